#include <config.h>

#include "util.h"

#include "support/json_strict.h"

#include <errno.h>
#include <malloc.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
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
eph_json_int64(json_object *o, const char *key)
{
  json_object *v = NULL;
  return json_object_object_get_ex(o, key, &v) ? json_object_get_int64(v) : 0;
}

void
eph_malloc_tune(void)
{
  mallopt(M_MMAP_THRESHOLD, 2 * 1024 * 1024);
  mallopt(M_TRIM_THRESHOLD, 8 * 1024 * 1024);
  mallopt(M_TOP_PAD, 1024 * 1024);
}

void
eph_cond_init_monotonic(pthread_cond_t *c)
{
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(c, &ca);
  pthread_condattr_destroy(&ca);
}

int64_t
eph_wall_us(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
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
  int r = eph_read_fd(fd, max_bytes, out, bytes);
  if (r == -EFBIG)
    return eph_error_set(err, EFBIG, "%s: larger than %zu bytes", path, max_bytes);
  if (r < 0)
    return eph_error_set(err, -r, "%s: %s", path, strerror(-r));
  return 0;
}

/* Line and column (1-based, in bytes) of byte offset off in text. */
static void
line_col(const char *text, size_t off, size_t *line, size_t *col)
{
  *line = 1;
  size_t start = 0;
  for (size_t i = 0; i < off; i++)
    if (text[i] == '\n') {
      (*line)++;
      start = i + 1;
    }
  *col = off - start + 1;
}

json_object *
eph_json_parse_strict(const char *text, size_t len, eph_error_t *err)
{
  json_object *root = NULL;
  eph_json_fault_t fault;
  int r = eph_json_parse_one(text, len, EPH_JSON_STRICT_UTF8, &root, &fault);
  if (r == -ENOMEM) {
    eph_error_set(err, ENOMEM, "out of memory");
  } else if (r < 0) {
    size_t line, col;
    line_col(text ? text : "", fault.offset, &line, &col);
    if (fault.trailing)
      eph_error_set(err, EBADMSG, "malformed JSON: trailing data at line %zu, column %zu", line,
                    col);
    else
      eph_error_set(err, EBADMSG, "malformed JSON at line %zu, column %zu: %s", line, col,
                    fault.desc);
  }
  return root;
}

const char *
eph_closest(const char *word, const char *const *candidates, size_t n)
{
  size_t wl = strlen(word);
  if (wl > 127)
    return NULL;
  size_t limit = wl / 3 < 2 ? wl / 3 : 2;
  const char *best = NULL;
  size_t best_d = limit + 1;
  for (size_t c = 0; c < n; c++) {
    const char *cand = candidates[c];
    size_t cl = cand ? strlen(cand) : 128;
    if (cl > 127 || (cl > wl ? cl - wl : wl - cl) >= best_d)
      continue;
    /* Two rows of the Wagner-Fischer table. */
    size_t prev[128], cur[128];
    for (size_t j = 0; j <= cl; j++)
      prev[j] = j;
    for (size_t i = 1; i <= wl; i++) {
      cur[0] = i;
      for (size_t j = 1; j <= cl; j++) {
        size_t sub = prev[j - 1] + (word[i - 1] != cand[j - 1]);
        size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
        cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
      }
      memcpy(prev, cur, (cl + 1) * sizeof prev[0]);
    }
    if (prev[cl] < best_d && prev[cl] > 0) {
      best_d = prev[cl];
      best = cand;
    }
  }
  return best;
}

int
eph_clear_ambient_caps(void)
{
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
    return -errno;
  return 0;
}
