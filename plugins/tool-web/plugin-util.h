/* Small helpers shared by the host-side tool plugins (tool-web, tool-connection, tool-file).
 * Plugins do not link the core, so they carry their own cleanup macros and thin wrappers of
 * OpenSSL's base64 codec. Header-only, all static. */
#ifndef EPH_PLUGIN_UTIL_H
#define EPH_PLUGIN_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <json-c/json.h>
#include <openssl/evp.h>

static inline void
pu_freep(void *p)
{
  free(*(void **)p);
}
static inline void
pu_closep(int *fd)
{
  if (*fd >= 0)
    close(*fd);
}
static inline void
pu_json_putp(json_object **o)
{
  if (*o)
    json_object_put(*o);
}
#define cleanup_free __attribute__((cleanup(pu_freep)))
#define cleanup_close __attribute__((cleanup(pu_closep)))
#define cleanup_json __attribute__((cleanup(pu_json_putp)))
#define steal_pointer(pp)                                                                   \
  ({                                                                                        \
    __typeof__(*(pp)) _p = *(pp);                                                           \
    *(pp) = NULL;                                                                           \
    _p;                                                                                     \
  })

/* {"error": msg} as a tool result (a failure the model should see). Owned by the caller. */
static inline json_object *
pu_error_result(const char *msg)
{
  json_object *o = json_object_new_object();
  json_object_object_add(o, "error", json_object_new_string(msg));
  return o;
}

/* Base64 (RFC 4648 section 4, with padding) through OpenSSL's codec. Returns a
 * NUL-terminated heap string owned by the caller, or NULL on out-of-memory. *out_len
 * (optional) gets its length. */
static inline char *
pu_b64_encode(const void *data, size_t n, size_t *out_len)
{
  if (n > (size_t)INT32_MAX / 4 * 3)
    return NULL;
  char *o = malloc(4 * ((n + 2) / 3) + 1);
  if (!o)
    return NULL;
  int len = EVP_EncodeBlock((unsigned char *)o, data, (int)n);
  o[len] = 0;
  if (out_len)
    *out_len = (size_t)len;
  return o;
}

/* Strict decoding: length a multiple of 4, only the alphabet, padding only at the end, no
 * whitespace (EVP_DecodeBlock alone would skip blanks), and canonical: re-encoding gives
 * the same text. Returns 0 and a heap buffer (*out, owned by the caller, NUL-terminated
 * for convenience) of *out_len bytes, or -1 when the text is not canonical base64. */
static inline int
pu_b64_decode(const char *s, size_t n, unsigned char **out, size_t *out_len)
{
  if (n % 4 || n > (size_t)INT32_MAX)
    return -1;
  size_t pad = 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    int alpha = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                c == '+' || c == '/';
    if (c == '=' && i + 2 >= n && (i + 1 == n || s[i + 1] == '='))
      pad++;
    else if (!alpha)
      return -1;
  }
  unsigned char *o = malloc(n / 4 * 3 + 1);
  if (!o)
    return -1;
  int len = n ? EVP_DecodeBlock(o, (const unsigned char *)s, (int)n) : 0;
  if (len < 0) {
    free(o);
    return -1;
  }
  len -= (int)pad; /* EVP_DecodeBlock counts padding as zero bytes */
  char *again = pu_b64_encode(o, (size_t)len, NULL);
  int canonical = again && strncmp(again, s, n) == 0 && strlen(again) == n;
  free(again);
  if (!canonical) {
    free(o);
    return -1;
  }
  o[len] = 0;
  *out = o;
  *out_len = (size_t)len;
  return 0;
}

/* True when the n bytes are valid UTF-8 without NUL (safe to hand over as a JSON string). */
static inline int
pu_is_utf8_text(const unsigned char *s, size_t n)
{
  size_t i = 0;
  while (i < n) {
    unsigned char c = s[i];
    int more;
    uint32_t cp;
    if (c == 0)
      return 0;
    if (c < 0x80) {
      i++;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      more = 1;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      more = 2;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      more = 3;
      cp = c & 0x07;
    } else
      return 0;
    if (i + (size_t)more >= n)
      return 0;
    for (int k = 1; k <= more; k++) {
      if ((s[i + k] & 0xc0) != 0x80)
        return 0;
      cp = cp << 6 | (s[i + k] & 0x3f);
    }
    if ((more == 1 && cp < 0x80) || (more == 2 && cp < 0x800) || (more == 3 && cp < 0x10000) ||
        cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      return 0;
    i += (size_t)more + 1;
  }
  return 1;
}

/* Length of the longest prefix of s[0..n) that does not end inside a UTF-8 sequence (so a
 * truncated text stays valid). */
static inline size_t
pu_utf8_clip(const char *s, size_t n)
{
  size_t i = n;
  int back = 0;
  while (i > 0 && back < 4 && ((unsigned char)s[i - 1] & 0xc0) == 0x80) {
    i--;
    back++;
  }
  if (i == 0)
    return n;
  unsigned char lead = (unsigned char)s[i - 1];
  int need = lead >= 0xf0 ? 3 : lead >= 0xe0 ? 2 : lead >= 0xc0 ? 1 : 0;
  if (need > back)
    return i - 1;
  return n;
}

#endif
