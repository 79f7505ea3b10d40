/* bench/qemu-pool-bench: a microVM restore as ephemerald makes it (several sandboxes from one
 * process), without and with backend-qemu's pool (key `pool`), side by side: N interleaved
 * pairs, each "ready" = create() until the guest's hello (what the core logs as "microVM
 * ready"), and each phase from the backend's "restore phases" line: median (min-max).
 * Between pairs the pooled instance's replacement is left to load (a daemon's steady state:
 * the pool refilled between runs), so neither column pays for the other's background work.
 * Figures only, never a test. usage: bench/qemu-pool-bench [N]   (as root; EPH_BUILDDIR,
 * EPH_STATE_DIR as for tests/qemu-pool.test: bench/qemu-bench sets them). */
#define _GNU_SOURCE
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ephemeral/plugin.h>

#include "guest/protocol.h"
#include "tests/mock-host.h"

enum { PHASES = 7 }; /* prepare, QEMU start, migration, resume, hello, ready, QEMU CPU */
static const char *const phase_names[PHASES] = {
    "prepare", "QEMU start",    "incoming migration", "resume",
    "hello",   "ready (total)", "QEMU CPU at resume"};

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char last_phases[512];
static int loaded_count;

static void
bench_log(eph_log_level_t level, const char *fmt, ...)
{
  char line[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  (void)level;
  pthread_mutex_lock(&log_lock);
  const char *p = strstr(line, "restore phases: ");
  if (p)
    snprintf(last_phases, sizeof last_phases, "%s", p);
  if (strstr(line, "loaded and paused"))
    loaded_count++;
  pthread_mutex_unlock(&log_lock);
}

typedef struct inst {
  fh_backend_t b;
  config_t cfg;
} inst_t;

static int
load(inst_t *in, const char *so, int pool)
{
  char text[256];
  snprintf(text, sizeof text, "backend-qemu: { pool = %d; snapshot = true; };", pool);
  config_init(&in->cfg);
  if (config_read_string(&in->cfg, text) != CONFIG_TRUE)
    return -1;
  /* RTLD_LOCAL twice: one copy, two independent states */
  eph_error_t err = {0};
  if (fh_backend_load(&in->b, so, config_lookup(&in->cfg, "backend-qemu"), &err) < 0) {
    fprintf(stderr, "%s\n", err.message);
    return -1;
  }
  return 0;
}

/* One sandbox: create, the hello, destroy. Fills ms[PHASES]; 0 or -1. */
static int
one(inst_t *in, const char *id, int64_t ms[PHASES])
{
  eph_sandbox_spec_t spec = {.struct_size = sizeof spec, .run_id = id, .proxy_netns_fd = -1};
  eph_sandbox_t *s = NULL;
  int fd = -1;
  eph_error_t err = {0};
  int64_t t0 = eph_now_ms();
  if (in->b.ops->create(in->b.state, &spec, &s, &fd, &err) < 0) {
    fprintf(stderr, "create: %s\n", err.message);
    return -1;
  }
  json_object *hello = fh_first_frame(fd, 60000 - (eph_now_ms() - t0));
  int64_t ready = eph_now_ms() - t0;
  int r = hello ? 0 : -1;
  json_object_put(hello);
  long long v[6] = {0};
  pthread_mutex_lock(&log_lock);
  int got = sscanf(last_phases,
                   "restore phases: prepare %lld ms, QEMU start %lld ms, incoming migration "
                   "%lld ms, resume %lld ms, create %lld ms (QEMU used %lld ms",
                   &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]);
  last_phases[0] = '\0';
  pthread_mutex_unlock(&log_lock);
  if (got != 6)
    r = -1;
  ms[0] = v[0], ms[1] = v[1], ms[2] = v[2], ms[3] = v[3], ms[4] = ready - v[4], ms[5] = ready;
  ms[6] = v[5];
  eph_sandbox_report_t rep = {.struct_size = sizeof rep};
  in->b.ops->destroy(in->b.state, s, &rep, &err);
  close(fd);
  return r;
}

static int
cmp64(const void *a, const void *b)
{
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

static void
cell(int64_t *v, int n, char *out, size_t size)
{
  qsort(v, (size_t)n, sizeof *v, cmp64);
  snprintf(out, size, "%" PRId64 " (%" PRId64 "-%" PRId64 ")", v[n / 2], v[0], v[n - 1]);
}

int
main(int argc, char **argv)
{
  int n = argc > 1 ? atoi(argv[1]) : 10;
  const char *state = getenv("EPH_STATE_DIR"), *b = getenv("EPH_BUILDDIR");
  if (n < 1 || !state || !b) {
    fprintf(stderr, "usage: EPH_BUILDDIR=... EPH_STATE_DIR=... %s [N]\n", argv[0]);
    return 2;
  }
  char so[1024];
  snprintf(so, sizeof so, "%s/plugins/.libs/backend-qemu.so", b);
  fh_reset(1000000, state, NULL);
  fh_host.log = bench_log;
  inst_t plain, pooled;
  if (load(&plain, so, 0) < 0 || load(&pooled, so, 1) < 0)
    return 1;
  int64_t(*m)[2][PHASES] = calloc((size_t)n, sizeof *m);
  char id[64];
  /* warm-up, not counted: the snapshot exists, the pool has its first microVM loaded */
  int64_t scratch[PHASES];
  for (int i = 0; i < 2; i++) {
    snprintf(id, sizeof id, "poolbench-%d-w%d", (int)getpid(), i);
    if (one(&pooled, id, scratch) < 0 || one(&plain, id, scratch) < 0)
      return 1;
  }
  int done = 0;
  for (int i = 0; i < n; i++) {
    /* the pool refilled: wait (at most 60 s) for its microVM to have loaded */
    for (int64_t end = eph_now_ms() + 60000; eph_now_ms() < end; usleep(20000)) {
      pthread_mutex_lock(&log_lock);
      int c = loaded_count;
      pthread_mutex_unlock(&log_lock);
      if (c >= i + 1)
        break;
    }
    snprintf(id, sizeof id, "poolbench-%d-p%d", (int)getpid(), i);
    if (one(&plain, id, m[done][0]) < 0)
      continue;
    snprintf(id, sizeof id, "poolbench-%d-q%d", (int)getpid(), i);
    if (one(&pooled, id, m[done][1]) < 0)
      continue;
    done++;
  }
  if (!done)
    return 1;
  printf("microVM ready from snapshot, %d interleaved pairs (ms, median (min-max))\n", done);
  printf("%-20s %-20s %-20s\n", "phase", "restore", "pooled restore");
  int64_t *col = calloc((size_t)done, sizeof *col);
  for (int p = 0; p < PHASES; p++) {
    char c0[64], c1[64];
    for (int i = 0; i < done; i++)
      col[i] = m[i][0][p];
    cell(col, done, c0, sizeof c0);
    for (int i = 0; i < done; i++)
      col[i] = m[i][1][p];
    cell(col, done, c1, sizeof c1);
    printf("%-20s %-20s %-20s\n", phase_names[p], c0, c1);
  }
  free(col);
  free(m);
  fh_backend_unload(&pooled.b);
  fh_backend_unload(&plain.b);
  config_destroy(&pooled.cfg);
  config_destroy(&plain.cfg);
  fh_free();
  return 0;
}
