/*
 * The ledger of a cluster (docs/cluster.md). Every node must keep its money in ONE ledger:
 * nodes with a ledger each would each hold part of an organisation's balance and could
 * together spend it several times. The store records the identity of the ledger the first
 * node used (eph_store_cluster_ledger); a node whose ledger answers another identity (its
 * own ledger-sqlite file, another database) is refused at start, and /v1/health and
 * `ephemeral doctor` report it.
 *
 * cluster_orphans.c: the reservations a node made just before it died, for runs whose row
 * it never wrote, are released by the surviving nodes.
 */
#ifndef EPH_CLUSTER_LEDGER_H
#define EPH_CLUSTER_LEDGER_H

#include <stdbool.h>
#include <stdint.h>

#include "context.h"
#include "store.h"

/* Compares this process's ledger (the first loaded ledger plugin) with the cluster's.
 * record_as: this node's name, to record the ledger as the cluster's when none is recorded
 * yet; NULL only compares. Returns 0 when they are the same, or when there is nothing to
 * compare (a SQLite store: one host; no ledger loaded: a command without money; nothing
 * recorded and record_as NULL). -EPH_E_CONFIG when they differ or the ledger cannot say
 * its identity (a plugin without eph_ledger_ops_t.identity), err naming both ledgers and
 * the node that recorded the cluster's. Another negative errno when the store or the ledger
 * failed. */
int eph_cluster_ledger_check(const eph_ctx_t *ctx, eph_store_t *store, const char *record_as,
                             eph_error_t *err);

/* A cluster node's sweep of orphan reservations (cluster_orphans.c), run by the daemon's
 * ticker: every lease_seconds / 3, the ledger's reservations still open lease_seconds +
 * EPH_ORPHAN_GRACE_S after they were made whose run has no row in the store are ended:
 * a row is inserted for the run (the fence: the admitting node's own insert then fails,
 * and of several nodes sweeping at once exactly one inserts it), the reservation settled
 * (released: nothing was billed) and the record completed failed/host_lost with the
 * ledger's totals, as a lost node's run (eph_runstore_settle_lost). A run whose row has
 * ended while its reservation is still open (its node's settle failed, and the node may be
 * gone with the lock file its reconciler retries from) is settled the same way, its record
 * completed from its stored `ended` event. */
#define EPH_ORPHAN_GRACE_S 5

typedef struct eph_orphans {
  bool enabled;     /* a PostgreSQL store and a ledger that lists open reservations */
  int64_t lease_us; /* lease_seconds */
  int64_t every_ms, next_ms;
} eph_orphans_t;

void eph_orphans_init(eph_orphans_t *o, eph_ctx_t *ctx, eph_store_t *store);
/* Sweeps when it is time (now_ms: CLOCK_MONOTONIC ms). Failures are logged, retried at the
 * next sweep. Returns how many reservations this node released. */
int eph_orphans_tick(eph_orphans_t *o, eph_ctx_t *ctx, eph_store_t *store, int64_t now_ms);

#endif
