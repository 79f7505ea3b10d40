/* ephemerald's worker pool and ticker: the workers take runs from the in-memory queue (on a
 * cluster, claimed from the shared queue when it is empty) and execute them; the ticker
 * resumes waits past their deadline, sweeps settled runs from memory, runs the cluster's
 * duties and purges expired history; start, stop and the drain. The table and queue they
 * work on are server_live.c's. */
#include <config.h>

#include "server_int.h"

#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <string.h>
#include <time.h>

#include "cluster_ledger.h"
#include "log.h"
#include "runstore.h"
#include "server_cache.h"
#include "util.h"

/* How often an idle worker looks at the cluster's shared queue while the listener is down
 * (while it is up, an announced admission wakes it). */
#define SHARED_QUEUE_POLL_MS 200

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
  eph_run_observer_t obs;
  live_t *l = eph_srv_live_new(srv, run, org, 2, &obs); /* the table's ref and the worker's */
  eph_error_t err = {0};
  /* Its row and `reserved` event (seq 1) were stored by the admitting node. */
  eph_runstore_adopt(srv->store, run, &obs, 1, &err);
  pthread_mutex_lock(&srv->lock);
  eph_srv_live_insert_locked(srv, l);
  l->running = true;
  srv->running++;
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
      eph_srv_leave_shared_queue(srv, l);
    if (cancelled)
      eph_run_abandon(l->run, "cancelled"); /* cancelled while in the shared queue */
    else
      eph_run_execute(l->run);
    eph_srv_live_finished(srv, l);
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
        eph_srv_resume_locked(srv, w);
    }
    live_t *dead = eph_srv_live_unlink_locked(srv, false, now);
    bool purge = now >= srv->next_purge_ms;
    if (purge)
      srv->next_purge_ms = now + 3600 * 1000;
    pthread_mutex_unlock(&srv->lock);
    bool freed = eph_srv_live_free_chain(dead);
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
  pthread_mutex_lock(&srv->lock);
  eph_srv_wake_locked(srv, NULL);
  live_t *dead = eph_srv_live_unlink_locked(srv, true, 0);
  pthread_mutex_unlock(&srv->lock);
  eph_srv_live_free_chain(dead);
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
    eph_srv_leave_shared_queue(srv, l);
    eph_run_abandon(l->run, "shutdown");
    eph_srv_live_finished(srv, l);
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
