/* The PostgreSQL store's cluster operations: what the nodes sharing one database coordinate
 * through (docs/cluster.md): cancel requests any node can make, the leases by which a node
 * holds its runs and takes over a dead node's, and the shared run queue. Each operation is
 * one statement, so a node that dies mid-call leaves no half-written change. */
#include "config.h"

#include <errno.h>
#include <string.h>

#include "store_pg_int.h"
#include "util.h"

/* ---------------------------------------------------------------- cluster */

/* The run ids a statement returned (its first column) as a JSON array of strings. */
static json_object *
run_ids(const PGresult *res)
{
  json_object *arr = json_object_new_array();
  for (int i = 0; i < PQntuples(res); i++)
    json_object_array_add(arr, json_object_new_string(PQgetvalue(res, i, 0)));
  return arr;
}

int
eph_pg_cancel_request(eph_store_t *base, const char *run_id, eph_error_t *err)
{
  int r;
  i64s_t now = i64s(eph_wall_us());
  const char *v[] = {run_id, now.s};
  /* Only for a run that exists; announced on channel eph_cancels (delivered at commit). */
  cleanup_pgresult PGresult *res =
      eph_pg_run(PG(base),
                 "WITH ins AS (INSERT INTO run_cancels(run_id, requested_at_us)"
                 " SELECT id, $2 FROM runs WHERE id = $1 ON CONFLICT (run_id) DO NOTHING"
                 " RETURNING run_id)"
                 " SELECT pg_notify('eph_cancels', run_id) FROM ins"
                 " UNION ALL SELECT NULL FROM runs WHERE id = $1",
                 2, v, "requesting a cancel", &r, err);
  if (r >= 0 && PQntuples(res) == 0)
    r = eph_error_set(err, ENOENT, "run %s does not exist", run_id);
  return r;
}

int
eph_pg_cancels_pending(eph_store_t *base, json_object **out, eph_error_t *err)
{
  int r;
  cleanup_pgresult PGresult *res =
      eph_pg_run(PG(base),
                 "SELECT c.run_id FROM run_cancels c JOIN runs r ON r.id = c.run_id"
                 " WHERE r.status IN ('queued', 'running')",
                 0, NULL, "reading cancel requests", &r, err);
  if (r >= 0)
    *out = run_ids(res);
  return r;
}

int
eph_pg_leases_renew(eph_store_t *base, json_object *ids, eph_error_t *err)
{
  pg_store_t *s = PG(base);
  if (!s->node)
    return eph_error_set(err, ENOTSUP, "%s: no node_name: no leases", base->path);
  int r;
  i64s_t lease = i64s(s->lease_us);
  /* The ids travel as one JSON parameter, expanded by the server: no SQL is built. */
  const char *v[] = {s->node, lease.s, json_text(ids)};
  cleanup_pgresult PGresult *res =
      eph_pg_run(s,
                 "UPDATE runs SET lease_expires_us = " PG_NOW_US " + $2::bigint WHERE node = $1"
                 " AND status IN ('queued', 'running')"
                 " AND id IN (SELECT jsonb_array_elements_text($3::jsonb))",
                 3, v, "renewing leases", &r, err);
  return r;
}

int
eph_pg_leases_take_expired(eph_store_t *base, json_object **out, eph_error_t *err)
{
  pg_store_t *s = PG(base);
  if (!s->node)
    return eph_error_set(err, ENOTSUP, "%s: no node_name: no leases", base->path);
  int r;
  i64s_t lease = i64s(s->lease_us);
  const char *v[] = {s->node, lease.s};
  /* Conditional: a second node updating the same row waits for the first, then re-checks
   * the WHERE against the new lease and skips it. Exactly one node takes each run. */
  cleanup_pgresult PGresult *res =
      eph_pg_run(s,
                 "WITH t AS (UPDATE runs SET node = $1, lease_expires_us = " PG_NOW_US
                 " + $2::bigint WHERE status IN ('queued', 'running')"
                 "  AND lease_expires_us < " PG_NOW_US " RETURNING id),"
                 /* A dead node's local_only queued runs (zero data retention) end with it. */
                 " q AS (DELETE FROM run_queue WHERE run_id IN (SELECT id FROM t) RETURNING 1),"
                 " d AS (UPDATE run_queue_length SET n = n - (SELECT count(*) FROM q) WHERE id = 1"
                 "  AND EXISTS (SELECT 1 FROM q))"
                 " SELECT id FROM t",
                 2, v, "taking over expired leases", &r, err);
  if (r >= 0)
    *out = run_ids(res);
  return r;
}

int
eph_pg_run_take_ended(eph_store_t *base, const char *run_id, eph_error_t *err)
{
  pg_store_t *s = PG(base);
  if (!s->node)
    return eph_error_set(err, ENOTSUP, "%s: no node_name: no leases", base->path);
  int r;
  const char *v[] = {run_id, s->node};
  /* No lease: an ended run is never taken over again (the takeover looks at queued and
   * running rows only); the node column alone fences the old holder's writes. */
  cleanup_pgresult PGresult *res =
      eph_pg_run(s,
                 "UPDATE runs SET node = $2, lease_expires_us = NULL WHERE id = $1"
                 " AND status NOT IN ('queued', 'running') AND node IS DISTINCT FROM $2",
                 2, v, "taking over an ended run's record", &r, err);
  return r < 0 ? r : affected(res) > 0;
}

int
eph_pg_fenced(pg_store_t *s, const char *run_id, const PGresult *res, eph_error_t *err)
{
  if (get_i64(res, 0, 0) > 0)
    return 0;
  if (get_i64(res, 0, 1) == 0)
    return eph_error_set(err, ENOENT, "run %s does not exist", run_id);
  const char *holder = PQgetvalue(res, 0, 2);
  /* The holder as the statement's snapshot saw it: a takeover committed while the write
   * waited shows this node's own name there. */
  if (!holder || !*holder || (s->node && strcmp(holder, s->node) == 0))
    holder = "another node";
  return eph_error_set(err, ESTALE,
                       "run %s: held by node '%s' now, not by this node ('%s'): this node's "
                       "lease on it expired and that node took it over; nothing written",
                       run_id, holder, s->node ? s->node : "");
}

/* ---------------------------------------------------------------- the shared queue */

int
eph_pg_queue_push(eph_store_t *base, const char *run_id, int64_t reserved_micros, bool local_only,
                  int max_queued, eph_error_t *err)
{
  pg_store_t *s = PG(base);
  if (!s->node)
    return eph_error_set(err, ENOTSUP, "%s: no node_name: no shared queue", base->path);
  int r;
  i64s_t reserved = i64s(reserved_micros), bound = i64s(max_queued), now = i64s(eph_wall_us());
  const char *v[] = {run_id, s->node, local_only ? "true" : "false", reserved.s, bound.s, now.s};
  /* The counter's row lock orders pushes: a second node's UPDATE waits for the first and
   * re-checks n < bound against its new value, so the bound holds across nodes. */
  cleanup_pgresult PGresult *res =
      eph_pg_run(s,
                 "WITH run AS (SELECT id FROM runs WHERE id = $1 AND status = 'queued'),"
                 " gate AS (UPDATE run_queue_length SET n = n + 1"
                 "  WHERE id = 1 AND n < $5 AND EXISTS (SELECT 1 FROM run) RETURNING n),"
                 " ins AS (INSERT INTO run_queue(run_id, admitted_by, local_only, reserved_micros,"
                 "  queued_at_us) SELECT $1, $2, $3, $4, $6 FROM gate RETURNING run_id),"
                 " rel AS (UPDATE runs SET node = NULL, lease_expires_us = NULL"
                 "  WHERE id IN (SELECT run_id FROM ins) AND NOT $3::boolean),"
                 /* Announced to idle workers of every node (delivered at commit); a
                  * local_only run is woken by its own node, in memory. */
                 " n AS (SELECT pg_notify('eph_queue', run_id) FROM ins WHERE NOT $3::boolean)"
                 " SELECT (SELECT count(*) FROM run), (SELECT count(*) FROM ins),"
                 "  (SELECT count(*) FROM n)",
                 6, v, "queueing the run", &r, err);
  if (r < 0)
    return r;
  if (get_i64(res, 0, 0) == 0)
    return eph_error_set(err, ENOENT, "run %s has no queued row", run_id);
  if (get_i64(res, 0, 1) == 0)
    return eph_error_set(err, EAGAIN, "the shared run queue is full (%d queued)", max_queued);
  return 0;
}

/* The rest of a claim after the row is picked (CTE c): the row leaves the queue and its
 * count, and the run gets this node ($1) and a lease of $2 micros (server time), only while
 * it is still queued. A row whose run is no longer queued (a push committed whose answer was
 * lost: the retry failed and the admitting node ended the run) is dropped, never claimed:
 * an ended run is not run again. */
#define CLAIM_REST                                                                                 \
  "  RETURNING run_id, reserved_micros, local_only),"                                              \
  " d AS (UPDATE run_queue_length SET n = n - (SELECT count(*) FROM c) WHERE id = 1"               \
  "  AND EXISTS (SELECT 1 FROM c)),"                                                               \
  " u AS (UPDATE runs SET node = $1, lease_expires_us = " PG_NOW_US " + $2::bigint FROM c"         \
  "  WHERE runs.id = c.run_id AND runs.status = 'queued'"                                          \
  "  RETURNING runs.id, runs.org, runs.request, runs.zdr,"                                         \
  "  runs.created_at_us)"                                                                          \
  " SELECT u.id, u.org, u.request, u.zdr, u.created_at_us, c.reserved_micros,"                     \
  "  c.local_only FROM u JOIN c ON c.run_id = u.id"

/* Runs a claim statement (CLAIM_REST after the pick; $3 = run_id when given) and shapes its
 * row as eph_store_queue_claim documents; *out stays NULL when it took nothing. */
static int
claim_with(pg_store_t *s, const char *sql, const char *run_id, const char *what, json_object **out,
           eph_error_t *err)
{
  if (!s->node)
    return eph_error_set(err, ENOTSUP, "%s: no node_name: no shared queue", s->base.path);
  int r;
  i64s_t lease = i64s(s->lease_us);
  const char *v[] = {s->node, lease.s, run_id};
  cleanup_pgresult PGresult *res = eph_pg_run(s, sql, run_id ? 3 : 2, v, what, &r, err);
  if (r < 0 || PQntuples(res) == 0)
    return r;
  json_object *o = json_object_new_object();
  json_object_object_add(o, "id", json_object_new_string(PQgetvalue(res, 0, 0)));
  json_object_object_add(o, "org", json_object_new_string(PQgetvalue(res, 0, 1)));
  json_object_object_add(o, "request", get_json(res, 0, 2));
  json_object_object_add(o, "zdr", json_object_new_boolean(PQgetvalue(res, 0, 3)[0] == 't'));
  json_object_object_add(o, "created_at_us", json_object_new_int64(get_i64(res, 0, 4)));
  json_object_object_add(o, "reserved_micros", json_object_new_int64(get_i64(res, 0, 5)));
  json_object_object_add(o, "local_only", json_object_new_boolean(PQgetvalue(res, 0, 6)[0] == 't'));
  *out = o;
  return 0;
}

int
eph_pg_queue_claim(eph_store_t *base, json_object **out, eph_error_t *err)
{
  /* SKIP LOCKED: nodes claiming at once take different rows instead of waiting for each
   * other; the row leaves the queue and the run gets this node and a lease in the same
   * statement, so a claimed run always has a holder (and a lease that can expire). */
  return claim_with(PG(base),
                    "WITH c AS (DELETE FROM run_queue WHERE run_id = ("
                    "  SELECT run_id FROM run_queue WHERE NOT local_only OR admitted_by = $1"
                    "  ORDER BY queued_at_us, run_id LIMIT 1 FOR UPDATE SKIP LOCKED)" CLAIM_REST,
                    NULL, "claiming a queued run", out, err);
}

int
eph_pg_queue_take(eph_store_t *base, const char *run_id, json_object **out, eph_error_t *err)
{
  /* Not SKIP LOCKED: a claimer holding the row makes this wait, then find it gone (the
   * DELETE re-checks a row changed under it); a take holding it makes claimers skip it. */
  return claim_with(
      PG(base), "WITH c AS (DELETE FROM run_queue WHERE run_id = $3 AND NOT local_only" CLAIM_REST,
      run_id, "taking a queued run out of the queue", out, err);
}

int
eph_pg_queue_remove(eph_store_t *base, const char *run_id, eph_error_t *err)
{
  int r;
  const char *v[] = {run_id};
  cleanup_pgresult PGresult *res =
      eph_pg_run(PG(base),
                 "WITH c AS (DELETE FROM run_queue WHERE run_id = $1 RETURNING run_id),"
                 " d AS (UPDATE run_queue_length SET n = n - 1 WHERE id = 1"
                 "  AND EXISTS (SELECT 1 FROM c))"
                 " SELECT count(*) FROM c",
                 1, v, "removing a queued run", &r, err);
  return r < 0 ? r : (int)get_i64(res, 0, 0);
}

int
eph_pg_queue_length(eph_store_t *base, int64_t *n, eph_error_t *err)
{
  int r;
  cleanup_pgresult PGresult *res =
      eph_pg_run(PG(base), "SELECT n FROM run_queue_length WHERE id = 1", 0, NULL,
                 "reading the queue's length", &r, err);
  if (r >= 0)
    *n = get_i64(res, 0, 0);
  return r;
}
