/*
 * ledger-sqlite: the money. Implements eph_ledger_ops_t over one SQLite file.
 *
 * Model. `entries` is the journal: an append-only list of credit, reserve, charge and settle
 * rows (UPDATE and DELETE are refused by triggers). Two small tables are derived from it by
 * AFTER INSERT triggers in the same statement, so no code path can append an entry without
 * updating them, and their CHECK constraints are the last line of defence for the
 * invariants:
 *   organisations.balance_micros >= 0                    (a balance never goes negative)
 *   reservations.billed_micros <= reserved_micros        (a charge never passes the cap)
 *   settled => billed_micros + released_micros = reserved_micros
 *   billed_micros = model_micros + web_micros + compute_micros
 *   every amount is an SQLite integer (SQLite turns an overflowing integer sum into a REAL;
 *   typeof() checks refuse that, and the C code checks for overflow first anyway).
 * The C code checks the same rules first so the caller gets the documented error codes
 * (-EPH_E_BUDGET, -EPH_E_INSUFFICIENT, ...); the constraints catch anything that slips by.
 *
 * Available balance = credits - reservations + releases. Charges move money inside a
 * reservation and do not change the balance: the whole reservation was taken at reserve.
 *
 * Concurrency. Each operation is one BEGIN IMMEDIATE transaction, so the balance check and
 * the reservation happen under SQLite's write lock: two processes sharing the file cannot
 * both pass the check. Inside one process all threads share one connection behind a mutex:
 * SQLite admits one writer at a time anyway, and a mutex hands the lock over at once, where
 * per-thread connections would contend on the WAL write lock and wait in SQLite's busy
 * handler, which sleeps in coarse steps. Every operation is a few prepared statements
 * (tens of microseconds), so a read-only path on its own connection would buy nothing.
 * busy_timeout still covers a second process (CLI + daemon) on the same file.
 *
 * Durability. journal_mode=WAL. Every commit is written to the WAL before the call returns,
 * so a crash of our process (kill -9) loses nothing: the record and the ledger agree after
 * it. With synchronous=full (the default) credits, reservations and settlements are
 * fsync()ed at their commit and survive power loss. Charges are group-committed: a charge
 * commits without fsync while the WAL was fsync()ed less than CHARGE_SYNC_US ago, else it
 * fsyncs (which makes every earlier charge durable too: one WAL, synced in order). A power
 * cut may so roll back at most the last second of charges of live runs, less than the
 * compute meter's interval (compute_meter_ms, 2 s) the documentation already allows to be
 * lost; never a reservation or a settlement. Per-call charges went from one fsync each
 * (~1.7 ms) to tens of microseconds. synchronous=normal (configurable) fsyncs only at
 * checkpoints: the last commits of any kind before an OS crash or power cut may roll back.
 * See bench/ledger-bench.c for the figures.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#include <sqlite3.h>

#include <ephemeral/plugin.h>

#include "support/cleanup.h"
#include "support/ledger_common.h"
#include "support/sqlite.h"

#define SCHEMA_VERSION 3

static const char schema_v1[] =
    "CREATE TABLE organisations ("
    "  org TEXT PRIMARY KEY NOT NULL,"
    "  credited_micros INTEGER NOT NULL DEFAULT 0"
    "    CHECK (typeof(credited_micros) = 'integer' AND credited_micros >= 0),"
    "  balance_micros INTEGER NOT NULL DEFAULT 0"
    "    CHECK (typeof(balance_micros) = 'integer' AND balance_micros >= 0),"
    "  created_us INTEGER NOT NULL"
    ");"
    "CREATE TABLE reservations ("
    "  run_id TEXT PRIMARY KEY NOT NULL,"
    "  org TEXT NOT NULL REFERENCES organisations(org),"
    "  reserved_micros INTEGER NOT NULL"
    "    CHECK (typeof(reserved_micros) = 'integer' AND reserved_micros > 0),"
    "  billed_micros INTEGER NOT NULL DEFAULT 0 CHECK (typeof(billed_micros) = 'integer'),"
    "  model_micros INTEGER NOT NULL DEFAULT 0 CHECK (typeof(model_micros) = 'integer'),"
    "  web_micros INTEGER NOT NULL DEFAULT 0 CHECK (typeof(web_micros) = 'integer'),"
    "  compute_micros INTEGER NOT NULL DEFAULT 0 CHECK (typeof(compute_micros) = 'integer'),"
    "  released_micros INTEGER NOT NULL DEFAULT 0 CHECK (typeof(released_micros) = 'integer'),"
    "  settled INTEGER NOT NULL DEFAULT 0 CHECK (settled IN (0, 1)),"
    "  CHECK (billed_micros >= 0 AND billed_micros <= reserved_micros),"
    "  CHECK (billed_micros = model_micros + web_micros + compute_micros),"
    "  CHECK ((settled = 0 AND released_micros = 0) OR"
    "         (settled = 1 AND billed_micros + released_micros = reserved_micros))"
    ");"
    "CREATE INDEX reservations_open ON reservations(settled) WHERE settled = 0;"
    "CREATE TABLE entries ("
    "  seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  t_us INTEGER NOT NULL,"
    "  org TEXT NOT NULL REFERENCES organisations(org),"
    "  run_id TEXT,"
    "  kind TEXT NOT NULL CHECK (kind IN ('credit', 'reserve', 'charge', 'settle')),"
    "  category TEXT CHECK (category IN ('model', 'web', 'compute')),"
    "  micros INTEGER NOT NULL CHECK (typeof(micros) = 'integer' AND micros >= 0),"
    "  memo TEXT,"
    "  CHECK ((kind = 'charge') = (category IS NOT NULL)),"
    "  CHECK ((kind = 'credit') = (run_id IS NULL)),"
    "  CHECK (kind NOT IN ('credit', 'reserve') OR micros > 0)"
    ");"
    "CREATE INDEX entries_run ON entries(run_id) WHERE run_id IS NOT NULL;"
    /* The journal is append-only. */
    "CREATE TRIGGER entries_no_update BEFORE UPDATE ON entries BEGIN"
    "  SELECT RAISE(ABORT, 'ledger entries are append-only: UPDATE refused');"
    "END;"
    "CREATE TRIGGER entries_no_delete BEFORE DELETE ON entries BEGIN"
    "  SELECT RAISE(ABORT, 'ledger entries are append-only: DELETE refused');"
    "END;"
    /* Derived state, maintained by the same INSERT. */
    "CREATE TRIGGER entries_credit AFTER INSERT ON entries WHEN NEW.kind = 'credit' BEGIN"
    "  UPDATE organisations SET credited_micros = credited_micros + NEW.micros,"
    "    balance_micros = balance_micros + NEW.micros WHERE org = NEW.org;"
    "END;"
    "CREATE TRIGGER entries_reserve AFTER INSERT ON entries WHEN NEW.kind = 'reserve' BEGIN"
    "  INSERT INTO reservations(run_id, org, reserved_micros)"
    "    VALUES (NEW.run_id, NEW.org, NEW.micros);"
    "  UPDATE organisations SET balance_micros = balance_micros - NEW.micros"
    "    WHERE org = NEW.org;"
    "END;"
    "CREATE TRIGGER entries_charge AFTER INSERT ON entries WHEN NEW.kind = 'charge' BEGIN"
    "  SELECT RAISE(ABORT, 'ledger: charge on a missing or settled reservation')"
    "    WHERE NOT EXISTS (SELECT 1 FROM reservations"
    "                      WHERE run_id = NEW.run_id AND org = NEW.org AND settled = 0);"
    "  UPDATE reservations SET billed_micros = billed_micros + NEW.micros,"
    "    model_micros = model_micros + (CASE NEW.category WHEN 'model' THEN NEW.micros ELSE 0 END),"
    "    web_micros = web_micros + (CASE NEW.category WHEN 'web' THEN NEW.micros ELSE 0 END),"
    "    compute_micros = compute_micros"
    "      + (CASE NEW.category WHEN 'compute' THEN NEW.micros ELSE 0 END)"
    "    WHERE run_id = NEW.run_id;"
    "END;"
    "CREATE TRIGGER entries_settle AFTER INSERT ON entries WHEN NEW.kind = 'settle' BEGIN"
    "  SELECT RAISE(ABORT, 'ledger: settle must release exactly reserved - billed')"
    "    WHERE NOT EXISTS (SELECT 1 FROM reservations"
    "                      WHERE run_id = NEW.run_id AND org = NEW.org AND settled = 0"
    "                        AND reserved_micros - billed_micros = NEW.micros);"
    "  UPDATE reservations SET settled = 1, released_micros = NEW.micros"
    "    WHERE run_id = NEW.run_id;"
    "  UPDATE organisations SET balance_micros = balance_micros + NEW.micros"
    "    WHERE org = NEW.org;"
    "END;";

/* v2: one row the health probe rewrites, so "can the ledger commit?" is answered by a
 * real commit without touching the journal. */
static const char schema_v2[] = "CREATE TABLE probe ("
                                "  id INTEGER PRIMARY KEY CHECK (id = 1),"
                                "  t_us INTEGER NOT NULL"
                                ");";

/* v3: the ledger's identity (eph_ledger_ops_t.identity): a random UUID (version 4) made
 * with the file and never changed, so processes can tell whether they share this file. */
static const char schema_v3[] =
    "CREATE TABLE identity ("
    "  one INTEGER PRIMARY KEY CHECK (one = 1),"
    "  id TEXT NOT NULL CHECK (length(id) = 36),"
    "  created_us INTEGER NOT NULL"
    ");"
    "INSERT INTO identity(one, id, created_us)"
    "  SELECT 1, lower(substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-4' || substr(h, 14, 3)"
    "    || '-' || substr('89ab', 1 + (abs(random()) % 4), 1) || substr(h, 18, 3) || '-'"
    "    || substr(h, 21, 12)),"
    "    CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)"
    "  FROM (SELECT hex(randomblob(16)) AS h);"
    "CREATE TRIGGER identity_no_update BEFORE UPDATE ON identity BEGIN"
    "  SELECT RAISE(ABORT, 'the ledger identity is fixed');"
    "END;"
    "CREATE TRIGGER identity_no_delete BEFORE DELETE ON identity BEGIN"
    "  SELECT RAISE(ABORT, 'the ledger identity is fixed');"
    "END;";

/* A charge commits without fsync while the WAL was fsync()ed less than this long ago. */
#define CHARGE_SYNC_US 1000000

enum {
  ST_BEGIN,
  ST_COMMIT,
  ST_ROLLBACK,
  ST_ORG_ENSURE,
  ST_ORG_GET,
  ST_RES_GET,
  ST_ENTRY_ADD,
  ST_OPEN_LIST,
  ST_PROBE,
  ST_IDENTITY,
  ST_OPEN_BEFORE,
  ST_COUNT
};

static const char *const statement_sql[ST_COUNT] = {
    [ST_BEGIN] = "BEGIN IMMEDIATE",
    [ST_COMMIT] = "COMMIT",
    [ST_ROLLBACK] = "ROLLBACK",
    [ST_ORG_ENSURE] = "INSERT INTO organisations(org, created_us) VALUES (?1, ?2)"
                      " ON CONFLICT(org) DO NOTHING",
    [ST_ORG_GET] = "SELECT credited_micros, balance_micros FROM organisations WHERE org = ?1",
    [ST_RES_GET] = "SELECT org, reserved_micros, billed_micros, released_micros, model_micros,"
                   " web_micros, compute_micros, settled FROM reservations WHERE run_id = ?1",
    [ST_ENTRY_ADD] = "INSERT INTO entries(t_us, org, run_id, kind, category, micros, memo)"
                     " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    [ST_OPEN_LIST] = "SELECT run_id FROM reservations WHERE settled = 0 ORDER BY run_id",
    [ST_PROBE] = "INSERT INTO probe(id, t_us) VALUES (1, ?1)"
                 " ON CONFLICT(id) DO UPDATE SET t_us = excluded.t_us",
    [ST_IDENTITY] = "SELECT id FROM identity WHERE one = 1",
    [ST_OPEN_BEFORE] = "SELECT r.run_id, r.org, r.reserved_micros, e.t_us FROM reservations r"
                       " JOIN entries e ON e.run_id = r.run_id AND e.kind = 'reserve'"
                       " WHERE r.settled = 0 AND e.t_us < ?1 ORDER BY e.t_us, r.run_id LIMIT ?2",
};

typedef struct ledger {
  const eph_host_t *host;
  char *path;
  sqlite3 *db;
  sqlite3_stmt *st[ST_COUNT];
  pthread_mutex_t lock; /* one connection, one user at a time: see the top comment */
  bool full;            /* synchronous = "full" configured */
  bool synced_now;      /* the connection's synchronous is FULL at the moment */
  int64_t last_sync_us; /* CLOCK_MONOTONIC of the last fsync()ed commit */
  char identity[EPH_LEDGER_IDENTITY_BYTES]; /* table identity, read at init */
} ledger_t;

static const eph_config_key_t ledger_keys[] = {
    {"path", EPH_CFG_STRING, "\"<state_dir>/ledger.sqlite\"", NULL,
     "The ledger's SQLite file. A relative path is taken relative to the state directory."},
    {"busy_timeout_ms", EPH_CFG_INT, "5000", "ms",
     "How long an operation waits for another process holding the file's write lock before "
     "failing with EBUSY.",
     EPH_CFG_RANGE(0, INT_MAX)},
    {"synchronous", EPH_CFG_STRING, "\"full\"", NULL,
     "\"full\": credits, reservations and settlements are fsync()ed and survive power loss; "
     "charges are group-committed (fsync()ed at least once a second: a power cut may roll back "
     "the last second of charges, less than one compute meter interval). \"normal\": "
     "faster, survives a crash of the process but the last entries of any kind may roll back "
     "after an OS crash or power cut."},
    {0},
};

/* A CHECK or trigger refusing an entry the C checks let through (a bug or a foreign writer)
 * is EINVAL with SQLite's message; the mapping is the store's too (eph_sqlite_errno). */
static int
db_error(ledger_t *l, int rc, const char *what, eph_error_t *err)
{
  return eph_error_set(err, eph_sqlite_errno(rc), "%s: %s: %s", l->path, what,
                       sqlite3_errmsg(l->db));
}

/* Runs a statement that returns no row (or whose rows are ignored) and resets it. */
static int
step_done(ledger_t *l, int which, const char *what, eph_error_t *err)
{
  sqlite3_stmt *s = l->st[which];
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW)
    ;
  int r = rc == SQLITE_DONE ? 0 : db_error(l, sqlite3_extended_errcode(l->db), what, err);
  sqlite3_reset(s);
  sqlite3_clear_bindings(s);
  return r;
}

static int64_t
mono_us(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Begins a transaction whose commit is fsync()ed (credit, reserve, settle: always) or, for
 * a charge (group = true), only when the last fsync is CHARGE_SYNC_US old: see the top
 * comment. synchronous can only change outside a transaction, so it is set here. */
static int
tx_start(ledger_t *l, bool group, eph_error_t *err)
{
  if (l->full) {
    bool sync = !group || mono_us() - l->last_sync_us >= CHARGE_SYNC_US;
    if (sync != l->synced_now) {
      /* Not a prepared statement: PRAGMA synchronous takes effect when it is compiled, so
       * a prepared one would set the level once, at prepare time, and never again. */
      const char *sql = sync ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL";
      int rc = sqlite3_exec(l->db, sql, NULL, NULL, NULL);
      if (rc != SQLITE_OK)
        return db_error(l, rc, "PRAGMA synchronous", err);
      l->synced_now = sync;
    }
  }
  return step_done(l, ST_BEGIN, "BEGIN IMMEDIATE", err);
}

/* Takes the lock and begins the transaction (tx_end commits or rolls back and releases
 * it); on failure the lock is released. */
static int
tx_begin_as(ledger_t *l, bool group, eph_error_t *err)
{
  pthread_mutex_lock(&l->lock);
  int r = tx_start(l, group, err);
  if (r < 0)
    pthread_mutex_unlock(&l->lock);
  return r;
}

static int
tx_begin(ledger_t *l, eph_error_t *err)
{
  return tx_begin_as(l, false, err);
}

static int
tx_commit(ledger_t *l, eph_error_t *err)
{
  int r = step_done(l, ST_COMMIT, "COMMIT", err);
  if (r >= 0 && l->full && l->synced_now)
    l->last_sync_us = mono_us();
  return r;
}

static void
tx_rollback(ledger_t *l)
{
  if (!sqlite3_get_autocommit(l->db))
    step_done(l, ST_ROLLBACK, "ROLLBACK", NULL);
}

/* Ends the transaction: commits when r >= 0, else rolls back; returns r or the commit's
 * error. Called with the lock held; releases it. */
static int
tx_end(ledger_t *l, int r, eph_error_t *err)
{
  if (r >= 0) {
    int c = tx_commit(l, err);
    if (c < 0) {
      tx_rollback(l);
      r = c;
    }
  } else {
    tx_rollback(l);
  }
  pthread_mutex_unlock(&l->lock);
  return r;
}

/* Reads one reservation. Returns 1 found, 0 absent, negative on error. */
static int
reservation_get(ledger_t *l, const char *run_id, eph_ledger_reservation_t *out, eph_error_t *err)
{
  sqlite3_stmt *s = l->st[ST_RES_GET];
  sqlite3_bind_text(s, 1, run_id, -1, SQLITE_STATIC);
  int rc = sqlite3_step(s);
  int r = 0;
  if (rc == SQLITE_ROW) {
    memset(out, 0, sizeof *out);
    snprintf(out->org, sizeof out->org, "%s", (const char *)sqlite3_column_text(s, 0));
    out->t.reserved_micros = sqlite3_column_int64(s, 1);
    out->t.billed_micros = sqlite3_column_int64(s, 2);
    out->t.released_micros = sqlite3_column_int64(s, 3);
    out->t.model_micros = sqlite3_column_int64(s, 4);
    out->t.web_micros = sqlite3_column_int64(s, 5);
    out->t.compute_micros = sqlite3_column_int64(s, 6);
    out->t.settled = sqlite3_column_int(s, 7);
    r = 1;
  } else if (rc != SQLITE_DONE) {
    r = db_error(l, sqlite3_extended_errcode(l->db), "reading the reservation", err);
  }
  sqlite3_reset(s);
  sqlite3_clear_bindings(s);
  return r;
}

/* Reads an organisation's balance. Returns 1 found, 0 absent, negative on error. */
static int
org_get(ledger_t *l, const char *org, int64_t *credited, int64_t *balance, eph_error_t *err)
{
  sqlite3_stmt *s = l->st[ST_ORG_GET];
  sqlite3_bind_text(s, 1, org, -1, SQLITE_STATIC);
  int rc = sqlite3_step(s);
  int r = 0;
  if (rc == SQLITE_ROW) {
    if (credited)
      *credited = sqlite3_column_int64(s, 0);
    if (balance)
      *balance = sqlite3_column_int64(s, 1);
    r = 1;
  } else if (rc != SQLITE_DONE) {
    r = db_error(l, sqlite3_extended_errcode(l->db), "reading the organisation", err);
  }
  sqlite3_reset(s);
  sqlite3_clear_bindings(s);
  return r;
}

static int
entry_add(void *ctx, const char *org, const char *run_id, const char *kind, const char *category,
          int64_t micros, const char *memo, eph_error_t *err)
{
  ledger_t *l = ctx; /* void *: it is the store's entry_add (eph_ledger_store_t) */
  sqlite3_stmt *s = l->st[ST_ENTRY_ADD];
  sqlite3_bind_int64(s, 1, eph_ledger_wall_us());
  sqlite3_bind_text(s, 2, org, -1, SQLITE_STATIC);
  if (run_id)
    sqlite3_bind_text(s, 3, run_id, -1, SQLITE_STATIC);
  sqlite3_bind_text(s, 4, kind, -1, SQLITE_STATIC);
  if (category)
    sqlite3_bind_text(s, 5, category, -1, SQLITE_STATIC);
  sqlite3_bind_int64(s, 6, micros);
  char memo_buf[EPH_LEDGER_MAX_MEMO_BYTES + 1];
  if (memo) {
    eph_ledger_memo_clean(memo, memo_buf);
    sqlite3_bind_text(s, 7, memo_buf, -1, SQLITE_STATIC);
  }
  return step_done(l, ST_ENTRY_ADD, "appending a ledger entry", err);
}

/* ---------------------------------------------------------------- operations */

static int
ledger_credit(void *state, const char *org, int64_t micros, eph_error_t *err)
{
  ledger_t *l = state;
  int r = eph_ledger_check_credit(org, micros, err);
  if (r < 0)
    return r;
  if ((r = tx_begin(l, err)) < 0)
    return r;
  int64_t credited = 0, balance = 0;
  sqlite3_bind_text(l->st[ST_ORG_ENSURE], 1, org, -1, SQLITE_STATIC);
  sqlite3_bind_int64(l->st[ST_ORG_ENSURE], 2, eph_ledger_wall_us());
  r = step_done(l, ST_ORG_ENSURE, "creating the organisation", err);
  if (r >= 0)
    r = org_get(l, org, &credited, &balance, err);
  if (r >= 0)
    r = eph_ledger_credit_fits(org, credited, balance, micros, err);
  if (r >= 0)
    r = entry_add(l, org, NULL, "credit", NULL, micros, NULL, err);
  return tx_end(l, r < 0 ? r : 0, err);
}

static int
ledger_balance(void *state, const char *org, int64_t *micros, eph_error_t *err)
{
  ledger_t *l = state;
  int r = eph_ledger_check_balance(org, err);
  if (r < 0)
    return r;
  int64_t balance = 0;
  pthread_mutex_lock(&l->lock);
  r = org_get(l, org, NULL, &balance, err);
  pthread_mutex_unlock(&l->lock);
  if (r < 0)
    return r;
  *micros = r == 1 ? balance : 0; /* an unknown organisation has nothing */
  return 0;
}

static int
ledger_reserve(void *state, const char *org, const char *run_id, int64_t micros, eph_error_t *err)
{
  ledger_t *l = state;
  int r = eph_ledger_check_reserve(org, run_id, micros, err);
  if (r < 0)
    return r;
  if ((r = tx_begin(l, err)) < 0)
    return r;
  eph_ledger_reservation_t res;
  int64_t balance = 0;
  r = reservation_get(l, run_id, &res, err);
  if (r == 1)
    r = eph_ledger_err_reserved(run_id, err);
  if (r >= 0 && (r = org_get(l, org, NULL, &balance, err)) >= 0)
    r = eph_ledger_reserve_fits(org, r, balance, micros, err);
  if (r >= 0)
    r = entry_add(l, org, run_id, "reserve", NULL, micros, NULL, err);
  return tx_end(l, r < 0 ? r : 0, err);
}

static int
ledger_charge(void *state, const char *run_id, eph_cost_t category, int64_t micros,
              const char *memo, eph_error_t *err)
{
  ledger_t *l = state;
  const char *cat = NULL;
  int r = eph_ledger_check_charge(run_id, category, micros, &cat, err);
  if (r < 0)
    return r;
  if ((r = tx_begin_as(l, true, err)) < 0)
    return r;
  eph_ledger_reservation_t res;
  r = reservation_get(l, run_id, &res, err);
  if (r >= 0)
    r = eph_ledger_charge_fits(run_id, cat, micros, r, &res.t, err);
  if (r >= 0)
    r = entry_add(l, res.org, run_id, "charge", cat, micros, memo, err);
  return tx_end(l, r < 0 ? r : 0, err);
}

static int
store_reservation_get(void *l, const char *run_id, eph_ledger_reservation_t *out, eph_error_t *err)
{
  return reservation_get(l, run_id, out, err);
}

static const eph_ledger_store_t store = {store_reservation_get, entry_add};

/* Settles inside an open transaction. Returns 1 when it settled now, 0 when it already
 * was settled, negative on error. */
static int
settle_locked(ledger_t *l, const char *run_id, eph_ledger_totals_t *totals, eph_error_t *err)
{
  return eph_ledger_settle_in(&store, l, run_id, totals, err);
}

static int
ledger_settle(void *state, const char *run_id, eph_ledger_totals_t *totals, eph_error_t *err)
{
  ledger_t *l = state;
  int r = eph_ledger_check_name("run_id", run_id, err);
  if (r < 0)
    return r;
  if ((r = tx_begin(l, err)) < 0)
    return r;
  r = settle_locked(l, run_id, totals, err);
  return tx_end(l, r < 0 ? r : 0, err);
}

static int
ledger_totals(void *state, const char *run_id, eph_ledger_totals_t *totals, eph_error_t *err)
{
  ledger_t *l = state;
  int r = eph_ledger_check_name("run_id", run_id, err);
  if (r < 0)
    return r;
  eph_ledger_reservation_t res;
  pthread_mutex_lock(&l->lock);
  r = reservation_get(l, run_id, &res, err);
  pthread_mutex_unlock(&l->lock);
  if (r == 0)
    return eph_ledger_err_no_reservation("totals", run_id, err);
  if (r < 0)
    return r;
  *totals = res.t;
  return 0;
}

static int
ledger_settle_open(void *state, eph_error_t *err)
{
  ledger_t *l = state;
  int r;
  if ((r = tx_begin(l, err)) < 0)
    return r;
  /* Collect first: settling writes to the table the list reads. */
  size_t n = 0, cap = 0;
  char **ids = NULL;
  sqlite3_stmt *s = l->st[ST_OPEN_LIST];
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      char **grown = realloc(ids, cap * sizeof *ids);
      if (!grown) {
        rc = SQLITE_NOMEM;
        break;
      }
      ids = grown;
    }
    if (!(ids[n] = strdup((const char *)sqlite3_column_text(s, 0)))) {
      rc = SQLITE_NOMEM;
      break;
    }
    n++;
  }
  if (rc == SQLITE_NOMEM)
    r = eph_error_set(err, ENOMEM, "settle_open: out of memory");
  else if (rc != SQLITE_DONE)
    r = db_error(l, sqlite3_extended_errcode(l->db), "listing open reservations", err);
  sqlite3_reset(s);
  int settled = 0;
  for (size_t i = 0; i < n && r >= 0; i++) {
    r = settle_locked(l, ids[i], NULL, err);
    if (r > 0)
      settled++;
  }
  for (size_t i = 0; i < n; i++)
    free(ids[i]);
  free(ids);
  r = tx_end(l, r < 0 ? r : 0, err);
  if (r < 0)
    return r;
  if (settled > 0 && l->host && l->host->log)
    l->host->log(EPH_LOG_WARN, "settled %d reservation(s) left open by an earlier process",
                 settled);
  return settled;
}

static int
ledger_probe(void *state, eph_error_t *err)
{
  ledger_t *l = state;
  int r = tx_begin(l, err);
  if (r < 0)
    return r;
  sqlite3_bind_int64(l->st[ST_PROBE], 1, eph_ledger_wall_us());
  r = step_done(l, ST_PROBE, "health probe", err);
  return tx_end(l, r, err);
}

static int
ledger_identity(void *state, char *out, size_t size, eph_error_t *err)
{
  ledger_t *l = state;
  if (!out || size < EPH_LEDGER_IDENTITY_BYTES)
    return eph_error_set(err, EINVAL, "ledger-sqlite: identity: buffer too small");
  snprintf(out, size, "%s", l->identity);
  return 0;
}

static int
ledger_open_reservations(void *state, int64_t open_for_us, int limit,
                         void (*each)(void *ctx, const eph_ledger_open_t *r), void *ctx,
                         eph_error_t *err)
{
  ledger_t *l = state;
  if (!each || limit < 1 || open_for_us < 0)
    return eph_error_set(
        err, EINVAL,
        "ledger-sqlite: open_reservations: each, limit > 0 and open_for_us >= 0 required");
  pthread_mutex_lock(&l->lock);
  sqlite3_stmt *s = l->st[ST_OPEN_BEFORE];
  /* One host's file: its entries are stamped with this host's clock (eph_ledger_wall_us),
   * which the age is measured by too. */
  sqlite3_bind_int64(s, 1, eph_ledger_wall_us() - open_for_us);
  sqlite3_bind_int(s, 2, limit);
  int n = 0, rc;
  /* One statement: SQLite reads it from one snapshot; each() must not call the ledger. */
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    eph_ledger_open_t o = {.struct_size = sizeof o,
                           .run_id = (const char *)sqlite3_column_text(s, 0),
                           .org = (const char *)sqlite3_column_text(s, 1),
                           .node = "",
                           .reserved_micros = sqlite3_column_int64(s, 2),
                           .reserved_unix_us = sqlite3_column_int64(s, 3)};
    each(ctx, &o);
    n++;
  }
  int r = rc == SQLITE_DONE
              ? n
              : db_error(l, sqlite3_extended_errcode(l->db), "listing open reservations", err);
  sqlite3_reset(s);
  pthread_mutex_unlock(&l->lock);
  return r;
}

/* ---------------------------------------------------------------- lifecycle */

/* The WAL outlives each process (no close-time checkpoint: see ledger_init), and the first
 * connection of every process rebuilds its index from all of it (SQLite empties the -shm of
 * a file nobody has open), reading and checksumming every frame: up to the 4 MiB of the
 * automatic checkpoint, ~2 ms of each `ephemeral run`. Past this size a closing connection
 * checkpoints and truncates it (two fsyncs every few runs); the rebuild then reads at most
 * this much. */
#define LEDGER_WAL_MAX_BYTES (512 * 1024)

static void
bound_wal(ledger_t *l)
{
  char wal[PATH_MAX];
  struct stat st;
  if (!l->db || !l->path || snprintf(wal, sizeof wal, "%s-wal", l->path) >= (int)sizeof wal ||
      stat(wal, &st) < 0 || st.st_size <= LEDGER_WAL_MAX_BYTES)
    return;
  /* Busy (another process reads or writes): it is left for a later close. */
  (void)sqlite3_wal_checkpoint_v2(l->db, NULL, SQLITE_CHECKPOINT_TRUNCATE, NULL, NULL);
}

static void
ledger_close(ledger_t *l)
{
  if (!l)
    return;
  eph_sqlite_finalize_all(l->st, ST_COUNT);
  bound_wal(l);
  if (l->db)
    sqlite3_close(l->db);
  pthread_mutex_destroy(&l->lock);
  free(l->path);
  free(l);
}

static int
ledger_init(const eph_host_t *host, const config_setting_t *config, void **state, eph_error_t *err)
{
  const char *path = NULL, *sync = NULL;
  int64_t busy_ms = 5000;
  int r;
  if (host->cfg_string && (r = host->cfg_string(config, "path", NULL, &path, err)) < 0)
    return r;
  if (host->cfg_int && (r = host->cfg_int(config, "busy_timeout_ms", 5000, &busy_ms, err)) < 0)
    return r;
  if (host->cfg_string && (r = host->cfg_string(config, "synchronous", "full", &sync, err)) < 0)
    return r;
  if (!sync)
    sync = "full";
  if (strcasecmp(sync, "full") != 0 && strcasecmp(sync, "normal") != 0)
    return eph_error_set(err, EPH_E_CONFIG,
                         "ledger-sqlite: key 'synchronous': \"%s\" is neither \"full\" nor "
                         "\"normal\"",
                         sync);
  /* busy_timeout_ms is within its row's range (the host refuses a value outside it). */

  ledger_t *l = calloc(1, sizeof *l);
  if (!l)
    return eph_error_set(err, ENOMEM, "ledger-sqlite: out of memory");
  pthread_mutex_init(&l->lock, NULL);
  l->host = host;
  if (path && path[0] == '/')
    l->path = strdup(path);
  else if (host->state_dir &&
           asprintf(&l->path, "%s/%s", host->state_dir, path && *path ? path : "ledger.sqlite") < 0)
    l->path = NULL;
  if (!l->path) {
    ledger_close(l);
    return eph_error_set(err, path || host->state_dir ? ENOMEM : EPH_E_CONFIG,
                         "ledger-sqlite: no path configured and no state directory");
  }

  /* Checked at every open however large the file grows: balances and open reservations. The
   * append-only journal (entries) is read back only by statements and settle_open. */
  static const char *const small_tables[] = {"organisations", "reservations", "probe", NULL};
  eph_sqlite_open_options_t so = {
      .what = "ledger",
      .check_tables = small_tables,
      .busy_timeout_ms = (int)busy_ms,
      .synchronous = strcasecmp(sync, "full") == 0 ? "FULL" : "NORMAL",
      .damaged_hint = "restore it from a backup",
      /* Balances and the journal: the owner's only, whatever the umask (a CLI `run` loads
       * this plugin after the core's umask 077 window, and the file came out 0644). */
      .owner_only = true,
      /* FULL: credits, reservations and settlements are fsync()ed at commit (a settlement
       * syncs every charge before it too), so the close-time checkpoint adds nothing. */
      .no_checkpoint_on_close = strcasecmp(sync, "full") == 0};
  if ((r = eph_sqlite_open(l->path, &so, &l->db, err)) < 0) {
    ledger_close(l);
    return r;
  }
  /* v1: the ledger; v2: the probe row; v3: its identity. Future versions: append. */
  static const char *const schema[] = {schema_v1, schema_v2, schema_v3};
  if ((r = eph_sqlite_migrate(l->db, l->path, schema, SCHEMA_VERSION, "plugin", err)) < 0) {
    ledger_close(l);
    return r;
  }
  if ((r = eph_sqlite_prepare_all(l->db, l->path, statement_sql, ST_COUNT, l->st, err)) < 0) {
    ledger_close(l);
    return r;
  }
  sqlite3_stmt *id = l->st[ST_IDENTITY];
  if (sqlite3_step(id) != SQLITE_ROW) {
    r = db_error(l, sqlite3_extended_errcode(l->db), "reading the ledger's identity", err);
    sqlite3_reset(id);
    ledger_close(l);
    return r < 0 ? r : -EIO;
  }
  snprintf(l->identity, sizeof l->identity, "%s", (const char *)sqlite3_column_text(id, 0));
  sqlite3_reset(id);
  l->full = l->synced_now = strcasecmp(sync, "full") == 0;
  *state = l;
  return 0;
}

EPH_LEDGER_PLUGIN("ledger-sqlite",
                  "Append-only ledger of organisations, reservations and charges in SQLite");
