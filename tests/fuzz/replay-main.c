/* Replays a fuzz target's corpus without libFuzzer: `make check` runs each target's
 * LLVMFuzzerTestOneInput over every file of tests/fuzz/corpus/<target>/ (the seeds and
 * the inputs of crashes found and fixed) under the ordinary build (gcc, ASan+UBSan when
 * configured), so a fixed crash stays fixed without clang.
 *
 *   replay-<target> [FILE|DIR]...   default: $EPH_SRCDIR/tests/fuzz/corpus/<target>
 *
 * TAP output: one line per input. A crash is the sanitizer's abort and a hang (over
 * REPLAY_TIMEOUT_S) ends in SIGALRM; the TAP driver reports either as a failed test with the
 * input's name and the stack trace in the log. */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"

#ifndef FUZZ_TARGET
#error "FUZZ_TARGET (the corpus directory name) must be defined"
#endif

/* Seconds per input (EPH_FUZZ_REPLAY_TIMEOUT_S overrides): the targets take milliseconds
 * on the seeds; this is for a loaded machine. */
#define REPLAY_TIMEOUT_S 60

typedef struct {
  char **v;
  size_t n;
} paths_t;

static void
add_path(paths_t *p, const char *path)
{
  p->v = realloc(p->v, (p->n + 1) * sizeof *p->v);
  if (!p->v || !(p->v[p->n] = strdup(path))) {
    perror("out of memory");
    exit(99);
  }
  p->n++;
}

static int
cmp(const void *a, const void *b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A directory contributes its regular files (not recursive), in name order. */
static void
collect(paths_t *p, const char *path)
{
  struct stat st;
  if (stat(path, &st) < 0) {
    fprintf(stderr, "%s: %s\n", path, strerror(errno));
    exit(99);
  }
  if (!S_ISDIR(st.st_mode)) {
    add_path(p, path);
    return;
  }
  DIR *d = opendir(path);
  if (!d) {
    fprintf(stderr, "%s: %s\n", path, strerror(errno));
    exit(99);
  }
  size_t first = p->n;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.')
      continue;
    char full[4096];
    snprintf(full, sizeof full, "%s/%s", path, e->d_name);
    if (stat(full, &st) == 0 && S_ISREG(st.st_mode))
      add_path(p, full);
  }
  closedir(d);
  qsort(p->v + first, p->n - first, sizeof *p->v, cmp);
}

static unsigned char *
slurp(const char *path, size_t *size)
{
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  unsigned char *buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len == cap) {
      cap = cap ? cap * 2 : 4096;
      unsigned char *nb = realloc(buf, cap);
      if (!nb) {
        free(buf);
        fclose(f);
        return NULL;
      }
      buf = nb;
    }
    size_t n = fread(buf + len, 1, cap - len, f);
    len += n;
    if (n == 0)
      break;
  }
  fclose(f);
  /* Exactly size bytes on the heap, as libFuzzer hands them: ASan sees any over-read. */
  unsigned char *exact = malloc(len ? len : 1);
  if (exact && len)
    memcpy(exact, buf, len);
  free(buf);
  *size = len;
  return exact;
}

int
main(int argc, char **argv)
{
  paths_t paths = {0};
  if (LLVMFuzzerInitialize)
    LLVMFuzzerInitialize(&argc, &argv);
  if (argc > 1) {
    for (int i = 1; i < argc; i++)
      collect(&paths, argv[i]);
  } else {
    const char *src = getenv("EPH_SRCDIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/%s", src ? src : EPH_SRCDIR, FUZZ_TARGET);
    collect(&paths, dir);
  }
  if (paths.n == 0) {
    printf("1..0 # SKIP no corpus files\n");
    return 0;
  }
  const char *t = getenv("EPH_FUZZ_REPLAY_TIMEOUT_S");
  unsigned timeout_s = t && atoi(t) > 0 ? (unsigned)atoi(t) : REPLAY_TIMEOUT_S;
  printf("1..%zu\n", paths.n);
  fflush(stdout);
  for (size_t i = 0; i < paths.n; i++) {
    size_t size = 0;
    unsigned char *data = slurp(paths.v[i], &size);
    if (!data) {
      printf("not ok %zu - %s: %s\n", i + 1, paths.v[i], strerror(errno));
      free(paths.v[i]);
      continue;
    }
    /* A hang is a failure too (libFuzzer's -timeout): SIGALRM ends the test, and the
     * line above names the input. */
    printf("# %s\n", paths.v[i]);
    fflush(stdout);
    alarm(timeout_s);
    LLVMFuzzerTestOneInput(data, size);
    alarm(0);
    free(data);
    const char *base = strrchr(paths.v[i], '/');
    printf("ok %zu - %s %s (%zu bytes)\n", i + 1, FUZZ_TARGET, base ? base + 1 : paths.v[i], size);
    fflush(stdout);
    free(paths.v[i]);
  }
  free(paths.v);
  return 0;
}
