/* ledger-bench: ledger charges per second on a real SQLite file, beside the peer figure of
 * plain sqlite3 INSERTs in autocommit mode on the same kind of file (WAL, same synchronous
 * setting). A ledger charge is one BEGIN IMMEDIATE transaction that reads the reservation,
 * checks the cap and appends an entry whose triggers update the derived totals; the peer is
 * the cheapest durable write SQLite can do, so the ratio is the price of the checks.
 *
 * Usage: ledger-bench [charges] [plugin.so]   (defaults: 20000, the build tree's plugin)
 * Prints figures; never fails on speed. */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "conf.h"
#include "loader.h"
#include "log.h"
#include "util.h"

static double
now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double
bench_ledger(const char *so, const char *dir, const char *sync, long n)
{
  eph_host_t host = {
    .struct_size = sizeof host,
    .abi_major = EPH_ABI_MAJOR,
    .abi_minor = EPH_ABI_MINOR,
    .log = eph_log,
    .cfg_int = eph_cfg_int,
    .cfg_bool = eph_cfg_bool,
    .cfg_string = eph_cfg_string,
    .state_dir = dir,
  };
  config_t cfg;
  config_init(&cfg);
  char text[256];
  snprintf(text, sizeof text, "ledger-sqlite: { path = \"ledger-%s.sqlite\"; synchronous = \"%s\"; };",
           sync, sync);
  if (config_read_string(&cfg, text) != CONFIG_TRUE) {
    fprintf(stderr, "ledger-bench: bad config\n");
    exit(1);
  }
  eph_plugins_t ps = {0};
  eph_error_t err = {0};
  int warnings = 0;
  if (eph_plugin_load_file(&ps, so, config_lookup(&cfg, "ledger-sqlite"), &host, &warnings,
                           &err) < 0) {
    fprintf(stderr, "ledger-bench: %s\n", err.message);
    exit(1);
  }
  const eph_plugin_slot_t *slot = eph_plugins_first(&ps, EPH_KIND_LEDGER);
  const eph_ledger_ops_t *ops = slot->desc->ops;
  void *st = slot->state;
  if (ops->credit(st, "bench", INT64_MAX / 2, &err) < 0 ||
      ops->reserve(st, "bench", "run_bench", INT64_MAX / 4, &err) < 0) {
    fprintf(stderr, "ledger-bench: %s\n", err.message);
    exit(1);
  }
  static const eph_cost_t cats[] = {EPH_COST_MODEL, EPH_COST_WEB, EPH_COST_COMPUTE};
  double t0 = now_s();
  for (long i = 0; i < n; i++) {
    if (ops->charge(st, "run_bench", cats[i % 3], 1 + i % 97, "bench charge", &err) < 0) {
      fprintf(stderr, "ledger-bench: charge %ld: %s\n", i, err.message);
      exit(1);
    }
  }
  double dt = now_s() - t0;
  eph_ledger_totals_t t;
  ops->settle(st, "run_bench", &t, &err);
  eph_plugins_unload(&ps);
  config_destroy(&cfg);
  return (double)n / dt;
}

static double
bench_sqlite(const char *dir, const char *sync, long n)
{
  char path[PATH_MAX], pragmas[128];
  snprintf(path, sizeof path, "%s/plain-%s.sqlite", dir, sync);
  snprintf(pragmas, sizeof pragmas, "PRAGMA journal_mode=WAL; PRAGMA synchronous=%s;", sync);
  sqlite3 *db = NULL;
  sqlite3_stmt *s = NULL;
  if (sqlite3_open(path, &db) != SQLITE_OK ||
      sqlite3_exec(db, pragmas, NULL, NULL, NULL) != SQLITE_OK ||
      sqlite3_exec(db,
                   "CREATE TABLE entries(seq INTEGER PRIMARY KEY, t_us INTEGER, run_id TEXT,"
                   " category TEXT, micros INTEGER, memo TEXT)",
                   NULL, NULL, NULL) != SQLITE_OK ||
      sqlite3_prepare_v2(db, "INSERT INTO entries(t_us, run_id, category, micros, memo)"
                             " VALUES (?1, ?2, ?3, ?4, ?5)", -1, &s, NULL) != SQLITE_OK) {
    fprintf(stderr, "ledger-bench: %s: %s\n", path, sqlite3_errmsg(db));
    exit(1);
  }
  static const char *const cats[] = {"model", "web", "compute"};
  double t0 = now_s();
  for (long i = 0; i < n; i++) {
    sqlite3_bind_int64(s, 1, eph_wall_us());
    sqlite3_bind_text(s, 2, "run_bench", -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, cats[i % 3], -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 4, 1 + i % 97);
    sqlite3_bind_text(s, 5, "bench charge", -1, SQLITE_STATIC);
    if (sqlite3_step(s) != SQLITE_DONE) {
      fprintf(stderr, "ledger-bench: insert: %s\n", sqlite3_errmsg(db));
      exit(1);
    }
    sqlite3_reset(s);
  }
  double dt = now_s() - t0;
  sqlite3_finalize(s);
  sqlite3_close(db);
  return (double)n / dt;
}

int
main(int argc, char **argv)
{
  long n = argc > 1 ? strtol(argv[1], NULL, 10) : 20000;
  char so[PATH_MAX];
  if (argc > 2)
    snprintf(so, sizeof so, "%s", argv[2]);
  else
    snprintf(so, sizeof so, "%s/plugins/.libs/ledger-sqlite.so",
             getenv("EPH_BUILDDIR") ? getenv("EPH_BUILDDIR") : EPH_BUILDDIR);
  char dir[] = "/tmp/eph-ledger-bench-XXXXXX";
  if (n <= 0 || !mkdtemp(dir)) {
    fprintf(stderr, "usage: ledger-bench [charges > 0] [plugin.so]\n");
    return 2;
  }
  printf("ledger-bench: %ld operations per figure, SQLite %s, files in %s\n", n,
         sqlite3_libversion(), dir);
  printf("%-10s %22s %28s %8s\n", "synchronous", "ledger charges/s",
         "peer: plain INSERT autocommit/s", "ratio");
  static const char *const modes[] = {"full", "normal"};
  for (int i = 0; i < 2; i++) {
    double l = bench_ledger(so, dir, modes[i], n);
    double p = bench_sqlite(dir, modes[i], n);
    printf("%-10s %22.0f %28.0f %7.2fx\n", modes[i], l, p, p / l);
  }
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd) == 0 ? 0 : 1;
}
