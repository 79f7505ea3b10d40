/* A cluster node's periodic duties (docs/cluster.md), run by the ticker of server_runs.c
 * when the store is PostgreSQL: cancel requests made on other nodes for runs live here,
 * the leases of its own runs, and taking over the runs of lost nodes. */
#include <config.h>

#include "server_int.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "cluster.h"
#include "log.h"
#include "runstore.h"
#include "util.h"

/* How often a cluster node looks for cancel requests of its runs made on other nodes while
 * its listener is down. */
#define CLUSTER_CANCEL_POLL_MS 250

/* A cluster node: the runs another node was asked to cancel (eph_store_cancel_request),
 * as a new array of ids for the ticker to cancel if they are live here (NULL: none or
 * unreadable, said in the log). The ticker (server_runs.c) does the cancelling, so this
 * unit stays below it. */
static json_object *
poll_cancels(eph_server_t *srv)
{
  json_object *ids = NULL;
  eph_error_t err = {0};
  if (eph_store_cancels_pending(srv->store, &ids, &err) < 0) {
    eph_warn("reading cancel requests: %s", err.message);
    return NULL;
  }
  return ids;
}

/* A cluster node's leases: renews its own runs' (every run in memory not yet settled),
 * then takes over the runs of nodes that stopped renewing theirs and ends them host_lost,
 * settled from the ledger (docs/cluster.md). */
static void
leases_tick(eph_server_t *srv)
{
  cleanup_json json_object *ids = json_object_new_array();
  pthread_mutex_lock(&srv->lock);
  for (unsigned b = 0; b < LIVE_BUCKETS; b++)
    for (live_t *l = srv->table[b]; l; l = l->bucket_next)
      if (!l->settled)
        json_object_array_add(ids, json_object_new_string(l->id));
  pthread_mutex_unlock(&srv->lock);
  eph_error_t err = {0};
  if (json_object_array_length(ids) > 0 && eph_store_leases_renew(srv->store, ids, &err) < 0)
    eph_warn("renewing this node's leases: %s", err.message);
  cleanup_json json_object *lost = NULL;
  err = (eph_error_t){0};
  if (eph_store_leases_take_expired(srv->store, &lost, &err) < 0) {
    eph_warn("looking for runs of lost nodes: %s", err.message);
    return;
  }
  for (size_t i = 0; i < json_object_array_length(lost); i++) {
    const char *id = json_object_get_string(json_object_array_get_idx(lost, i));
    eph_ledger_totals_t t = {0};
    err = (eph_error_t){0};
    if (eph_runstore_settle_lost(srv->ctx, srv->store, id, &t, &err) < 0)
      eph_warn("run %s (its node was lost): %s; retried when the lease expires", id, err.message);
    else
      eph_info("run %s: its node was lost; ended host_lost, %" PRId64 " billed, %" PRId64
               " released",
               id, t.billed_micros, t.released_micros);
  }
}

void
eph_srv_cluster_init(eph_server_t *srv, eph_srv_cluster_t *c)
{
  *c = (eph_srv_cluster_t){.enabled = eph_store_kind(srv->store) == EPH_STORE_POSTGRES,
                           .lease_every_ms = 5000};
  if (!c->enabled)
    return;
  eph_cluster_config_t cc;
  eph_error_t err = {0};
  if (eph_cluster_config(srv->ctx, &cc, &err) == 0) {
    /* Renewed three times per lease: one late renewal never loses a run. */
    c->lease_every_ms = cc.lease_seconds * 1000 / 3;
    eph_cluster_config_free(&cc);
  }
}

json_object *
eph_srv_cluster_tick(eph_server_t *srv, eph_srv_cluster_t *c, int64_t now_ms)
{
  if (!c->enabled)
    return NULL;
  json_object *cancels = NULL;
  /* A cancel request is announced (eph_cancels) and delivered by the listener at once;
   * this is the safety poll, or the pace from before while the listener is down (the
   * interval is chosen at each tick: a listener going down shortens it at once). */
  if (now_ms >= c->last_cancel_poll_ms + eph_srv_poll_ms(srv, CLUSTER_CANCEL_POLL_MS)) {
    c->last_cancel_poll_ms = now_ms;
    cancels = poll_cancels(srv);
  }
  if (now_ms >= c->next_lease_ms) {
    c->next_lease_ms = now_ms + c->lease_every_ms;
    leases_tick(srv);
  }
  return cancels;
}

/* A run taken from the shared queue (c: eph_store_queue_claim's object) rebuilt on this
 * node with the admitting node's reservation (never reserving again); *org_out (heap) its
 * organisation. NULL with err set when this node cannot build it (its limits or plugins
 * differ from the admitting node's). */
static eph_run_t *
rebuild(eph_server_t *srv, json_object *c, char **org_out, eph_error_t *err)
{
  *org_out = NULL;
  const char *id = json_object_get_string(json_object_object_get(c, "id"));
  const char *org = json_object_get_string(json_object_object_get(c, "org"));
  const char *text =
      json_object_to_json_string_ext(json_object_object_get(c, "request"), JSON_C_TO_STRING_PLAIN);
  eph_request_t rq;
  const char *field = NULL;
  eph_run_t *run = NULL;
  int r = eph_request_parse(text, strlen(text), &srv->limits, &rq, &field, err);
  if (r == 0 && !srv->replay_models && strncmp(rq.model, "replay:", 7) == 0) {
    /* Admitted by a node that serves replay transcripts (a file opened by root): this
     * one does not (server_admit.c refuses them at admission here). */
    r = eph_error_set(err, EINVAL, "replay transcripts are not served by this daemon");
    eph_request_free(&rq);
  }
  if (r == 0) {
    eph_run_options_t ro = {
        .org = org,
        .run_id = id,
        .adopt_reserved_micros =
            json_object_get_int64(json_object_object_get(c, "reserved_micros")),
        .created_us = json_object_get_int64(json_object_object_get(c, "created_at_us")),
    };
    r = eph_run_new(srv->ctx, &rq, &ro, &run, err);
    eph_request_free(&rq);
  }
  if (r < 0)
    return NULL;
  *org_out = eph_xstrdup(org);
  return run;
}

eph_run_t *
eph_srv_cluster_claim(eph_server_t *srv, char **org_out)
{
  *org_out = NULL;
  cleanup_json json_object *c = NULL;
  eph_error_t err = {0};
  if (eph_store_queue_claim(srv->store, &c, &err) < 0) {
    eph_warn("claiming from the shared queue: %s", err.message);
    return NULL;
  }
  if (!c)
    return NULL;
  const char *id = json_object_get_string(json_object_object_get(c, "id"));
  if (json_object_get_boolean(json_object_object_get(c, "local_only")))
    return NULL; /* zero data retention: live in this node's memory queue already */
  eph_run_t *run = rebuild(srv, c, org_out, &err);
  if (!run) {
    /* Claimed (this node holds its lease) but not executable here: ended and settled now
     * rather than left to wait for a lease to expire. */
    eph_warn("run %s claimed from the shared queue cannot run on this node: %s; ending it", id,
             err.message);
    eph_ledger_totals_t t = {0};
    err = (eph_error_t){0};
    if (eph_runstore_settle_lost(srv->ctx, srv->store, id, &t, &err) < 0)
      eph_warn("run %s: %s", id, err.message);
    return NULL;
  }
  return run;
}

int
eph_srv_cluster_cancel_queued(eph_server_t *srv, const char *id, eph_error_t *err)
{
  cleanup_json json_object *c = NULL;
  if (eph_store_queue_take(srv->store, id, &c, err) < 0)
    return -1;
  if (!c)
    return 0;
  /* This node holds it now (its lease: if this node dies before the end is stored, the
   * takeover settles it). Ended as its claimer would have ended it: rebuilt with the
   * admitting node's reservation and abandoned (the `ended` cancelled and `settled`
   * events follow seq 1, the whole reservation released, nothing started). */
  char *org = NULL;
  eph_error_t e = {0};
  eph_run_t *run = rebuild(srv, c, &org, &e);
  free(org);
  if (run) {
    if (eph_runstore_adopt(srv->store, run, NULL, 1, &e) < 0)
      eph_warn("run %s: recording its cancel: %s", id, e.message);
    eph_run_abandon(run, "cancelled");
    eph_runstore_detach(run);
    eph_run_free(run);
    eph_info("run %s: cancelled while queued in the shared queue", id);
    return 1;
  }
  /* Not buildable here (configurations differ): settled from the ledger as a cancel. */
  eph_warn("run %s: cancelled in the shared queue but not buildable on this node (%s): settling "
           "it from the ledger",
           id, e.message);
  e = (eph_error_t){0};
  if (eph_runstore_settle_as(srv->ctx, srv->store, id, "cancelled", "cancelled", NULL, &e) < 0)
    eph_warn("run %s: %s; its lease expires and another node settles it", id, e.message);
  return 1;
}
