/* ephemerald's runs: the table of runs in memory, the worker pool, waits (?wait=) by
 * suspended connections, reads from memory or the store, cancellation and the drain.
 * Admission (POST /v1/runs) is server_admit.c's, above this unit. */
#include <config.h>

#include "server_int.h"

#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cluster_ledger.h"
#include "log.h"
#include "runstore.h"
#include "server_cache.h"
#include "util.h"
#include "webhook.h"

/* How often ?wait= on a run executing on another cluster node reads the store while the
 * listener is down (while it is up, its announced events wake the wait). */
#define CLUSTER_WAIT_POLL_MS 200

/* ------------------------------------------------------------------ the table */

static unsigned
bucket_of(const char *id)
{
  uint32_t h = 2166136261u; /* FNV-1a */
  for (const unsigned char *p = (const unsigned char *)id; *p; p++)
    h = (h ^ *p) * 16777619u;
  return h % LIVE_BUCKETS;
}

static live_t *
find_locked(eph_server_t *srv, const char *id)
{
  for (live_t *l = srv->table[bucket_of(id)]; l; l = l->bucket_next)
    if (strcmp(l->id, id) == 0)
      return l;
  return NULL;
}

static void
unlink_locked(eph_server_t *srv, live_t *l)
{
  for (live_t **p = &srv->table[bucket_of(l->id)]; *p; p = &(*p)->bucket_next)
    if (*p == l) {
      *p = l->bucket_next;
      break;
    }
  l->in_table = false;
  srv->live_count--;
}

static void
live_free(live_t *l)
{
  /* Detached first: the list is keyed by the run's address, which another thread's new run
   * may get as soon as it is freed. The run is settled: no event can reach the link. */
  eph_runstore_detach(l->run);
  eph_run_free(l->run);
  free(l->org);
  free(l);
}

live_t *
eph_srv_live_get(eph_server_t *srv, const char *id)
{
  pthread_mutex_lock(&srv->lock);
  live_t *l = find_locked(srv, id);
  if (l)
    l->refs++;
  pthread_mutex_unlock(&srv->lock);
  return l;
}

void
eph_srv_live_put(live_t *l)
{
  if (!l)
    return;
  eph_server_t *srv = l->srv;
  pthread_mutex_lock(&srv->lock);
  bool last = --l->refs == 0;
  pthread_mutex_unlock(&srv->lock);
  if (last)
    live_free(l);
}

/* ------------------------------------------------------------------ waiters */

void
eph_srv_wait_add(eph_server_t *srv, waiter_t *w)
{
  w->prev = NULL;
  w->next = srv->waiters;
  if (srv->waiters)
    srv->waiters->prev = w;
  srv->waiters = w;
  w->listed = true;
  /* Suspended under srv->lock, resumed only under it: a resume never overtakes the suspend. */
  MHD_suspend_connection(w->conn);
}

void
eph_srv_wait_remove(eph_server_t *srv, waiter_t *w)
{
  if (!w->listed)
    return;
  if (w->prev)
    w->prev->next = w->next;
  else
    srv->waiters = w->next;
  if (w->next)
    w->next->prev = w->prev;
  w->listed = false;
  w->prev = w->next = NULL;
}

static void
resume_locked(eph_server_t *srv, waiter_t *w)
{
  eph_srv_wait_remove(srv, w);
  MHD_resume_connection(w->conn);
}

/* Resumes every connection waiting on l (all of them when l is NULL). */
static void
wake_locked(eph_server_t *srv, live_t *l)
{
  waiter_t *next;
  for (waiter_t *w = srv->waiters; w; w = next) {
    next = w->next;
    if (!l || w->live == l)
      resume_locked(srv, w);
  }
}

static void
obs_wake(void *opaque, eph_run_t *run)
{
  (void)run;
  live_t *l = opaque;
  pthread_mutex_lock(&l->srv->lock);
  wake_locked(l->srv, l);
  pthread_mutex_unlock(&l->srv->lock);
}

static void
obs_event(void *opaque, eph_run_t *run, const eph_event_t *ev)
{
  (void)ev;
  obs_wake(opaque, run);
}

void
eph_srv_req_done(eph_server_t *srv, conn_req_t *req)
{
  pthread_mutex_lock(&srv->lock);
  eph_srv_wait_remove(srv, &req->waiter);
  pthread_mutex_unlock(&srv->lock);
  eph_srv_live_put(req->live);
  req->live = NULL;
}

/* ------------------------------------------------------------------ workers, ticker */

/* Books a run that has settled: counters, waiters, the drain's condition. */
static void
finished(eph_server_t *srv, live_t *l)
{
  /* The webhook's payload: the run object as the API answers it. */
  cleanup_json json_object *o = eph_run_to_json(l->run, false);
  eph_run_usage_t u;
  eph_run_usage(l->run, &u);
  eph_run_status_t s = eph_run_status(l->run);
  pthread_mutex_lock(&srv->lock);
  if (l->running) {
    l->running = false;
    srv->running--;
  }
  l->settled = true;
  l->settled_ms = eph_now_ms();
  if (s <= EPH_RUN_CANCELLED)
    srv->runs_ended[s]++;
  srv->billed_model_micros += u.model_micros;
  srv->billed_web_micros += u.web_micros;
  srv->billed_compute_micros += u.compute_micros;
  wake_locked(srv, l);
  pthread_cond_broadcast(&srv->cond);
  pthread_mutex_unlock(&srv->lock);
  eph_webhooks_run_ended(srv->webhooks, l->org, l->id, o);
}

/* How often an idle worker looks at the cluster's shared queue while the listener is down
 * (while it is up, an announced admission wakes it). */
#define SHARED_QUEUE_POLL_MS 200

/* A run leaving this node's memory queue on a cluster (a zero-data-retention run, counted in
 * the shared queue as a local_only row for its bound): it leaves the count too, whether it
 * starts, is cancelled or is abandoned by a drain. A no-op for a run that has no row. */
static void
leave_shared_queue(eph_server_t *srv, live_t *l)
{
  eph_error_t err = {0};
  if (srv->shared_queue && eph_store_queue_remove(srv->store, l->id, &err) < 0)
    eph_warn("run %s: leaving the shared queue: %s", l->id, err.message);
}

/* Whether a cancel was requested for run ID (eph_store_cancel_request, on any node). An
 * unreadable answer counts as no (the ticker's poll still sees the request later). */
static bool
cancel_requested(eph_server_t *srv, const char *id)
{
  cleanup_json json_object *ids = NULL;
  eph_error_t err = {0};
  if (eph_store_cancels_pending(srv->store, &ids, &err) < 0) {
    eph_warn("run %s: reading cancel requests: %s", id, err.message);
    return false;
  }
  for (size_t i = 0; i < json_object_array_length(ids); i++)
    if (strcmp(json_object_get_string(json_object_array_get_idx(ids, i)), id) == 0)
      return true;
  return false;
}

/* A run claimed from the shared queue made live here, running: in the table with a ref for
 * the worker. NULL when nothing was claimed (or it could not be recorded: then it is ended
 * and settled). *cancelled: a cancel was requested while it waited in the shared queue
 * (nobody held it to act on it then), so the worker abandons it instead of starting it.
 * srv->lock not held. */
static live_t *
claim_live(eph_server_t *srv, bool *cancelled)
{
  char *org = NULL;
  eph_run_t *run = eph_srv_cluster_claim(srv, &org);
  if (!run)
    return NULL;
  live_t *l = eph_xcalloc(1, sizeof *l);
  l->srv = srv;
  l->run = run;
  l->org = org;
  snprintf(l->id, sizeof l->id, "%s", eph_run_id(run));
  l->refs = 2; /* the table's and the worker's */
  eph_run_observer_t obs = {.on_event = obs_event, .on_update = obs_wake, .opaque = l};
  eph_error_t err = {0};
  /* Its row and `reserved` event (seq 1) were stored by the admitting node. */
  eph_runstore_adopt(srv->store, run, &obs, 1, &err);
  pthread_mutex_lock(&srv->lock);
  unsigned b = bucket_of(l->id);
  l->bucket_next = srv->table[b];
  srv->table[b] = l;
  l->in_table = true;
  l->running = true;
  srv->running++;
  srv->live_count++;
  pthread_mutex_unlock(&srv->lock);
  /* Read once it is in the table: a cancel requested from here on is delivered to it
   * (announced, or the safety poll); one requested before is seen here. */
  *cancelled = cancel_requested(srv, l->id);
  return l;
}

static void *
worker_main(void *arg)
{
  eph_server_t *srv = arg;
  pthread_mutex_lock(&srv->lock);
  for (;;) {
    live_t *l = NULL;
    bool cancelled = false;
    while (!srv->queue_head && !srv->stopping) {
      if (!srv->shared_queue || srv->draining) {
        pthread_cond_wait(&srv->cond, &srv->lock);
        continue;
      }
      /* Idle on a cluster: take a run any node admitted. An admission anywhere is announced
       * (server_listen.c raises queue_gen and wakes the workers); the wait below is the
       * safety poll, or the old pace while the listener is down. A local admission of a
       * zero-data-retention run wakes this worker at once. */
      uint64_t gen = srv->queue_gen;
      pthread_mutex_unlock(&srv->lock);
      l = claim_live(srv, &cancelled);
      pthread_mutex_lock(&srv->lock);
      if (l || srv->queue_head || srv->stopping)
        break;
      if (srv->queue_gen != gen || srv->draining)
        continue; /* announced while this worker was claiming: claim again */
      int64_t poll_ms = eph_srv_poll_ms(srv, SHARED_QUEUE_POLL_MS);
      struct timespec until;
      clock_gettime(CLOCK_MONOTONIC, &until);
      until.tv_sec += poll_ms / 1000;
      until.tv_nsec += (poll_ms % 1000) * 1000000L;
      if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
      }
      pthread_cond_timedwait(&srv->cond, &srv->lock, &until);
    }
    bool local_only = false;
    if (!l) {
      if (!srv->queue_head)
        break;
      l = srv->queue_head;
      srv->queue_head = l->queue_next;
      if (!srv->queue_head)
        srv->queue_tail = NULL;
      l->queue_next = NULL;
      l->queued = false;
      l->running = true;
      l->refs++;
      srv->queued--;
      srv->running++;
      local_only = srv->shared_queue;
    }
    pthread_mutex_unlock(&srv->lock);
    if (local_only)
      leave_shared_queue(srv, l);
    if (cancelled)
      eph_run_abandon(l->run, "cancelled"); /* cancelled while in the shared queue */
    else
      eph_run_execute(l->run);
    finished(srv, l);
    eph_srv_live_put(l);
    pthread_mutex_lock(&srv->lock);
  }
  pthread_mutex_unlock(&srv->lock);
  return NULL;
}

/* Every 100 ms: resumes waits whose deadline passed (?wait=, SSE keep-alives), drops runs
 * settled more than live_grace_ms ago from memory, and hourly purges expired history. */
static void *
ticker_main(void *arg)
{
  eph_server_t *srv = arg;
  const struct timespec tick = {0, 100 * 1000000};
  eph_srv_cluster_t cluster;
  eph_srv_cluster_init(srv, &cluster);
  eph_orphans_t orphans; /* reservations of nodes lost before recording their run */
  eph_orphans_init(&orphans, srv->ctx, srv->store);
  for (;;) {
    nanosleep(&tick, NULL);
    live_t *dead = NULL;
    pthread_mutex_lock(&srv->lock);
    if (srv->stopping) {
      pthread_mutex_unlock(&srv->lock);
      break;
    }
    int64_t now = eph_now_ms();
    waiter_t *next;
    for (waiter_t *w = srv->waiters; w; w = next) {
      next = w->next;
      if (w->deadline_ms && w->deadline_ms <= now)
        resume_locked(srv, w);
    }
    for (unsigned b = 0; b < LIVE_BUCKETS; b++) {
      live_t *ln;
      for (live_t *l = srv->table[b]; l; l = ln) {
        ln = l->bucket_next;
        if (l->settled && now - l->settled_ms >= srv->opt.live_grace_ms) {
          unlink_locked(srv, l);
          if (--l->refs == 0) {
            l->bucket_next = dead;
            dead = l;
          }
        }
      }
    }
    bool purge = now >= srv->next_purge_ms;
    if (purge)
      srv->next_purge_ms = now + 3600 * 1000;
    pthread_mutex_unlock(&srv->lock);
    bool freed = dead != NULL;
    while (dead) {
      live_t *l = dead;
      dead = l->bucket_next;
      live_free(l);
    }
    /* After a burst, give the freed runs' memory back to the system once nothing is live
     * (glibc keeps it in its arenas otherwise): RSS follows the load, not the history. */
    if (freed) {
      pthread_mutex_lock(&srv->lock);
      bool empty = srv->live_count == 0;
      pthread_mutex_unlock(&srv->lock);
      if (empty)
        malloc_trim(0);
    }
    json_object *cancels = eph_srv_cluster_tick(srv, &cluster, now);
    eph_orphans_tick(&orphans, srv->ctx, srv->store, now);
    if (cancels) {
      eph_srv_cancel_ids(srv, cancels);
      json_object_put(cancels);
    }
    if (purge) {
      int64_t days = eph_config_values(&srv->ctx->config)->retention_days;
      eph_error_t err = {0};
      int n = eph_store_purge(srv->store, days > 0 ? (int)days : 30, &err);
      eph_srv_cache_clear(srv);
      if (n < 0)
        eph_warn("purging history: %s", err.message);
      else if (n > 0)
        eph_info("purged %d run(s) older than %" PRId64 " days", n, days);
    }
  }
  return NULL;
}

void
eph_srv_cancel_ids(eph_server_t *srv, json_object *ids)
{
  for (size_t i = 0; i < json_object_array_length(ids); i++) {
    live_t *l = eph_srv_live_get(srv, json_object_get_string(json_object_array_get_idx(ids, i)));
    if (!l)
      continue; /* another node's run */
    if (eph_srv_cancel_live(srv, l))
      eph_info("run %s: cancelled through another node", l->id);
    eph_srv_live_put(l);
  }
}

int
eph_srv_runs_init(eph_server_t *srv, eph_error_t *err)
{
  int hr = eph_srv_health_start(srv, err);
  if (hr < 0)
    return hr;
  srv->shared_queue = eph_store_kind(srv->store) == EPH_STORE_POSTGRES;
  srv->workers = eph_xcalloc((size_t)srv->opt.max_concurrent_runs, sizeof *srv->workers);
  for (int i = 0; i < srv->opt.max_concurrent_runs; i++) {
    int r = pthread_create(&srv->workers[i], NULL, worker_main, srv);
    if (r != 0)
      return eph_error_set(err, r, "starting run worker %d: %s", i, strerror(r));
    srv->n_workers++;
  }
  int r = pthread_create(&srv->ticker, NULL, ticker_main, srv);
  if (r != 0)
    return eph_error_set(err, r, "starting the ticker: %s", strerror(r));
  srv->ticker_started = true;
  return 0;
}

void
eph_srv_runs_stop(eph_server_t *srv)
{
  pthread_mutex_lock(&srv->lock);
  srv->stopping = true;
  pthread_cond_broadcast(&srv->cond);
  pthread_mutex_unlock(&srv->lock);
  for (int i = 0; i < srv->n_workers; i++)
    pthread_join(srv->workers[i], NULL);
  srv->n_workers = 0;
  if (srv->ticker_started)
    pthread_join(srv->ticker, NULL);
  srv->ticker_started = false;
  eph_srv_health_stop(srv);
  eph_srv_cache_clear(srv);
  /* Every wait and stream ends now (they see `stopping`); the table lets go of its runs. */
  live_t *dead = NULL;
  pthread_mutex_lock(&srv->lock);
  wake_locked(srv, NULL);
  for (unsigned b = 0; b < LIVE_BUCKETS; b++) {
    live_t *ln;
    for (live_t *l = srv->table[b]; l; l = ln) {
      ln = l->bucket_next;
      unlink_locked(srv, l);
      if (--l->refs == 0) {
        l->bucket_next = dead;
        dead = l;
      }
    }
  }
  pthread_mutex_unlock(&srv->lock);
  while (dead) {
    live_t *l = dead;
    dead = l->bucket_next;
    live_free(l);
  }
}

void
eph_srv_runs_drain(eph_server_t *srv, int grace_seconds)
{
  /* Under `admit`: no admission is half-way when the queue is taken. */
  pthread_mutex_lock(&srv->admit);
  pthread_mutex_lock(&srv->lock);
  srv->draining = true;
  live_t *queued = srv->queue_head;
  srv->queue_head = srv->queue_tail = NULL;
  for (live_t *l = queued; l; l = l->queue_next) {
    l->queued = false;
    l->refs++;
    srv->queued--;
  }
  pthread_mutex_unlock(&srv->lock);
  pthread_mutex_unlock(&srv->admit);

  int n_abandoned = 0;
  while (queued) {
    live_t *l = queued;
    queued = l->queue_next;
    l->queue_next = NULL;
    leave_shared_queue(srv, l);
    eph_run_abandon(l->run, "shutdown");
    finished(srv, l);
    eph_srv_live_put(l);
    n_abandoned++;
  }
  if (n_abandoned)
    eph_info("drain: %d queued run(s) abandoned and settled", n_abandoned);

  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_sec += grace_seconds;
  pthread_mutex_lock(&srv->lock);
  while (srv->running > 0)
    if (pthread_cond_timedwait(&srv->cond, &srv->lock, &until) == ETIMEDOUT)
      break;
  if (srv->running > 0) {
    eph_info("drain: cancelling %d run(s) still running after %d s", srv->running, grace_seconds);
    for (unsigned b = 0; b < LIVE_BUCKETS; b++)
      for (live_t *l = srv->table[b]; l; l = l->bucket_next)
        if (l->running)
          eph_run_cancel(l->run); /* takes only the run's lock */
    while (srv->running > 0)
      pthread_cond_wait(&srv->cond, &srv->lock);
  }
  pthread_mutex_unlock(&srv->lock);
}

/* ------------------------------------------------------------------ run objects */

json_object *
eph_srv_run_object(eph_server_t *srv, const char *id, const char *org, bool events,
                   eph_error_t *err)
{
  live_t *l = eph_srv_live_get(srv, id);
  if (l) {
    json_object *o = strcmp(l->org, org) == 0 ? eph_run_to_json(l->run, events) : NULL;
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
  return eph_srv_run_shape(row, evs);
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

/* Answers a created (or replayed) run, or suspends the connection until it settles or the
 * wait passes; called again when resumed. */
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
  return eph_srv_json(c, srv, (unsigned)req->status, o);
}

/* Makes a created run live on this node: recorded through the store (its row and events),
 * put in the table and at the end of the in-memory queue for a worker. On failure the
 * run's reservation is settled (eph_run_abandon) and the run freed: -1 with err set.
 * *created (when not NULL) receives the run as admitted, rendered before a worker can
 * touch it. */
int
eph_srv_live_enqueue(eph_server_t *srv, eph_run_t *run, const char *org, json_object **created,
                     eph_error_t *err)
{
  live_t *l = eph_xcalloc(1, sizeof *l);
  l->srv = srv;
  l->run = run;
  l->org = eph_xstrdup(org);
  snprintf(l->id, sizeof l->id, "%s", eph_run_id(run));
  l->refs = 1;
  eph_run_observer_t obs = {.on_event = obs_event, .on_update = obs_wake, .opaque = l};
  if (eph_runstore_attach(srv->store, run, &obs, err) < 0) {
    eph_error("run %s: %s", l->id, err->message);
    /* Settles the reservation made above (or leaves it to the reconciler when the ledger
     * fails too): nothing is charged for a run that never started. */
    eph_run_abandon(run, "storage_error");
    live_free(l);
    return -1;
  }
  if (created)
    *created = eph_run_to_json(run, true);
  pthread_mutex_lock(&srv->lock);
  unsigned b = bucket_of(l->id);
  l->bucket_next = srv->table[b];
  srv->table[b] = l;
  l->in_table = true;
  l->queued = true;
  if (srv->queue_tail)
    srv->queue_tail->queue_next = l;
  else
    srv->queue_head = l;
  srv->queue_tail = l;
  srv->queued++;
  srv->live_count++;
  srv->runs_created++;
  pthread_cond_broadcast(&srv->cond);
  pthread_mutex_unlock(&srv->lock);
  return 0;
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
    json_object_array_add(data, eph_srv_run_shape(json_object_array_get_idx(rows, i), NULL));
  json_object *o = json_object_new_object();
  json_object_object_add(o, "object", json_object_new_string("list"));
  json_object_object_add(o, "data", data);
  json_object_object_add(o, "next_cursor", next ? json_object_new_string(next) : NULL);
  return eph_srv_json(c, srv, MHD_HTTP_OK, o);
}

/* Cancels a run live on this node: a queued one is abandoned, a running one told to stop.
 * False when it has already ended (nothing to cancel). */
/* Under srv->lock: takes a queued l out of the memory queue. */
static void
unqueue_locked(eph_server_t *srv, live_t *l)
{
  for (live_t **p = &srv->queue_head, *prev = NULL; *p; prev = *p, p = &(*p)->queue_next)
    if (*p == l) {
      *p = l->queue_next;
      if (srv->queue_tail == l)
        srv->queue_tail = prev;
      break;
    }
  l->queue_next = NULL;
  l->queued = false;
  srv->queued--;
}

bool
eph_srv_unqueue_live(eph_server_t *srv, live_t *l, const char *reason)
{
  pthread_mutex_lock(&srv->lock);
  bool queued = l->queued;
  if (queued)
    unqueue_locked(srv, l);
  pthread_mutex_unlock(&srv->lock);
  if (!queued)
    return false;
  eph_run_abandon(l->run, reason);
  finished(srv, l);
  return true;
}

bool
eph_srv_cancel_live(eph_server_t *srv, live_t *l)
{
  bool abandon = false, ended = false;
  {
    pthread_mutex_lock(&srv->lock);
    if (l->queued) {
      unqueue_locked(srv, l);
      abandon = true;
    } else if (l->settled || eph_run_settled(l->run) ||
               eph_run_status(l->run) >= EPH_RUN_SUCCEEDED) {
      /* Ended but not yet settled (the settle is milliseconds away): a cancel can no longer
       * change how it ended, so it is a conflict, as after the settle. */
      ended = true;
    }
    pthread_mutex_unlock(&srv->lock);
  }
  if (ended)
    return false;
  if (abandon) {
    leave_shared_queue(srv, l);
    eph_run_abandon(l->run, "cancelled");
    finished(srv, l);
  } else {
    eph_run_cancel(l->run);
  }
  return true;
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
