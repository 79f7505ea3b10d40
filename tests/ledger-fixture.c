/* See ledger-fixture.h. */
#include "config.h"

#include "ledger-fixture.h"

const char *
plugin_path(void)
{
  static char path[PATH_MAX];
  const char *b = getenv("EPH_BUILDDIR");
  snprintf(path, sizeof path, "%s/plugins/.libs/" PLUGIN_NAME ".so", b ? b : EPH_BUILDDIR);
  return path;
}

#if TEST_LEDGER_PG
const char *
test_database(void)
{
  const char *db = getenv("EPH_TEST_DATABASE");
  if (!db || !*db) {
    printf("1..0 # SKIP EPH_TEST_DATABASE is not set (run under tests/with-pg)\n");
    exit(0);
  }
  return db;
}
#endif

/* Loads the plugin with the config block text `block` (NULL: no block of its own; the
 * PostgreSQL build always names the test database unless the block has a `database`). */
int
load_as(fixture_t *f, const char *block, bool with_database, eph_error_t *err)
{
  config_init(&f->cfg);
  const config_setting_t *setting = NULL;
  char text[2048];
#if TEST_LEDGER_PG
  if (with_database)
    snprintf(text, sizeof text, PLUGIN_NAME ": { database = \"%s\"; %s };", test_database(),
             block ? block : "");
  else
    snprintf(text, sizeof text, PLUGIN_NAME ": { %s };", block ? block : "");
  block = text;
#else
  (void)with_database;
  if (block)
    snprintf(text, sizeof text, PLUGIN_NAME ": { %s };", block);
#endif
  if (block) {
    assert_int_equal(config_read_string(&f->cfg, text), CONFIG_TRUE);
    setting = config_lookup(&f->cfg, PLUGIN_NAME);
  }
  memset(&f->plugins, 0, sizeof f->plugins);
  int warnings = 0;
  int r = eph_plugin_load_file(&f->plugins, plugin_path(), setting, &f->host, &warnings, err);
  if (r < 0)
    return r;
  const eph_plugin_slot_t *slot = eph_plugins_first(&f->plugins, EPH_KIND_LEDGER);
  assert_non_null(slot);
  f->ops = slot->desc->ops;
  f->state = slot->state;
  return 0;
}

int
load(fixture_t *f, const char *block, eph_error_t *err)
{
  return load_as(f, block, true, err);
}

void
unload(fixture_t *f)
{
  eph_plugins_unload(&f->plugins);
  config_destroy(&f->cfg);
  f->ops = NULL;
  f->state = NULL;
}

/* ---------------------------------------------------------------- raw SQL checks */

#if TEST_LEDGER_PG
raw_t *
raw_open(fixture_t *f)
{
  (void)f;
  PGconn *db = PQconnectdb(test_database());
  if (PQstatus(db) != CONNECTION_OK)
    fail_msg("connecting to %s: %s", test_database(), PQerrorMessage(db));
  PGresult *res = PQexec(db, "SET search_path = ledger");
  assert_int_equal(PQresultStatus(res), PGRES_COMMAND_OK);
  PQclear(res);
  return db;
}

void
raw_close(raw_t *db)
{
  PQfinish(db);
}

/* One integer from `sql` (SQLite's ?1 placeholder, turned into $1). */
int64_t
raw_int(raw_t *db, const char *sql, const char *arg)
{
  char pg_sql[2048];
  snprintf(pg_sql, sizeof pg_sql, "%s", sql);
  for (char *p = pg_sql; (p = strstr(p, "?1")); p++)
    *p = '$';
  const char *params[] = {arg};
  PGresult *res = PQexecParams(db, pg_sql, arg ? 1 : 0, NULL, arg ? params : NULL, NULL, NULL, 0);
  if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
    fail_msg("%s: %s", sql, PQresultErrorMessage(res));
  int64_t v = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
  PQclear(res);
  return v;
}

/* Runs sql as a rogue client would: 0 it passed, 1 the schema refused it (an integrity
 * constraint or trigger: SQLSTATE class 23), -1 any other failure. msg: the server's. */
int
raw_exec(raw_t *db, const char *sql, char *msg, size_t n)
{
  PGresult *res = PQexec(db, sql);
  ExecStatusType st = PQresultStatus(res);
  const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
  int r = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK ? 0
          : state && strncmp(state, "23", 2) == 0         ? 1
                                                          : -1;
  if (msg)
    snprintf(msg, n, "%s", PQresultErrorMessage(res));
  if (r < 0)
    print_message("# %s: %s", sql, PQresultErrorMessage(res));
  PQclear(res);
  return r;
}

/* A fresh ledger: the plugin creates the schema again at its next init. */
void
raw_reset(void)
{
  PGconn *db = PQconnectdb(test_database());
  if (PQstatus(db) != CONNECTION_OK)
    fail_msg("connecting to %s: %s", test_database(), PQerrorMessage(db));
  PGresult *res = PQexec(db, "SET client_min_messages = warning;"
                             " DROP SCHEMA IF EXISTS ledger CASCADE");
  assert_int_equal(PQresultStatus(res), PGRES_COMMAND_OK);
  PQclear(res);
  PQfinish(db);
}
#else
raw_t *
raw_open(fixture_t *f)
{
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open_v2(f->db_path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  return db;
}

void
raw_close(raw_t *db)
{
  sqlite3_close(db);
}

int64_t
raw_int(raw_t *db, const char *sql, const char *arg)
{
  sqlite3_stmt *s = NULL;
  assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
  if (arg)
    sqlite3_bind_text(s, 1, arg, -1, SQLITE_STATIC);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  int64_t v = sqlite3_column_int64(s, 0);
  sqlite3_finalize(s);
  return v;
}

/* 0 it passed, 1 the schema refused it (SQLITE_CONSTRAINT), -1 any other failure. */
int
raw_exec(raw_t *db, const char *sql, char *msg, size_t n)
{
  char *m = NULL;
  int rc = sqlite3_exec(db, sql, NULL, NULL, &m);
  if (msg)
    snprintf(msg, n, "%s", m ? m : "");
  sqlite3_free(m);
  return rc == SQLITE_OK ? 0 : (rc & 0xff) == SQLITE_CONSTRAINT ? 1 : -1;
}

void
raw_reset(void)
{
}
#endif

int
setup(void **st)
{
  fixture_t *f = calloc(1, sizeof *f);
  snprintf(f->dir, sizeof f->dir, "/tmp/eph-ledger-test-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  snprintf(f->db_path, sizeof f->db_path, "%s/ledger.sqlite", f->dir);
  raw_reset();
  /* The shared fake host (its log mirrored as TAP comments), with this test's state dir. */
  fh_reset(0, f->dir, NULL);
  fh_log_to_stderr = true;
  f->host = fh_host;
  eph_error_t err = {0};
  if (load(f, NULL, &err) < 0)
    fail_msg("loading %s: %s", plugin_path(), err.message);
  *st = f;
  return 0;
}

int
teardown(void **st)
{
  fixture_t *f = *st;
  if (f->ops)
    unload(f);
  char cmd[160];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
  assert_int_equal(system(cmd), 0);
  free(f);
  fh_free();
  return 0;
}

/* Recomputes every total from the journal alone and compares with the derived tables and
 * with the invariants. */
void
check_journal(fixture_t *f)
{
  raw_t *db = raw_open(f);
  /* Per reservation: charges sum to billed, billed <= reserved, settled => billed+released =
   * reserved. Any row breaking one of these is counted. */
  int64_t bad =
      raw_int(db,
              "SELECT count(*) FROM reservations r WHERE"
              " r.billed_micros != (SELECT coalesce(sum(micros),0) FROM entries e"
              "                     WHERE e.run_id = r.run_id AND e.kind = 'charge')"
              " OR r.reserved_micros != (SELECT sum(micros) FROM entries e"
              "                          WHERE e.run_id = r.run_id AND e.kind = 'reserve')"
              " OR r.billed_micros > r.reserved_micros"
              " OR (r.settled = 1 AND r.billed_micros + r.released_micros != r.reserved_micros)"
              " OR r.settled != (SELECT count(*) FROM entries e"
              "                  WHERE e.run_id = r.run_id AND e.kind = 'settle')",
              NULL);
  assert_int_equal(bad, 0);
  /* Per organisation: balance = credits - reserves + releases, never negative. */
  bad = raw_int(db,
                "SELECT count(*) FROM organisations o WHERE o.balance_micros < 0 OR"
                " o.balance_micros != (SELECT coalesce(sum(CASE kind"
                "   WHEN 'credit' THEN micros WHEN 'reserve' THEN -micros"
                "   WHEN 'settle' THEN micros ELSE 0 END), 0) FROM entries e"
                "   WHERE e.org = o.org)",
                NULL);
  assert_int_equal(bad, 0);
  raw_close(db);
}

int64_t
balance(fixture_t *f, const char *org)
{
  int64_t b = -1;
  eph_error_t err = {0};
  assert_int_equal(f->ops->balance(f->state, org, &b, &err), 0);
  return b;
}
