/* Health of what a run needs, one component at a time: the store (run history, keys), the
 * ledger (money), the backend (sandboxes) and the model plugin. The daemon's /v1/health
 * and `ephemeral doctor` report the same checks. */
#ifndef EPH_HEALTH_H
#define EPH_HEALTH_H

#include <stdbool.h>

#include <json-c/json.h>

#include "context.h"
#include "store.h"

/* Checks each component now and returns {"store": {"status": "ok"|"degraded", "reason":
 * "..."}, "ledger": ..., "backend": ..., "model": ...} (a new reference owned by the
 * caller). The store and the ledger are probed with a real one-row write transaction: a
 * full disk or a file that went read-only is caught even when nothing else writes.
 * store: the open store, or NULL when it could not be opened (store_error then says why).
 * *healthy: every component ok. *storage_ok (optional): store and ledger ok, the two a new
 * run needs to be recorded and billed. May block up to a busy timeout (another process
 * holding a write lock): not for an HTTP thread. */
json_object *eph_health_check(eph_ctx_t *ctx, eph_store_t *store, const char *store_error,
                              bool *healthy, bool *storage_ok);

/* The four component names in report order. */
extern const char *const eph_health_components[4];

#endif
