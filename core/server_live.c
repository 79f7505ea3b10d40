/* ephemerald's runs in memory: the table of live runs (reference counted: the table's own
 * ref plus one per reader), the in-memory queue, the connections waiting on a run's news,
 * and how a run leaves: finished (counted, its waiters woken, its webhook queued), swept
 * from the table once settled for live_grace_ms, cancelled. The worker pool and ticker
 * (server_workers.c) and the handlers (server_runs.c, server_admit.c, server_sse.c) sit
 * above it; it calls none of them. Everything here takes srv->lock itself unless its name
 * ends in _locked. */
#include <config.h>

#include "server_int.h"

#include <stdio.h>
#include <string.h>

#include "log.h"
#include "runstore.h"
#include "util.h"
#include "webhook.h"

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

void
eph_srv_live_free(live_t *l)
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
    eph_srv_live_free(l);
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
eph_srv_count_event_waiter(waiter_t *w)
{
  if (w->live && w->events && !w->counted) {
    atomic_fetch_add(&w->live->event_waiters, 1);
    w->counted = true;
  }
}

void
eph_srv_wait_remove(eph_server_t *srv, waiter_t *w)
{
  if (w->counted) {
    atomic_fetch_sub(&w->live->event_waiters, 1);
    w->counted = false;
  }
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

void
eph_srv_resume_locked(eph_server_t *srv, waiter_t *w)
{
  eph_srv_wait_remove(srv, w);
  MHD_resume_connection(w->conn);
}

void
eph_srv_wake_locked(eph_server_t *srv, live_t *l)
{
  waiter_t *next;
  for (waiter_t *w = srv->waiters; w; w = next) {
    next = w->next;
    if (!l || w->live == l)
      eph_srv_resume_locked(srv, w);
  }
}

/* A new event or state of l's run: resumes the streams following it. A ?wait= for the run's
 * end is not woken by every event (it would only suspend again): eph_srv_live_finished
 * resumes it. With nobody streaming the run, no lock is taken (event_waiters is counted
 * before a stream checks for events and suspends: see eph_srv_count_event_waiter). */
static void
obs_wake(void *opaque, eph_run_t *run)
{
  (void)run;
  live_t *l = opaque;
  if (atomic_load(&l->event_waiters) == 0)
    return;
  pthread_mutex_lock(&l->srv->lock);
  waiter_t *next;
  for (waiter_t *w = l->srv->waiters; w; w = next) {
    next = w->next;
    if (w->live == l && w->events)
      eph_srv_resume_locked(l->srv, w);
  }
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

live_t *
eph_srv_live_new(eph_server_t *srv, eph_run_t *run, char *org, int refs, eph_run_observer_t *obs)
{
  live_t *l = eph_xcalloc(1, sizeof *l);
  l->srv = srv;
  l->run = run;
  l->org = org;
  snprintf(l->id, sizeof l->id, "%s", eph_run_id(run));
  l->refs = refs;
  *obs = (eph_run_observer_t){.on_event = obs_event, .on_update = obs_wake, .opaque = l};
  return l;
}

void
eph_srv_live_insert_locked(eph_server_t *srv, live_t *l)
{
  unsigned b = bucket_of(l->id);
  l->bucket_next = srv->table[b];
  srv->table[b] = l;
  l->in_table = true;
  srv->live_count++;
}

/* ------------------------------------------------------------------ the sweep */

live_t *
eph_srv_live_unlink_locked(eph_server_t *srv, bool all, int64_t now_ms)
{
  live_t *dead = NULL;
  for (unsigned b = 0; b < LIVE_BUCKETS; b++) {
    live_t *ln;
    for (live_t *l = srv->table[b]; l; l = ln) {
      ln = l->bucket_next;
      if (all || (l->settled && now_ms - l->settled_ms >= srv->opt.live_grace_ms)) {
        unlink_locked(srv, l);
        if (--l->refs == 0) {
          l->bucket_next = dead;
          dead = l;
        }
      }
    }
  }
  return dead;
}

bool
eph_srv_live_free_chain(live_t *dead)
{
  bool freed = dead != NULL;
  while (dead) {
    live_t *l = dead;
    dead = l->bucket_next;
    eph_srv_live_free(l);
  }
  return freed;
}

/* ------------------------------------------------------------------ admission, end, cancel */

int
eph_srv_live_enqueue(eph_server_t *srv, eph_run_t *run, const char *org, json_object **created,
                     eph_error_t *err)
{
  eph_run_observer_t obs;
  live_t *l = eph_srv_live_new(srv, run, eph_xstrdup(org), 1, &obs);
  if (eph_runstore_attach(srv->store, run, &obs, err) < 0) {
    eph_error("run %s: %s", l->id, err->message);
    /* Settles the reservation made above (or leaves it to the reconciler when the ledger
     * fails too): nothing is charged for a run that never started. */
    eph_run_abandon(run, "storage_error");
    eph_srv_live_free(l);
    return -1;
  }
  if (created) {
    *created = eph_run_to_json(run, true);
    eph_run_sync_events(run); /* its `reserved` event is stored before the 201 shows it */
  }
  pthread_mutex_lock(&srv->lock);
  eph_srv_live_insert_locked(srv, l);
  l->queued = true;
  if (srv->queue_tail)
    srv->queue_tail->queue_next = l;
  else
    srv->queue_head = l;
  srv->queue_tail = l;
  srv->queued++;
  srv->runs_created++;
  pthread_cond_broadcast(&srv->cond);
  pthread_mutex_unlock(&srv->lock);
  return 0;
}

void
eph_srv_live_finished(eph_server_t *srv, live_t *l)
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
  eph_srv_wake_locked(srv, l);
  pthread_cond_broadcast(&srv->cond);
  pthread_mutex_unlock(&srv->lock);
  eph_webhooks_run_ended(srv->webhooks, l->org, l->id, o);
}

void
eph_srv_leave_shared_queue(eph_server_t *srv, live_t *l)
{
  eph_error_t err = {0};
  if (srv->shared_queue && eph_store_queue_remove(srv->store, l->id, &err) < 0)
    eph_warn("run %s: leaving the shared queue: %s", l->id, err.message);
}

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
  eph_srv_live_finished(srv, l);
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
    eph_srv_leave_shared_queue(srv, l);
    eph_run_abandon(l->run, "cancelled");
    eph_srv_live_finished(srv, l);
  } else {
    eph_run_cancel(l->run);
  }
  return true;
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
