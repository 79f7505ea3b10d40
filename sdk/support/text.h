/* UTF-8 text checks and the tool error result, shared by the host-side tool plugins
 * (tool-web, tool-connection, tool-file) and the core (sdk/support/README.md). */
#ifndef EPH_SUPPORT_TEXT_H
#define EPH_SUPPORT_TEXT_H

#include <stdbool.h>
#include <stddef.h>

#include <json-c/json.h>

/* True when the bytes are valid UTF-8 (shortest forms, no surrogates, at most U+10FFFF)
 * without NUL: safe to hand over as a JSON string. */
bool eph_utf8_is_text(const unsigned char *s, size_t bytes);

/* The length in bytes (1 or 2) of the control character p starts with, 0 when it starts
 * none: a C0 control (U+0000..U+001F), DEL (U+007F) or a C1 control (U+0080..U+009F, UTF-8
 * C2 80..C2 9F; a CSI alone is C2 9B). p must be NUL-terminated. One definition for every
 * place that keeps controls away from a terminal or out of a stored name (ECMA-48 sets). */
size_t eph_control_len(const unsigned char *p);

/* Length of the longest prefix of s[0..bytes) that does not end inside a UTF-8 sequence
 * (so a truncated text stays valid). */
size_t eph_utf8_clip(const char *s, size_t bytes);

/* The string member `key` of obj, borrowed from obj; NULL when obj is NULL or not an
 * object, the member is absent or not a string (the caller names what is missing). Inline,
 * so the libraries that do not link this one (the model wire formats) use it too. */
static inline const char *
eph_json_get_string(json_object *obj, const char *key)
{
  json_object *v = NULL;
  if (!obj || !json_object_object_get_ex(obj, key, &v) || !json_object_is_type(v, json_type_string))
    return NULL;
  return json_object_get_string(v);
}

/* Reads fd to its end into *out (malloc'ed and NUL-terminated, the caller frees it) and
 * *bytes (its length, the NUL not counted; may be NULL): 0, or -EFBIG once more than
 * max_bytes came (nothing returned), -ENOMEM, or read()'s -errno. Retries EINTR. The one
 * bounded whole-file reader (the core's files, `exec --stdin`, model-replay's transcripts). */
int eph_read_fd(int fd, size_t max_bytes, char **out, size_t *bytes);

/* {"error": msg} as a tool result (a failure the model should see). Owned by the caller;
 * NULL only when out of memory. */
json_object *eph_error_result(const char *msg);

#endif
