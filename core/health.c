#include <config.h>

#include "health.h"

#include <string.h>

#include "cluster_ledger.h"
#include "loader.h"
#include "log.h"
#include "util.h"

const char *const eph_health_components[4] = {"store", "ledger", "backend", "model"};

static json_object *
component(const char *reason)
{
  json_object *o = json_object_new_object();
  json_object_object_add(o, "status", json_object_new_string(reason ? "degraded" : "ok"));
  if (reason)
    json_object_object_add(o, "reason", json_object_new_string(reason));
  return o;
}

json_object *
eph_health_check(eph_ctx_t *ctx, eph_store_t *store, const char *store_error, bool *healthy,
                 bool *storage_ok)
{
  json_object *o = json_object_new_object();
  bool store_ok = false, ledger_ok = false, backend_ok = false, model_ok = false;
  eph_error_t err = {0};

  if (!store) {
    json_object_object_add(o, "store",
                           component(store_error ? store_error : "the store is not open"));
  } else if (eph_store_probe(store, &err) < 0) {
    json_object_object_add(o, "store", component(err.message));
  } else if (eph_store_fault(store, err.message, sizeof err.message)) {
    /* The probe's page is sound, but a read found a damaged one (an API key's): every
     * request it serves is wrong until the file is restored. */
    json_object_object_add(o, "store", component(err.message));
  } else {
    store_ok = true;
    json_object_object_add(o, "store", component(NULL));
  }

  const eph_plugin_slot_t *ledger = eph_plugins_first(&ctx->plugins, EPH_KIND_LEDGER);
  err = (eph_error_t){0};
  if (!ledger) {
    json_object_object_add(o, "ledger",
                           component("no ledger plugin is loaded (enabled ledger-sqlite was "
                                     "refused? its reason is logged at start)"));
  } else {
    const eph_ledger_ops_t *ops = ledger->desc->ops;
    int r = EPH_OPS_HAS(ops, eph_ledger_ops_t, probe)
                ? EPH_WITH_PLUGIN(ledger, ops->probe(ledger->state, &err))
                : 0;
    /* A cluster node's ledger must be the cluster's (money split between two ledgers can
     * be spent twice): checked against what the store recorded, never recording here. */
    if (r >= 0 && store_ok)
      r = eph_cluster_ledger_check(ctx, store, NULL, &err);
    ledger_ok = r >= 0;
    json_object_object_add(o, "ledger", component(r < 0 ? err.message : NULL));
  }

  err = (eph_error_t){0};
  backend_ok = eph_ctx_backend(ctx, NULL, &err) != NULL;
  json_object_object_add(o, "backend", component(backend_ok ? NULL : err.message));

  /* The plugin a run of the default model goes to, and whether it could make the call
   * now: a hosted provider without its key fails every run at the first model call. */
  err = (eph_error_t){0};
  const char *model = NULL;
  const eph_plugin_slot_t *m = NULL;
  if (!eph_ctx_model_plugin(ctx, &err))
    ; /* a misspelt model_plugin: degraded, even if the default model routes elsewhere */
  else if ((model = eph_config_values(&ctx->config)->default_model))
    if (!(m = eph_ctx_model(ctx, model, &err)))
      eph_error_wrap(&err, "default_model '%s'", model);
  int r = m ? 0 : -1;
  const eph_model_ops_t *mo = m ? m->desc->ops : NULL;
  if (m && EPH_OPS_HAS(mo, eph_model_ops_t, ready))
    r = EPH_WITH_PLUGIN(m, mo->ready(m->state, model, &err));
  if (r < 0 && !*err.message)
    eph_error_set(&err, EIO, "%s: not ready (no reason given)", m ? m->desc->name : "model");
  model_ok = r >= 0;
  json_object_object_add(o, "model", component(model_ok ? NULL : err.message));
  if (healthy)
    *healthy = store_ok && ledger_ok && backend_ok && model_ok;
  if (storage_ok)
    *storage_ok = store_ok && ledger_ok;
  return o;
}
