/* `ephemeral db migrate`: creates or migrates the configured store's schema, the same
 * migrations ephemerald applies at start (core/store_sqlite.c, core/store_pg.c). An
 * operator runs it before a rolling upgrade of a cluster so no node waits on the lock. */
#include "config.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cluster.h"
#include "log.h"
#include "store.h"
#include "util.h"

int
eph_cmd_db_check(int argc, char **argv)
{
  int n = eph_cli_operands("db", argc, argv, 1);
  if (n == 1 && strcmp(argv[optind], "migrate") != 0)
    eph_error("db: unknown subcommand '%s'", argv[optind]);
  else if (n == 1)
    return -1;
  fputs("usage: ephemeral db migrate\n", stderr);
  return 2;
}

int
eph_cmd_db(eph_ctx_t *ctx, int argc, char **argv)
{
  int bad = eph_cmd_db_check(argc, argv);
  if (bad >= 0)
    return bad;
  eph_store_t *store = NULL;
  eph_error_t err = {0};
  if (eph_store_open_ctx(ctx, NULL, false, &store, &err) < 0) {
    eph_error("%s", err.message);
    return 1;
  }
  printf("%s: schema version %d (%s)\n", eph_store_path(store), eph_store_schema_version(store),
         eph_store_kind(store) == EPH_STORE_POSTGRES ? "PostgreSQL" : "SQLite");
  eph_store_close(store);
  return 0;
}
