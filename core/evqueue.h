/* A run's timeline on its way to the store: events queued and committed together, one
 * transaction per batch instead of one per event (two per shell call), the way the ledger
 * group-commits charges.
 *
 * The contract (docs/ARCHITECTURE.md, "Crash recovery"): an event is in the store at most
 * flush_ms after it was emitted (by the writer thread; by its run's next event at twice
 * that, should the writer be late), and at once when it ends the run (`ended`, `settled`),
 * before any write of the run's row (eph_evq_flush, called by the store observer ahead of
 * it) and when the queue is freed. So the row never says more than the stored timeline,
 * and a process killed with SIGKILL loses at most the events of its last flush_ms: the
 * reconciler completes that run's record after the last stored event (ended host_lost,
 * settled with the ledger's totals), as it always has. Within the process the run's own
 * memory has every event at once (the CLI prints it), and the daemon commits what is
 * queued before it shows a live run's events to a client (eph_run_sync_events: an SSE
 * batch, a GET, the 201), so only another process reading the store (`ephemeral runs
 * show`, a second daemon) sees a live run up to flush_ms late.
 *
 * The run's row goes the same way (eph_evq_set_row): a write of it is a commit's last step,
 * after the batch, so the row never says more than the stored timeline. A change of status
 * (the run starts, ends, settles) is written at once (eph_evq_flush_row); what changes while
 * it runs (the money of each model call) is deferred (eph_evq_defer_row): the row as it was
 * then, after the events it reflects were pushed, waits in the queue and the next commit
 * writes it after its batch, at most flush_ms later. Not the run's state at the commit: on
 * the writer thread that may be a model call charged whose event is not yet pushed, or an
 * end decided whose `ended` is not yet stored. A kill -9 loses at most that flush_ms of
 * progress in the row, which the reconciler rewrites from the ledger anyway.
 *
 * A store that writes events one by one (eph_store_groups_events false: PostgreSQL, whose
 * nodes are told of each stored event) and flush_ms 0 keep the old behaviour: each event
 * is written when it is pushed.
 *
 * A failed write (one batch: all or none of it) stops the run as a failed single write did
 * (eph_run_storage_failed: storage_error), whichever thread wrote it.
 *
 * Threads: push from any thread (events arrive in seq order under the run's emit_lock); one
 * process-wide writer thread, started with the first queued event, commits what waited
 * flush_ms. Locks: a queue's flush lock (one batch at a time, in seq order) is taken under
 * the run's emit_lock or none and takes the store's lock inside; its list lock is a leaf.
 */
#ifndef EPH_EVQUEUE_H
#define EPH_EVQUEUE_H

#include <stdbool.h>
#include <stdint.h>

#include <json-c/json.h>

#include "run.h"
#include "store.h"

typedef struct eph_evq eph_evq_t;

/* A queue for run's events into store (both borrowed: they outlive the queue). flush_ms:
 * the longest an event waits before its commit; 0 writes each event at once. */
eph_evq_t *eph_evq_new(eph_store_t *store, eph_run_t *run, int64_t flush_ms);

/* Queues one event (every argument copied; data serialised now, on the caller's thread;
 * text and data already redacted by the caller); commits the queue when the event ends
 * the run, when the queue is large, or when its oldest event has waited twice flush_ms
 * (the writer thread, which commits it at flush_ms, is late). */
void eph_evq_push(eph_evq_t *q, int64_t seq, int64_t t_ms, const char *source, const char *kind,
                  const char *text, json_object *data);

/* Commits what is queued, now (and the row if it is due). 0, or the negative error already
 * reported to the run. */
int eph_evq_flush(eph_evq_t *q);

/* Writes row (borrowed; what the caller of eph_evq_defer_row or eph_evq_flush_row gave) as
 * the run's row, and reports a failure to the run itself. Called by a commit, with the
 * queue's flush lock held, on the pushing thread or the writer thread: row must share no
 * object with the run (the writer thread frees it). */
typedef void (*eph_evq_row_fn)(void *opaque, json_object *row);

/* Sets the row's writer (before the first push). */
void eph_evq_set_row(eph_evq_t *q, eph_evq_row_fn fn, void *opaque);

/* Defers row (the run's row as of now, every event it reflects already pushed): the next
 * commit writes it after its batch, at most flush_ms from now, unless a newer row replaces
 * it first. True: row is the queue's. False (row untouched, still the caller's) when the
 * queue writes through (flush_ms 0, a store without batches) or has no row writer: the
 * caller writes it now (eph_evq_flush_row). */
bool eph_evq_defer_row(eph_evq_t *q, json_object *row);

/* Commits what is queued and then writes row (owned by the queue from the call; it replaces
 * a deferred one), now, on the calling thread. 0, or the negative error of the events'
 * commit (the row is not written after a failed batch). */
int eph_evq_flush_row(eph_evq_t *q, json_object *row);

/* Commits what is queued and frees the queue; q may be NULL. */
void eph_evq_free(eph_evq_t *q);

#endif
