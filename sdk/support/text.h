/* UTF-8 text checks and the tool error result, shared by the host-side tool plugins
 * (tool-web, tool-connection, tool-file) and the core (sdk/support/README.md). */
#ifndef EPH_SUPPORT_TEXT_H
#define EPH_SUPPORT_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <json-c/json.h>

/* True when the bytes are valid UTF-8 (shortest forms, no surrogates, at most U+10FFFF)
 * without NUL: safe to hand over as a JSON string. */
bool eph_utf8_is_text(const unsigned char *s, size_t bytes);

/* The UTF-8 sequence s[0..bytes) starts with (bytes >= 1): its length, 1..4, when it is a
 * valid and complete one (shortest form, no surrogate, at most U+10FFFF; a NUL is 1);
 * 0 when it is invalid; -1 when it is valid so far but cut by the end of the bytes (live
 * output keeps such a tail for its next chunk). The one UTF-8 decoder of the host side:
 * eph_utf8_is_text, eph_utf8_repair, live output (core/live.c), the terminal's printer
 * (core/cmd_run.c). RFC 3629, section 4. */
int eph_utf8_seq(const unsigned char *s, size_t bytes);

/* Every string of o (values and member names, nested) made valid UTF-8 in place, as
 * eph_utf8_repair does but keeping a NUL in a value (JSON writes it \u0000; a string o
 * shares with the caller, a tool call's arguments, is not changed by it). Returns how many
 * strings were repaired (0: o was clean, nothing copied).
 * What the core keeps of what plugins and sandboxes wrote goes through it (events, errors:
 * core/run_state.c), so the record and every JSON rendering of it stay valid UTF-8. */
size_t eph_json_utf8_repair(json_object *o);

/* The offset of the first byte of s[0..bytes) that is not part of valid UTF-8 (a NUL
 * counts as invalid), SIZE_MAX when there is none. */
size_t eph_utf8_invalid_at(const char *s, size_t bytes);

/* s[0..bytes) as valid UTF-8 without NUL: each byte that starts no valid sequence (a cut
 * one at the end too) and each NUL becomes U+FFFD. A new heap string (malloc'ed,
 * NUL-terminated; NULL only when out of memory) of *out_bytes bytes (may be NULL): what a
 * model API or a JSON record may be given of bytes a program wrote. */
char *eph_utf8_repair(const char *s, size_t bytes, size_t *out_bytes);

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
