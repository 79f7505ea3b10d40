/* The PostgreSQL store: one database several hosts share (docs/cluster.md). See store.h for
 * the contract and store_int.h for what core/store.c has already checked.
 *
 * One connection behind a mutex (libpq connections are not thread-safe); every statement
 * is PQexecParams with bound parameters: no SQL is ever built from data. Each operation is
 * one statement (autocommit), except where noted, so a node that dies mid-call leaves no
 * half-written change. When the server closed the connection (restart, failover), the
 * connection is reset and the statement retried once. */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "log.h"
#include "store_pg_int.h"
#include "util.h"

/* Advisory lock key serialising migrations across nodes: "ephemera" in ASCII. */
#define MIGRATION_LOCK_KEY "7308604897068041825"

/* Migrations (core/store_pg_schema.c): entry i brings eph_schema.version from i to i + 1. */
#define SCHEMA_VERSION eph_store_pg_schema_version
#define migrations eph_store_pg_migrations

/* ---------------------------------------------------------------- organisations */

static int
pg_org_create(eph_store_t *base, const char *org, eph_error_t *err)
{
  int r;
  i64s_t now = i64s(eph_wall_us());
  const char *v[] = {org, now.s};
  cleanup_pgresult PGresult *res =
      eph_pg_run(PG(base),
                 "INSERT INTO organisations(id, created_at_us) VALUES ($1, $2)"
                 " ON CONFLICT (id) DO NOTHING",
                 2, v, "creating the organisation", &r, err);
  return r;
}

static int
pg_member_add(eph_store_t *base, const char *org, const char *member, const char *role,
              eph_error_t *err)
{
  int r;
  i64s_t now = i64s(eph_wall_us());
  const char *v[] = {org, member, role, now.s};
  /* One statement: no member row for an organisation that does not exist. */
  cleanup_pgresult PGresult *res =
      eph_pg_run(PG(base),
                 "INSERT INTO members(org, member, role, created_at_us)"
                 " SELECT $1, $2, $3, $4 WHERE EXISTS (SELECT 1 FROM organisations WHERE id = $1)"
                 " ON CONFLICT (org, member) DO UPDATE SET role = excluded.role",
                 4, v, "adding the member", &r, err);
  if (r >= 0 && affected(res) == 0)
    r = eph_error_set(err, ENOENT, "organisation '%s' does not exist", org);
  return r;
}

/* ---------------------------------------------------------------- API keys */

static int
pg_key_insert(eph_store_t *base, const char *org, const char *name, const char *id,
              const unsigned char md[32], eph_error_t *err)
{
  /* The organisation first (idempotent: one left behind by a refused key is harmless, it
   * is created by the first key anyway). */
  int r = pg_org_create(base, org, err);
  if (r < 0)
    return r;
  i64s_t now = i64s(eph_wall_us());
  const char *v[] = {id, org, name, (const char *)md, now.s};
  int lens[] = {0, 0, 0, 32, 0}, fmts[] = {0, 0, 0, 1, 0};
  pg_store_t *s = PG(base);
  pthread_mutex_lock(&s->lock);
  cleanup_pgresult PGresult *res =
      eph_pg_exec(s,
                  "INSERT INTO api_keys(id, org, name, sha256, created_at_us)"
                  " VALUES ($1, $2, $3, $4, $5)",
                  5, v, lens, fmts, 0, "storing the API key", &r, err);
  pthread_mutex_unlock(&s->lock);
  if (r == -EEXIST)
    r = eph_error_set(err, EEXIST, "organisation '%s' already has an active key named '%s'", org,
                      name);
  return r;
}

static int
pg_key_lookup(eph_store_t *base, const unsigned char md[32], char **id_out, char **org_out,
              eph_error_t *err)
{
  int r;
  const char *v[] = {(const char *)md};
  int lens[] = {32}, fmts[] = {1};
  pg_store_t *s = PG(base);
  pthread_mutex_lock(&s->lock);
  /* Binary results: sha256 comes back as its 32 bytes, the text columns as their bytes
   * (NUL-terminated by libpq). */
  cleanup_pgresult PGresult *res = eph_pg_exec(
      s, "SELECT id, org, sha256 FROM api_keys WHERE sha256 = $1 AND revoked_at_us IS NULL", 1, v,
      lens, fmts, 1, "looking up the API key", &r, err);
  pthread_mutex_unlock(&s->lock);
  if (r < 0)
    return r;
  if (PQntuples(res) == 1 && PQgetlength(res, 0, 2) == 32 &&
      CRYPTO_memcmp(PQgetvalue(res, 0, 2), md, 32) == 0) {
    *id_out = get_dup(res, 0, 0);
    *org_out = get_dup(res, 0, 1);
    return 0;
  }
  return eph_error_set(err, EACCES, "invalid API key");
}

static int
pg_key_revoke(eph_store_t *base, const char *key_id_or_name, const char *org, eph_error_t *err)
{
  int r;
  i64s_t now = i64s(eph_wall_us());
  const char *v[] = {key_id_or_name, org, now.s};
  cleanup_pgresult PGresult *res =
      eph_pg_run(PG(base),
                 "UPDATE api_keys SET revoked_at_us = $3"
                 " WHERE org = $2 AND (id = $1 OR name = $1) AND revoked_at_us IS NULL",
                 3, v, "revoking the API key", &r, err);
  if (r >= 0 && affected(res) == 0)
    r = eph_error_set(err, ENOENT, "organisation '%s' has no active key '%s'", org, key_id_or_name);
  return r;
}

static int
pg_key_list(eph_store_t *base, const char *org, json_object **out, eph_error_t *err)
{
  int r;
  const char *v[] = {org};
  cleanup_pgresult PGresult *res =
      eph_pg_run(PG(base),
                 "SELECT id, name, created_at_us, revoked_at_us FROM api_keys"
                 " WHERE org = $1 ORDER BY created_at_us DESC, id DESC",
                 1, v, "listing API keys", &r, err);
  if (r < 0)
    return r;
  json_object *arr = json_object_new_array();
  for (int i = 0; i < PQntuples(res); i++) {
    json_object *k = json_object_new_object();
    json_object_object_add(k, "id", json_object_new_string(PQgetvalue(res, i, 0)));
    json_object_object_add(k, "name", json_object_new_string(PQgetvalue(res, i, 1)));
    json_object_object_add(k, "created_at_us", json_object_new_int64(get_i64(res, i, 2)));
    json_object_object_add(k, "revoked_at_us",
                           PQgetisnull(res, i, 3) ? NULL
                                                  : json_object_new_int64(get_i64(res, i, 3)));
    json_object_array_add(arr, k);
  }
  *out = arr;
  return 0;
}

/* ---------------------------------------------------------------- runs */

static int
pg_run_insert(eph_store_t *base, const char *id, const char *org, const char *status,
              int64_t created_at_us, json_object *stored, bool zdr, eph_error_t *err)
{
  int r;
  pg_store_t *s = PG(base);
  i64s_t t = i64s(created_at_us), lease = i64s(s->lease_us);
  const char *v[] = {id,
                     org,
                     status,
                     t.s,
                     zdr ? "true" : "false",
                     json_text(stored),
                     s->node,
                     s->node ? lease.s : NULL};
  /* The inserting node holds the run from the start: a node dying before its first
   * heartbeat still leaves a lease that expires. */
  cleanup_pgresult PGresult *res = eph_pg_run(
      s,
      "INSERT INTO runs(id, org, status, created_at_us, updated_at_us, zdr, request, node,"
      " lease_expires_us) VALUES ($1, $2, $3, $4, $4, $5, $6, $7, " PG_NOW_US " + $8::bigint)",
      8, v, "inserting the run", &r, err);
  return r;
}

static int
pg_run_update(eph_store_t *base, const char *id, const char *status, json_object *output,
              json_object *usage, eph_error_t *err)
{
  int r;
  pg_store_t *s = PG(base);
  i64s_t now = i64s(eph_wall_us());
  const char *v[] = {id, status, json_text(output), json_text(usage), now.s, s->node};
  /* output is kept NULL under zdr whatever is bound. The end of a run (its row written
   * after its `settled` event) is announced like an event: a node waiting for the run to
   * end (?wait=) reads the finished row then, not at its next poll.
   * The fence ($6, this node): a row another node holds is not this node's to write. A
   * node stalled past its lease (SIGSTOP, a paused VM) whose run was ended host_lost and
   * settled by another node would otherwise overwrite that record when it resumes. The
   * UPDATE re-checks the condition against a takeover committed while it waited. */
  cleanup_pgresult PGresult *res =
      eph_pg_run(s,
                 "WITH u AS (UPDATE runs SET status = coalesce($2, status),"
                 " output = CASE WHEN zdr THEN NULL ELSE coalesce($3, output) END,"
                 " usage = coalesce($4, usage), updated_at_us = $5 WHERE id = $1"
                 " AND ($6::text IS NULL OR node IS NULL OR node = $6) RETURNING id),"
                 " n AS (SELECT pg_notify('eph_events', id) FROM u"
                 "  WHERE $2 NOT IN ('queued', 'running'))"
                 " SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM runs WHERE id = $1),"
                 "  (SELECT node FROM runs WHERE id = $1), (SELECT count(*) FROM n)",
                 6, v, "updating the run", &r, err);
  return r < 0 ? r : eph_pg_fenced(s, id, res, err);
}

/* A run object from a row of the run queries (same columns). */
static json_object *
run_from_row(const PGresult *res, int i, bool with_content)
{
  json_object *o = json_object_new_object();
  json_object_object_add(o, "id", json_object_new_string(PQgetvalue(res, i, 0)));
  json_object_object_add(o, "org", json_object_new_string(PQgetvalue(res, i, 1)));
  json_object_object_add(o, "status", json_object_new_string(PQgetvalue(res, i, 2)));
  json_object_object_add(o, "created_at_us", json_object_new_int64(get_i64(res, i, 3)));
  json_object_object_add(o, "updated_at_us", json_object_new_int64(get_i64(res, i, 4)));
  json_object_object_add(o, "zero_data_retention",
                         json_object_new_boolean(PQgetvalue(res, i, 5)[0] == 't'));
  if (with_content) {
    json_object_object_add(o, "request", get_json(res, i, 6));
    json_object_object_add(o, "output", get_json(res, i, 7));
  }
  json_object_object_add(o, "usage", get_json(res, i, 8));
  return o;
}

static int
pg_run_get(eph_store_t *base, const char *id, json_object **out, eph_error_t *err)
{
  int r;
  const char *v[] = {id};
  cleanup_pgresult PGresult *res =
      eph_pg_run(PG(base),
                 "SELECT id, org, status, created_at_us, updated_at_us, zdr, request, output, usage"
                 " FROM runs WHERE id = $1",
                 1, v, "reading the run", &r, err);
  if (r >= 0 && PQntuples(res) == 1)
    *out = run_from_row(res, 0, true);
  return r;
}

static int
pg_run_list(eph_store_t *base, const char *org, int limit, int64_t after_us, const char *after_id,
            json_object **out, eph_error_t *err)
{
  int r;
  i64s_t lim = i64s(limit + 1), after = i64s(after_us);
  const char *v[] = {org, lim.s, after.s, after_id};
  cleanup_pgresult PGresult *res =
      after_id ? eph_pg_run(PG(base),
                            "SELECT id, org, status, created_at_us, updated_at_us, zdr, NULL, NULL,"
                            " usage FROM runs WHERE org = $1"
                            " AND (created_at_us < $3 OR (created_at_us = $3 AND id < $4))"
                            " ORDER BY created_at_us DESC, id DESC LIMIT $2",
                            4, v, "listing runs", &r, err)
               : eph_pg_run(PG(base),
                            "SELECT id, org, status, created_at_us, updated_at_us, zdr, NULL, NULL,"
                            " usage FROM runs WHERE org = $1"
                            " ORDER BY created_at_us DESC, id DESC LIMIT $2",
                            2, v, "listing runs", &r, err);
  if (r < 0)
    return r;
  json_object *arr = json_object_new_array();
  for (int i = 0; i < PQntuples(res); i++)
    json_object_array_add(arr, run_from_row(res, i, false));
  *out = arr;
  return 0;
}

/* ---------------------------------------------------------------- events */

static int
pg_event_append(eph_store_t *base, const char *run_id, int64_t seq, int64_t t_ms,
                const char *source, const char *kind, const char *text, json_object *data,
                eph_error_t *err)
{
  int r;
  pg_store_t *s = PG(base);
  i64s_t sq = i64s(seq), t = i64s(t_ms);
  const char *v[] = {run_id, sq.s, t.s, source, kind, text, json_text(data), s->node};
  /* One statement decides on zdr from the run row itself, inserts nothing for an unknown
   * run, and announces the event to every node following the run (channel eph_events,
   * payload the run id; delivered at commit). The fence ($8) as in pg_run_update: the row
   * is read FOR SHARE, so a takeover (an UPDATE of the row) waits for this insert to
   * commit, and an insert waiting for a takeover re-reads the row and sees its new holder:
   * the taker, reading the events after its takeover, sees every event the old holder
   * wrote, and none comes after. */
  cleanup_pgresult PGresult *res = eph_pg_run(
      s,
      "WITH r AS (SELECT id, zdr, node FROM runs WHERE id = $1 FOR SHARE),"
      " ins AS (INSERT INTO events(run_id, seq, t_ms, source, kind, text, data)"
      " SELECT id, $2, $3, $4, $5, $6, CASE WHEN zdr THEN NULL ELSE $7 END"
      " FROM r WHERE $8::text IS NULL OR r.node IS NULL OR r.node = $8 RETURNING run_id),"
      " n AS (SELECT pg_notify('eph_events', run_id) FROM ins)"
      " SELECT (SELECT count(*) FROM n), (SELECT count(*) FROM r), (SELECT node FROM r)",
      8, v, "appending the event", &r, err);
  return r < 0 ? r : eph_pg_fenced(s, run_id, res, err);
}

static int
pg_events_since(eph_store_t *base, const char *run_id, int64_t since_seq, int limit,
                json_object **out, eph_error_t *err)
{
  int r;
  i64s_t since = i64s(since_seq), lim = i64s(limit);
  const char *v[] = {run_id, since.s, limit ? lim.s : NULL}; /* LIMIT NULL: no limit */
  cleanup_pgresult PGresult *res =
      eph_pg_run(PG(base),
                 "SELECT seq, t_ms, source, kind, text, data FROM events"
                 " WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                 3, v, "reading events", &r, err);
  if (r < 0)
    return r;
  json_object *arr = json_object_new_array();
  for (int i = 0; i < PQntuples(res); i++) {
    json_object *e = json_object_new_object();
    json_object_object_add(e, "seq", json_object_new_int64(get_i64(res, i, 0)));
    json_object_object_add(e, "t_ms", json_object_new_int64(get_i64(res, i, 1)));
    json_object_object_add(e, "source", json_object_new_string(PQgetvalue(res, i, 2)));
    json_object_object_add(e, "kind", json_object_new_string(PQgetvalue(res, i, 3)));
    json_object_object_add(e, "text", json_object_new_string(PQgetvalue(res, i, 4)));
    json_object *data = get_json(res, i, 5);
    if (data)
      json_object_object_add(e, "data", data);
    json_object_array_add(arr, e);
  }
  *out = arr;
  return 0;
}

/* ---------------------------------------------------------------- idempotency */

static int
pg_idem_claim(eph_store_t *base, const char *org, const char *key, const char *body_sha256_hex,
              const char *new_run_id, int64_t now, char **existing_run_id, eph_error_t *err)
{
  pg_store_t *s = PG(base);
  i64s_t now_s = i64s(now), expired = i64s(now - base->idempotency_us);
  /* The unique (org, key) index decides between nodes: of concurrent inserts one wins and
   * the others wait for its commit and then see its row. A claim released between our
   * failed insert and the read is retried. */
  for (int attempt = 0; attempt < 3; attempt++) {
    int r;
    {
      const char *v[] = {org, key, expired.s};
      cleanup_pgresult PGresult *res = eph_pg_run(
          s, "DELETE FROM idempotency WHERE org = $1 AND key = $2 AND created_at_us < $3", 3, v,
          "forgetting an expired idempotency key", &r, err);
      if (r < 0)
        return r;
    }
    {
      const char *v[] = {org, key, body_sha256_hex, new_run_id, now_s.s};
      cleanup_pgresult PGresult *res =
          eph_pg_run(s,
                     "INSERT INTO idempotency(org, key, body_sha256, run_id, created_at_us)"
                     " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (org, key) DO NOTHING",
                     5, v, "claiming the idempotency key", &r, err);
      if (r < 0)
        return r;
      if (affected(res) == 1)
        return 0;
    }
    const char *v[] = {org, key};
    cleanup_pgresult PGresult *res =
        eph_pg_run(s, "SELECT body_sha256, run_id FROM idempotency WHERE org = $1 AND key = $2", 2,
                   v, "reading the idempotency key", &r, err);
    if (r < 0)
      return r;
    if (PQntuples(res) == 0)
      continue;
    if (strcmp(PQgetvalue(res, 0, 0), body_sha256_hex) != 0)
      return eph_error_set(
          err, EBUSY, "idempotency key '%s' was already used with a different request body", key);
    *existing_run_id = get_dup(res, 0, 1);
    return 1;
  }
  return eph_error_set(err, EBUSY, "idempotency key '%s': claimed and released repeatedly", key);
}

static int
pg_idem_release(eph_store_t *base, const char *org, const char *key, const char *run_id,
                eph_error_t *err)
{
  int r;
  const char *v[] = {org, key, run_id};
  cleanup_pgresult PGresult *res =
      eph_pg_run(PG(base), "DELETE FROM idempotency WHERE org = $1 AND key = $2 AND run_id = $3", 3,
                 v, "releasing the idempotency key", &r, err);
  return r;
}

/* ---------------------------------------------------------------- retention, health */

static int
pg_purge(eph_store_t *base, int64_t runs_before_us, int64_t idem_before_us, eph_error_t *err)
{
  int r, deleted;
  i64s_t runs = i64s(runs_before_us), idem = i64s(idem_before_us);
  {
    /* Queued runs purged with their rows leave the queue's count too. */
    const char *v[] = {runs.s};
    cleanup_pgresult PGresult *res =
        eph_pg_run(PG(base),
                   "WITH q AS (DELETE FROM run_queue WHERE run_id IN"
                   "  (SELECT id FROM runs WHERE created_at_us < $1) RETURNING 1)"
                   " UPDATE run_queue_length SET n = n - (SELECT count(*) FROM q) WHERE id = 1"
                   "  AND EXISTS (SELECT 1 FROM q)",
                   1, v, "purging queued runs", &r, err);
    if (r < 0)
      return r;
  }
  {
    const char *v[] = {runs.s};
    cleanup_pgresult PGresult *res = eph_pg_run(
        PG(base), "DELETE FROM runs WHERE created_at_us < $1", 1, v, "purging runs", &r, err);
    if (r < 0)
      return r;
    deleted = affected(res); /* events go with them: ON DELETE CASCADE */
  }
  const char *v[] = {idem.s};
  cleanup_pgresult PGresult *res =
      eph_pg_run(PG(base), "DELETE FROM idempotency WHERE created_at_us < $1", 1, v,
                 "purging idempotency keys", &r, err);
  return r < 0 ? r : deleted;
}

static int
pg_probe(eph_store_t *base, eph_error_t *err)
{
  int r;
  i64s_t now = i64s(eph_wall_us());
  const char *v[] = {now.s};
  cleanup_pgresult PGresult *res =
      eph_pg_run(PG(base),
                 "INSERT INTO probe(id, t_us) VALUES (1, $1)"
                 " ON CONFLICT (id) DO UPDATE SET t_us = excluded.t_us",
                 1, v, "health probe", &r, err);
  return r;
}

static int
pg_with_db(eph_store_t *base, int (*fn)(struct sqlite3 *db, void *opaque, eph_error_t *err),
           void *opaque, eph_error_t *err)
{
  pg_store_t *s = PG(base);
  if (!s->local)
    return eph_error_set(err, ENOTSUP,
                         "%s: webhooks and the admin audit are node-local: no local store file "
                         "was given",
                         base->path);
  return s->local->ops->with_db(s->local, fn, opaque, err); /* the SQLite store's own */
}

static void
pg_close(eph_store_t *base)
{
  pg_store_t *s = PG(base);
  if (s->conn)
    PQfinish(s->conn);
  if (s->local) /* its own close: this unit stays below store.c's dispatch */
    s->local->ops->close(s->local);
  free(s->node);
  free(s->session_sql);
  pthread_mutex_destroy(&s->lock);
  eph_store_base_free(&s->base);
  free(s);
}

static const eph_store_ops_t pg_ops = {
    .kind = EPH_STORE_POSTGRES,
    .close = pg_close,
    .org_create = pg_org_create,
    .member_add = pg_member_add,
    .key_insert = pg_key_insert,
    .key_lookup = pg_key_lookup,
    .key_revoke = pg_key_revoke,
    .key_list = pg_key_list,
    .run_insert = pg_run_insert,
    .run_update = pg_run_update,
    .run_get = pg_run_get,
    .run_list = pg_run_list,
    .event_append = pg_event_append,
    .events_since = pg_events_since,
    .idem_claim = pg_idem_claim,
    .idem_release = pg_idem_release,
    .purge = pg_purge,
    .probe = pg_probe,
    .cancel_request = eph_pg_cancel_request,
    .cancels_pending = eph_pg_cancels_pending,
    .queue_push = eph_pg_queue_push,
    .queue_claim = eph_pg_queue_claim,
    .queue_remove = eph_pg_queue_remove,
    .queue_length = eph_pg_queue_length,
    .queue_take = eph_pg_queue_take,
    .listen = eph_pg_listen,
    .leases_renew = eph_pg_leases_renew,
    .leases_take_expired = eph_pg_leases_take_expired,
    .run_take_ended = eph_pg_run_take_ended,
    .cluster_ledger = eph_pg_cluster_ledger,
    .with_db = pg_with_db,
    .with_pg = eph_pg_with_pg,
    .pg_query = eph_pg_query,
};

/* ---------------------------------------------------------------- open, migrations */

/* What messages call the database: its target without the password. */
static char *
display_target(const char *conninfo)
{
  char *msg = NULL;
  PQconninfoOption *opts = PQconninfoParse(conninfo, &msg);
  if (!opts) {
    PQfreemem(msg);
    return eph_xstrdup("PostgreSQL (unparsable connection string)");
  }
  const char *host = NULL, *port = NULL, *db = NULL, *user = NULL;
  for (PQconninfoOption *o = opts; o->keyword; o++) {
    if (!o->val)
      continue;
    if (strcmp(o->keyword, "host") == 0)
      host = o->val;
    else if (strcmp(o->keyword, "port") == 0)
      port = o->val;
    else if (strcmp(o->keyword, "dbname") == 0)
      db = o->val;
    else if (strcmp(o->keyword, "user") == 0)
      user = o->val;
  }
  char *out = eph_xasprintf("PostgreSQL database %s (host %s%s%s, user %s)", db ? db : "(default)",
                            host ? host : "(default)", port ? " port " : "", port ? port : "",
                            user ? user : "(default)");
  PQconninfoFree(opts);
  return out;
}

static int
exec_plain(pg_store_t *s, const char *sql, const char *what, eph_error_t *err)
{
  cleanup_pgresult PGresult *res = PQexec(s->conn, sql);
  ExecStatusType st = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
  if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)
    return 0;
  return eph_pg_error(s, res, what, err);
}

/* Migrates the schema forward in one transaction holding a transaction-scoped advisory
 * lock: nodes starting at once queue on it, and each finds the version the first left. */
static int
migrate(pg_store_t *s, eph_error_t *err)
{
  int r = exec_plain(s, "BEGIN", "starting the schema migration", err);
  if (r < 0)
    return r;
  if ((r = exec_plain(s, "SELECT pg_advisory_xact_lock(" MIGRATION_LOCK_KEY ")",
                      "waiting for other nodes' migration", err)) >= 0)
    r = exec_plain(s,
                   "CREATE TABLE IF NOT EXISTS eph_schema (version INTEGER NOT NULL);"
                   "INSERT INTO eph_schema SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM eph_schema)",
                   "creating the schema version table", err);
  int version = -1;
  if (r >= 0) {
    cleanup_pgresult PGresult *res = PQexec(s->conn, "SELECT version FROM eph_schema");
    if (res && PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
      version = atoi(PQgetvalue(res, 0, 0));
    else
      r = eph_pg_error(s, res, "reading the schema version", err);
  }
  if (r >= 0 && version > SCHEMA_VERSION)
    r = eph_error_set(err, EPH_E_CONFIG,
                      "%s: schema version %d is newer than this program's (%d); refusing to "
                      "touch it",
                      s->base.path, version, SCHEMA_VERSION);
  for (int v = version; r >= 0 && v < SCHEMA_VERSION; v++) {
    char what[64], set[64];
    snprintf(what, sizeof what, "migrating the schema to version %d", v + 1);
    snprintf(set, sizeof set, "UPDATE eph_schema SET version = %d", v + 1);
    if ((r = exec_plain(s, migrations[v], what, err)) >= 0)
      r = exec_plain(s, set, what, err);
  }
  if (r < 0) {
    exec_plain(s, "ROLLBACK", "rolling back the migration", NULL);
    return r;
  }
  if ((r = exec_plain(s, "COMMIT", "committing the schema", err)) >= 0)
    s->base.schema_version = SCHEMA_VERSION;
  return r;
}

/* libpq's notices ("relation exists, skipping") are not ours to print on stderr. */
static void
quiet_notice(void *arg, const char *message)
{
  (void)arg;
  (void)message;
}

int
eph_store_pg_open(const char *conninfo, const eph_store_options_t *opt, eph_store_t **out,
                  eph_error_t *err)
{
  int r = eph_pq_load(err);
  if (r < 0)
    return r;
  pg_store_t *s = eph_xcalloc(1, sizeof *s);
  cleanup_free char *display = display_target(conninfo);
  eph_store_base_init(&s->base, &pg_ops, display, (int64_t)opt->idempotency_hours * 3600 * 1000000);
  pthread_mutex_init(&s->lock, NULL);
  if (opt->node_name && *opt->node_name) {
    s->node = eph_xstrdup(opt->node_name);
    s->lease_us = (int64_t)(opt->lease_seconds > 0 ? opt->lease_seconds : 15) * 1000000;
  }
  s->conn = PQconnectdb(conninfo);
  if (!s->conn || PQstatus(s->conn) != CONNECTION_OK) {
    char clean[400];
    snprintf(clean, sizeof clean, "%s", s->conn ? PQerrorMessage(s->conn) : "out of memory");
    clean[strcspn(clean, "\n")] = '\0';
    r = eph_error_set(err, EIO, "%s: connecting: %s", display, clean);
    goto fail;
  }
  PQsetNoticeProcessor(s->conn, quiet_notice, NULL);
  /* The search path pinned to the store's schema (store_pg_conn.c), on this session and
   * every one a reconnect makes. Statements that wait on a lock give up rather than hang a
   * request forever. */
  char *search_path = NULL;
  if ((r = eph_pg_choose_schema(s, &search_path, err)) < 0)
    goto fail;
  s->session_sql = eph_xasprintf("%s; SET lock_timeout = %d; SET client_encoding = 'UTF8'",
                                 search_path, opt->busy_timeout_ms);
  free(search_path);
  if ((r = eph_pg_session(s, "setting the session", err)) < 0 || (r = migrate(s, err)) < 0)
    goto fail;
  if (opt->local_path && (r = eph_store_sqlite_open(opt->local_path, opt, &s->local, err)) < 0)
    goto fail;
  *out = &s->base;
  return 0;
fail:
  pg_close(&s->base);
  return r;
}
