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

/* The first byte of s[0..bytes) that is not part of valid UTF-8, SIZE_MAX when none;
 * keep_nul: a NUL counts as valid (a JSON string holds it as \u0000). */
static size_t
first_invalid(const char *s, size_t bytes, bool keep_nul)
{
  const unsigned char *p = (const unsigned char *)s;
  for (size_t i = 0; i < bytes;) {
    int n = eph_utf8_seq(p + i, bytes - i);
    if (n <= 0 || (p[i] == 0 && !keep_nul))
      return i;
    i += (size_t)n;
  }
  return SIZE_MAX;
}

size_t
eph_utf8_invalid_at(const char *s, size_t bytes)
{
  return first_invalid(s, bytes, false);
}

bool
eph_utf8_is_text(const unsigned char *s, size_t bytes)
{
  return eph_utf8_invalid_at((const char *)s, bytes) == SIZE_MAX;
}

/* eph_utf8_repair; keep_nul: a NUL stays (a JSON string holds it as \u0000). */
static char *
repair(const char *s, size_t bytes, size_t *out_bytes, bool keep_nul)
{
  const unsigned char *p = (const unsigned char *)s;
  char *out = malloc(bytes * 3 + 1);
  if (!out)
    return NULL;
  size_t o = 0;
  for (size_t i = 0; i < bytes;) {
    int n = eph_utf8_seq(p + i, bytes - i);
    if (n <= 0 || (p[i] == 0 && !keep_nul)) {
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

char *
eph_utf8_repair(const char *s, size_t bytes, size_t *out_bytes)
{
  return repair(s, bytes, out_bytes, false);
}

size_t
eph_json_utf8_repair(json_object *o)
{
  size_t n = 0;
  if (json_object_is_type(o, json_type_string)) {
    const char *v = json_object_get_string(o);
    size_t len = (size_t)json_object_get_string_len(o), out_len = 0;
    if (first_invalid(v, len, true) == SIZE_MAX)
      return 0; /* the usual case: nothing copied, a NUL kept */
    char *fixed = repair(v, len, &out_len, true);
    if (!fixed || out_len > INT32_MAX)
      abort(); /* out of memory: the core does not limp on */
    json_object_set_string_len(o, fixed, (int)out_len);
    free(fixed);
    return 1;
  }
  if (json_object_is_type(o, json_type_array)) {
    size_t len = json_object_array_length(o);
    for (size_t i = 0; i < len; i++)
      n += eph_json_utf8_repair(json_object_array_get_idx(o, i));
    return n;
  }
  if (!json_object_is_type(o, json_type_object))
    return 0;
  /* A member whose name is not UTF-8 is taken out and put back under the repaired name
   * (names cannot change in place); at most a few, so a second pass finds them. */
  bool bad_key = false;
  json_object_object_foreach(o, key, val) {
    n += eph_json_utf8_repair(val);
    bad_key |= eph_utf8_invalid_at(key, strlen(key)) != SIZE_MAX;
  }
  while (bad_key) {
    bad_key = false;
    json_object_object_foreach(o, k2, v2) {
      if (eph_utf8_invalid_at(k2, strlen(k2)) == SIZE_MAX)
        continue;
      char *fixed = eph_utf8_repair(k2, strlen(k2), NULL);
      if (!fixed)
        abort();
      json_object *keep = json_object_get(v2);
      json_object_object_del(o, k2);
      json_object_object_add(o, fixed, keep);
      free(fixed);
      n++;
      bad_key = true;
      break; /* the iteration is over a changed object: start again */
    }
  }
  return n;
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
