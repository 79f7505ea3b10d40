/* model-replay's transcripts: read, parsed once and shared by the calls that replay them.
 *
 * A run asks the plugin once per model call and each call needs every earlier response of
 * the transcript (to check the run still follows it), so parsing the file per call made a
 * run's cost grow with the square of its length. A parsed transcript is kept in a small
 * cache of the plugin (the runs of a daemon share it) keyed by the path and the file's
 * exact bytes: every call still opens and reads the file (the same checks as before: a
 * regular file within the size cap), and only an unchanged file is not parsed again, so a
 * transcript edited between two calls is seen at the next call as it was before. */
#ifndef EPH_MODEL_REPLAY_TRANSCRIPT_H
#define EPH_MODEL_REPLAY_TRANSCRIPT_H

#include <pthread.h>
#include <stddef.h>

#include <ephemeral/plugin.h>

/* Most recently used transcripts kept parsed (a daemon replays few at once). */
#define TRANSCRIPT_CACHE_SLOTS 8

/* One parsed transcript. Immutable once published and shared between threads: readers
 * only look (eph_json_get_string, json_object_object_get_ex, array reads), never call
 * json_object_get/put or to_json_string on its objects; what a call hands out or changes
 * is a deep copy. */
typedef struct transcript {
  char *path;             /* as the run named it */
  char *bytes;            /* the file's content, what the cache compares */
  size_t size;            /* bytes in `bytes` */
  json_object **lines;    /* each non-blank line's object */
  json_object **recorded; /* each line's assistant message read by its provider's parser
                           * (parse_line in replay.c), or NULL where that failed */
  size_t *lineno;         /* each line's number in the file (1-based) */
  size_t n;
  unsigned refs; /* the cache's reference and each call's, under transcript_cache_t.lock */
} transcript_t;

typedef struct transcript_cache {
  pthread_mutex_t lock;
  transcript_t *slot[TRANSCRIPT_CACHE_SLOTS]; /* most recently used first; NULL: empty */
} transcript_cache_t;

/* Reads a transcript line's recorded assistant message (replay.c's parse_line): 0 and
 * resp filled, or negative with err set. */
typedef int (*transcript_parse_fn)(json_object *line, const char *where, eph_model_response_t *resp,
                                   eph_error_t *err);

void transcript_cache_init(transcript_cache_t *c);
/* Drops the cache's references (no call may be in progress). */
void transcript_cache_fini(transcript_cache_t *c);

/* Opens the transcript at path for reading, refusing what is not a regular file within the
 * size cap: a file descriptor, or negative with err set. */
int transcript_open(const char *path, eph_error_t *err);

/* The transcript at path, parsed: from the cache when the file's bytes are those it was
 * parsed from, else read, parsed (each line's recorded message with parse) and cached;
 * host->log says when a file is parsed (debug). Returns 0 and *out (one reference, given
 * back with transcript_release), or negative with err set (nothing cached): the file cannot
 * be read, or a line is not one JSON object ("PATH:LINE: not a JSON object (why)"). */
int transcript_get(transcript_cache_t *c, const eph_host_t *host, const char *path,
                   transcript_parse_fn parse, transcript_t **out, eph_error_t *err);
void transcript_release(transcript_cache_t *c, transcript_t *t);

#endif
