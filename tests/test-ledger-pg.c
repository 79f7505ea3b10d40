/* The ledger tests of the PostgreSQL build only (tests/test-ledger-postgres, with
 * tests/test-ledger.c): a server stopped mid-run, several processes and connections on one
 * database, the core's database by default, locks, roles and search_path. */
#include "config.h"

#include "ledger-fixture.h"

/* ---------------------------------------------------------------- PostgreSQL only */

/* Runs pg_ctl on with-pg's cluster (as its unprivileged owner when we are root). */
static void
pg_ctl(const char *action)
{
  const char *bindir = getenv("EPH_TEST_PG_BINDIR"), *dir = getenv("EPH_TEST_PG_DIR");
  const char *role = getenv("PGUSER");
  assert_non_null(bindir);
  assert_non_null(dir);
  char run_as[256] = "";
  if (getuid() == 0 && role)
    snprintf(run_as, sizeof run_as, "setpriv --reuid=%s --regid=$(id -g %s) --init-groups --", role,
             role);
  char cmd[2048];
  if (strcmp(action, "start") == 0)
    snprintf(cmd, sizeof cmd,
             "cd '%s' && %s '%s/pg_ctl' -D '%s/data' -l '%s/server.log' -w -t 60 -o "
             "\"-c listen_addresses= -c unix_socket_directories=%s -c max_connections=200\" "
             "start >/dev/null",
             dir, run_as, bindir, dir, dir, dir);
  else
    snprintf(cmd, sizeof cmd,
             "cd '%s' && %s '%s/pg_ctl' -D '%s/data' -m immediate -w stop "
             ">/dev/null",
             dir, run_as, bindir, dir);
  assert_int_equal(system(cmd), 0);
}

/* Configuration errors and an unreachable database are refused at init, the message naming
 * the setting and the database without its password. */
void
test_pg_config_and_unreachable(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  unload(f);
  assert_true(load_as(f, NULL, false, &err) < 0);
  assert_int_equal(err.code, EPH_E_CONFIG);
  assert_non_null(strstr(err.message, "'database'"));
  config_destroy(&f->cfg);

  err = (eph_error_t){0};
  char block[512];
  snprintf(block, sizeof block,
           "database = \"postgresql://ledger:s3cr3t-pw@/nodb?host=%s/no-such-dir\";"
           " connect_timeout_s = 2;",
           f->dir);
  assert_true(load_as(f, block, false, &err) < 0);
  print_message("# %s\n", err.message);
  assert_int_equal(err.code, EIO);
  assert_non_null(strstr(err.message, "'database'"));
  assert_non_null(strstr(err.message, "cannot connect"));
  assert_non_null(strstr(err.message, "dbname=nodb"));
  assert_null(strstr(err.message, "s3cr3t-pw"));
  config_destroy(&f->cfg);

  /* A remote host without verified TLS is refused before any connection is tried (no
   * traffic leaves the machine: the check reads the string only). */
  err = (eph_error_t){0};
  assert_true(
      load_as(f, "database = \"postgresql://ledger@db.example.invalid/ledger\";", false, &err) < 0);
  assert_int_equal(err.code, EPH_E_CONFIG);
  assert_non_null(strstr(err.message, "db.example.invalid"));
  assert_non_null(strstr(err.message, "sslmode=verify-full"));
  config_destroy(&f->cfg);
  err = (eph_error_t){0};
  assert_true(
      load_as(f, "database = \"host=/tmp,db.example.invalid sslmode=require\";", false, &err) < 0);
  assert_non_null(strstr(err.message, "'require'"));
  config_destroy(&f->cfg);
  /* A name that only starts like a loopback address is a name (red3: a prefix test took
   * it for 127/8 and let it connect without TLS). */
  const char *const not_loopback[] = {"postgresql://ledger@127.db.example.invalid/ledger",
                                      "host=127.0.0.1.example.invalid dbname=ledger",
                                      "host=/tmp hostaddr=127.0.0.1,10.0.0.9 dbname=ledger"};
  for (size_t i = 0; i < sizeof not_loopback / sizeof *not_loopback; i++) {
    char b[256];
    snprintf(b, sizeof b, "database = \"%s\"; connect_timeout_s = 1;", not_loopback[i]);
    err = (eph_error_t){0};
    assert_true(load_as(f, b, false, &err) < 0);
    print_message("# %s\n", err.message);
    assert_int_equal(err.code, EPH_E_CONFIG);
    assert_non_null(strstr(err.message, "is not local"));
    config_destroy(&f->cfg);
  }

  err = (eph_error_t){0};
  assert_true(load(f, "connections = 0;", &err) < 0);
  assert_non_null(strstr(err.message, "connections"));
  config_destroy(&f->cfg);
  err = (eph_error_t){0};
  char long_node[200];
  snprintf(long_node, sizeof long_node, "node_name = \"%0150d\";", 0);
  assert_true(load(f, long_node, &err) < 0);
  assert_int_equal(err.code, EPH_E_CONFIG);
  assert_non_null(strstr(err.message, "node_name"));
  config_destroy(&f->cfg);
  assert_int_equal(load(f, "connections = 2; node_name = \"node-a\";", &err), 0);
  assert_int_equal(f->ops->credit(f->state, "acme", 5, &err), 0);
  assert_int_equal(f->ops->probe(f->state, &err), 0);
}

/* The server goes away mid-run: charges are refused (fail closed) with an error naming the
 * database, nothing is recorded for them; once it is back the same plugin instance
 * reconnects and what was refused is not in the journal. */
void
test_pg_server_stopped_mid_run(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  assert_int_equal(f->ops->credit(f->state, "acme", 100000, &err), 0);
  assert_int_equal(f->ops->reserve(f->state, "acme", "run_mid", 40000, &err), 0);
  assert_int_equal(f->ops->charge(f->state, "run_mid", EPH_COST_MODEL, 100, "before", &err), 0);

  pg_ctl("stop");
  err = (eph_error_t){0};
  int r = f->ops->charge(f->state, "run_mid", EPH_COST_COMPUTE, 50, "while down", &err);
  print_message("# %s\n", err.message);
  assert_int_equal(r, -EIO);
  assert_non_null(strstr(err.message, "ephemeral_test"));
  eph_ledger_totals_t t = {0};
  assert_true(f->ops->settle(f->state, "run_mid", &t, &err) < 0);
  assert_true(f->ops->probe(f->state, &err) < 0);
  pg_ctl("start");

  err = (eph_error_t){0};
  assert_int_equal(f->ops->charge(f->state, "run_mid", EPH_COST_WEB, 7, "after", &err), 0);
  assert_int_equal(f->ops->settle(f->state, "run_mid", &t, &err), 0);
  assert_int_equal(t.billed_micros, 107);
  assert_int_equal(t.compute_micros, 0);
  assert_int_equal(t.released_micros, 40000 - 107);
  assert_int_equal(balance(f, "acme"), 100000 - 107);
  raw_t *db = raw_open(f);
  assert_int_equal(raw_int(db, "SELECT count(*) FROM entries WHERE kind = 'charge'", NULL), 2);
  raw_close(db);
  check_journal(f);
}

#define CHARGE_THREADS 8
#define CHARGES_PER_THREAD 40
#define CHARGE_MICROS 3
#define CHARGE_CAP 500

typedef struct charge_arg {
  fixture_t *f;
  int granted, refused, other;
} charge_arg_t;

static void *
charge_worker(void *p)
{
  charge_arg_t *a = p;
  for (int i = 0; i < CHARGES_PER_THREAD; i++) {
    eph_error_t err = {0};
    int r = a->f->ops->charge(a->f->state, "run_hot", EPH_COST_MODEL, CHARGE_MICROS, "t", &err);
    if (r == 0)
      a->granted++;
    else if (r == -EPH_E_BUDGET)
      a->refused++;
    else {
      print_message("# charge: %s\n", err.message);
      a->other++;
    }
  }
  return NULL;
}

/* 8 threads on 8 connections charge one reservation at once, 320 x 3 micros against a cap of
 * 500: exactly 166 charges pass, the rest are refused whole, billed never passes the cap and
 * the balance never goes negative. */
void
test_pg_concurrent_charges_one_reservation(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  unload(f);
  assert_int_equal(load(f, "connections = 8;", &err), 0);
  assert_int_equal(f->ops->credit(f->state, "acme", CHARGE_CAP, &err), 0);
  assert_int_equal(f->ops->reserve(f->state, "acme", "run_hot", CHARGE_CAP, &err), 0);
  pthread_t th[CHARGE_THREADS];
  charge_arg_t args[CHARGE_THREADS];
  for (int i = 0; i < CHARGE_THREADS; i++) {
    args[i] = (charge_arg_t){.f = f};
    assert_int_equal(pthread_create(&th[i], NULL, charge_worker, &args[i]), 0);
  }
  int granted = 0, refused = 0, other = 0;
  for (int i = 0; i < CHARGE_THREADS; i++) {
    pthread_join(th[i], NULL);
    granted += args[i].granted;
    refused += args[i].refused;
    other += args[i].other;
  }
  assert_int_equal(other, 0);
  assert_int_equal(granted, CHARGE_CAP / CHARGE_MICROS);
  assert_int_equal(refused, CHARGE_THREADS * CHARGES_PER_THREAD - granted);
  eph_ledger_totals_t t = {0};
  assert_int_equal(f->ops->totals(f->state, "run_hot", &t, &err), 0);
  assert_int_equal(t.billed_micros, granted * CHARGE_MICROS);
  assert_true(t.billed_micros <= t.reserved_micros);
  assert_int_equal(balance(f, "acme"), 0);
  check_journal(f);
}

/* Waits until the parent closes the barrier pipe, so the children start together. */
static void
barrier_wait(int fd)
{
  char c;
  while (read(fd, &c, 1) < 0 && errno == EINTR)
    ;
  close(fd);
}

#define PROCS 4

/* Lets the PROCS children waiting on gate go (closing its write end, which they read EOF
 * on) and reaps them: each must exit 0. */
static void
release_and_reap(int gate[2], const pid_t *pids)
{
  close(gate[0]);
  close(gate[1]);
  for (int i = 0; i < PROCS; i++) {
    int status = 0;
    assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
  }
}

/* Several processes (separate plugin instances and connections, as separate hosts) at once:
 * all initialise the same fresh database (one schema, migrated once), all settle the same
 * reservation (settled once, every one gets the same totals), and all race for reservations
 * on one balance (never overspent). */
void
test_pg_processes_share_one_ledger(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  unload(f);
  raw_reset();
  int gate[2];
  assert_int_equal(pipe(gate), 0);
  pid_t pids[PROCS];
  for (int i = 0; i < PROCS; i++) {
    pids[i] = fork();
    assert_true(pids[i] >= 0);
    if (pids[i] == 0) {
      close(gate[1]);
      barrier_wait(gate[0]);
      fixture_t child = *f;
      eph_error_t e = {0};
      char block[64];
      snprintf(block, sizeof block, "node_name = \"node-%d\";", i);
      if (load(&child, block, &e) < 0) {
        fprintf(stderr, "# child %d: %s\n", i, e.message);
        _exit(10);
      }
      _exit(0); /* no fini: as a crash right after start */
    }
  }
  release_and_reap(gate, pids);
  assert_int_equal(load(f, NULL, &err), 0);
  raw_t *db = raw_open(f);
  assert_int_equal(raw_int(db, "SELECT count(*) FROM schema_version", NULL), 1);
  assert_int_equal(raw_int(db, "SELECT version FROM schema_version", NULL), 2);
  /* One identity however many processes migrated at once: they share one ledger. */
  assert_int_equal(raw_int(db, "SELECT count(*) FROM identity", NULL), 1);
  raw_close(db);

  assert_int_equal(f->ops->credit(f->state, "acme", 1000, &err), 0);
  assert_int_equal(f->ops->reserve(f->state, "acme", "run_twice", 600, &err), 0);
  assert_int_equal(f->ops->charge(f->state, "run_twice", EPH_COST_COMPUTE, 250, "c", &err), 0);
  assert_int_equal(pipe(gate), 0);
  for (int i = 0; i < PROCS; i++) {
    pids[i] = fork();
    assert_true(pids[i] >= 0);
    if (pids[i] == 0) {
      close(gate[1]);
      fixture_t child = *f;
      eph_error_t e = {0};
      if (load(&child, NULL, &e) < 0)
        _exit(10);
      barrier_wait(gate[0]);
      eph_ledger_totals_t t = {0};
      if (child.ops->settle(child.state, "run_twice", &t, &e) < 0) {
        fprintf(stderr, "# child %d: %s\n", i, e.message);
        _exit(11);
      }
      if (t.billed_micros != 250 || t.released_micros != 350 || !t.settled)
        _exit(12);
      /* Then all race for reservations of 7 on what is left (400 + 350 released). */
      int granted = 0;
      for (int k = 0; k < 40; k++) {
        char run[64];
        snprintf(run, sizeof run, "run_p%d_%d", i, k);
        int r = child.ops->reserve(child.state, "acme", run, 7, &e);
        if (r == 0)
          granted++;
        else if (r != -EPH_E_INSUFFICIENT) {
          fprintf(stderr, "# child %d: %s\n", i, e.message);
          _exit(13);
        }
      }
      _exit(granted > 100 ? 14 : 0);
    }
  }
  release_and_reap(gate, pids);
  db = raw_open(f);
  assert_int_equal(raw_int(db,
                           "SELECT count(*) FROM entries WHERE kind = 'settle'"
                           " AND run_id = ?1",
                           "run_twice"),
                   1);
  int64_t granted =
      raw_int(db, "SELECT count(*) FROM reservations WHERE run_id LIKE 'run_p%'", NULL);
  raw_close(db);
  /* 1000 - 600 + 350 = 750 available: 107 reservations of 7, 1 micro left. */
  assert_int_equal(granted, 750 / 7);
  assert_int_equal(balance(f, "acme"), 750 - 7 * granted);
  check_journal(f);
}

/* Without a `database` of its own the plugin uses the core's (host->database) and the
 * core's node_name: a cluster names its database once. Its own key still wins. */
void
test_pg_core_database_by_default(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  unload(f);
  f->host.database = test_database();
  f->host.node_name = "node-core";
  assert_int_equal(load_as(f, NULL, false, &err), 0);
  assert_int_equal(f->ops->credit(f->state, "acme", 1000, &err), 0);
  assert_int_equal(f->ops->reserve(f->state, "acme", "run_core", 100, &err), 0);
  raw_t *db = raw_open(f);
  assert_int_equal(raw_int(db,
                           "SELECT count(*) FROM reservations WHERE run_id = ?1"
                           " AND node = 'node-core'",
                           "run_core"),
                   1);
  raw_close(db);
  unload(f);
  /* The block's own database and node_name override the core's (an unreachable core
   * database would fail the load if it were used). */
  char bad[256];
  snprintf(bad, sizeof bad, "postgresql:///nodb?host=%s/no-such-dir", f->dir);
  f->host.database = bad;
  assert_int_equal(load(f, "node_name = \"node-own\";", &err), 0);
  assert_int_equal(f->ops->reserve(f->state, "acme", "run_own", 100, &err), 0);
  db = raw_open(f);
  assert_int_equal(
      raw_int(db, "SELECT count(*) FROM reservations WHERE run_id = ?1 AND node = 'node-own'",
              "run_own"),
      1);
  raw_close(db);
  unload(f);
  /* The core's unreachable database is named as such. */
  err = (eph_error_t){0};
  assert_true(load_as(f, "connect_timeout_s = 1;", false, &err) < 0);
  print_message("# %s\n", err.message);
  assert_non_null(strstr(err.message, "the core's `database`: cannot connect"));
  config_destroy(&f->cfg);
  f->host.database = NULL;
  assert_int_equal(load(f, NULL, &err), 0);
}

/* settle_open settles only the open reservations of its own node: on a shared database
 * another node's open reservation is a live run. */
void
test_pg_settle_open_own_node_only(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  unload(f);
  assert_int_equal(load(f, "node_name = \"node-a\";", &err), 0);
  fixture_t b = *f;
  assert_int_equal(load(&b, "node_name = \"node-b\";", &err), 0);
  assert_int_equal(f->ops->credit(f->state, "acme", 1000, &err), 0);
  assert_int_equal(f->ops->reserve(f->state, "acme", "run_on_a", 100, &err), 0);
  assert_int_equal(b.ops->reserve(b.state, "acme", "run_on_b", 200, &err), 0);
  assert_int_equal(b.ops->charge(b.state, "run_on_b", EPH_COST_MODEL, 20, "m", &err), 0);
  assert_int_equal(b.ops->settle_open(b.state, &err), 1);
  eph_ledger_totals_t t = {0};
  assert_int_equal(f->ops->totals(f->state, "run_on_a", &t, &err), 0);
  assert_int_equal(t.settled, 0);
  assert_int_equal(b.ops->totals(b.state, "run_on_b", &t, &err), 0);
  assert_int_equal(t.settled, 1);
  assert_int_equal(t.released_micros, 180);
  /* Any node may settle a run by its id (a surviving node settling a lost host's run). */
  assert_int_equal(b.ops->settle(b.state, "run_on_a", &t, &err), 0);
  assert_int_equal(f->ops->settle_open(f->state, &err), 0);
  assert_int_equal(balance(f, "acme"), 1000 - 20);
  unload(&b);
  check_journal(f);
}
/* A client holding the reservation's row lock (a stuck session): the charge waits at most
 * statement_timeout_ms and fails with -EBUSY, recording nothing; once the lock goes the
 * next charge passes. */
void
test_pg_stuck_lock_times_out(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  unload(f);
  assert_int_equal(load(f, "statement_timeout_ms = 300;", &err), 0);
  assert_int_equal(f->ops->credit(f->state, "acme", 1000, &err), 0);
  assert_int_equal(f->ops->reserve(f->state, "acme", "run_stuck", 500, &err), 0);
  raw_t *db = raw_open(f);
  assert_int_equal(raw_exec(db,
                            "BEGIN; SELECT 1 FROM reservations WHERE run_id = 'run_stuck'"
                            " FOR UPDATE",
                            NULL, 0),
                   0);
  int64_t t0 = eph_now_ms();
  err = (eph_error_t){0};
  assert_int_equal(f->ops->charge(f->state, "run_stuck", EPH_COST_MODEL, 10, "m", &err), -EBUSY);
  int64_t waited = eph_now_ms() - t0;
  print_message("# after %" PRId64 " ms: %s\n", waited, err.message);
  assert_non_null(strstr(err.message, "57014"));
  assert_true(waited < 5000);
  assert_int_equal(raw_exec(db, "ROLLBACK", NULL, 0), 0);
  assert_int_equal(f->ops->charge(f->state, "run_stuck", EPH_COST_MODEL, 10, "m", &err), 0);
  assert_int_equal(raw_int(db, "SELECT count(*) FROM entries WHERE kind = 'charge'", NULL), 1);
  raw_close(db);
  check_journal(f);
}

/* The runtime role is not the schema's owner (the README's recommended set-up): the plugin
 * works with SELECT, INSERT and UPDATE grants only, and that role cannot move a balance
 * without a journal entry by any route: not directly, not from a trigger of its own (the
 * derived tables accept writes only from ledger.apply_entry running as their owner), not by
 * disabling the triggers, not by deleting. */
void
test_pg_runtime_role_cannot_bypass_journal(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  raw_t *owner = raw_open(f);
  assert_int_equal(raw_exec(owner,
                            "DROP ROLE IF EXISTS ledger_app; CREATE ROLE ledger_app LOGIN;"
                            " GRANT USAGE ON SCHEMA ledger TO ledger_app;"
                            " GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA ledger"
                            "   TO ledger_app;"
                            " GRANT USAGE ON ALL SEQUENCES IN SCHEMA ledger TO ledger_app",
                            NULL, 0),
                   0);
  raw_close(owner);
  unload(f);
  char app_db[1024], block[1200];
  snprintf(app_db, sizeof app_db, "postgresql:///ephemeral_test?host=%s&user=ledger_app",
           getenv("PGHOST"));
  snprintf(block, sizeof block, "database = \"%s\";", app_db);
  assert_int_equal(load_as(f, block, false, &err), 0);
  assert_int_equal(f->ops->credit(f->state, "acme", 1000, &err), 0);
  assert_int_equal(f->ops->reserve(f->state, "acme", "run_r", 400, &err), 0);
  assert_int_equal(f->ops->charge(f->state, "run_r", EPH_COST_WEB, 40, "w", &err), 0);
  assert_int_equal(f->ops->settle(f->state, "run_r", NULL, &err), 0);
  assert_int_equal(f->ops->probe(f->state, &err), 0);
  assert_int_equal(balance(f, "acme"), 960);

  PGconn *app = PQconnectdb(app_db);
  assert_int_equal(PQstatus(app), CONNECTION_OK);
  char msg[512];
  assert_int_equal(raw_exec(app,
                            "UPDATE ledger.organisations SET balance_micros = 10"
                            " WHERE org = 'acme'",
                            msg, sizeof msg),
                   1);
  assert_non_null(strstr(msg, "derived from the journal"));
  /* A trigger of its own one level down (pg_trigger_depth() = 2, as apply_entry's). */
  assert_int_equal(raw_exec(app,
                            "CREATE TEMP TABLE t(x int);"
                            " CREATE FUNCTION pg_temp.f() RETURNS trigger LANGUAGE plpgsql AS"
                            " $$BEGIN UPDATE ledger.organisations SET balance_micros = 1000000"
                            "  WHERE org = 'acme'; RETURN NULL; END$$;"
                            " CREATE TRIGGER t_f AFTER INSERT ON t FOR EACH ROW"
                            "  EXECUTE FUNCTION pg_temp.f()",
                            NULL, 0),
                   0);
  assert_int_equal(raw_exec(app, "INSERT INTO t VALUES (1)", msg, sizeof msg), 1);
  assert_non_null(strstr(msg, "derived from the journal"));
  assert_int_equal(
      raw_exec(app, "ALTER TABLE ledger.entries DISABLE TRIGGER USER", msg, sizeof msg), -1);
  assert_non_null(strstr(msg, "owner"));
  assert_int_equal(raw_exec(app, "DELETE FROM ledger.entries", msg, sizeof msg), -1);
  assert_non_null(strstr(msg, "permission denied"));
  PQfinish(app);
  assert_int_equal(balance(f, "acme"), 960);
  unload(f);
  assert_int_equal(load(f, NULL, &err), 0);
  check_journal(f);
}

/* red3: a `database` whose options (or the role's default, set by a DBA) put a schema
 * another database user can write before pg_catalog in search_path. That user's `=` on
 * text then resolves before the built-in one in every prepared statement (WHERE org = $1)
 * and runs as the ledger's role inside its transaction: here it appends a credit of
 * 1,000,000 to an organisation of its own, a journalled entry no operator made. The
 * plugin's session pins search_path to pg_catalog, so its statements never resolve a name
 * outside it (the old session did not: the forged credit appeared). */
void
test_pg_search_path_cannot_hijack_operators(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  raw_t *owner = raw_open(f);
  assert_int_equal(
      raw_exec(owner,
               "SET client_min_messages = warning; DROP SCHEMA IF EXISTS shady CASCADE;"
               " DROP ROLE IF EXISTS mallory_sp; CREATE ROLE mallory_sp;"
               " DROP ROLE IF EXISTS ledger_sp; CREATE ROLE ledger_sp LOGIN;"
               " GRANT USAGE ON SCHEMA ledger TO ledger_sp;"
               " GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA ledger TO ledger_sp;"
               " GRANT USAGE ON ALL SEQUENCES IN SCHEMA ledger TO ledger_sp;"
               " CREATE SCHEMA shady AUTHORIZATION mallory_sp;"
               " GRANT USAGE ON SCHEMA shady TO ledger_sp; SET ROLE mallory_sp;"
               " CREATE FUNCTION shady.texteq(a text, b text) RETURNS boolean"
               "  LANGUAGE plpgsql AS $f$ BEGIN"
               "  IF NOT EXISTS (SELECT 1 FROM ledger.organisations o"
               "                 WHERE o.org OPERATOR(pg_catalog.=) 'mallory') THEN"
               "    INSERT INTO ledger.organisations(org, created_us) VALUES ('mallory', 0);"
               "    INSERT INTO ledger.entries(t_us, org, node, kind, micros, memo)"
               "      VALUES (0, 'mallory', 'x', 'credit', 1000000, 'forged');"
               "  END IF;"
               "  RETURN a OPERATOR(pg_catalog.=) b; END $f$;"
               " CREATE OPERATOR shady.= (LEFTARG = text, RIGHTARG = text,"
               "  FUNCTION = shady.texteq); RESET ROLE",
               NULL, 0),
      0);
  unload(f);
  char block[1200];
  snprintf(block, sizeof block,
           "database = \"host=%s dbname=ephemeral_test user=ledger_sp"
           " options='-c search_path=shady,pg_catalog'\";",
           getenv("PGHOST"));
  assert_int_equal(load_as(f, block, false, &err), 0);
  assert_int_equal(f->ops->credit(f->state, "acme", 1000, &err), 0);
  assert_int_equal(f->ops->reserve(f->state, "acme", "run_sp", 400, &err), 0);
  assert_int_equal(f->ops->charge(f->state, "run_sp", EPH_COST_WEB, 40, "w", &err), 0);
  assert_int_equal(f->ops->settle(f->state, "run_sp", NULL, &err), 0);
  unload(f);
  int64_t forged =
      raw_int(owner, "SELECT count(*) FROM ledger.entries WHERE org = 'mallory'", NULL);
  assert_int_equal(raw_exec(owner,
                            "SET client_min_messages = warning; DROP SCHEMA shady CASCADE;"
                            " DROP OWNED BY ledger_sp; DROP ROLE ledger_sp;"
                            " DROP ROLE mallory_sp",
                            NULL, 0),
                   0);
  raw_close(owner);
  if (forged)
    print_message("# %" PRId64 " forged credit entries appeared\n", forged);
  assert_int_equal(forged, 0);
  assert_int_equal(load(f, NULL, &err), 0);
  assert_int_equal(balance(f, "acme"), 960);
  check_journal(f);
}
