/* A sandbox: a backend plugin's machine plus the guest client. See sandbox.h. */
#include <config.h>

#include "sandbox.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "context.h"
#include "guest_client.h"
#include "log.h"
#include "util.h"

/* How long the hello may take when the spec carries no deadline, and how long the guest
 * gets to shut down before the backend kills it anyway. */
#define HELLO_DEFAULT_MS 60000
#define SHUTDOWN_MS 5000

struct eph_sbx {
  const eph_plugin_slot_t *backend;
  const eph_backend_ops_t *ops;
  eph_sandbox_t *box;
  eph_guest_t *guest;
  int64_t created_ms;
  /* With network: HTTP_PROXY.. for every command, so tools that honour the variables
   * (curl, pip, git, python requests) use the one way out. NULL-terminated, owned. */
  char *proxy_env[6];
};

/* The conventional proxy variables, both cases (curl reads only lower-case http_proxy);
 * NO_PROXY empty: nothing bypasses the proxy (nothing else is reachable anyway). */
static void
set_proxy_env(eph_sbx_t *s, const eph_sandbox_spec_t *spec)
{
  if (!spec->network || !spec->proxy_url)
    return;
  static const char *const names[] = {"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"};
  for (size_t i = 0; i < 4; i++)
    s->proxy_env[i] = eph_xasprintf("%s=%s", names[i], spec->proxy_url);
  s->proxy_env[4] = eph_xstrdup("NO_PROXY=");
}

static void
free_proxy_env(eph_sbx_t *s)
{
  for (size_t i = 0; s->proxy_env[i]; i++)
    free(s->proxy_env[i]);
}

static const eph_backend_ops_t *
backend_ops(const eph_plugin_slot_t *backend, eph_error_t *err)
{
  if (!backend || !backend->desc || backend->desc->kind != EPH_KIND_BACKEND) {
    eph_error_set(err, EINVAL, "sandbox: %s is not a backend plugin",
                  backend && backend->desc ? backend->desc->name : "(none)");
    return NULL;
  }
  const eph_backend_ops_t *ops = backend->desc->ops;
  if (!EPH_OPS_HAS(ops, eph_backend_ops_t, create) ||
      !EPH_OPS_HAS(ops, eph_backend_ops_t, destroy)) {
    eph_error_set(err, EINVAL, "sandbox: backend %s lacks create or destroy", backend->desc->name);
    return NULL;
  }
  return ops;
}

static int
backend_destroy(eph_sbx_t *s, eph_sandbox_report_t *report, eph_error_t *err)
{
  eph_sandbox_report_t local = {.struct_size = sizeof local};
  eph_sandbox_report_t *rep = report ? report : &local;
  memset(rep, 0, sizeof *rep);
  rep->struct_size = sizeof *rep;
  int r = EPH_WITH_PLUGIN(s->backend, s->ops->destroy(s->backend->state, s->box, rep, err));
  s->box = NULL;
  if (r < 0)
    return eph_error_wrap(err, "%s: destroying the %s", s->backend->desc->name,
                          s->ops->noun ? s->ops->noun : "sandbox");
  if (rep->processes_left || rep->files_left)
    return eph_error_set(err, EBUSY, "%s: %d process(es) and %d file(s) left after destroy",
                         s->backend->desc->name, rep->processes_left, rep->files_left);
  return 0;
}

int
eph_sbx_create(const eph_plugin_slot_t *backend, const eph_sandbox_spec_t *spec, eph_sbx_t **out,
               eph_error_t *err)
{
  return eph_sbx_create_booting(backend, spec, NULL, NULL, out, err);
}

int
eph_sbx_create_booting(const eph_plugin_slot_t *backend, const eph_sandbox_spec_t *spec,
                       void (*booting)(void *opaque), void *opaque, eph_sbx_t **out,
                       eph_error_t *err)
{
  const eph_backend_ops_t *ops = backend_ops(backend, err);
  if (!ops)
    return -err->code;
  eph_sbx_t *s = eph_xcalloc(1, sizeof *s);
  s->backend = backend;
  s->ops = ops;
  s->created_ms = eph_now_ms();
  set_proxy_env(s, spec);
  int fd = -1;
  int r = EPH_WITH_PLUGIN(backend, ops->create(backend->state, spec, &s->box, &fd, err));
  if (r < 0) {
    eph_error_wrap(err, "%s: creating a %s", backend->desc->name,
                   ops->noun ? ops->noun : "sandbox");
    free_proxy_env(s);
    free(s);
    return r;
  }
  if (fd < 0) {
    r = eph_error_set(err, EPH_E_PROTOCOL, "%s: create returned no guest stream",
                      backend->desc->name);
    goto fail;
  }
  if (booting)
    booting(opaque);
  int64_t deadline = spec->deadline_ms > 0 ? spec->deadline_ms : s->created_ms + HELLO_DEFAULT_MS;
  r = eph_guest_open(fd, deadline, &s->guest, err); /* owns fd from here */
  if (r < 0)
    goto fail;
  /* The release is what uname() answers inside: a microVM's own kernel, but the host's
   * for the jail (it shares the host kernel), so the line names neither. */
  eph_info("%s: %s ready in %" PRId64 " ms (kernel %s as seen inside, scratch %s)",
           backend->desc->name, ops->noun ? ops->noun : "sandbox", eph_now_ms() - s->created_ms,
           eph_guest_kernel(s->guest), eph_guest_scratch(s->guest));
  *out = s;
  return 0;
fail:;
  eph_error_t derr = {0};
  if (s->box && backend_destroy(s, NULL, &derr) < 0)
    eph_error("%s", derr.message);
  free_proxy_env(s);
  free(s);
  return r;
}

const char *
eph_sbx_scratch(const eph_sbx_t *s)
{
  return eph_guest_scratch(s->guest);
}

const char *
eph_sbx_guest_kernel(const eph_sbx_t *s)
{
  return eph_guest_kernel(s->guest);
}

static bool
backend_stats(eph_sbx_t *s, eph_sandbox_report_t *rep)
{
  if (!EPH_OPS_HAS(s->ops, eph_backend_ops_t, stats))
    return false;
  eph_error_t err = {0};
  memset(rep, 0, sizeof *rep);
  rep->struct_size = sizeof *rep;
  if (EPH_WITH_PLUGIN(s->backend, s->ops->stats(s->backend->state, s->box, rep, &err)) < 0) {
    eph_warn("%s: stats: %s", s->backend->desc->name, err.message);
    return false;
  }
  return true;
}

int
eph_sbx_exec(eph_sbx_t *s, const eph_exec_request_t *req, eph_exec_result_t *result,
             eph_error_t *err)
{
  eph_sandbox_report_t before, after;
  bool have_before = backend_stats(s, &before);
  eph_exec_request_t with_proxy;
  cleanup_free const char **env = NULL;
  if (s->proxy_env[0]) {
    /* A key the request sets itself is left to the request (no duplicate keys). */
    size_t n = 0;
    while (req->env && req->env[n])
      n++;
    env = eph_xcalloc(n + 6, sizeof *env);
    size_t k = 0;
    for (size_t p = 0; s->proxy_env[p]; p++) {
      size_t klen = (size_t)(strchr(s->proxy_env[p], '=') - s->proxy_env[p]) + 1;
      bool overridden = false;
      for (size_t i = 0; i < n; i++)
        overridden |= strncmp(req->env[i], s->proxy_env[p], klen) == 0;
      if (!overridden)
        env[k++] = s->proxy_env[p];
    }
    for (size_t i = 0; i < n; i++)
      env[k + i] = req->env[i];
    with_proxy = *req;
    with_proxy.env = env;
    req = &with_proxy;
  }
  int r = eph_guest_exec(s->guest, req, result, err);
  if (r < 0)
    return r;
  /* The guest sees a SIGKILL or a failed command; only the backend's counters say whether
   * the memory limit or the process limit caused it. */
  bool failed = result->signal != 0 || result->exit_code != 0;
  if (result->reason == EPH_END_EXITED && failed && have_before && backend_stats(s, &after)) {
    if (after.oom_kills > before.oom_kills)
      result->reason = EPH_END_OOM;
    else if (after.pids_refused > before.pids_refused)
      result->reason = EPH_END_PIDS_EXHAUSTED;
  }
  return 0;
}

int
eph_sbx_write(eph_sbx_t *s, const char *path, const void *data, size_t bytes, eph_error_t *err)
{
  return eph_guest_write(s->guest, path, data, bytes, err);
}

int
eph_sbx_read(eph_sbx_t *s, const char *path, size_t max_bytes, void **data, size_t *bytes,
             int *truncated, eph_error_t *err)
{
  return eph_guest_read(s->guest, path, max_bytes, data, bytes, truncated, err);
}

int
eph_sbx_list(eph_sbx_t *s, const char *path, eph_dirent_t **entries, size_t *count,
             eph_error_t *err)
{
  return eph_guest_list(s->guest, path, entries, count, err);
}

void
eph_sbx_cancel(eph_sbx_t *s)
{
  if (s && s->guest)
    eph_guest_kill(s->guest, true);
}

int
eph_sbx_destroy(eph_sbx_t *s, eph_sandbox_report_t *report, eph_error_t *err)
{
  if (!s)
    return 0;
  /* A backend whose destroy ends the guest anyway (the jail) is not made to wait for a
   * graceful shutdown first (plugin.h, destroy_ends_guest). */
  if (s->guest && !eph_guest_broken(s->guest) &&
      !EPH_BACKEND_DESTROY_ENDS_GUEST((const eph_backend_ops_t *)s->backend->desc->ops)) {
    eph_error_t serr = {0};
    if (eph_guest_shutdown(s->guest, eph_now_ms() + SHUTDOWN_MS, &serr) < 0)
      eph_warn("%s: guest shutdown: %s (the backend kills it)", s->backend->desc->name,
               serr.message);
  }
  eph_guest_close(s->guest);
  s->guest = NULL;
  int r = backend_destroy(s, report, err);
  if (report && report->lifetime_ms == 0)
    report->lifetime_ms = eph_now_ms() - s->created_ms;
  free_proxy_env(s);
  free(s);
  return r;
}

/* Declared in context.h; defined here, beside the sandboxes it chooses the backend for, so
 * that the run (which calls it) does not depend on context.c, which depends on the run
 * through the host services. */
const eph_plugin_slot_t *
eph_ctx_backend(eph_ctx_t *ctx, const char *name, eph_error_t *err)
{
  if (!name)
    name = eph_config_values(&ctx->config)->backend;
  cleanup_free char *full =
      strncmp(name, "backend-", 8) == 0 ? eph_xstrdup(name) : eph_xasprintf("backend-%s", name);
  if (ctx->lazy_plugins && !eph_plugins_find(&ctx->plugins, full)) {
    eph_error_t e = {0};
    int r =
        eph_plugins_load_one(&ctx->plugins, &ctx->config, ctx->plugin_dir, &ctx->host, full, &e);
    if (r < 0 && r != -ENOENT) {
      eph_error_set(err, -r, "backend '%s': %s", name, e.message);
      return NULL;
    }
  }
  const eph_plugin_slot_t *s = eph_plugins_find(&ctx->plugins, full);
  if (!s || s->desc->kind != EPH_KIND_BACKEND) {
    /* A typo names no plugin at all: say which enabled backend was meant (from conf.d's
     * blocks: a lazy command has loaded only the one it was asked for). */
    const char *names[32];
    size_t n = 0;
    for (size_t i = 0; i < ctx->config.n_blocks && n < 32; i++)
      if (ctx->config.blocks[i].enabled && strncmp(ctx->config.blocks[i].name, "backend-", 8) == 0)
        names[n++] = ctx->config.blocks[i].name;
    const char *near = eph_closest(full, names, n);
    if (near) {
      eph_error_set(err, ENOENT, "backend '%s' is not loaded: did you mean '%s'?", name, near);
      return NULL;
    }
    /* The file its block names, or the one a block would (PLUGIN_DIR/backend-NAME.so). */
    const eph_config_block_t *block = NULL;
    for (size_t i = 0; i < ctx->config.n_blocks && !block; i++)
      if (strcmp(ctx->config.blocks[i].name, full) == 0)
        block = &ctx->config.blocks[i];
    const char *file = block ? block->file : NULL;
    cleanup_free char *path = file && file[0] == '/' ? eph_xstrdup(file)
                              : file                 ? eph_xasprintf("%s/%s", ctx->plugin_dir, file)
                                     : eph_xasprintf("%s/%s.so", ctx->plugin_dir, full);
    if (access(path, F_OK) < 0) {
      /* Nothing to enable: say so, and which backends there are. */
      char known[256] = "";
      for (size_t i = 0, used = 0; i < n && used < sizeof known; i++)
        used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "",
                                 names[i] + 8);
      if (n)
        eph_error_set(err, ENOENT,
                      "backend '%s': there is no such backend (no plugin %s); the backends "
                      "enabled in conf.d: %s",
                      name, path, known);
      else
        eph_error_set(err, ENOENT,
                      "backend '%s': there is no such backend (no plugin %s); no backend is "
                      "enabled in conf.d",
                      name, path);
    } else if (block && block->enabled) {
      eph_error_set(err, ENOENT,
                    "backend '%s' is enabled (%s) but did not load: see the error above", name,
                    block->where);
    } else {
      eph_error_set(err, ENOENT, "backend '%s' is not loaded (enable %s in conf.d)", name, full);
    }
    return NULL;
  }
  return s;
}
