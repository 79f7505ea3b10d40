/* model-replay's transcripts: read each call, parsed once per content (see transcript.h). */
#include "config.h" /* autoconf: _GNU_SOURCE */

#include "transcript.h"

#include "support/text.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TRANSCRIPT_MAX_BYTES (64u << 20)

static void
transcript_free(transcript_t *t)
{
  for (size_t i = 0; i < t->n; i++) {
    json_object_put(t->lines[i]);
    if (t->recorded[i])
      json_object_put(t->recorded[i]);
  }
  free(t->lines);
  free(t->recorded);
  free(t->lineno);
  free(t->bytes);
  free(t->path);
  free(t);
}

/* Blanks only (space, tab, CR, LF) in the n bytes at s; a NUL is not a blank. */
static bool
blank(const char *s, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (!memchr(" \t\r\n", s[i], 4))
      return false;
  return true;
}

int
transcript_open(const char *path, eph_error_t *err)
{
  /* The path may come from a request ("replay:PATH"): a FIFO would block this model call
   * (and the run, and a daemon's drain) in open() where no deadline reaches it, and a
   * device such as /dev/zero is one endless line that a reader grows without bound.
   * Only a regular file no larger than the cap is read; O_NONBLOCK makes open() of a
   * FIFO return at once so that fstat() can refuse it. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0)
    return eph_error_set(err, errno == ENOENT ? EPH_E_CONFIG : errno, "transcript %s: %s", path,
                         strerror(errno));
  struct stat st;
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return eph_error_set(err, EINVAL, "transcript %s: not a regular file", path);
  }
  if ((uint64_t)st.st_size > TRANSCRIPT_MAX_BYTES) {
    close(fd);
    return eph_error_set(err, EFBIG, "transcript %s: larger than %u MiB", path,
                         TRANSCRIPT_MAX_BYTES >> 20);
  }
  return fd;
}

/* The whole file into *bytes (malloc'ed, NUL-terminated) and *size; the cap holds even for
 * a file that grew after transcript_open's fstat. */
static int
read_all(int fd, const char *path, char **bytes, size_t *size, eph_error_t *err)
{
  int r = eph_read_fd(fd, TRANSCRIPT_MAX_BYTES, bytes, size);
  if (r == -EFBIG)
    return eph_error_set(err, EFBIG, "transcript %s: larger than %u MiB", path,
                         TRANSCRIPT_MAX_BYTES >> 20);
  if (r == -ENOMEM)
    return eph_error_set(err, ENOMEM, "transcript %s: out of memory", path);
  if (r < 0)
    return eph_error_set(err, -r, "transcript %s: %s", path, strerror(-r));
  return 0;
}

/* One line (len bytes at line, its newline included) as a JSON object into *out: 0, or
 * negative with err set naming path:no. Exactly one object and blanks, as model-openai accepts a
 * body: the line's length, not its first NUL, bounds it, and nothing may follow the object. */
static int
parse_object(const char *line, size_t len, const char *path, size_t no, json_object **out,
             eph_error_t *err)
{
  json_tokener *tok = json_tokener_new();
  if (!tok)
    return eph_error_set(err, ENOMEM, "transcript %s: out of memory", path);
  json_object *o = json_tokener_parse_ex(tok, line, (int)len);
  enum json_tokener_error jerr = json_tokener_get_error(tok);
  size_t used = json_tokener_get_parse_end(tok);
  json_tokener_free(tok);
  const char *why = NULL;
  if (!o || jerr != json_tokener_success)
    why = jerr == json_tokener_continue ? "truncated" : json_tokener_error_desc(jerr);
  else if (!blank(line + used, len - used))
    why = "bytes after the object";
  else if (!json_object_is_type(o, json_type_object))
    why = "another JSON value";
  if (why) {
    if (o)
      json_object_put(o);
    return eph_error_set(err, EPH_E_PROTOCOL, "%s:%zu: not a JSON object (%s)", path, no, why);
  }
  *out = o;
  return 0;
}

/* Parses t->bytes into t's lines and their recorded messages. */
static int
parse_lines(transcript_t *t, transcript_parse_fn parse, eph_error_t *err)
{
  size_t lines = 0;
  for (size_t i = 0; i < t->size; i++)
    lines += t->bytes[i] == '\n';
  lines++; /* a last line without its newline */
  t->lines = calloc(lines, sizeof *t->lines);
  t->recorded = calloc(lines, sizeof *t->recorded);
  t->lineno = calloc(lines, sizeof *t->lineno);
  if (!t->lines || !t->recorded || !t->lineno)
    return eph_error_set(err, ENOMEM, "transcript %s: out of memory", t->path);
  const char *p = t->bytes, *end = t->bytes + t->size;
  for (size_t no = 1; p < end; no++) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t len = nl ? (size_t)(nl + 1 - p) : (size_t)(end - p);
    const char *line = p;
    p += len;
    if (blank(line, len))
      continue;
    json_object *o = NULL;
    int r = parse_object(line, len, t->path, no, &o, err);
    if (r < 0)
      return r;
    t->lines[t->n] = o;
    t->lineno[t->n] = no;
    /* The recorded message, read once here; a line its parser refuses stays NULL and
     * replay.c parses it again when it gets there, for the error. */
    char where[4096];
    snprintf(where, sizeof where, "%s:%zu", t->path, no);
    eph_model_response_t rec = {.struct_size = sizeof rec};
    eph_error_t ignored = {0};
    if (parse(o, where, &rec, &ignored) == 0) {
      t->recorded[t->n] = rec.message;
      rec.message = NULL;
    }
    eph_model_response_clear(&rec);
    t->n++;
  }
  return 0;
}

void
transcript_cache_init(transcript_cache_t *c)
{
  memset(c, 0, sizeof *c);
  pthread_mutex_init(&c->lock, NULL);
}

void
transcript_cache_fini(transcript_cache_t *c)
{
  for (size_t i = 0; i < TRANSCRIPT_CACHE_SLOTS; i++)
    if (c->slot[i])
      transcript_release(c, c->slot[i]);
  pthread_mutex_destroy(&c->lock);
}

void
transcript_release(transcript_cache_t *c, transcript_t *t)
{
  pthread_mutex_lock(&c->lock);
  bool last = --t->refs == 0;
  pthread_mutex_unlock(&c->lock);
  if (last)
    transcript_free(t);
}

/* The cached transcript of path with exactly these bytes, moved to the front, with a
 * reference for the caller; or NULL. c->lock held. */
static transcript_t *
lookup_locked(transcript_cache_t *c, const char *path, const char *bytes, size_t size)
{
  for (size_t i = 0; i < TRANSCRIPT_CACHE_SLOTS && c->slot[i]; i++) {
    transcript_t *t = c->slot[i];
    if (t->size != size || strcmp(t->path, path) != 0 || memcmp(t->bytes, bytes, size) != 0)
      continue;
    memmove(c->slot + 1, c->slot, i * sizeof *c->slot);
    c->slot[0] = t;
    t->refs++;
    return t;
  }
  return NULL;
}

int
transcript_get(transcript_cache_t *c, const eph_host_t *host, const char *path,
               transcript_parse_fn parse, transcript_t **out, eph_error_t *err)
{
  char *bytes = NULL;
  size_t size = 0;
  int fd = transcript_open(path, err);
  if (fd < 0)
    return fd;
  int r = read_all(fd, path, &bytes, &size, err);
  close(fd);
  if (r < 0)
    return r;

  pthread_mutex_lock(&c->lock);
  *out = lookup_locked(c, path, bytes, size);
  pthread_mutex_unlock(&c->lock);
  if (*out) {
    free(bytes);
    return 0;
  }

  /* Parsed outside the lock: another run's calls go on meanwhile. */
  transcript_t *t = calloc(1, sizeof *t);
  if (!t || !(t->path = strdup(path))) {
    free(t);
    free(bytes);
    return eph_error_set(err, ENOMEM, "transcript %s: out of memory", path);
  }
  t->bytes = bytes;
  t->size = size;
  if ((r = parse_lines(t, parse, err)) < 0) {
    transcript_free(t);
    return r;
  }
  if (host && host->log)
    host->log(EPH_LOG_DEBUG, "transcript %s: %zu responses parsed", path, t->n);

  t->refs = 2; /* the cache's and the caller's */
  pthread_mutex_lock(&c->lock);
  transcript_t *evicted = c->slot[TRANSCRIPT_CACHE_SLOTS - 1];
  memmove(c->slot + 1, c->slot, (TRANSCRIPT_CACHE_SLOTS - 1) * sizeof *c->slot);
  c->slot[0] = t;
  pthread_mutex_unlock(&c->lock);
  if (evicted)
    transcript_release(c, evicted);
  *out = t;
  return 0;
}
