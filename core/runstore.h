/* Persistence of runs in the store: the observer that writes a run's events and state to
 * <state_dir>/ephemeral.sqlite as they happen, honouring zero data retention (content
 * events are stored redacted; the store itself drops payloads and outputs). */
#ifndef EPH_RUNSTORE_H
#define EPH_RUNSTORE_H

#include "run.h"
#include "store.h"

/* Inserts the run's row (status queued) and installs the persistence observer, chained
 * in front of `next` (may be NULL): next sees every event after the store wrote it.
 * On failure nothing is inserted. The store must outlive the run. */
int eph_runstore_attach(eph_store_t *store, eph_run_t *run, const eph_run_observer_t *next,
                        eph_error_t *err);

/* The same for a run whose row and first seq_stored events are already stored (a run
 * claimed from the shared queue): no insert, only the later events are appended. */
int eph_runstore_adopt(eph_store_t *store, eph_run_t *run, const eph_run_observer_t *next,
                       int64_t seq_stored, eph_error_t *err);

/* Frees what eph_runstore_attach allocated for the run (call after eph_run_free). */
void eph_runstore_detach(eph_run_t *run);

/* Recovery and reconciliation. Completes every run whose lock file in <state_dir>/runs can
 * be locked (its owner is gone: a process killed, or a run whose ledger or store write
 * failed and which left a note of its end there): settles its reservation in the ledger
 * (idempotent), writes the missing `ended` event (the note's status and reason, else
 * failed/host_lost) and `settled` event with the ledger's totals, and puts those totals
 * into the run's row, so the record and the ledger agree to the micro. A lock file is
 * removed only once all of that is stored; otherwise it stays for the next pass.
 * store: the caller's open store, or NULL to open <state_dir>/ephemeral.sqlite for the
 * pass. quiet: a failure is logged at debug level only (the periodic pass: a full disk
 * would log every second; /v1/health says it instead). Called at every start (context.c)
 * and periodically by the daemon. Returns the
 * number of runs completed; *pending (optional) receives how many are left. */
int eph_runstore_recover(eph_ctx_t *ctx, eph_store_t *store, bool quiet, int *pending);

/* A cluster run whose node was lost (its lease expired and this node took it over with
 * eph_store_leases_take_expired): settles its reservation in the ledger (compute charged
 * up to the last metered moment stays billed, the rest is released; idempotent) and
 * completes its record as recovery does, ended failed/host_lost with the ledger's totals.
 * *totals (optional) receives them. 0 or negative (the lease then expires again and a node
 * retries). */
int eph_runstore_settle_lost(eph_ctx_t *ctx, eph_store_t *store, const char *run_id,
                             eph_ledger_totals_t *totals, eph_error_t *err);

/* The same for a run that ends otherwise without running here (a cancel of a run taken out
 * of the shared queue that this node cannot build): ended `status` with `reason` when its
 * record has no `ended` event yet. */
int eph_runstore_settle_as(eph_ctx_t *ctx, eph_store_t *store, const char *run_id,
                           const char *status, const char *reason, eph_ledger_totals_t *totals,
                           eph_error_t *err);
/* An orphan reservation of a cluster (cluster_ledger.h): the ledger holds run_id's
 * reservation for org, made at reserved_unix_us by node reserved_by ("" when the ledger does
 * not say), but the store has no row for it. Inserts the row first (the fence: -EEXIST
 * means the run is not an orphan, or another node is ending it, and nothing is done), then
 * settles the reservation and completes the record failed/host_lost with the ledger's
 * totals, as eph_runstore_settle_lost. A node dying half-way leaves a row whose lease
 * expires: the lease takeover completes it. Returns 1 when this call ended it, 0 when
 * there was nothing to do, negative on error; *totals (optional) receives the ledger's. */
int eph_runstore_settle_orphan(eph_ctx_t *ctx, eph_store_t *store, const char *run_id,
                               const char *org, int64_t reserved_unix_us, const char *reserved_by,
                               eph_ledger_totals_t *totals, eph_error_t *err);

#endif
