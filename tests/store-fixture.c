/* See store-fixture.h. */
#include "config.h"

#include "store-fixture.h"

#ifdef HAVE_LIBPQ
/* Runs sql on the test database through a connection of its own (a writer that bypasses
 * the store); params: up to 2 text values. Returns the result (caller clears) or fails. */
PGresult *
pg_query(fixture_t *f, const char *sql, const char *p1, const char *p2, bool must_succeed)
{
  PGconn *c = PQconnectdb(f->path);
  if (PQstatus(c) != CONNECTION_OK)
    fail_msg("connecting to %s: %s", f->path, PQerrorMessage(c));
  const char *v[] = {p1, p2};
  /* Without parameters PQexec, which takes several statements. */
  PGresult *res = p1 ? PQexecParams(c, sql, p2 ? 2 : 1, NULL, v, NULL, NULL, 0) : PQexec(c, sql);
  ExecStatusType s = PQresultStatus(res);
  if (must_succeed && s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK)
    fail_msg("%s: %s", sql, PQresultErrorMessage(res));
  PQfinish(c);
  return res;
}
#endif

/* Runs sql (no parameters) on the store's database behind its back: 0 or -1. */
int
sql_exec(fixture_t *f, const char *sql)
{
#ifdef HAVE_LIBPQ
  if (f->pg) {
    PGresult *res = pg_query(f, sql, NULL, NULL, false);
    int r =
        PQresultStatus(res) == PGRES_COMMAND_OK || PQresultStatus(res) == PGRES_TUPLES_OK ? 0 : -1;
    PQclear(res);
    return r;
  }
#endif
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open(f->path, &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  int rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
  sqlite3_close(db);
  return rc == SQLITE_OK ? 0 : -1;
}

int
setup(void **st)
{
  fixture_t *f = calloc(1, sizeof *f);
  snprintf(f->dir, sizeof f->dir, "/tmp/eph-store-test-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  snprintf(f->path, sizeof f->path, "%s/ephemeral.sqlite", f->dir);
  const char *db = getenv("EPH_TEST_DATABASE");
  if (db && *db) {
#ifdef HAVE_LIBPQ
    f->pg = true;
    snprintf(f->path, sizeof f->path, "%s", db);
    /* Each test starts from an empty database, as each SQLite test from a new file. */
    PQclear(pg_query(f, "DROP SCHEMA public CASCADE; CREATE SCHEMA public", NULL, NULL, true));
#else
    fail_msg("EPH_TEST_DATABASE is set but this build has no libpq");
#endif
  }
  eph_error_t err = {0};
  if (eph_store_open(f->path, NULL, &f->store, &err) < 0)
    fail_msg("%s", err.message);
  *st = f;
  return 0;
}

int
teardown(void **st)
{
  fixture_t *f = *st;
  eph_store_close(f->store);
  char cmd[160];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
  assert_int_equal(system(cmd), 0);
  free(f);
  return 0;
}

/* True when needle occurs in the bytes of the database file or its WAL. */
bool
file_contains(fixture_t *f, const char *needle)
{
  static const char *const suffixes[] = {"", "-wal"};
  for (int i = 0; i < 2; i++) {
    char p[sizeof f->path + 8];
    snprintf(p, sizeof p, "%s%s", f->path, suffixes[i]);
    cleanup_free char *buf = NULL;
    size_t n = 0;
    eph_error_t err = {0};
    if (eph_read_file(p, 256u << 20, &buf, &n, &err) < 0)
      continue;
    if (memmem(buf, n, needle, strlen(needle)))
      return true;
  }
  return false;
}

/* True when needle is stored anywhere in the store: the file's bytes (SQLite), every row of
 * every table as text (PostgreSQL). */
bool
stored_contains(fixture_t *f, const char *needle)
{
#ifdef HAVE_LIBPQ
  if (f->pg) {
    PGresult *res =
        pg_query(f,
                 "SELECT count(*) FROM (SELECT row_to_json(t)::text AS j FROM runs t UNION ALL"
                 " SELECT row_to_json(t)::text FROM events t UNION ALL"
                 " SELECT row_to_json(t)::text FROM api_keys t UNION ALL"
                 " SELECT row_to_json(t)::text FROM idempotency t) x WHERE strpos(j, $1) > 0",
                 needle, NULL, true);
    bool found = atoi(PQgetvalue(res, 0, 0)) > 0;
    PQclear(res);
    return found;
  }
#endif
  return file_contains(f, needle);
}

/* The stored SHA-256 of key id, as hex. */
void
stored_key_hash(fixture_t *f, const char *id, char out[65])
{
#ifdef HAVE_LIBPQ
  if (f->pg) {
    PGresult *res =
        pg_query(f, "SELECT encode(sha256, 'hex') FROM api_keys WHERE id = $1", id, NULL, true);
    assert_int_equal(PQntuples(res), 1);
    snprintf(out, 65, "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
    return;
  }
#endif
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open(f->path, &db), SQLITE_OK);
  sqlite3_stmt *s = NULL;
  assert_int_equal(
      sqlite3_prepare_v2(db, "SELECT sha256 FROM api_keys WHERE id = ?1", -1, &s, NULL), SQLITE_OK);
  sqlite3_bind_text(s, 1, id, -1, SQLITE_STATIC);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  const unsigned char *b = sqlite3_column_blob(s, 0);
  assert_int_equal(sqlite3_column_bytes(s, 0), 32);
  for (int i = 0; i < 32; i++)
    snprintf(out + 2 * i, 3, "%02x", b[i]);
  sqlite3_finalize(s);
  sqlite3_close(db);
}

void
sha(const char *body, char out[65])
{
  eph_error_t err = {0};
  assert_int_equal(eph_sha256_hex(body, strlen(body), out, &err), 0);
}

json_object *
request(const char *prompt)
{
  json_object *r = json_object_new_object();
  json_object_object_add(r, "prompt", json_object_new_string(prompt));
  json_object_object_add(r, "web", json_object_new_boolean(0));
  json_object_object_add(r, "shell", json_object_new_boolean(1));
  json_object_object_add(r, "timeout_seconds", json_object_new_int(120));
  json_object_object_add(r, "max_cost_micros", json_object_new_int64(40000));
  return r;
}
