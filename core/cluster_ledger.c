/* The ledger a cluster's nodes share: see cluster_ledger.h. */
#include "config.h"

#include "cluster_ledger.h"

#include <errno.h>
#include <string.h>

#include "loader.h"
#include "log.h"
#include "util.h"

int
eph_cluster_ledger_check(const eph_ctx_t *ctx, eph_store_t *store, const char *record_as,
                         eph_error_t *err)
{
  if (!store || eph_store_kind(store) != EPH_STORE_POSTGRES)
    return 0;
  const eph_plugin_slot_t *ledger = eph_plugins_first(&ctx->plugins, EPH_KIND_LEDGER);
  if (!ledger)
    return 0;
  const eph_ledger_ops_t *ops = ledger->desc->ops;
  const char *name = ledger->desc->name;
  if (!EPH_OPS_HAS(ops, eph_ledger_ops_t, identity))
    return eph_error_set(err, EPH_E_CONFIG,
                         "the ledger %s cannot name its identity (a plugin built before ABI "
                         "1.2's ledger identity): a cluster node cannot check that it shares "
                         "the cluster's ledger; use ledger-postgres (docs/cluster.md)",
                         name);
  char mine[EPH_LEDGER_IDENTITY_BYTES] = "";
  eph_error_t e = {0};
  int r = EPH_WITH_PLUGIN(ledger, ops->identity(ledger->state, mine, sizeof mine, &e));
  if (r < 0) {
    *err = e;
    return eph_error_wrap(err, "the ledger %s's identity", name);
  }
  cleanup_json json_object *rec = NULL;
  if ((r = eph_store_cluster_ledger(store, record_as ? mine : NULL, name, record_as, &rec, err)) <
      0)
    return r;
  if (!rec)
    return 0;
  const char *id = json_object_get_string(json_object_object_get(rec, "identity"));
  if (strcmp(id, mine) == 0)
    return 0;
  return eph_error_set(
      err, EPH_E_CONFIG,
      "this node's ledger is not the cluster's: it is %s %s, but the cluster's ledger, "
      "recorded by node '%s', is %s %s; money kept in two ledgers would be split between "
      "them (an organisation could spend its balance once per ledger). Give every node the "
      "same ledger (unset `ledger` to use ledger-postgres in `database`; docs/cluster.md)",
      name, mine, json_object_get_string(json_object_object_get(rec, "node")),
      json_object_get_string(json_object_object_get(rec, "plugin")), id);
}
