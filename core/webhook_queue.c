/* Webhooks, the queue: endpoints and default secrets, the delivery rows, and what fills
 * them (a run's end, the catch-up of ends no process announced). The rows live in the
 * store: its SQLite file (eph_store_with_db) or a cluster's PostgreSQL database
 * (eph_store_with_pg); webhook.c delivers them. See webhook.h. */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "support/sqlite_api.h"

#include "log.h"
#include "sqlrow.h"
#include "util.h"
#include "webhook_int.h"

/* A run settled by this daemon is announced by its worker (finished()) right after the
 * row is written: the catch-up leaves it that long so the live payload is the one sent. */
#define CATCH_UP_GRACE_US (2LL * 1000000)
#define CATCH_UP_BATCH 64 /* runs per pass: a backlog drains over passes, the lock is short */

/* ------------------------------------------------------------------ store access */

static int
sql_error(sqlite3 *db, const char *what, eph_error_t *err)
{
  return eph_error_set(err, EIO, "webhooks: %s: %s", what, sqlite3_errmsg(db));
}

typedef struct {
  const char *org, *id, *url, *secret, *run_id, *body;
  int64_t now_us, next_us, limit;
  int64_t ended_us, since_us; /* db_enqueue, db_unannounced */
  long code;
  const char *error;
  const char *status;
  json_object *out;
  int changes;
  char *text, *default_id; /* heap results */
  const char *claim;       /* PostgreSQL: the claimant's token of a delivery */
  int64_t lease_us;        /* PostgreSQL: how long a claimed delivery is this node's */
} sql_args_t;

/* ------------------------------------------------------------------ PostgreSQL (a cluster)
 *
 * The same tables, shared by every node (docs/cluster.md; migration 4 -> 5 in
 * core/store_pg_schema.c), the same statements in PostgreSQL's dialect. What differs: a
 * due delivery is claimed (FOR UPDATE SKIP LOCKED, its next attempt pushed past the
 * attempt's lease, a token written), so of the nodes' delivery threads exactly one
 * attempts it, and only the claimant records the outcome. */

#define PG_DELIVERY_ID "'whd_' || left(replace(gen_random_uuid()::text, '-', ''), 24)"

static int
pg_register(eph_store_t *s, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  return eph_store_pg_query(s, NULL, NULL, "webhooks: registering", err,
                            "INSERT INTO webhooks(id, org, url, secret, created_at_us)"
                            " VALUES ($1, $2, $3, $4, $5)",
                            "tttti", a->id, a->org, a->url, a->secret, a->now_us);
}

static int
pg_list(eph_store_t *s, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  json_object_put(a->out);
  a->out = NULL;
  return eph_store_pg_query(s, &a->out, NULL, "webhooks: listing", err,
                            "SELECT id, url, created_at_us FROM webhooks"
                            " WHERE org = $1 AND deleted_at_us IS NULL AND kind = 'endpoint'"
                            " ORDER BY created_at_us DESC, id DESC",
                            "t", a->org);
}

static int
pg_delete(eph_store_t *s, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  int changes = 0;
  int r = eph_store_pg_query(s, NULL, &changes, "webhooks: deleting", err,
                             "UPDATE webhooks SET deleted_at_us = $3 WHERE org = $1 AND id = $2"
                             " AND deleted_at_us IS NULL AND kind = 'endpoint'",
                             "tti", a->org, a->id, a->now_us);
  if (r == 0 && changes == 0)
    return eph_error_set(err, ENOENT, "no webhook '%s'", a->id);
  if (r == 0)
    r = eph_store_pg_query(s, NULL, NULL, "webhooks: deleting", err,
                           "UPDATE webhook_deliveries SET status = 'failed',"
                           " last_error = 'endpoint deleted', updated_at_us = $3, claim = NULL"
                           " WHERE org = $1 AND webhook_id = $2 AND status = 'pending'",
                           "tti", a->org, a->id, a->now_us);
  return r;
}

static int
pg_enqueue(eph_store_t *s, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  return eph_store_pg_query(s, NULL, &a->changes, "webhooks: queueing a delivery", err,
                            "INSERT INTO webhook_deliveries(id, webhook_id, org, run_id, url, body,"
                            " status, next_attempt_us, created_at_us, updated_at_us)"
                            " SELECT " PG_DELIVERY_ID ", id, org, $2, url, $3,"
                            " 'pending', $4, $4, $4 FROM webhooks"
                            " WHERE org = $1 AND deleted_at_us IS NULL AND kind = 'endpoint'"
                            " AND created_at_us <= $5"
                            " ON CONFLICT (webhook_id, run_id) DO NOTHING",
                            "tttii", a->org, a->run_id, a->body, a->now_us, a->ended_us);
}

static int
pg_default(eph_store_t *s, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  cleanup_json json_object *rows = NULL;
  int r = eph_store_pg_query(s, NULL, NULL, "webhooks: creating the default secret", err,
                             "INSERT INTO webhooks(id, org, url, secret, created_at_us, kind)"
                             " VALUES ($1, $2, '', $3, $4, 'default') ON CONFLICT DO NOTHING",
                             "ttti", a->id, a->org, a->secret, a->now_us);
  if (r == 0)
    r = eph_store_pg_query(s, &rows, NULL, "webhooks: reading the default secret", err,
                           "SELECT id, secret FROM webhooks WHERE org = $1 AND kind = 'default'",
                           "t", a->org);
  if (r < 0)
    return r;
  json_object *row = json_object_array_get_idx(rows, 0);
  if (!row)
    return eph_error_set(err, EIO, "webhooks: the default secret of '%s' is missing", a->org);
  a->default_id = eph_xstrdup(json_object_get_string(json_object_object_get(row, "id")));
  a->text = eph_xstrdup(json_object_get_string(json_object_object_get(row, "secret")));
  if (!a->run_id)
    return 0;
  return eph_store_pg_query(s, NULL, &a->changes, "webhooks: queueing the request's delivery", err,
                            "INSERT INTO webhook_deliveries(id, webhook_id, org, run_id, url, body,"
                            " status, next_attempt_us, created_at_us, updated_at_us)"
                            " VALUES (" PG_DELIVERY_ID
                            ", $1, $2, $3, $4, $5, 'pending', $6, $6, $6)"
                            " ON CONFLICT (webhook_id, run_id) DO NOTHING",
                            "ttttti", a->default_id, a->org, a->run_id, a->url, a->body, a->now_us);
}

static int
pg_deliveries(eph_store_t *s, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  json_object_put(a->out);
  a->out = NULL;
  return eph_store_pg_query(s, &a->out, NULL, "webhooks: listing deliveries", err,
                            "SELECT id, webhook_id, run_id, url, status, attempts, next_attempt_us,"
                            " last_status_code, last_error, created_at_us, updated_at_us"
                            " FROM webhook_deliveries WHERE org = $1"
                            " ORDER BY created_at_us DESC, id DESC LIMIT $2",
                            "ti", a->org, a->limit);
}

/* Claims the oldest due delivery for this node in one statement: the row locked with SKIP
 * LOCKED (another node claiming at the same moment takes another row or none), its next
 * attempt moved a->lease_us ahead (if this node dies mid-attempt, the delivery is due again
 * then, for any node) and a->claim written (the fence of pg_record). a->out: the claimed
 * delivery or NULL; a->next_us: the earliest future attempt (0: none pending). */
static int
pg_claim_due(eph_store_t *s, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  json_object *rows = NULL;
  int r = eph_store_pg_query(
      s, &rows, NULL, "webhooks: claiming a due delivery", err,
      "UPDATE webhook_deliveries d SET next_attempt_us = $2, claim = $3 FROM webhooks w"
      " WHERE w.id = d.webhook_id AND d.id = (SELECT id FROM webhook_deliveries"
      "   WHERE status = 'pending' AND next_attempt_us <= $1"
      "   ORDER BY next_attempt_us LIMIT 1 FOR UPDATE SKIP LOCKED)"
      " RETURNING d.id, d.url, d.body, d.attempts, d.created_at_us, w.secret, d.claim",
      "iit", a->now_us, a->now_us + a->lease_us, a->claim);
  if (r < 0)
    return r;
  a->out = json_object_get(json_object_array_get_idx(rows, 0));
  json_object_put(rows);
  a->next_us = 0;
  if (a->out)
    return 0;
  cleanup_json json_object *next = NULL;
  r = eph_store_pg_query(s, &next, NULL, "webhooks: reading due deliveries", err,
                         "SELECT min(next_attempt_us) AS at FROM webhook_deliveries"
                         " WHERE status = 'pending'",
                         "");
  if (r == 0)
    a->next_us =
        json_object_get_int64(json_object_object_get(json_object_array_get_idx(next, 0), "at"));
  return r;
}

/* Records this node's attempt; a->changes = 0 when the claim is no longer this node's (its
 * lease ran out and another node claimed the delivery again). */
static int
pg_record(eph_store_t *s, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  return eph_store_pg_query(s, NULL, &a->changes, "webhooks: recording an attempt", err,
                            "UPDATE webhook_deliveries SET status = $2, attempts = attempts + 1,"
                            " next_attempt_us = $3, last_status_code = $4, last_error = $5,"
                            " updated_at_us = $6, claim = NULL WHERE id = $1 AND claim = $7",
                            "ttintit", a->id, a->status, a->next_us, (int64_t)a->code, a->error,
                            a->now_us, a->claim);
}

static int
pg_purge(eph_store_t *s, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  return eph_store_pg_query(s, NULL, NULL, "webhooks: purging deliveries", err,
                            "DELETE FROM webhook_deliveries"
                            " WHERE status != 'pending' AND updated_at_us < $1",
                            "i", a->now_us);
}

/* As db_unannounced, over the cluster's runs: a run ended on any node, or taken over
 * (host_lost) by any node, is announced by the first node whose catch-up finds it (the
 * (webhook_id, run_id) uniqueness makes the others add nothing). */
static int
pg_unannounced(eph_store_t *s, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  cleanup_json json_object *rows = NULL;
  int r = eph_store_pg_query(
      s, &rows, NULL, "webhooks: finding unannounced run ends", err,
      "SELECT r.id, r.updated_at_us FROM runs r"
      " WHERE r.created_at_us >= $3 AND r.updated_at_us BETWEEN $1 AND $2"
      " AND r.status NOT IN ('queued', 'running')"
      " AND (EXISTS (SELECT 1 FROM webhooks w WHERE w.org = r.org AND w.kind = 'endpoint'"
      "              AND w.deleted_at_us IS NULL AND w.created_at_us <= r.updated_at_us"
      "              AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d"
      "                              WHERE d.webhook_id = w.id AND d.run_id = r.id))"
      "  OR (r.request::jsonb ->> 'webhook_url' IS NOT NULL"
      "      AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d"
      "                      JOIN webhooks w ON w.id = d.webhook_id"
      "                      WHERE d.run_id = r.id AND w.kind = 'default')))"
      " ORDER BY r.updated_at_us LIMIT $4",
      "iiii", a->since_us, a->now_us, a->next_us, a->limit);
  if (r < 0)
    return r;
  for (size_t i = 0; i < json_object_array_length(rows); i++) {
    json_object *row = json_object_array_get_idx(rows, i), *p = json_object_new_array();
    json_object_array_add(p, json_object_get(json_object_object_get(row, "id")));
    json_object_array_add(p, json_object_get(json_object_object_get(row, "updated_at_us")));
    json_object_array_add(a->out, p);
  }
  return 0;
}

/* One store call: the SQLite statements (db) on a file, the PostgreSQL ones (pg, in one
 * transaction when tx) on a cluster's database. */
static int
with_store(eph_store_t *store, bool tx, int (*db)(sqlite3 *, void *, eph_error_t *),
           int (*pg)(eph_store_t *, void *, eph_error_t *), sql_args_t *a, eph_error_t *err)
{
  if (eph_store_kind(store) == EPH_STORE_POSTGRES)
    return eph_store_with_pg(store, tx, pg, a, err);
  return eph_store_with_db(store, db, a, err);
}

static int
db_register(sqlite3 *db, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  if (eph_sqlrow_exec(db, NULL,
                      "INSERT INTO webhooks(id, org, url, secret, created_at_us)"
                      " VALUES (?1, ?2, ?3, ?4, ?5)",
                      "tttti", a->id, a->org, a->url, a->secret, a->now_us) < 0)
    return sql_error(db, "registering", err);
  return 0;
}

static int
db_list(sqlite3 *db, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  static const char *const cols[] = {"id", "url", "created_at_us"};
  if (eph_sqlrow_select(db, a->out, cols, 3,
                        "SELECT id, url, created_at_us FROM webhooks"
                        " WHERE org = ?1 AND deleted_at_us IS NULL"
                        " AND kind = 'endpoint'"
                        " ORDER BY created_at_us DESC, id DESC",
                        "t", a->org) < 0)
    return sql_error(db, "listing", err);
  return 0;
}

/* Runs statements in one transaction; each binds ?1 = org, ?2 = id, ?3 = now. */
static int
db_delete(sqlite3 *db, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  static const char *const sql[] = {
      "UPDATE webhooks SET deleted_at_us = ?3"
      " WHERE org = ?1 AND id = ?2 AND deleted_at_us IS NULL AND kind = 'endpoint'",
      "UPDATE webhook_deliveries SET status = 'failed', last_error = 'endpoint deleted',"
      " updated_at_us = ?3 WHERE org = ?1 AND webhook_id = ?2 AND status = 'pending'",
  };
  if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
    return sql_error(db, "deleting", err);
  int r = 0;
  for (size_t i = 0; r == 0 && i < sizeof sql / sizeof sql[0]; i++) {
    int changes = 0;
    if (eph_sqlrow_exec(db, &changes, sql[i], "tti", a->org, a->id, a->now_us) < 0)
      r = sql_error(db, "deleting", err);
    else if (i == 0 && changes == 0)
      r = eph_error_set(err, ENOENT, "no webhook '%s'", a->id);
  }
  sqlite3_exec(db, r == 0 ? "COMMIT" : "ROLLBACK", NULL, NULL, NULL);
  return r;
}

static int
db_enqueue(sqlite3 *db, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  /* One row per live endpoint of the org that existed when the run ended (?5: a catch-up
   * must not announce an old run to an endpoint registered since); a second notice of the
   * same run adds none. */
  if (eph_sqlrow_exec(db, &a->changes,
                      "INSERT INTO webhook_deliveries(id, webhook_id, org, run_id, url, body,"
                      " status, next_attempt_us, created_at_us, updated_at_us)"
                      " SELECT 'whd_' || lower(hex(randomblob(12))), id, org, ?2, url, ?3,"
                      " 'pending', ?4, ?4, ?4 FROM webhooks"
                      " WHERE org = ?1 AND deleted_at_us IS NULL AND kind = 'endpoint'"
                      " AND created_at_us <= ?5"
                      " ON CONFLICT(webhook_id, run_id) DO NOTHING",
                      "tttii", a->org, a->run_id, a->body, a->now_us, a->ended_us) < 0)
    return sql_error(db, "queueing a delivery", err);
  return 0;
}

/* The org's default row (created with a->id and a->secret when missing); a->text gets its
 * secret (heap). */
static int
db_default(sqlite3 *db, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  if (eph_sqlrow_exec(db, NULL,
                      "INSERT INTO webhooks(id, org, url, secret, created_at_us, kind)"
                      " VALUES (?1, ?2, '', ?3, ?4, 'default')"
                      " ON CONFLICT DO NOTHING",
                      "ttti", a->id, a->org, a->secret, a->now_us) < 0)
    return sql_error(db, "creating the default secret", err);
  sqlite3_stmt *st = eph_sqlrow_prepare(
      db, "SELECT id, secret FROM webhooks WHERE org = ?1 AND kind = 'default'", "t", a->org);
  if (!st)
    return sql_error(db, "reading the default secret", err);
  int r = 0;
  if (sqlite3_step(st) == SQLITE_ROW) {
    a->default_id = eph_xstrdup((const char *)sqlite3_column_text(st, 0));
    a->text = eph_xstrdup((const char *)sqlite3_column_text(st, 1));
  } else {
    r = sql_error(db, "reading the default secret", err);
  }
  sqlite3_finalize(st);
  if (r < 0 || !a->run_id)
    return r;
  /* A request's own webhook_url: one delivery signed with the default secret. */
  if (eph_sqlrow_exec(db, &a->changes,
                      "INSERT INTO webhook_deliveries(id, webhook_id, org, run_id, url, body,"
                      " status, next_attempt_us, created_at_us, updated_at_us)"
                      " VALUES ('whd_' || lower(hex(randomblob(12))), ?1, ?2, ?3, ?4, ?5,"
                      " 'pending', ?6, ?6, ?6) ON CONFLICT(webhook_id, run_id) DO NOTHING",
                      "ttttti", a->default_id, a->org, a->run_id, a->url, a->body, a->now_us) < 0)
    return sql_error(db, "queueing the request's delivery", err);
  return 0;
}

static int
db_deliveries(sqlite3 *db, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  static const char *const cols[] = {
      "id",         "webhook_id",    "run_id",          "url",
      "status",     "attempts",      "next_attempt_us", "last_status_code",
      "last_error", "created_at_us", "updated_at_us"};
  if (eph_sqlrow_select(db, a->out, cols, (int)(sizeof cols / sizeof cols[0]),
                        "SELECT id, webhook_id, run_id, url, status, attempts, next_attempt_us,"
                        " last_status_code, last_error, created_at_us, updated_at_us"
                        " FROM webhook_deliveries WHERE org = ?1"
                        " ORDER BY created_at_us DESC, id DESC LIMIT ?2",
                        "ti", a->org, a->limit) < 0)
    return sql_error(db, "listing deliveries", err);
  return 0;
}

/* The next due delivery (a->now_us), or a->out stays NULL; a->next_us receives the
 * earliest future attempt time (0: none pending). */
static int
db_next_due(sqlite3 *db, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  static const char *const cols[] = {"id", "url", "body", "attempts", "created_at_us", "secret"};
  sqlite3_stmt *st = eph_sqlrow_prepare(db,
                                        "SELECT d.id, d.url, d.body, d.attempts, d.created_at_us,"
                                        " w.secret, d.next_attempt_us FROM webhook_deliveries d"
                                        " JOIN webhooks w ON w.id = d.webhook_id"
                                        " WHERE d.status = 'pending'"
                                        " ORDER BY d.next_attempt_us LIMIT 1",
                                        "");
  if (!st)
    return sql_error(db, "reading due deliveries", err);
  int rc = sqlite3_step(st);
  int r = 0;
  a->next_us = 0;
  if (rc == SQLITE_ROW) {
    int64_t at = sqlite3_column_int64(st, 6);
    if (at <= a->now_us)
      a->out = eph_sqlrow_object(st, cols, 6);
    else
      a->next_us = at;
  } else if (rc != SQLITE_DONE) {
    r = sql_error(db, "reading due deliveries", err);
  }
  sqlite3_finalize(st);
  return r;
}

/* Finished deliveries (delivered, failed) go with the history they describe. */
static int
db_purge(sqlite3 *db, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  if (eph_sqlrow_exec(db, NULL,
                      "DELETE FROM webhook_deliveries"
                      " WHERE status != 'pending' AND updated_at_us < ?1",
                      "i", a->now_us) < 0)
    return sql_error(db, "purging deliveries", err);
  return 0;
}

/* Settled runs that ended in [a->since_us, a->now_us] and still lack a delivery: for an
 * endpoint of their org that existed when they ended, or to their request's webhook_url.
 * a->out receives [[run id, ended_at_us], ...], at most a->limit. A run's row is last
 * written when it settles (its updated_at_us is the end); created_at_us is bounded too
 * (a->next_us) so the runs index, not the whole history, is read every second. */
static int
db_unannounced(sqlite3 *db, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  sqlite3_stmt *st = eph_sqlrow_prepare(
      db,
      "SELECT r.id, r.updated_at_us FROM runs r"
      " WHERE r.created_at_us >= ?3 AND r.updated_at_us BETWEEN ?1 AND ?2"
      " AND r.status NOT IN ('queued', 'running')"
      " AND (EXISTS (SELECT 1 FROM webhooks w WHERE w.org = r.org AND w.kind = 'endpoint'"
      "              AND w.deleted_at_us IS NULL AND w.created_at_us <= r.updated_at_us"
      "              AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d"
      "                              WHERE d.webhook_id = w.id AND d.run_id = r.id))"
      "  OR (json_valid(r.request) AND json_extract(r.request, '$.webhook_url') IS NOT NULL"
      "      AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d"
      "                      JOIN webhooks w ON w.id = d.webhook_id"
      "                      WHERE d.run_id = r.id AND w.kind = 'default')))"
      " ORDER BY r.updated_at_us LIMIT ?4",
      "iiii", a->since_us, a->now_us, a->next_us, a->limit);
  if (!st)
    return sql_error(db, "finding unannounced run ends", err);
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    json_object *p = json_object_new_array();
    json_object_array_add(p, eph_sqlrow_column(st, 0));
    json_object_array_add(p, eph_sqlrow_column(st, 1));
    json_object_array_add(a->out, p);
  }
  int r = rc == SQLITE_DONE ? 0 : sql_error(db, "finding unannounced run ends", err);
  sqlite3_finalize(st);
  return r;
}

static int
db_record(sqlite3 *db, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  if (eph_sqlrow_exec(db, NULL,
                      "UPDATE webhook_deliveries SET status = ?2, attempts = attempts + 1,"
                      " next_attempt_us = ?3, last_status_code = ?4, last_error = ?5,"
                      " updated_at_us = ?6 WHERE id = ?1",
                      "ttinti", a->id, a->status, a->next_us, (int64_t)a->code, a->error,
                      a->now_us) < 0)
    return sql_error(db, "recording an attempt", err);
  return 0;
}

/* ------------------------------------------------------------------ the delivery thread's calls */

int
eph_webhooks_new_ids(eph_webhook_ids_t *ids)
{
  memcpy(ids->id, "wh_", 3);
  memcpy(ids->secret, "whsec_", 6);
  return eph_random_hex(ids->id + 3, 8) < 0 || eph_random_hex(ids->secret + 6, 24) < 0 ? -EIO : 0;
}

void
eph_webhooks_kick(eph_webhooks_t *wh)
{
  pthread_mutex_lock(&wh->mu);
  wh->kicked = true;
  pthread_cond_signal(&wh->cond);
  pthread_mutex_unlock(&wh->mu);
}

int
eph_webhooks_add_endpoint(eph_webhooks_t *wh, const char *org, const char *id, const char *url,
                          const char *secret, int64_t now_us, eph_error_t *err)
{
  sql_args_t a = {.org = org, .id = id, .url = url, .secret = secret, .now_us = now_us};
  return with_store(wh->store, false, db_register, pg_register, &a, err);
}

/* A claimed delivery stays its claimant's for one attempt's timeout plus this margin (a
 * slow record): after that, any node may attempt it again. */
#define CLAIM_MARGIN_US (30LL * 1000000)

int
eph_webhooks_next_due(eph_webhooks_t *wh, int64_t now_us, json_object **due, int64_t *next_us,
                      eph_error_t *err)
{
  char claim[33];
  if (eph_random_hex(claim, 16) < 0)
    return eph_error_set(err, EIO, "webhooks: no random bytes");
  sql_args_t a = {
      .now_us = now_us, .claim = claim, .lease_us = wh->timeout_ms * 1000 + CLAIM_MARGIN_US};
  int r = with_store(wh->store, false, db_next_due, pg_claim_due, &a, err);
  *due = a.out;
  *next_us = a.next_us;
  return r;
}

int
eph_webhooks_record(eph_webhooks_t *wh, const char *id, const char *claim, const char *status,
                    long code, const char *error, int64_t next_us, int64_t now_us, eph_error_t *err)
{
  sql_args_t a = {.id = id,
                  .claim = claim,
                  .status = status,
                  .code = code,
                  .error = error,
                  .next_us = next_us,
                  .now_us = now_us};
  int r = with_store(wh->store, false, db_record, pg_record, &a, err);
  if (r == 0 && claim && a.changes == 0)
    eph_warn("webhook delivery %s: its claim expired before the outcome (%s) was recorded; "
             "another node may attempt it again",
             id, status);
  return r;
}

int
eph_webhooks_purge(eph_webhooks_t *wh, int64_t before_us, eph_error_t *err)
{
  sql_args_t a = {.now_us = before_us};
  return with_store(wh->store, false, db_purge, pg_purge, &a, err);
}

/* ------------------------------------------------------------------ public */

/* What a receiver learns of a run: its outcome and usage, never the request (prompt,
 * inline files); under zero data retention not the answer or the error text either. */
static json_object *
summary_of(json_object *run)
{
  json_object *s = json_object_new_object(), *req = NULL, *zdr = NULL;
  bool hide = json_object_object_get_ex(run, "request", &req) &&
              json_object_object_get_ex(req, "zero_data_retention", &zdr) &&
              json_object_get_boolean(zdr);
  static const char *const keep[] = {"id",           "object",  "status", "reason", "created_at",
                                     "organisation", "backend", "usage",  "output", "error"};
  for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++) {
    json_object *v = NULL;
    if (hide && (strcmp(keep[i], "output") == 0 || strcmp(keep[i], "error") == 0))
      continue;
    if (json_object_object_get_ex(run, keep[i], &v))
      json_object_object_add(s, keep[i], json_object_get(v));
  }
  return s;
}

/* Queues run's end (ended_us: when it ended) for org's endpoints and its webhook_url. */
static void
announce(eph_webhooks_t *wh, const char *org, const char *run_id, json_object *run,
         int64_t ended_us)
{
  int64_t now = eph_wall_us();
  cleanup_json json_object *body = json_object_new_object();
  json_object_object_add(body, "type", json_object_new_string("run.ended"));
  json_object_object_add(body, "created_at_us", json_object_new_int64(now));
  json_object_object_add(body, "run", summary_of(run));
  sql_args_t a = {.org = org,
                  .run_id = run_id,
                  .body = json_object_to_json_string_ext(body, JSON_C_TO_STRING_PLAIN),
                  .now_us = now,
                  .ended_us = ended_us};
  eph_error_t err = {0};
  if (with_store(wh->store, false, db_enqueue, pg_enqueue, &a, &err) < 0)
    eph_warn("run %s: %s", run_id, err.message);
  else if (a.changes > 0)
    eph_webhooks_kick(wh);
  json_object *req = NULL, *u = NULL;
  if (json_object_object_get_ex(run, "request", &req) &&
      json_object_object_get_ex(req, "webhook_url", &u) &&
      json_object_is_type(u, json_type_string)) {
    eph_webhook_ids_t ids;
    if (eph_webhooks_new_ids(&ids) < 0) {
      eph_warn("run %s: webhook_url: no random bytes", run_id);
      return;
    }
    a.id = ids.id;
    a.secret = ids.secret;
    a.url = json_object_get_string(u);
    a.changes = 0;
    if (with_store(wh->store, true, db_default, pg_default, &a, &err) < 0)
      eph_warn("run %s: %s", run_id, err.message);
    else if (a.changes > 0)
      eph_webhooks_kick(wh);
    free(a.text);
    free(a.default_id);
  }
}

void
eph_webhooks_run_ended(eph_webhooks_t *wh, const char *org, const char *run_id, json_object *run)
{
  if (wh)
    announce(wh, org, run_id, run, eph_wall_us());
}

int
eph_webhooks_catch_up(eph_webhooks_t *wh, json_object *(*run_object)(json_object *row))
{
  if (!wh)
    return 0;
  int64_t now = eph_wall_us();
  /* Within the retry window (older ends would be given up at once anyway) and within the
   * deliveries' retention (a purged row must not look unannounced). */
  int64_t window = wh->retry_us < wh->retention_us ? wh->retry_us : wh->retention_us;
  sql_args_t a = {.since_us = now - window,
                  .now_us = now - CATCH_UP_GRACE_US,
                  .next_us = now - window - wh->max_run_us,
                  .limit = CATCH_UP_BATCH,
                  .out = json_object_new_array()};
  eph_error_t err = {0};
  if (with_store(wh->store, false, db_unannounced, pg_unannounced, &a, &err) < 0) {
    eph_warn("%s", err.message);
    json_object_put(a.out);
    return -1;
  }
  int n = 0;
  for (size_t i = 0; i < json_object_array_length(a.out); i++) {
    json_object *p = json_object_array_get_idx(a.out, i);
    const char *id = json_object_get_string(json_object_array_get_idx(p, 0));
    int64_t ended = json_object_get_int64(json_object_array_get_idx(p, 1));
    cleanup_json json_object *row = NULL;
    eph_error_t rerr = {0};
    if (eph_store_run_get(wh->store, id, NULL, &row, &rerr) < 0) {
      eph_warn("webhooks: run %s: %s", id, rerr.message);
      continue;
    }
    json_object *org = NULL;
    json_object_object_get_ex(row, "org", &org);
    cleanup_json json_object *run = run_object(row);
    announce(wh, json_object_get_string(org), id, run, ended);
    n++;
  }
  json_object_put(a.out);
  if (n > 0)
    eph_info("webhooks: queued the end of %d run(s) no process announced (recovered runs)", n);
  return n;
}

int
eph_webhooks_default_secret(eph_webhooks_t *wh, const char *org, char **secret_out,
                            eph_error_t *err)
{
  eph_webhook_ids_t ids;
  if (eph_webhooks_new_ids(&ids) < 0)
    return eph_error_set(err, EIO, "webhooks: no random bytes");
  sql_args_t a = {.org = org, .id = ids.id, .secret = ids.secret, .now_us = eph_wall_us()};
  int r = with_store(wh->store, true, db_default, pg_default, &a, err);
  free(a.default_id);
  if (r < 0) {
    free(a.text);
    return r;
  }
  *secret_out = a.text;
  return 0;
}

int
eph_webhooks_list(eph_webhooks_t *wh, const char *org, json_object **out, eph_error_t *err)
{
  sql_args_t a = {.org = org, .out = json_object_new_array()};
  int r = with_store(wh->store, false, db_list, pg_list, &a, err);
  if (r < 0) {
    json_object_put(a.out);
    return r;
  }
  *out = a.out;
  return 0;
}

int
eph_webhooks_delete(eph_webhooks_t *wh, const char *org, const char *id, eph_error_t *err)
{
  sql_args_t a = {.org = org, .id = id, .now_us = eph_wall_us()};
  return with_store(wh->store, true, db_delete, pg_delete, &a, err);
}

int
eph_webhooks_deliveries(eph_webhooks_t *wh, const char *org, int limit, json_object **out,
                        eph_error_t *err)
{
  sql_args_t a = {.org = org, .limit = limit, .out = json_object_new_array()};
  int r = with_store(wh->store, false, db_deliveries, pg_deliveries, &a, err);
  if (r < 0) {
    json_object_put(a.out);
    return r;
  }
  *out = a.out;
  return 0;
}
