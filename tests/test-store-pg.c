/* Tests of the PostgreSQL store's connection (core/store_pg_conn.c) when the server closes
 * it, on a real database (tests/store-pg-conn.test runs this program under tests/with-pg):
 * the store's backend is terminated behind its back (pg_terminate_backend, as a server
 * restart or a failover does) and the store must reconnect as the session it was:
 *   - the session's settings (lock_timeout, from busy_timeout_ms) hold on the new session,
 *     so a statement waiting on another session's lock still gives up instead of hanging;
 *   - a transaction (eph_store_with_pg) whose connection is lost between two statements is
 *     not continued on the new connection outside any transaction: its first statement died
 *     with the old session, so the second alone must not be committed and reported as the
 *     whole; the call fails and nothing of it is stored.
 * And the leases' clock: a node whose wall clock is wrong (NTP broken, a VM restored from a
 * snapshot) must neither take over the live runs of the others (its clock ahead) nor lose
 * its own (behind): the leases are the database server's time, one clock for every node.
 * This program's CLOCK_REALTIME is skewed (clock_gettime below) while one "node" acts; the
 * same holds for the orphan sweep (cluster_orphans.c with the real ledger-postgres, whose
 * clock_gettime calls resolve to this program's too). */
#include "config.h"

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <libpq-fe.h>

#include "admin.h"
#include "cluster_ledger.h"
#include "context.h"
#include "host.h"
#include "loader.h"
#include "store-fixture.h"
#include "store.h"
#include "util.h"

/* Added to CLOCK_REALTIME while a skewed node acts, seconds. This definition wins over the C
 * library's for the code linked into this program (core/util.c's eph_wall_us). */
static long skew_s;

int
clock_gettime(clockid_t id, struct timespec *ts)
{
  int r = (int)syscall(SYS_clock_gettime, id, ts);
  if (r == 0 && id == CLOCK_REALTIME)
    ts->tv_sec += skew_s;
  return r;
}

/* A connection of the test's own, behind the store's back, kept open across statements (a
 * lock held by its transaction). */
static PGconn *side_conn;

/* sql on side_conn; the result (caller clears), failing the test on error. */
static PGresult *
side(fixture_t *f, const char *sql)
{
  (void)f;
  PGresult *res = PQexec(side_conn, sql);
  ExecStatusType s = PQresultStatus(res);
  if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK)
    fail_msg("%s: %s", sql, PQresultErrorMessage(res));
  return res;
}

/* tests/store-fixture.c's (an emptied database), the store reopened with a short lock
 * timeout, and side_conn. */
static int
pg_setup(void **st)
{
  if (!getenv("EPH_TEST_DATABASE"))
    fail_msg("EPH_TEST_DATABASE is not set (run tests/store-pg-conn.test)");
  setup(st);
  fixture_t *f = *st;
  eph_store_close(f->store);
  eph_store_options_t o = {.busy_timeout_ms = 300};
  eph_error_t err = {0};
  if (eph_store_open(f->path, &o, &f->store, &err) < 0)
    fail_msg("%s", err.message);
  side_conn = PQconnectdb(f->path);
  if (PQstatus(side_conn) != CONNECTION_OK)
    fail_msg("connecting to %s: %s", f->path, PQerrorMessage(side_conn));
  return 0;
}

static int
pg_teardown(void **st)
{
  PQfinish(side_conn);
  side_conn = NULL;
  return teardown(st);
}

/* One statement's rows on the store's own connection. */
typedef struct {
  const char *sql;
  json_object *rows;
} query_t;

static int
one_query(eph_store_t *s, void *opaque, eph_error_t *err)
{
  query_t *q = opaque;
  return eph_store_pg_query(s, &q->rows, NULL, "test query", err, q->sql, "");
}

/* The first column of the first row of sql run by store s, as text (heap). */
static char *
value_of(eph_store_t *s, const char *sql)
{
  query_t q = {.sql = sql};
  eph_error_t err = {0};
  if (eph_store_with_pg(s, false, one_query, &q, &err) < 0)
    fail_msg("%s: %s", sql, err.message);
  json_object *row = json_object_array_get_idx(q.rows, 0);
  char *out = NULL;
  json_object_object_foreach(row, k, v) {
    (void)k;
    out = eph_xstrdup(json_object_get_string(v));
    break;
  }
  json_object_put(q.rows);
  assert_non_null(out);
  return out;
}

/* The same on the fixture's store. */
static char *
store_value(fixture_t *f, const char *sql)
{
  return value_of(f->store, sql);
}

/* Terminates store st's backend from the side connection, as a server restart would. */
static void
kill_backend_of(fixture_t *f, eph_store_t *st)
{
  cleanup_free char *pid = value_of(st, "SELECT pg_backend_pid()::text");
  char sql[96];
  snprintf(sql, sizeof sql, "SELECT pg_terminate_backend(%s)", pid);
  PQclear(side(f, sql));
}

static void
kill_store_backend(fixture_t *f)
{
  kill_backend_of(f, f->store);
}

static void
test_session_settings_survive_reconnect(void **st)
{
  fixture_t *f = *st;
  cleanup_free char *before = store_value(f, "SHOW lock_timeout");
  assert_string_equal(before, "300ms");
  kill_store_backend(f);
  /* The next statement finds the connection closed, reconnects and is retried once. */
  eph_error_t err = {0};
  assert_int_equal(eph_store_probe(f->store, &err), 0);
  cleanup_free char *after = store_value(f, "SHOW lock_timeout");
  assert_string_equal(after, "300ms");
  /* And it works: a run row another session holds locked makes an update give up. */
  cleanup_json json_object *req = json_tokener_parse("{\"prompt\":\"p\"}");
  assert_int_equal(eph_store_run_insert(f->store, "run_lk", "acme", "running", 1, req, false, &err),
                   0);
  PQclear(side(f, "BEGIN; SELECT 1 FROM runs WHERE id = 'run_lk' FOR UPDATE"));
  assert_int_equal(eph_store_run_update(f->store, "run_lk", "failed", NULL, NULL, &err), -EBUSY);
  PQclear(side(f, "ROLLBACK"));
}

static void
test_transaction_not_continued_after_reconnect(void **st)
{
  fixture_t *f = *st;
  /* The audit record's transaction is two statements (the INSERT, then the purge of old
   * records): the purge kills its own backend, once (a sequence is not rolled back). */
  PQclear(side(f,
               "CREATE SEQUENCE once;"
               "CREATE FUNCTION die_once() RETURNS trigger LANGUAGE plpgsql AS $$"
               " BEGIN IF nextval('once') = 1 THEN PERFORM pg_terminate_backend(pg_backend_pid());"
               " END IF; RETURN NULL; END $$;"
               "CREATE TRIGGER die_once BEFORE DELETE ON audit"
               " FOR EACH STATEMENT EXECUTE FUNCTION die_once()"));
  eph_error_t err = {0};
  int r = eph_admin_audit_add(f->store, "key_1", "acme", "keys.create", "acme", NULL, NULL,
                              "127.0.0.1", 201, 30, &err);
  PGresult *res = side(f, "SELECT count(*), (SELECT last_value FROM once) FROM audit");
  int rows = atoi(PQgetvalue(res, 0, 0)), deaths = atoi(PQgetvalue(res, 0, 1));
  PQclear(res);
  assert_true(deaths >= 1); /* the purge's backend did die (the old code retried it: 2) */
  /* Either the whole record (retried as a whole) or a failure the caller logs: never a
   * success with the record lost. */
  if (r == 0)
    assert_int_equal(rows, 1);
  else
    assert_int_equal(rows, 0);
  /* The store works afterwards. */
  err = (eph_error_t){0};
  assert_int_equal(eph_admin_audit_add(f->store, "key_1", "acme", "keys.create", "acme", NULL, NULL,
                                       "127.0.0.1", 201, 30, &err),
                   0);
}

static eph_store_t *
node(fixture_t *f, const char *name)
{
  eph_store_options_t o = {.node_name = name, .lease_seconds = 5};
  eph_store_t *s = NULL;
  eph_error_t err = {0};
  if (eph_store_open(f->path, &o, &s, &err) < 0)
    fail_msg("%s", err.message);
  return s;
}

/* The node holding run_id, as text (heap). */
static char *
holder(fixture_t *f, const char *run_id)
{
  char sql[128];
  snprintf(sql, sizeof sql, "SELECT coalesce(node, '-') FROM runs WHERE id = '%s'", run_id);
  PGresult *res = side(f, sql);
  char *out = eph_xstrdup(PQgetvalue(res, 0, 0));
  PQclear(res);
  return out;
}

static void
test_leases_use_one_clock(void **st)
{
  fixture_t *f = *st;
  eph_store_t *a = node(f, "na"), *b = node(f, "nb");
  eph_error_t err = {0};
  cleanup_json json_object *req = json_tokener_parse("{\"prompt\":\"p\"}");
  cleanup_json json_object *ids = json_tokener_parse("[\"run_a\"]");
  assert_int_equal(eph_store_run_insert(a, "run_a", "acme", "running", 1, req, false, &err), 0);
  /* b's clock 10 minutes ahead: a's live run (its lease 5 s from a's now) is not expired. */
  skew_s = 600;
  cleanup_json json_object *taken = NULL;
  assert_int_equal(eph_store_leases_take_expired(b, &taken, &err), 0);
  skew_s = 0;
  assert_int_equal(json_object_array_length(taken), 0);
  cleanup_free char *h1 = holder(f, "run_a");
  assert_string_equal(h1, "na");
  /* a's clock 10 minutes behind when it renews: its lease still runs from the true now. */
  skew_s = -600;
  assert_int_equal(eph_store_leases_renew(a, ids, &err), 0);
  skew_s = 0;
  cleanup_json json_object *taken2 = NULL;
  assert_int_equal(eph_store_leases_take_expired(b, &taken2, &err), 0);
  assert_int_equal(json_object_array_length(taken2), 0);
  cleanup_free char *h2 = holder(f, "run_a");
  assert_string_equal(h2, "na");
  /* And an expired lease is still taken (a stopped renewing). */
  PQclear(side(f, "UPDATE runs SET lease_expires_us = 1 WHERE id = 'run_a'"));
  cleanup_json json_object *taken3 = NULL;
  assert_int_equal(eph_store_leases_take_expired(b, &taken3, &err), 0);
  assert_int_equal(json_object_array_length(taken3), 1);
  cleanup_free char *h3 = holder(f, "run_a");
  assert_string_equal(h3, "nb");
  eph_store_close(a);
  eph_store_close(b);
}

/* ---------------------------------------------------------------- the search path */

/* Whether key authenticates on store st, and as which organisation ("-" when refused). */
static void
key_org(eph_store_t *st, const char *key, char *out, size_t size)
{
  cleanup_free char *org = NULL;
  eph_error_t err = {0};
  int r = eph_store_key_verify(st, key, &org, NULL, &err);
  snprintf(out, size, "%s", r == 0 ? org : "-");
}

/* The count of sql's rows on the side connection. */
static int
side_count(fixture_t *f, const char *sql)
{
  PGresult *res = side(f, sql);
  int n = atoi(PQgetvalue(res, 0, 0));
  PQclear(res);
  return n;
}

/* Attack: another role of the database (mallory) makes a schema named after the store's
 * role (the server's default search_path begins with "$user": such a schema, usable by the
 * store, comes before public, where the store's tables are) and another one the URI's
 * options put first (`options=-c search_path=shady,...`), each holding tables shadowing the
 * store's: an api_keys with a key of mallory's making for organisation "victim", an empty
 * runs, an eph_schema saying the schema is migrated. The store's statements must read and
 * write its own tables whatever the path says: on the fixture's session (open before the
 * attack), on a new one, on one opened with the hostile options, and after that one's
 * reconnect (a new session starts with the hostile path again). */
static void
test_search_path_cannot_shadow_tables(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  cleanup_free char *key = NULL, *forged = NULL, *forged_id = NULL;
  assert_int_equal(eph_store_key_create(f->store, "acme", "real", &key, NULL, &err), 0);
  assert_int_equal(eph_store_key_create(f->store, "victim", "forged", &forged, &forged_id, &err),
                   0);
  PGresult *u = side(f, "SELECT quote_ident(current_user)");
  cleanup_free char *me = eph_xstrdup(PQgetvalue(u, 0, 0));
  PQclear(u);
  char sql[2048];
  PQclear(side(f, "DROP ROLE IF EXISTS mallory; CREATE ROLE mallory"));
  static const char *const schemas[] = {NULL, "shady"};
  for (int i = 0; i < 2; i++) {
    const char *sch = schemas[i] ? schemas[i] : me;
    snprintf(sql, sizeof sql,
             "CREATE SCHEMA %1$s AUTHORIZATION mallory; GRANT USAGE ON SCHEMA %1$s TO PUBLIC;"
             "CREATE TABLE %1$s.api_keys (LIKE public.api_keys INCLUDING ALL);"
             "CREATE TABLE %1$s.runs (LIKE public.runs INCLUDING ALL);"
             "CREATE TABLE %1$s.eph_schema AS SELECT * FROM public.eph_schema;"
             "INSERT INTO %1$s.api_keys SELECT * FROM public.api_keys WHERE id = '%2$s';"
             "ALTER TABLE %1$s.api_keys OWNER TO mallory; ALTER TABLE %1$s.runs OWNER TO mallory;"
             "ALTER TABLE %1$s.eph_schema OWNER TO mallory;"
             "GRANT ALL ON ALL TABLES IN SCHEMA %1$s TO PUBLIC",
             sch, forged_id);
    PQclear(side(f, sql));
  }
  snprintf(sql, sizeof sql, "DELETE FROM public.api_keys WHERE id = '%s'", forged_id);
  PQclear(side(f, sql)); /* the forged key is mallory's alone now */
  cleanup_free char *hostile =
      eph_xasprintf("%s&options=-c%%20search_path%%3Dshady%%2Cpg_catalog%%2Cpublic", f->path);
  eph_store_t *fresh = NULL, *opts = NULL;
  if (eph_store_open(f->path, NULL, &fresh, &err) < 0 ||
      eph_store_open(hostile, NULL, &opts, &err) < 0)
    fail_msg("%s", err.message);
  eph_store_t *stores[] = {f->store, fresh, opts, opts};
  for (int i = 0; i < 4; i++) {
    if (i == 3)
      kill_backend_of(f, opts); /* reconnected at the next statement */
    char a[64], b[64];
    key_org(stores[i], forged, a, sizeof a);
    key_org(stores[i], key, b, sizeof b);
    print_message("# session %d: mallory's key: %s, the real key: %s\n", i, a, b);
    assert_string_equal(a, "-");
    assert_string_equal(b, "acme");
    char id[32];
    snprintf(id, sizeof id, "run_sp%d", i);
    cleanup_json json_object *req = json_tokener_parse("{\"prompt\":\"p\"}");
    assert_int_equal(eph_store_run_insert(stores[i], id, "acme", "queued", 1, req, false, &err), 0);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM public.runs WHERE id = '%s'", id);
    assert_int_equal(side_count(f, sql), 1);
  }
  snprintf(sql, sizeof sql,
           "SELECT (SELECT count(*) FROM %s.runs) + (SELECT count(*) FROM shady.runs)", me);
  assert_int_equal(side_count(f, sql), 0);
  eph_store_close(fresh);
  eph_store_close(opts);

  /* The store kept where the path used to lead (a schema this role does not own) is not
   * silently replaced by a second, empty one in public: the open is refused, naming it. */
  PQclear(side(f, "DROP SCHEMA public CASCADE; CREATE SCHEMA public"));
  eph_store_t *second = NULL;
  err = (eph_error_t){0};
  assert_int_equal(eph_store_open(hostile, NULL, &second, &err), -EPH_E_CONFIG);
  print_message("# %s\n", err.message);
  assert_non_null(strstr(err.message, "schema 'shady'"));
  assert_int_equal(side_count(f, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"), 0);
  snprintf(sql, sizeof sql,
           "DROP SCHEMA %s CASCADE; DROP SCHEMA shady CASCADE; DROP OWNED BY mallory;"
           " DROP ROLE mallory",
           me);
  PQclear(side(f, sql));
}

/* ---------------------------------------------------------------- the orphan sweep's clock */

/* A sweeping node as the daemon has it (eph_orphans_*): a context whose only plugin is the
 * real ledger-postgres on the test database (reserving as node "na"), the default
 * lease_seconds (15: reservations open for more than 15 + EPH_ORPHAN_GRACE_S s are
 * orphans when their run has no row). */
typedef struct sweeper {
  eph_ctx_t ctx;
  config_t cfg;
  const eph_ledger_ops_t *ops;
  void *state;
} sweeper_t;

static bool
sweeper_open(sweeper_t *w, fixture_t *f)
{
  const char *b = getenv("EPH_BUILDDIR");
  cleanup_free char *path =
      eph_xasprintf("%s/plugins/.libs/ledger-postgres.so", b ? b : EPH_BUILDDIR);
  if (access(path, F_OK) != 0)
    return false;
  *w = (sweeper_t){0};
  w->ctx.state_dir = eph_xstrdup(f->dir);
  eph_host_init(&w->ctx.host, &w->ctx);
  config_init(&w->cfg);
  cleanup_free char *text =
      eph_xasprintf("ledger-postgres: { database = \"%s\"; node_name = \"na\"; };", f->path);
  assert_int_equal(config_read_string(&w->cfg, text), CONFIG_TRUE);
  eph_error_t err = {0};
  if (eph_plugin_load_file(&w->ctx.plugins, path, config_lookup(&w->cfg, "ledger-postgres"),
                           &w->ctx.host, NULL, &err) < 0)
    fail_msg("%s", err.message);
  const eph_plugin_slot_t *l = eph_plugins_first(&w->ctx.plugins, EPH_KIND_LEDGER);
  w->ops = l->desc->ops;
  w->state = l->state;
  return true;
}

static void
sweeper_close(sweeper_t *w)
{
  eph_plugins_unload(&w->ctx.plugins);
  config_destroy(&w->cfg);
  free(w->ctx.state_dir);
}

/* One sweep by `store` with this program's clock skewed by skew (s); how many it released. */
static int
sweep(sweeper_t *w, eph_store_t *store, long skew)
{
  eph_orphans_t o;
  eph_orphans_init(&o, &w->ctx, store);
  assert_true(o.enabled);
  skew_s = skew;
  int n = eph_orphans_tick(&o, &w->ctx, store, 0);
  skew_s = 0;
  return n;
}

/* Reserves run_id's budget as node "na" with this program's clock skewed by skew (s). */
static void
reserve(sweeper_t *w, const char *run_id, long skew)
{
  eph_error_t err = {0};
  skew_s = skew;
  int r = w->ops->reserve(w->state, "acme", run_id, 100, &err);
  skew_s = 0;
  if (r < 0)
    fail_msg("reserving %s: %s", run_id, err.message);
}

/* Whether run_id's reservation is settled, and its row's status ("-" without a row). */
static void
orphan_state(fixture_t *f, const char *run_id, char *out, size_t size)
{
  char sql[320];
  snprintf(sql, sizeof sql,
           "SELECT (SELECT settled FROM ledger.reservations WHERE run_id = '%s')::text || ' ' ||"
           " coalesce((SELECT status || '/' || (usage::jsonb->>'reason') FROM runs"
           " WHERE id = '%s'), '-')",
           run_id, run_id);
  PGresult *res = side(f, sql);
  snprintf(out, size, "%s", PQgetvalue(res, 0, 0));
  PQclear(res);
}

/* The orphan sweep measures a reservation's age by one clock (the ledger's: the database
 * server's), not by the reserving node's nor the sweeper's: a sweeper whose clock is 10
 * minutes ahead ends no admission in progress, nor does any sweeper end one whose node's
 * clock is 10 minutes behind; a dead node's reservation (made a minute ago, truly) is
 * released by a sweeper whose clock is 10 minutes behind, and when the dead node's clock
 * was 10 minutes ahead. */
static void
test_orphan_sweep_uses_one_clock(void **st)
{
  fixture_t *f = *st;
  PQclear(side(f, "DROP SCHEMA IF EXISTS ledger CASCADE"));
  setenv("EPHEMERAL_DATABASE", f->path, 1);
  sweeper_t w;
  if (!sweeper_open(&w, f)) {
    unsetenv("EPHEMERAL_DATABASE");
    skip(); /* a build without plugins/ledger-postgres */
  }
  eph_store_t *b = node(f, "nb");
  eph_error_t err = {0};
  assert_int_equal(w.ops->credit(w.state, "acme", 1000000, &err), 0);
  /* Admissions in progress (reserved, no row yet): "na" with the true time, and with its
   * clock 10 minutes behind. */
  reserve(&w, "run_live1", 0);
  reserve(&w, "run_live2", -600);
  assert_int_equal(sweep(&w, b, 600), 0); /* the sweeper 10 minutes ahead */
  assert_int_equal(sweep(&w, b, 0), 0);
  char s1[64], s2[64];
  orphan_state(f, "run_live1", s1, sizeof s1);
  orphan_state(f, "run_live2", s2, sizeof s2);
  assert_string_equal(s1, "0 -");
  assert_string_equal(s2, "0 -");
  /* A node that reserved a minute ago and died before storing the rows: with the true time
   * and with its clock 10 minutes ahead. (Their journal entries are moved a minute back,
   * behind the append-only trigger's back, as a minute's wait would.) */
  reserve(&w, "run_dead1", 0);
  reserve(&w, "run_dead2", 600);
  PQclear(side(f, "SET session_replication_role = replica;"
                  " UPDATE ledger.entries SET t_us = t_us - 60000000"
                  " WHERE run_id IN ('run_dead1', 'run_dead2') AND kind = 'reserve';"
                  " SET session_replication_role = origin"));
  assert_int_equal(sweep(&w, b, -600), 2); /* the sweeper 10 minutes behind */
  char d1[64], d2[64];
  orphan_state(f, "run_dead1", d1, sizeof d1);
  orphan_state(f, "run_dead2", d2, sizeof d2);
  assert_string_equal(d1, "1 failed/host_lost");
  assert_string_equal(d2, "1 failed/host_lost");
  orphan_state(f, "run_live1", s1, sizeof s1);
  orphan_state(f, "run_live2", s2, sizeof s2);
  assert_string_equal(s1, "0 -");
  assert_string_equal(s2, "0 -");
  eph_store_close(b);
  sweeper_close(&w);
  unsetenv("EPHEMERAL_DATABASE");
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_session_settings_survive_reconnect, pg_setup,
                                      pg_teardown),
      cmocka_unit_test_setup_teardown(test_transaction_not_continued_after_reconnect, pg_setup,
                                      pg_teardown),
      cmocka_unit_test_setup_teardown(test_leases_use_one_clock, pg_setup, pg_teardown),
      cmocka_unit_test_setup_teardown(test_orphan_sweep_uses_one_clock, pg_setup, pg_teardown),
      cmocka_unit_test_setup_teardown(test_search_path_cannot_shadow_tables, pg_setup, pg_teardown),
  };
  return cmocka_run_group_tests_name("store (PostgreSQL connection)", tests, NULL, NULL);
}
