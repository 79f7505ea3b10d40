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

/* Frees what eph_runstore_attach allocated for the run (call after eph_run_free). */
void eph_runstore_detach(eph_run_t *run);

#endif
