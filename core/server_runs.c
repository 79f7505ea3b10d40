/* ephemerald's run routes: GET /v1/runs/{id} (with ?wait=, by a suspended connection; a run
 * in memory, else the store, on a cluster a run executing on another node), GET /v1/runs
 * and POST /v1/runs/{id}/cancel. Admission (POST /v1/runs) is server_admit.c's, above this
 * unit; the runs in memory are server_live.c's, below it. */
#include <config.h>

#include "server_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "admin.h"
#include "log.h"
#include "server_cache.h"
#include "util.h"

/* How often ?wait= on a run executing on another cluster node reads the store while the
 * listener is down (while it is up, its announced events wake the wait). */
#define CLUSTER_WAIT_POLL_MS 200

/* ------------------------------------------------------------------ run objects */

json_object *
eph_srv_run_object(eph_server_t *srv, const char *id, const char *org, bool events,
                   eph_error_t *err)
{
  live_t *l = eph_srv_live_get(srv, id);
  if (l) {
    json_object *o = strcmp(l->org, org) == 0 ? eph_run_to_json(l->run, events) : NULL;
    if (o && events)
      eph_run_sync_events(l->run); /* the events it shows are stored (run.h) */
    eph_srv_live_put(l);
    if (!o)
      eph_error_set(err, ENOENT, "run %s does not exist", id);
    return o;
  }
  cleanup_json json_object *row = NULL, *evs = NULL;
  if (eph_store_run_get(srv->store, id, org, &row, err) < 0)
    return NULL;
  if (events && eph_store_events_since(srv->store, id, -1, 0, &evs, err) < 0)
    return NULL;
  return eph_run_json_from_store(row, evs);
}

/* The cache's renderer (server_cache.c): a run no longer in memory, rendered as the
 * uncached path renders it; NULL while it is live (never cached) or unreadable. */
static json_object *
render_stored(eph_server_t *srv, const char *id, const char *org)
{
  live_t *l = eph_srv_live_get(srv, id);
  if (l) {
    eph_srv_live_put(l);
    return NULL;
  }
  eph_error_t err = {0};
  return eph_srv_run_object(srv, id, org, true, &err);
}

/* ------------------------------------------------------------------ handlers */

static MHD_RESULT
not_found(eph_server_t *srv, struct MHD_Connection *c, const char *id)
{
  return eph_srv_error(c, srv, MHD_HTTP_NOT_FOUND, "not_found", NULL, "run %s does not exist", id);
}

MHD_RESULT
eph_srv_store_failure(eph_server_t *srv, struct MHD_Connection *c, const eph_error_t *err)
{
  if (err->code == ENOENT)
    return eph_srv_error(c, srv, MHD_HTTP_NOT_FOUND, "not_found", NULL, "%s", err->message);
  eph_error("%s", err->message);
  return eph_srv_error(c, srv, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal_error", NULL,
                       "the store failed; see the daemon's log");
}

/* True when a run object's timeline ends with its `settled` event (always the last). */
static bool
run_object_settled(json_object *o)
{
  json_object *events = json_object_object_get(o, "events"), *kind = NULL;
  size_t n = json_object_array_length(events);
  json_object *last = n ? json_object_array_get_idx(events, n - 1) : NULL;
  return last && json_object_object_get_ex(last, "kind", &kind) &&
         strcmp(json_object_get_string(kind), "settled") == 0;
}

/* True when a stored run is complete: its `settled` event is stored and so is its row's end
 * (written just after that event by the node that ran it). */
static bool
run_object_ended(json_object *o)
{
  const char *status = json_object_get_string(json_object_object_get(o, "status"));
  return run_object_settled(o) && status && strcmp(status, "queued") != 0 &&
         strcmp(status, "running") != 0;
}

/* Answers a created (or replayed) run, or suspends the connection until it settles or the
 * wait passes; called again when resumed. */
MHD_RESULT
eph_srv_runs_continue(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  eph_srv_live_put(req->live);
  req->live = NULL;
  live_t *l = eph_srv_live_get(srv, req->run_id);
  if (l && req->wait_until_ms > eph_now_ms()) {
    pthread_mutex_lock(&srv->lock);
    if (!srv->stopping && !eph_run_settled(l->run)) {
      req->live = l; /* keeps the ref while suspended */
      req->waiter.conn = c;
      req->waiter.live = l;
      req->waiter.events = false; /* its end resumes it (eph_srv_live_finished) */
      req->waiter.remote_id = NULL;
      req->waiter.deadline_ms = req->wait_until_ms;
      eph_srv_wait_add(srv, &req->waiter);
      pthread_mutex_unlock(&srv->lock);
      return MHD_YES;
    }
    pthread_mutex_unlock(&srv->lock);
  }
  json_object *o = NULL;
  eph_error_t err = {0};
  if (req->created && !req->wait_until_ms) {
    /* Without ?wait the answer is the run as admitted, whatever a worker did since. */
    eph_srv_live_put(l);
    o = steal_pointer(&req->created);
  } else if (l) {
    o = eph_run_to_json(l->run, true);
    eph_run_sync_events(l->run); /* the events it shows are stored (run.h) */
    eph_srv_live_put(l);
  } else {
    for (;;) {
      pthread_mutex_lock(&srv->lock);
      uint64_t gen = srv->events_gen;
      pthread_mutex_unlock(&srv->lock);
      o = eph_srv_run_object(srv, req->run_id, req->org, true, &err);
      if (!o)
        return eph_srv_store_failure(srv, c, &err);
      int64_t now = eph_now_ms();
      if (eph_store_kind(srv->store) != EPH_STORE_POSTGRES || req->wait_until_ms <= now ||
          run_object_ended(o))
        break;
      /* ?wait= for a run executing on another cluster node (an Idempotency-Key replay):
       * its progress is in the store, read again when it announces an event (its
       * `settled` one ends the wait), at the latest after the poll interval. */
      int64_t poll_ms = eph_srv_poll_ms(srv, CLUSTER_WAIT_POLL_MS);
      pthread_mutex_lock(&srv->lock);
      if (srv->stopping) {
        pthread_mutex_unlock(&srv->lock);
        break;
      }
      if (srv->events_gen != gen) {
        /* An event was announced since the read: read again rather than sleep on it. */
        pthread_mutex_unlock(&srv->lock);
        json_object_put(o);
        continue;
      }
      req->waiter.conn = c;
      req->waiter.live = NULL;
      req->waiter.remote_id = req->run_id;
      req->waiter.deadline_ms =
          now + poll_ms < req->wait_until_ms ? now + poll_ms : req->wait_until_ms;
      eph_srv_wait_add(srv, &req->waiter);
      pthread_mutex_unlock(&srv->lock);
      json_object_put(o);
      return MHD_YES;
    }
  }
  /* A wait can outlast its key: revoked meanwhile (through any node), the key gets nothing
   * of the run, as a stream it opened gets nothing more (server_sse.c). Fail closed: a key
   * the store cannot vouch for now gets no run either. */
  if (req->wait_until_ms && req->key_id) {
    cleanup_free char *org = NULL;
    int r = eph_admin_key_org(srv->store, req->key_id, &org, &err);
    if (r < 0) {
      json_object_put(o);
      if (r != -ENOENT)
        return eph_srv_store_failure(srv, c, &err);
      return eph_srv_error_h(c, srv, MHD_HTTP_UNAUTHORIZED, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
                             "Bearer realm=\"ephemeral\"", "authentication_error", NULL,
                             "the API key was revoked while the request waited");
    }
  }
  return eph_srv_json(c, srv, (unsigned)req->status, o);
}

MHD_RESULT
eph_srv_runs_get(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  char *text = NULL;
  size_t bytes = 0;
  if (eph_srv_ended_json(srv, req->param, req->org, render_stored, &text, &bytes) == 0)
    return eph_srv_send(c, srv, MHD_HTTP_OK, "application/json", text, bytes, NULL, NULL);
  eph_error_t err = {0};
  json_object *o = eph_srv_run_object(srv, req->param, req->org, true, &err);
  if (!o)
    return eph_srv_store_failure(srv, c, &err);
  return eph_srv_json(c, srv, MHD_HTTP_OK, o);
}

MHD_RESULT
eph_srv_runs_list(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  const char *ls = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit");
  const char *cursor = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "cursor");
  long limit = 20;
  if (ls) {
    char *end = NULL;
    errno = 0;
    limit = strtol(ls, &end, 10);
    if (!*ls || errno || *end || limit < 1 || limit > 1000)
      return eph_srv_error(c, srv, MHD_HTTP_BAD_REQUEST, "invalid_request", "limit",
                           "limit: expected 1..1000");
  }
  if (cursor && !*cursor)
    cursor = NULL;
  eph_error_t err = {0};
  cleanup_json json_object *rows = NULL;
  cleanup_free char *next = NULL;
  if (eph_store_run_list(srv->store, req->org, (int)limit, cursor, &rows, &next, &err) < 0) {
    if (err.code == EINVAL)
      return eph_srv_error(c, srv, MHD_HTTP_BAD_REQUEST, "invalid_request", "cursor", "%s",
                           err.message);
    return eph_srv_store_failure(srv, c, &err);
  }
  json_object *data = json_object_new_array();
  for (size_t i = 0; i < json_object_array_length(rows); i++)
    json_object_array_add(data, eph_run_json_from_store(json_object_array_get_idx(rows, i), NULL));
  json_object *o = json_object_new_object();
  json_object_object_add(o, "object", json_object_new_string("list"));
  json_object_object_add(o, "data", data);
  json_object_object_add(o, "next_cursor", next ? json_object_new_string(next) : NULL);
  return eph_srv_json(c, srv, MHD_HTTP_OK, o);
}

MHD_RESULT
eph_srv_runs_cancel(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  live_t *l = eph_srv_live_get(srv, req->param);
  if (l && strcmp(l->org, req->org) != 0) {
    eph_srv_live_put(l);
    return not_found(srv, c, req->param);
  }
  if (!l || !eph_srv_cancel_live(srv, l)) {
    eph_srv_live_put(l);
    eph_error_t err = {0};
    cleanup_json json_object *o = eph_srv_run_object(srv, req->param, req->org, false, &err);
    if (!o)
      return eph_srv_store_failure(srv, c, &err);
    const char *status = json_object_get_string(json_object_object_get(o, "status"));
    if (!l && eph_store_kind(srv->store) == EPH_STORE_POSTGRES && status &&
        strcmp(status, "queued") == 0) {
      /* Waiting in the shared queue: taken out of it and ended here, now (unless a node
       * claimed it in the meantime: then the cancel is requested from that node below). */
      int r = eph_srv_cluster_cancel_queued(srv, req->param, &err);
      if (r < 0)
        return eph_srv_store_failure(srv, c, &err);
      if (r == 1) {
        json_object *now = eph_srv_run_object(srv, req->param, req->org, false, &err);
        return now ? eph_srv_json(c, srv, MHD_HTTP_OK, now) : eph_srv_store_failure(srv, c, &err);
      }
    }
    if (!l && eph_store_kind(srv->store) == EPH_STORE_POSTGRES && status &&
        (strcmp(status, "queued") == 0 || strcmp(status, "running") == 0)) {
      /* Executing on another node: the request goes through the database, announced to
       * that node (NOTIFY eph_cancels), which cancels it at once (or at its next poll when
       * its listener is down). Answered with the run as it is now. */
      if (eph_store_cancel_request(srv->store, req->param, &err) < 0)
        return eph_srv_store_failure(srv, c, &err);
      return eph_srv_json(c, srv, MHD_HTTP_OK, json_object_get(o));
    }
    return eph_srv_error(c, srv, MHD_HTTP_CONFLICT, "conflict", NULL, "run %s has already ended",
                         req->param);
  }
  json_object *o = eph_run_to_json(l->run, false);
  eph_srv_live_put(l);
  return eph_srv_json(c, srv, MHD_HTTP_OK, o);
}
