/* Admin keys, the audit trail and usage per organisation. See admin.h. */
#include "config.h"

#include "admin.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "support/sqlite_api.h"

#include "sqlrow.h"
#include "util.h"

typedef struct {
  const char *a[8];
  int64_t i[4];
  bool flag;
  char *text;
  json_object *out;
} args_t;

static int
fail(sqlite3 *db, const char *what, eph_error_t *err)
{
  return eph_error_set(err, EIO, "store: %s: %s", what, sqlite3_errmsg(db));
}

/* PostgreSQL (a cluster): the same tables, shared by every node (docs/cluster.md). */
static bool
on_pg(eph_store_t *store)
{
  return eph_store_kind(store) == EPH_STORE_POSTGRES;
}

static int
pg_mark(eph_store_t *s, void *opaque, eph_error_t *err)
{
  args_t *x = opaque;
  int changes = 0,
      r = eph_store_pg_query(
          s, NULL, &changes, "marking an admin key", err,
          "UPDATE api_keys SET admin = true WHERE id = $1 AND revoked_at_us IS NULL", "t", x->a[0]);
  if (r == 0 && changes == 0)
    r = eph_error_set(err, ENOENT, "no active key '%s'", x->a[0]);
  return r;
}

static int
pg_key(eph_store_t *s, void *opaque, eph_error_t *err)
{
  args_t *x = opaque;
  cleanup_json json_object *rows = NULL;
  int r = eph_store_pg_query(
      s, &rows, NULL, "reading a key", err,
      "SELECT admin, org FROM api_keys WHERE id = $1 AND revoked_at_us IS NULL", "t", x->a[0]);
  if (r < 0)
    return r;
  json_object *row = json_object_array_get_idx(rows, 0);
  if (!row)
    return eph_error_set(err, ENOENT, "no active key '%s'", x->a[0]);
  x->flag = json_object_get_boolean(json_object_object_get(row, "admin"));
  x->text = eph_xstrdup(json_object_get_string(json_object_object_get(row, "org")));
  return 0;
}

static int
pg_audit_add(eph_store_t *s, void *opaque, eph_error_t *err)
{
  args_t *x = opaque;
  int r = eph_store_pg_query(s, NULL, NULL, "writing the audit record", err,
                             "INSERT INTO audit(at_us, actor_key_id, actor_org, action, target_org,"
                             " target, detail, address, status)"
                             " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                             "ittttttti", x->i[0], x->a[0], x->a[1], x->a[2], x->a[3], x->a[4],
                             x->a[5], x->a[6], x->i[1]);
  if (r == 0)
    r = eph_store_pg_query(s, NULL, NULL, "purging old audit records", err,
                           "DELETE FROM audit WHERE at_us < $1", "i", x->i[2]);
  return r;
}

static int
pg_audit_list(eph_store_t *s, void *opaque, eph_error_t *err)
{
  args_t *x = opaque;
  json_object_put(x->out);
  x->out = NULL;
  return eph_store_pg_query(s, &x->out, NULL, "reading the audit trail", err,
                            "SELECT id, at_us, actor_key_id, actor_org, action, target_org,"
                            " target, detail, address, status FROM audit"
                            " ORDER BY id DESC LIMIT $1",
                            "i", x->i[0]);
}

/* The runs' usage is stored as the JSON text given: summed as numbers of its fields. */
static int
pg_usage(eph_store_t *s, void *opaque, eph_error_t *err)
{
  args_t *x = opaque;
  cleanup_json json_object *rows = NULL;
  int r = eph_store_pg_query(
      s, &rows, NULL, "summing usage", err,
      "SELECT count(*) AS runs,"
      " coalesce(sum((usage::jsonb ->> 'model_micros')::bigint), 0)::bigint AS model_micros,"
      " coalesce(sum((usage::jsonb ->> 'web_micros')::bigint), 0)::bigint AS web_micros,"
      " coalesce(sum((usage::jsonb ->> 'compute_micros')::bigint), 0)::bigint AS compute_micros,"
      " coalesce(sum((usage::jsonb ->> 'billed_micros')::bigint), 0)::bigint AS billed_micros"
      " FROM runs WHERE org = $1 AND created_at_us >= $2 AND created_at_us < $3",
      "tii", x->a[0], x->i[0], x->i[1]);
  if (r < 0)
    return r;
  json_object_object_foreach(json_object_array_get_idx(rows, 0), k, v)
    json_object_object_add(x->out, k, json_object_get(v));
  return 0;
}

static int
db_mark(sqlite3 *db, void *opaque, eph_error_t *err)
{
  args_t *x = opaque;
  int changes = 0;
  if (eph_sqlrow_exec(db, &changes,
                      "UPDATE api_keys SET admin = 1 WHERE id = ?1 AND revoked_at_us IS NULL", "t",
                      x->a[0]) < 0)
    return fail(db, "marking an admin key", err);
  if (changes == 0)
    return eph_error_set(err, ENOENT, "no active key '%s'", x->a[0]);
  return 0;
}

int
eph_admin_key_mark(eph_store_t *store, const char *key_id, eph_error_t *err)
{
  args_t x = {.a = {key_id}};
  if (on_pg(store))
    return eph_store_with_pg(store, false, pg_mark, &x, err);
  return eph_store_with_db(store, db_mark, &x, err);
}

static int
db_key(sqlite3 *db, void *opaque, eph_error_t *err)
{
  args_t *x = opaque;
  sqlite3_stmt *st = eph_sqlrow_prepare(
      db, "SELECT admin, org FROM api_keys WHERE id = ?1 AND revoked_at_us IS NULL", "t", x->a[0]);
  if (!st)
    return fail(db, "reading a key", err);
  int rc = sqlite3_step(st), r = 0;
  if (rc == SQLITE_ROW) {
    x->flag = sqlite3_column_int(st, 0) == 1;
    x->text = eph_xstrdup((const char *)sqlite3_column_text(st, 1));
  } else if (rc == SQLITE_DONE) {
    r = eph_error_set(err, ENOENT, "no active key '%s'", x->a[0]);
  } else {
    r = fail(db, "reading a key", err);
  }
  sqlite3_finalize(st);
  return r;
}

int
eph_admin_key_is_admin(eph_store_t *store, const char *key_id, bool *admin, eph_error_t *err)
{
  args_t x = {.a = {key_id}};
  *admin = false;
  int r = on_pg(store) ? eph_store_with_pg(store, false, pg_key, &x, err)
                       : eph_store_with_db(store, db_key, &x, err);
  free(x.text);
  if (r == -ENOENT)
    return 0;
  if (r == 0)
    *admin = x.flag;
  return r;
}

int
eph_admin_key_org(eph_store_t *store, const char *key_id, char **org_out, eph_error_t *err)
{
  args_t x = {.a = {key_id}};
  int r = on_pg(store) ? eph_store_with_pg(store, false, pg_key, &x, err)
                       : eph_store_with_db(store, db_key, &x, err);
  if (r < 0) {
    free(x.text);
    return r;
  }
  *org_out = x.text;
  return 0;
}

static int
db_audit_add(sqlite3 *db, void *opaque, eph_error_t *err)
{
  args_t *x = opaque;
  if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
    return fail(db, "writing the audit record", err);
  int r = 0;
  if (eph_sqlrow_exec(db, NULL,
                      "INSERT INTO audit(at_us, actor_key_id, actor_org, action, target_org,"
                      " target, detail, address, status)"
                      " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                      "ittttttti", x->i[0], x->a[0], x->a[1], x->a[2], x->a[3], x->a[4], x->a[5],
                      x->a[6], x->i[1]) < 0)
    r = fail(db, "writing the audit record", err);
  else if (eph_sqlrow_exec(db, NULL, "DELETE FROM audit WHERE at_us < ?1", "i", x->i[2]) < 0)
    r = fail(db, "purging old audit records", err);
  sqlite3_exec(db, r == 0 ? "COMMIT" : "ROLLBACK", NULL, NULL, NULL);
  return r;
}

int
eph_admin_audit_add(eph_store_t *store, const char *actor_key_id, const char *actor_org,
                    const char *action, const char *target_org, const char *target,
                    const char *detail, const char *address, int status, int retention_days,
                    eph_error_t *err)
{
  int64_t now = eph_wall_us();
  args_t x = {.a = {actor_key_id, actor_org, action, target_org, target, detail, address},
              .i = {now, status,
                    now - (int64_t)(retention_days > 0 ? retention_days : 30) * 86400 * 1000000}};
  if (on_pg(store))
    return eph_store_with_pg(store, true, pg_audit_add, &x, err);
  return eph_store_with_db(store, db_audit_add, &x, err);
}

static int
db_audit_list(sqlite3 *db, void *opaque, eph_error_t *err)
{
  args_t *x = opaque;
  static const char *const names[] = {"id",      "at_us",      "actor_key_id", "actor_org",
                                      "action",  "target_org", "target",       "detail",
                                      "address", "status"};
  if (eph_sqlrow_select(db, x->out, names, 10,
                        "SELECT id, at_us, actor_key_id, actor_org, action,"
                        " target_org, target, detail, address, status FROM audit"
                        " ORDER BY id DESC LIMIT ?1",
                        "i", x->i[0]) < 0)
    return fail(db, "reading the audit trail", err);
  return 0;
}

int
eph_admin_audit_list(eph_store_t *store, int limit, json_object **out, eph_error_t *err)
{
  args_t x = {.i = {limit}, .out = json_object_new_array()};
  int r = on_pg(store) ? eph_store_with_pg(store, false, pg_audit_list, &x, err)
                       : eph_store_with_db(store, db_audit_list, &x, err);
  if (r < 0) {
    json_object_put(x.out);
    return r;
  }
  *out = x.out;
  return 0;
}

static int
db_usage(sqlite3 *db, void *opaque, eph_error_t *err)
{
  args_t *x = opaque;
  /* The run rows' usage is the settled truth the ledger agrees with (run record and ledger
   * always agree): summed with SQLite's JSON functions. */
  sqlite3_stmt *st =
      eph_sqlrow_prepare(db,
                         "SELECT count(*),"
                         " coalesce(sum(json_extract(usage, '$.model_micros')), 0),"
                         " coalesce(sum(json_extract(usage, '$.web_micros')), 0),"
                         " coalesce(sum(json_extract(usage, '$.compute_micros')), 0),"
                         " coalesce(sum(json_extract(usage, '$.billed_micros')), 0)"
                         " FROM runs WHERE org = ?1 AND created_at_us >= ?2 AND created_at_us < ?3",
                         "tii", x->a[0], x->i[0], x->i[1]);
  if (!st)
    return fail(db, "summing usage", err);
  int r = 0;
  if (sqlite3_step(st) == SQLITE_ROW) {
    static const char *const names[] = {"runs", "model_micros", "web_micros", "compute_micros",
                                        "billed_micros"};
    for (int k = 0; k < 5; k++)
      json_object_object_add(x->out, names[k], json_object_new_int64(sqlite3_column_int64(st, k)));
  } else {
    r = fail(db, "summing usage", err);
  }
  sqlite3_finalize(st);
  return r;
}

int
eph_admin_usage(eph_store_t *store, const char *org, int64_t from_us, int64_t to_us,
                json_object **out, eph_error_t *err)
{
  args_t x = {.a = {org}, .i = {from_us, to_us}, .out = json_object_new_object()};
  json_object_object_add(x.out, "object", json_object_new_string("usage"));
  json_object_object_add(x.out, "org", json_object_new_string(org));
  json_object_object_add(x.out, "from_us", json_object_new_int64(from_us));
  json_object_object_add(x.out, "to_us", json_object_new_int64(to_us));
  int r = on_pg(store) ? eph_store_with_pg(store, false, pg_usage, &x, err)
                       : eph_store_with_db(store, db_usage, &x, err);
  if (r < 0) {
    json_object_put(x.out);
    return r;
  }
  *out = x.out;
  return 0;
}
