/* See text.h. */
#include "text.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int
eph_utf8_seq(const unsigned char *s, size_t bytes)
{
  unsigned char c = s[0];
  if (c < 0x80)
    return 1;
  /* C0 and C1 would be overlong two-byte forms, F5..FF past U+10FFFF. */
  int len = c >= 0xc2 && c <= 0xdf   ? 2
            : c >= 0xe0 && c <= 0xef ? 3
            : c >= 0xf0 && c <= 0xf4 ? 4
                                     : 0;
  if (!len)
    return 0;
  for (int i = 1; i < len; i++) {
    if ((size_t)i >= bytes)
      return -1;
    if ((s[i] & 0xc0) != 0x80)
      return 0;
  }
  /* Overlongs, surrogates and past U+10FFFF: E0 needs A0..BF, ED 80..9F, F0 90..BF,
   * F4 80..8F as its second byte (RFC 3629's table). */
  if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] > 0x9f) || (c == 0xf0 && s[1] < 0x90) ||
      (c == 0xf4 && s[1] > 0x8f))
    return 0;
  return len;
}

size_t
eph_utf8_invalid_at(const char *s, size_t bytes)
{
  const unsigned char *p = (const unsigned char *)s;
  for (size_t i = 0; i < bytes;) {
    int n = eph_utf8_seq(p + i, bytes - i);
    if (n <= 0 || p[i] == 0)
      return i;
    i += (size_t)n;
  }
  return SIZE_MAX;
}

bool
eph_utf8_is_text(const unsigned char *s, size_t bytes)
{
  return eph_utf8_invalid_at((const char *)s, bytes) == SIZE_MAX;
}

char *
eph_utf8_repair(const char *s, size_t bytes, size_t *out_bytes)
{
  const unsigned char *p = (const unsigned char *)s;
  char *out = malloc(bytes * 3 + 1);
  if (!out)
    return NULL;
  size_t o = 0;
  for (size_t i = 0; i < bytes;) {
    int n = eph_utf8_seq(p + i, bytes - i);
    if (n <= 0 || p[i] == 0) {
      memcpy(out + o, "\xef\xbf\xbd", 3);
      o += 3;
      i++;
    } else {
      memcpy(out + o, p + i, (size_t)n);
      o += (size_t)n;
      i += (size_t)n;
    }
  }
  out[o] = '\0';
  if (out_bytes)
    *out_bytes = o;
  return out;
}

size_t
eph_control_len(const unsigned char *p)
{
  if (p[0] < 0x20 || p[0] == 0x7f)
    return 1;
  return p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f ? 2 : 0;
}

size_t
eph_utf8_clip(const char *s, size_t bytes)
{
  size_t i = bytes;
  int back = 0;
  while (i > 0 && back < 4 && ((unsigned char)s[i - 1] & 0xc0) == 0x80) {
    i--;
    back++;
  }
  if (i == 0)
    return bytes;
  unsigned char lead = (unsigned char)s[i - 1];
  int need = lead >= 0xf0 ? 3 : lead >= 0xe0 ? 2 : lead >= 0xc0 ? 1 : 0;
  if (need > back)
    return i - 1;
  return bytes;
}

json_object *
eph_error_result(const char *msg)
{
  json_object *o = json_object_new_object();
  if (o)
    json_object_object_add(o, "error", json_object_new_string(msg));
  return o;
}

int
eph_read_fd(int fd, size_t max_bytes, char **out, size_t *bytes)
{
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap + 1);
  if (!buf)
    return -ENOMEM;
  for (;;) {
    if (len == cap) {
      char *nb = realloc(buf, cap * 2 + 1);
      if (!nb) {
        free(buf);
        return -ENOMEM;
      }
      buf = nb;
      cap *= 2;
    }
    ssize_t r = read(fd, buf + len, cap - len);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      int e = errno;
      free(buf);
      return -e;
    }
    if (r == 0)
      break;
    len += (size_t)r;
    if (len > max_bytes) {
      free(buf);
      return -EFBIG;
    }
  }
  buf[len] = '\0';
  if (bytes)
    *bytes = len;
  *out = buf;
  return 0;
}
