/* Configuration: ephemeral.conf (core keys) then every conf.d file ending in .conf in lexical order
 * (plugin blocks), libconfig syntax. A plugin block is a top-level group named after the plugin:
 *
 *   backend-jail: { enabled = true; memory_mib = 512; };
 *
 * Keys every block accepts besides the plugin's own table: `enabled` (bool, default false)
 * and `file` (string: the .so to load, relative to plugin_dir; default "<name>.so").
 * When ephemeral.conf is absent the embedded defaults of the core keys apply; a missing
 * conf.d is an error (no plugin set is ever assumed). */
#ifndef EPH_CONF_H
#define EPH_CONF_H

#include <libconfig.h>
#include <stdbool.h>
#include <stdio.h>

#include <ephemeral/plugin.h>

#include "conf_core.h"

/* One plugin block found in conf.d. */
typedef struct eph_config_block {
  char *name;                /* block name = plugin name; owned */
  config_setting_t *setting; /* the group; owned by its file */
  char *file;                /* the .so file name or path; owned */
  bool enabled;
  char *where; /* "conf.d/10-x.conf:3"; owned */
} eph_config_block_t;

typedef struct eph_config {
  char *main_path;  /* ephemeral.conf used, or NULL (embedded defaults); owned */
  char *confd_path; /* conf.d directory used; owned */
  config_t *files;  /* parsed files: [0] ephemeral.conf (maybe empty), then conf.d */
  size_t n_files;
  eph_config_block_t *blocks;
  size_t n_blocks;
  const config_setting_t *core; /* root of ephemeral.conf (core keys), or NULL */
  int warnings;                 /* unknown keys and other warnings reported so far */
  /* Every core key of ephemeral.conf, parsed once, defaults applied and ranges checked
   * (rows: conf_core.h). Read it through eph_config_values(). */
  eph_core_conf_t values;
  bool parsed; /* values holds the loaded files' (eph_config_load succeeded) */
} eph_config_t;

/* The core's values: c's once eph_config_load succeeded, else (c NULL, or a context built
 * without loading a configuration, as unit tests do) the rows' defaults. Borrowed, valid
 * until eph_config_free(c). Thread-safe. */
const eph_core_conf_t *eph_config_values(const eph_config_t *c);

/* The core's own documented keys (ephemeral.conf), {0}-terminated. */
extern const eph_config_key_t eph_core_config_keys[];

/* Loads main_path (may be NULL or missing: embedded defaults) and every *.conf in
 * confd_path, in lexical order. A confd_path that is NULL, missing or not a directory
 * fails with -EPH_E_CONFIG and a message naming it. Syntax errors, type and range errors
 * of core keys (nested groups included) and duplicate blocks fail with "file:line:
 * message"; unknown core keys, at the top level or inside a group, are warnings naming
 * file:line (counted in c->warnings). Fills c->values. On failure c is left empty. Free
 * with eph_config_free(). */
int eph_config_load(eph_config_t *c, const char *main_path, const char *confd_path,
                    eph_error_t *err);
void eph_config_free(eph_config_t *c);

/* The PostgreSQL target the store is to use: EPHEMERAL_DATABASE (which --database sets)
 * when set and not empty, else the core key `database` when not empty, else NULL (the
 * local SQLite store). Borrowed from the environment or the config tree. Whether it is a
 * PostgreSQL target at all is checked where the store is opened (core/cluster.c). */
const char *eph_config_database(const eph_config_t *c);

/* Finds the block for a plugin name, or NULL. */
const eph_config_block_t *eph_config_block(const eph_config_t *c, const char *name);

/* Checks a block's keys against a documented table: a key of the wrong type or outside its
 * row's range is an error (file:line), an unknown key a warning (file:line) counted in
 * *warnings; rows with their own keys (groups, lists of groups) are checked the same way
 * inside. `enabled` and `file` are always accepted at the top. owner names the block in
 * messages. Each matched setting keeps its row, so eph_cfg_int enforces the range too. */
int eph_config_check_keys(const config_setting_t *block, const eph_config_key_t *keys,
                          const char *owner, int *warnings, eph_error_t *err);

/* A plugin built against ABI 1.0 or 1.1 has key rows of the old, shorter layout: this
 * returns them in today's layout (no ranges, no nested keys), {0}-terminated, heap memory
 * owned by the caller (free()); NULL for NULL. The strings stay borrowed from the plugin. */
eph_config_key_t *eph_config_keys_upgrade_1_1(const void *rows);

/* Prints one line per key, nested keys as "group.key":
 * BLOCK TAB NAME TAB TYPE TAB DEFAULT TAB UNIT TAB DOC TAB RANGE (`ephemeral config keys`,
 * from which docs/man/gen-conf5.sh writes ephemeral.conf(5)). prefix may be NULL. */
void eph_config_keys_print(FILE *out, const char *block, const eph_config_key_t *keys,
                           const char *prefix);
/* "1..65535", "1..3600 seconds", "at least 1 ms" (no maximum), or "" without a range;
 * returns buf. */
const char *eph_config_range_text(const eph_config_key_t *k, char *buf, size_t size);
/* "integer", "string", ... */
const char *eph_config_type_word(eph_config_type_t t);

/* Typed getters: missing key (or NULL block) gives def; a wrong type fails with
 * -EPH_E_CONFIG and "file:line: key 'k': expected ...", an integer outside the range of the
 * row eph_config_check_keys matched with "file:line: key 'k': V is outside LO..HI UNIT
 * (block.k)". Strings are borrowed from the
 * config tree (valid until eph_config_free) or are def. */
int eph_cfg_int(const config_setting_t *block, const char *key, int64_t def, int64_t *out,
                eph_error_t *err);
int eph_cfg_bool(const config_setting_t *block, const char *key, int def, int *out,
                 eph_error_t *err);
int eph_cfg_string(const config_setting_t *block, const char *key, const char *def,
                   const char **out, eph_error_t *err);

/* "file:line" of a setting into buf (or "(embedded defaults)" for NULL); returns buf. */
const char *eph_cfg_where(const config_setting_t *s, char *buf, size_t size);
/* "server.max_body_bytes", "pricing.models[0].name": the dotted path of s from the file's
 * root, written into buf (size bytes, truncated); returns buf. */
const char *eph_cfg_path(const config_setting_t *s, char *buf, size_t size);

#endif
