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
 * operations on one reservation queue rather than abort each other (see run_tx).
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

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include <ephemeral/plugin.h>

#define PLUGIN "ledger-postgres"
#define SCHEMA_VERSION 1
#define MAX_NAME_BYTES 128 /* org, run_id and node_name */
#define MAX_MEMO_BYTES 256 /* longer memos are cut at a UTF-8 boundary */
/* pg_advisory_xact_lock key of the schema migration: "ephl" */
#define MIGRATION_LOCK_KEY "1701865580"

/* The schema check runs under the advisory lock, so several nodes starting at once migrate
 * one after the other; the second finds the version written and does nothing. */
static const char schema_head[] =
  "CREATE SCHEMA IF NOT EXISTS ledger;"
  "CREATE TABLE IF NOT EXISTS ledger.schema_version ("
  "  one boolean PRIMARY KEY DEFAULT true CHECK (one),"
  "  version integer NOT NULL"
  ");";

static const char schema_v1[] =
  "CREATE TABLE ledger.organisations ("
  "  org text PRIMARY KEY,"
  "  credited_micros bigint NOT NULL DEFAULT 0 CHECK (credited_micros >= 0),"
  "  balance_micros bigint NOT NULL DEFAULT 0 CHECK (balance_micros >= 0),"
  "  created_us bigint NOT NULL"
  ");"
  "CREATE TABLE ledger.reservations ("
  "  run_id text PRIMARY KEY,"
  "  org text NOT NULL REFERENCES ledger.organisations(org),"
  "  node text NOT NULL,"
  "  reserved_micros bigint NOT NULL CHECK (reserved_micros > 0),"
  "  billed_micros bigint NOT NULL DEFAULT 0,"
  "  model_micros bigint NOT NULL DEFAULT 0 CHECK (model_micros >= 0),"
  "  web_micros bigint NOT NULL DEFAULT 0 CHECK (web_micros >= 0),"
  "  compute_micros bigint NOT NULL DEFAULT 0 CHECK (compute_micros >= 0),"
  "  released_micros bigint NOT NULL DEFAULT 0 CHECK (released_micros >= 0),"
  "  settled smallint NOT NULL DEFAULT 0 CHECK (settled IN (0, 1)),"
  "  CHECK (billed_micros >= 0 AND billed_micros <= reserved_micros),"
  "  CHECK (billed_micros = model_micros + web_micros + compute_micros),"
  "  CHECK ((settled = 0 AND released_micros = 0) OR"
  "         (settled = 1 AND billed_micros + released_micros = reserved_micros))"
  ");"
  "CREATE INDEX reservations_open ON ledger.reservations(node) WHERE settled = 0;"
  "CREATE TABLE ledger.entries ("
  "  seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
  "  t_us bigint NOT NULL,"
  "  org text NOT NULL REFERENCES ledger.organisations(org),"
  "  run_id text,"
  "  node text NOT NULL,"
  "  kind text NOT NULL CHECK (kind IN ('credit', 'reserve', 'charge', 'settle')),"
  "  category text CHECK (category IN ('model', 'web', 'compute')),"
  "  micros bigint NOT NULL CHECK (micros >= 0),"
  "  memo text,"
  "  CHECK ((kind = 'charge') = (category IS NOT NULL)),"
  "  CHECK ((kind = 'credit') = (run_id IS NULL)),"
  "  CHECK (kind NOT IN ('credit', 'reserve') OR micros > 0)"
  ");"
  "CREATE INDEX entries_run ON ledger.entries(run_id) WHERE run_id IS NOT NULL;"
  "CREATE UNIQUE INDEX entries_one_reserve ON ledger.entries(run_id) WHERE kind = 'reserve';"
  "CREATE UNIQUE INDEX entries_one_settle ON ledger.entries(run_id) WHERE kind = 'settle';"
  "CREATE TABLE ledger.probe ("
  "  id integer PRIMARY KEY CHECK (id = 1),"
  "  t_us bigint NOT NULL"
  ");"
  /* The journal is append-only. */
  "CREATE FUNCTION ledger.refuse_change() RETURNS trigger LANGUAGE plpgsql"
  "  SET search_path = pg_catalog, pg_temp AS $$"
  "BEGIN"
  "  RAISE EXCEPTION 'ledger entries are append-only: % refused', TG_OP"
  "    USING ERRCODE = 'check_violation';"
  "END $$;"
  "CREATE TRIGGER entries_append_only BEFORE UPDATE OR DELETE ON ledger.entries"
  "  FOR EACH ROW EXECUTE FUNCTION ledger.refuse_change();"
  "CREATE TRIGGER entries_no_truncate BEFORE TRUNCATE ON ledger.entries"
  "  FOR EACH STATEMENT EXECUTE FUNCTION ledger.refuse_change();"
  /* The derived tables are written only by the journal's trigger: ledger.apply_entry runs
   * as the schema's owner (SECURITY DEFINER, fixed search_path) one level down (depth 2).
   * A runtime role that is not the owner cannot write them in any other way, not even from
   * a trigger of its own (it would run as itself). The one direct write allowed is
   * creating an empty organisation. */
  "CREATE FUNCTION ledger.derived_only() RETURNS trigger LANGUAGE plpgsql"
  "  SET search_path = pg_catalog, pg_temp AS $$"
  "BEGIN"
  "  IF TG_OP = 'INSERT' AND TG_TABLE_NAME = 'organisations' THEN"
  "    IF NEW.credited_micros = 0 AND NEW.balance_micros = 0 THEN"
  "      RETURN NEW;"
  "    END IF;"
  "  END IF;"
  "  IF TG_OP IN ('DELETE', 'TRUNCATE') OR pg_trigger_depth() < 2"
  "     OR current_user <> (SELECT r.rolname FROM pg_class c"
  "                         JOIN pg_roles r ON r.oid = c.relowner WHERE c.oid = TG_RELID) THEN"
  "    RAISE EXCEPTION 'ledger.% is derived from the journal: % refused', TG_TABLE_NAME, TG_OP"
  "      USING ERRCODE = 'check_violation';"
  "  END IF;"
  "  RETURN NEW;"
  "END $$;"
  "CREATE TRIGGER organisations_derived BEFORE INSERT OR UPDATE OR DELETE"
  "  ON ledger.organisations FOR EACH ROW EXECUTE FUNCTION ledger.derived_only();"
  "CREATE TRIGGER organisations_no_truncate BEFORE TRUNCATE ON ledger.organisations"
  "  FOR EACH STATEMENT EXECUTE FUNCTION ledger.derived_only();"
  "CREATE TRIGGER reservations_derived BEFORE INSERT OR UPDATE OR DELETE"
  "  ON ledger.reservations FOR EACH ROW EXECUTE FUNCTION ledger.derived_only();"
  "CREATE TRIGGER reservations_no_truncate BEFORE TRUNCATE ON ledger.reservations"
  "  FOR EACH STATEMENT EXECUTE FUNCTION ledger.derived_only();"
  /* Derived state, maintained by the same INSERT. */
  "CREATE FUNCTION ledger.apply_entry() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER"
  "  SET search_path = pg_catalog, pg_temp AS $$"
  "BEGIN"
  "  IF NEW.kind = 'credit' THEN"
  "    UPDATE ledger.organisations SET credited_micros = credited_micros + NEW.micros,"
  "      balance_micros = balance_micros + NEW.micros WHERE org = NEW.org;"
  "  ELSIF NEW.kind = 'reserve' THEN"
  "    INSERT INTO ledger.reservations(run_id, org, node, reserved_micros)"
  "      VALUES (NEW.run_id, NEW.org, NEW.node, NEW.micros);"
  "    UPDATE ledger.organisations SET balance_micros = balance_micros - NEW.micros"
  "      WHERE org = NEW.org;"
  "  ELSIF NEW.kind = 'charge' THEN"
  "    UPDATE ledger.reservations SET billed_micros = billed_micros + NEW.micros,"
  "      model_micros = model_micros"
  "        + (CASE NEW.category WHEN 'model' THEN NEW.micros ELSE 0 END),"
  "      web_micros = web_micros + (CASE NEW.category WHEN 'web' THEN NEW.micros ELSE 0 END),"
  "      compute_micros = compute_micros"
  "        + (CASE NEW.category WHEN 'compute' THEN NEW.micros ELSE 0 END)"
  "      WHERE run_id = NEW.run_id AND org = NEW.org AND settled = 0;"
  "    IF NOT FOUND THEN"
  "      RAISE EXCEPTION 'ledger: charge on a missing or settled reservation'"
  "        USING ERRCODE = 'check_violation';"
  "    END IF;"
  "  ELSIF NEW.kind = 'settle' THEN"
  "    UPDATE ledger.reservations SET settled = 1, released_micros = NEW.micros"
  "      WHERE run_id = NEW.run_id AND org = NEW.org AND settled = 0"
  "        AND reserved_micros - billed_micros = NEW.micros;"
  "    IF NOT FOUND THEN"
  "      RAISE EXCEPTION 'ledger: settle must release exactly reserved - billed'"
  "        USING ERRCODE = 'check_violation';"
  "    END IF;"
  "    UPDATE ledger.organisations SET balance_micros = balance_micros + NEW.micros"
  "      WHERE org = NEW.org;"
  "  END IF;"
  "  RETURN NULL;"
  "END $$;"
  "CREATE TRIGGER entries_apply AFTER INSERT ON ledger.entries"
  "  FOR EACH ROW EXECUTE FUNCTION ledger.apply_entry();";

enum {
  ST_ORG_ENSURE,
  ST_ORG_GET,
  ST_ORG_LOCK,
  ST_RES_GET,
  ST_RES_LOCK,
  ST_ENTRY_ADD,
  ST_OPEN_LIST,
  ST_RES_ORG,
  ST_PROBE,
  ST_COUNT
};

static const struct {
  const char *sql;
  int params;
} statements[ST_COUNT] = {
  [ST_ORG_ENSURE] = {"INSERT INTO ledger.organisations(org, created_us) VALUES ($1, $2)"
                     " ON CONFLICT (org) DO NOTHING", 2},
  [ST_ORG_GET] = {"SELECT credited_micros, balance_micros FROM ledger.organisations"
                  " WHERE org = $1", 1},
  [ST_ORG_LOCK] = {"SELECT credited_micros, balance_micros FROM ledger.organisations"
                   " WHERE org = $1 FOR NO KEY UPDATE", 1},
  [ST_RES_GET] = {"SELECT org, reserved_micros, billed_micros, released_micros, model_micros,"
                  " web_micros, compute_micros, settled FROM ledger.reservations"
                  " WHERE run_id = $1", 1},
  [ST_RES_LOCK] = {"SELECT org, reserved_micros, billed_micros, released_micros, model_micros,"
                   " web_micros, compute_micros, settled FROM ledger.reservations"
                   " WHERE run_id = $1 FOR NO KEY UPDATE", 1},
  [ST_ENTRY_ADD] = {"INSERT INTO ledger.entries(t_us, org, run_id, node, kind, category, micros,"
                    " memo) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)", 8},
  [ST_RES_ORG] = {"SELECT org FROM ledger.reservations WHERE run_id = $1", 1},
  [ST_OPEN_LIST] = {"SELECT run_id FROM ledger.reservations WHERE settled = 0 AND node = $1"
                    " ORDER BY run_id", 1},
  [ST_PROBE] = {"INSERT INTO ledger.probe(id, t_us) VALUES (1, $1)"
                " ON CONFLICT (id) DO UPDATE SET t_us = excluded.t_us", 1},
};

typedef struct conn {
  PGconn *pg;
  bool ready; /* connected, session set up and statements prepared */
  bool busy;
} conn_t;

typedef struct ledger {
  const eph_host_t *host;
  char *conninfo; /* the `database` value: may hold a password, never logged */
  char *display;  /* the same without its password, for messages */
  char node[MAX_NAME_BYTES + 1];
  int64_t connect_timeout_s, statement_timeout_ms, max_attempts;
  bool require_tls;
  pthread_mutex_t lock; /* guards conns[].busy */
  pthread_cond_t freed;
  size_t n_conns;
  conn_t *conns;
} ledger_t;

/* One operation's transaction on one pooled connection. */
typedef struct tx {
  ledger_t *l;
  conn_t *c;
  char sqlstate[6]; /* of the last failed statement; "" when none or no server answer */
  bool retry;       /* serialization failure or deadlock: run the transaction again */
  bool lost;        /* the connection broke */
  bool commit_sent;
} tx_t;

typedef struct reservation {
  char org[MAX_NAME_BYTES + 1];
  eph_ledger_totals_t t;
} reservation_t;

static const eph_config_key_t ledger_keys[] = {
  {"database", EPH_CFG_STRING, "(none: required)", NULL,
   "The PostgreSQL database of the ledger: a libpq connection URI "
   "(postgresql://user@host/db?sslmode=verify-full) or key=value string. Prefer a password "
   "in ~/.pgpass or PGPASSFILE to one written here."},
  {"node_name", EPH_CFG_STRING, "\"<hostname>\"", NULL,
   "This host's name in the ledger: reservations record it, and settle_open settles only "
   "this node's open reservations. Must differ between nodes sharing the database."},
  {"connections", EPH_CFG_INT, "4", NULL,
   "Connections in the plugin's pool; an operation holds one for its transaction."},
  {"connect_timeout_s", EPH_CFG_INT, "5", "seconds",
   "How long connecting (or reconnecting) waits for the server (a connect_timeout in the "
   "URI wins)."},
  {"statement_timeout_ms", EPH_CFG_INT, "10000", "ms",
   "A statement running longer (a lock held by a stuck client) is cancelled and the "
   "operation fails with EBUSY."},
  {"require_tls", EPH_CFG_BOOL, "true", NULL,
   "Refuse a `database` that reaches a host other than a Unix socket or loopback without "
   "sslmode=verify-full: money and credentials would cross the network readable and "
   "alterable."},
  {"max_attempts", EPH_CFG_INT, "20", NULL,
   "How many times a transaction aborted by a serialization failure or a deadlock is run "
   "before the operation fails with EBUSY."},
  {0},
};

static int64_t
wall_us(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static const char *
cost_name(eph_cost_t c)
{
  switch (c) {
  case EPH_COST_MODEL:
    return "model";
  case EPH_COST_WEB:
    return "web";
  case EPH_COST_COMPUTE:
    return "compute";
  }
  return NULL;
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when it is not one. PostgreSQL
 * refuses invalid UTF-8 in text; SQLite stores it. */
static size_t
utf8_seq(const unsigned char *s)
{
  unsigned char c = s[0];
  if (c < 0x80)
    return 1;
  size_t n = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
  if (n == 0 || (n == 2 && c < 0xC2) || (n == 4 && c > 0xF4))
    return 0;
  for (size_t i = 1; i < n; i++)
    if ((s[i] & 0xC0) != 0x80)
      return 0;
  if ((n == 3 && c == 0xE0 && s[1] < 0xA0) || (n == 3 && c == 0xED && s[1] >= 0xA0) ||
      (n == 4 && c == 0xF0 && s[1] < 0x90) || (n == 4 && c == 0xF4 && s[1] >= 0x90))
    return 0; /* overlong, surrogate, past U+10FFFF */
  return n;
}

static bool
utf8_valid(const char *s)
{
  for (const unsigned char *p = (const unsigned char *)s; *p;) {
    size_t n = utf8_seq(p);
    if (!n)
      return false;
    p += n;
  }
  return true;
}

static int
check_name(const char *what, const char *s, eph_error_t *err)
{
  if (!s || !*s)
    return eph_error_set(err, EINVAL, "%s: empty", what);
  if (strlen(s) > MAX_NAME_BYTES)
    return eph_error_set(err, EINVAL, "%s: longer than %d bytes", what, MAX_NAME_BYTES);
  if (!utf8_valid(s))
    return eph_error_set(err, EINVAL, "%s: not valid UTF-8", what);
  return 0;
}

/* The memo as stored: at most MAX_MEMO_BYTES, cut at a character boundary, each invalid
 * byte replaced by '?' (a memo is a note; it must never make a charge fail). */
static void
memo_clean(const char *memo, char out[MAX_MEMO_BYTES + 1])
{
  size_t o = 0;
  const unsigned char *p = (const unsigned char *)memo;
  while (*p) {
    size_t n = utf8_seq(p);
    if (n == 0) {
      if (o + 1 > MAX_MEMO_BYTES)
        break;
      out[o++] = '?';
      p++;
      continue;
    }
    if (o + n > MAX_MEMO_BYTES)
      break;
    memcpy(out + o, p, n);
    o += n;
    p += n;
  }
  out[o] = '\0';
}

/* ---------------------------------------------------------------- errors */

static void
trim_newline(char *s)
{
  size_t n = strlen(s);
  while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == ' '))
    s[--n] = '\0';
}

/* Records a failed statement in tx and err. SQLSTATE to code: 40001/40P01 retried by
 * run_tx; class 08 or a broken connection -EIO ("unreachable"); 53100 -ENOSPC; 57014
 * (statement_timeout) and 55P03 -EBUSY; 22003 -EOVERFLOW; class 23 and raised exceptions
 * (a schema CHECK or trigger refused what the C checks let through: a bug or a foreign
 * writer) -EINVAL; anything else -EIO. */
static int
pg_fail(tx_t *tx, const PGresult *res, const char *what, eph_error_t *err)
{
  ledger_t *l = tx->l;
  const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
  snprintf(tx->sqlstate, sizeof tx->sqlstate, "%s", state ? state : "");
  /* No SQLSTATE: libpq's own failure (the server closed the connection, a socket error). */
  bool lost = PQstatus(tx->c->pg) == CONNECTION_BAD || strncmp(tx->sqlstate, "08", 2) == 0 ||
              !tx->sqlstate[0];
  tx->lost = tx->lost || lost;
  tx->retry = strcmp(tx->sqlstate, "40001") == 0 || strcmp(tx->sqlstate, "40P01") == 0;
  int code = lost                                       ? EIO
             : strcmp(tx->sqlstate, "53100") == 0       ? ENOSPC
             : strcmp(tx->sqlstate, "57014") == 0       ? EBUSY
             : strcmp(tx->sqlstate, "55P03") == 0       ? EBUSY
             : tx->retry                                ? EBUSY
             : strcmp(tx->sqlstate, "22003") == 0       ? EOVERFLOW
             : strncmp(tx->sqlstate, "23", 2) == 0      ? EINVAL
             : strcmp(tx->sqlstate, "P0001") == 0       ? EINVAL
                                                        : EIO;
  char msg[512];
  snprintf(msg, sizeof msg, "%s",
           res && *PQresultErrorMessage(res) ? PQresultErrorMessage(res)
                                             : PQerrorMessage(tx->c->pg));
  trim_newline(msg);
  if (lost)
    return eph_error_set(err, code, PLUGIN ": database %s unreachable while %s%s: %s",
                         l->display, what,
                         tx->commit_sent ? " (the commit's outcome is unknown until the run "
                                           "is settled)"
                                         : "",
                         msg);
  return eph_error_set(err, code, PLUGIN ": %s: %s: %s%s%s%s", l->display, what, msg,
                       tx->sqlstate[0] ? " (SQLSTATE " : "", tx->sqlstate,
                       tx->sqlstate[0] ? ")" : "");
}

/* ---------------------------------------------------------------- connections */

static bool
host_is_local(const char *h, size_t n)
{
  if (n == 0 || h[0] == '/' || h[0] == '@') /* none: libpq's Unix socket; a socket dir */
    return true;
  if ((n == 9 && strncmp(h, "localhost", 9) == 0) || (n == 3 && strncmp(h, "::1", 3) == 0))
    return true;
  /* 127/8 as an address only: "127.db.example.com" is a name anyone's DNS can point
   * anywhere (a prefix test let it skip TLS). */
  char a[INET_ADDRSTRLEN];
  struct in_addr in;
  if (n >= sizeof a)
    return false;
  memcpy(a, h, n);
  a[n] = '\0';
  return inet_pton(AF_INET, a, &in) == 1 && (ntohl(in.s_addr) >> 24) == 127;
}

/* With require_tls: every host the conninfo (or PGHOST/PGHOSTADDR) names is local, or the
 * sslmode (or PGSSLMODE) is verify-full. Checked before any connection is attempted. */
static int
check_transport(const char *conninfo, eph_error_t *err)
{
  char *errmsg = NULL;
  PQconninfoOption *opts = PQconninfoParse(conninfo, &errmsg);
  if (!opts) {
    PQfreemem(errmsg);
    return eph_error_set(err, EPH_E_CONFIG,
                         PLUGIN ": key 'database': not a libpq connection URI or key=value "
                         "string");
  }
  const char *host = getenv("PGHOST"), *hostaddr = getenv("PGHOSTADDR");
  const char *mode = getenv("PGSSLMODE");
  for (PQconninfoOption *o = opts; o->keyword; o++) {
    if (!o->val || !*o->val)
      continue;
    if (strcmp(o->keyword, "host") == 0)
      host = o->val;
    else if (strcmp(o->keyword, "hostaddr") == 0)
      hostaddr = o->val;
    else if (strcmp(o->keyword, "sslmode") == 0)
      mode = o->val;
  }
  int r = 0;
  bool verified = mode && strcmp(mode, "verify-full") == 0;
  const char *lists[] = {host, hostaddr};
  for (size_t i = 0; i < 2 && r == 0 && !verified; i++) {
    for (const char *p = lists[i]; p && *p && r == 0;) {
      size_t n = strcspn(p, ",");
      if (!host_is_local(p, n))
        r = eph_error_set(err, EPH_E_CONFIG,
                          PLUGIN ": key 'database': host '%.*s' is not local and sslmode is "
                          "'%s': the ledger's traffic and credentials could be read or altered "
                          "on the network; add sslmode=verify-full (with the server's CA in "
                          "sslrootcert), or set require_tls = false",
                          (int)n, p, mode ? mode : "prefer");
      p += n + (p[n] == ',');
    }
  }
  PQconninfoFree(opts);
  return r;
}

/* "host=... port=... dbname=... user=..." from the conninfo, without the password. */
static char *
display_name(const char *conninfo)
{
  char *errmsg = NULL;
  PQconninfoOption *opts = PQconninfoParse(conninfo, &errmsg);
  if (!opts) {
    PQfreemem(errmsg);
    return NULL;
  }
  char buf[512] = "";
  size_t used = 0;
  static const char *const shown[] = {"host", "hostaddr", "port", "dbname", "user"};
  for (PQconninfoOption *o = opts; o->keyword; o++) {
    if (!o->val || !*o->val)
      continue;
    for (size_t i = 0; i < sizeof shown / sizeof shown[0]; i++)
      if (strcmp(o->keyword, shown[i]) == 0 && used < sizeof buf) {
        int w = snprintf(buf + used, sizeof buf - used, "%s%s=%s", used ? " " : "", o->keyword,
                         o->val);
        used += w > 0 ? (size_t)w : 0;
      }
  }
  PQconninfoFree(opts);
  char *out = NULL;
  if (asprintf(&out, "'%s'", used ? buf : "(libpq defaults)") < 0)
    return NULL;
  return out;
}

static int
prepare_all(tx_t *tx, bool statements_too, eph_error_t *err)
{
  PGconn *pg = tx->c->pg;
  char setup[256];
  /* UTC and a fixed statement timeout: the session is ours alone. search_path is
   * pg_catalog only (before the statements are prepared: names resolve then): every table
   * is schema-qualified, and an `options=-c search_path=...` in `database` or a role's
   * default must not put another user's schema before pg_catalog, whose `=` would then run
   * as this role in every WHERE (red3: it forged a credit). */
  snprintf(setup, sizeof setup,
           "DEALLOCATE ALL; SET search_path = pg_catalog; SET statement_timeout = %" PRId64
           "; SET TIME ZONE 'UTC'; SET client_encoding = 'UTF8'",
           tx->l->statement_timeout_ms);
  PGresult *res = PQexec(pg, setup);
  if (PQresultStatus(res) != PGRES_COMMAND_OK) {
    int r = pg_fail(tx, res, "setting up the session", err);
    PQclear(res);
    return r;
  }
  PQclear(res);
  for (int i = 0; statements_too && i < ST_COUNT; i++) {
    char name[8];
    snprintf(name, sizeof name, "l%d", i);
    res = PQprepare(pg, name, statements[i].sql, statements[i].params, NULL);
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
      int r = pg_fail(tx, res, "preparing a statement", err);
      PQclear(res);
      return r;
    }
    PQclear(res);
  }
  return 0;
}

/* Server notices (NOTICE, WARNING) are not errors: libpq's default prints them on stderr. */
static void
notice_quiet(void *arg, const char *message)
{
  (void)arg;
  (void)message;
}

static PGconn *
connect_db(ledger_t *l)
{
  char timeout[24];
  snprintf(timeout, sizeof timeout, "%" PRId64, l->connect_timeout_s);
  /* Keywords before "dbname" are defaults the URI may override; after it, ours win. */
  const char *const keys[] = {"connect_timeout", "fallback_application_name", "dbname", NULL};
  const char *const vals[] = {timeout, "ephemeral-ledger", l->conninfo, NULL};
  PGconn *pg = PQconnectdbParams(keys, vals, 1);
  if (pg)
    PQsetNoticeProcessor(pg, notice_quiet, NULL);
  return pg;
}

/* Makes c usable: connects or resets a broken connection, sets up the session and (unless
 * `connect_only`: the schema may not exist yet) prepares the statements. */
static int
conn_connect(tx_t *tx, bool connect_only, eph_error_t *err)
{
  conn_t *c = tx->c;
  if (c->ready && PQstatus(c->pg) == CONNECTION_OK &&
      PQtransactionStatus(c->pg) == PQTRANS_IDLE)
    return 0;
  c->ready = false;
  if (c->pg && PQstatus(c->pg) == CONNECTION_OK && PQtransactionStatus(c->pg) != PQTRANS_IDLE) {
    PGresult *res = PQexec(c->pg, "ROLLBACK");
    PQclear(res);
  }
  if (!c->pg)
    c->pg = connect_db(tx->l);
  else if (PQstatus(c->pg) != CONNECTION_OK)
    PQreset(c->pg);
  if (!c->pg)
    return eph_error_set(err, ENOMEM, PLUGIN ": out of memory connecting");
  if (PQstatus(c->pg) != CONNECTION_OK) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", PQerrorMessage(c->pg));
    trim_newline(msg);
    tx->lost = true;
    return eph_error_set(err, EIO, PLUGIN ": key 'database': cannot connect to %s: %s",
                         tx->l->display, msg);
  }
  /* The connection as made (a service file or the environment may have chosen the host):
   * the same rule as check_transport, on what libpq actually connected to. */
  if (tx->l->require_tls) {
    const char *h = PQhost(c->pg);
    const char *mode = NULL;
    PQconninfoOption *opts = PQconninfo(c->pg);
    for (PQconninfoOption *o = opts; o && o->keyword; o++)
      if (strcmp(o->keyword, "sslmode") == 0)
        mode = o->val;
    bool ok = host_is_local(h ? h : "", h ? strlen(h) : 0) ||
              (PQsslInUse(c->pg) && mode && strcmp(mode, "verify-full") == 0);
    char shown[256];
    snprintf(shown, sizeof shown, "%s", h ? h : "");
    PQconninfoFree(opts);
    if (!ok) {
      PQfinish(c->pg);
      c->pg = NULL;
      return eph_error_set(err, EPH_E_CONFIG,
                           PLUGIN ": key 'database': connected to host '%s' without "
                           "sslmode=verify-full; refused (require_tls)",
                           shown);
    }
  }
  int r = prepare_all(tx, !connect_only, err);
  if (r < 0)
    return r;
  c->ready = !connect_only;
  return 0;
}

static int
conn_ready(tx_t *tx, eph_error_t *err)
{
  return conn_connect(tx, false, err);
}

static conn_t *
checkout(ledger_t *l)
{
  pthread_mutex_lock(&l->lock);
  for (;;) {
    for (size_t i = 0; i < l->n_conns; i++)
      if (!l->conns[i].busy) {
        l->conns[i].busy = true;
        pthread_mutex_unlock(&l->lock);
        return &l->conns[i];
      }
    pthread_cond_wait(&l->freed, &l->lock);
  }
}

static void
checkin(ledger_t *l, conn_t *c)
{
  pthread_mutex_lock(&l->lock);
  c->busy = false;
  pthread_cond_signal(&l->freed);
  pthread_mutex_unlock(&l->lock);
}

/* ---------------------------------------------------------------- statements */

/* Runs prepared statement `which` with text parameters (NULL = SQL NULL). Returns the
 * result (caller PQclear()s) or NULL after filling err. */
static PGresult *
q(tx_t *tx, int which, const char *const *params, const char *what, eph_error_t *err)
{
  char name[8];
  snprintf(name, sizeof name, "l%d", which);
  PGresult *res =
    PQexecPrepared(tx->c->pg, name, statements[which].params, params, NULL, NULL, 0);
  ExecStatusType s = PQresultStatus(res);
  if (s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK)
    return res;
  pg_fail(tx, res, what, err);
  PQclear(res);
  return NULL;
}

static int
exec_simple(tx_t *tx, const char *sql, eph_error_t *err)
{
  PGresult *res = PQexec(tx->c->pg, sql);
  int r = 0;
  ExecStatusType st = PQresultStatus(res);
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
    r = pg_fail(tx, res, sql, err);
  PQclear(res);
  return r;
}

static int64_t
col_i64(const PGresult *res, int row, int col)
{
  return strtoll(PQgetvalue(res, row, col), NULL, 10);
}

/* Reads one reservation (locked when `lock`). Returns 1 found, 0 absent, negative on error. */
static int
reservation_get(tx_t *tx, const char *run_id, bool lock, reservation_t *out, eph_error_t *err)
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
org_get(tx_t *tx, const char *org, bool lock, int64_t *credited, int64_t *balance,
        eph_error_t *err)
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
entry_add(tx_t *tx, const char *org, const char *run_id, const char *kind,
          const char *category, int64_t micros, const char *memo, eph_error_t *err)
{
  char t[24], m[24], memo_buf[MAX_MEMO_BYTES + 1];
  snprintf(t, sizeof t, "%" PRId64, wall_us());
  snprintf(m, sizeof m, "%" PRId64, micros);
  if (memo)
    memo_clean(memo, memo_buf);
  const char *p[] = {t, org, run_id, tx->l->node, kind, category, m, memo ? memo_buf : NULL};
  PGresult *res = q(tx, ST_ENTRY_ADD, p, "appending a ledger entry", err);
  if (!res)
    return -err->code;
  PQclear(res);
  return 0;
}

/* ---------------------------------------------------------------- transactions */

typedef int (*tx_body_fn)(tx_t *tx, void *arg, eph_error_t *err);

static void
backoff(int attempt)
{
  /* 1, 2, 4 .. 64 ms, each jittered to 50-100 %: the conflicting transactions spread out. */
  long ms = 1L << (attempt < 6 ? attempt : 6);
  unsigned seed = (unsigned)wall_us() ^ (unsigned)(uintptr_t)&attempt;
  long us = ms * 500 + (long)(rand_r(&seed) % (ms * 500 + 1));
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

/* Advisory lock classes: one lock per organisation (credit, reserve) or per run (charge,
 * settle); the second key is a 32-bit FNV-1a hash of the name (a collision only serialises
 * two unrelated operations). */
#define LOCK_ORG 0x65706f /* "epo" */
#define LOCK_RUN 0x657072 /* "epr" */

static int32_t
name_hash(const char *s)
{
  uint32_t h = 2166136261u;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 16777619u;
  return (int32_t)h;
}

/* Sends sql (several statements) and reads every result; the first failure is the error. */
static int
exec_multi(tx_t *tx, const char *sql, const char *what, eph_error_t *err)
{
  if (!PQsendQuery(tx->c->pg, sql))
    return pg_fail(tx, NULL, what, err);
  int r = 0;
  PGresult *res;
  while ((res = PQgetResult(tx->c->pg))) {
    ExecStatusType st = PQresultStatus(res);
    if (r == 0 && st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
      r = pg_fail(tx, res, what, err);
    PQclear(res);
  }
  return r;
}

/* Runs body inside one SERIALIZABLE transaction on a pooled connection: commits when it
 * returns >= 0, rolls back otherwise; runs it again on a serialization failure or deadlock
 * (up to max_attempts) and once more when the connection was lost before COMMIT was sent.
 *
 * lock_name (with lock_class): the session-level advisory lock taken BEFORE the transaction
 * starts, so its snapshot is taken after the previous holder committed. Operations on one
 * run or one organisation then queue instead of aborting each other with serialization
 * failures (which, under contention, retry without bound: one attempt can lose every
 * round). SERIALIZABLE and the row locks still decide correctness; the advisory lock only
 * orders the queue. It is released with the COMMIT or ROLLBACK, and by the server if the
 * connection dies. Returns body's result or the error. */
static int
run_tx_locked(ledger_t *l, int lock_class, const char *lock_name, bool lock_org_too,
              tx_body_fn body, void *arg, eph_error_t *err)
{
  bool reconnected = false;
  char lock_sql[96] = "", end_sql[96];
  if (lock_name)
    snprintf(lock_sql, sizeof lock_sql, "SELECT pg_advisory_lock(%d, %" PRId32 ")", lock_class,
             name_hash(lock_name));
  for (int attempt = 1;; attempt++) {
    tx_t tx = {.l = l, .c = checkout(l)};
    int r = conn_ready(&tx, err);
    bool locked = false;
    if (r >= 0 && lock_name && (r = exec_simple(&tx, lock_sql, err)) >= 0)
      locked = true;
    /* A settle also moves its organisation's balance: it queues behind that organisation's
     * reserves and credits too (run lock first, then org: reserve and credit take only the
     * org lock, so the order has no cycle). The org of a reservation never changes, so
     * reading it outside the transaction is safe. */
    if (r >= 0 && locked && lock_class == LOCK_RUN && lock_org_too) {
      const char *p[] = {lock_name};
      PGresult *res = q(&tx, ST_RES_ORG, p, "reading the reservation's organisation", err);
      if (!res)
        r = -err->code;
      else if (PQntuples(res) == 1) {
        char org_sql[96];
        snprintf(org_sql, sizeof org_sql, "SELECT pg_advisory_lock(%d, %" PRId32 ")", LOCK_ORG,
                 name_hash(PQgetvalue(res, 0, 0)));
        r = exec_simple(&tx, org_sql, err);
      }
      PQclear(res);
    }
    if (r >= 0)
      r = exec_simple(&tx, "BEGIN ISOLATION LEVEL SERIALIZABLE", err);
    if (r >= 0) {
      r = body(&tx, arg, err);
      if (r >= 0) {
        tx.commit_sent = true;
        snprintf(end_sql, sizeof end_sql, "COMMIT%s",
                 locked ? "; SELECT pg_advisory_unlock_all()" : "");
        int c = exec_multi(&tx, end_sql, "COMMIT", err);
        if (c < 0)
          r = c;
        else
          locked = false;
      } else if (!tx.lost) {
        snprintf(end_sql, sizeof end_sql, "ROLLBACK%s",
                 locked ? "; SELECT pg_advisory_unlock_all()" : "");
        if (exec_multi(&tx, end_sql, "ROLLBACK", NULL) == 0)
          locked = false;
      }
    }
    if (locked && !tx.lost) {
      if (PQtransactionStatus(tx.c->pg) != PQTRANS_IDLE)
        exec_simple(&tx, "ROLLBACK", NULL);
      if (exec_simple(&tx, "SELECT pg_advisory_unlock_all()", NULL) < 0)
        tx.lost = true; /* never hand on a connection that may still hold the lock */
    }
    if (tx.lost) {
      /* Dropped, not reset in place: a half-dead session must not keep a lock. */
      PQfinish(tx.c->pg);
      tx.c->pg = NULL;
      tx.c->ready = false;
    }
    checkin(l, tx.c);
    if (r >= 0)
      return r;
    if (tx.retry && attempt < l->max_attempts) {
      backoff(attempt);
      continue;
    }
    if (tx.retry)
      return eph_error_set(err, EBUSY,
                           PLUGIN ": %s: still conflicting with concurrent transactions after "
                           "%d attempts (max_attempts)",
                           l->display, attempt);
    /* Lost before COMMIT: the server rolled the transaction back; reconnect once. */
    if (tx.lost && !tx.commit_sent && !reconnected) {
      reconnected = true;
      attempt--;
      continue;
    }
    return r;
  }
}

static int
run_tx(ledger_t *l, int lock_class, const char *lock_name, tx_body_fn body, void *arg,
       eph_error_t *err)
{
  return run_tx_locked(l, lock_class, lock_name, false, body, arg, err);
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
  snprintf(t, sizeof t, "%" PRId64, wall_us());
  const char *params[] = {a->org, t};
  PGresult *res = q(tx, ST_ORG_ENSURE, params, "creating the organisation", err);
  if (!res)
    return -err->code;
  PQclear(res);
  int64_t credited = 0, balance = 0;
  int r = org_get(tx, a->org, true, &credited, &balance, err);
  if (r < 0)
    return r;
  if (credited > INT64_MAX - a->micros || balance > INT64_MAX - a->micros)
    return eph_error_set(err, EOVERFLOW,
                         "credit: organisation '%s' would pass %" PRId64 " micros", a->org,
                         INT64_MAX);
  return entry_add(tx, a->org, NULL, "credit", NULL, a->micros, NULL, err);
}

static int
ledger_credit(void *state, const char *org, int64_t micros, eph_error_t *err)
{
  int r = check_name("organisation", org, err);
  if (r < 0)
    return r;
  if (micros <= 0)
    return eph_error_set(err, EINVAL, "credit: micros must be positive (got %" PRId64 ")",
                         micros);
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
  int r = check_name("organisation", org, err);
  if (r < 0)
    return r;
  op_arg_t a = {.org = org, .out = micros};
  return run_tx(state, 0, NULL, balance_body, &a, err);
}

static int
reserve_body(tx_t *tx, void *p, eph_error_t *err)
{
  op_arg_t *a = p;
  reservation_t res;
  int64_t balance = 0;
  int r = reservation_get(tx, a->run_id, false, &res, err);
  if (r == 1)
    return eph_error_set(err, EEXIST, "reserve: run %s already has a reservation", a->run_id);
  if (r < 0)
    return r;
  r = org_get(tx, a->org, true, NULL, &balance, err);
  if (r == 0)
    return eph_error_set(err, EPH_E_INSUFFICIENT, "reserve: organisation '%s' has no credit",
                         a->org);
  if (r < 0)
    return r;
  if (balance < a->micros)
    return eph_error_set(err, EPH_E_INSUFFICIENT,
                         "reserve: organisation '%s' has %" PRId64 " micros available, the "
                         "run asks for %" PRId64,
                         a->org, balance, a->micros);
  r = entry_add(tx, a->org, a->run_id, "reserve", NULL, a->micros, NULL, err);
  /* Another node reserved the same run between our read and our insert. */
  if (r < 0 && strcmp(tx->sqlstate, "23505") == 0)
    return eph_error_set(err, EEXIST, "reserve: run %s already has a reservation", a->run_id);
  return r;
}

static int
ledger_reserve(void *state, const char *org, const char *run_id, int64_t micros,
               eph_error_t *err)
{
  int r = check_name("organisation", org, err);
  if (r < 0 || (r = check_name("run_id", run_id, err)) < 0)
    return r;
  if (micros <= 0)
    return eph_error_set(err, EINVAL, "reserve: micros must be positive (got %" PRId64 ")",
                         micros);
  op_arg_t a = {.org = org, .run_id = run_id, .micros = micros};
  return run_tx(state, LOCK_ORG, org, reserve_body, &a, err);
}

static int
charge_body(tx_t *tx, void *p, eph_error_t *err)
{
  op_arg_t *a = p;
  reservation_t res;
  int r = reservation_get(tx, a->run_id, true, &res, err);
  if (r < 0)
    return r;
  if (r == 0)
    return eph_error_set(err, ENOENT, "charge: run %s has no reservation", a->run_id);
  if (res.t.settled)
    return eph_error_set(err, EALREADY, "charge: run %s is already settled", a->run_id);
  /* Written as a subtraction so it cannot overflow: both sides are within [0, reserved]. */
  if (a->micros > res.t.reserved_micros - res.t.billed_micros)
    return eph_error_set(err, EPH_E_BUDGET,
                         "charge: %" PRId64 " micros of %s would pass the reservation of run "
                         "%s (%" PRId64 " of %" PRId64 " micros billed)",
                         a->micros, a->category, a->run_id, res.t.billed_micros,
                         res.t.reserved_micros);
  return entry_add(tx, res.org, a->run_id, "charge", a->category, a->micros, a->memo, err);
}

static int
ledger_charge(void *state, const char *run_id, eph_cost_t category, int64_t micros,
              const char *memo, eph_error_t *err)
{
  int r = check_name("run_id", run_id, err);
  if (r < 0)
    return r;
  const char *cat = cost_name(category);
  if (!cat)
    return eph_error_set(err, EINVAL, "charge: unknown cost category %d", (int)category);
  if (micros < 0)
    return eph_error_set(err, EINVAL, "charge: micros must not be negative (got %" PRId64 ")",
                         micros);
  op_arg_t a = {.run_id = run_id, .category = cat, .micros = micros, .memo = memo};
  return run_tx(state, LOCK_RUN, run_id, charge_body, &a, err);
}

/* Settles inside an open transaction. Returns 1 when it settled now, 0 when it already was
 * settled, negative on error. */
static int
settle_locked(tx_t *tx, const char *run_id, eph_ledger_totals_t *totals, eph_error_t *err)
{
  reservation_t res;
  int r = reservation_get(tx, run_id, true, &res, err);
  if (r < 0)
    return r;
  if (r == 0)
    return eph_error_set(err, ENOENT, "settle: run %s has no reservation", run_id);
  if (!res.t.settled) {
    int64_t released = res.t.reserved_micros - res.t.billed_micros;
    if ((r = entry_add(tx, res.org, run_id, "settle", NULL, released, NULL, err)) < 0)
      return r;
    res.t.released_micros = released;
    res.t.settled = 1;
    r = 1;
  }
  if (totals)
    *totals = res.t;
  return r;
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
  int r = check_name("run_id", run_id, err);
  if (r < 0)
    return r;
  op_arg_t a = {.run_id = run_id, .totals = totals};
  return run_tx_locked(state, LOCK_RUN, run_id, true, settle_body, &a, err);
}

static int
totals_body(tx_t *tx, void *p, eph_error_t *err)
{
  op_arg_t *a = p;
  reservation_t res;
  int r = reservation_get(tx, a->run_id, false, &res, err);
  if (r < 0)
    return r;
  if (r == 0)
    return eph_error_set(err, ENOENT, "totals: run %s has no reservation", a->run_id);
  *a->totals = res.t;
  return 0;
}

static int
ledger_totals(void *state, const char *run_id, eph_ledger_totals_t *totals, eph_error_t *err)
{
  int r = check_name("run_id", run_id, err);
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
                 "settled %d reservation(s) node '%s' left open in an earlier process",
                 settled, l->node);
  return settled;
}

static int
probe_body(tx_t *tx, void *p, eph_error_t *err)
{
  (void)p;
  char t[24];
  snprintf(t, sizeof t, "%" PRId64, wall_us());
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

/* Creates or checks the schema in one transaction under a transaction-level advisory lock,
 * so nodes starting together migrate one at a time. */
static int
migrate(ledger_t *l, eph_error_t *err)
{
  tx_t tx = {.l = l, .c = checkout(l)};
  int r = conn_connect(&tx, true, err);
  if (r >= 0)
    r = exec_simple(&tx, "BEGIN", err);
  if (r >= 0)
    r = exec_simple(&tx, "SELECT pg_advisory_xact_lock(" MIGRATION_LOCK_KEY ")", err);
  /* Read before any DDL: a runtime role without CREATE on the database (see the README)
   * starts on a schema its owner migrated; CREATE ... IF NOT EXISTS would still need it. */
  int version = 0;
  if (r >= 0) {
    PGresult *res = PQexec(tx.c->pg,
                           "SELECT CASE WHEN to_regclass('ledger.schema_version') IS NULL"
                           " THEN 0 ELSE -1 END");
    if (PQresultStatus(res) != PGRES_TUPLES_OK)
      r = pg_fail(&tx, res, "looking for the ledger schema", err);
    else
      version = (int)col_i64(res, 0, 0);
    PQclear(res);
  }
  if (r >= 0 && version < 0) {
    version = 0;
    PGresult *res = PQexec(tx.c->pg, "SELECT version FROM ledger.schema_version");
    if (PQresultStatus(res) != PGRES_TUPLES_OK)
      r = pg_fail(&tx, res, "reading the schema version", err);
    else if (PQntuples(res) == 1)
      version = (int)col_i64(res, 0, 0);
    PQclear(res);
  }
  if (r >= 0 && version < SCHEMA_VERSION)
    r = exec_simple(&tx, schema_head, err);
  if (r >= 0 && version > SCHEMA_VERSION)
    r = eph_error_set(err, EPH_E_CONFIG,
                      PLUGIN ": %s: schema version %d is newer than this plugin's (%d); "
                      "refusing to touch it",
                      l->display, version, SCHEMA_VERSION);
  if (r >= 0 && version < 1) {
    r = exec_simple(&tx, schema_v1, err);
    if (r >= 0)
      r = exec_simple(&tx, "INSERT INTO ledger.schema_version(version) VALUES (1)", err);
    if (r < 0)
      eph_error_wrap(err, PLUGIN ": creating the ledger schema");
  }
  /* Future versions: `if (version < 2) { ALTER ...; UPDATE ledger.schema_version ...; }` */
  if (r >= 0)
    r = exec_simple(&tx, "COMMIT", err);
  else if (!tx.lost)
    exec_simple(&tx, "ROLLBACK", NULL);
  if (tx.lost)
    tx.c->ready = false;
  checkin(l, tx.c);
  return r;
}

static int
ledger_init(const eph_host_t *host, const config_setting_t *config, void **state,
            eph_error_t *err)
{
  const char *db = NULL, *node = NULL;
  int64_t conns = 4, connect_s = 5, stmt_ms = 10000, attempts = 20;
  int require_tls = 1;
  int r;
  if (host->cfg_string && (r = host->cfg_string(config, "database", NULL, &db, err)) < 0)
    return r;
  if (host->cfg_string && (r = host->cfg_string(config, "node_name", NULL, &node, err)) < 0)
    return r;
  if (host->cfg_int && ((r = host->cfg_int(config, "connections", 4, &conns, err)) < 0 ||
                        (r = host->cfg_int(config, "connect_timeout_s", 5, &connect_s, err)) < 0 ||
                        (r = host->cfg_int(config, "statement_timeout_ms", 10000, &stmt_ms,
                                           err)) < 0 ||
                        (r = host->cfg_int(config, "max_attempts", 20, &attempts, err)) < 0))
    return r;
  if (host->cfg_bool &&
      (r = host->cfg_bool(config, "require_tls", 1, &require_tls, err)) < 0)
    return r;
  if (!db || !*db)
    return eph_error_set(err, EPH_E_CONFIG,
                         PLUGIN ": key 'database' is not set: give the ledger's PostgreSQL "
                         "database as a libpq URI (postgresql://user@host/dbname)");
  if (require_tls && (r = check_transport(db, err)) < 0)
    return r;
  if (conns < 1 || conns > 64)
    return eph_error_set(err, EPH_E_CONFIG,
                         PLUGIN ": key 'connections': %" PRId64 " is not within 1..64", conns);
  if (connect_s < 1 || connect_s > 3600)
    return eph_error_set(err, EPH_E_CONFIG,
                         PLUGIN ": key 'connect_timeout_s': %" PRId64 " is not within 1..3600",
                         connect_s);
  if (stmt_ms < 0 || stmt_ms > INT_MAX)
    return eph_error_set(err, EPH_E_CONFIG,
                         PLUGIN ": key 'statement_timeout_ms': %" PRId64 " out of range",
                         stmt_ms);
  if (attempts < 1 || attempts > 1000)
    return eph_error_set(err, EPH_E_CONFIG,
                         PLUGIN ": key 'max_attempts': %" PRId64 " is not within 1..1000",
                         attempts);

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
                         PLUGIN ": key 'database': not a libpq connection URI or key=value "
                         "string");
  }
  if (node && *node) {
    eph_error_t why = {0};
    if (check_name("node_name", node, &why) < 0) {
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

static void
ledger_fini(void *state)
{
  ledger_close(state);
}

static const eph_ledger_ops_t ledger_ops = {
  .struct_size = sizeof(eph_ledger_ops_t),
  .credit = ledger_credit,
  .balance = ledger_balance,
  .reserve = ledger_reserve,
  .charge = ledger_charge,
  .settle = ledger_settle,
  .totals = ledger_totals,
  .settle_open = ledger_settle_open,
  .probe = ledger_probe,
};

EPH_PLUGIN_EXPORT = {
  .abi_major = EPH_ABI_MAJOR,
  .abi_minor = EPH_ABI_MINOR,
  .struct_size = sizeof(eph_plugin_t),
  .name = PLUGIN,
  .kind = EPH_KIND_LEDGER,
  .version = "0.1.0",
  .description = "Append-only ledger of organisations, reservations and charges in PostgreSQL",
  .config_keys = ledger_keys,
  .init = ledger_init,
  .fini = ledger_fini,
  .ops = &ledger_ops,
};
