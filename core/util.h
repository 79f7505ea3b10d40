/* Small shared helpers of the core: scope-bound cleanup, string building, time. */
#ifndef EPH_UTIL_H
#define EPH_UTIL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include <ephemeral/plugin.h>

#include "support/base64.h"
#include "support/cleanup.h"
#include "support/format.h" /* eph_format_dollars, eph_format_iso8601 */
#include "support/text.h"

/* malloc/strdup/asprintf that abort on out-of-memory: the core does not limp on without
 * memory. Returned memory is owned by the caller (free()). */
void *eph_xmalloc(size_t bytes);
void *eph_xcalloc(size_t n, size_t bytes);
void *eph_xrealloc(void *p, size_t bytes);
/* Parses len bytes as exactly one JSON value, strictly (eph_json_parse_one,
 * support/json_strict.h: no comments, trailing commas nor single-quoted values; valid
 * UTF-8), followed only by blanks (a NUL is not a blank). Returns a new reference owned by
 * the caller, or NULL with err set (EBADMSG) to a message locating the fault by line and
 * column ("malformed JSON at line 3, column 7: ...", "malformed JSON: trailing data at
 * line 2, column 1"): request files are edited by hand. json-c keeps the last of duplicate
 * keys; that is not detected. */
json_object *eph_json_parse_strict(const char *text, size_t len, eph_error_t *err);
/* o.key as json_object_get_int64 reads it (a numeric string too), 0 when absent. (A string
 * member: eph_json_get_string, support/text.h.) */
int64_t eph_json_int64(json_object *o, const char *key);

/* The allocator's thresholds for a process that runs sandboxes (the CLI, the daemon), set
 * first thing in main: heap chunks up to 2 MiB (not a mmap and munmap of their own each)
 * and 8 MiB of free heap top kept (M_TRIM_THRESHOLD), 1 MiB grown at a time. With glibc's
 * defaults the heap's top sat at the 128 KiB trim edge: each SQLite transaction's page
 * grew it with brk() and its free shrank it again, two system calls and fresh zeroed
 * pages (page faults) per transaction, and per shell call. */
void eph_malloc_tune(void);

/* pthread_cond_init of c with CLOCK_MONOTONIC: the core's deadlines are monotonic ms
 * (eph_now_ms), so a timed wait must not move with the wall clock. */
void eph_cond_init_monotonic(pthread_cond_t *c);

char *eph_xstrdup(const char *s);
char *eph_xstrndup(const char *s, size_t n);
char *eph_xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The candidate closest to word by edit distance (insertions, deletions, substitutions,
 * each 1), when that distance is small enough to be a typo: at most 2, and at most a third
 * of word's length. NULL when none is (or word or a candidate is longer than 127 bytes).
 * For "did you mean" hints in errors about names (configuration keys, model names). The
 * result is one of candidates[0..n), borrowed. */
const char *eph_closest(const char *word, const char *const *candidates, size_t n);

/* Wall-clock time in microseconds since the epoch (CLOCK_REALTIME). */
int64_t eph_wall_us(void);

/* Fills buf with n random bytes from getrandom(); returns 0 or -errno. */
int eph_random_bytes(void *buf, size_t n);
/* Writes 2*n lowercase hex digits of n random bytes plus NUL into out (2n+1 bytes). */
int eph_random_hex(char *out, size_t n);
/* Clears the ambient capability set, so nothing this process executes inherits a
 * capability it was handed as an ambient one (the packaged unit hands CAP_SETUID and
 * CAP_SETGID that way; the process itself keeps them as permitted and effective).
 * Returns 0, or -errno (EINVAL, a kernel without ambient capabilities, counts as done). */
int eph_clear_ambient_caps(void);

/* mkdir -p with mode; returns 0 or negative + err naming the path. */
int eph_mkdir_p(const char *path, mode_t mode, eph_error_t *err);

/* Reads a whole file into a NUL-terminated heap buffer (owned by the caller), refusing
 * files over max_bytes. *bytes (optional) gets the length. */
int eph_read_file(const char *path, size_t max_bytes, char **out, size_t *bytes, eph_error_t *err);

#endif
