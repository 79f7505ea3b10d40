#include <config.h>

#include "context.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>

#include "egress.h"
#include "host.h"
#include "log.h"
#include "runstore.h"
#include "util.h"

/* Ranges of the core's numbers. A value outside is an error naming file:line, never a
 * silent surprise: a negative price made runs free, a max_cost_micros of -1 refused every
 * request with a confusing message. The upper bounds keep the money arithmetic of a run
 * (budget * 1e6, tokens * price) inside int64. */
static const struct {
  const char *key;
  int64_t lo, hi;
} core_ranges[] = {
    {"max_timeout_seconds", 1, 2147483},
    {"max_cost_micros", 1, 1000000000000LL},
    {"max_steps", 1, 100000},
    {"max_output_tokens", 1, 10000000},
    {"compute_meter_ms", 10, 3600000},
    {"retention_days", 0, 36500},
    {"cli_credit_micros", 0, 1000000000000LL},
    {"max_inline_files_bytes", 0, 1073741824},
};

static int
check_range(const config_setting_t *block, const char *key, int64_t lo, int64_t hi,
            eph_error_t *err)
{
  int64_t v = 0;
  int r = eph_cfg_int(block, key, lo, &v, err);
  if (r < 0)
    return r;
  if (v >= lo && v <= hi)
    return 0;
  char where[512];
  return eph_error_set(err, EPH_E_CONFIG, "%s: key '%s': %lld is outside %lld..%lld",
                       eph_cfg_where(config_setting_get_member(block, key), where, sizeof where),
                       key, (long long)v, (long long)lo, (long long)hi);
}

static int
check_core_ranges(const config_setting_t *core, eph_error_t *err)
{
  int r;
  if (!core)
    return 0;
  for (size_t i = 0; i < sizeof core_ranges / sizeof core_ranges[0]; i++)
    if ((r = check_range(core, core_ranges[i].key, core_ranges[i].lo, core_ranges[i].hi,
                         err)) < 0)
      return r;
  const config_setting_t *pricing = config_setting_get_member(core, "pricing");
  if (!pricing)
    return 0;
  if ((r = check_range(pricing, "compute_micros_per_second", 0, 1000000000, err)) < 0)
    return r;
  const config_setting_t *models = config_setting_get_member(pricing, "models");
  for (int i = 0; models && i < config_setting_length(models); i++) {
    const config_setting_t *m = config_setting_get_elem(models, (unsigned)i);
    if ((r = check_range(m, "input_micros_per_mtok", 0, 100000000000LL, err)) < 0 ||
        (r = check_range(m, "output_micros_per_mtok", 0, 100000000000LL, err)) < 0)
      return r;
  }
  return 0;
}

static int
resolve_state_dir(eph_ctx_t *ctx, const eph_ctx_options_t *opt, eph_error_t *err)
{
  const char *from_config = NULL;
  int r = eph_cfg_string(ctx->config.core, "state_dir", NULL, &from_config, err);
  if (r < 0)
    return r;
  const char *env = getenv("EPHEMERAL_STATE_DIR");
  if (opt->state_dir)
    ctx->state_dir = eph_xstrdup(opt->state_dir);
  else if (env && *env)
    ctx->state_dir = eph_xstrdup(env);
  else if (from_config)
    ctx->state_dir = eph_xstrdup(from_config);
  else
    ctx->state_dir = eph_paths_default_state_dir(&ctx->paths, opt->daemon);
  r = eph_mkdir_p(ctx->state_dir, 0700, err);
  if (r < 0)
    return eph_error_wrap(err, "state directory");
  char *real = realpath(ctx->state_dir, NULL);
  if (real) {
    free(ctx->state_dir);
    ctx->state_dir = real;
  }
  return 0;
}

int
eph_ctx_open(eph_ctx_t *ctx, const eph_ctx_options_t *opt, eph_error_t *err)
{
  memset(ctx, 0, sizeof *ctx);
  ctx->daemon = opt->daemon;
  int r = eph_paths_init(&ctx->paths);
  if (r < 0)
    return eph_error_set(err, -r, "cannot find the running executable: %s", strerror(-r));

  const char *main_path = opt->config_file ? opt->config_file : getenv("EPHEMERAL_CONFIG");
  cleanup_free char *confd = NULL;
  if (main_path && *main_path) {
    /* An explicit ephemeral.conf brings the conf.d beside it. */
    cleanup_free char *dir = eph_xstrdup(main_path);
    char *slash = strrchr(dir, '/');
    confd = slash ? (slash[0] = '\0', eph_xasprintf("%s/conf.d", dir[0] ? dir : "/"))
                  : eph_xstrdup("conf.d");
    struct stat st;
    if (stat(main_path, &st) < 0) {
      r = eph_error_set(err, errno, "%s: %s", main_path, strerror(errno));
      goto fail;
    }
  } else {
    main_path = ctx->paths.config_file;
    confd = eph_xstrdup(ctx->paths.confd_dir);
  }
  r = eph_config_load(&ctx->config, main_path, confd, err);
  if (r < 0)
    goto fail;

  const char *level = NULL;
  r = eph_cfg_string(ctx->config.core, "log_level", NULL, &level, err);
  if (r < 0)
    goto fail;
  if (level && eph_log_level_parse(level) < 0) {
    char where[512];
    r = eph_error_set(err, EPH_E_CONFIG, "%s: log_level: expected error, warn, info or debug",
                      eph_cfg_where(config_setting_get_member(ctx->config.core, "log_level"),
                                    where, sizeof where));
    goto fail;
  }
  r = check_core_ranges(ctx->config.core, err);
  if (r < 0)
    goto fail;
  /* -v on the command line wins over the config's level. */
  if (level && eph_log_get_level() == EPH_LOG_WARN)
    eph_log_set_level((eph_log_level_t)eph_log_level_parse(level));

  const char *plugin_dir = NULL;
  r = eph_cfg_string(ctx->config.core, "plugin_dir", NULL, &plugin_dir, err);
  if (r < 0)
    goto fail;
  ctx->plugin_dir = eph_xstrdup(opt->plugin_dir     ? opt->plugin_dir
                                : getenv("EPHEMERAL_PLUGIN_DIR") ? getenv("EPHEMERAL_PLUGIN_DIR")
                                : plugin_dir        ? plugin_dir
                                                    : ctx->paths.plugin_dir);

  r = resolve_state_dir(ctx, opt, err);
  if (r < 0)
    goto fail;

  eph_host_init(&ctx->host, ctx);

  if (opt->load_plugins) {
    r = eph_plugins_load(&ctx->plugins, &ctx->config, ctx->plugin_dir, &ctx->host, err);
    if (r < 0)
      goto fail;
    for (size_t i = 0; i < ctx->plugins.n; i++) {
      const eph_plugin_slot_t *s = &ctx->plugins.slots[i];
      if (s->desc->kind != EPH_KIND_BACKEND)
        continue;
      const eph_backend_ops_t *ops = s->desc->ops;
      if (!EPH_OPS_HAS(ops, eph_backend_ops_t, sweep))
        continue;
      eph_error_t e = {0};
      int n = EPH_WITH_PLUGIN(s, ops->sweep(s->state, &e));
      if (n < 0)
        eph_warn("%s: start-up sweep failed: %s", s->desc->name, e.message);
      else if (n > 0)
        eph_info("%s: reaped %d sandbox(es) left behind by a dead process", s->desc->name, n);
    }
    /* Reservations and records left by a process that died (kill -9) or by a run whose
     * storage failed: see eph_runstore_recover. */
    eph_runstore_recover(ctx, NULL, false, NULL);
  }
  return 0;

fail:
  eph_ctx_close(ctx);
  return r;
}

void
eph_ctx_close(eph_ctx_t *ctx)
{
  eph_plugins_unload(&ctx->plugins);
  eph_config_free(&ctx->config);
  eph_paths_free(&ctx->paths);
  free(ctx->state_dir);
  free(ctx->plugin_dir);
  memset(ctx, 0, sizeof *ctx);
}

/* "FILE:LINE: " of ephemeral.conf's core key, or "" when it is not set there. */
static char *
core_key_where(const eph_ctx_t *ctx, const char *key)
{
  const config_setting_t *s = ctx->config.core ? config_setting_get_member(ctx->config.core, key) : NULL;
  if (!s || !config_setting_source_file(s))
    return eph_xstrdup("");
  return eph_xasprintf("%s:%d: ", config_setting_source_file(s), config_setting_source_line(s));
}

int
eph_ctx_check_selected(eph_ctx_t *ctx, eph_error_t *err)
{
  eph_error_t e = {0};
  if (!eph_ctx_backend(ctx, NULL, &e)) {
    cleanup_free char *where = core_key_where(ctx, "backend");
    return eph_error_set(err, ENOENT, "%sbackend: %s", where, e.message);
  }
  const char *model_plugin = NULL;
  if (eph_cfg_string(ctx->config.core, "model_plugin", "model-openai", &model_plugin, err) < 0)
    return -EINVAL;
  const eph_plugin_slot_t *m = eph_plugins_find(&ctx->plugins, model_plugin);
  if (!m || m->desc->kind != EPH_KIND_MODEL) {
    cleanup_free char *where = core_key_where(ctx, "model_plugin");
    return eph_error_set(err, ENOENT,
                         "%smodel_plugin: '%s' is not a loaded model plugin (enable it in conf.d)",
                         where, model_plugin);
  }
  /* A narrowed sandbox policy left in a plugin block by an upgrade: refuse, naming it. */
  return eph_egress_check_config(&ctx->config, err);
}
