/*
 * ledger-postgres: the connection pool, each connection's session set-up, the transport
 * rule (require_tls), the mapping of PostgreSQL's errors to errno values and the retry loop
 * around every operation's transaction (run_tx). See ledger.c for the model.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

#include "ledger.h"

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
int
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
  int code = lost                                  ? EIO
             : strcmp(tx->sqlstate, "53100") == 0  ? ENOSPC
             : strcmp(tx->sqlstate, "57014") == 0  ? EBUSY
             : strcmp(tx->sqlstate, "55P03") == 0  ? EBUSY
             : tx->retry                           ? EBUSY
             : strcmp(tx->sqlstate, "22003") == 0  ? EOVERFLOW
             : strncmp(tx->sqlstate, "23", 2) == 0 ? EINVAL
             : strcmp(tx->sqlstate, "P0001") == 0  ? EINVAL
                                                   : EIO;
  char msg[512];
  snprintf(msg, sizeof msg, "%s",
           res && *PQresultErrorMessage(res) ? PQresultErrorMessage(res)
                                             : PQerrorMessage(tx->c->pg));
  trim_newline(msg);
  if (lost)
    return eph_error_set(err, code, PLUGIN ": database %s unreachable while %s%s: %s", l->display,
                         what,
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
int
check_transport(const char *conninfo, const char *source, eph_error_t *err)
{
  char *errmsg = NULL;
  PQconninfoOption *opts = PQconninfoParse(conninfo, &errmsg);
  if (!opts) {
    PQfreemem(errmsg);
    return eph_error_set(err, EPH_E_CONFIG,
                         PLUGIN ": %s: not a libpq connection URI or key=value string", source);
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
                          PLUGIN
                          ": %s: host '%.*s' is not local and sslmode is "
                          "'%s': the ledger's traffic and credentials could be read or altered "
                          "on the network; add sslmode=verify-full (with the server's CA in "
                          "sslrootcert), or set require_tls = false",
                          source, (int)n, p, mode ? mode : "prefer");
      p += n + (p[n] == ',');
    }
  }
  PQconninfoFree(opts);
  return r;
}

/* "host=... port=... dbname=... user=..." from the conninfo, without the password. */
char *
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
        int w =
            snprintf(buf + used, sizeof buf - used, "%s%s=%s", used ? " " : "", o->keyword, o->val);
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
int
conn_connect(tx_t *tx, bool connect_only, eph_error_t *err)
{
  conn_t *c = tx->c;
  if (c->ready && PQstatus(c->pg) == CONNECTION_OK && PQtransactionStatus(c->pg) == PQTRANS_IDLE)
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
    return eph_error_set(err, EIO, PLUGIN ": %s: cannot connect to %s: %s", tx->l->db_source,
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
                           PLUGIN ": %s: connected to host '%s' without "
                                  "sslmode=verify-full; refused (require_tls)",
                           tx->l->db_source, shown);
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

conn_t *
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

void
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
PGresult *
q(tx_t *tx, int which, const char *const *params, const char *what, eph_error_t *err)
{
  char name[8];
  snprintf(name, sizeof name, "l%d", which);
  PGresult *res = PQexecPrepared(tx->c->pg, name, statements[which].params, params, NULL, NULL, 0);
  ExecStatusType s = PQresultStatus(res);
  if (s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK)
    return res;
  pg_fail(tx, res, what, err);
  PQclear(res);
  return NULL;
}

int
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

int64_t
col_i64(const PGresult *res, int row, int col)
{
  return strtoll(PQgetvalue(res, row, col), NULL, 10);
}

/* ---------------------------------------------------------------- transactions */

static void
backoff(int attempt)
{
  /* 1, 2, 4 .. 64 ms, each jittered to 50-100 %: the conflicting transactions spread out. */
  long ms = 1L << (attempt < 6 ? attempt : 6);
  unsigned seed = (unsigned)eph_ledger_wall_us() ^ (unsigned)(uintptr_t)&attempt;
  long us = ms * 500 + (long)(rand_r(&seed) % (ms * 500 + 1));
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

static int32_t
name_hash(const char *s)
{
  uint32_t h = 2166136261u;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 16777619u;
  return (int32_t)h;
}

/* Sends sql (several statements) and reads every result; the first failure is the error. */
int
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
int
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

int
run_tx(ledger_t *l, int lock_class, const char *lock_name, tx_body_fn body, void *arg,
       eph_error_t *err)
{
  return run_tx_locked(l, lock_class, lock_name, false, body, arg, err);
}
