/*
 * ledger-postgres: the schema (tables, constraints, triggers), the prepared statements and
 * the migration run at start. See ledger.c for the model and ledger.h for the internals.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "ledger.h"

#define SCHEMA_VERSION 2
/* pg_advisory_xact_lock key of the schema migration: "ephl" */
#define MIGRATION_LOCK_KEY "1701865580"
/* The database server's time in unix micros (the start of the statement's transaction). */
#define LEDGER_NOW_US "(extract(epoch FROM now()) * 1000000)::bigint"

/* The schema check runs under the advisory lock, so several nodes starting at once migrate
 * one after the other; the second finds the version written and does nothing. */
static const char schema_head[] = "CREATE SCHEMA IF NOT EXISTS ledger;"
                                  "CREATE TABLE IF NOT EXISTS ledger.schema_version ("
                                  "  one boolean PRIMARY KEY DEFAULT true CHECK (one),"
                                  "  version integer NOT NULL"
                                  ");";

static const char schema_v1[] =
    "CREATE TABLE ledger.organisations ("
    "  org text PRIMARY KEY,"
    "  credited_micros bigint NOT NULL DEFAULT 0 CHECK (credited_micros >= 0),"
    "  balance_micros bigint NOT NULL DEFAULT 0 CHECK (balance_micros >= 0),"
    "  created_us bigint NOT NULL"
    ");"
    "CREATE TABLE ledger.reservations ("
    "  run_id text PRIMARY KEY,"
    "  org text NOT NULL REFERENCES ledger.organisations(org),"
    "  node text NOT NULL,"
    "  reserved_micros bigint NOT NULL CHECK (reserved_micros > 0),"
    "  billed_micros bigint NOT NULL DEFAULT 0,"
    "  model_micros bigint NOT NULL DEFAULT 0 CHECK (model_micros >= 0),"
    "  web_micros bigint NOT NULL DEFAULT 0 CHECK (web_micros >= 0),"
    "  compute_micros bigint NOT NULL DEFAULT 0 CHECK (compute_micros >= 0),"
    "  released_micros bigint NOT NULL DEFAULT 0 CHECK (released_micros >= 0),"
    "  settled smallint NOT NULL DEFAULT 0 CHECK (settled IN (0, 1)),"
    "  CHECK (billed_micros >= 0 AND billed_micros <= reserved_micros),"
    "  CHECK (billed_micros = model_micros + web_micros + compute_micros),"
    "  CHECK ((settled = 0 AND released_micros = 0) OR"
    "         (settled = 1 AND billed_micros + released_micros = reserved_micros))"
    ");"
    "CREATE INDEX reservations_open ON ledger.reservations(node) WHERE settled = 0;"
    "CREATE TABLE ledger.entries ("
    "  seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    "  t_us bigint NOT NULL,"
    "  org text NOT NULL REFERENCES ledger.organisations(org),"
    "  run_id text,"
    "  node text NOT NULL,"
    "  kind text NOT NULL CHECK (kind IN ('credit', 'reserve', 'charge', 'settle')),"
    "  category text CHECK (category IN ('model', 'web', 'compute')),"
    "  micros bigint NOT NULL CHECK (micros >= 0),"
    "  memo text,"
    "  CHECK ((kind = 'charge') = (category IS NOT NULL)),"
    "  CHECK ((kind = 'credit') = (run_id IS NULL)),"
    "  CHECK (kind NOT IN ('credit', 'reserve') OR micros > 0)"
    ");"
    "CREATE INDEX entries_run ON ledger.entries(run_id) WHERE run_id IS NOT NULL;"
    "CREATE UNIQUE INDEX entries_one_reserve ON ledger.entries(run_id) WHERE kind = 'reserve';"
    "CREATE UNIQUE INDEX entries_one_settle ON ledger.entries(run_id) WHERE kind = 'settle';"
    "CREATE TABLE ledger.probe ("
    "  id integer PRIMARY KEY CHECK (id = 1),"
    "  t_us bigint NOT NULL"
    ");"
    /* The journal is append-only. */
    "CREATE FUNCTION ledger.refuse_change() RETURNS trigger LANGUAGE plpgsql"
    "  SET search_path = pg_catalog, pg_temp AS $$"
    "BEGIN"
    "  RAISE EXCEPTION 'ledger entries are append-only: % refused', TG_OP"
    "    USING ERRCODE = 'check_violation';"
    "END $$;"
    "CREATE TRIGGER entries_append_only BEFORE UPDATE OR DELETE ON ledger.entries"
    "  FOR EACH ROW EXECUTE FUNCTION ledger.refuse_change();"
    "CREATE TRIGGER entries_no_truncate BEFORE TRUNCATE ON ledger.entries"
    "  FOR EACH STATEMENT EXECUTE FUNCTION ledger.refuse_change();"
    /* The derived tables are written only by the journal's trigger: ledger.apply_entry runs
     * as the schema's owner (SECURITY DEFINER, fixed search_path) one level down (depth 2).
     * A runtime role that is not the owner cannot write them in any other way, not even from
     * a trigger of its own (it would run as itself). The one direct write allowed is
     * creating an empty organisation. */
    "CREATE FUNCTION ledger.derived_only() RETURNS trigger LANGUAGE plpgsql"
    "  SET search_path = pg_catalog, pg_temp AS $$"
    "BEGIN"
    "  IF TG_OP = 'INSERT' AND TG_TABLE_NAME = 'organisations' THEN"
    "    IF NEW.credited_micros = 0 AND NEW.balance_micros = 0 THEN"
    "      RETURN NEW;"
    "    END IF;"
    "  END IF;"
    "  IF TG_OP IN ('DELETE', 'TRUNCATE') OR pg_trigger_depth() < 2"
    "     OR current_user <> (SELECT r.rolname FROM pg_class c"
    "                         JOIN pg_roles r ON r.oid = c.relowner WHERE c.oid = TG_RELID) THEN"
    "    RAISE EXCEPTION 'ledger.% is derived from the journal: % refused', TG_TABLE_NAME, TG_OP"
    "      USING ERRCODE = 'check_violation';"
    "  END IF;"
    "  RETURN NEW;"
    "END $$;"
    "CREATE TRIGGER organisations_derived BEFORE INSERT OR UPDATE OR DELETE"
    "  ON ledger.organisations FOR EACH ROW EXECUTE FUNCTION ledger.derived_only();"
    "CREATE TRIGGER organisations_no_truncate BEFORE TRUNCATE ON ledger.organisations"
    "  FOR EACH STATEMENT EXECUTE FUNCTION ledger.derived_only();"
    "CREATE TRIGGER reservations_derived BEFORE INSERT OR UPDATE OR DELETE"
    "  ON ledger.reservations FOR EACH ROW EXECUTE FUNCTION ledger.derived_only();"
    "CREATE TRIGGER reservations_no_truncate BEFORE TRUNCATE ON ledger.reservations"
    "  FOR EACH STATEMENT EXECUTE FUNCTION ledger.derived_only();"
    /* Derived state, maintained by the same INSERT. */
    "CREATE FUNCTION ledger.apply_entry() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER"
    "  SET search_path = pg_catalog, pg_temp AS $$"
    "BEGIN"
    "  IF NEW.kind = 'credit' THEN"
    "    UPDATE ledger.organisations SET credited_micros = credited_micros + NEW.micros,"
    "      balance_micros = balance_micros + NEW.micros WHERE org = NEW.org;"
    "  ELSIF NEW.kind = 'reserve' THEN"
    "    INSERT INTO ledger.reservations(run_id, org, node, reserved_micros)"
    "      VALUES (NEW.run_id, NEW.org, NEW.node, NEW.micros);"
    "    UPDATE ledger.organisations SET balance_micros = balance_micros - NEW.micros"
    "      WHERE org = NEW.org;"
    "  ELSIF NEW.kind = 'charge' THEN"
    "    UPDATE ledger.reservations SET billed_micros = billed_micros + NEW.micros,"
    "      model_micros = model_micros"
    "        + (CASE NEW.category WHEN 'model' THEN NEW.micros ELSE 0 END),"
    "      web_micros = web_micros + (CASE NEW.category WHEN 'web' THEN NEW.micros ELSE 0 END),"
    "      compute_micros = compute_micros"
    "        + (CASE NEW.category WHEN 'compute' THEN NEW.micros ELSE 0 END)"
    "      WHERE run_id = NEW.run_id AND org = NEW.org AND settled = 0;"
    "    IF NOT FOUND THEN"
    "      RAISE EXCEPTION 'ledger: charge on a missing or settled reservation'"
    "        USING ERRCODE = 'check_violation';"
    "    END IF;"
    "  ELSIF NEW.kind = 'settle' THEN"
    "    UPDATE ledger.reservations SET settled = 1, released_micros = NEW.micros"
    "      WHERE run_id = NEW.run_id AND org = NEW.org AND settled = 0"
    "        AND reserved_micros - billed_micros = NEW.micros;"
    "    IF NOT FOUND THEN"
    "      RAISE EXCEPTION 'ledger: settle must release exactly reserved - billed'"
    "        USING ERRCODE = 'check_violation';"
    "    END IF;"
    "    UPDATE ledger.organisations SET balance_micros = balance_micros + NEW.micros"
    "      WHERE org = NEW.org;"
    "  END IF;"
    "  RETURN NULL;"
    "END $$;"
    "CREATE TRIGGER entries_apply AFTER INSERT ON ledger.entries"
    "  FOR EACH ROW EXECUTE FUNCTION ledger.apply_entry();";

/* v2: the ledger's identity (eph_ledger_ops_t.identity): one UUID made with the schema and
 * never changed, so nodes of a cluster can tell whether they share this ledger. */
static const char schema_v2[] =
    "CREATE TABLE ledger.identity ("
    "  one boolean PRIMARY KEY DEFAULT true CHECK (one),"
    "  id uuid NOT NULL DEFAULT gen_random_uuid(),"
    "  created_us bigint NOT NULL"
    ");"
    "CREATE TRIGGER identity_fixed BEFORE UPDATE OR DELETE ON ledger.identity"
    "  FOR EACH ROW EXECUTE FUNCTION ledger.refuse_change();"
    "CREATE TRIGGER identity_no_truncate BEFORE TRUNCATE ON ledger.identity"
    "  FOR EACH STATEMENT EXECUTE FUNCTION ledger.refuse_change();"
    "INSERT INTO ledger.identity(created_us)"
    "  VALUES ((extract(epoch FROM clock_timestamp()) * 1000000)::bigint);"
    "UPDATE ledger.schema_version SET version = 2;";

const pg_statement_t statements[ST_COUNT] = {
    [ST_ORG_ENSURE] = {"INSERT INTO ledger.organisations(org, created_us) VALUES ($1, $2)"
                       " ON CONFLICT (org) DO NOTHING",
                       2},
    [ST_ORG_GET] = {"SELECT credited_micros, balance_micros FROM ledger.organisations"
                    " WHERE org = $1",
                    1},
    [ST_ORG_LOCK] = {"SELECT credited_micros, balance_micros FROM ledger.organisations"
                     " WHERE org = $1 FOR NO KEY UPDATE",
                     1},
    [ST_RES_GET] = {"SELECT org, reserved_micros, billed_micros, released_micros, model_micros,"
                    " web_micros, compute_micros, settled FROM ledger.reservations"
                    " WHERE run_id = $1",
                    1},
    [ST_RES_LOCK] = {"SELECT org, reserved_micros, billed_micros, released_micros, model_micros,"
                     " web_micros, compute_micros, settled FROM ledger.reservations"
                     " WHERE run_id = $1 FOR NO KEY UPDATE",
                     1},
    /* Stamped with the database server's time (the transaction's start), one clock for
     * every node: the orphan sweep compares a reservation's age in it (ST_OPEN_BEFORE). */
    [ST_ENTRY_ADD] = {"INSERT INTO ledger.entries(t_us, org, run_id, node, kind, category, micros,"
                      " memo) VALUES (" LEDGER_NOW_US ", $1, $2, $3, $4, $5, $6, $7)",
                      7},
    [ST_RES_ORG] = {"SELECT org FROM ledger.reservations WHERE run_id = $1", 1},
    [ST_OPEN_LIST] = {"SELECT run_id FROM ledger.reservations WHERE settled = 0 AND node = $1"
                      " ORDER BY run_id",
                      1},
    [ST_OPEN_BEFORE] = {"SELECT r.run_id, r.org, r.node, r.reserved_micros, e.t_us"
                        " FROM ledger.reservations r JOIN ledger.entries e"
                        " ON e.run_id = r.run_id AND e.kind = 'reserve'"
                        " WHERE r.settled = 0 AND e.t_us < " LEDGER_NOW_US " - $1::bigint"
                        " ORDER BY e.t_us, r.run_id LIMIT $2",
                        2},
    [ST_PROBE] = {"INSERT INTO ledger.probe(id, t_us) VALUES (1, $1)"
                  " ON CONFLICT (id) DO UPDATE SET t_us = excluded.t_us",
                  1},
};

/* Creates or checks the schema in one transaction under a transaction-level advisory lock,
 * so nodes starting together migrate one at a time. */
int
migrate(ledger_t *l, eph_error_t *err)
{
  tx_t tx = {.l = l, .c = checkout(l)};
  int r = conn_connect(&tx, true, err);
  if (r >= 0)
    r = exec_simple(&tx, "BEGIN", err);
  if (r >= 0)
    r = exec_simple(&tx, "SELECT pg_advisory_xact_lock(" MIGRATION_LOCK_KEY ")", err);
  /* Read before any DDL: a runtime role without CREATE on the database (see the README)
   * starts on a schema its owner migrated; CREATE ... IF NOT EXISTS would still need it. */
  int version = 0;
  if (r >= 0) {
    PGresult *res = PQexec(tx.c->pg, "SELECT CASE WHEN to_regclass('ledger.schema_version') IS NULL"
                                     " THEN 0 ELSE -1 END");
    if (PQresultStatus(res) != PGRES_TUPLES_OK)
      r = pg_fail(&tx, res, "looking for the ledger schema", err);
    else
      version = (int)col_i64(res, 0, 0);
    PQclear(res);
  }
  if (r >= 0 && version < 0) {
    version = 0;
    PGresult *res = PQexec(tx.c->pg, "SELECT version FROM ledger.schema_version");
    if (PQresultStatus(res) != PGRES_TUPLES_OK)
      r = pg_fail(&tx, res, "reading the schema version", err);
    else if (PQntuples(res) == 1)
      version = (int)col_i64(res, 0, 0);
    PQclear(res);
  }
  if (r >= 0 && version < SCHEMA_VERSION)
    r = exec_simple(&tx, schema_head, err);
  if (r >= 0 && version > SCHEMA_VERSION)
    r = eph_error_set(err, EPH_E_CONFIG,
                      PLUGIN ": %s: schema version %d is newer than this plugin's (%d); "
                             "refusing to touch it",
                      l->display, version, SCHEMA_VERSION);
  if (r >= 0 && version < 1) {
    r = exec_simple(&tx, schema_v1, err);
    if (r >= 0)
      r = exec_simple(&tx, "INSERT INTO ledger.schema_version(version) VALUES (1)", err);
    if (r < 0)
      eph_error_wrap(err, PLUGIN ": creating the ledger schema");
  }
  if (r >= 0 && version < 2 && (r = exec_simple(&tx, schema_v2, err)) < 0)
    eph_error_wrap(err, PLUGIN ": migrating the ledger schema to version 2");
  /* Future versions: `if (version < 3) { ALTER ...; UPDATE ledger.schema_version ...; }` */
  if (r >= 0) {
    PGresult *res = PQexec(tx.c->pg, "SELECT id::text FROM ledger.identity");
    if (PQresultStatus(res) != PGRES_TUPLES_OK)
      r = pg_fail(&tx, res, "reading the ledger's identity", err);
    else if (PQntuples(res) != 1)
      r = eph_error_set(err, EIO, PLUGIN ": %s: ledger.identity holds %d rows, not 1", l->display,
                        PQntuples(res));
    else
      snprintf(l->identity, sizeof l->identity, "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
  }
  if (r >= 0)
    r = exec_simple(&tx, "COMMIT", err);
  else if (!tx.lost)
    exec_simple(&tx, "ROLLBACK", NULL);
  if (tx.lost)
    tx.c->ready = false;
  checkin(l, tx.c);
  return r;
}
