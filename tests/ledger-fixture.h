/* What the two builds of the ledger tests share (tests/test-ledger.c, and for
 * TEST_LEDGER_PG tests/test-ledger-pg.c): the fixture (a loaded plugin, a temporary
 * directory, the fake host), the database read behind the plugin's back (raw_*), and the
 * journal check every test ends with. Definitions in tests/ledger-fixture.c. */
#ifndef EPH_TESTS_LEDGER_FIXTURE_H
#define EPH_TESTS_LEDGER_FIXTURE_H

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#if TEST_LEDGER_PG
#include <fcntl.h>
#include <libpq-fe.h>
#include <sys/stat.h>
#else
#include <sqlite3.h>
#endif

#include "conf.h"
#include "mock-host.h"
#include "loader.h"
#include "log.h"
#include "util.h"

#if TEST_LEDGER_PG
#define PLUGIN_NAME "ledger-postgres"
typedef PGconn raw_t;
/* The journal's columns written by a rogue client's INSERT: PostgreSQL's entries also name
 * the node that wrote them. */
#define ENTRY_INSERT(cols, vals) "INSERT INTO entries(node, " cols ") VALUES ('rogue', " vals ")"
#else
#define PLUGIN_NAME "ledger-sqlite"
typedef sqlite3 raw_t;
#define ENTRY_INSERT(cols, vals) "INSERT INTO entries(" cols ") VALUES (" vals ")"
#endif

typedef struct fixture {
  char dir[64];
  char db_path[128];
  eph_host_t host;
  eph_plugins_t plugins;
  config_t cfg;
  const eph_ledger_ops_t *ops;
  void *state;
} fixture_t;

/* The plugin's file in the build tree. */
const char *plugin_path(void);
#if TEST_LEDGER_PG
/* EPH_TEST_DATABASE; skips the whole program (a TAP skip plan) when it is not set. */
const char *test_database(void);
#endif
/* Loads the plugin with the config block text `block` (NULL: no block of its own; the
 * PostgreSQL build always names the test database unless the block has a `database`, or
 * with_database is false). load: with_database. */
int load_as(fixture_t *f, const char *block, bool with_database, eph_error_t *err);
int load(fixture_t *f, const char *block, eph_error_t *err);
void unload(fixture_t *f);
/* The database read and written behind the plugin's back (sqlite3 or libpq): raw_int, one
 * integer from sql (?1 = arg, NULL: none); raw_exec, sql run as a rogue client would: 0 it
 * passed, 1 the schema refused it (a constraint or trigger), -1 any other failure (msg, when
 * not NULL, gets the database's message); raw_reset, a fresh database before a test. */
raw_t *raw_open(fixture_t *f);
void raw_close(raw_t *db);
int64_t raw_int(raw_t *db, const char *sql, const char *arg);
int raw_exec(raw_t *db, const char *sql, char *msg, size_t n);
void raw_reset(void);
int setup(void **st);
int teardown(void **st);
/* Recomputes every total from the journal alone and compares with the derived tables and
 * with the invariants. */
void check_journal(fixture_t *f);
int64_t balance(fixture_t *f, const char *org);

#if TEST_LEDGER_PG
/* tests/test-ledger-pg.c: the PostgreSQL build's own tests. */
void test_pg_config_and_unreachable(void **st);
void test_pg_server_stopped_mid_run(void **st);
void test_pg_concurrent_charges_one_reservation(void **st);
void test_pg_processes_share_one_ledger(void **st);
void test_pg_core_database_by_default(void **st);
void test_pg_settle_open_own_node_only(void **st);
void test_pg_stuck_lock_times_out(void **st);
void test_pg_runtime_role_cannot_bypass_journal(void **st);
void test_pg_search_path_cannot_hijack_operators(void **st);
#endif

#endif
