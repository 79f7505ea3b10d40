/* What the PostgreSQL store's units share (store_pg.c: open, migrations and the records;
 * store_pg_cluster.c: what nodes coordinate through; store_pg_conn.c: running a statement).
 * Not included outside core/store_pg*.c. */
#ifndef EPH_CORE_STORE_PG_INT_H
#define EPH_CORE_STORE_PG_INT_H

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "pq_api.h"
#include "store_int.h"
#include "util.h"

typedef struct pg_store {
  eph_store_t base; /* first: see store_int.h */
  PGconn *conn;
  pthread_mutex_t lock; /* one connection, one user at a time */
  eph_store_t *local;   /* node-local SQLite for eph_store_with_db, or NULL */
  char *node;           /* this node's name, or NULL (no leases) */
  char *session_sql;    /* the session's settings, set again on every new connection */
  int64_t lease_us;
} pg_store_t;

#define PG(x) ((pg_store_t *)(x))

/* The database server's time in micros (the start of the statement's transaction), in SQL:
 * what leases are written and compared in. Every node's lease is then measured by one
 * clock: a node whose own clock is ahead does not take the others' live runs over, one
 * behind does not lose its own (a node's eph_wall_us() still stamps created_at and the
 * like, which order but decide nothing). */
#define PG_NOW_US "(extract(epoch FROM now()) * 1000000)::bigint"

/* A result freed when it goes out of scope. */
static inline void
pqclearp(PGresult **r)
{
  if (*r)
    PQclear(*r);
}
#define cleanup_pgresult __attribute__((cleanup(pqclearp)))

/* Decimal text of an int64 parameter. */
typedef struct {
  char s[24];
} i64s_t;
static inline i64s_t
i64s(int64_t v)
{
  i64s_t o;
  snprintf(o.s, sizeof o.s, "%" PRId64, v);
  return o;
}

static inline int64_t
get_i64(const PGresult *res, int row, int col)
{
  return strtoll(PQgetvalue(res, row, col), NULL, 10);
}

static inline char *
get_dup(const PGresult *res, int row, int col)
{
  return PQgetisnull(res, row, col) ? NULL : eph_xstrdup(PQgetvalue(res, row, col));
}

/* A stored JSON text column as an object (NULL column -> JSON null). */
static inline json_object *
get_json(const PGresult *res, int row, int col)
{
  return PQgetisnull(res, row, col) ? NULL : json_tokener_parse(PQgetvalue(res, row, col));
}

static inline const char *
json_text(json_object *v)
{
  return v ? json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN) : NULL;
}

static inline int
affected(const PGresult *res)
{
  return atoi(PQcmdTuples((PGresult *)res));
}

/* Maps a failed result (or, res NULL, a lost connection) to an errno and fills err naming
 * the target and the operation ("what"); a lost or failing server sets the store's fault.
 * Returns the negative errno. */
int eph_pg_error(pg_store_t *s, const PGresult *res, const char *what, eph_error_t *err);

/* The store's schema, chosen on a new connection before anything else runs on it (see
 * store_pg_conn.c): *set_sql (heap) the statement pinning the session's search_path to it,
 * part of s->session_sql from then on. -EPH_E_CONFIG when the store's tables are in another
 * schema of the connection's search path; another negative errno when the server failed. */
int eph_pg_choose_schema(pg_store_t *s, char **set_sql, eph_error_t *err);

/* Sets this store's session settings (s->session_sql) on its connection: at open and after
 * every reconnect. 0, or the negative errno with err naming the operation. */
int eph_pg_session(pg_store_t *s, const char *what, eph_error_t *err);

/* Runs one parameterised statement; the caller holds s->lock. Text parameters when lens and
 * fmts are NULL. Returns the result (the caller PQclear()s it) with *r = 0, or NULL with *r
 * the negative errno and err filled. A connection the server closed is reset (its session
 * settings set again) and the statement retried once, unless it ran inside a transaction:
 * then -EIO (the transaction is lost with the old session; the caller rolls back). */
PGresult *eph_pg_exec(pg_store_t *s, const char *sql, int n, const char *const *vals,
                      const int *lens, const int *fmts, int binary_result, const char *what, int *r,
                      eph_error_t *err);

/* eph_pg_exec taking s->lock itself, for the one-statement operations. */
PGresult *eph_pg_run(pg_store_t *s, const char *sql, int n, const char *const *vals,
                     const char *what, int *r, eph_error_t *err);

/* The cluster operations of eph_store_ops_t (store_pg_cluster.c); their contracts are those
 * of store.h's eph_store_cancel_request, eph_store_queue_push, eph_store_leases_renew, ... */
int eph_pg_cancel_request(eph_store_t *base, const char *run_id, eph_error_t *err);
int eph_pg_cancels_pending(eph_store_t *base, json_object **out, eph_error_t *err);
int eph_pg_leases_renew(eph_store_t *base, json_object *ids, eph_error_t *err);
int eph_pg_leases_take_expired(eph_store_t *base, json_object **out, eph_error_t *err);
int eph_pg_run_take_ended(eph_store_t *base, const char *run_id, eph_error_t *err);
/* The outcome of a fenced write to run_id (store_pg.c's run_update, event_append), from its
 * result's first row: (rows written, rows of the run, the run's holder). 0 when written;
 * else -ESTALE naming the holder, or -ENOENT when the run does not exist. */
int eph_pg_fenced(pg_store_t *s, const char *run_id, const PGresult *res, eph_error_t *err);
int eph_pg_queue_push(eph_store_t *base, const char *run_id, int64_t reserved_micros,
                      bool local_only, int max_queued, eph_error_t *err);
int eph_pg_queue_claim(eph_store_t *base, json_object **out, eph_error_t *err);
int eph_pg_queue_remove(eph_store_t *base, const char *run_id, eph_error_t *err);
int eph_pg_queue_length(eph_store_t *base, int64_t *n, eph_error_t *err);
int eph_pg_queue_take(eph_store_t *base, const char *run_id, json_object **out, eph_error_t *err);
/* store_pg_listen.c: eph_store_listen's implementation. */
int eph_pg_listen(eph_store_t *base,
                  void (*fn)(void *opaque, eph_store_note_t note, const char *run_id), void *opaque,
                  eph_store_listener_t **out, eph_error_t *err);

/* eph_store_with_pg and one statement inside it (store_pg_sql.c); contracts in store.h. */
int eph_pg_with_pg(eph_store_t *base, bool transaction,
                   int (*fn)(eph_store_t *s, void *opaque, eph_error_t *err), void *opaque,
                   eph_error_t *err);
int eph_pg_query(eph_store_t *base, const char *sql, int n, const char *const *vals,
                 json_object **rows, int *changes, const char *what, eph_error_t *err);
/* store_pg_ledger.c: eph_store_cluster_ledger. */
int eph_pg_cluster_ledger(eph_store_t *base, const char *identity, const char *plugin,
                          const char *node, json_object **out, eph_error_t *err);

#endif
