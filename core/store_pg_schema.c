/* The PostgreSQL store's schema: its versioned migrations (see store_pg.c). */
#include "config.h"

#include "store_int.h"

/* Migrations: entry i brings eph_schema.version from i to i + 1. Append, never edit. */
const char *const eph_store_pg_migrations[] = {
    /* 0 -> 1: the tables of store.h, as in the SQLite schema (BIGINT micros, BYTEA hashes,
     * JSON kept as the text given so a stored request reads back byte for byte). */
    "CREATE TABLE organisations ("
    "  id TEXT PRIMARY KEY,"
    "  created_at_us BIGINT NOT NULL"
    ");"
    "CREATE TABLE members ("
    "  org TEXT NOT NULL REFERENCES organisations(id) ON DELETE CASCADE,"
    "  member TEXT NOT NULL,"
    "  role TEXT NOT NULL CHECK (role IN ('owner', 'admin', 'member')),"
    "  created_at_us BIGINT NOT NULL,"
    "  PRIMARY KEY (org, member)"
    ");"
    "CREATE TABLE api_keys ("
    "  id TEXT PRIMARY KEY,"
    "  org TEXT NOT NULL REFERENCES organisations(id) ON DELETE CASCADE,"
    "  name TEXT NOT NULL,"
    "  sha256 BYTEA NOT NULL UNIQUE CHECK (length(sha256) = 32),"
    "  created_at_us BIGINT NOT NULL,"
    "  revoked_at_us BIGINT,"
    "  admin BOOLEAN NOT NULL DEFAULT false"
    ");"
    "CREATE UNIQUE INDEX api_keys_active_name ON api_keys(org, name)"
    "  WHERE revoked_at_us IS NULL;"
    "CREATE TABLE runs ("
    "  id TEXT PRIMARY KEY,"
    "  org TEXT NOT NULL,"
    "  status TEXT NOT NULL,"
    "  created_at_us BIGINT NOT NULL,"
    "  updated_at_us BIGINT NOT NULL,"
    "  zdr BOOLEAN NOT NULL,"
    "  request TEXT NOT NULL,"
    "  output TEXT CHECK (output IS NULL OR NOT zdr),"
    "  usage TEXT"
    ");"
    "CREATE INDEX runs_org_created ON runs(org, created_at_us DESC, id DESC);"
    "CREATE INDEX runs_created ON runs(created_at_us);"
    "CREATE TABLE events ("
    "  run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,"
    "  seq BIGINT NOT NULL CHECK (seq >= 0),"
    "  t_ms BIGINT NOT NULL,"
    "  source TEXT NOT NULL,"
    "  kind TEXT NOT NULL,"
    "  text TEXT NOT NULL,"
    "  data TEXT,"
    "  PRIMARY KEY (run_id, seq)"
    ");"
    /* Backstop for zero data retention: the insert statement already drops the payload. */
    "CREATE FUNCTION eph_events_zdr() RETURNS trigger LANGUAGE plpgsql AS $$"
    "BEGIN"
    "  IF NEW.data IS NOT NULL AND (SELECT zdr FROM runs WHERE id = NEW.run_id) THEN"
    "    RAISE EXCEPTION 'zero data retention: event payload refused';"
    "  END IF;"
    "  RETURN NEW;"
    "END $$;"
    "CREATE TRIGGER events_zdr BEFORE INSERT ON events"
    "  FOR EACH ROW EXECUTE FUNCTION eph_events_zdr();"
    "CREATE TABLE idempotency ("
    "  org TEXT NOT NULL,"
    "  key TEXT NOT NULL,"
    "  body_sha256 TEXT NOT NULL CHECK (length(body_sha256) = 64),"
    "  run_id TEXT NOT NULL,"
    "  created_at_us BIGINT NOT NULL,"
    "  PRIMARY KEY (org, key)"
    ");"
    "CREATE INDEX idempotency_created ON idempotency(created_at_us);"
    "CREATE TABLE probe ("
    "  id INTEGER PRIMARY KEY CHECK (id = 1),"
    "  t_us BIGINT NOT NULL"
    ");",
    /* 1 -> 2: cancel requests for runs executing on another node (docs/cluster.md). */
    "CREATE TABLE run_cancels ("
    "  run_id TEXT PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,"
    "  requested_at_us BIGINT NOT NULL"
    ");",
    /* 2 -> 3: which node holds a run and until when (leases, docs/cluster.md). */
    "ALTER TABLE runs ADD COLUMN node TEXT, ADD COLUMN lease_expires_us BIGINT;"
    "CREATE INDEX runs_lease ON runs(lease_expires_us) WHERE status IN ('queued', 'running');",
    /* 3 -> 4: the shared queue (docs/cluster.md): runs admitted and reserved by one node,
     * waiting for any node (or, local_only, their admitting node) to claim them. Its length
     * is kept in a one-row counter so the bound is checked and raised in one conditional
     * UPDATE (a count(*) would race between nodes under READ COMMITTED). */
    "CREATE TABLE run_queue ("
    "  run_id TEXT PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,"
    "  admitted_by TEXT NOT NULL,"
    "  local_only BOOLEAN NOT NULL,"
    "  reserved_micros BIGINT NOT NULL CHECK (reserved_micros >= 0),"
    "  queued_at_us BIGINT NOT NULL"
    ");"
    "CREATE INDEX run_queue_order ON run_queue(queued_at_us, run_id);"
    "CREATE TABLE run_queue_length ("
    "  id INTEGER PRIMARY KEY CHECK (id = 1),"
    "  n BIGINT NOT NULL CHECK (n >= 0)"
    ");"
    "INSERT INTO run_queue_length(id, n) VALUES (1, 0);",
    /* 4 -> 5: the ledger every node must share (docs/cluster.md): the identity of the
     * ledger the first node used, which every later node's ledger must answer too. */
    "CREATE TABLE cluster_ledger ("
    "  one BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),"
    "  identity TEXT NOT NULL,"
    "  plugin TEXT NOT NULL,"
    "  node TEXT NOT NULL,"
    "  recorded_at_us BIGINT NOT NULL"
    ");",
};
const int eph_store_pg_schema_version =
    (int)(sizeof eph_store_pg_migrations / sizeof eph_store_pg_migrations[0]);
