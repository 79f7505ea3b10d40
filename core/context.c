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

static int
resolve_state_dir(eph_ctx_t *ctx, const eph_ctx_options_t *opt, eph_error_t *err)
{
  const char *from_config = eph_config_values(&ctx->config)->state_dir;
  const char *env = getenv("EPHEMERAL_STATE_DIR");
  if (opt->state_dir)
    ctx->state_dir = eph_xstrdup(opt->state_dir);
  else if (env && *env)
    ctx->state_dir = eph_xstrdup(env);
  else if (from_config)
    ctx->state_dir = eph_xstrdup(from_config);
  else
    ctx->state_dir = eph_paths_default_state_dir(&ctx->paths, opt->daemon);
  int r = eph_mkdir_p(ctx->state_dir, 0700, err);
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

  /* Types, ranges and log_level were checked by eph_config_load (core/conf_core.h). */
  const char *level = eph_config_values(&ctx->config)->log_level;
  /* -v on the command line wins over the config's level. */
  if (eph_log_get_level() == EPH_LOG_WARN)
    eph_log_set_level((eph_log_level_t)eph_log_level_parse(level));

  const char *plugin_dir = eph_config_values(&ctx->config)->plugin_dir;
  ctx->plugin_dir = eph_xstrdup(opt->plugin_dir                  ? opt->plugin_dir
                                : getenv("EPHEMERAL_PLUGIN_DIR") ? getenv("EPHEMERAL_PLUGIN_DIR")
                                : plugin_dir                     ? plugin_dir
                                                                 : ctx->paths.plugin_dir);

  /* What can be refused without state is refused before any is made (a plugin directory
   * that is not there, the caller's own checks, the cluster's database): a failed start
   * leaves the state directory as it found it, or absent. */
  if (opt->load_plugins && !opt->lazy_plugins &&
      (r = eph_plugins_check_dir(&ctx->config, ctx->plugin_dir, err)) < 0)
    goto fail;
  if (opt->before_state && (r = opt->before_state(ctx, err)) < 0)
    goto fail;
  r = resolve_state_dir(ctx, opt, err);
  if (r < 0)
    goto fail;

  eph_host_init(&ctx->host, ctx);

  ctx->lazy_plugins = opt->load_plugins && (opt->lazy_plugins || opt->lazy_backends);
  if (opt->load_plugins && !opt->lazy_plugins) {
    r = eph_plugins_load_except(&ctx->plugins, &ctx->config, ctx->plugin_dir, &ctx->host,
                                opt->lazy_backends ? (int)EPH_KIND_BACKEND : -1, err);
    if (r < 0)
      goto fail;
    for (size_t i = 0; i < ctx->plugins.n; i++)
      eph_plugin_sweep(&ctx->plugins.slots[i]);
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
  const config_setting_t *s =
      ctx->config.core ? config_setting_get_member(ctx->config.core, key) : NULL;
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
  if (!eph_ctx_model_plugin(ctx, &e)) {
    cleanup_free char *where = core_key_where(ctx, "model_plugin");
    return eph_error_set(err, ENOENT, "%s%s", where, e.message);
  }
  /* A narrowed sandbox policy left in a plugin block by an upgrade: refuse, naming it. */
  return eph_egress_check_config(&ctx->config, err);
}

bool
eph_ctx_common_option(int c, const char *arg, eph_ctx_options_t *opt, int *verbose)
{
  switch (c) {
  case 'c':
    opt->config_file = arg;
    return true;
  case 'P':
    opt->plugin_dir = arg;
    return true;
  case 'S':
    opt->state_dir = arg;
    return true;
  case 'D':
    setenv("EPHEMERAL_DATABASE", arg, 1);
    return true;
  case 'v':
    (*verbose)++;
    return true;
  case 'q':
    *verbose = -1;
    return true;
  }
  return false;
}
