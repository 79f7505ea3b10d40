/* Tests of the ledger plugins, one source for both: built as tests/test-ledger-sqlite
 * (plugins/ledger-sqlite on a real SQLite file in a fresh temporary directory) and, with
 * TEST_LEDGER_PG, as tests/test-ledger-postgres (plugins/ledger-postgres on the throw-away
 * PostgreSQL cluster of tests/with-pg, EPH_TEST_DATABASE; the schema `ledger` dropped before
 * each test). The plugin is loaded from the build tree through the core's loader. Each test
 * also reads the database with its own connection (sqlite3 or libpq) to check that the
 * journal (entries) and the derived tables agree, so a test cannot pass on the plugin's word
 * alone. Tests that only make sense for one engine (a damaged SQLite file; a PostgreSQL
 * server stopped mid-run, several processes on one database) are in that build only: the
 * PostgreSQL ones in tests/test-ledger-pg.c; the fixture both use is tests/ledger-fixture.c. */
#include "config.h"

#include "ledger-fixture.h"
#include "sqlite-damage.h"

/* ---------------------------------------------------------------- tests */

/* The product page's run: $0.04 reserved, model $0.00033 + compute $0.0032 billed,
 * $0.03647 released. */
static void
test_reserve_charge_settle_sums(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  const char *run = "run_de9af30ebaaa50ab76819bb536239c61";
  assert_int_equal(f->ops->credit(f->state, "acme", 1000000, &err), 0);
  assert_int_equal(balance(f, "acme"), 1000000);
  assert_int_equal(f->ops->reserve(f->state, "acme", run, 40000, &err), 0);
  assert_int_equal(balance(f, "acme"), 960000);
  assert_int_equal(f->ops->charge(f->state, run, EPH_COST_MODEL, 110, "call 1", &err), 0);
  assert_int_equal(f->ops->charge(f->state, run, EPH_COST_MODEL, 220, "call 2+3", &err), 0);
  assert_int_equal(f->ops->charge(f->state, run, EPH_COST_COMPUTE, 3200, "13.4 s", &err), 0);
  assert_int_equal(f->ops->charge(f->state, run, EPH_COST_WEB, 0, "no web", &err), 0);
  /* Charges stay inside the reservation: the balance does not move until settle. */
  assert_int_equal(balance(f, "acme"), 960000);

  eph_ledger_totals_t t = {0};
  assert_int_equal(f->ops->totals(f->state, run, &t, &err), 0);
  assert_int_equal(t.reserved_micros, 40000);
  assert_int_equal(t.billed_micros, 3530);
  assert_int_equal(t.settled, 0);
  assert_int_equal(t.released_micros, 0);

  memset(&t, 0, sizeof t);
  assert_int_equal(f->ops->settle(f->state, run, &t, &err), 0);
  assert_int_equal(t.billed_micros, 3530);
  assert_int_equal(t.model_micros, 330);
  assert_int_equal(t.web_micros, 0);
  assert_int_equal(t.compute_micros, 3200);
  assert_int_equal(t.released_micros, 36470);
  assert_int_equal(t.billed_micros + t.released_micros, t.reserved_micros);
  assert_int_equal(t.settled, 1);
  assert_int_equal(balance(f, "acme"), 1000000 - 3530);

  /* A charge after settle is refused and changes nothing. */
  assert_int_equal(f->ops->charge(f->state, run, EPH_COST_MODEL, 1, "late", &err), -EALREADY);
  assert_int_equal(f->ops->totals(f->state, run, &t, &err), 0);
  assert_int_equal(t.billed_micros, 3530);
  check_journal(f);
}

static void
test_charge_over_cap_refused(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  assert_int_equal(f->ops->credit(f->state, "acme", 5000, &err), 0);
  assert_int_equal(f->ops->reserve(f->state, "acme", "run_cap", 1000, &err), 0);
  assert_int_equal(f->ops->charge(f->state, "run_cap", EPH_COST_MODEL, 600, "a", &err), 0);
  err = (eph_error_t){0};
  assert_int_equal(f->ops->charge(f->state, "run_cap", EPH_COST_WEB, 401, "b", &err),
                   -EPH_E_BUDGET);
  assert_int_equal(err.code, EPH_E_BUDGET);
  assert_non_null(strstr(err.message, "run_cap"));
  eph_ledger_totals_t t = {0};
  assert_int_equal(f->ops->totals(f->state, "run_cap", &t, &err), 0);
  assert_int_equal(t.billed_micros, 600);
  assert_int_equal(t.web_micros, 0);
  /* Exactly up to the cap is allowed, one more micro is not. */
  assert_int_equal(f->ops->charge(f->state, "run_cap", EPH_COST_WEB, 400, "c", &err), 0);
  assert_int_equal(f->ops->charge(f->state, "run_cap", EPH_COST_COMPUTE, 1, "d", &err),
                   -EPH_E_BUDGET);
  /* INT64_MAX must not wrap around the check. */
  assert_int_equal(f->ops->charge(f->state, "run_cap", EPH_COST_COMPUTE, INT64_MAX, "e", &err),
                   -EPH_E_BUDGET);
  assert_int_equal(f->ops->charge(f->state, "run_cap", EPH_COST_COMPUTE, -5, "f", &err), -EINVAL);
  assert_int_equal(f->ops->charge(f->state, "run_nope", EPH_COST_COMPUTE, 1, "g", &err), -ENOENT);
  assert_int_equal(f->ops->settle(f->state, "run_cap", &t, &err), 0);
  assert_int_equal(t.billed_micros, 1000);
  assert_int_equal(t.released_micros, 0);

  raw_t *db = raw_open(f);
  assert_int_equal(
      raw_int(db, "SELECT count(*) FROM entries WHERE kind='charge' AND run_id=?1", "run_cap"), 2);
  raw_close(db);
  check_journal(f);
}

/* The same bad input gets the same error from both ledgers (sdk/support/ledger_common.c):
 * a name that is not UTF-8 is refused naming the field (ledger-sqlite used to store it), a
 * memo's invalid bytes are stored as '?' and a long memo is cut at a character boundary
 * (ledger-sqlite used to store the bytes as given). */
static void
test_same_errors_for_bad_input(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  assert_int_equal(f->ops->credit(f->state, "acme", 5000, &err), 0);
  assert_int_equal(f->ops->reserve(f->state, "acme", "run_bad\xff", 100, &err), -EINVAL);
  assert_string_equal(err.message, "run_id: not valid UTF-8");
  err = (eph_error_t){0};
  assert_int_equal(f->ops->credit(f->state, "ac\xc0\xafme", 5, &err), -EINVAL);
  assert_string_equal(err.message,
                      "organisation: byte 2 (0xc0) is not a letter, a digit, '_', '.' or '-'");
  err = (eph_error_t){0};
  assert_int_equal(f->ops->charge(f->state, "run_\xed\xa0\x80", EPH_COST_WEB, 1, "m", &err),
                   -EINVAL);
  assert_string_equal(err.message, "run_id: not valid UTF-8");
  err = (eph_error_t){0};
  assert_int_equal(f->ops->totals(f->state, "run_absent", &(eph_ledger_totals_t){0}, &err),
                   -ENOENT);
  assert_string_equal(err.message, "totals: run run_absent has no reservation");
  /* Control characters in a name (an escape sequence that would rewrite what an operator's
   * terminal shows, a newline that splits a log line) are refused: C0, DEL and C1 (CSI). */
  err = (eph_error_t){0};
  assert_int_equal(f->ops->credit(f->state, "acme\x1b[2J", 5, &err), -EINVAL);
  assert_string_equal(err.message,
                      "organisation: byte 4 (0x1b) is not a letter, a digit, '_', '.' or '-'");
  err = (eph_error_t){0};
  assert_int_equal(f->ops->reserve(f->state, "acme", "run_\nx", 100, &err), -EINVAL);
  assert_string_equal(err.message, "run_id: contains a control character (byte 4)");
  err = (eph_error_t){0};
  assert_int_equal(f->ops->credit(f->state, "ac\xc2\x9bme", 5, &err), -EINVAL);
  assert_string_equal(err.message,
                      "organisation: byte 2 (0xc2) is not a letter, a digit, '_', '.' or '-'");
  err = (eph_error_t){0};
  assert_int_equal(f->ops->credit(f->state, "acme\x7f", 5, &err), -EINVAL);

  assert_int_equal(f->ops->reserve(f->state, "acme", "run_memo", 100, &err), 0);
  assert_int_equal(f->ops->charge(f->state, "run_memo", EPH_COST_WEB, 1,
                                  "a\xff"
                                  "b\xe2\x82",
                                  &err),
                   0);
  /* A memo's controls: ESC and C1 CSI become '?', a newline or tab a space. */
  assert_int_equal(
      f->ops->charge(f->state, "run_memo", EPH_COST_WEB, 1, "ls -l\n\x1b[2J\xc2\x9bx\ty", &err), 0);
  /* 255 ASCII bytes then a 3-byte character: the character does not fit in 256 bytes. */
  char long_memo[300];
  memset(long_memo, 'x', 255);
  snprintf(long_memo + 255, sizeof long_memo - 255, "\xe2\x82\xac tail");
  assert_int_equal(f->ops->charge(f->state, "run_memo", EPH_COST_WEB, 1, long_memo, &err), 0);
  raw_t *db = raw_open(f);
  assert_int_equal(raw_int(db, "SELECT count(*) FROM entries WHERE memo = ?1", "a?b??"), 1);
  assert_int_equal(raw_int(db, "SELECT count(*) FROM entries WHERE memo = ?1", "ls -l ?[2J?x y"),
                   1);
  assert_int_equal(raw_int(db,
                           "SELECT count(*) FROM entries WHERE kind = 'charge'"
                           " AND length(memo) = 255",
                           NULL),
                   1);
  assert_int_equal(
      raw_int(db, "SELECT count(*) FROM reservations WHERE run_id LIKE 'run_bad%'", NULL), 0);
  raw_close(db);
  check_journal(f);
}

/* An organisation's name follows one rule everywhere (sdk/support/org_name.h): the ledgers
 * refuse, for credit, balance and reserve alike, every name the store and the admin API
 * refuse, and write nothing (before, they took any UTF-8 name up to 128 bytes, so a plugin
 * or API path could credit "a b" or "a/b", which no run can be billed to). */
static void
test_org_names_one_rule(void **st)
{
  fixture_t *f = *st;
  char long65[66], long64[65];
  memset(long65, 'a', 65);
  long65[65] = '\0';
  memset(long64, 'z', 64);
  long64[64] = '\0';
  static const struct {
    const char *name, *message;
  } bad[] = {
      {"a b", "organisation: byte 1 (' ') is not a letter, a digit, '_', '.' or '-'"},
      {"a/b", "organisation: byte 1 ('/') is not a letter, a digit, '_', '.' or '-'"},
      {"", "organisation: empty"},
      {"\xc3\xa9", "organisation: byte 0 (0xc3) is not a letter, a digit, '_', '.' or '-'"},
      {"acme'", "organisation: byte 4 (0x27) is not a letter, a digit, '_', '.' or '-'"},
      {NULL, "organisation: longer than 64 bytes"}, /* long65 */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *name = bad[i].name ? bad[i].name : long65;
    eph_error_t err = {0};
    int64_t b = -1;
    print_message("# org '%s'\n", bad[i].name ? name : "<65 bytes>");
    assert_int_equal(f->ops->credit(f->state, name, 1000, &err), -EINVAL);
    assert_string_equal(err.message, bad[i].message);
    err = (eph_error_t){0};
    assert_int_equal(f->ops->balance(f->state, name, &b, &err), -EINVAL);
    assert_string_equal(err.message, bad[i].message);
    assert_int_equal(b, -1);
    err = (eph_error_t){0};
    assert_int_equal(f->ops->reserve(f->state, name, "run_badorg", 10, &err), -EINVAL);
    assert_string_equal(err.message, bad[i].message);
  }
  raw_t *db = raw_open(f);
  assert_int_equal(raw_int(db, "SELECT count(*) FROM entries", NULL), 0);
  raw_close(db);

  /* The longest name and every character the rule allows are taken. */
  eph_error_t err = {0};
  assert_int_equal(f->ops->credit(f->state, long64, 1000, &err), 0);
  assert_int_equal(balance(f, long64), 1000);
  assert_int_equal(f->ops->reserve(f->state, long64, "run_org64", 10, &err), 0);
  assert_int_equal(balance(f, long64), 990);
  assert_int_equal(f->ops->credit(f->state, "Az09_.-", 5, &err), 0);
  assert_int_equal(balance(f, "Az09_.-"), 5);
  check_journal(f);
}

static void
test_insufficient_balance(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  assert_int_equal(f->ops->credit(f->state, "poor", 100, &err), 0);
  assert_int_equal(f->ops->reserve(f->state, "poor", "run_1", 101, &err), -EPH_E_INSUFFICIENT);
  assert_int_equal(err.code, EPH_E_INSUFFICIENT);
  assert_int_equal(balance(f, "poor"), 100);
  eph_ledger_totals_t t;
  assert_int_equal(f->ops->totals(f->state, "run_1", &t, &err), -ENOENT);
  assert_int_equal(f->ops->reserve(f->state, "poor", "run_1", 100, &err), 0);
  assert_int_equal(balance(f, "poor"), 0);
  assert_int_equal(f->ops->reserve(f->state, "poor", "run_2", 1, &err), -EPH_E_INSUFFICIENT);
  assert_int_equal(f->ops->reserve(f->state, "poor", "run_1", 1, &err), -EEXIST);
  assert_int_equal(f->ops->reserve(f->state, "nobody", "run_3", 1, &err), -EPH_E_INSUFFICIENT);
  assert_int_equal(balance(f, "nobody"), 0);
  assert_int_equal(f->ops->reserve(f->state, "poor", "run_4", 0, &err), -EINVAL);
  assert_int_equal(f->ops->credit(f->state, "poor", -1, &err), -EINVAL);
  /* Releasing the reservation makes the money available again. */
  assert_int_equal(f->ops->charge(f->state, "run_1", EPH_COST_MODEL, 30, "m", &err), 0);
  assert_int_equal(f->ops->settle(f->state, "run_1", &t, &err), 0);
  assert_int_equal(balance(f, "poor"), 70);
  assert_int_equal(f->ops->reserve(f->state, "poor", "run_5", 70, &err), 0);
  /* Credits cannot overflow. */
  assert_int_equal(f->ops->credit(f->state, "rich", INT64_MAX, &err), 0);
  assert_int_equal(f->ops->credit(f->state, "rich", 1, &err), -EOVERFLOW);
  assert_int_equal(balance(f, "rich"), INT64_MAX);
  check_journal(f);
}

#define THREADS 8
#define RESERVES_PER_THREAD 50
#define RESERVE_MICROS 7
#define POOL_MICROS 500

typedef struct worker_arg {
  fixture_t *f;
  int index;
  int granted;
  int refused;
  int other;
} worker_arg_t;

static void *
reserve_worker(void *p)
{
  worker_arg_t *a = p;
  for (int i = 0; i < RESERVES_PER_THREAD; i++) {
    char run[64];
    snprintf(run, sizeof run, "run_t%d_%d", a->index, i);
    eph_error_t err = {0};
    int r = a->f->ops->reserve(a->f->state, "shared", run, RESERVE_MICROS, &err);
    if (r == 0) {
      a->granted++;
      /* Charge something and settle half of them to interleave every kind of write. */
      if (a->f->ops->charge(a->f->state, run, EPH_COST_COMPUTE, 2, "t", &err) != 0) {
        print_message("# charge %s: %s\n", run, err.message);
        a->other++;
      }
      if (i % 2 == 0 && a->f->ops->settle(a->f->state, run, NULL, &err) != 0) {
        print_message("# settle %s: %s\n", run, err.message);
        a->other++;
      }
    } else if (r == -EPH_E_INSUFFICIENT) {
      a->refused++;
    } else {
      print_message("# reserve %s: %s\n", run, err.message);
      a->other++;
    }
  }
  return NULL;
}

static void
test_concurrent_reserves_never_overspend(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  assert_int_equal(f->ops->credit(f->state, "shared", POOL_MICROS, &err), 0);
  pthread_t th[THREADS];
  worker_arg_t args[THREADS];
  for (int i = 0; i < THREADS; i++) {
    args[i] = (worker_arg_t){.f = f, .index = i};
    assert_int_equal(pthread_create(&th[i], NULL, reserve_worker, &args[i]), 0);
  }
  int granted = 0, refused = 0, other = 0;
  for (int i = 0; i < THREADS; i++) {
    pthread_join(th[i], NULL);
    granted += args[i].granted;
    refused += args[i].refused;
    other += args[i].other;
  }
  assert_int_equal(other, 0);
  assert_int_equal(granted + refused, THREADS * RESERVES_PER_THREAD);
  /* Settled runs give back 5 of 7 micros, so more than 500/7 may be granted; what must hold
   * is that everything granted was covered: the balance is never negative and it equals
   * credits - open reservations - billed. */
  raw_t *db = raw_open(f);
  int64_t open_reserved = raw_int(
      db, "SELECT coalesce(sum(reserved_micros),0) FROM reservations WHERE settled=0", NULL);
  int64_t billed_settled =
      raw_int(db, "SELECT coalesce(sum(billed_micros),0) FROM reservations WHERE settled=1", NULL);
  int64_t n = raw_int(db, "SELECT count(*) FROM reservations", NULL);
  raw_close(db);
  assert_int_equal(n, granted);
  int64_t b = balance(f, "shared");
  assert_true(b >= 0);
  assert_true(b < RESERVE_MICROS); /* the pool was drained: refusals were real */
  assert_int_equal(b, POOL_MICROS - open_reserved - billed_settled);
  assert_true(refused > 0);
  check_journal(f);
}

static void
test_settle_idempotent(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  assert_int_equal(f->ops->credit(f->state, "acme", 1000, &err), 0);
  assert_int_equal(f->ops->reserve(f->state, "acme", "run_i", 500, &err), 0);
  assert_int_equal(f->ops->charge(f->state, "run_i", EPH_COST_MODEL, 123, "m", &err), 0);
  eph_ledger_totals_t t1 = {0}, t2 = {0};
  assert_int_equal(f->ops->settle(f->state, "run_i", &t1, &err), 0);
  assert_int_equal(f->ops->settle(f->state, "run_i", &t2, &err), 0);
  assert_memory_equal(&t1, &t2, sizeof t1);
  assert_int_equal(t1.released_micros, 377);
  assert_int_equal(balance(f, "acme"), 877);
  assert_int_equal(f->ops->settle(f->state, "run_unknown", &t2, &err), -ENOENT);
  raw_t *db = raw_open(f);
  assert_int_equal(raw_int(db, "SELECT count(*) FROM entries WHERE kind='settle'", NULL), 1);
  raw_close(db);
  assert_int_equal(f->ops->settle_open(f->state, &err), 0);
  check_journal(f);
}

/* A process reserves and charges, then dies without settling (_exit, no fini). The next
 * process settles what it left open: the charges stay billed, the rest is released. */
static void
test_settle_open_after_crash(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  assert_int_equal(f->ops->credit(f->state, "acme", 100000, &err), 0);
  assert_int_equal(f->ops->reserve(f->state, "acme", "run_done", 1000, &err), 0);
  assert_int_equal(f->ops->settle(f->state, "run_done", NULL, &err), 0);
  unload(f);

  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    fixture_t child = *f;
    eph_error_t e = {0};
    if (load(&child, NULL, &e) < 0)
      _exit(10);
    if (child.ops->reserve(child.state, "acme", "run_crash", 40000, &e) < 0 ||
        child.ops->charge(child.state, "run_crash", EPH_COST_MODEL, 330, "m", &e) < 0 ||
        child.ops->charge(child.state, "run_crash", EPH_COST_COMPUTE, 3200, "c", &e) < 0 ||
        child.ops->reserve(child.state, "acme", "run_crash2", 5000, &e) < 0)
      _exit(11);
    _exit(0); /* no settle, no fini, no sqlite3_close: as a crash */
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);

  assert_int_equal(load(f, NULL, &err), 0);
  assert_int_equal(balance(f, "acme"), 100000 - 40000 - 5000);
  assert_int_equal(f->ops->settle_open(f->state, &err), 2);
  eph_ledger_totals_t t = {0};
  assert_int_equal(f->ops->totals(f->state, "run_crash", &t, &err), 0);
  assert_int_equal(t.settled, 1);
  assert_int_equal(t.billed_micros, 3530);
  assert_int_equal(t.compute_micros, 3200);
  assert_int_equal(t.released_micros, 36470);
  assert_int_equal(f->ops->totals(f->state, "run_crash2", &t, &err), 0);
  assert_int_equal(t.billed_micros, 0);
  assert_int_equal(t.released_micros, 5000);
  assert_int_equal(balance(f, "acme"), 100000 - 3530);
  /* Running it again settles nothing and charges nothing twice. */
  assert_int_equal(f->ops->settle_open(f->state, &err), 0);
  assert_int_equal(balance(f, "acme"), 100000 - 3530);
  check_journal(f);
}

static void
test_append_only_enforced(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  assert_int_equal(f->ops->credit(f->state, "acme", 1000, &err), 0);
  assert_int_equal(f->ops->reserve(f->state, "acme", "run_a", 100, &err), 0);
  assert_int_equal(f->ops->charge(f->state, "run_a", EPH_COST_MODEL, 40, "m", &err), 0);

  raw_t *db = raw_open(f);
  char msg[512];
  assert_int_equal(
      raw_exec(db, "UPDATE entries SET micros = 1 WHERE kind = 'charge'", msg, sizeof msg), 1);
  assert_non_null(strstr(msg, "append-only"));
  assert_int_equal(raw_exec(db, "DELETE FROM entries", NULL, 0), 1);
  /* The schema itself refuses what the C code would: a charge past the reservation, a
   * reservation past the balance, a settle that does not balance. */
  assert_int_equal(raw_exec(db,
                            ENTRY_INSERT("t_us, org, run_id, kind, category, micros",
                                         "0, 'acme', 'run_a', 'charge', 'web', 61"),
                            NULL, 0),
                   1);
  assert_int_equal(raw_exec(db,
                            ENTRY_INSERT("t_us, org, run_id, kind, micros",
                                         "0, 'acme', 'run_b', 'reserve', 901"),
                            NULL, 0),
                   1);
  assert_int_equal(
      raw_exec(db,
               ENTRY_INSERT("t_us, org, run_id, kind, micros", "0, 'acme', 'run_a', 'settle', 100"),
               NULL, 0),
      1);
#if TEST_LEDGER_PG
  /* PostgreSQL also refuses TRUNCATE of the journal, and any write to the derived tables
   * that does not come from a journal entry: a client with the ledger's own role cannot
   * move a balance or a reservation without leaving an entry. */
  assert_int_equal(raw_exec(db, "TRUNCATE entries", msg, sizeof msg), 1);
  assert_non_null(strstr(msg, "append-only"));
  assert_int_equal(
      raw_exec(db, "UPDATE organisations SET balance_micros = 1000000", msg, sizeof msg), 1);
  assert_non_null(strstr(msg, "derived from the journal"));
  assert_int_equal(
      raw_exec(db, "UPDATE reservations SET billed_micros = 0, model_micros = 0", NULL, 0), 1);
  assert_int_equal(raw_exec(db, "DELETE FROM reservations", NULL, 0), 1);
  assert_int_equal(raw_exec(db, "TRUNCATE organisations CASCADE", NULL, 0), 1);
  assert_int_equal(raw_exec(db,
                            "INSERT INTO organisations(org, credited_micros, balance_micros,"
                            " created_us) VALUES ('evil', 5, 5, 0)",
                            NULL, 0),
                   1);
  assert_int_equal(raw_exec(db,
                            "INSERT INTO reservations(run_id, org, node, reserved_micros)"
                            " VALUES ('run_evil', 'acme', 'n', 1)",
                            NULL, 0),
                   1);
  assert_int_equal(raw_int(db, "SELECT balance_micros FROM organisations WHERE org = ?1", "acme"),
                   900);
#endif
  assert_int_equal(raw_int(db, "SELECT count(*) FROM entries", NULL), 3);
#if !TEST_LEDGER_PG
  sqlite3_stmt *s = NULL;
  assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &s, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  assert_string_equal((const char *)sqlite3_column_text(s, 0), "wal");
  sqlite3_finalize(s);
#endif
  raw_close(db);

  eph_ledger_totals_t t = {0};
  assert_int_equal(f->ops->totals(f->state, "run_a", &t, &err), 0);
  assert_int_equal(t.billed_micros, 40);
  check_journal(f);
}

#if !TEST_LEDGER_PG
/* A damaged file is refused at init naming it (before: the plugin loaded and every
 * operation on the damaged table failed later); a sound one answers the write probe. */
static void
test_damaged_file_refused(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  assert_int_equal(f->ops->credit(f->state, "acme", 1000, &err), 0);
  assert_int_equal(f->ops->reserve(f->state, "acme", "run_a", 100, &err), 0);
  assert_true(EPH_OPS_HAS(f->ops, eph_ledger_ops_t, probe));
  assert_int_equal(f->ops->probe(f->state, &err), 0);
  unload(f);
  /* ledger-sqlite skips the checkpoint at close (its commits are fsync()ed): the WAL goes
   * into the file first. */
  damage_root_page(f->db_path, "reservations", true);
  err = (eph_error_t){0};
  assert_true(load(f, NULL, &err) < 0);
  assert_non_null(strstr(err.message, f->db_path));
  assert_non_null(strstr(err.message, "damaged"));
  config_destroy(&f->cfg);
}

static void
test_config_keys(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  unload(f);
  assert_true(load(f, "synchronous = \"sometimes\";", &err) < 0);
  assert_non_null(strstr(err.message, "synchronous"));
  unload(f);
  err = (eph_error_t){0};
  assert_true(load(f, "busy_timeout_ms = \"soon\";", &err) < 0);
  assert_non_null(strstr(err.message, "busy_timeout_ms"));
  unload(f);
  /* A relative path lands in the state directory; synchronous=normal is accepted. */
  assert_int_equal(load(f, "path = \"other.sqlite\"; synchronous = \"normal\";", &err), 0);
  assert_int_equal(f->ops->credit(f->state, "acme", 5, &err), 0);
  char other[192];
  snprintf(other, sizeof other, "%s/other.sqlite", f->dir);
  assert_int_equal(access(other, F_OK), 0);
}

#endif /* !TEST_LEDGER_PG */

/* open_reservations' callback: "run_id:micros " per reservation, in order. */
static void
open_collect(void *ctx, const eph_ledger_open_t *r)
{
  char *line = ctx;
  size_t used = strlen(line);
  snprintf(line + used, 512 - used, "%s:%lld ", r->run_id, (long long)r->reserved_micros);
}

/* The ledger's identity: a UUID made with its storage, the same after a reload (another
 * process on the same file or database answers the same), and the open reservations a
 * cluster node sweeps for orphans: only those not settled, open for longer than the age
 * given (in the ledger's own clock), oldest first, at most `limit`. */
static void
test_identity_and_open_reservations(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  char id[EPH_LEDGER_IDENTITY_BYTES] = "", again[EPH_LEDGER_IDENTITY_BYTES] = "";
  assert_non_null(f->ops->identity);
  assert_int_equal(f->ops->identity(f->state, id, sizeof id, &err), 0);
  assert_int_equal(strlen(id), 36);
  assert_int_equal(strspn(id, "0123456789abcdef-"), 36);
  assert_true(id[8] == '-' && id[13] == '-' && id[14] == '4' && id[18] == '-' && id[23] == '-');
  assert_true(f->ops->identity(f->state, again, 8, &err) < 0);
  unload(f);
  assert_int_equal(load(f, NULL, &err), 0);
  assert_int_equal(f->ops->identity(f->state, again, sizeof again, &err), 0);
  assert_string_equal(id, again);

  assert_int_equal(f->ops->credit(f->state, "acme", 1000, &err), 0);
  assert_int_equal(f->ops->reserve(f->state, "acme", "run_old1", 100, &err), 0);
  assert_int_equal(f->ops->reserve(f->state, "acme", "run_old2", 200, &err), 0);
  assert_int_equal(f->ops->reserve(f->state, "acme", "run_done", 300, &err), 0);
  assert_int_equal(f->ops->settle(f->state, "run_done", NULL, &err), 0);
  /* The age is the ledger's to measure (its own clock, which stamped them): none of these
   * has been open for an hour; all have been open for more than 0 us (run_old2's reserve
   * was two committed transactions ago); a negative age is refused. */
  char line[512] = "";
  assert_int_equal(f->ops->open_reservations(f->state, 3600000000LL, 10, open_collect, line, &err),
                   0);
  assert_string_equal(line, "");
  assert_int_equal(f->ops->open_reservations(f->state, 0, 10, open_collect, line, &err), 2);
  assert_string_equal(line, "run_old1:100 run_old2:200 ");
  line[0] = '\0';
  assert_int_equal(f->ops->open_reservations(f->state, 0, 1, open_collect, line, &err), 1);
  assert_string_equal(line, "run_old1:100 ");
  assert_true(f->ops->open_reservations(f->state, -1, 10, open_collect, line, &err) < 0);
  assert_true(f->ops->open_reservations(f->state, 0, 0, open_collect, line, &err) < 0);
  check_journal(f);
}

/* A ledger made before identities existed (ledger-postgres schema 1, ledger-sqlite 2) gets
 * one at its next start, its money untouched; the identity cannot be changed afterwards. */
static void
test_identity_added_by_upgrade(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  assert_int_equal(f->ops->credit(f->state, "acme", 1234, &err), 0);
  unload(f);
  raw_t *db = raw_open(f);
#if TEST_LEDGER_PG
  assert_int_equal(
      raw_exec(db, "DROP TABLE identity; UPDATE schema_version SET version = 1", NULL, 0), 0);
#else
  assert_int_equal(raw_exec(db, "DROP TABLE identity; PRAGMA user_version = 2", NULL, 0), 0);
#endif
  raw_close(db);
  assert_int_equal(load(f, NULL, &err), 0);
  char id[EPH_LEDGER_IDENTITY_BYTES] = "";
  assert_int_equal(f->ops->identity(f->state, id, sizeof id, &err), 0);
  assert_int_equal(strlen(id), 36);
  assert_int_equal(balance(f, "acme"), 1234);
  db = raw_open(f);
#if TEST_LEDGER_PG
  assert_int_equal(raw_int(db, "SELECT version FROM schema_version", NULL), 2);
#else
  assert_int_equal(raw_int(db, "PRAGMA user_version", NULL), 3);
#endif
  assert_int_equal(raw_int(db, "SELECT count(*) FROM identity", NULL), 1);
  /* Fixed once made: a second ledger cannot take this one's identity, nor this one lose it. */
  assert_int_equal(raw_exec(db, "UPDATE identity SET created_us = 0", NULL, 0), 1);
  assert_int_equal(raw_exec(db, "DELETE FROM identity", NULL, 0), 1);
  raw_close(db);
  check_journal(f);
}

int
main(void)
{
#if TEST_LEDGER_PG
  test_database(); /* skips the whole program (a TAP skip plan) without a database */
#endif
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_reserve_charge_settle_sums, setup, teardown),
    cmocka_unit_test_setup_teardown(test_charge_over_cap_refused, setup, teardown),
    cmocka_unit_test_setup_teardown(test_insufficient_balance, setup, teardown),
    cmocka_unit_test_setup_teardown(test_same_errors_for_bad_input, setup, teardown),
    cmocka_unit_test_setup_teardown(test_org_names_one_rule, setup, teardown),
    cmocka_unit_test_setup_teardown(test_concurrent_reserves_never_overspend, setup, teardown),
    cmocka_unit_test_setup_teardown(test_settle_idempotent, setup, teardown),
    cmocka_unit_test_setup_teardown(test_settle_open_after_crash, setup, teardown),
    cmocka_unit_test_setup_teardown(test_append_only_enforced, setup, teardown),
    cmocka_unit_test_setup_teardown(test_identity_and_open_reservations, setup, teardown),
    cmocka_unit_test_setup_teardown(test_identity_added_by_upgrade, setup, teardown),
#if TEST_LEDGER_PG
    cmocka_unit_test_setup_teardown(test_pg_core_database_by_default, setup, teardown),
    cmocka_unit_test_setup_teardown(test_pg_config_and_unreachable, setup, teardown),
    cmocka_unit_test_setup_teardown(test_pg_server_stopped_mid_run, setup, teardown),
    cmocka_unit_test_setup_teardown(test_pg_concurrent_charges_one_reservation, setup, teardown),
    cmocka_unit_test_setup_teardown(test_pg_processes_share_one_ledger, setup, teardown),
    cmocka_unit_test_setup_teardown(test_pg_settle_open_own_node_only, setup, teardown),
    cmocka_unit_test_setup_teardown(test_pg_runtime_role_cannot_bypass_journal, setup, teardown),
    cmocka_unit_test_setup_teardown(test_pg_stuck_lock_times_out, setup, teardown),
    cmocka_unit_test_setup_teardown(test_pg_search_path_cannot_hijack_operators, setup, teardown),
#else
    cmocka_unit_test_setup_teardown(test_config_keys, setup, teardown),
    cmocka_unit_test_setup_teardown(test_damaged_file_refused, setup, teardown),
#endif
  };
  return cmocka_run_group_tests_name(PLUGIN_NAME, tests, NULL, NULL);
}
