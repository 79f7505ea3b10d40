/* Small helpers shared by the host-side tool plugins (tool-web, tool-connection, tool-file).
 * Plugins do not link the core, so they carry their own cleanup macros and a strict
 * RFC 4648 base64 codec (json-c, libcurl and libxml2 expose none). Header-only, all static. */
#ifndef EPH_PLUGIN_UTIL_H
#define EPH_PLUGIN_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <json-c/json.h>

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

/* Base64 (RFC 4648 section 4, with padding). Returns a NUL-terminated heap string owned by
 * the caller, or NULL on out-of-memory. *out_len (optional) gets its length. */
static inline char *
pu_b64_encode(const void *data, size_t n, size_t *out_len)
{
  static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const unsigned char *p = data;
  size_t len = 4 * ((n + 2) / 3);
  char *o = malloc(len + 1), *w = o;
  if (!o)
    return NULL;
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16;
    if (i + 1 < n)
      v |= (uint32_t)p[i + 1] << 8;
    if (i + 2 < n)
      v |= p[i + 2];
    *w++ = tab[(v >> 18) & 63];
    *w++ = tab[(v >> 12) & 63];
    *w++ = i + 1 < n ? tab[(v >> 6) & 63] : '=';
    *w++ = i + 2 < n ? tab[v & 63] : '=';
  }
  *w = 0;
  if (out_len)
    *out_len = len;
  return o;
}

static inline int
pu_b64_value(unsigned char c)
{
  if (c >= 'A' && c <= 'Z')
    return c - 'A';
  if (c >= 'a' && c <= 'z')
    return c - 'a' + 26;
  if (c >= '0' && c <= '9')
    return c - '0' + 52;
  if (c == '+')
    return 62;
  if (c == '/')
    return 63;
  return -1;
}

/* Strict decoding: length a multiple of 4, padding only at the end, no whitespace, no
 * stray bits. Returns 0 and a heap buffer (*out, owned by the caller, NUL-terminated for
 * convenience) of *out_len bytes, or -1 when the text is not canonical base64. */
static inline int
pu_b64_decode(const char *s, size_t n, unsigned char **out, size_t *out_len)
{
  if (n % 4)
    return -1;
  unsigned char *o = malloc(n / 4 * 3 + 1);
  size_t w = 0;
  if (!o)
    return -1;
  for (size_t i = 0; i < n; i += 4) {
    int v[4], pad = 0;
    for (int k = 0; k < 4; k++) {
      unsigned char c = (unsigned char)s[i + k];
      if (c == '=' && i + 4 == n && k >= 2) {
        pad++;
        v[k] = 0;
        continue;
      }
      if (pad || (v[k] = pu_b64_value(c)) < 0)
        goto bad;
    }
    uint32_t x = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
    if ((pad == 1 && (x & 0xff)) || (pad == 2 && (x & 0xffff)))
      goto bad; /* non-zero bits under the padding: not canonical */
    o[w++] = (unsigned char)(x >> 16);
    if (pad < 2)
      o[w++] = (unsigned char)(x >> 8);
    if (pad < 1)
      o[w++] = (unsigned char)x;
  }
  o[w] = 0;
  *out = o;
  *out_len = w;
  return 0;
bad:
  free(o);
  return -1;
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
