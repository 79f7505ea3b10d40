/* The PostgreSQL store lending its connection to the core's modules whose tables the
 * cluster shares (core/admin.c, core/webhook_queue.c): eph_store_with_pg and
 * eph_store_pg_query (store.h). The statements are theirs; running them, the transaction
 * and the mapping of errors are the store's (store_pg_conn.c). */
#include "config.h"

#include <errno.h>
#include <string.h>

#include "store_pg_int.h"

/* Type OIDs of the built-in types a row is read as (catalog/pg_type_d.h, stable since
 * PostgreSQL 7): anything else is returned as its text. */
#define OID_BOOL 16
#define OID_INT8 20
#define OID_INT2 21
#define OID_INT4 23

static int
plain(pg_store_t *s, const char *sql, const char *what, eph_error_t *err)
{
  int r;
  cleanup_pgresult PGresult *res = eph_pg_exec(s, sql, 0, NULL, NULL, NULL, 0, what, &r, err);
  return r;
}

int
eph_pg_with_pg(eph_store_t *base, bool transaction,
               int (*fn)(eph_store_t *s, void *opaque, eph_error_t *err), void *opaque,
               eph_error_t *err)
{
  pg_store_t *s = PG(base);
  pthread_mutex_lock(&s->lock);
  int r = transaction ? plain(s, "BEGIN", "starting a transaction", err) : 0;
  if (r >= 0) {
    r = fn(base, opaque, err);
    if (transaction) {
      if (r >= 0) {
        int c = plain(s, "COMMIT", "committing", err);
        if (c < 0)
          r = c;
      } else {
        plain(s, "ROLLBACK", "rolling back", NULL);
      }
    }
  }
  pthread_mutex_unlock(&s->lock);
  return r;
}

static json_object *
cell(const PGresult *res, int row, int col)
{
  if (PQgetisnull(res, row, col))
    return NULL;
  const char *v = PQgetvalue(res, row, col);
  switch (PQftype(res, col)) {
  case OID_INT2:
  case OID_INT4:
  case OID_INT8:
    return json_object_new_int64(strtoll(v, NULL, 10));
  case OID_BOOL:
    return json_object_new_boolean(v[0] == 't');
  default:
    return json_object_new_string(v);
  }
}

int
eph_pg_query(eph_store_t *base, const char *sql, int n, const char *const *vals, json_object **rows,
             int *changes, const char *what, eph_error_t *err)
{
  int r;
  cleanup_pgresult PGresult *res =
      eph_pg_exec(PG(base), sql, n, vals, NULL, NULL, 0, what, &r, err);
  if (r < 0)
    return r;
  if (changes)
    *changes = affected(res);
  if (rows) {
    json_object *a = json_object_new_array();
    int nf = PQnfields(res);
    for (int i = 0; i < PQntuples(res); i++) {
      json_object *o = json_object_new_object();
      for (int k = 0; k < nf; k++)
        json_object_object_add(o, PQfname(res, k), cell(res, i, k));
      json_object_array_add(a, o);
    }
    *rows = a;
  }
  return 0;
}
