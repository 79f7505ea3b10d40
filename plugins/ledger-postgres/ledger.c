/*
 * ledger-postgres: the money, in PostgreSQL. Implements eph_ledger_ops_t with the same model,
 * invariants and error codes as ledger-sqlite (plugins/ledger-sqlite/ledger.c), for several
 * hosts sharing one database.
 *
 * Model. Schema `ledger` (its own namespace: the core's store may share the database).
 * `ledger.entries` is the journal: an append-only list of credit, reserve, charge and settle
 * rows; triggers refuse UPDATE, DELETE and TRUNCATE. An AFTER INSERT trigger maintains the
 * derived tables (`organisations`, `reservations`) in the same statement, and those refuse
 * any write that does not come from it (pg_trigger_depth()), so no client, not even one
 * holding the ledger's own role, can move a balance without a journal entry. Their CHECK
 * constraints are the last line of defence:
 *   organisations.balance_micros >= 0                    (a balance never goes negative)
 *   reservations.billed_micros <= reserved_micros        (a charge never passes the cap)
 *   settled => billed_micros + released_micros = reserved_micros
 *   billed_micros = model_micros + web_micros + compute_micros
 *   one reserve and at most one settle entry per run (partial unique indexes)
 * bigint overflow raises an error in PostgreSQL (never wraps); the C code checks first anyway
 * so the caller gets the documented codes (-EPH_E_BUDGET, -EPH_E_INSUFFICIENT, ...).
 *
 * Concurrency. Every operation is one SERIALIZABLE transaction that also locks the rows it
 * decides on (SELECT ... FOR NO KEY UPDATE), so two hosts (or threads) cannot both pass a
 * balance or cap check; a transaction PostgreSQL aborts with serialization_failure (40001)
 * or deadlock_detected (40P01) is run again from the start, a bounded number of times with a
 * randomised back-off. Before the transaction starts, an operation on a run (charge, settle)
 * or an organisation (credit, reserve) takes a session advisory lock on its name, so
 * operations on one reservation queue rather than abort each other (see run_tx, conn.c).
 *
 * Threads. The core calls the ledger from the HTTP, run and meter threads at once: a small
 * pool of connections (`connections`, default 4) behind a mutex and a condition variable; an
 * operation takes one connection for its whole transaction. A connection found broken is
 * reset on its next use.
 *
 * Failure. A database that cannot be reached fails the operation (-EIO, naming the database
 * without its password): a charge that returned an error was not recorded, so the core stops
 * the run (storage_error) rather than bill what the ledger does not hold. A connection lost
 * before COMMIT was sent is reset and the operation tried once more (the server rolled the
 * transaction back); lost during COMMIT the outcome is unknown: the error says so, and the
 * run's record takes its totals from the ledger when it is settled, so they still agree.
 *
 * settle_open settles the open reservations of this node only (`node_name`): on a shared
 * database the other nodes' open reservations belong to runs that are still alive.
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
#include <unistd.h>

#include <libpq-fe.h>

#include <ephemeral/plugin.h>

#include "ledger.h"
#include "support/ledger_common.h"

static const eph_config_key_t ledger_keys[] = {
    {"database", EPH_CFG_STRING, "(the core's `database`)", NULL,
     "The PostgreSQL database of the ledger: a libpq connection URI "
     "(postgresql://user@host/db?sslmode=verify-full) or key=value string. Unset: the core's "
     "own `database` (ephemeral.conf, --database, EPHEMERAL_DATABASE), so a cluster names it "
     "once. Set it only to keep the money in another database. Prefer a password in "
     "~/.pgpass or PGPASSFILE to one written here."},
    {"node_name", EPH_CFG_STRING, "(the core's `node_name`)", NULL,
     "This host's name in the ledger: reservations record it, and settle_open settles only "
     "this node's open reservations. Unset: the core's `node_name` (default the hostname). "
     "Must differ between nodes sharing the database."},
    {"connections", EPH_CFG_INT, "4", NULL,
     "Connections in the plugin's pool; an operation holds one for its transaction.",
     EPH_CFG_RANGE(1, 64)},
    {"connect_timeout_s", EPH_CFG_INT, "5", "seconds",
     "How long connecting (or reconnecting) waits for the server (a connect_timeout in the "
     "URI wins).",
     EPH_CFG_RANGE(1, 3600)},
    {"statement_timeout_ms", EPH_CFG_INT, "10000", "ms",
     "A statement running longer (a lock held by a stuck client) is cancelled and the "
     "operation fails with EBUSY. 0: no limit.",
     EPH_CFG_RANGE(0, INT_MAX)},
    {"require_tls", EPH_CFG_BOOL, "true", NULL,
     "Refuse a `database` that reaches a host other than a Unix socket or loopback without "
     "sslmode=verify-full: money and credentials would cross the network readable and "
     "alterable."},
    {"max_attempts", EPH_CFG_INT, "20", NULL,
     "How many times a transaction aborted by a serialization failure or a deadlock is run "
     "before the operation fails with EBUSY.",
     EPH_CFG_RANGE(1, 1000)},
    {0},
};

/* Reads one reservation (locked when `lock`). Returns 1 found, 0 absent, negative on error. */
static int
reservation_get(tx_t *tx, const char *run_id, bool lock, eph_ledger_reservation_t *out,
                eph_error_t *err)
{
  const char *p[] = {run_id};
  PGresult *res = q(tx, lock ? ST_RES_LOCK : ST_RES_GET, p, "reading the reservation", err);
  if (!res)
    return -err->code;
  int r = 0;
  if (PQntuples(res) == 1) {
    memset(out, 0, sizeof *out);
    snprintf(out->org, sizeof out->org, "%s", PQgetvalue(res, 0, 0));
    out->t.reserved_micros = col_i64(res, 0, 1);
    out->t.billed_micros = col_i64(res, 0, 2);
    out->t.released_micros = col_i64(res, 0, 3);
    out->t.model_micros = col_i64(res, 0, 4);
    out->t.web_micros = col_i64(res, 0, 5);
    out->t.compute_micros = col_i64(res, 0, 6);
    out->t.settled = (int)col_i64(res, 0, 7);
    r = 1;
  }
  PQclear(res);
  return r;
}

/* Reads an organisation (locked when `lock`). Returns 1 found, 0 absent, negative on error. */
static int
org_get(tx_t *tx, const char *org, bool lock, int64_t *credited, int64_t *balance, eph_error_t *err)
{
  const char *p[] = {org};
  PGresult *res = q(tx, lock ? ST_ORG_LOCK : ST_ORG_GET, p, "reading the organisation", err);
  if (!res)
    return -err->code;
  int r = 0;
  if (PQntuples(res) == 1) {
    if (credited)
      *credited = col_i64(res, 0, 0);
    if (balance)
      *balance = col_i64(res, 0, 1);
    r = 1;
  }
  PQclear(res);
  return r;
}

static int
entry_add(void *ctx, const char *org, const char *run_id, const char *kind, const char *category,
          int64_t micros, const char *memo, eph_error_t *err)
{
  tx_t *tx = ctx; /* void *: it is the store's entry_add (eph_ledger_store_t) */
  char m[24], memo_buf[EPH_LEDGER_MAX_MEMO_BYTES + 1];
  snprintf(m, sizeof m, "%" PRId64, micros);
  if (memo)
    eph_ledger_memo_clean(memo, memo_buf);
  /* The entry's time is the database server's (ST_ENTRY_ADD), not this node's. */
  const char *p[] = {org, run_id, tx->l->node, kind, category, m, memo ? memo_buf : NULL};
  PGresult *res = q(tx, ST_ENTRY_ADD, p, "appending a ledger entry", err);
  if (!res)
    return -err->code;
  PQclear(res);
  return 0;
}

/* ---------------------------------------------------------------- operations */

typedef struct op_arg {
  const char *org, *run_id, *category, *memo;
  int64_t micros;
  eph_ledger_totals_t *totals;
  int64_t *out;
} op_arg_t;

static int
credit_body(tx_t *tx, void *p, eph_error_t *err)
{
  op_arg_t *a = p;
  char t[24];
  snprintf(t, sizeof t, "%" PRId64, eph_ledger_wall_us());
  const char *params[] = {a->org, t};
  PGresult *res = q(tx, ST_ORG_ENSURE, params, "creating the organisation", err);
  if (!res)
    return -err->code;
  PQclear(res);
  int64_t credited = 0, balance = 0;
  int r = org_get(tx, a->org, true, &credited, &balance, err);
  if (r < 0)
    return r;
  if ((r = eph_ledger_credit_fits(a->org, credited, balance, a->micros, err)) < 0)
    return r;
  return entry_add(tx, a->org, NULL, "credit", NULL, a->micros, NULL, err);
}

static int
ledger_credit(void *state, const char *org, int64_t micros, eph_error_t *err)
{
  int r = eph_ledger_check_credit(org, micros, err);
  if (r < 0)
    return r;
  op_arg_t a = {.org = org, .micros = micros};
  return run_tx(state, LOCK_ORG, org, credit_body, &a, err);
}

static int
balance_body(tx_t *tx, void *p, eph_error_t *err)
{
  op_arg_t *a = p;
  int64_t balance = 0;
  int r = org_get(tx, a->org, false, NULL, &balance, err);
  if (r < 0)
    return r;
  *a->out = r == 1 ? balance : 0; /* an unknown organisation has nothing */
  return 0;
}

static int
ledger_balance(void *state, const char *org, int64_t *micros, eph_error_t *err)
{
  int r = eph_ledger_check_balance(org, err);
  if (r < 0)
    return r;
  op_arg_t a = {.org = org, .out = micros};
  return run_tx(state, 0, NULL, balance_body, &a, err);
}

static int
reserve_body(tx_t *tx, void *p, eph_error_t *err)
{
  op_arg_t *a = p;
  eph_ledger_reservation_t res;
  int64_t balance = 0;
  int r = reservation_get(tx, a->run_id, false, &res, err);
  if (r == 1)
    return eph_ledger_err_reserved(a->run_id, err);
  if (r < 0)
    return r;
  r = org_get(tx, a->org, true, NULL, &balance, err);
  if (r < 0 || (r = eph_ledger_reserve_fits(a->org, r, balance, a->micros, err)) < 0)
    return r;
  r = entry_add(tx, a->org, a->run_id, "reserve", NULL, a->micros, NULL, err);
  /* Another node reserved the same run between our read and our insert. */
  if (r < 0 && strcmp(tx->sqlstate, "23505") == 0)
    return eph_ledger_err_reserved(a->run_id, err);
  return r;
}

static int
ledger_reserve(void *state, const char *org, const char *run_id, int64_t micros, eph_error_t *err)
{
  int r = eph_ledger_check_reserve(org, run_id, micros, err);
  if (r < 0)
    return r;
  op_arg_t a = {.org = org, .run_id = run_id, .micros = micros};
  return run_tx(state, LOCK_ORG, org, reserve_body, &a, err);
}

static int
charge_body(tx_t *tx, void *p, eph_error_t *err)
{
  op_arg_t *a = p;
  eph_ledger_reservation_t res;
  int r = reservation_get(tx, a->run_id, true, &res, err);
  if (r < 0 || (r = eph_ledger_charge_fits(a->run_id, a->category, a->micros, r, &res.t, err)) < 0)
    return r;
  return entry_add(tx, res.org, a->run_id, "charge", a->category, a->micros, a->memo, err);
}

static int
ledger_charge(void *state, const char *run_id, eph_cost_t category, int64_t micros,
              const char *memo, eph_error_t *err)
{
  const char *cat = NULL;
  int r = eph_ledger_check_charge(run_id, category, micros, &cat, err);
  if (r < 0)
    return r;
  op_arg_t a = {.run_id = run_id, .category = cat, .micros = micros, .memo = memo};
  return run_tx(state, LOCK_RUN, run_id, charge_body, &a, err);
}

static int
store_reservation_get(void *tx, const char *run_id, eph_ledger_reservation_t *out, eph_error_t *err)
{
  return reservation_get(tx, run_id, true, out, err); /* locked: the settle writes it */
}

static const eph_ledger_store_t store = {store_reservation_get, entry_add};

/* Settles inside an open transaction. Returns 1 when it settled now, 0 when it already was
 * settled, negative on error. */
static int
settle_locked(tx_t *tx, const char *run_id, eph_ledger_totals_t *totals, eph_error_t *err)
{
  return eph_ledger_settle_in(&store, tx, run_id, totals, err);
}

static int
settle_body(tx_t *tx, void *p, eph_error_t *err)
{
  op_arg_t *a = p;
  int r = settle_locked(tx, a->run_id, a->totals, err);
  return r < 0 ? r : 0;
}

static int
ledger_settle(void *state, const char *run_id, eph_ledger_totals_t *totals, eph_error_t *err)
{
  int r = eph_ledger_check_name("run_id", run_id, err);
  if (r < 0)
    return r;
  op_arg_t a = {.run_id = run_id, .totals = totals};
  return run_tx_locked(state, LOCK_RUN, run_id, true, settle_body, &a, err);
}

static int
totals_body(tx_t *tx, void *p, eph_error_t *err)
{
  op_arg_t *a = p;
  eph_ledger_reservation_t res;
  int r = reservation_get(tx, a->run_id, false, &res, err);
  if (r < 0)
    return r;
  if (r == 0)
    return eph_ledger_err_no_reservation("totals", a->run_id, err);
  *a->totals = res.t;
  return 0;
}

static int
ledger_totals(void *state, const char *run_id, eph_ledger_totals_t *totals, eph_error_t *err)
{
  int r = eph_ledger_check_name("run_id", run_id, err);
  if (r < 0)
    return r;
  op_arg_t a = {.run_id = run_id, .totals = totals};
  return run_tx(state, 0, NULL, totals_body, &a, err);
}

static int
settle_open_body(tx_t *tx, void *p, eph_error_t *err)
{
  (void)p;
  const char *params[] = {tx->l->node};
  PGresult *res = q(tx, ST_OPEN_LIST, params, "listing open reservations", err);
  if (!res)
    return -err->code;
  int settled = 0, r = 0;
  for (int i = 0; i < PQntuples(res) && r >= 0; i++) {
    r = settle_locked(tx, PQgetvalue(res, i, 0), NULL, err);
    if (r > 0)
      settled++;
  }
  PQclear(res);
  return r < 0 ? r : settled;
}

static int
ledger_settle_open(void *state, eph_error_t *err)
{
  ledger_t *l = state;
  int settled = run_tx(l, 0, NULL, settle_open_body, NULL, err);
  if (settled > 0 && l->host && l->host->log)
    l->host->log(EPH_LOG_WARN,
                 "settled %d reservation(s) node '%s' left open in an earlier process", settled,
                 l->node);
  return settled;
}

static int
probe_body(tx_t *tx, void *p, eph_error_t *err)
{
  (void)p;
  char t[24];
  snprintf(t, sizeof t, "%" PRId64, eph_ledger_wall_us());
  const char *params[] = {t};
  PGresult *res = q(tx, ST_PROBE, params, "health probe", err);
  if (!res)
    return -err->code;
  PQclear(res);
  return 0;
}

static int
ledger_probe(void *state, eph_error_t *err)
{
  return run_tx(state, 0, NULL, probe_body, NULL, err);
}

static int
ledger_identity(void *state, char *out, size_t size, eph_error_t *err)
{
  ledger_t *l = state;
  if (!out || size < EPH_LEDGER_IDENTITY_BYTES)
    return eph_error_set(err, EINVAL, PLUGIN ": identity: buffer too small");
  snprintf(out, size, "%s", l->identity);
  return 0;
}

typedef struct open_arg {
  int64_t open_for_us;
  int limit;
  PGresult *res; /* the rows of the committed attempt */
} open_arg_t;

static int
open_body(tx_t *tx, void *p, eph_error_t *err)
{
  open_arg_t *a = p;
  char t[24], n[24];
  snprintf(t, sizeof t, "%" PRId64, a->open_for_us);
  snprintf(n, sizeof n, "%d", a->limit);
  const char *params[] = {t, n};
  if (a->res) /* an attempt run again: its rows were not reported */
    PQclear(a->res);
  a->res = q(tx, ST_OPEN_BEFORE, params, "listing open reservations", err);
  return a->res ? 0 : -err->code;
}

static int
ledger_open_reservations(void *state, int64_t open_for_us, int limit,
                         void (*each)(void *ctx, const eph_ledger_open_t *r), void *ctx,
                         eph_error_t *err)
{
  if (!each || limit < 1 || open_for_us < 0)
    return eph_error_set(
        err, EINVAL, PLUGIN ": open_reservations: each, limit > 0 and open_for_us >= 0 required");
  open_arg_t a = {open_for_us, limit, NULL};
  int r = run_tx(state, 0, NULL, open_body, &a, err);
  /* Reported once the transaction committed, so a retried one never reports a row twice. */
  int rows = r >= 0 && a.res ? PQntuples(a.res) : 0;
  for (int i = 0; i < rows; i++) {
    eph_ledger_open_t o = {.struct_size = sizeof o,
                           .run_id = PQgetvalue(a.res, i, 0),
                           .org = PQgetvalue(a.res, i, 1),
                           .node = PQgetvalue(a.res, i, 2),
                           .reserved_micros = col_i64(a.res, i, 3),
                           .reserved_unix_us = col_i64(a.res, i, 4)};
    each(ctx, &o);
  }
  if (a.res)
    PQclear(a.res);
  return r < 0 ? r : rows;
}

/* ---------------------------------------------------------------- lifecycle */

static void
ledger_close(ledger_t *l)
{
  if (!l)
    return;
  for (size_t i = 0; i < l->n_conns; i++)
    if (l->conns[i].pg)
      PQfinish(l->conns[i].pg);
  free(l->conns);
  pthread_mutex_destroy(&l->lock);
  pthread_cond_destroy(&l->freed);
  free(l->conninfo);
  free(l->display);
  free(l);
}

static int
ledger_init(const eph_host_t *host, const config_setting_t *config, void **state, eph_error_t *err)
{
  const char *db = NULL, *node = NULL;
  int64_t conns = 4, connect_s = 5, stmt_ms = 10000, attempts = 20;
  int require_tls = 1;
  int r;
  if (host->cfg_string && (r = host->cfg_string(config, "database", NULL, &db, err)) < 0)
    return r;
  if (host->cfg_string && (r = host->cfg_string(config, "node_name", NULL, &node, err)) < 0)
    return r;
  if (host->cfg_int &&
      ((r = host->cfg_int(config, "connections", 4, &conns, err)) < 0 ||
       (r = host->cfg_int(config, "connect_timeout_s", 5, &connect_s, err)) < 0 ||
       (r = host->cfg_int(config, "statement_timeout_ms", 10000, &stmt_ms, err)) < 0 ||
       (r = host->cfg_int(config, "max_attempts", 20, &attempts, err)) < 0))
    return r;
  if (host->cfg_bool && (r = host->cfg_bool(config, "require_tls", 1, &require_tls, err)) < 0)
    return r;
  /* The core's own database and node name unless the block overrides them (ABI 1.2 host
   * fields: an older core has none). */
  bool have_core = EPH_HOST_HAS_DATABASE(host);
  bool own_db = db && *db;
  if (!own_db && have_core)
    db = host->database;
  if ((!node || !*node) && have_core)
    node = host->node_name;
  if (!db || !*db)
    return eph_error_set(err, EPH_E_CONFIG,
                         PLUGIN ": key 'database' is not set and the core's `database` is not "
                                "a PostgreSQL database: set `database` in ephemeral.conf (the "
                                "ledger then shares it) or give the ledger's own as a libpq URI "
                                "(postgresql://user@host/dbname) in this block");
  const char *source = own_db ? "key 'database'" : "the core's `database`";
  if (require_tls && (r = check_transport(db, source, err)) < 0)
    return r;
  /* connections, connect_timeout_s, statement_timeout_ms and max_attempts are within their
   * rows' ranges: the host refuses a value outside (file:line) before init and in cfg_int. */

  ledger_t *l = calloc(1, sizeof *l);
  if (!l)
    return eph_error_set(err, ENOMEM, PLUGIN ": out of memory");
  pthread_mutex_init(&l->lock, NULL);
  pthread_cond_init(&l->freed, NULL);
  l->host = host;
  l->connect_timeout_s = connect_s;
  l->statement_timeout_ms = stmt_ms;
  l->max_attempts = attempts;
  l->require_tls = require_tls != 0;
  l->conninfo = strdup(db);
  l->db_source = source;
  l->display = display_name(db);
  l->conns = calloc((size_t)conns, sizeof *l->conns);
  if (!l->conninfo || !l->conns) {
    ledger_close(l);
    return eph_error_set(err, ENOMEM, PLUGIN ": out of memory");
  }
  l->n_conns = (size_t)conns;
  if (!l->display) {
    ledger_close(l);
    /* Not echoed: a malformed URI may still hold a password. */
    return eph_error_set(err, EPH_E_CONFIG,
                         PLUGIN ": %s: not a libpq connection URI or key=value string", source);
  }
  if (node && *node) {
    eph_error_t why = {0};
    if (eph_ledger_check_name("node_name", node, &why) < 0) {
      ledger_close(l);
      return eph_error_set(err, EPH_E_CONFIG, PLUGIN ": key %s", why.message);
    }
    snprintf(l->node, sizeof l->node, "%s", node);
  } else if (gethostname(l->node, sizeof l->node - 1) < 0 || !l->node[0]) {
    snprintf(l->node, sizeof l->node, "localhost");
  }
  /* Connect now: an unreachable database is an error at start naming the setting, not a
   * failure of the first run. */
  if ((r = migrate(l, err)) < 0) {
    ledger_close(l);
    return r;
  }
  *state = l;
  return 0;
}

EPH_LEDGER_PLUGIN(PLUGIN,
                  "Append-only ledger of organisations, reservations and charges in PostgreSQL");
