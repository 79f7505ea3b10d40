/* Tests of core/store.c on a real SQLite file in a fresh temporary directory, or, when
 * EPH_TEST_DATABASE names a PostgreSQL database (tests/store-pg.test runs this program under
 * tests/with-pg), on that database, emptied before each test: the same contract for both
 * implementations. Where a test claims something is NOT stored (a key, a ZDR payload) it
 * first shows that the same search finds what IS stored, so the search itself is proven to
 * work. Tests of the SQLite file itself (damage, mode) are skipped on PostgreSQL. */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>
#ifdef HAVE_LIBPQ
#include <libpq-fe.h>
#endif

#include "admin.h"
#include "sqlite-damage.h"
#include "store.h"
#include "util.h"

typedef struct fixture {
  char dir[64];
  char path[1024]; /* the SQLite file, or the PostgreSQL URI */
  bool pg;
  eph_store_t *store;
} fixture_t;

#ifdef HAVE_LIBPQ
/* Runs sql on the test database through a connection of its own (a writer that bypasses
 * the store); params: up to 2 text values. Returns the result (caller clears) or fails. */
static PGresult *
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
static int
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

static int
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

static int
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
static bool
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
static bool
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
static void
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

static void
sha(const char *body, char out[65])
{
  eph_error_t err = {0};
  assert_int_equal(eph_sha256_hex(body, strlen(body), out, &err), 0);
}

/* ---------------------------------------------------------------- API keys */

static void
test_keys(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  cleanup_free char *key = NULL, *id = NULL, *key2 = NULL;
  assert_int_equal(eph_store_key_create(f->store, "acme", "ci-deploy-key", &key, &id, &err), 0);
  assert_int_equal(strlen(key), 4 + 48);
  assert_memory_equal(key, "eph_", 4);
  assert_int_equal(strspn(key + 4, "0123456789abcdef"), 48);
  assert_memory_equal(id, "key_", 4);
  assert_int_equal(eph_store_key_create(f->store, "acme", "ci-deploy-key", &key2, NULL, &err),
                   -EEXIST);
  assert_int_equal(eph_store_key_create(f->store, "other", "ci-deploy-key", &key2, NULL, &err), 0);
  assert_string_not_equal(key, key2);

  cleanup_free char *org = NULL, *kid = NULL;
  assert_int_equal(eph_store_key_verify(f->store, key, &org, &kid, &err), 0);
  assert_string_equal(org, "acme");
  assert_string_equal(kid, id);
  /* One changed digit, a truncated key, garbage: the same refusal. */
  char bad[64];
  snprintf(bad, sizeof bad, "%s", key);
  bad[10] = bad[10] == 'a' ? 'b' : 'a';
  assert_int_equal(eph_store_key_verify(f->store, bad, NULL, NULL, &err), -EACCES);
  bad[20] = '\0';
  assert_int_equal(eph_store_key_verify(f->store, bad, NULL, NULL, &err), -EACCES);
  assert_int_equal(eph_store_key_verify(f->store, "Bearer x", NULL, NULL, &err), -EACCES);

  /* Only the hash is on disk: the name (stored in clear) is found by the same search, the
   * key and its random part are not; the hash is. */
  assert_true(stored_contains(f, "ci-deploy-key"));
  assert_false(stored_contains(f, key));
  assert_false(stored_contains(f, key + 4));
  assert_false(stored_contains(f, key + 20));
  char hex[65], stored_hex[65];
  sha(key, hex);
  stored_key_hash(f, id, stored_hex);
  assert_string_equal(stored_hex, hex);

  /* List: never the key. */
  cleanup_json json_object *list = NULL;
  assert_int_equal(eph_store_key_list(f->store, "acme", &list, &err), 0);
  assert_int_equal(json_object_array_length(list), 1);
  const char *text = json_object_to_json_string(list);
  assert_null(strstr(text, key + 4));
  assert_non_null(strstr(text, id));

  /* Revoke: another organisation cannot; by name works; then the key is refused. */
  assert_int_equal(eph_store_key_revoke(f->store, id, "other", &err), -ENOENT);
  assert_int_equal(eph_store_key_verify(f->store, key, NULL, NULL, &err), 0);
  assert_int_equal(eph_store_key_revoke(f->store, "ci-deploy-key", "acme", &err), 0);
  assert_int_equal(eph_store_key_verify(f->store, key, NULL, NULL, &err), -EACCES);
  assert_int_equal(eph_store_key_revoke(f->store, id, "acme", &err), -ENOENT);
  assert_int_equal(eph_store_key_verify(f->store, key2, NULL, NULL, &err), 0);
  json_object_put(list);
  list = NULL;
  assert_int_equal(eph_store_key_list(f->store, "acme", &list, &err), 0);
  json_object *k0 = json_object_array_get_idx(list, 0);
  assert_true(json_object_get_int64(json_object_object_get(k0, "revoked_at_us")) > 0);

  /* Members need an existing organisation. */
  assert_int_equal(eph_store_member_add(f->store, "acme", "alice@example.org", "owner", &err), 0);
  assert_int_equal(eph_store_member_add(f->store, "ghost", "bob", "member", &err), -ENOENT);
  assert_int_equal(eph_store_member_add(f->store, "acme", "bob", "emperor", &err), -EINVAL);
}

/* ---------------------------------------------------------------- runs */

static json_object *
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

static void
test_runs_and_cursor(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  /* 7 runs of acme, two pairs sharing a timestamp (the cursor must tie-break on id), and
   * one of another organisation. */
  static const int64_t created[] = {1000, 2000, 2000, 3000, 4000, 4000, 5000};
  for (int i = 0; i < 7; i++) {
    char id[40];
    snprintf(id, sizeof id, "run_%032d", i);
    cleanup_json json_object *req = request("hello");
    assert_int_equal(
        eph_store_run_insert(f->store, id, "acme", "queued", created[i], req, false, &err), 0);
  }
  cleanup_json json_object *req = request("x");
  assert_int_equal(
      eph_store_run_insert(f->store, "run_other", "other", "queued", 9999, req, false, &err), 0);
  assert_int_equal(
      eph_store_run_insert(f->store, "run_other", "other", "queued", 1, req, false, &err), -EEXIST);

  cleanup_json json_object *usage = json_tokener_parse("{\"model_calls\":3,\"tokens\":5214}");
  cleanup_json json_object *output = json_object_new_string("2 3 5 7 11");
  assert_int_equal(eph_store_run_update(f->store, "run_00000000000000000000000000000003",
                                        "succeeded", output, usage, &err),
                   0);
  assert_int_equal(eph_store_run_update(f->store, "run_nope", "failed", NULL, NULL, &err), -ENOENT);
  cleanup_json json_object *run = NULL;
  assert_int_equal(
      eph_store_run_get(f->store, "run_00000000000000000000000000000003", "acme", &run, &err), 0);
  assert_string_equal(json_object_get_string(json_object_object_get(run, "status")), "succeeded");
  assert_string_equal(json_object_get_string(json_object_object_get(run, "output")), "2 3 5 7 11");
  assert_int_equal(
      json_object_get_int(json_object_object_get(json_object_object_get(run, "usage"), "tokens")),
      5214);
  assert_string_equal(json_object_get_string(
                          json_object_object_get(json_object_object_get(run, "request"), "prompt")),
                      "hello");
  assert_int_equal(json_object_get_int64(json_object_object_get(run, "created_at_us")), 3000);
  /* Status-only update keeps output and usage. */
  assert_int_equal(eph_store_run_update(f->store, "run_00000000000000000000000000000003",
                                        "archived", NULL, NULL, &err),
                   0);
  json_object_put(run);
  run = NULL;
  assert_int_equal(
      eph_store_run_get(f->store, "run_00000000000000000000000000000003", NULL, &run, &err), 0);
  assert_string_equal(json_object_get_string(json_object_object_get(run, "output")), "2 3 5 7 11");
  /* Another organisation's run does not exist for the caller. */
  json_object *none = NULL;
  assert_int_equal(eph_store_run_get(f->store, "run_other", "acme", &none, &err), -ENOENT);

  /* Pages of 3: expected order is created desc, id desc. */
  static const int expect[] = {6, 5, 4, 3, 2, 1, 0};
  int seen = 0, pages = 0;
  cleanup_free char *cursor = NULL;
  do {
    json_object *page = NULL;
    char *next = NULL;
    assert_int_equal(eph_store_run_list(f->store, "acme", 3, cursor, &page, &next, &err), 0);
    pages++;
    for (size_t i = 0; i < json_object_array_length(page); i++) {
      char id[40];
      snprintf(id, sizeof id, "run_%032d", expect[seen++]);
      json_object *r = json_object_array_get_idx(page, i);
      assert_string_equal(json_object_get_string(json_object_object_get(r, "id")), id);
      assert_null(json_object_object_get(r, "request")); /* lists carry no content */
    }
    json_object_put(page);
    free(cursor);
    cursor = next;
  } while (cursor);
  assert_int_equal(seen, 7);
  assert_int_equal(pages, 3);

  json_object *page = NULL;
  char *next = NULL;
  assert_int_equal(eph_store_run_list(f->store, "acme", 3, "zz", &page, &next, &err), -EINVAL);
  assert_int_equal(eph_store_run_list(f->store, "acme", 3, "3132", &page, &next, &err), -EINVAL);
  assert_int_equal(eph_store_run_list(f->store, "acme", 5000, NULL, &page, &next, &err), -EINVAL);
  assert_int_equal(eph_store_run_list(f->store, "nobody", 0, NULL, &page, &next, &err), 0);
  assert_int_equal(json_object_array_length(page), 0);
  assert_null(next);
  json_object_put(page);
}

static void
test_events_since(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  cleanup_json json_object *req = request("p");
  assert_int_equal(eph_store_run_insert(f->store, "run_ev", "acme", "running", 1, req, false, &err),
                   0);
  for (int i = 0; i < 10; i++) {
    cleanup_json json_object *data = json_object_new_object();
    json_object_object_add(data, "i", json_object_new_int(i));
    char text[32];
    snprintf(text, sizeof text, "event %d", i);
    assert_int_equal(eph_store_event_append(f->store, "run_ev", i, 100 * i, "Shell", "tool_call",
                                            text, data, &err),
                     0);
  }
  assert_int_equal(
      eph_store_event_append(f->store, "run_ev", 3, 0, "Shell", "x", "dup", NULL, &err), -EEXIST);
  assert_int_equal(
      eph_store_event_append(f->store, "run_missing", 0, 0, "Shell", "x", "t", NULL, &err),
      -ENOENT);
  cleanup_json json_object *all = NULL, *tail = NULL, *two = NULL;
  assert_int_equal(eph_store_events_since(f->store, "run_ev", -1, 0, &all, &err), 0);
  assert_int_equal(json_object_array_length(all), 10);
  assert_int_equal(eph_store_events_since(f->store, "run_ev", 6, 0, &tail, &err), 0);
  assert_int_equal(json_object_array_length(tail), 3);
  json_object *e = json_object_array_get_idx(tail, 0);
  assert_int_equal(json_object_get_int(json_object_object_get(e, "seq")), 7);
  assert_int_equal(json_object_get_int(json_object_object_get(e, "t_ms")), 700);
  assert_string_equal(json_object_get_string(json_object_object_get(e, "text")), "event 7");
  assert_int_equal(
      json_object_get_int(json_object_object_get(json_object_object_get(e, "data"), "i")), 7);
  assert_int_equal(eph_store_events_since(f->store, "run_ev", 2, 2, &two, &err), 0);
  assert_int_equal(json_object_array_length(two), 2);
  assert_int_equal(
      json_object_get_int(json_object_object_get(json_object_array_get_idx(two, 1), "seq")), 4);
}

/* ---------------------------------------------------------------- idempotency */

static void
test_idempotency_same_and_different_body(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  char h1[65], h2[65];
  sha("{\"prompt\":\"a\"}", h1);
  sha("{\"prompt\":\"b\"}", h2);
  assert_string_not_equal(h1, h2);
  cleanup_free char *existing = NULL;
  assert_int_equal(eph_store_idem_claim(f->store, "acme", "k-1", h1, "run_first", &existing, &err),
                   0);
  assert_null(existing);
  assert_int_equal(eph_store_idem_claim(f->store, "acme", "k-1", h1, "run_second", &existing, &err),
                   1);
  assert_string_equal(existing, "run_first");
  err = (eph_error_t){0};
  char *unused = NULL;
  assert_int_equal(eph_store_idem_claim(f->store, "acme", "k-1", h2, "run_third", &unused, &err),
                   -EBUSY);
  assert_null(unused);
  assert_non_null(strstr(err.message, "different request body"));
  /* Keys are per organisation. */
  assert_int_equal(eph_store_idem_claim(f->store, "other", "k-1", h2, "run_o", &unused, &err), 0);
  assert_int_equal(eph_store_idem_claim(f->store, "acme", "k-1", "XYZ", "run_x", &unused, &err),
                   -EINVAL);
  assert_null(unused);
}

#define CLAIMERS 50

typedef struct claim_arg {
  eph_store_t *store;
  const char *hash;
  int index;
  int result;
  char *existing;
  pthread_barrier_t *barrier;
} claim_arg_t;

static void *
claimer(void *p)
{
  claim_arg_t *a = p;
  char run[32];
  snprintf(run, sizeof run, "run_claim_%02d", a->index);
  eph_error_t err = {0};
  pthread_barrier_wait(a->barrier);
  a->result = eph_store_idem_claim(a->store, "acme", "same-key", a->hash, run, &a->existing, &err);
  return NULL;
}

/* CLAIMERS threads claiming one key at once, thread i on stores[i] as run_claim_<i>: one
 * winner, every other claim answers with the winner's run. */
static void
race_claims(eph_store_t *const *stores, const char *hash)
{
  pthread_t th[CLAIMERS];
  claim_arg_t args[CLAIMERS];
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, CLAIMERS);
  for (int i = 0; i < CLAIMERS; i++) {
    args[i] = (claim_arg_t){.store = stores[i], .hash = hash, .index = i, .barrier = &barrier};
    assert_int_equal(pthread_create(&th[i], NULL, claimer, &args[i]), 0);
  }
  for (int i = 0; i < CLAIMERS; i++)
    pthread_join(th[i], NULL);
  pthread_barrier_destroy(&barrier);
  int winners = 0, winner = -1;
  for (int i = 0; i < CLAIMERS; i++) {
    assert_true(args[i].result == 0 || args[i].result == 1);
    if (args[i].result == 0) {
      winners++;
      winner = i;
    }
  }
  assert_int_equal(winners, 1);
  char won[32];
  snprintf(won, sizeof won, "run_claim_%02d", winner);
  for (int i = 0; i < CLAIMERS; i++) {
    if (i != winner)
      assert_string_equal(args[i].existing, won);
    free(args[i].existing);
  }
}

static void
test_idempotency_concurrent_claims(void **st)
{
  fixture_t *f = *st;
  char h[65];
  sha("{\"prompt\":\"race\"}", h);
  eph_store_t *stores[CLAIMERS];
  for (int i = 0; i < CLAIMERS; i++)
    stores[i] = f->store;
  race_claims(stores, h);
}

/* A second store on the same file (another process's view) sees the claim: the claim is
 * in the file, not in memory. */
static void
test_idempotency_across_connections(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  char h[65];
  sha("body", h);
  eph_store_t *second = NULL;
  assert_int_equal(eph_store_open(f->path, NULL, &second, &err), 0);
  cleanup_free char *existing = NULL;
  assert_int_equal(eph_store_idem_claim(f->store, "acme", "k", h, "run_a", &existing, &err), 0);
  assert_int_equal(eph_store_idem_claim(second, "acme", "k", h, "run_b", &existing, &err), 1);
  assert_string_equal(existing, "run_a");
  eph_store_close(second);
  eph_store_options_t bad = {.idempotency_hours = 1};
  assert_int_equal(eph_store_open(f->path, &bad, &second, &err), -EINVAL);
}

/* ---------------------------------------------------------------- retention */

static void
test_purge(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  int64_t now = eph_wall_us(), day = 86400LL * 1000000;
  cleanup_json json_object *req = request("p");
  assert_int_equal(eph_store_run_insert(f->store, "run_old", "acme", "succeeded", now - 31 * day,
                                        req, false, &err),
                   0);
  assert_int_equal(eph_store_run_insert(f->store, "run_new", "acme", "succeeded", now - 29 * day,
                                        req, false, &err),
                   0);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(
        eph_store_event_append(f->store, "run_old", i, i, "Shell", "k", "t", NULL, &err), 0);
    assert_int_equal(
        eph_store_event_append(f->store, "run_new", i, i, "Shell", "k", "t", NULL, &err), 0);
  }
  char h[65];
  sha("x", h);
  char *existing = NULL;
  assert_int_equal(eph_store_idem_claim(f->store, "acme", "k", h, "run_new", &existing, &err), 0);

  assert_int_equal(eph_store_purge(f->store, 30, &err), 1);
  json_object *gone = NULL;
  assert_int_equal(eph_store_run_get(f->store, "run_old", NULL, &gone, &err), -ENOENT);
  cleanup_json json_object *kept = NULL, *ev_old = NULL, *ev_new = NULL;
  assert_int_equal(eph_store_run_get(f->store, "run_new", NULL, &kept, &err), 0);
  assert_int_equal(eph_store_events_since(f->store, "run_old", -1, 0, &ev_old, &err), 0);
  assert_int_equal(json_object_array_length(ev_old), 0);
  assert_int_equal(eph_store_events_since(f->store, "run_new", -1, 0, &ev_new, &err), 0);
  assert_int_equal(json_object_array_length(ev_new), 3);
  /* The day-old idempotency key is still remembered. */
  assert_int_equal(eph_store_idem_claim(f->store, "acme", "k", h, "run_z", &existing, &err), 1);
  free(existing);
  assert_int_equal(eph_store_purge(f->store, 30, &err), 0);
  assert_int_equal(eph_store_purge(f->store, 0, &err), -EINVAL);

  /* An idempotency key older than the window is purged and may be claimed afresh: age it
   * through SQL (the API has no clock to turn). */
  /* 25 hours in micros, one literal: PostgreSQL multiplies int4 literals as int4. */
  assert_int_equal(sql_exec(f, "UPDATE idempotency SET created_at_us = created_at_us - "
                               "90000000000"),
                   0);
  assert_int_equal(eph_store_idem_claim(f->store, "acme", "k", h, "run_fresh", &existing, &err), 0);
}

/* ---------------------------------------------------------------- zero data retention */

static void
test_zdr_payloads_not_stored(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  cleanup_json json_object *open_req = request("VISIBLE_PROMPT_MARKER");
  cleanup_json json_object *zdr_req = request("SECRET_PROMPT_MARKER");
  assert_int_equal(
      eph_store_run_insert(f->store, "run_open", "acme", "running", 1, open_req, false, &err), 0);
  assert_int_equal(
      eph_store_run_insert(f->store, "run_zdr", "acme", "running", 2, zdr_req, true, &err), 0);
  cleanup_json json_object *d1 = json_tokener_parse("{\"stdout\":\"VISIBLE_DATA_MARKER\"}");
  cleanup_json json_object *d2 = json_tokener_parse("{\"stdout\":\"SECRET_DATA_MARKER\"}");
  assert_int_equal(eph_store_event_append(f->store, "run_open", 0, 5, "Shell", "tool_result",
                                          "ran a command", d1, &err),
                   0);
  assert_int_equal(eph_store_event_append(f->store, "run_zdr", 0, 5, "Shell", "tool_result",
                                          "ran a command", d2, &err),
                   0);
  cleanup_json json_object *o1 = json_object_new_string("VISIBLE_OUTPUT_MARKER");
  cleanup_json json_object *o2 = json_object_new_string("SECRET_OUTPUT_MARKER");
  cleanup_json json_object *usage = json_tokener_parse("{\"tokens\":5214}");
  assert_int_equal(eph_store_run_update(f->store, "run_open", "succeeded", o1, usage, &err), 0);
  assert_int_equal(eph_store_run_update(f->store, "run_zdr", "succeeded", o2, usage, &err), 0);

  assert_true(stored_contains(f, "VISIBLE_PROMPT_MARKER"));
  assert_true(stored_contains(f, "VISIBLE_DATA_MARKER"));
  assert_true(stored_contains(f, "VISIBLE_OUTPUT_MARKER"));
  assert_false(stored_contains(f, "SECRET_PROMPT_MARKER"));
  assert_false(stored_contains(f, "SECRET_DATA_MARKER"));
  assert_false(stored_contains(f, "SECRET_OUTPUT_MARKER"));

  /* What ZDR keeps: the permission table, budget, usage, the event skeleton. */
  cleanup_json json_object *run = NULL, *events = NULL;
  assert_int_equal(eph_store_run_get(f->store, "run_zdr", "acme", &run, &err), 0);
  json_object *req = json_object_object_get(run, "request");
  assert_null(json_object_object_get(req, "prompt"));
  assert_int_equal(json_object_get_int(json_object_object_get(req, "max_cost_micros")), 40000);
  assert_true(json_object_get_boolean(json_object_object_get(req, "shell")));
  assert_null(json_object_object_get(run, "output"));
  assert_int_equal(
      json_object_get_int(json_object_object_get(json_object_object_get(run, "usage"), "tokens")),
      5214);
  assert_true(json_object_get_boolean(json_object_object_get(run, "zero_data_retention")));
  assert_int_equal(eph_store_events_since(f->store, "run_zdr", -1, 0, &events, &err), 0);
  assert_int_equal(json_object_array_length(events), 1);
  json_object *e = json_object_array_get_idx(events, 0);
  assert_null(json_object_object_get(e, "data"));
  assert_string_equal(json_object_get_string(json_object_object_get(e, "kind")), "tool_result");

  /* The schema refuses a payload for a ZDR run even from a writer that bypasses the API. */
  assert_int_equal(sql_exec(f, "INSERT INTO events(run_id, seq, t_ms, source, kind, text, data)"
                               " VALUES ('run_zdr', 1, 0, 's', 'k', 't', '{}')"),
                   -1);
  /* ... while the same insert for an ordinary run passes: the refusal is the trigger's. */
  assert_int_equal(sql_exec(f, "INSERT INTO events(run_id, seq, t_ms, source, kind, text, data)"
                               " VALUES ('run_open', 1, 0, 's', 'k', 't', '{}')"),
                   0);
}

static void
test_schema_version(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
#ifdef HAVE_LIBPQ
  if (f->pg) {
    PGresult *res = pg_query(f, "SELECT version FROM eph_schema", NULL, NULL, true);
    assert_int_equal(PQntuples(res), 1);
    int v = atoi(PQgetvalue(res, 0, 0));
    PQclear(res);
    assert_true(v >= 1);
    eph_store_close(f->store);
    f->store = NULL;
    assert_int_equal(eph_store_open(f->path, NULL, &f->store, &err), 0);
    eph_store_close(f->store);
    f->store = NULL;
    char sql[64];
    snprintf(sql, sizeof sql, "UPDATE eph_schema SET version = %d", v + 1);
    assert_int_equal(sql_exec(f, sql), 0);
    assert_int_equal(eph_store_open(f->path, NULL, &f->store, &err), -EPH_E_CONFIG);
    assert_non_null(strstr(err.message, "newer"));
    assert_null(f->store);
    return;
  }
#endif
  eph_store_close(f->store);
  f->store = NULL;
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open(f->path, &db), SQLITE_OK);
  sqlite3_stmt *s = NULL;
  assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &s, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  int v = sqlite3_column_int(s, 0);
  sqlite3_finalize(s);
  assert_true(v >= 1);
  struct stat sb;
  assert_int_equal(stat(f->path, &sb), 0);
  assert_int_equal(sb.st_mode & 0777, 0600);
  /* Reopening an up-to-date file migrates nothing and works. */
  assert_int_equal(eph_store_open(f->path, NULL, &f->store, &err), 0);
  eph_store_close(f->store);
  f->store = NULL;
  /* A file from a newer version is refused, untouched. */
  char sql[64];
  snprintf(sql, sizeof sql, "PRAGMA user_version = %d", v + 1);
  assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(db);
  assert_int_equal(eph_store_open(f->path, NULL, &f->store, &err), -EPH_E_CONFIG);
  assert_non_null(strstr(err.message, "newer"));
  assert_null(f->store);
}

/* A damaged API-key page: the store refuses to open naming the file (before: it opened,
 * and key checks failed as if the key did not exist: every request 401, nothing logged).
 * A sound store answers the write probe and reports no fault. */
static void
test_damaged_file_refused(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  char *key = NULL;
  assert_int_equal(eph_store_key_create(f->store, "acme", "ci", &key, NULL, &err), 0);
  free(key);
  assert_int_equal(eph_store_probe(f->store, &err), 0);
  assert_false(eph_store_fault(f->store, NULL, 0));
  eph_store_close(f->store);
  f->store = NULL;
  damage_root_page(f->path, "api_keys", false);
  err = (eph_error_t){0};
  assert_int_equal(eph_store_open(f->path, NULL, &f->store, &err), -EIO);
  assert_null(f->store);
  assert_non_null(strstr(err.message, f->path));
  assert_non_null(strstr(err.message, "damaged"));
}

/* A page damaged while the store is open (found by a key check, not at open): the check
 * fails with -EIO, not the -EACCES of an unknown key, and the fault stays reported (health
 * says degraded) even after writes elsewhere in the file succeed. */
static void
test_damage_found_while_open_is_sticky(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  char *key = NULL;
  assert_int_equal(eph_store_key_create(f->store, "acme", "ci", &key, NULL, &err), 0);
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open_v2(f->path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  /* A write from this connection makes the store's connection drop its page cache; the
   * checkpoint moves every page into the main file, where the damage goes. */
  assert_int_equal(sqlite3_exec(db,
                                "INSERT INTO probe(id, t_us) VALUES (1, 1)"
                                " ON CONFLICT(id) DO UPDATE SET t_us = t_us + 1;"
                                "PRAGMA wal_checkpoint(TRUNCATE);",
                                NULL, NULL, NULL),
                   SQLITE_OK);
  sqlite3_close(db);
  damage_root_page(f->path, "api_keys", false);
  assert_false(eph_store_fault(f->store, NULL, 0));
  err = (eph_error_t){0};
  assert_int_equal(eph_store_key_verify(f->store, key, NULL, NULL, &err), -EIO);
  free(key);
  char why[512];
  assert_true(eph_store_fault(f->store, why, sizeof why));
  assert_non_null(strstr(why, f->path));
  eph_store_probe(f->store, &err); /* a write elsewhere proves nothing about that page */
  assert_true(eph_store_fault(f->store, NULL, 0));
}

/* Separate connections (as separate nodes would have) claiming one key at once: one
 * winner, every other claim answers with its run. */
static void
test_idempotency_concurrent_claims_separate_connections(void **st)
{
  fixture_t *f = *st;
  char h[65];
  sha("{\"prompt\":\"nodes\"}", h);
  eph_store_t *stores[CLAIMERS];
  for (int i = 0; i < CLAIMERS; i++) {
    eph_error_t err = {0};
    if (eph_store_open(f->path, NULL, &stores[i], &err) < 0)
      fail_msg("%s", err.message);
  }
  race_claims(stores, h);
  for (int i = 0; i < CLAIMERS; i++)
    eph_store_close(stores[i]);
}

typedef struct opener_arg {
  const char *path;
  pthread_barrier_t *barrier;
  int result;
  char message[sizeof((eph_error_t *)0)->message];
} opener_arg_t;

static void *
opener(void *p)
{
  opener_arg_t *a = p;
  eph_store_t *s = NULL;
  eph_error_t err = {0};
  pthread_barrier_wait(a->barrier);
  a->result = eph_store_open(a->path, NULL, &s, &err);
  snprintf(a->message, sizeof a->message, "%s", err.message);
  eph_store_close(s);
  return NULL;
}

/* Several nodes starting at once on an empty database: every one opens, the schema is
 * created once (on PostgreSQL: serialised by the advisory lock; without it the concurrent
 * CREATE TABLEs fail). */
static void
test_concurrent_first_open(void **st)
{
  fixture_t *f = *st;
  eph_store_close(f->store);
  f->store = NULL;
  if (f->pg)
    assert_int_equal(sql_exec(f, "DROP SCHEMA public CASCADE; CREATE SCHEMA public"), 0);
  else
    assert_int_equal(unlink(f->path), 0);
  enum { OPENERS = 6 };
  pthread_t th[OPENERS];
  opener_arg_t args[OPENERS];
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, OPENERS);
  for (int i = 0; i < OPENERS; i++) {
    args[i] = (opener_arg_t){.path = f->path, .barrier = &barrier};
    assert_int_equal(pthread_create(&th[i], NULL, opener, &args[i]), 0);
  }
  for (int i = 0; i < OPENERS; i++)
    pthread_join(th[i], NULL);
  pthread_barrier_destroy(&barrier);
  for (int i = 0; i < OPENERS; i++)
    if (args[i].result != 0)
      fail_msg("opener %d: %d %s", i, args[i].result, args[i].message);
  eph_error_t err = {0};
  assert_int_equal(eph_store_open(f->path, NULL, &f->store, &err), 0);
  cleanup_free char *key = NULL;
  assert_int_equal(eph_store_key_create(f->store, "acme", "after", &key, NULL, &err), 0);
}

/* Cancel requests (a cluster's way to reach the node executing a run): only for a run that
 * exists, idempotent, listed while the run is queued or running, gone once it ended. SQLite
 * has no cluster: -ENOTSUP. */
static void
test_cancel_requests(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  cleanup_json json_object *req = request("c");
  if (!f->pg) {
    assert_int_equal(eph_store_cancel_request(f->store, "run_x", &err), -ENOTSUP);
    return;
  }
  assert_int_equal(
      eph_store_run_insert(f->store, "run_live", "acme", "running", 1, req, false, &err), 0);
  assert_int_equal(
      eph_store_run_insert(f->store, "run_other", "acme", "running", 2, req, false, &err), 0);
  assert_int_equal(eph_store_cancel_request(f->store, "run_nope", &err), -ENOENT);
  assert_int_equal(eph_store_cancel_request(f->store, "run_live", &err), 0);
  assert_int_equal(eph_store_cancel_request(f->store, "run_live", &err), 0);
  cleanup_json json_object *pending = NULL, *after = NULL;
  assert_int_equal(eph_store_cancels_pending(f->store, &pending, &err), 0);
  assert_int_equal(json_object_array_length(pending), 1);
  assert_string_equal(json_object_get_string(json_object_array_get_idx(pending, 0)), "run_live");
  assert_int_equal(eph_store_run_update(f->store, "run_live", "cancelled", NULL, NULL, &err), 0);
  assert_int_equal(eph_store_cancels_pending(f->store, &after, &err), 0);
  assert_int_equal(json_object_array_length(after), 0);
}

#ifdef HAVE_LIBPQ
typedef struct taker_arg {
  eph_store_t *store;
  pthread_barrier_t *barrier;
  int result;
  json_object *taken;
} taker_arg_t;

static void *
taker(void *p)
{
  taker_arg_t *a = p;
  eph_error_t err = {0};
  pthread_barrier_wait(a->barrier);
  a->result = eph_store_leases_take_expired(a->store, &a->taken, &err);
  return NULL;
}
#endif

/* Leases: a run inserted by a node carries it; renewal by another node does nothing; once
 * expired, several nodes taking over at once: exactly one gets the run. Without a node or
 * on SQLite: -ENOTSUP. */
static void
test_leases(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  cleanup_json json_object *none = NULL, *ids = json_tokener_parse("[\"run_l\"]");
  assert_int_equal(eph_store_leases_take_expired(f->store, &none, &err), -ENOTSUP);
  if (!f->pg)
    return;
#ifdef HAVE_LIBPQ
  enum { TAKERS = 6 };
  eph_store_t *nodes[TAKERS];
  for (int i = 0; i < TAKERS; i++) {
    char name[16];
    snprintf(name, sizeof name, "n%d", i);
    eph_store_options_t o = {.node_name = name, .lease_seconds = 2};
    if (eph_store_open(f->path, &o, &nodes[i], &err) < 0)
      fail_msg("%s", err.message);
  }
  cleanup_json json_object *req = request("l");
  assert_int_equal(eph_store_run_insert(nodes[0], "run_l", "acme", "running", 1, req, false, &err),
                   0);
  PGresult *res = pg_query(f,
                           "SELECT node, lease_expires_us > (extract(epoch FROM now())"
                           " * 1000000)::bigint FROM runs WHERE id = 'run_l'",
                           NULL, NULL, true);
  assert_string_equal(PQgetvalue(res, 0, 0), "n0");
  assert_string_equal(PQgetvalue(res, 0, 1), "t");
  PQclear(res);
  /* Not expired: nobody takes it. */
  cleanup_json json_object *early = NULL;
  assert_int_equal(eph_store_leases_take_expired(nodes[1], &early, &err), 0);
  assert_int_equal(json_object_array_length(early), 0);
  /* Expired (the node stopped renewing): a renewal by another node does not revive it. */
  assert_int_equal(sql_exec(f, "UPDATE runs SET lease_expires_us = 1 WHERE id = 'run_l'"), 0);
  assert_int_equal(eph_store_leases_renew(nodes[2], ids, &err), 0);
  pthread_t th[TAKERS];
  taker_arg_t args[TAKERS];
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, TAKERS);
  for (int i = 0; i < TAKERS; i++) {
    args[i] = (taker_arg_t){.store = nodes[i], .barrier = &barrier};
    assert_int_equal(pthread_create(&th[i], NULL, taker, &args[i]), 0);
  }
  int winners = 0, winner = -1;
  for (int i = 0; i < TAKERS; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(args[i].result, 0);
    size_t n = json_object_array_length(args[i].taken);
    if (n == 1) {
      winners++;
      winner = i;
      assert_string_equal(json_object_get_string(json_object_array_get_idx(args[i].taken, 0)),
                          "run_l");
    } else {
      assert_int_equal(n, 0);
    }
    json_object_put(args[i].taken);
  }
  pthread_barrier_destroy(&barrier);
  assert_int_equal(winners, 1);
  /* The taker now holds a fresh lease; the old node's renewal no longer applies. */
  char want[16];
  snprintf(want, sizeof want, "n%d", winner);
  res = pg_query(f, "SELECT node FROM runs WHERE id = 'run_l'", NULL, NULL, true);
  assert_string_equal(PQgetvalue(res, 0, 0), want);
  PQclear(res);
  /* Once ended, an expired lease is nobody's business. */
  assert_int_equal(eph_store_run_update(nodes[0], "run_l", "failed", NULL, NULL, &err), 0);
  assert_int_equal(sql_exec(f, "UPDATE runs SET lease_expires_us = 1 WHERE id = 'run_l'"), 0);
  cleanup_json json_object *after = NULL;
  assert_int_equal(eph_store_leases_take_expired(nodes[1], &after, &err), 0);
  assert_int_equal(json_object_array_length(after), 0);
  for (int i = 0; i < TAKERS; i++)
    eph_store_close(nodes[i]);
#endif
}

#ifdef HAVE_LIBPQ
typedef struct queue_arg {
  eph_store_t *store;
  pthread_barrier_t *barrier;
  const char *run_id; /* push this one, or claim when NULL */
  int max_queued;
  int result;
  json_object *claimed;
} queue_arg_t;

static void *
queue_worker(void *p)
{
  queue_arg_t *a = p;
  eph_error_t err = {0};
  pthread_barrier_wait(a->barrier);
  a->result = a->run_id ? eph_store_queue_push(a->store, a->run_id, 7, false, a->max_queued, &err)
                        : eph_store_queue_claim(a->store, &a->claimed, &err);
  return NULL;
}

/* Runs all threads of args at once (a barrier); joins them. */
static void
queue_race(queue_arg_t *args, int n)
{
  pthread_t th[16];
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, (unsigned)n);
  for (int i = 0; i < n; i++) {
    args[i].barrier = &barrier;
    assert_int_equal(pthread_create(&th[i], NULL, queue_worker, &args[i]), 0);
  }
  for (int i = 0; i < n; i++)
    pthread_join(th[i], NULL);
  pthread_barrier_destroy(&barrier);
}

static int64_t
queue_len(eph_store_t *s)
{
  eph_error_t err = {0};
  int64_t n = -1;
  assert_int_equal(eph_store_queue_length(s, &n, &err), 0);
  return n;
}
#endif

/* The shared queue (docs/cluster.md): the bound holds when nodes push at once; nodes
 * claiming at once never get the same run; a claim carries the admitting node's
 * reservation and the stored request; a queued run belongs to no node, so a dead node's
 * queued runs are not taken over (host_lost) but stay claimable; a local_only run (zero data
 * retention) is claimed only by its admitting node and ends with it. SQLite: -ENOTSUP. */
static void
test_queue(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  if (!f->pg) {
    json_object *none = NULL;
    assert_int_equal(eph_store_queue_push(f->store, "run_q", 1, false, 10, &err), -ENOTSUP);
    assert_int_equal(eph_store_queue_claim(f->store, &none, &err), -ENOTSUP);
    assert_null(none);
    return;
  }
#ifdef HAVE_LIBPQ
  enum { NODES = 3, RUNS = 8 };
  eph_store_t *nodes[NODES];
  for (int i = 0; i < NODES; i++) {
    char name[16];
    snprintf(name, sizeof name, "q%d", i);
    eph_store_options_t o = {.node_name = name, .lease_seconds = 5};
    if (eph_store_open(f->path, &o, &nodes[i], &err) < 0)
      fail_msg("%s", err.message);
  }
  cleanup_json json_object *req = request("queued prompt");
  char ids[RUNS][16];
  for (int i = 0; i < RUNS; i++) {
    snprintf(ids[i], sizeof ids[i], "run_q%d", i);
    assert_int_equal(
        eph_store_run_insert(nodes[0], ids[i], "acme", "queued", 100 + i, req, i == RUNS - 1, &err),
        0);
  }
  assert_int_equal(eph_store_queue_push(nodes[0], "run_none", 7, false, 10, &err), -ENOENT);
  /* Six nodes' admissions at once against a bound of 4: exactly 4 are queued. */
  queue_arg_t push[6];
  for (int i = 0; i < 6; i++)
    push[i] = (queue_arg_t){.store = nodes[i % NODES], .run_id = ids[i], .max_queued = 4};
  queue_race(push, 6);
  int queued = 0, full = 0;
  for (int i = 0; i < 6; i++) {
    if (push[i].result == 0)
      queued++;
    else if (push[i].result == -EAGAIN)
      full++;
  }
  assert_int_equal(queued, 4);
  assert_int_equal(full, 2);
  assert_int_equal(queue_len(nodes[1]), 4);
  /* A queued run belongs to no node: its lease is gone, so no takeover can end it. */
  PGresult *res = pg_query(f,
                           "SELECT count(*) FROM runs r JOIN run_queue q ON q.run_id = r.id"
                           " WHERE r.node IS NULL AND r.lease_expires_us IS NULL",
                           NULL, NULL, true);
  assert_string_equal(PQgetvalue(res, 0, 0), "4");
  PQclear(res);
  /* Its admitting node q0 dies (its leases expire): its queued runs are not taken over. */
  assert_int_equal(sql_exec(f, "UPDATE runs SET lease_expires_us = 1 WHERE node = 'q0'"), 0);
  cleanup_json json_object *taken = NULL;
  assert_int_equal(eph_store_leases_take_expired(nodes[2], &taken, &err), 0);
  assert_int_equal(json_object_array_length(taken), RUNS - 4);
  for (size_t i = 0; i < json_object_array_length(taken); i++)
    for (int j = 0; j < 6; j++)
      if (push[j].result == 0)
        assert_string_not_equal(json_object_get_string(json_object_array_get_idx(taken, i)),
                                ids[j]);
  /* Six claims at once from three nodes: four distinct runs, none twice. */
  queue_arg_t claim[6];
  for (int i = 0; i < 6; i++)
    claim[i] = (queue_arg_t){.store = nodes[i % NODES]};
  queue_race(claim, 6);
  int got = 0;
  const char *seen[6] = {0};
  for (int i = 0; i < 6; i++) {
    assert_int_equal(claim[i].result, 0);
    if (!claim[i].claimed)
      continue;
    const char *id = json_object_get_string(json_object_object_get(claim[i].claimed, "id"));
    for (int j = 0; j < got; j++)
      assert_string_not_equal(seen[j], id);
    seen[got++] = id;
    assert_int_equal(
        json_object_get_int64(json_object_object_get(claim[i].claimed, "reserved_micros")), 7);
    assert_string_equal(json_object_get_string(json_object_object_get(
                            json_object_object_get(claim[i].claimed, "request"), "prompt")),
                        "queued prompt");
    /* The claimer holds the run now, with a lease. */
    char name[16];
    snprintf(name, sizeof name, "q%d", i % NODES);
    res = pg_query(f, "SELECT node, lease_expires_us IS NOT NULL FROM runs WHERE id = $1", id, NULL,
                   true);
    assert_string_equal(PQgetvalue(res, 0, 0), name);
    assert_string_equal(PQgetvalue(res, 0, 1), "t");
    PQclear(res);
  }
  assert_int_equal(got, 4);
  assert_int_equal(queue_len(nodes[0]), 0);
  for (int i = 0; i < 6; i++)
    json_object_put(claim[i].claimed);
  /* Cancelling a queued run takes it out: once. */
  const char *left = push[0].result == 0 ? NULL : ids[0];
  for (int i = 0; i < 6 && !left; i++)
    if (push[i].result != 0)
      left = ids[i];
  assert_int_equal(eph_store_queue_push(nodes[1], left, 7, false, 4, &err), 0);
  assert_int_equal(eph_store_queue_remove(nodes[2], left, &err), 1);
  assert_int_equal(eph_store_queue_remove(nodes[2], left, &err), 0);
  assert_int_equal(queue_len(nodes[0]), 0);
  /* local_only (zero data retention): node q0's, invisible to the others' claims. */
  const char *zdr = ids[RUNS - 1];
  assert_int_equal(eph_store_queue_push(nodes[0], zdr, 9, true, 4, &err), 0);
  json_object *none = NULL;
  assert_int_equal(eph_store_queue_claim(nodes[1], &none, &err), 0);
  assert_null(none);
  cleanup_json json_object *mine = NULL;
  assert_int_equal(eph_store_queue_claim(nodes[0], &mine, &err), 0);
  assert_non_null(mine);
  assert_string_equal(json_object_get_string(json_object_object_get(mine, "id")), zdr);
  assert_true(json_object_get_boolean(json_object_object_get(mine, "zdr")));
  /* ... and when q0 dies with one still queued, the takeover ends it and it leaves the
   * queue (and its count). */
  assert_int_equal(
      eph_store_run_insert(nodes[0], "run_qz2", "acme", "queued", 300, req, true, &err), 0);
  assert_int_equal(eph_store_queue_push(nodes[0], "run_qz2", 9, true, 4, &err), 0);
  assert_int_equal(queue_len(nodes[0]), 1);
  assert_int_equal(sql_exec(f, "UPDATE runs SET lease_expires_us = 1 WHERE id = 'run_qz2'"), 0);
  cleanup_json json_object *lost = NULL;
  assert_int_equal(eph_store_leases_take_expired(nodes[1], &lost, &err), 0);
  assert_int_equal(json_object_array_length(lost), 1);
  assert_int_equal(queue_len(nodes[0]), 0);
  for (int i = 0; i < NODES; i++)
    eph_store_close(nodes[i]);
#endif
}

/* Attack: values made of SQL (quotes, statement separators, comments, a NUL-free
 * backslash soup) go through every text parameter a client can influence: a run id, an
 * idempotency key, a key name, event text and JSON. Each is stored and read back verbatim
 * and the tables are all still there: nothing was ever spliced into SQL. */
static void
test_hostile_values(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  static const char *const evil[] = {
      "x'); DROP TABLE runs; --",      "'' OR 1=1 --",
      "\\'; SELECT pg_sleep(10); --",  "$1 $$ $tag$ ; COMMIT; DROP TABLE api_keys",
      "run_\"quoted\" /* comment */ ",
  };
  for (size_t i = 0; i < sizeof evil / sizeof evil[0]; i++) {
    cleanup_json json_object *req = request(evil[i]);
    assert_int_equal(
        eph_store_run_insert(f->store, evil[i], "acme", "queued", (int64_t)i + 1, req, false, &err),
        0);
    cleanup_json json_object *data = json_object_new_object();
    json_object_object_add(data, evil[i], json_object_new_string(evil[i]));
    assert_int_equal(
        eph_store_event_append(f->store, evil[i], 0, 1, "Shell", "tool_call", evil[i], data, &err),
        0);
    char h[65];
    sha(evil[i], h);
    char *existing = NULL;
    assert_int_equal(eph_store_idem_claim(f->store, "acme", evil[i], h, evil[i], &existing, &err),
                     0);
    assert_int_equal(
        eph_store_idem_claim(f->store, "acme", evil[i], h, "run_other", &existing, &err), 1);
    assert_string_equal(existing, evil[i]);
    free(existing);
    cleanup_free char *key = NULL;
    assert_int_equal(eph_store_key_create(f->store, "acme", evil[i], &key, NULL, &err), 0);
    assert_int_equal(eph_store_key_revoke(f->store, evil[i], "acme", &err), 0);
    assert_int_equal(eph_store_key_verify(f->store, key, NULL, NULL, &err), -EACCES);

    cleanup_json json_object *run = NULL, *events = NULL;
    assert_int_equal(eph_store_run_get(f->store, evil[i], "acme", &run, &err), 0);
    assert_string_equal(json_object_get_string(json_object_object_get(run, "id")), evil[i]);
    assert_string_equal(json_object_get_string(json_object_object_get(
                            json_object_object_get(run, "request"), "prompt")),
                        evil[i]);
    assert_int_equal(eph_store_events_since(f->store, evil[i], -1, 0, &events, &err), 0);
    json_object *e = json_object_array_get_idx(events, 0);
    assert_string_equal(json_object_get_string(json_object_object_get(e, "text")), evil[i]);
    assert_string_equal(
        json_object_get_string(json_object_object_get(json_object_object_get(e, "data"), evil[i])),
        evil[i]);
  }
  /* Every table is still there and holds exactly what was put in. */
  cleanup_json json_object *runs = NULL;
  char *next = NULL;
  assert_int_equal(eph_store_run_list(f->store, "acme", 0, NULL, &runs, &next, &err), 0);
  assert_int_equal(json_object_array_length(runs), 5);
  assert_null(next);
  cleanup_json json_object *keys = NULL;
  assert_int_equal(eph_store_key_list(f->store, "acme", &keys, &err), 0);
  assert_int_equal(json_object_array_length(keys), 5);
  assert_int_equal(eph_store_probe(f->store, &err), 0);
}

/* Which strings name a PostgreSQL database; the password of one never appears in the
 * store's name for messages. */
static int64_t
jget(json_object *o, const char *k)
{
  json_object *v = NULL;
  if (!json_object_object_get_ex(o, k, &v))
    fail_msg("no field %s in %s", k, json_object_to_json_string(o));
  return json_object_get_int64(v);
}

/* Admin keys, the audit trail and usage (core/admin.c) keep one contract on both stores,
 * and a second store on the same database (another node of a cluster, or another process
 * on one host) reads what the first wrote at once: the mark, its revocation, the trail. */
static void
test_admin_keys_audit_usage(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  cleanup_free char *key = NULL, *id = NULL, *plain = NULL, *plain_id = NULL, *org = NULL;
  assert_int_equal(eph_store_key_create(f->store, "ops", "root", &key, &id, &err), 0);
  assert_int_equal(eph_store_key_create(f->store, "cust", "app", &plain, &plain_id, &err), 0);
  if (eph_admin_key_mark(f->store, id, &err) < 0)
    fail_msg("marking an admin key: %s", err.message);
  assert_int_equal(eph_admin_key_mark(f->store, "key_00000000deadbeef", &err), -ENOENT);
  eph_store_t *other = NULL;
  if (eph_store_open(f->path, NULL, &other, &err) < 0)
    fail_msg("%s", err.message);
  bool admin = false;
  assert_int_equal(eph_admin_key_is_admin(other, id, &admin, &err), 0);
  assert_true(admin);
  assert_int_equal(eph_admin_key_is_admin(other, plain_id, &admin, &err), 0);
  assert_false(admin);
  assert_int_equal(eph_admin_key_org(other, id, &org, &err), 0);
  assert_string_equal(org, "ops");

  /* The trail: written through both, read newest first through either. */
  assert_int_equal(eph_admin_audit_add(f->store, id, "ops", "keys.create", "cust", NULL,
                                       "{\"name\":\"x\"}", "127.0.0.1", 201, 30, &err),
                   0);
  assert_int_equal(eph_admin_audit_add(other, plain_id, "cust", "audit.list", NULL, NULL, NULL,
                                       "::1", 403, 30, &err),
                   0);
  cleanup_json json_object *trail = NULL;
  assert_int_equal(eph_admin_audit_list(f->store, 10, &trail, &err), 0);
  assert_int_equal(json_object_array_length(trail), 2);
  json_object *newest = json_object_array_get_idx(trail, 0),
              *oldest = json_object_array_get_idx(trail, 1);
  assert_string_equal(json_object_get_string(json_object_object_get(newest, "actor_key_id")),
                      plain_id);
  assert_int_equal(jget(newest, "status"), 403);
  assert_null(json_object_object_get(newest, "target_org"));
  assert_string_equal(json_object_get_string(json_object_object_get(oldest, "detail")),
                      "{\"name\":\"x\"}");
  assert_string_equal(json_object_get_string(json_object_object_get(oldest, "action")),
                      "keys.create");
  assert_true(jget(newest, "id") > jget(oldest, "id"));
  assert_true(jget(oldest, "at_us") > 0);

  /* Usage: the runs' stored usage, summed. */
  cleanup_json json_object *req = json_tokener_parse("{\"prompt\":\"p\"}");
  cleanup_json json_object *usage = json_tokener_parse(
      "{\"model_micros\":5,\"web_micros\":1,\"compute_micros\":2,\"billed_micros\":8}");
  assert_int_equal(
      eph_store_run_insert(f->store, "run_u1", "cust", "queued", 1000, req, false, &err), 0);
  assert_int_equal(eph_store_run_update(f->store, "run_u1", "succeeded", NULL, usage, &err), 0);
  assert_int_equal(
      eph_store_run_insert(f->store, "run_u2", "cust", "queued", 1001, req, false, &err), 0);
  cleanup_json json_object *u = NULL;
  assert_int_equal(eph_admin_usage(other, "cust", 0, 2000, &u, &err), 0);
  assert_int_equal(jget(u, "runs"), 2);
  assert_int_equal(jget(u, "billed_micros"), 8);
  assert_int_equal(jget(u, "compute_micros"), 2);

  /* Revoked through one, the key is no admin key through the other. */
  assert_int_equal(eph_store_key_revoke(other, id, "ops", &err), 0);
  assert_int_equal(eph_admin_key_is_admin(f->store, id, &admin, &err), 0);
  assert_false(admin);
  free(org);
  org = NULL;
  assert_int_equal(eph_admin_key_org(f->store, id, &org, &err), -ENOENT);
  eph_store_close(other);
}

static void
test_target_kind_and_password_hidden(void **st)
{
  fixture_t *f = *st;
  assert_true(eph_store_target_is_pg("postgresql://db.example/eph"));
  assert_true(eph_store_target_is_pg("postgres://u:p@db/eph"));
  assert_true(eph_store_target_is_pg("host=db dbname=eph"));
  assert_false(eph_store_target_is_pg("/var/lib/ephemeral/ephemeral.sqlite"));
  assert_false(eph_store_target_is_pg("./state/a=b/ephemeral.sqlite"));
  assert_false(eph_store_target_is_pg("postgresql.sqlite"));
  assert_int_equal(eph_store_kind(f->store), f->pg ? EPH_STORE_POSTGRES : EPH_STORE_SQLITE);
  if (!f->pg)
    return;
  char with_pw[1200];
  snprintf(with_pw, sizeof with_pw, "%s&password=Sekr1tPassw0rd", f->path);
  eph_store_t *s = NULL;
  eph_error_t err = {0};
  assert_int_equal(eph_store_open(with_pw, NULL, &s, &err), 0); /* trust auth: ignored */
  assert_null(strstr(eph_store_path(s), "Sekr1t"));
  assert_non_null(strstr(eph_store_path(s), "ephemeral_test"));
  eph_store_close(s);
  /* A refused connection's message names the target, not the password. */
  char bad[1200];
  snprintf(bad, sizeof bad, "postgresql://nobody:Sekr1tPassw0rd@/no_such_db?host=%s",
           getenv("PGHOST") ? getenv("PGHOST") : "/nonexistent");
  err = (eph_error_t){0};
  assert_true(eph_store_open(bad, NULL, &s, &err) < 0);
  assert_null(strstr(err.message, "Sekr1t"));
  assert_non_null(strstr(err.message, "no_such_db"));
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_keys, setup, teardown),
      cmocka_unit_test_setup_teardown(test_runs_and_cursor, setup, teardown),
      cmocka_unit_test_setup_teardown(test_events_since, setup, teardown),
      cmocka_unit_test_setup_teardown(test_idempotency_same_and_different_body, setup, teardown),
      cmocka_unit_test_setup_teardown(test_idempotency_concurrent_claims, setup, teardown),
      cmocka_unit_test_setup_teardown(test_idempotency_across_connections, setup, teardown),
      cmocka_unit_test_setup_teardown(test_purge, setup, teardown),
      cmocka_unit_test_setup_teardown(test_zdr_payloads_not_stored, setup, teardown),
      cmocka_unit_test_setup_teardown(test_schema_version, setup, teardown),
      cmocka_unit_test_setup_teardown(test_idempotency_concurrent_claims_separate_connections,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_concurrent_first_open, setup, teardown),
      cmocka_unit_test_setup_teardown(test_target_kind_and_password_hidden, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cancel_requests, setup, teardown),
      cmocka_unit_test_setup_teardown(test_leases, setup, teardown),
      cmocka_unit_test_setup_teardown(test_queue, setup, teardown),
      cmocka_unit_test_setup_teardown(test_hostile_values, setup, teardown),
      cmocka_unit_test_setup_teardown(test_admin_keys_audit_usage, setup, teardown),
      /* Properties of the SQLite file itself: last, left out on PostgreSQL. */
      cmocka_unit_test_setup_teardown(test_damaged_file_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_damage_found_while_open_is_sticky, setup, teardown),
  };
  const size_t sqlite_only = 2, all = sizeof tests / sizeof tests[0];
  const char *db = getenv("EPH_TEST_DATABASE");
  if (db && *db)
    return _cmocka_run_group_tests("store (PostgreSQL)", tests, all - sqlite_only, NULL, NULL);
  return _cmocka_run_group_tests("store (SQLite)", tests, all, NULL, NULL);
}
