/* A cluster node's ears (docs/cluster.md): what other nodes announce through PostgreSQL
 * (NOTIFY, heard by the store's listener, eph_store_listen) wakes what would otherwise poll:
 *   - a run pushed into the shared queue: the idle workers claim it at once;
 *   - a cancel requested for a run live here: it is cancelled at once;
 *   - an event of a run executing elsewhere: the streams (SSE) and ?wait= requests
 *     following it read the store again at once.
 * While the listener is down (eph_srv_poll_ms), everything polls at its old pace, and each
 * (re)connection wakes everything once (EPH_NOTE_RESYNC): nothing announced while nobody
 * listened is lost. Sits above server_runs.c, whose functions it calls; started and
 * stopped by server.c. */
#include <config.h>

#include "server_int.h"

#include <string.h>

#include "conf.h"
#include "log.h"

/* Resumes the suspended connections following run_id on another node (all of them when
 * run_id is NULL). srv->lock held. */
static void
wake_remote_locked(eph_server_t *srv, const char *run_id)
{
  waiter_t *next;
  for (waiter_t *w = srv->waiters; w; w = next) {
    next = w->next;
    if (w->remote_id && (!run_id || strcmp(w->remote_id, run_id) == 0)) {
      eph_srv_wait_remove(srv, w);
      MHD_resume_connection(w->conn);
    }
  }
}

/* The listener's thread: keep it short (every notification of the cluster passes here). */
static void
on_note(void *opaque, eph_store_note_t note, const char *run_id)
{
  eph_server_t *srv = opaque;
  if (note == EPH_NOTE_CANCEL || note == EPH_NOTE_RESYNC) {
    /* A cancel of a run live here: delivered now (a running run is told to stop; a
     * zero-data-retention run waiting in this node's memory queue is ended). The payload
     * is only a hint: any session of the database may NOTIFY eph_cancels with any text
     * (NOTIFY needs no privilege), so what is cancelled is what run_cancels holds, which
     * only the cancel route writes. */
    json_object *ids = NULL;
    eph_error_t err = {0};
    if (eph_store_cancels_pending(srv->store, &ids, &err) < 0)
      eph_warn("reading cancel requests (announced for %s): %s",
               note == EPH_NOTE_CANCEL && run_id ? run_id : "all runs", err.message);
    if (ids) {
      eph_srv_cancel_ids(srv, ids);
      json_object_put(ids);
    }
  }
  pthread_mutex_lock(&srv->lock);
  if (note == EPH_NOTE_QUEUE || note == EPH_NOTE_RESYNC) {
    srv->queue_gen++;
    pthread_cond_broadcast(&srv->cond); /* the idle workers: one of them claims it */
  }
  if (note == EPH_NOTE_EVENTS || note == EPH_NOTE_RESYNC) {
    srv->events_gen++;
    wake_remote_locked(srv, note == EPH_NOTE_EVENTS ? run_id : NULL);
  }
  pthread_mutex_unlock(&srv->lock);
}

void
eph_srv_listen_start(eph_server_t *srv)
{
  srv->cluster_poll_ms = eph_config_values(&srv->ctx->config)->cluster_poll_ms;
  if (eph_store_kind(srv->store) != EPH_STORE_POSTGRES)
    return;
  eph_error_t err = {0};
  if (eph_store_listen(srv->store, on_note, srv, &srv->listener, &err) < 0)
    eph_warn("%s; this node polls the database instead", err.message);
}

void
eph_srv_listen_stop(eph_server_t *srv)
{
  eph_store_listener_stop(srv->listener);
  srv->listener = NULL;
}
