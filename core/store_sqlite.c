/* The SQLite store: one file, one host (the default). See store.h for the contract and
 * store_int.h for what core/store.c has already checked. */
#include "config.h"

#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "support/sqlite.h"

#include "log.h"
#include "sqlrow.h"
#include "store_int.h"
#include "util.h"

/* Migrations (core/store_sqlite_schema.c): entry i brings user_version from i to i + 1. */
#define SCHEMA_VERSION eph_store_sqlite_schema_version
#define migrations eph_store_sqlite_migrations

/* The prepared statements (ST_*, eph_store_sqlite_sql) are in store_sqlite_schema.c. */
#define statement_sql eph_store_sqlite_sql

typedef struct sq_store {
  eph_store_t base; /* first: see store_int.h */
  sqlite3 *db;
  sqlite3_stmt *st[ST_COUNT];
  pthread_mutex_t lock; /* one connection, one user at a time: see store.h */
} sq_store_t;

/* Within this file `s` is the SQLite store; its base holds the path and the faults. */
#define SQ(x) ((sq_store_t *)(x))

/* A fault is what the operator must act on: the file or the disk, not the caller. */
static bool
is_fault(int rc)
{
  switch (rc & 0xff) {
  case SQLITE_FULL:
  case SQLITE_IOERR:
  case SQLITE_CORRUPT:
  case SQLITE_NOTADB:
  case SQLITE_CANTOPEN:
  case SQLITE_READONLY:
    return true;
  default:
    return false;
  }
}

/* A damaged page stays reported until the file is reopened (and refused by quick_check):
 * a later write elsewhere in the file proves nothing about it. */
static void
fault_set(sq_store_t *s, int rc, const char *message)
{
  eph_store_fault_set(&s->base, (rc & 0xff) == SQLITE_CORRUPT || (rc & 0xff) == SQLITE_NOTADB,
                      message);
}

static void
fault_clear(sq_store_t *s)
{
  eph_store_fault_clear(&s->base);
}

/* Resets a statement (and drops its bindings) when it goes out of scope. */
static inline void
stmt_resetp(sqlite3_stmt **s)
{
  if (*s) {
    sqlite3_reset(*s);
    sqlite3_clear_bindings(*s);
  }
}
#define cleanup_reset __attribute__((cleanup(stmt_resetp)))

static int
db_error(sq_store_t *s, const char *what, eph_error_t *err)
{
  int rc = sqlite3_extended_errcode(s->db);
  int code = eph_sqlite_errno(rc);
  int r = eph_error_set(err, code, "%s: %s: %s", s->base.path, what, sqlite3_errmsg(s->db));
  if (is_fault(rc)) {
    char msg[sizeof s->base.fault];
    snprintf(msg, sizeof msg, "%s: %s: %s", s->base.path, what, sqlite3_errmsg(s->db));
    fault_set(s, rc, msg);
  }
  return r;
}

/* Steps a statement that yields no row we need; 0 or negative. */
static int
step_done(sq_store_t *s, sqlite3_stmt *st, const char *what, eph_error_t *err)
{
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW)
    ;
  return rc == SQLITE_DONE ? 0 : db_error(s, what, err);
}

/* A write to a run's rows (its update, an event): stepped; a success clears a recorded
 * fault (the store writes again); no row changed means no such run (-ENOENT). */
static int
step_run_write(sq_store_t *s, sqlite3_stmt *st, const char *what, const char *run_id,
               eph_error_t *err)
{
  int r = step_done(s, st, what, err);
  if (r >= 0)
    fault_clear(s);
  if (r >= 0 && sqlite3_changes(s->db) == 0)
    r = eph_error_set(err, ENOENT, "run %s does not exist", run_id);
  return r;
}

static int
run_simple(sq_store_t *s, int which, const char *what, eph_error_t *err)
{
  cleanup_reset sqlite3_stmt *st = s->st[which];
  return step_done(s, st, what, err);
}

/* Locks the store and opens a write transaction; on failure the lock is released. */
static int
tx_begin(sq_store_t *s, eph_error_t *err)
{
  pthread_mutex_lock(&s->lock);
  int r = run_simple(s, ST_BEGIN, "BEGIN IMMEDIATE", err);
  if (r < 0)
    pthread_mutex_unlock(&s->lock);
  return r;
}

/* Commits when r >= 0, else rolls back; unlocks; returns r or the commit's error. */
static int
tx_end(sq_store_t *s, int r, eph_error_t *err)
{
  if (r >= 0) {
    int c = run_simple(s, ST_COMMIT, "COMMIT", err);
    if (c < 0)
      r = c;
    else
      fault_clear(s);
  }
  if (r < 0 && !sqlite3_get_autocommit(s->db))
    run_simple(s, ST_ROLLBACK, "ROLLBACK", NULL);
  pthread_mutex_unlock(&s->lock);
  return r;
}

static void
bind_text(sqlite3_stmt *st, int i, const char *v)
{
  if (v)
    sqlite3_bind_text(st, i, v, -1, SQLITE_STATIC);
  else
    sqlite3_bind_null(st, i);
}

/* Binds a JSON value as its compact text, or NULL. */
static void
bind_json(sqlite3_stmt *st, int i, json_object *v)
{
  if (v)
    sqlite3_bind_text(st, i, json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN), -1,
                      SQLITE_TRANSIENT);
  else
    sqlite3_bind_null(st, i);
}

static char *
column_dup(sqlite3_stmt *st, int i)
{
  const unsigned char *t = sqlite3_column_text(st, i);
  return t ? eph_xstrdup((const char *)t) : NULL;
}

/* A stored JSON text column as an object (NULL column -> JSON null). */
static json_object *
column_json(sqlite3_stmt *st, int i)
{
  const unsigned char *t = sqlite3_column_text(st, i);
  return t ? json_tokener_parse((const char *)t) : NULL;
}

/* ---------------------------------------------------------------- open / close */

static void
sq_close(eph_store_t *base)
{
  sq_store_t *s = SQ(base);
  eph_sqlite_finalize_all(s->st, ST_COUNT);
  if (s->db)
    sqlite3_close(s->db);
  pthread_mutex_destroy(&s->lock);
  eph_store_base_free(&s->base);
  free(s);
}

/* ---------------------------------------------------------------- organisations */

static int
org_ensure(sq_store_t *s, const char *org, eph_error_t *err)
{
  cleanup_reset sqlite3_stmt *st = s->st[ST_ORG_ENSURE];
  bind_text(st, 1, org);
  sqlite3_bind_int64(st, 2, eph_wall_us());
  return step_done(s, st, "creating the organisation", err);
}

static int
sq_org_create(eph_store_t *base, const char *org, eph_error_t *err)
{
  sq_store_t *s = SQ(base);
  int r = tx_begin(s, err);
  if (r < 0)
    return r;
  return tx_end(s, org_ensure(s, org, err), err);
}

static int
sq_member_add(eph_store_t *base, const char *org, const char *member, const char *role,
              eph_error_t *err)
{
  sq_store_t *s = SQ(base);
  int r = tx_begin(s, err);
  if (r < 0)
    return r;
  {
    cleanup_reset sqlite3_stmt *st = s->st[ST_ORG_EXISTS];
    bind_text(st, 1, org);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_DONE)
      r = eph_error_set(err, ENOENT, "organisation '%s' does not exist", org);
    else if (rc != SQLITE_ROW)
      r = db_error(s, "reading the organisation", err);
  }
  if (r >= 0) {
    cleanup_reset sqlite3_stmt *st = s->st[ST_MEMBER_PUT];
    bind_text(st, 1, org);
    bind_text(st, 2, member);
    bind_text(st, 3, role);
    sqlite3_bind_int64(st, 4, eph_wall_us());
    r = step_done(s, st, "adding the member", err);
  }
  return tx_end(s, r, err);
}

/* ---------------------------------------------------------------- API keys */

static int
sq_key_insert(eph_store_t *base, const char *org, const char *name, const char *id,
              const unsigned char md[32], eph_error_t *err)
{
  sq_store_t *s = SQ(base);
  int r = tx_begin(s, err);
  if (r < 0)
    return r;
  r = org_ensure(s, org, err);
  if (r >= 0) {
    cleanup_reset sqlite3_stmt *st = s->st[ST_KEY_INSERT];
    bind_text(st, 1, id);
    bind_text(st, 2, org);
    bind_text(st, 3, name);
    sqlite3_bind_blob(st, 4, md, 32, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, eph_wall_us());
    r = step_done(s, st, "storing the API key", err);
    if (r == -EEXIST)
      r = eph_error_set(err, EEXIST, "organisation '%s' already has an active key named '%s'", org,
                        name);
  }
  return tx_end(s, r, err);
}

static int
sq_key_lookup(eph_store_t *base, const unsigned char md[32], char **id_out, char **org_out,
              eph_error_t *err)
{
  sq_store_t *s = SQ(base);
  int r = 0;
  pthread_mutex_lock(&s->lock);
  {
    cleanup_reset sqlite3_stmt *st = s->st[ST_KEY_BY_HASH];
    sqlite3_bind_blob(st, 1, md, 32, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      const void *stored = sqlite3_column_blob(st, 2);
      if (stored && sqlite3_column_bytes(st, 2) == 32 && CRYPTO_memcmp(stored, md, 32) == 0) {
        *id_out = column_dup(st, 0);
        *org_out = column_dup(st, 1);
      }
    } else if (rc != SQLITE_DONE) {
      r = db_error(s, "looking up the API key", err);
    }
  }
  pthread_mutex_unlock(&s->lock);
  if (r >= 0 && !*id_out)
    r = eph_error_set(err, EACCES, "invalid API key");
  return r;
}

static int
sq_key_revoke(eph_store_t *base, const char *key_id_or_name, const char *org, eph_error_t *err)
{
  sq_store_t *s = SQ(base);
  int r = tx_begin(s, err);
  if (r < 0)
    return r;
  {
    cleanup_reset sqlite3_stmt *st = s->st[ST_KEY_REVOKE];
    bind_text(st, 1, key_id_or_name);
    bind_text(st, 2, org);
    sqlite3_bind_int64(st, 3, eph_wall_us());
    r = step_done(s, st, "revoking the API key", err);
  }
  if (r >= 0 && sqlite3_changes(s->db) == 0)
    r = eph_error_set(err, ENOENT, "organisation '%s' has no active key '%s'", org, key_id_or_name);
  return tx_end(s, r, err);
}

/* Steps the bound statement st (under s->lock) to its end: each row as row(st) into a new
 * array, *out on success. */
static int
rows_collect(sq_store_t *s, sqlite3_stmt *st, json_object *(*row)(sqlite3_stmt *st),
             const char *what, json_object **out, eph_error_t *err)
{
  cleanup_json json_object *arr = json_object_new_array();
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW)
    json_object_array_add(arr, row(st));
  if (rc != SQLITE_DONE)
    return db_error(s, what, err);
  *out = steal_pointer(&arr);
  return 0;
}

/* A row of ST_KEY_LIST (revoked_at_us null while the key is active). */
static json_object *
key_from_row(sqlite3_stmt *st)
{
  static const char *const names[] = {"id", "name", "created_at_us", "revoked_at_us"};
  return eph_sqlrow_object(st, names, 4);
}

static int
sq_key_list(eph_store_t *base, const char *org, json_object **out, eph_error_t *err)
{
  sq_store_t *s = SQ(base);
  int r;
  pthread_mutex_lock(&s->lock);
  {
    cleanup_reset sqlite3_stmt *st = s->st[ST_KEY_LIST];
    bind_text(st, 1, org);
    r = rows_collect(s, st, key_from_row, "listing API keys", out, err);
  }
  pthread_mutex_unlock(&s->lock);
  return r;
}

/* ---------------------------------------------------------------- runs */

static int
sq_run_insert(eph_store_t *base, const char *id, const char *org, const char *status,
              int64_t created_at_us, json_object *stored, bool zdr, eph_error_t *err)
{
  sq_store_t *s = SQ(base);
  int r;
  pthread_mutex_lock(&s->lock);
  {
    cleanup_reset sqlite3_stmt *st = s->st[ST_RUN_INSERT];
    bind_text(st, 1, id);
    bind_text(st, 2, org);
    bind_text(st, 3, status);
    sqlite3_bind_int64(st, 4, created_at_us);
    sqlite3_bind_int(st, 5, zdr ? 1 : 0);
    bind_json(st, 6, stored);
    r = step_done(s, st, "inserting the run", err);
  }
  pthread_mutex_unlock(&s->lock);
  return r;
}

static int
sq_run_update(eph_store_t *base, const char *id, const char *status, json_object *output,
              json_object *usage, eph_error_t *err)
{
  sq_store_t *s = SQ(base);
  int r;
  pthread_mutex_lock(&s->lock);
  {
    cleanup_reset sqlite3_stmt *st = s->st[ST_RUN_UPDATE];
    bind_text(st, 1, id);
    bind_text(st, 2, status);
    bind_json(st, 3, output);
    bind_json(st, 4, usage);
    sqlite3_bind_int64(st, 5, eph_wall_us());
    r = step_run_write(s, st, "updating the run", id, err);
  }
  pthread_mutex_unlock(&s->lock);
  return r;
}

/* Builds a run object from a row of ST_RUN_GET / ST_RUN_LIST_* (same columns). */
static json_object *
run_from_row(sqlite3_stmt *st, bool with_content)
{
  json_object *o = json_object_new_object();
  json_object_object_add(o, "id", json_object_new_string((const char *)sqlite3_column_text(st, 0)));
  json_object_object_add(o, "org",
                         json_object_new_string((const char *)sqlite3_column_text(st, 1)));
  json_object_object_add(o, "status",
                         json_object_new_string((const char *)sqlite3_column_text(st, 2)));
  json_object_object_add(o, "created_at_us", json_object_new_int64(sqlite3_column_int64(st, 3)));
  json_object_object_add(o, "updated_at_us", json_object_new_int64(sqlite3_column_int64(st, 4)));
  json_object_object_add(o, "zero_data_retention",
                         json_object_new_boolean(sqlite3_column_int(st, 5)));
  if (with_content) {
    json_object_object_add(o, "request", column_json(st, 6));
    json_object_object_add(o, "output", column_json(st, 7));
  }
  json_object_object_add(o, "usage", column_json(st, 8));
  return o;
}

static json_object *
run_summary_from_row(sqlite3_stmt *st)
{
  return run_from_row(st, false);
}

static int
sq_run_get(eph_store_t *base, const char *id, json_object **out, eph_error_t *err)
{
  sq_store_t *s = SQ(base);
  int r = 0;
  pthread_mutex_lock(&s->lock);
  {
    cleanup_reset sqlite3_stmt *st = s->st[ST_RUN_GET];
    bind_text(st, 1, id);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
      *out = run_from_row(st, true);
    else if (rc != SQLITE_DONE)
      r = db_error(s, "reading the run", err);
  }
  pthread_mutex_unlock(&s->lock);
  return r;
}

static int
sq_run_list(eph_store_t *base, const char *org, int limit, int64_t after_us, const char *after_id,
            json_object **out, eph_error_t *err)
{
  sq_store_t *s = SQ(base);
  int r;
  pthread_mutex_lock(&s->lock);
  {
    cleanup_reset sqlite3_stmt *st = s->st[after_id ? ST_RUN_LIST_AFTER : ST_RUN_LIST_FIRST];
    bind_text(st, 1, org);
    sqlite3_bind_int(st, 2, limit + 1);
    if (after_id) {
      sqlite3_bind_int64(st, 3, after_us);
      bind_text(st, 4, after_id);
    }
    r = rows_collect(s, st, run_summary_from_row, "listing runs", out, err);
  }
  pthread_mutex_unlock(&s->lock);
  return r;
}

/* ---------------------------------------------------------------- events */

static int
sq_event_append(eph_store_t *base, const char *run_id, int64_t seq, int64_t t_ms,
                const char *source, const char *kind, const char *text, json_object *data,
                eph_error_t *err)
{
  sq_store_t *s = SQ(base);
  int r;
  pthread_mutex_lock(&s->lock);
  {
    cleanup_reset sqlite3_stmt *st = s->st[ST_EVENT_INSERT];
    bind_text(st, 1, run_id);
    sqlite3_bind_int64(st, 2, seq);
    sqlite3_bind_int64(st, 3, t_ms);
    bind_text(st, 4, source);
    bind_text(st, 5, kind);
    bind_text(st, 6, text);
    bind_json(st, 7, data);
    r = step_run_write(s, st, "appending the event", run_id, err);
  }
  pthread_mutex_unlock(&s->lock);
  return r;
}

static int
sq_events_append(eph_store_t *base, const char *run_id, const eph_store_event_t *evs, size_t n,
                 eph_error_t *err)
{
  sq_store_t *s = SQ(base);
  int r = tx_begin(s, err);
  if (r < 0)
    return r;
  for (size_t i = 0; i < n && r >= 0; i++) {
    cleanup_reset sqlite3_stmt *st = s->st[ST_EVENT_INSERT];
    bind_text(st, 1, run_id);
    sqlite3_bind_int64(st, 2, evs[i].seq);
    sqlite3_bind_int64(st, 3, evs[i].t_ms);
    bind_text(st, 4, evs[i].source);
    bind_text(st, 5, evs[i].kind);
    bind_text(st, 6, evs[i].text ? evs[i].text : "");
    bind_text(st, 7, evs[i].data_json);
    r = step_run_write(s, st, "appending the events", run_id, err);
  }
  return tx_end(s, r, err);
}

/* A row of ST_EVENTS_SINCE ("data" only when the event has some). */
static json_object *
event_from_row(sqlite3_stmt *st)
{
  json_object *e = json_object_new_object();
  json_object_object_add(e, "seq", json_object_new_int64(sqlite3_column_int64(st, 0)));
  json_object_object_add(e, "t_ms", json_object_new_int64(sqlite3_column_int64(st, 1)));
  json_object_object_add(e, "source",
                         json_object_new_string((const char *)sqlite3_column_text(st, 2)));
  json_object_object_add(e, "kind",
                         json_object_new_string((const char *)sqlite3_column_text(st, 3)));
  json_object_object_add(e, "text",
                         json_object_new_string((const char *)sqlite3_column_text(st, 4)));
  json_object *data = column_json(st, 5);
  if (data)
    json_object_object_add(e, "data", data);
  return e;
}

static int
sq_events_since(eph_store_t *base, const char *run_id, int64_t since_seq, int limit,
                json_object **out, eph_error_t *err)
{
  sq_store_t *s = SQ(base);
  int r;
  pthread_mutex_lock(&s->lock);
  {
    cleanup_reset sqlite3_stmt *st = s->st[ST_EVENTS_SINCE];
    bind_text(st, 1, run_id);
    sqlite3_bind_int64(st, 2, since_seq);
    sqlite3_bind_int(st, 3, limit ? limit : -1); /* LIMIT -1: no limit */
    r = rows_collect(s, st, event_from_row, "reading events", out, err);
  }
  pthread_mutex_unlock(&s->lock);
  return r;
}

/* ---------------------------------------------------------------- idempotency */

static int
sq_idem_claim(eph_store_t *base, const char *org, const char *key, const char *body_sha256_hex,
              const char *new_run_id, int64_t now, char **existing_run_id, eph_error_t *err)
{
  sq_store_t *s = SQ(base);
  cleanup_free char *existing = NULL;
  int r = tx_begin(s, err);
  if (r < 0)
    return r;
  bool expired = false;
  {
    cleanup_reset sqlite3_stmt *st = s->st[ST_IDEM_GET];
    bind_text(st, 1, org);
    bind_text(st, 2, key);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      if (sqlite3_column_int64(st, 2) < now - s->base.idempotency_us)
        expired = true;
      else if (strcmp((const char *)sqlite3_column_text(st, 0), body_sha256_hex) == 0)
        existing = column_dup(st, 1);
      else
        r = eph_error_set(
            err, EBUSY, "idempotency key '%s' was already used with a different request body", key);
    } else if (rc != SQLITE_DONE) {
      r = db_error(s, "reading the idempotency key", err);
    }
  }
  if (r >= 0 && expired) {
    cleanup_reset sqlite3_stmt *st = s->st[ST_IDEM_DELETE];
    bind_text(st, 1, org);
    bind_text(st, 2, key);
    r = step_done(s, st, "forgetting an expired idempotency key", err);
  }
  if (r >= 0 && !existing) {
    cleanup_reset sqlite3_stmt *st = s->st[ST_IDEM_INSERT];
    bind_text(st, 1, org);
    bind_text(st, 2, key);
    bind_text(st, 3, body_sha256_hex);
    bind_text(st, 4, new_run_id);
    sqlite3_bind_int64(st, 5, now);
    r = step_done(s, st, "claiming the idempotency key", err);
  }
  r = tx_end(s, r, err);
  if (r < 0)
    return r;
  if (existing) {
    *existing_run_id = steal_pointer(&existing);
    return 1;
  }
  return 0;
}

static int
sq_idem_release(eph_store_t *base, const char *org, const char *key, const char *run_id,
                eph_error_t *err)
{
  sq_store_t *s = SQ(base);
  int r;
  pthread_mutex_lock(&s->lock);
  {
    cleanup_reset sqlite3_stmt *st = s->st[ST_IDEM_RELEASE];
    bind_text(st, 1, org);
    bind_text(st, 2, key);
    bind_text(st, 3, run_id);
    r = step_done(s, st, "releasing the idempotency key", err);
  }
  pthread_mutex_unlock(&s->lock);
  return r;
}

/* ---------------------------------------------------------------- retention, health */

static int
sq_purge(eph_store_t *base, int64_t runs_before_us, int64_t idem_before_us, eph_error_t *err)
{
  sq_store_t *s = SQ(base);
  int r = tx_begin(s, err);
  if (r < 0)
    return r;
  int deleted = 0;
  {
    cleanup_reset sqlite3_stmt *st = s->st[ST_PURGE_RUNS];
    sqlite3_bind_int64(st, 1, runs_before_us);
    r = step_done(s, st, "purging runs", err);
    if (r >= 0)
      deleted = sqlite3_changes(s->db); /* events go with them: ON DELETE CASCADE */
  }
  if (r >= 0) {
    cleanup_reset sqlite3_stmt *st = s->st[ST_PURGE_IDEM];
    sqlite3_bind_int64(st, 1, idem_before_us);
    r = step_done(s, st, "purging idempotency keys", err);
  }
  r = tx_end(s, r, err);
  return r < 0 ? r : deleted;
}

static int
sq_probe(eph_store_t *base, eph_error_t *err)
{
  sq_store_t *s = SQ(base);
  int r = tx_begin(s, err);
  if (r < 0)
    return r;
  {
    cleanup_reset sqlite3_stmt *st = s->st[ST_PROBE];
    sqlite3_bind_int64(st, 1, eph_wall_us());
    r = step_done(s, st, "health probe", err);
  }
  return tx_end(s, r, err);
}

static int
sq_with_db(eph_store_t *base, int (*fn)(struct sqlite3 *db, void *opaque, eph_error_t *err),
           void *opaque, eph_error_t *err)
{
  sq_store_t *s = SQ(base);
  pthread_mutex_lock(&s->lock);
  int r = fn(s->db, opaque, err);
  pthread_mutex_unlock(&s->lock);
  return r;
}

static const eph_store_ops_t sqlite_ops = {
    .kind = EPH_STORE_SQLITE,
    .close = sq_close,
    .org_create = sq_org_create,
    .member_add = sq_member_add,
    .key_insert = sq_key_insert,
    .key_lookup = sq_key_lookup,
    .key_revoke = sq_key_revoke,
    .key_list = sq_key_list,
    .run_insert = sq_run_insert,
    .run_update = sq_run_update,
    .run_get = sq_run_get,
    .run_list = sq_run_list,
    .event_append = sq_event_append,
    .events_since = sq_events_since,
    .idem_claim = sq_idem_claim,
    .idem_release = sq_idem_release,
    .purge = sq_purge,
    .probe = sq_probe,
    .with_db = sq_with_db,
    .events_append = sq_events_append,
};

/* ---------------------------------------------------------------- open */

int
eph_store_sqlite_open(const char *path, const eph_store_options_t *opt, eph_store_t **out,
                      eph_error_t *err)
{
  int busy_ms = opt->busy_timeout_ms;
  sq_store_t *s = eph_xcalloc(1, sizeof *s);
  eph_store_base_init(&s->base, &sqlite_ops, path,
                      (int64_t)opt->idempotency_hours * 3600 * 1000000);
  pthread_mutex_init(&s->lock, NULL);
  /* History and key hashes: owner-only. */
  /* Checked at every open: what authenticates and authorises (history is checked whole by
   * the daemon at start and by `ephemeral doctor`; see check_whole). */
  static const char *const small_tables[] = {"organisations", "members", "api_keys", "probe", NULL};
  eph_sqlite_open_options_t so = {.what = "store",
                                  .check_tables = small_tables,
                                  .check_whole = opt->check_whole,
                                  .busy_timeout_ms = busy_ms,
                                  .synchronous = "NORMAL",
                                  .owner_only = true,
                                  .damaged_hint =
                                      "restore it from a backup or move it away to start empty"};
  int r = eph_sqlite_open(path, &so, &s->db, err);
  if (r < 0)
    goto fail;
  if ((r = eph_sqlite_migrate(s->db, path, migrations, SCHEMA_VERSION, "program", err)) < 0)
    goto fail;
  s->base.schema_version = SCHEMA_VERSION;
  if ((r = eph_sqlite_prepare_all(s->db, path, statement_sql, ST_COUNT, s->st, err)) < 0)
    goto fail;
  *out = &s->base;
  return 0;
fail:
  sq_close(&s->base);
  return r;
}
