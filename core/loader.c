#include <config.h>

#include "loader.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

const char *
eph_kind_name(eph_kind_t kind)
{
  switch (kind) {
  case EPH_KIND_TOOL:
    return "tool";
  case EPH_KIND_BACKEND:
    return "backend";
  case EPH_KIND_MODEL:
    return "model";
  case EPH_KIND_LEDGER:
    return "ledger";
  }
  return NULL;
}

static bool
valid_name(const char *name)
{
  if (!name || !*name || strlen(name) > 64)
    return false;
  for (const char *p = name; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '_'))
      return false;
  return true;
}

/* The ops table must at least carry its struct_size; each kind's table starts with it. */
static bool
ops_present(const eph_plugin_t *d)
{
  if (!d->ops)
    return false;
  const uint32_t *size = d->ops;
  return *size >= sizeof(uint32_t);
}

/* The operations the core calls without checking them first, per kind: a plugin missing one
 * is refused at load (naming it) instead of crashing the first run that needs it. Optional
 * operations (a tool's connection_defined, a backend's stats and sweep, a model's serves, a
 * ledger's probe) are checked where they are called. */
typedef struct required_op {
  eph_kind_t kind;
  const char *name;
  size_t offset;
} required_op_t;
#define REQUIRED(kind, type, field)                                                                \
  {                                                                                                \
    kind, #field, offsetof(type, field)                                                            \
  }
static const required_op_t required_ops[] = {
    REQUIRED(EPH_KIND_TOOL, eph_tool_ops_t, call),
    REQUIRED(EPH_KIND_BACKEND, eph_backend_ops_t, create),
    REQUIRED(EPH_KIND_BACKEND, eph_backend_ops_t, destroy),
    REQUIRED(EPH_KIND_MODEL, eph_model_ops_t, complete),
    REQUIRED(EPH_KIND_LEDGER, eph_ledger_ops_t, credit),
    REQUIRED(EPH_KIND_LEDGER, eph_ledger_ops_t, balance),
    REQUIRED(EPH_KIND_LEDGER, eph_ledger_ops_t, reserve),
    REQUIRED(EPH_KIND_LEDGER, eph_ledger_ops_t, charge),
    REQUIRED(EPH_KIND_LEDGER, eph_ledger_ops_t, settle),
    REQUIRED(EPH_KIND_LEDGER, eph_ledger_ops_t, totals),
    REQUIRED(EPH_KIND_LEDGER, eph_ledger_ops_t, settle_open),
};
#undef REQUIRED

/* The first required operation of d's kind its table lacks (too small to hold it, or NULL),
 * or NULL when none is missing. */
static const char *
missing_op(const eph_plugin_t *d)
{
  const uint32_t *size = d->ops;
  for (size_t i = 0; i < sizeof required_ops / sizeof required_ops[0]; i++) {
    const required_op_t *op = &required_ops[i];
    if (op->kind != d->kind)
      continue;
    void (*fn)(void) = NULL;
    if (*size >= op->offset + sizeof fn)
      memcpy(&fn, (const char *)d->ops + op->offset, sizeof fn);
    if (!fn)
      return op->name;
  }
  if (d->kind == EPH_KIND_TOOL) {
    const eph_tool_ops_t *t = d->ops;
    if (t->n_tools > 0 && !t->tools)
      return "tools";
  }
  return NULL;
}

static void
release_handle(void *handle)
{
  /* Leave plugins mapped under ASan so leak reports can still symbolise their frames. */
#ifndef EPH_KEEP_PLUGINS_MAPPED
  if (!getenv("EPH_NO_DLCLOSE"))
    dlclose(handle);
#else
  (void)handle;
#endif
}

/* dlopen() runs the file's constructors with the daemon's privileges before anything
 * else can be checked: whoever can replace the file, or rename in a directory on its
 * path, runs code as the daemon. Refuses (-EPERM) a plugin whose file or any directory up
 * to / (symbolic links resolved) is owned by someone else than root or us, or is
 * world-writable (a directory: unless sticky). A path that does not resolve is left to
 * dlopen's own error. */
static int
plugin_path_refusal(const char *path, eph_error_t *err)
{
  cleanup_free char *p = realpath(path, NULL);
  if (!p)
    return 0;
  for (bool file = true;; file = false) {
    struct stat st;
    if (stat(p, &st) < 0)
      return 0;
    const char *why = st.st_uid != 0 && st.st_uid != geteuid() ? "is owned by another user"
                      : (st.st_mode & S_IWOTH) && (file || !(st.st_mode & S_ISVTX))
                          ? "is writable by every user"
                          : NULL;
    if (why)
      return eph_error_set(err, EPERM,
                           "%s: not loaded: %s%s %s (uid %u, mode %04o): whoever can change "
                           "it would run code as this daemon",
                           path, file ? "the plugin file " : "directory ", p, why,
                           (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
    if (strcmp(p, "/") == 0)
      return 0;
    char *slash = strrchr(p, '/');
    slash[slash == p] = '\0'; /* "/usr" -> "/", "/usr/lib" -> "/usr" */
  }
}

int
eph_plugin_load_file(eph_plugins_t *ps, const char *path, const config_setting_t *config,
                     const eph_host_t *host, int *warnings, eph_error_t *err)
{
  int pr = plugin_path_refusal(path, err);
  if (pr < 0)
    return pr;
  dlerror();
  void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!handle)
    return eph_error_set(err, ENOENT, "%s: cannot load: %s", path, dlerror());

  int r = 0;
  eph_config_key_t *upgraded = NULL; /* a pre-1.2 plugin's key rows, today's layout */
  const eph_plugin_t *d = dlsym(handle, EPH_PLUGIN_SYMBOL);
  if (!d) {
    r = eph_error_set(err, ENOENT, "%s: no '%s' descriptor: not an ephemeral plugin", path,
                      EPH_PLUGIN_SYMBOL);
    goto fail;
  }
  if (d->abi_major != EPH_ABI_MAJOR) {
    r = eph_error_set(err, EPROTO,
                      "%s: plugin ABI %u.%u, but this ephemeral speaks ABI %u.x: rebuild the "
                      "plugin against the installed SDK",
                      path, d->abi_major, d->abi_minor, EPH_ABI_MAJOR);
    goto fail;
  }
  /* The descriptor's fields up to ops exist in every 1.x; a smaller one is corrupt. */
  if (d->struct_size < offsetof(eph_plugin_t, ops) + sizeof(d->ops)) {
    r = eph_error_set(err, EPROTO, "%s: descriptor too small (%u bytes)", path, d->struct_size);
    goto fail;
  }
  if (!valid_name(d->name)) {
    r = eph_error_set(err, EINVAL, "%s: invalid plugin name (want [a-z0-9_-]{1,64})", path);
    goto fail;
  }
  if (!eph_kind_name(d->kind)) {
    r = eph_error_set(err, EINVAL, "%s: plugin '%s' has unknown kind %d", path, d->name,
                      (int)d->kind);
    goto fail;
  }
  if (!d->init || !ops_present(d)) {
    r = eph_error_set(err, EINVAL, "%s: plugin '%s' has no init or no operations table", path,
                      d->name);
    goto fail;
  }
  const char *missing = missing_op(d);
  if (missing) {
    r = eph_error_set(err, EINVAL,
                      "%s: %s plugin '%s' lacks the required operation '%s' (its operations "
                      "table has no %s, or is too small to hold it)",
                      path, eph_kind_name(d->kind), d->name, missing, missing);
    goto fail;
  }
  const eph_plugin_slot_t *dup = eph_plugins_find(ps, d->name);
  if (dup) {
    r = eph_error_set(err, EEXIST, "%s: duplicate plugin name '%s' (already loaded from %s)", path,
                      d->name, dup->path);
    goto fail;
  }
  /* Key rows grew in ABI 1.2 (ranges, nested keys): an older plugin's have another stride. */
  upgraded = d->abi_minor < 2 ? eph_config_keys_upgrade_1_1(d->config_keys) : NULL;
  const eph_config_key_t *keys = upgraded ? upgraded : d->config_keys;
  r = eph_config_check_keys(config, keys, d->name, warnings, err);
  if (r < 0) {
    eph_error_wrap(err, "%s", path);
    goto fail;
  }

  void *state = NULL;
  const char *prev = eph_log_push_plugin(d->name);
  r = d->init(host, config, &state, err);
  eph_log_pop_plugin(prev);
  if (r < 0) {
    if (!err || !err->message[0])
      eph_error_set(err, -r, "failed");
    r = eph_error_wrap(err, "%s: init of plugin '%s' failed", path, d->name);
    goto fail;
  }

  if (ps->n == ps->cap) {
    ps->cap = ps->cap ? ps->cap * 2 : 4;
    ps->slots = eph_xrealloc(ps->slots, ps->cap * sizeof *ps->slots);
  }
  ps->slots[ps->n++] = (eph_plugin_slot_t){.desc = d,
                                           .handle = handle,
                                           .state = state,
                                           .path = eph_xstrdup(path),
                                           .config = config,
                                           .config_keys = keys,
                                           .keys_owned = upgraded};
  eph_debug("loaded %s %s %s from %s", eph_kind_name(d->kind), d->name, d->version, path);
  return 0;

fail:
  free(upgraded);
  release_handle(handle);
  return r < 0 ? r : -EIO;
}

/* 0 when plugin_dir is a directory, else the error naming it and block b (which needs it). */
static int
check_plugin_dir(const char *plugin_dir, const eph_config_block_t *b, eph_error_t *err)
{
  struct stat st;
  int e = !plugin_dir                 ? ENOENT
          : stat(plugin_dir, &st) < 0 ? errno
          : !S_ISDIR(st.st_mode)      ? ENOTDIR
                                      : 0;
  if (!e)
    return 0;
  return eph_error_set(err, e,
                       "plugin directory %s: %s (needed by '%s', enabled at %s); set "
                       "plugin_dir in ephemeral.conf, --plugin-dir or "
                       "EPHEMERAL_PLUGIN_DIR to where the plugins are installed",
                       plugin_dir ? plugin_dir : "(none)",
                       e == ENOTDIR ? "not a directory" : strerror(e), b->name, b->where);
}

/* Loads block b; on success warns when the plugin calls itself something else. */
/* The plugin of plugin_dir whose name is closest to name (a block "tool-shel" meant
 * tool-shell.so), or NULL; the caller frees it. */
static char *
closest_plugin(const char *plugin_dir, const char *name)
{
  DIR *d = opendir(plugin_dir);
  if (!d)
    return NULL;
  char *names[128];
  size_t n = 0;
  for (struct dirent *e; n < 128 && (e = readdir(d));) {
    size_t len = strlen(e->d_name);
    if (len > 3 && strcmp(e->d_name + len - 3, ".so") == 0)
      names[n++] = eph_xstrndup(e->d_name, len - 3);
  }
  closedir(d);
  const char *near = eph_closest(name, (const char *const *)names, n);
  char *out = near ? eph_xstrdup(near) : NULL;
  for (size_t i = 0; i < n; i++)
    free(names[i]);
  return out;
}

static int
load_block(eph_plugins_t *ps, eph_config_t *cfg, const eph_config_block_t *b,
           const char *plugin_dir, const eph_host_t *host, eph_error_t *err)
{
  cleanup_free char *path =
      b->file[0] == '/' ? eph_xstrdup(b->file) : eph_xasprintf("%s/%s", plugin_dir, b->file);
  /* A misspelt block name names a file that is not there: say which plugin was meant. */
  if (b->file[0] != '/' && access(path, F_OK) < 0 && errno == ENOENT) {
    cleanup_free char *near = closest_plugin(plugin_dir, b->name);
    if (near)
      return eph_error_set(err, ENOENT,
                           "%s: no plugin '%s' in %s: did you mean '%s'? (a block is named "
                           "after its plugin)",
                           path, b->name, plugin_dir, near);
  }
  int r = eph_plugin_load_file(ps, path, b->setting, host, &cfg->warnings, err);
  if (r < 0)
    return r;
  const eph_plugin_slot_t *s = &ps->slots[ps->n - 1];
  if (strcmp(s->desc->name, b->name) != 0)
    eph_warn("%s: block '%s' loaded a plugin that calls itself '%s'", b->where, b->name,
             s->desc->name);
  return 0;
}

/* Room for every enabled block: a later lazy load never moves the slots handed out. */
static void
reserve_slots(eph_plugins_t *ps, const eph_config_t *cfg)
{
  size_t want = 0;
  for (size_t i = 0; i < cfg->n_blocks; i++)
    want += cfg->blocks[i].enabled;
  if (want < ps->n)
    want = ps->n;
  if (want > ps->cap) {
    ps->slots = eph_xrealloc(ps->slots, want * sizeof *ps->slots);
    ps->cap = want;
  }
}

/* True when block b is deferred: a backend block (by its name) when defer is
 * EPH_KIND_BACKEND. */
static bool
deferred(const eph_config_block_t *b, int defer)
{
  return defer == (int)EPH_KIND_BACKEND && strncmp(b->name, "backend-", 8) == 0;
}

int
eph_plugins_load(eph_plugins_t *ps, eph_config_t *cfg, const char *plugin_dir,
                 const eph_host_t *host, eph_error_t *err)
{
  return eph_plugins_load_except(ps, cfg, plugin_dir, host, -1, err);
}

int
eph_plugins_check_dir(const eph_config_t *cfg, const char *plugin_dir, eph_error_t *err)
{
  /* A missing plugin directory is one error naming it, not one "cannot load" per plugin
   * followed by a daemon that serves without them. Only blocks naming a relative file
   * use it. */
  for (size_t i = 0; i < cfg->n_blocks; i++) {
    const eph_config_block_t *b = &cfg->blocks[i];
    if (!b->enabled || b->file[0] == '/')
      continue;
    return check_plugin_dir(plugin_dir, b, err);
  }
  return 0;
}

int
eph_plugins_load_except(eph_plugins_t *ps, eph_config_t *cfg, const char *plugin_dir,
                        const eph_host_t *host, int defer, eph_error_t *err)
{
  memset(ps, 0, sizeof *ps);
  reserve_slots(ps, cfg);
  int r = eph_plugins_check_dir(cfg, plugin_dir, err);
  if (r < 0)
    return r;
  for (size_t i = 0; i < cfg->n_blocks; i++) {
    const eph_config_block_t *b = &cfg->blocks[i];
    if (!b->enabled || deferred(b, defer))
      continue;
    eph_error_t e = {0};
    if (load_block(ps, cfg, b, plugin_dir, host, &e) < 0) {
      eph_error("%s (enabled at %s)", e.message, b->where);
      ps->refused++;
    }
  }
  return 0;
}

int
eph_plugins_load_logged(eph_plugins_t *ps, eph_config_t *cfg, const char *plugin_dir,
                        const eph_host_t *host, const char *name)
{
  eph_error_t e = {0};
  if (eph_plugins_load_one(ps, cfg, plugin_dir, host, name, &e) < 0) {
    eph_error("%s", e.message);
    return 0;
  }
  return 1;
}

int
eph_plugins_load_one(eph_plugins_t *ps, eph_config_t *cfg, const char *plugin_dir,
                     const eph_host_t *host, const char *name, eph_error_t *err)
{
  if (eph_plugins_find(ps, name))
    return 0;
  reserve_slots(ps, cfg);
  for (size_t i = 0; i < cfg->n_blocks; i++) {
    const eph_config_block_t *b = &cfg->blocks[i];
    if (!b->enabled || strcmp(b->name, name) != 0)
      continue;
    int r = b->file[0] == '/' ? 0 : check_plugin_dir(plugin_dir, b, err);
    if (r < 0)
      return r;
    if ((r = load_block(ps, cfg, b, plugin_dir, host, err)) < 0) {
      ps->refused++;
      return eph_error_wrap(err, "enabled at %s", b->where);
    }
    eph_plugin_sweep(&ps->slots[ps->n - 1]);
    return 0;
  }
  return eph_error_set(err, ENOENT, "no enabled plugin block '%s'", name);
}

void
eph_plugin_sweep(const eph_plugin_slot_t *s)
{
  if (s->desc->kind != EPH_KIND_BACKEND)
    return;
  const eph_backend_ops_t *ops = s->desc->ops;
  if (!EPH_OPS_HAS(ops, eph_backend_ops_t, sweep))
    return;
  eph_error_t e = {0};
  int n = EPH_WITH_PLUGIN(s, ops->sweep(s->state, &e));
  if (n < 0)
    eph_warn("%s: start-up sweep failed: %s", s->desc->name, e.message);
  else if (n > 0)
    eph_info("%s: reaped %d sandbox(es) left behind by a dead process", s->desc->name, n);
}

void
eph_plugins_unload(eph_plugins_t *ps)
{
  for (size_t i = ps->n; i-- > 0;) {
    eph_plugin_slot_t *s = &ps->slots[i];
    if (s->desc->fini) {
      const char *prev = eph_log_push_plugin(s->desc->name);
      s->desc->fini(s->state);
      eph_log_pop_plugin(prev);
    }
    release_handle(s->handle);
    free(s->path);
    free(s->keys_owned);
  }
  free(ps->slots);
  memset(ps, 0, sizeof *ps);
}

const eph_plugin_slot_t *
eph_plugins_find(const eph_plugins_t *ps, const char *name)
{
  for (size_t i = 0; i < ps->n; i++)
    if (strcmp(ps->slots[i].desc->name, name) == 0)
      return &ps->slots[i];
  return NULL;
}

const eph_plugin_slot_t *
eph_plugins_first(const eph_plugins_t *ps, eph_kind_t kind)
{
  for (size_t i = 0; i < ps->n; i++)
    if (ps->slots[i].desc->kind == kind)
      return &ps->slots[i];
  return NULL;
}
