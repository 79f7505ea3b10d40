/* The PostgreSQL store's connection: running a statement (with one reconnect when the server
 * closed the connection) and mapping a failure to an errno and the store's fault. Below
 * store_pg.c and store_pg_cluster.c, which call it. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "store_pg_int.h"
#include "util.h"

int
eph_pg_error(pg_store_t *s, const PGresult *res, const char *what, eph_error_t *err)
{
  const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
  const char *msg =
      res && *PQresultErrorMessage(res) ? PQresultErrorMessage(res) : PQerrorMessage(s->conn);
  char clean[400];
  snprintf(clean, sizeof clean, "%s", msg ? msg : "unknown error");
  clean[strcspn(clean, "\n")] = '\0';
  int code = EIO;
  bool fault = true;
  if (state) {
    fault = false;
    if (strcmp(state, "23505") == 0)
      code = EEXIST;
    else if (strncmp(state, "23", 2) == 0 || strcmp(state, "P0001") == 0)
      code = EINVAL; /* a constraint or the ZDR trigger */
    else if (strcmp(state, "40001") == 0 || strcmp(state, "40P01") == 0 ||
             strcmp(state, "55P03") == 0 || strcmp(state, "57014") == 0)
      code = EBUSY;
    else if (strcmp(state, "53100") == 0)
      code = ENOSPC, fault = true;
    else if (strncmp(state, "08", 2) == 0 || strncmp(state, "57", 2) == 0 ||
             strncmp(state, "53", 2) == 0 || strncmp(state, "58", 2) == 0 ||
             strncmp(state, "XX", 2) == 0)
      fault = true;
  }
  int r = eph_error_set(err, code, "%s: %s: %s", s->base.path, what, clean);
  if (fault) {
    char m[sizeof s->base.fault];
    snprintf(m, sizeof m, "%s: %s: %s", s->base.path, what, clean);
    eph_store_fault_set(&s->base, false, m);
  }
  return r;
}

int
eph_pg_session(pg_store_t *s, const char *what, eph_error_t *err)
{
  PGresult *res = PQexec(s->conn, s->session_sql);
  ExecStatusType st = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
  int r = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK ? 0 : eph_pg_error(s, res, what, err);
  PQclear(res);
  return r;
}

/* A success clears the store's fault: the server answered. */
PGresult *
eph_pg_exec(pg_store_t *s, const char *sql, int n, const char *const *vals, const int *lens,
            const int *fmts, int binary_result, const char *what, int *r, eph_error_t *err)
{
  /* Inside a transaction (eph_pg_with_pg) a lost connection took the transaction with it:
   * the statement is not retried, or it would run alone on the new connection, outside
   * any transaction, and a COMMIT after it would "succeed" with a warning (there is no
   * transaction) while the statements before it were rolled back. */
  PGTransactionStatusType tx = PQtransactionStatus(s->conn);
  bool in_tx = tx == PQTRANS_INTRANS || tx == PQTRANS_INERROR;
  for (int attempt = 0;; attempt++) {
    PGresult *res = PQexecParams(s->conn, sql, n, NULL, vals, lens, fmts, binary_result);
    ExecStatusType st = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) {
      eph_store_fault_clear(&s->base);
      *r = 0;
      return res;
    }
    if (attempt == 0 && PQstatus(s->conn) == CONNECTION_BAD) {
      PQclear(res);
      PQreset(s->conn);
      if (PQstatus(s->conn) != CONNECTION_OK) {
        *r = eph_pg_error(s, NULL, what, err);
        return NULL;
      }
      /* A new session: this store's settings (lock_timeout above all: without it a
       * statement waiting on a lock would hang its request for ever) are set again. */
      if ((*r = eph_pg_session(s, "setting up the new session", err)) < 0)
        return NULL;
      eph_info("%s: reconnected", s->base.path);
      if (!in_tx)
        continue;
      *r = eph_error_set(err, EIO,
                         "%s: %s: the connection was lost inside a transaction, which the "
                         "server rolled back; reconnected",
                         s->base.path, what);
      return NULL;
    }
    *r = eph_pg_error(s, res, what, err);
    PQclear(res);
    return NULL;
  }
}

PGresult *
eph_pg_run(pg_store_t *s, const char *sql, int n, const char *const *vals, const char *what, int *r,
           eph_error_t *err)
{
  pthread_mutex_lock(&s->lock);
  PGresult *res = eph_pg_exec(s, sql, n, vals, NULL, NULL, 0, what, r, err);
  pthread_mutex_unlock(&s->lock);
  return res;
}
