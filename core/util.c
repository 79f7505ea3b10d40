#include <config.h>

#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>

static void
oom(void)
{
  static const char msg[] = "ephemeral: out of memory\n";
  ssize_t r = write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)r;
  abort();
}

void *
eph_xmalloc(size_t bytes)
{
  void *p = malloc(bytes ? bytes : 1);
  if (!p)
    oom();
  return p;
}

void *
eph_xcalloc(size_t n, size_t bytes)
{
  void *p = calloc(n ? n : 1, bytes ? bytes : 1);
  if (!p)
    oom();
  return p;
}

void *
eph_xrealloc(void *p, size_t bytes)
{
  p = realloc(p, bytes ? bytes : 1);
  if (!p)
    oom();
  return p;
}

char *
eph_xstrdup(const char *s)
{
  char *p = strdup(s ? s : "");
  if (!p)
    oom();
  return p;
}

char *
eph_xstrndup(const char *s, size_t n)
{
  char *p = strndup(s ? s : "", n);
  if (!p)
    oom();
  return p;
}

char *
eph_xasprintf(const char *fmt, ...)
{
  va_list ap;
  char *out = NULL;
  va_start(ap, fmt);
  int r = vasprintf(&out, fmt, ap);
  va_end(ap);
  if (r < 0)
    oom();
  return out;
}

int64_t
eph_wall_us(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

char *
eph_format_dollars(int64_t micros, char *buf, size_t size)
{
  const char *sign = micros < 0 ? "-" : "";
  uint64_t m = micros < 0 ? (uint64_t)(-(micros + 1)) + 1 : (uint64_t)micros;
  /* 5 decimals = tens of micros, rounded half up, as the product page prints $0.00353. */
  uint64_t tens = (m + 5) / 10;
  snprintf(buf, size, "%s$%llu.%05llu", sign, (unsigned long long)(tens / 100000),
           (unsigned long long)(tens % 100000));
  return buf;
}

int
eph_random_bytes(void *buf, size_t n)
{
  unsigned char *p = buf;
  while (n > 0) {
    ssize_t r = getrandom(p, n, 0);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

int
eph_random_hex(char *out, size_t n)
{
  unsigned char raw[64];
  if (n > sizeof raw)
    return -EINVAL;
  int r = eph_random_bytes(raw, n);
  if (r < 0)
    return r;
  for (size_t i = 0; i < n; i++)
    snprintf(out + 2 * i, 3, "%02x", raw[i]);
  return 0;
}

int
eph_mkdir_p(const char *path, mode_t mode, eph_error_t *err)
{
  cleanup_free char *copy = eph_xstrdup(path);
  for (char *p = copy + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(copy, mode) < 0 && errno != EEXIST)
      return eph_error_set(err, errno, "creating directory %s: %s", copy, strerror(errno));
    *p = '/';
  }
  if (mkdir(copy, mode) < 0 && errno != EEXIST)
    return eph_error_set(err, errno, "creating directory %s: %s", copy, strerror(errno));
  return 0;
}

int
eph_read_file(const char *path, size_t max_bytes, char **out, size_t *bytes, eph_error_t *err)
{
  cleanup_close int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return eph_error_set(err, errno, "%s: %s", path, strerror(errno));
  size_t cap = 4096, len = 0;
  cleanup_free char *buf = eph_xmalloc(cap + 1);
  for (;;) {
    if (len == cap) {
      cap *= 2;
      buf = eph_xrealloc(buf, cap + 1);
    }
    ssize_t r = read(fd, buf + len, cap - len);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return eph_error_set(err, errno, "%s: %s", path, strerror(errno));
    }
    if (r == 0)
      break;
    len += (size_t)r;
    if (len > max_bytes)
      return eph_error_set(err, EFBIG, "%s: larger than %zu bytes", path, max_bytes);
  }
  buf[len] = '\0';
  if (bytes)
    *bytes = len;
  *out = steal_pointer(&buf);
  return 0;
}
