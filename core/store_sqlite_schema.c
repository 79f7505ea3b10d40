/* The SQLite store's schema: its versioned migrations and its prepared statements (see
 * store_sqlite.c). */
#include "config.h"

#include "store_int.h"

/* Migrations: entry i brings user_version from i to i + 1. Append, never edit. */
const char *const eph_store_sqlite_migrations[] = {
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
const int eph_store_sqlite_schema_version =
    (int)(sizeof eph_store_sqlite_migrations / sizeof eph_store_sqlite_migrations[0]);

const char *const eph_store_sqlite_sql[ST_COUNT] = {
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
