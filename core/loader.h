/* The plugin loader: dlopen()s the plugins conf.d enables from plugin_dir with
 * RTLD_NOW | RTLD_LOCAL, checks each descriptor and calls its init(). A plugin is refused,
 * with an error naming its file, for: a dlopen failure, a missing descriptor, a different
 * ABI major, a descriptor too small, a bad or duplicate name, an unknown kind, a config
 * type error, a failing init. A refused plugin is dlclose()d: it never half-loads. */
#ifndef EPH_LOADER_H
#define EPH_LOADER_H

#include <stddef.h>

#include <ephemeral/plugin.h>

#include "conf.h"

/* One loaded plugin. */
typedef struct eph_plugin_slot {
  const eph_plugin_t *desc;       /* the plugin's descriptor (in its .so) */
  void *handle;                   /* dlopen handle */
  void *state;                    /* what init() returned */
  char *path;                     /* the file it was loaded from; owned */
  const config_setting_t *config; /* its block (may be NULL); owned by eph_config_t */
  /* Its key rows: desc->config_keys, or their upgrade from a plugin built against ABI
   * 1.0/1.1, whose rows are shorter (then owned: keys_owned). */
  const eph_config_key_t *config_keys;
  eph_config_key_t *keys_owned;
} eph_plugin_slot_t;

typedef struct eph_plugins {
  eph_plugin_slot_t *slots; /* room for every enabled block is reserved at the first load,
                             * so a slot loaded later (lazily) never moves the others */
  size_t n, cap;
  int refused; /* how many enabled plugins were refused */
} eph_plugins_t;

/* True when the ops table `ops` of type `type` is large enough to hold `field` and it is
 * set: tables may come from an older or newer minor. */
#define EPH_OPS_HAS(ops, type, field)                                                              \
  ((ops) && (ops)->struct_size >= offsetof(type, field) + sizeof((ops)->field) &&                  \
   (ops)->field != NULL)

/* Runs `expr` with the log prefix naming the slot's plugin. */
#define EPH_WITH_PLUGIN(slot, expr)                                                                \
  ({                                                                                               \
    const char *_prev = eph_log_push_plugin((slot)->desc->name);                                   \
    __typeof__(expr) _r = (expr);                                                                  \
    eph_log_pop_plugin(_prev);                                                                     \
    _r;                                                                                            \
  })

/* Loads every enabled block of cfg. Each refusal is logged as an error naming the file and
 * counted in ps->refused; the others load. host is borrowed and must outlive ps.
 * Returns 0, or negative (err names the directory) when an enabled block needs plugin_dir
 * and it is NULL, missing or not a directory: then nothing is loaded. */
int eph_plugins_load(eph_plugins_t *ps, eph_config_t *cfg, const char *plugin_dir,
                     const eph_host_t *host, eph_error_t *err);

/* 0, or negative with err naming the directory (as eph_plugins_load refuses it) when an
 * enabled block of cfg needs plugin_dir and it is NULL, missing or not a directory. Opens
 * nothing: eph_ctx_open checks it before it creates any state. */
int eph_plugins_check_dir(const eph_config_t *cfg, const char *plugin_dir, eph_error_t *err);

/* eph_plugins_load, except the blocks of plugins of kind `defer` (their file is not opened:
 * a block's kind is known once loaded, so deferred blocks are recognised by name, `backend-`
 * for EPH_KIND_BACKEND). They load later with eph_plugins_load_one. defer < 0: none. */
int eph_plugins_load_except(eph_plugins_t *ps, eph_config_t *cfg, const char *plugin_dir,
                            const eph_host_t *host, int defer, eph_error_t *err);

/* Loads one plugin file (used by eph_plugins_load and the tests). On success appends it to
 * ps; on failure nothing of it stays loaded and err names path. */
int eph_plugin_load_file(eph_plugins_t *ps, const char *path, const config_setting_t *config,
                         const eph_host_t *host, int *warnings, eph_error_t *err);

/* Loads the one enabled block called `name` (a lazy context: `exec` loads its backend and
 * nothing else) and, for a backend, runs its start-up sweep. Returns 0 (also when it is
 * loaded already), -ENOENT when no enabled block has that name, or the refusal (err names
 * the file). Earlier slot pointers stay valid (room was reserved for every enabled block). */
int eph_plugins_load_one(eph_plugins_t *ps, eph_config_t *cfg, const char *plugin_dir,
                         const eph_host_t *host, const char *name, eph_error_t *err);

/* eph_plugins_load_one for a lazy load that must not stop what asked for it (the plugins a
 * run's request uses): a refusal is logged as an error. 1 when loaded now or before, 0
 * when refused. */
int eph_plugins_load_logged(eph_plugins_t *ps, eph_config_t *cfg, const char *plugin_dir,
                            const eph_host_t *host, const char *name);

/* A backend's start-up sweep (reaps what a dead process left); logs what it did. No-op for
 * other kinds and for a backend without one. */
void eph_plugin_sweep(const eph_plugin_slot_t *s);

/* fini() then dlclose() every plugin, last loaded first. */
void eph_plugins_unload(eph_plugins_t *ps);

const eph_plugin_slot_t *eph_plugins_find(const eph_plugins_t *ps, const char *name);
/* The first loaded plugin of a kind, or NULL. */
const eph_plugin_slot_t *eph_plugins_first(const eph_plugins_t *ps, eph_kind_t kind);

const char *eph_kind_name(eph_kind_t kind);

#endif
