/* See text.h. */
#include "text.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

bool
eph_utf8_is_text(const unsigned char *s, size_t bytes)
{
  size_t i = 0;
  while (i < bytes) {
    unsigned char c = s[i];
    int more;
    uint32_t cp;
    if (c == 0)
      return false;
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
      return false;
    if (i + (size_t)more >= bytes)
      return false;
    for (int k = 1; k <= more; k++) {
      if ((s[i + k] & 0xc0) != 0x80)
        return false;
      cp = cp << 6 | (s[i + k] & 0x3f);
    }
    /* Overlong forms, surrogates and code points past U+10FFFF are not UTF-8. */
    if ((more == 1 && cp < 0x80) || (more == 2 && cp < 0x800) || (more == 3 && cp < 0x10000) ||
        cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += (size_t)more + 1;
  }
  return true;
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
