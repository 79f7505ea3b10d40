/* ledger-bench: the two ledger plugins side by side, ledger-sqlite (its shipped settings:
 * WAL, synchronous = full) and ledger-postgres (on the database given, e.g. the throw-away
 * cluster of tests/with-pg: fsync on, synchronous_commit on, over a Unix socket), each loaded
 * through the core's loader as the daemon loads it. Three figures per ledger:
 *   charges/s           one thread charging one reservation (the meter's pattern);
 *   charges/s, T threads  T threads each charging its own reservation at once (the HTTP,
 *                       run and meter threads of a busy daemon; SQLite serialises writers,
 *                       PostgreSQL takes one connection of its pool per thread);
 *   cycles/s            reserve -> charge -> settle of a fresh run (one run's whole life).
 * Rounds are interleaved (sqlite, postgres, sqlite, ...) so drift on a shared machine hits
 * both alike; each figure is the median of the rounds with their min-max.
 *
 * Usage: ledger-bench [--rounds N] [--charges N] [--cycles N] [--threads N]
 *                     [--database URL]
 * --database defaults to $EPH_TEST_DATABASE: `tests/with-pg _b/bench/ledger-bench` runs both;
 * without a database only ledger-sqlite is measured. Prints figures; never fails on speed. */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "conf.h"
#include "loader.h"
#include "log.h"
#include "util.h"

enum { FIG_CHARGES, FIG_THREADED, FIG_CYCLES, FIG_COUNT };
static const char *const fig_names[FIG_COUNT] = {"charges/s (1 thread)", "charges/s (T threads)",
                                                 "reserve-charge-settle cycles/s"};
#define MAX_ROUNDS 101

typedef struct ledger {
  const char *name;
  eph_plugins_t ps;
  config_t cfg;
  eph_host_t host;
  const eph_ledger_ops_t *ops;
  void *st;
  double fig[FIG_COUNT][MAX_ROUNDS];
} ledger_t;

static long n_charges = 2000, n_cycles = 300, n_threads = 4;
static unsigned long run_seq;

static double
now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void
die(const char *what, const eph_error_t *err)
{
  fprintf(stderr, "ledger-bench: %s: %s\n", what, err->message);
  exit(1);
}

static void
open_ledger(ledger_t *l, const char *name, const char *block, const char *state_dir)
{
  l->name = name;
  l->host = (eph_host_t){
      .struct_size = sizeof l->host,
      .abi_major = EPH_ABI_MAJOR,
      .abi_minor = EPH_ABI_MINOR,
      .log = eph_log,
      .cfg_int = eph_cfg_int,
      .cfg_bool = eph_cfg_bool,
      .cfg_string = eph_cfg_string,
      .state_dir = state_dir,
  };
  config_init(&l->cfg);
  if (config_read_string(&l->cfg, block) != CONFIG_TRUE) {
    fprintf(stderr, "ledger-bench: bad config for %s\n", name);
    exit(1);
  }
  char so[PATH_MAX];
  snprintf(so, sizeof so, "%s/plugins/.libs/%s.so",
           getenv("EPH_BUILDDIR") ? getenv("EPH_BUILDDIR") : EPH_BUILDDIR, name);
  eph_error_t err = {0};
  int warnings = 0;
  if (eph_plugin_load_file(&l->ps, so, config_lookup(&l->cfg, name), &l->host, &warnings, &err) < 0)
    die(so, &err);
  const eph_plugin_slot_t *slot = eph_plugins_first(&l->ps, EPH_KIND_LEDGER);
  l->ops = slot->desc->ops;
  l->st = slot->state;
  char org[64];
  snprintf(org, sizeof org, "bench-%d", (int)getpid());
  if (l->ops->credit(l->st, org, INT64_MAX / 2, &err) < 0)
    die("credit", &err);
}

static void
new_run(ledger_t *l, char *run, size_t n, int64_t micros)
{
  char org[64];
  snprintf(org, sizeof org, "bench-%d", (int)getpid());
  snprintf(run, n, "run_bench_%d_%lu", (int)getpid(),
           __atomic_add_fetch(&run_seq, 1, __ATOMIC_RELAXED));
  eph_error_t err = {0};
  if (l->ops->reserve(l->st, org, run, micros, &err) < 0)
    die("reserve", &err);
}

static void
charge_many(ledger_t *l, const char *run, long n)
{
  static const eph_cost_t cats[] = {EPH_COST_MODEL, EPH_COST_WEB, EPH_COST_COMPUTE};
  for (long i = 0; i < n; i++) {
    eph_error_t err = {0};
    if (l->ops->charge(l->st, run, cats[i % 3], 1 + i % 97, "bench charge", &err) < 0)
      die("charge", &err);
  }
}

static void
settle(ledger_t *l, const char *run)
{
  eph_error_t err = {0};
  eph_ledger_totals_t t;
  if (l->ops->settle(l->st, run, &t, &err) < 0)
    die("settle", &err);
}

typedef struct worker {
  ledger_t *l;
  char run[96];
} worker_t;

static void *
worker_main(void *p)
{
  worker_t *w = p;
  charge_many(w->l, w->run, n_charges / n_threads);
  return NULL;
}

static void
one_round(ledger_t *l, int round)
{
  char run[96];
  new_run(l, run, sizeof run, INT64_MAX / 8);
  double t0 = now_s();
  charge_many(l, run, n_charges);
  l->fig[FIG_CHARGES][round] = (double)n_charges / (now_s() - t0);
  settle(l, run);

  worker_t w[64];
  pthread_t th[64];
  for (long i = 0; i < n_threads; i++) {
    w[i].l = l;
    new_run(l, w[i].run, sizeof w[i].run, INT64_MAX / 256);
  }
  t0 = now_s();
  for (long i = 0; i < n_threads; i++)
    pthread_create(&th[i], NULL, worker_main, &w[i]);
  for (long i = 0; i < n_threads; i++)
    pthread_join(th[i], NULL);
  l->fig[FIG_THREADED][round] = (double)(n_charges / n_threads * n_threads) / (now_s() - t0);
  for (long i = 0; i < n_threads; i++)
    settle(l, w[i].run);

  t0 = now_s();
  for (long i = 0; i < n_cycles; i++) {
    new_run(l, run, sizeof run, 40000);
    charge_many(l, run, 1);
    settle(l, run);
  }
  l->fig[FIG_CYCLES][round] = (double)n_cycles / (now_s() - t0);
}

static int
cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void
summary(const double *v, int n, char *out, size_t size)
{
  double s[MAX_ROUNDS];
  memcpy(s, v, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  double med = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
  snprintf(out, size, "%8.0f (%.0f-%.0f)", med, s[0], s[n - 1]);
}

int
main(int argc, char **argv)
{
  long rounds = 5;
  const char *database = getenv("EPH_TEST_DATABASE");
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (v && strcmp(a, "--rounds") == 0)
      rounds = strtol(v, NULL, 10), i++;
    else if (v && strcmp(a, "--charges") == 0)
      n_charges = strtol(v, NULL, 10), i++;
    else if (v && strcmp(a, "--cycles") == 0)
      n_cycles = strtol(v, NULL, 10), i++;
    else if (v && strcmp(a, "--threads") == 0)
      n_threads = strtol(v, NULL, 10), i++;
    else if (v && strcmp(a, "--database") == 0)
      database = v, i++;
    else {
      fprintf(stderr, "usage: ledger-bench [--rounds N] [--charges N] [--cycles N] "
                      "[--threads N] [--database URL]\n");
      return 2;
    }
  }
  if (rounds < 1 || rounds > MAX_ROUNDS - 1 || n_charges < 1 || n_cycles < 1 || n_threads < 1 ||
      n_threads > 64) {
    fprintf(stderr, "ledger-bench: --rounds 1..100, --threads 1..64, counts > 0\n");
    return 2;
  }
  char dir[] = "/tmp/eph-ledger-bench-XXXXXX";
  if (!mkdtemp(dir)) {
    perror("ledger-bench: mkdtemp");
    return 1;
  }
  static ledger_t ledgers[2];
  int n = 0;
  open_ledger(&ledgers[n++], "ledger-sqlite", "ledger-sqlite: { synchronous = \"full\"; };", dir);
  if (database && *database) {
    char block[2048];
    snprintf(block, sizeof block,
             "ledger-postgres: { database = \"%s\"; connections = %ld; node_name = \"bench\"; };",
             database, n_threads);
    open_ledger(&ledgers[n++], "ledger-postgres", block, dir);
  }
  printf("ledger-bench: %ld rounds interleaved; per round %ld charges, %ld cycles, T = %ld "
         "threads\n",
         rounds, n_charges, n_cycles, n_threads);
  printf("ledger-sqlite: %s/ledger.sqlite (WAL, synchronous = full)\n", dir);
  if (n > 1)
    printf("ledger-postgres: %s\n", database);
  else
    printf("ledger-postgres: not measured (no --database, no EPH_TEST_DATABASE: run it "
           "under tests/with-pg)\n");
  for (int r = 0; r < rounds; r++)
    for (int i = 0; i < n; i++)
      one_round(&ledgers[i], r);
  printf("\n%-32s %-28s %-28s\n", "median (min-max)", "ledger-sqlite",
         n > 1 ? "ledger-postgres" : "");
  for (int f = 0; f < FIG_COUNT; f++) {
    char a[64], b[64] = "";
    summary(ledgers[0].fig[f], (int)rounds, a, sizeof a);
    if (n > 1)
      summary(ledgers[1].fig[f], (int)rounds, b, sizeof b);
    char label[64];
    snprintf(label, sizeof label, "%s", fig_names[f]);
    if (f == FIG_THREADED)
      snprintf(label, sizeof label, "charges/s (%ld threads)", n_threads);
    printf("%-32s %-28s %-28s\n", label, a, b);
  }
  for (int i = 0; i < n; i++) {
    eph_plugins_unload(&ledgers[i].ps);
    config_destroy(&ledgers[i].cfg);
  }
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd) == 0 ? 0 : 1;
}
