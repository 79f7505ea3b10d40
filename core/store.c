/* The store: run history, API keys, idempotency keys. See store.h for the contract. */
#include "config.h"

#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sqlite3.h>

#include "support/sqlite.h"

#include "log.h"
#include "util.h"

#define MAX_ID_BYTES 128
#define KEY_PREFIX "eph_"
#define KEY_RANDOM_BYTES 24 /* 48 hex digits: 192 bits */

/* Migrations: entry i brings user_version from i to i + 1. Append, never edit. */
static const char *const migrations[] = {
  /* 0 -> 1 */
  "CREATE TABLE organisations ("
  "  id TEXT PRIMARY KEY NOT NULL,"
  "  created_at_us INTEGER NOT NULL"
  ");"
  "CREATE TABLE members ("
  "  org TEXT NOT NULL REFERENCES organisations(id) ON DELETE CASCADE,"
  "  member TEXT NOT NULL,"
  "  role TEXT NOT NULL CHECK (role IN ('owner', 'admin', 'member')),"
  "  created_at_us INTEGER NOT NULL,"
  "  PRIMARY KEY (org, member)"
  ");"
  "CREATE TABLE api_keys ("
  "  id TEXT PRIMARY KEY NOT NULL,"
  "  org TEXT NOT NULL REFERENCES organisations(id) ON DELETE CASCADE,"
  "  name TEXT NOT NULL,"
  "  sha256 BLOB NOT NULL UNIQUE CHECK (length(sha256) = 32),"
  "  created_at_us INTEGER NOT NULL,"
  "  revoked_at_us INTEGER"
  ");"
  "CREATE UNIQUE INDEX api_keys_active_name ON api_keys(org, name)"
  "  WHERE revoked_at_us IS NULL;"
  "CREATE TABLE runs ("
  "  id TEXT PRIMARY KEY NOT NULL,"
  "  org TEXT NOT NULL,"
  "  status TEXT NOT NULL,"
  "  created_at_us INTEGER NOT NULL,"
  "  updated_at_us INTEGER NOT NULL,"
  "  zdr INTEGER NOT NULL CHECK (zdr IN (0, 1)),"
  "  request TEXT NOT NULL,"
  "  output TEXT CHECK (output IS NULL OR zdr = 0),"
  "  usage TEXT"
  ");"
  "CREATE INDEX runs_org_created ON runs(org, created_at_us DESC, id DESC);"
  "CREATE INDEX runs_created ON runs(created_at_us);"
  "CREATE TABLE events ("
  "  run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,"
  "  seq INTEGER NOT NULL CHECK (seq >= 0),"
  "  t_ms INTEGER NOT NULL,"
  "  source TEXT NOT NULL,"
  "  kind TEXT NOT NULL,"
  "  text TEXT NOT NULL,"
  "  data TEXT,"
  "  PRIMARY KEY (run_id, seq)"
  ") WITHOUT ROWID;"
  /* Backstop for zero data retention: the insert statement already drops the payload. */
  "CREATE TRIGGER events_zdr BEFORE INSERT ON events"
  "  WHEN NEW.data IS NOT NULL AND (SELECT zdr FROM runs WHERE id = NEW.run_id) = 1 BEGIN"
  "  SELECT RAISE(ABORT, 'zero data retention: event payload refused');"
  "END;"
  "CREATE TABLE idempotency ("
  "  org TEXT NOT NULL,"
  "  key TEXT NOT NULL,"
  "  body_sha256 TEXT NOT NULL CHECK (length(body_sha256) = 64),"
  "  run_id TEXT NOT NULL,"
  "  created_at_us INTEGER NOT NULL,"
  "  PRIMARY KEY (org, key)"
  ") WITHOUT ROWID;"
  "CREATE INDEX idempotency_created ON idempotency(created_at_us);",
  /* 1 -> 2: one row the health probe rewrites, so "can the store commit?" is answered by a
   * real commit (a full disk fails it) without touching history. */
  "CREATE TABLE probe ("
  "  id INTEGER PRIMARY KEY CHECK (id = 1),"
  "  t_us INTEGER NOT NULL"
  ");",
  /* 2 -> 3: webhooks (core/webhook.c): an organisation's endpoints and every delivery of a
   * run's end, kept until delivered or given up, so a restart loses none. */
  "CREATE TABLE webhooks ("
  "  id TEXT PRIMARY KEY NOT NULL,"
  "  org TEXT NOT NULL,"
  "  url TEXT NOT NULL,"
  "  secret TEXT NOT NULL,"
  "  created_at_us INTEGER NOT NULL,"
  "  deleted_at_us INTEGER,"
  /* 'default': the org's signing secret for requests' own webhook_url (url unused). */
  "  kind TEXT NOT NULL DEFAULT 'endpoint' CHECK (kind IN ('endpoint', 'default'))"
  ");"
  "CREATE UNIQUE INDEX webhooks_default ON webhooks(org) WHERE kind = 'default';"
  "CREATE INDEX webhooks_org ON webhooks(org);"
  "CREATE TABLE webhook_deliveries ("
  "  id TEXT PRIMARY KEY NOT NULL,"
  "  webhook_id TEXT NOT NULL REFERENCES webhooks(id),"
  "  org TEXT NOT NULL,"
  "  run_id TEXT NOT NULL,"
  "  url TEXT NOT NULL,"
  "  body TEXT NOT NULL,"
  "  status TEXT NOT NULL CHECK (status IN ('pending', 'delivered', 'failed')),"
  "  attempts INTEGER NOT NULL DEFAULT 0,"
  "  next_attempt_us INTEGER NOT NULL,"
  "  last_status_code INTEGER,"
  "  last_error TEXT,"
  "  created_at_us INTEGER NOT NULL,"
  "  updated_at_us INTEGER NOT NULL,"
  "  UNIQUE (webhook_id, run_id)"
  ");"
  "CREATE INDEX webhook_deliveries_due ON webhook_deliveries(status, next_attempt_us);"
  "CREATE INDEX webhook_deliveries_org ON webhook_deliveries(org, created_at_us DESC);",
  /* 3 -> 4: admin keys and the audit trail of admin actions (core/admin.c). */
  "ALTER TABLE api_keys ADD COLUMN admin INTEGER NOT NULL DEFAULT 0 CHECK (admin IN (0, 1));"
  "CREATE TABLE audit ("
  "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
  "  at_us INTEGER NOT NULL,"
  "  actor_key_id TEXT NOT NULL,"
  "  actor_org TEXT NOT NULL,"
  "  action TEXT NOT NULL,"
  "  target_org TEXT,"
  "  target TEXT,"
  "  detail TEXT,"
  "  address TEXT NOT NULL,"
  "  status INTEGER NOT NULL"
  ");"
  "CREATE INDEX audit_at ON audit(at_us);",
};
#define SCHEMA_VERSION ((int)(sizeof migrations / sizeof migrations[0]))

enum {
  ST_BEGIN,
  ST_COMMIT,
  ST_ROLLBACK,
  ST_ORG_ENSURE,
  ST_ORG_EXISTS,
  ST_MEMBER_PUT,
  ST_KEY_INSERT,
  ST_KEY_BY_HASH,
  ST_KEY_REVOKE,
  ST_KEY_LIST,
  ST_RUN_INSERT,
  ST_RUN_UPDATE,
  ST_RUN_GET,
  ST_RUN_LIST_FIRST,
  ST_RUN_LIST_AFTER,
  ST_EVENT_INSERT,
  ST_EVENTS_SINCE,
  ST_IDEM_GET,
  ST_IDEM_DELETE,
  ST_IDEM_INSERT,
  ST_IDEM_RELEASE,
  ST_PURGE_RUNS,
  ST_PURGE_IDEM,
  ST_PROBE,
  ST_COUNT
};

static const char *const statement_sql[ST_COUNT] = {
  [ST_BEGIN] = "BEGIN IMMEDIATE",
  [ST_COMMIT] = "COMMIT",
  [ST_ROLLBACK] = "ROLLBACK",
  [ST_ORG_ENSURE] = "INSERT INTO organisations(id, created_at_us) VALUES (?1, ?2)"
                    " ON CONFLICT(id) DO NOTHING",
  [ST_ORG_EXISTS] = "SELECT 1 FROM organisations WHERE id = ?1",
  [ST_MEMBER_PUT] = "INSERT INTO members(org, member, role, created_at_us)"
                    " VALUES (?1, ?2, ?3, ?4)"
                    " ON CONFLICT(org, member) DO UPDATE SET role = excluded.role",
  [ST_KEY_INSERT] = "INSERT INTO api_keys(id, org, name, sha256, created_at_us)"
                    " VALUES (?1, ?2, ?3, ?4, ?5)",
  [ST_KEY_BY_HASH] = "SELECT id, org, sha256 FROM api_keys"
                     " WHERE sha256 = ?1 AND revoked_at_us IS NULL",
  [ST_KEY_REVOKE] = "UPDATE api_keys SET revoked_at_us = ?3"
                    " WHERE org = ?2 AND (id = ?1 OR name = ?1) AND revoked_at_us IS NULL",
  [ST_KEY_LIST] = "SELECT id, name, created_at_us, revoked_at_us FROM api_keys"
                  " WHERE org = ?1 ORDER BY created_at_us DESC, id DESC",
  [ST_RUN_INSERT] = "INSERT INTO runs(id, org, status, created_at_us, updated_at_us, zdr,"
                    " request) VALUES (?1, ?2, ?3, ?4, ?4, ?5, ?6)",
  /* output is kept NULL under zdr whatever is bound. */
  [ST_RUN_UPDATE] = "UPDATE runs SET status = coalesce(?2, status),"
                    " output = CASE WHEN zdr = 1 THEN NULL ELSE coalesce(?3, output) END,"
                    " usage = coalesce(?4, usage), updated_at_us = ?5 WHERE id = ?1",
  [ST_RUN_GET] = "SELECT id, org, status, created_at_us, updated_at_us, zdr, request, output,"
                 " usage FROM runs WHERE id = ?1",
  [ST_RUN_LIST_FIRST] = "SELECT id, org, status, created_at_us, updated_at_us, zdr, NULL,"
                        " NULL, usage FROM runs WHERE org = ?1"
                        " ORDER BY created_at_us DESC, id DESC LIMIT ?2",
  [ST_RUN_LIST_AFTER] = "SELECT id, org, status, created_at_us, updated_at_us, zdr, NULL,"
                        " NULL, usage FROM runs WHERE org = ?1"
                        " AND (created_at_us < ?3 OR (created_at_us = ?3 AND id < ?4))"
                        " ORDER BY created_at_us DESC, id DESC LIMIT ?2",
  /* One statement decides on zdr from the run row itself: no window between a check and
   * the insert. No row is inserted for an unknown run. */
  [ST_EVENT_INSERT] = "INSERT INTO events(run_id, seq, t_ms, source, kind, text, data)"
                      " SELECT id, ?2, ?3, ?4, ?5, ?6, CASE WHEN zdr = 1 THEN NULL ELSE ?7 END"
                      " FROM runs WHERE id = ?1",
  [ST_EVENTS_SINCE] = "SELECT seq, t_ms, source, kind, text, data FROM events"
                      " WHERE run_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
  [ST_IDEM_GET] = "SELECT body_sha256, run_id, created_at_us FROM idempotency"
                  " WHERE org = ?1 AND key = ?2",
  [ST_IDEM_DELETE] = "DELETE FROM idempotency WHERE org = ?1 AND key = ?2",
  [ST_IDEM_INSERT] = "INSERT INTO idempotency(org, key, body_sha256, run_id, created_at_us)"
                     " VALUES (?1, ?2, ?3, ?4, ?5)",
  [ST_PURGE_RUNS] = "DELETE FROM runs WHERE created_at_us < ?1",
  [ST_IDEM_RELEASE] = "DELETE FROM idempotency WHERE org = ?1 AND key = ?2 AND run_id = ?3",
  [ST_PURGE_IDEM] = "DELETE FROM idempotency WHERE created_at_us < ?1",
  [ST_PROBE] = "INSERT INTO probe(id, t_us) VALUES (1, ?1)"
               " ON CONFLICT(id) DO UPDATE SET t_us = excluded.t_us",
};

struct eph_store {
  char *path;
  sqlite3 *db;
  sqlite3_stmt *st[ST_COUNT];
  pthread_mutex_t lock; /* one connection, one user at a time: see store.h */
  int64_t idempotency_us;
  /* The last storage fault (full disk, I/O error, damaged page) until a write succeeds
   * again: read by health checks without waiting for `lock`. */
  pthread_mutex_t fault_lock;
  char fault[512];
  /* A damaged page found while serving: sticky until the file is reopened (and refused by
   * quick_check), since a later write elsewhere in the file proves nothing about it. */
  char damaged[512];
};

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

/* Records a fault; logged once when the store goes from healthy to failing (a full disk
 * fails every write: one line, not thousands). */
static void
fault_set(eph_store_t *s, int rc, const char *message)
{
  pthread_mutex_lock(&s->fault_lock);
  bool was_ok = !s->fault[0] && !s->damaged[0];
  if ((rc & 0xff) == SQLITE_CORRUPT || (rc & 0xff) == SQLITE_NOTADB)
    snprintf(s->damaged, sizeof s->damaged, "%s", message);
  else
    snprintf(s->fault, sizeof s->fault, "%s", message);
  pthread_mutex_unlock(&s->fault_lock);
  if (was_ok)
    eph_error("%s (the store is failing; see /v1/health or `ephemeral doctor`)", message);
}

static void
fault_clear(eph_store_t *s)
{
  pthread_mutex_lock(&s->fault_lock);
  bool was_failing = s->fault[0] != '\0';
  s->fault[0] = '\0';
  pthread_mutex_unlock(&s->fault_lock);
  if (was_failing)
    eph_info("%s: writes succeed again", s->path);
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
db_error(eph_store_t *s, const char *what, eph_error_t *err)
{
  int rc = sqlite3_extended_errcode(s->db);
  int code = eph_sqlite_errno(rc);
  int r = eph_error_set(err, code, "%s: %s: %s", s->path, what, sqlite3_errmsg(s->db));
  if (is_fault(rc)) {
    char msg[sizeof s->fault];
    snprintf(msg, sizeof msg, "%s: %s: %s", s->path, what, sqlite3_errmsg(s->db));
    fault_set(s, rc, msg);
  }
  return r;
}

/* Steps a statement that yields no row we need; 0 or negative. */
static int
step_done(eph_store_t *s, sqlite3_stmt *st, const char *what, eph_error_t *err)
{
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW)
    ;
  return rc == SQLITE_DONE ? 0 : db_error(s, what, err);
}

static int
run_simple(eph_store_t *s, int which, const char *what, eph_error_t *err)
{
  cleanup_reset sqlite3_stmt *st = s->st[which];
  return step_done(s, st, what, err);
}

/* Locks the store and opens a write transaction; on failure the lock is released. */
static int
tx_begin(eph_store_t *s, eph_error_t *err)
{
  pthread_mutex_lock(&s->lock);
  int r = run_simple(s, ST_BEGIN, "BEGIN IMMEDIATE", err);
  if (r < 0)
    pthread_mutex_unlock(&s->lock);
  return r;
}

/* Commits when r >= 0, else rolls back; unlocks; returns r or the commit's error. */
static int
tx_end(eph_store_t *s, int r, eph_error_t *err)
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

static int
check_text(const char *what, const char *v, size_t max, eph_error_t *err)
{
  if (!v || !*v)
    return eph_error_set(err, EINVAL, "%s: empty", what);
  if (strlen(v) > max)
    return eph_error_set(err, EINVAL, "%s: longer than %zu bytes", what, max);
  return 0;
}

static int
check_org(const char *org, eph_error_t *err)
{
  int r = check_text("organisation", org, 64, err);
  if (r < 0)
    return r;
  if (strspn(org, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") !=
      strlen(org))
    return eph_error_set(err, EINVAL, "organisation '%s': only letters, digits, '_.-'", org);
  return 0;
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

int
eph_sha256_hex(const void *data, size_t bytes, char out[65], eph_error_t *err)
{
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(data, bytes, md, &n, EVP_sha256(), NULL) != 1 || n != 32)
    return eph_error_set(err, EIO, "SHA-256: OpenSSL EVP_Digest failed");
  for (unsigned i = 0; i < n; i++)
    snprintf(out + 2 * i, 3, "%02x", md[i]);
  return 0;
}

/* ---------------------------------------------------------------- open / close */

void
eph_store_close(eph_store_t *s)
{
  if (!s)
    return;
  eph_sqlite_finalize_all(s->st, ST_COUNT);
  if (s->db)
    sqlite3_close(s->db);
  pthread_mutex_destroy(&s->lock);
  pthread_mutex_destroy(&s->fault_lock);
  free(s->path);
  free(s);
}

int
eph_store_open(const char *path, const eph_store_options_t *opt, eph_store_t **out,
               eph_error_t *err)
{
  int idem_hours = opt && opt->idempotency_hours ? opt->idempotency_hours : 24;
  int busy_ms = opt && opt->busy_timeout_ms ? opt->busy_timeout_ms : 5000;
  if (!path || !*path)
    return eph_error_set(err, EINVAL, "store: no path");
  if (idem_hours < 24)
    return eph_error_set(err, EINVAL,
                         "store: idempotency_hours %d is below 24: clients retry for a day",
                         idem_hours);
  if (busy_ms < 0)
    return eph_error_set(err, EINVAL, "store: busy_timeout_ms %d is negative", busy_ms);

  eph_store_t *s = eph_xcalloc(1, sizeof *s);
  pthread_mutex_init(&s->lock, NULL);
  pthread_mutex_init(&s->fault_lock, NULL);
  s->path = eph_xstrdup(path);
  s->idempotency_us = (int64_t)idem_hours * 3600 * 1000000;
  /* History and key hashes: owner-only. */
  eph_sqlite_open_options_t so = {
    .what = "store", .busy_timeout_ms = busy_ms, .synchronous = "NORMAL", .owner_only = true,
    .damaged_hint = "restore it from a backup or move it away to start empty"};
  int r = eph_sqlite_open(path, &so, &s->db, err);
  if (r < 0)
    goto fail;
  if ((r = eph_sqlite_migrate(s->db, path, migrations, SCHEMA_VERSION, "program", err)) < 0)
    goto fail;
  if ((r = eph_sqlite_prepare_all(s->db, path, statement_sql, ST_COUNT, s->st, err)) < 0)
    goto fail;
  *out = s;
  return 0;
fail:
  eph_store_close(s);
  return r;
}

/* ---------------------------------------------------------------- organisations */

static int
org_ensure(eph_store_t *s, const char *org, eph_error_t *err)
{
  cleanup_reset sqlite3_stmt *st = s->st[ST_ORG_ENSURE];
  bind_text(st, 1, org);
  sqlite3_bind_int64(st, 2, eph_wall_us());
  return step_done(s, st, "creating the organisation", err);
}

int
eph_store_org_create(eph_store_t *s, const char *org, eph_error_t *err)
{
  int r = check_org(org, err);
  if (r < 0 || (r = tx_begin(s, err)) < 0)
    return r;
  return tx_end(s, org_ensure(s, org, err), err);
}

int
eph_store_member_add(eph_store_t *s, const char *org, const char *member, const char *role,
                     eph_error_t *err)
{
  int r = check_org(org, err);
  if (r < 0 || (r = check_text("member", member, 256, err)) < 0)
    return r;
  if (!role || (strcmp(role, "owner") && strcmp(role, "admin") && strcmp(role, "member")))
    return eph_error_set(err, EINVAL, "member role '%s': expected owner, admin or member",
                         role ? role : "(null)");
  if ((r = tx_begin(s, err)) < 0)
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
key_hash(const char *key, unsigned char md[32], eph_error_t *err)
{
  unsigned int n = 0;
  if (EVP_Digest(key, strlen(key), md, &n, EVP_sha256(), NULL) != 1 || n != 32)
    return eph_error_set(err, EIO, "SHA-256: OpenSSL EVP_Digest failed");
  return 0;
}

int
eph_store_key_create(eph_store_t *s, const char *org, const char *name, char **key_out,
                     char **key_id_out, eph_error_t *err)
{
  int r = check_org(org, err);
  if (r < 0 || (r = check_text("key name", name, 128, err)) < 0)
    return r;
  char key[sizeof KEY_PREFIX + 2 * KEY_RANDOM_BYTES], id[4 + 16 + 1];
  memcpy(key, KEY_PREFIX, sizeof KEY_PREFIX - 1);
  memcpy(id, "key_", 4);
  if ((r = eph_random_hex(key + sizeof KEY_PREFIX - 1, KEY_RANDOM_BYTES)) < 0 ||
      (r = eph_random_hex(id + 4, 8)) < 0)
    return eph_error_set(err, -r, "generating an API key: %s", strerror(-r));
  unsigned char md[32];
  if ((r = key_hash(key, md, err)) < 0)
    return r;
  if ((r = tx_begin(s, err)) < 0) {
    OPENSSL_cleanse(key, sizeof key);
    return r;
  }
  r = org_ensure(s, org, err);
  if (r >= 0) {
    cleanup_reset sqlite3_stmt *st = s->st[ST_KEY_INSERT];
    bind_text(st, 1, id);
    bind_text(st, 2, org);
    bind_text(st, 3, name);
    sqlite3_bind_blob(st, 4, md, sizeof md, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, eph_wall_us());
    r = step_done(s, st, "storing the API key", err);
    if (r == -EEXIST)
      r = eph_error_set(err, EEXIST, "organisation '%s' already has an active key named '%s'",
                        org, name);
  }
  r = tx_end(s, r, err);
  if (r >= 0) {
    *key_out = eph_xstrdup(key);
    if (key_id_out)
      *key_id_out = eph_xstrdup(id);
  }
  OPENSSL_cleanse(key, sizeof key);
  return r;
}

static bool
key_well_formed(const char *key)
{
  size_t p = sizeof KEY_PREFIX - 1;
  return key && strncmp(key, KEY_PREFIX, p) == 0 && strlen(key) == p + 2 * KEY_RANDOM_BYTES &&
         strspn(key + p, "0123456789abcdef") == 2 * KEY_RANDOM_BYTES;
}

int
eph_store_key_verify(eph_store_t *s, const char *key, char **org_out, char **key_id_out,
                     eph_error_t *err)
{
  if (!key_well_formed(key))
    return eph_error_set(err, EACCES, "invalid API key");
  unsigned char md[32];
  int r = key_hash(key, md, err);
  if (r < 0)
    return r;
  cleanup_free char *org = NULL, *id = NULL;
  pthread_mutex_lock(&s->lock);
  {
    cleanup_reset sqlite3_stmt *st = s->st[ST_KEY_BY_HASH];
    sqlite3_bind_blob(st, 1, md, sizeof md, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      const void *stored = sqlite3_column_blob(st, 2);
      if (stored && sqlite3_column_bytes(st, 2) == sizeof md &&
          CRYPTO_memcmp(stored, md, sizeof md) == 0) {
        id = column_dup(st, 0);
        org = column_dup(st, 1);
      }
    } else if (rc != SQLITE_DONE) {
      r = db_error(s, "looking up the API key", err);
    }
  }
  pthread_mutex_unlock(&s->lock);
  if (r < 0)
    return r;
  if (!id)
    return eph_error_set(err, EACCES, "invalid API key");
  if (org_out)
    *org_out = steal_pointer(&org);
  if (key_id_out)
    *key_id_out = steal_pointer(&id);
  return 0;
}

int
eph_store_key_revoke(eph_store_t *s, const char *key_id_or_name, const char *org,
                     eph_error_t *err)
{
  int r = check_org(org, err);
  if (r < 0 || (r = check_text("key", key_id_or_name, 128, err)) < 0)
    return r;
  if ((r = tx_begin(s, err)) < 0)
    return r;
  {
    cleanup_reset sqlite3_stmt *st = s->st[ST_KEY_REVOKE];
    bind_text(st, 1, key_id_or_name);
    bind_text(st, 2, org);
    sqlite3_bind_int64(st, 3, eph_wall_us());
    r = step_done(s, st, "revoking the API key", err);
  }
  if (r >= 0 && sqlite3_changes(s->db) == 0)
    r = eph_error_set(err, ENOENT, "organisation '%s' has no active key '%s'", org,
                      key_id_or_name);
  return tx_end(s, r, err);
}

int
eph_store_key_list(eph_store_t *s, const char *org, json_object **out, eph_error_t *err)
{
  int r = check_org(org, err);
  if (r < 0)
    return r;
  cleanup_json json_object *arr = json_object_new_array();
  pthread_mutex_lock(&s->lock);
  {
    cleanup_reset sqlite3_stmt *st = s->st[ST_KEY_LIST];
    bind_text(st, 1, org);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
      json_object *k = json_object_new_object();
      json_object_object_add(k, "id", json_object_new_string((const char *)sqlite3_column_text(st, 0)));
      json_object_object_add(k, "name", json_object_new_string((const char *)sqlite3_column_text(st, 1)));
      json_object_object_add(k, "created_at_us", json_object_new_int64(sqlite3_column_int64(st, 2)));
      json_object_object_add(k, "revoked_at_us",
                             sqlite3_column_type(st, 3) == SQLITE_NULL
                               ? NULL
                               : json_object_new_int64(sqlite3_column_int64(st, 3)));
      json_object_array_add(arr, k);
    }
    if (rc != SQLITE_DONE)
      r = db_error(s, "listing API keys", err);
  }
  pthread_mutex_unlock(&s->lock);
  if (r < 0)
    return r;
  *out = steal_pointer(&arr);
  return 0;
}

/* ---------------------------------------------------------------- runs */

/* The request as stored under zero data retention: booleans, numbers and null (the
 * permission table, budget, timeout), "model" and "connections" (names and methods); every
 * other string, object or array (prompt, inline files) is content and is dropped. */
static json_object *
request_without_content(json_object *request)
{
  json_object *out = json_object_new_object();
  json_object_object_foreach(request, k, v)
  {
    json_type t = json_object_get_type(v);
    if (t == json_type_boolean || t == json_type_int || t == json_type_double ||
        t == json_type_null || strcmp(k, "model") == 0 || strcmp(k, "connections") == 0)
      json_object_object_add(out, k, json_object_get(v));
  }
  return out;
}

int
eph_store_run_insert(eph_store_t *s, const char *id, const char *org, const char *status,
                     int64_t created_at_us, json_object *request, bool zdr, eph_error_t *err)
{
  int r = check_text("run id", id, MAX_ID_BYTES, err);
  if (r < 0 || (r = check_org(org, err)) < 0 || (r = check_text("status", status, 64, err)) < 0)
    return r;
  if (request && !json_object_is_type(request, json_type_object))
    return eph_error_set(err, EINVAL, "run %s: request is not a JSON object", id);
  cleanup_json json_object *stored =
    !request ? json_object_new_object()
             : zdr ? request_without_content(request) : json_object_get(request);
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
  if (r == -EEXIST)
    return eph_error_set(err, EEXIST, "run %s already exists", id);
  return r;
}

int
eph_store_run_update(eph_store_t *s, const char *id, const char *status, json_object *output,
                     json_object *usage, eph_error_t *err)
{
  int r = check_text("run id", id, MAX_ID_BYTES, err);
  if (r < 0)
    return r;
  pthread_mutex_lock(&s->lock);
  {
    cleanup_reset sqlite3_stmt *st = s->st[ST_RUN_UPDATE];
    bind_text(st, 1, id);
    bind_text(st, 2, status);
    bind_json(st, 3, output);
    bind_json(st, 4, usage);
    sqlite3_bind_int64(st, 5, eph_wall_us());
    r = step_done(s, st, "updating the run", err);
    if (r >= 0)
      fault_clear(s);
    if (r >= 0 && sqlite3_changes(s->db) == 0)
      r = eph_error_set(err, ENOENT, "run %s does not exist", id);
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
  json_object_object_add(o, "org", json_object_new_string((const char *)sqlite3_column_text(st, 1)));
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

int
eph_store_run_get(eph_store_t *s, const char *id, const char *org, json_object **out,
                  eph_error_t *err)
{
  int r = check_text("run id", id, MAX_ID_BYTES, err);
  if (r < 0)
    return r;
  cleanup_json json_object *run = NULL;
  pthread_mutex_lock(&s->lock);
  {
    cleanup_reset sqlite3_stmt *st = s->st[ST_RUN_GET];
    bind_text(st, 1, id);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      if (!org || strcmp(org, (const char *)sqlite3_column_text(st, 1)) == 0)
        run = run_from_row(st, true);
    } else if (rc != SQLITE_DONE) {
      r = db_error(s, "reading the run", err);
    }
  }
  pthread_mutex_unlock(&s->lock);
  if (r < 0)
    return r;
  if (!run)
    return eph_error_set(err, ENOENT, "run %s does not exist", id);
  *out = steal_pointer(&run);
  return 0;
}

/* The cursor is the last row's (created_at_us, id), hex-encoded so clients treat it as
 * opaque and cannot smuggle anything but those two values. */
static char *
cursor_encode(int64_t created_at_us, const char *id)
{
  cleanup_free char *plain = eph_xasprintf("%" PRId64 ":%s", created_at_us, id);
  size_t n = strlen(plain);
  char *out = eph_xmalloc(2 * n + 1);
  for (size_t i = 0; i < n; i++)
    snprintf(out + 2 * i, 3, "%02x", (unsigned char)plain[i]);
  return out;
}

static int
cursor_decode(const char *cursor, int64_t *created_at_us, char **id, eph_error_t *err)
{
  size_t n = strlen(cursor);
  if (n == 0 || n % 2 || n > 2 * (MAX_ID_BYTES + 24) ||
      strspn(cursor, "0123456789abcdef") != n)
    return eph_error_set(err, EINVAL, "cursor: malformed");
  cleanup_free char *plain = eph_xmalloc(n / 2 + 1);
  for (size_t i = 0; i < n / 2; i++) {
    unsigned v;
    sscanf(cursor + 2 * i, "%2x", &v);
    plain[i] = (char)v;
  }
  plain[n / 2] = '\0';
  char *colon = strchr(plain, ':');
  if (!colon || colon == plain || !colon[1] || strlen(plain) != n / 2)
    return eph_error_set(err, EINVAL, "cursor: malformed");
  *colon = '\0';
  char *end = NULL;
  errno = 0;
  long long v = strtoll(plain, &end, 10);
  if (errno || *end)
    return eph_error_set(err, EINVAL, "cursor: malformed");
  *created_at_us = v;
  *id = eph_xstrdup(colon + 1);
  return 0;
}

int
eph_store_run_list(eph_store_t *s, const char *org, int limit, const char *cursor,
                   json_object **runs_out, char **next_cursor, eph_error_t *err)
{
  int r = check_org(org, err);
  if (r < 0)
    return r;
  if (limit == 0)
    limit = 50;
  if (limit < 1 || limit > 1000)
    return eph_error_set(err, EINVAL, "limit %d: expected 1..1000", limit);
  int64_t after_us = 0;
  cleanup_free char *after_id = NULL;
  if (cursor && (r = cursor_decode(cursor, &after_us, &after_id, err)) < 0)
    return r;
  cleanup_json json_object *arr = json_object_new_array();
  cleanup_free char *next = NULL;
  pthread_mutex_lock(&s->lock);
  {
    cleanup_reset sqlite3_stmt *st = s->st[cursor ? ST_RUN_LIST_AFTER : ST_RUN_LIST_FIRST];
    bind_text(st, 1, org);
    /* One row more than asked tells whether another page exists. */
    sqlite3_bind_int(st, 2, limit + 1);
    if (cursor) {
      sqlite3_bind_int64(st, 3, after_us);
      bind_text(st, 4, after_id);
    }
    int rc, n = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
      if (n == limit) {
        json_object *last = json_object_array_get_idx(arr, (size_t)n - 1);
        next = cursor_encode(json_object_get_int64(json_object_object_get(last, "created_at_us")),
                             json_object_get_string(json_object_object_get(last, "id")));
        break;
      }
      json_object_array_add(arr, run_from_row(st, false));
      n++;
    }
    if (rc != SQLITE_DONE && rc != SQLITE_ROW)
      r = db_error(s, "listing runs", err);
  }
  pthread_mutex_unlock(&s->lock);
  if (r < 0)
    return r;
  *runs_out = steal_pointer(&arr);
  *next_cursor = steal_pointer(&next);
  return 0;
}

/* ---------------------------------------------------------------- events */

int
eph_store_event_append(eph_store_t *s, const char *run_id, int64_t seq, int64_t t_ms,
                       const char *source, const char *kind, const char *text,
                       json_object *data, eph_error_t *err)
{
  int r = check_text("run id", run_id, MAX_ID_BYTES, err);
  if (r < 0 || (r = check_text("event source", source, 64, err)) < 0 ||
      (r = check_text("event kind", kind, 64, err)) < 0)
    return r;
  if (seq < 0)
    return eph_error_set(err, EINVAL, "event seq %" PRId64 ": negative", seq);
  pthread_mutex_lock(&s->lock);
  {
    cleanup_reset sqlite3_stmt *st = s->st[ST_EVENT_INSERT];
    bind_text(st, 1, run_id);
    sqlite3_bind_int64(st, 2, seq);
    sqlite3_bind_int64(st, 3, t_ms);
    bind_text(st, 4, source);
    bind_text(st, 5, kind);
    bind_text(st, 6, text ? text : "");
    bind_json(st, 7, data);
    r = step_done(s, st, "appending the event", err);
    if (r >= 0)
      fault_clear(s);
    if (r == -EEXIST)
      r = eph_error_set(err, EEXIST, "run %s already has event %" PRId64, run_id, seq);
    else if (r >= 0 && sqlite3_changes(s->db) == 0)
      r = eph_error_set(err, ENOENT, "run %s does not exist", run_id);
  }
  pthread_mutex_unlock(&s->lock);
  return r;
}

int
eph_store_events_since(eph_store_t *s, const char *run_id, int64_t since_seq, int limit,
                       json_object **out, eph_error_t *err)
{
  int r = check_text("run id", run_id, MAX_ID_BYTES, err);
  if (r < 0)
    return r;
  if (limit < 0)
    return eph_error_set(err, EINVAL, "limit %d: negative", limit);
  cleanup_json json_object *arr = json_object_new_array();
  pthread_mutex_lock(&s->lock);
  {
    cleanup_reset sqlite3_stmt *st = s->st[ST_EVENTS_SINCE];
    bind_text(st, 1, run_id);
    sqlite3_bind_int64(st, 2, since_seq);
    sqlite3_bind_int(st, 3, limit ? limit : -1); /* LIMIT -1: no limit */
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
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
      json_object_array_add(arr, e);
    }
    if (rc != SQLITE_DONE)
      r = db_error(s, "reading events", err);
  }
  pthread_mutex_unlock(&s->lock);
  if (r < 0)
    return r;
  *out = steal_pointer(&arr);
  return 0;
}

/* ---------------------------------------------------------------- idempotency */

int
eph_store_idem_claim(eph_store_t *s, const char *org, const char *key,
                     const char *body_sha256_hex, const char *new_run_id,
                     char **existing_run_id, eph_error_t *err)
{
  int r = check_org(org, err);
  if (r < 0 || (r = check_text("idempotency key", key, 255, err)) < 0 ||
      (r = check_text("run id", new_run_id, MAX_ID_BYTES, err)) < 0)
    return r;
  if (!body_sha256_hex || strlen(body_sha256_hex) != 64 ||
      strspn(body_sha256_hex, "0123456789abcdef") != 64)
    return eph_error_set(err, EINVAL, "body_sha256_hex: expected 64 lowercase hex digits");
  int64_t now = eph_wall_us();
  cleanup_free char *existing = NULL;
  if ((r = tx_begin(s, err)) < 0)
    return r;
  bool expired = false;
  {
    cleanup_reset sqlite3_stmt *st = s->st[ST_IDEM_GET];
    bind_text(st, 1, org);
    bind_text(st, 2, key);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      if (sqlite3_column_int64(st, 2) < now - s->idempotency_us)
        expired = true;
      else if (strcmp((const char *)sqlite3_column_text(st, 0), body_sha256_hex) == 0)
        existing = column_dup(st, 1);
      else
        r = eph_error_set(err, EBUSY,
                          "idempotency key '%s' was already used with a different request body",
                          key);
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

int
eph_store_idem_release(eph_store_t *s, const char *org, const char *key, const char *run_id,
                       eph_error_t *err)
{
  int r = check_org(org, err);
  if (r < 0 || (r = check_text("idempotency key", key, 255, err)) < 0 ||
      (r = check_text("run id", run_id, MAX_ID_BYTES, err)) < 0)
    return r;
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

/* ---------------------------------------------------------------- retention */

int
eph_store_purge(eph_store_t *s, int retention_days, eph_error_t *err)
{
  if (retention_days <= 0)
    return eph_error_set(err, EINVAL, "retention_days %d: expected > 0", retention_days);
  int64_t now = eph_wall_us();
  int r = tx_begin(s, err);
  if (r < 0)
    return r;
  int deleted = 0;
  {
    cleanup_reset sqlite3_stmt *st = s->st[ST_PURGE_RUNS];
    sqlite3_bind_int64(st, 1, now - (int64_t)retention_days * 86400 * 1000000);
    r = step_done(s, st, "purging runs", err);
    if (r >= 0)
      deleted = sqlite3_changes(s->db); /* events go with them: ON DELETE CASCADE */
  }
  if (r >= 0) {
    cleanup_reset sqlite3_stmt *st = s->st[ST_PURGE_IDEM];
    sqlite3_bind_int64(st, 1, now - s->idempotency_us);
    r = step_done(s, st, "purging idempotency keys", err);
  }
  r = tx_end(s, r, err);
  return r < 0 ? r : deleted;
}

/* ---------------------------------------------------------------- health */

int
eph_store_probe(eph_store_t *s, eph_error_t *err)
{
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

bool
eph_store_fault(eph_store_t *s, char *buf, size_t size)
{
  pthread_mutex_lock(&s->fault_lock);
  const char *which = s->damaged[0] ? s->damaged : s->fault;
  bool failing = which[0] != '\0';
  if (failing && buf)
    snprintf(buf, size, "%s", which);
  pthread_mutex_unlock(&s->fault_lock);
  return failing;
}

const char *
eph_store_path(const eph_store_t *s)
{
  return s->path;
}

int
eph_store_with_db(eph_store_t *s, int (*fn)(struct sqlite3 *db, void *opaque, eph_error_t *err),
                  void *opaque, eph_error_t *err)
{
  pthread_mutex_lock(&s->lock);
  int r = fn(s->db, opaque, err);
  pthread_mutex_unlock(&s->lock);
  return r;
}
