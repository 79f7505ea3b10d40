/* Cluster configuration: see cluster.h. */
#include "config.h"

#include "cluster.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster_ledger.h"
#include "conf.h"
#include "loader.h"
#include "support/org_name.h"
#include "log.h"
#include "util.h"

/* Where the database setting in force came from, for messages: the environment (which
 * --database sets) or ephemeral.conf's file:line. */
static const char *
database_where(const eph_ctx_t *ctx, char *buf, size_t size)
{
  const char *env = getenv("EPHEMERAL_DATABASE");
  if (env && *env)
    return "EPHEMERAL_DATABASE or --database";
  const config_setting_t *core = ctx->config.core;
  return eph_cfg_where(core ? config_setting_get_member(core, "database") : NULL, buf, size);
}

int
eph_cluster_config(const eph_ctx_t *ctx, eph_cluster_config_t *out, eph_error_t *err)
{
  *out = (eph_cluster_config_t){0};
  const config_setting_t *core = ctx->config.core;
  const char *node = NULL;
  int64_t lease = 15;
  int r;
  if ((r = eph_cfg_string(core, "node_name", NULL, &node, err)) < 0 ||
      (r = eph_cfg_int(core, "lease_seconds", 15, &lease, err)) < 0)
    return r;
  /* The environment wins, as EPHEMERAL_DATABASE does: several daemons of one host can share
   * a configuration file and still have their own names. */
  const char *env_node = getenv("EPHEMERAL_NODE_NAME");
  bool from_env = env_node && *env_node;
  if (from_env)
    node = env_node;
  char where[256];
  const char *chosen = eph_config_database(&ctx->config);
  if (chosen && !eph_store_target_is_pg(chosen))
    return eph_error_set(err, EPH_E_CONFIG,
                         "%s: database: expected a PostgreSQL URI (postgresql://...) or libpq "
                         "key=value string; unset it for the local SQLite store",
                         database_where(ctx, where, sizeof where));
  const config_setting_t *s = core ? config_setting_get_member(core, "lease_seconds") : NULL;
  if (lease < 2 || lease > 3600)
    return eph_error_set(err, EPH_E_CONFIG, "%s: lease_seconds = %" PRId64 ": expected 2..3600",
                         eph_cfg_where(s, where, sizeof where), lease);
  char host[256] = "";
  bool from_host = !node || !*node;
  if (from_host) {
    if (gethostname(host, sizeof host - 1) < 0 || !host[0])
      snprintf(host, sizeof host, "node");
    node = host;
  }
  /* The organisations' rule (a node's name is a word of the same paths, SQL, logs and
   * terminals), its message naming where the name came from and never echoing it. */
  eph_error_t why = {0};
  if (eph_name_check("node_name", node, &why) < 0) {
    s = core ? config_setting_get_member(core, "node_name") : NULL;
    return eph_error_set(err, EPH_E_CONFIG, "%s: %s%s",
                         from_env    ? "EPHEMERAL_NODE_NAME"
                         : from_host ? "the host's name (node_name unset)"
                                     : eph_cfg_where(s, where, sizeof where),
                         why.message, from_host ? "; set node_name" : "");
  }
  out->database = chosen ? eph_xstrdup(chosen) : NULL;
  out->node_name = eph_xstrdup(node);
  out->lease_seconds = lease;
  return 0;
}

void
eph_cluster_config_free(eph_cluster_config_t *c)
{
  free(c->database);
  free(c->node_name);
  *c = (eph_cluster_config_t){0};
}

/* eph_store_open on the target in force; a database that does not open is named by its
 * setting: the operator's next question is which one to fix. */
static int
open_target(const eph_ctx_t *ctx, const eph_cluster_config_t *cc, const char *local,
            const eph_store_options_t *o, eph_store_t **out, eph_error_t *err)
{
  int r = eph_store_open(cc->database ? cc->database : local, o, out, err);
  if (r < 0 && cc->database) {
    char where[256];
    eph_error_wrap(err, "%s: database", database_where(ctx, where, sizeof where));
  }
  return r;
}

int
eph_cluster_probe(const eph_ctx_t *ctx, eph_error_t *err)
{
  eph_cluster_config_t cc;
  int r = eph_cluster_config(ctx, &cc, err);
  if (r == 0 && cc.database) {
    eph_store_t *s = NULL;
    if ((r = open_target(ctx, &cc, NULL, NULL, &s, err)) == 0)
      eph_store_close(s);
  }
  eph_cluster_config_free(&cc);
  return r;
}

int
eph_store_open_ctx(const eph_ctx_t *ctx, const eph_store_options_t *opt, bool as_node,
                   eph_store_t **out, eph_error_t *err)
{
  eph_cluster_config_t cc;
  int r = eph_cluster_config(ctx, &cc, err);
  if (r < 0)
    return r;
  cleanup_free char *local = eph_xasprintf("%s/ephemeral.sqlite", ctx->state_dir);
  eph_store_options_t o = opt ? *opt : (eph_store_options_t){0};
  o.local_path = cc.database ? local : NULL;
  if (as_node) {
    o.node_name = cc.node_name;
    o.lease_seconds = (int)cc.lease_seconds;
    /* Runs, keys and queue are shared; money is where the ledger plugin keeps it. A
     * file-based ledger is shared only by processes of one machine: said at start, so an
     * operator does not credit one host's ledger believing it is the cluster's. */
    const eph_plugin_slot_t *ledger = eph_plugins_first(&ctx->plugins, EPH_KIND_LEDGER);
    if (cc.database && ledger && strcmp(ledger->desc->name, "ledger-sqlite") == 0)
      eph_warn("database is shared but the ledger is ledger-sqlite (a file on this host): "
               "money is shared only with processes on this machine using the same file; "
               "use ledger-postgres for several hosts (docs/cluster.md)");
  }
  r = open_target(ctx, &cc, local, &o, out, err);
  /* One ledger for the whole cluster: the first process records it, the others must match. */
  if (r == 0 && (r = eph_cluster_ledger_check(ctx, *out, cc.node_name, err)) < 0) {
    eph_store_close(*out);
    *out = NULL;
  }
  eph_cluster_config_free(&cc);
  return r;
}
