/* The process-wide context every CLI command and the daemon start from: paths, config,
 * state directory, the host services table and the loaded plugins. */
#ifndef EPH_CONTEXT_H
#define EPH_CONTEXT_H

#include <stdbool.h>

#include <ephemeral/plugin.h>

#include "conf.h"
#include "loader.h"
#include "paths.h"

struct eph_ctx;

typedef struct eph_ctx_options {
  const char *config_file; /* --config: ephemeral.conf to use (its conf.d beside it) */
  const char *plugin_dir;  /* --plugin-dir override */
  const char *state_dir;   /* --state-dir override (else config, env, default) */
  bool daemon;             /* daemon defaults (state in /var/lib/ephemeral) */
  bool load_plugins;       /* false for commands that need only the config */
  bool lazy_plugins;       /* with load_plugins: load none now; eph_ctx_backend() loads the
                            * one backend asked for (exec: no model, no ledger, no tool, and
                            * no recovery of dead runs, which needs the ledger) */
  bool lazy_backends;      /* with load_plugins: load all but the backends now (and recover
                            * dead runs); eph_ctx_backend() loads the one asked for (run) */
  /* Optional: called once the configuration is loaded, before the state directory is
   * created or any plugin loaded (they make directories and files in it); a negative
   * return fails eph_ctx_open with its err, nothing created. The daemon checks its
   * database there (eph_cluster_probe). */
  int (*before_state)(const struct eph_ctx *ctx, eph_error_t *err);
} eph_ctx_options_t;

typedef struct eph_ctx {
  eph_paths_t paths;
  eph_config_t config;
  eph_plugins_t plugins;
  eph_host_t host;
  char *state_dir;  /* absolute, created 0700; owned */
  char *plugin_dir; /* owned */
  bool daemon;
  bool lazy_plugins; /* see eph_ctx_options_t */
} eph_ctx_t;

/* Resolves paths, loads the config, creates the state directory, builds the host table and
 * (if asked) loads the plugins and runs each backend's start-up sweep. On failure ctx is
 * released. Plugin refusals are logged and counted in ctx->plugins.refused, not fatal. */
int eph_ctx_open(eph_ctx_t *ctx, const eph_ctx_options_t *opt, eph_error_t *err);

/* The options the CLI and the daemon share, as getopt_long returned them: -c/--config,
 * --plugin-dir ('P'), --state-dir ('S'), --database ('D': sets EPHEMERAL_DATABASE, read
 * where the store is opened, core/cluster.c), -v (more verbose) and -q (errors only, as
 * *verbose = -1). Returns true when c was one of them (applied to opt, *verbose). */
bool eph_ctx_common_option(int c, const char *arg, eph_ctx_options_t *opt, int *verbose);
void eph_ctx_close(eph_ctx_t *ctx);

/* Checks that ephemeral.conf's `backend` and `model_plugin` name loaded plugins of their
 * kind. Returns 0, or -ENOENT with err naming ephemeral.conf's FILE:LINE and the key (a
 * typo there must stop `config check` and the daemon, not surface at the first run); or
 * -EPH_E_CONFIG from eph_egress_check_config() (a sandbox policy left in a plugin block). */
int eph_ctx_check_selected(eph_ctx_t *ctx, eph_error_t *err);

/* Finds a backend by short or full name ("jail" or "backend-jail"); NULL = the configured
 * default backend (core key `backend`). Returns NULL with err set when it is not loaded.
 * In a lazy context it is loaded (and swept) on first use; a later load may move the slot
 * array, so a lazy context's caller asks for one backend only.
 * Defined in sandbox.c (no unit below context.c may call into context.c). */
const eph_plugin_slot_t *eph_ctx_backend(eph_ctx_t *ctx, const char *name, eph_error_t *err);

/* The model plugin that serves model (a request's full name, "openai/gpt-6-luna"): a
 * "replay:" name goes to model-replay, else the plugin whose serves() matches the most
 * specific prefix, else core key `model_plugin`. Returns NULL with err set: EINVAL naming
 * field 'model' when model_plugin declines the name and no plugin serves it, ENOENT when
 * the plugin is not loaded. Defined in models.c. */
const eph_plugin_slot_t *eph_ctx_model(eph_ctx_t *ctx, const char *model, eph_error_t *err);

/* The plugin core key `model_plugin` names, or NULL with err (ENOENT) "model_plugin: 'X' is
 * not a loaded model plugin (enable it in conf.d)". Routing by prefix can serve a run
 * without it, so the places that judge a configuration (config check, the daemon's start,
 * `run`, health and doctor) ask this first: a misspelt name is refused everywhere, not only
 * where the default is needed. Defined in models.c. */
const eph_plugin_slot_t *eph_ctx_model_plugin(eph_ctx_t *ctx, eph_error_t *err);

/* CLI subcommands: argv[0] is the subcommand name; return the process exit code. */
int eph_cmd_exec(eph_ctx_t *ctx, int argc, char **argv);

#endif
