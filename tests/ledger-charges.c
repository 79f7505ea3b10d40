/* tests/ledger-charges: drives the real ledger-sqlite plugin through one run's money, each
 * step followed by a marker line on stdout, so tests/ledger-group-commit.test can see (with
 * strace) which steps fsync the file:
 *   "credit" "reserve" then N charges "charges", then "settle".
 * Usage: ledger-charges STATE_DIR N */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loader.h"
#include "mock-host.h"

static void
mark(const char *what)
{
  /* One write(2) per marker: strace shows it between the steps' fdatasync calls. */
  char line[32];
  int n = snprintf(line, sizeof line, "%s\n", what);
  if (write(STDOUT_FILENO, line, (size_t)n) != n)
    exit(1);
}

int
main(int argc, char **argv)
{
  if (argc < 3)
    return 2;
  int n = atoi(argv[2]);
  fh_reset(0, argv[1], NULL);
  char path[4096];
  const char *b = getenv("EPH_BUILDDIR");
  snprintf(path, sizeof path, "%s/plugins/.libs/ledger-sqlite.so", b ? b : EPH_BUILDDIR);
  eph_plugins_t ps = {0};
  eph_error_t err = {0};
  int warnings = 0;
  if (eph_plugin_load_file(&ps, path, NULL, &fh_host, &warnings, &err) < 0) {
    fprintf(stderr, "%s\n", err.message);
    return 1;
  }
  const eph_ledger_ops_t *ops = ps.slots[0].desc->ops;
  void *st = ps.slots[0].state;
  int r = ops->credit(st, "acme", 1000000, &err);
  mark("credit");
  if (r == 0)
    r = ops->reserve(st, "acme", "run_group", 100000, &err);
  mark("reserve");
  for (int i = 0; r == 0 && i < n; i++)
    r = ops->charge(st, "run_group", EPH_COST_MODEL, 1, "call", &err);
  mark("charges");
  eph_ledger_totals_t t = {0};
  if (r == 0)
    r = ops->settle(st, "run_group", &t, &err);
  mark("settle");
  if (r < 0 || t.billed_micros != n) {
    fprintf(stderr, "ledger: %s (billed %lld)\n", err.message, (long long)t.billed_micros);
    r = -1;
  }
  eph_plugins_unload(&ps);
  fh_free();
  return r < 0 ? 1 : 0;
}
