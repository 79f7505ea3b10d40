/* A cluster node's sweep of orphan reservations: see cluster_ledger.h. A node killed after
 * its ledger reserved a run's budget and before it stored the run's row leaves a
 * reservation nobody holds: no row, so no lease expires and the lease takeover never sees
 * it, and only that node's own restart on the same state directory would settle it. */
#include "config.h"

#include "cluster_ledger.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "cluster.h"
#include "loader.h"
#include "log.h"
#include "runstore.h"
#include "util.h"

/* At most this many reservations per sweep: the rest wait for the next one. */
#define ORPHAN_BATCH 100

void
eph_orphans_init(eph_orphans_t *o, eph_ctx_t *ctx, eph_store_t *store)
{
  *o = (eph_orphans_t){0};
  const eph_plugin_slot_t *ledger = eph_plugins_first(&ctx->plugins, EPH_KIND_LEDGER);
  if (!store || eph_store_kind(store) != EPH_STORE_POSTGRES || !ledger ||
      !EPH_OPS_HAS((const eph_ledger_ops_t *)ledger->desc->ops, eph_ledger_ops_t,
                   open_reservations))
    return;
  eph_cluster_config_t cc;
  eph_error_t err = {0};
  if (eph_cluster_config(ctx, &cc, &err) < 0)
    return;
  o->enabled = true;
  o->lease_us = cc.lease_seconds * 1000000;
  o->every_ms = cc.lease_seconds * 1000 / 3;
  eph_cluster_config_free(&cc);
}

static void
collect(void *opaque, const eph_ledger_open_t *r)
{
  json_object *o = json_object_new_object();
  json_object_object_add(o, "run_id", json_object_new_string(r->run_id));
  json_object_object_add(o, "org", json_object_new_string(r->org));
  json_object_object_add(o, "node", json_object_new_string(r->node ? r->node : ""));
  json_object_object_add(o, "reserved_unix_us", json_object_new_int64(r->reserved_unix_us));
  json_object_array_add(opaque, o);
}

int
eph_orphans_tick(eph_orphans_t *o, eph_ctx_t *ctx, eph_store_t *store, int64_t now_ms)
{
  if (!o->enabled || now_ms < o->next_ms)
    return 0;
  o->next_ms = now_ms + o->every_ms;
  const eph_plugin_slot_t *ledger = eph_plugins_first(&ctx->plugins, EPH_KIND_LEDGER);
  const eph_ledger_ops_t *ops = ledger->desc->ops;
  cleanup_json json_object *open = json_object_new_array();
  eph_error_t err = {0};
  /* Older than a lease and a grace: a live node stores the row within milliseconds of the
   * reservation; one silent that long has lost its runs to the lease takeover too. The age
   * is the ledger's to measure, in its own clock (ledger-postgres: the database server's,
   * as the leases are the store's): neither this node's clock nor the reserving node's
   * decides, so a node whose clock is ahead does not end another node's admission in
   * progress, and one whose clock is behind does not leave a dead node's budget held. */
  int64_t open_for_us = o->lease_us + EPH_ORPHAN_GRACE_S * 1000000LL;
  int n = EPH_WITH_PLUGIN(ledger, ops->open_reservations(ledger->state, open_for_us, ORPHAN_BATCH,
                                                         collect, open, &err));
  if (n < 0) {
    eph_warn("looking for orphan reservations: %s", err.message);
    return 0;
  }
  int released = 0;
  for (size_t i = 0; i < json_object_array_length(open); i++) {
    json_object *r = json_object_array_get_idx(open, i);
    const char *id = json_object_get_string(json_object_object_get(r, "run_id"));
    eph_ledger_totals_t t = {0};
    err = (eph_error_t){0};
    cleanup_json json_object *row = NULL;
    int s = eph_store_run_get(store, id, NULL, &row, &err);
    const char *status =
        s == 0 ? json_object_get_string(json_object_object_get(row, "status")) : NULL;
    if (s == -ENOENT) {
      err = (eph_error_t){0};
      s = eph_runstore_settle_orphan(
          ctx, store, id, json_object_get_string(json_object_object_get(r, "org")),
          json_object_get_int64(json_object_object_get(r, "reserved_unix_us")),
          json_object_get_string(json_object_object_get(r, "node")), &t, &err);
    } else if (s == 0 && status && strcmp(status, "queued") != 0 &&
               strcmp(status, "running") != 0) {
      /* Ended, yet its reservation is open: its node's settle failed (its reconciler
       * retries from a lock file only that node sees) and the node may be gone. The run
       * charges nothing after it ended, so settling it here is what that node would do;
       * the record is completed from its stored `ended` event, by this node: it takes the
       * row first, so the old node's own late retry is refused (-ESTALE) instead of
       * writing beside it. */
      s = eph_store_run_take_ended(store, id, &err);
      if (s >= 0) {
        err = (eph_error_t){0};
        s = eph_runstore_settle_lost(ctx, store, id, &t, &err);
      }
      if (s == 0) {
        eph_info("run %s: ended with its reservation open (its node's settle failed); "
                 "settled here, %" PRId64 " billed, %" PRId64 " released",
                 id, t.billed_micros, t.released_micros);
        released++;
      }
      s = s < 0 ? s : 0;
    } else {
      s = s < 0 ? s : 0; /* queued or running: the lease takeover's, if its node is lost */
    }
    if (s < 0) {
      eph_warn("run %s (an orphan reservation): %s; retried at the next sweep", id, err.message);
    } else if (s > 0) {
      released++;
      eph_info("run %s: reserved by a node lost before it recorded the run; ended host_lost, "
               "%" PRId64 " billed, %" PRId64 " released",
               id, t.billed_micros, t.released_micros);
    }
  }
  return released;
}
