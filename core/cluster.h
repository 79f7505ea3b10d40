/*
 * Cluster configuration: which store this process uses and who it is among the nodes that
 * share one (docs/cluster.md).
 *
 * The store target, first found wins: EPHEMERAL_DATABASE (which --database sets), the
 * `database` key of ephemeral.conf, else the local SQLite file <state_dir>/ephemeral.sqlite.
 * An empty value counts as unset.
 */
#ifndef EPH_CLUSTER_H
#define EPH_CLUSTER_H

#include <stdbool.h>
#include <stdint.h>

#include "context.h"
#include "store.h"

typedef struct eph_cluster_config {
  char *database;        /* the PostgreSQL target, or NULL for the local SQLite store; owned */
  char *node_name;       /* `node_name`, default the hostname; owned */
  int64_t lease_seconds; /* `lease_seconds`, default 15, 2..3600 */
} eph_cluster_config_t;

/* Reads the cluster keys. -EPH_E_CONFIG naming the key for a bad value (a database that
 * is not a PostgreSQL target, a node name outside [A-Za-z0-9_.-]{1,64}, a lease outside
 * 2..3600). Release with eph_cluster_config_free. */
int eph_cluster_config(const eph_ctx_t *ctx, eph_cluster_config_t *out, eph_error_t *err);
void eph_cluster_config_free(eph_cluster_config_t *c);

/* Opens the configured PostgreSQL database (connects, migrates its schema) and closes it
 * again: 0 when it opened or none is configured (the local SQLite store), else the error
 * eph_store_open_ctx would give, naming the setting. The daemon calls it before it creates
 * anything (eph_ctx_options_t.before_state): a daemon that cannot reach its database
 * leaves no state directory, plugin directories or files behind. Nothing local is opened. */
int eph_cluster_probe(const eph_ctx_t *ctx, eph_error_t *err);

/* Opens the store this process is configured for (see the top comment). On PostgreSQL the
 * node-local tables (webhooks, admin audit) stay in <state_dir>/ephemeral.sqlite. as_node:
 * the daemon, whose runs carry node_name and a lease it renews (the CLI's do not: nothing
 * would renew them). opt may be NULL; its local_path, node_name and lease_seconds are set
 * here. */
int eph_store_open_ctx(const eph_ctx_t *ctx, const eph_store_options_t *opt, bool as_node,
                       eph_store_t **out, eph_error_t *err);

#endif
