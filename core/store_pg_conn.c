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

/* The store's tables are named unqualified, so the session's search_path decides which
 * tables a statement reads and writes: left as the connection came (the server's default
 * "$user", public; a role's or database's default; the URI's options), a schema named
 * after this role that another role created, or any schema put before the store's, could
 * hold tables, functions or operators shadowing the store's (a table api_keys of someone
 * else's making would authenticate that someone's keys). The store's schema is chosen once,
 * here, with nothing resolved through the path it came with: the first schema of that path
 * this role owns (the secure usage pattern's schema of its own, or one the URI names),
 * else public; pg_catalog, left out of the pinned path, is searched before it. */
int
eph_pg_choose_schema(pg_store_t *s, char **set_sql, eph_error_t *err)
{
  /* The path as it came, read by a schema-qualified function: no name is looked up in it. */
  cleanup_pgresult PGresult *path =
      PQexec(s->conn, "SELECT pg_catalog.current_schemas(false)::pg_catalog.text[]");
  if (!path || PQresultStatus(path) != PGRES_TUPLES_OK || PQntuples(path) != 1)
    return eph_pg_error(s, path, "reading the search path", err);
  cleanup_pgresult PGresult *pin = PQexec(s->conn, "SET search_path = pg_catalog, pg_temp");
  if (!pin || PQresultStatus(pin) != PGRES_COMMAND_OK)
    return eph_pg_error(s, pin, "pinning the search path", err);
  const char *v[] = {PQgetvalue(path, 0, 0)};
  cleanup_pgresult PGresult *res = PQexecParams(
      s->conn,
      "WITH p AS (SELECT u.s, u.i FROM unnest($1::text[]) WITH ORDINALITY AS u(s, i)),"
      " c AS (SELECT coalesce((SELECT p.s FROM p JOIN pg_namespace n ON n.nspname = p.s"
      "  WHERE n.nspowner = (SELECT oid FROM pg_roles WHERE rolname = current_user)"
      "  AND p.s NOT LIKE 'pg\\_%' AND p.s <> 'information_schema' ORDER BY p.i LIMIT 1),"
      "  'public') AS s)"
      " SELECT c.s, format('SET search_path = %I, pg_temp', c.s),"
      "  to_regclass(format('%I.eph_schema', c.s)) IS NOT NULL,"
      "  (SELECT string_agg(p.s, ', ' ORDER BY p.i) FROM p WHERE p.s <> c.s"
      "   AND to_regclass(format('%I.eph_schema', p.s)) IS NOT NULL), current_user::text"
      " FROM c",
      1, NULL, v, NULL, NULL, 0);
  if (!res || PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
    return eph_pg_error(s, res, "choosing the store's schema", err);
  /* The store was created where the path used to lead (a schema of another role's named
   * after this one, say): a second, empty store beside it would take the runs in flight
   * for orphans. The operator moves the tables, or gives the role their schema. */
  if (PQgetvalue(res, 0, 2)[0] != 't' && !PQgetisnull(res, 0, 3))
    return eph_error_set(err, EPH_E_CONFIG,
                         "%s: the store's tables belong in schema '%s' (the first schema of the "
                         "search path that role '%s' owns, else public), which has none, but "
                         "schema '%s' on the connection's search path has them: refusing to "
                         "start a second, empty store; move them (ALTER TABLE ... SET SCHEMA) "
                         "or give role '%s' their schema (docs/cluster.md)",
                         s->base.path, PQgetvalue(res, 0, 0), PQgetvalue(res, 0, 4),
                         PQgetvalue(res, 0, 3), PQgetvalue(res, 0, 4));
  *set_sql = eph_xstrdup(PQgetvalue(res, 0, 1));
  return 0;
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
