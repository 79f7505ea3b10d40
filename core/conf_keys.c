/* The configuration key rows at work: where a setting stands (file:line, its dotted path),
 * the typed getters plugins call (eph_cfg_int/bool/string), the check of a group against its
 * rows (unknown keys, types, ranges), `ephemeral config keys` and the ABI 1.1 row upgrade.
 * The core's own tables and their parsing: conf.c. */
#include <config.h>

#include "conf.h"

#include <inttypes.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "util.h"

const char *
eph_cfg_where(const config_setting_t *s, char *buf, size_t size)
{
  if (!s) {
    snprintf(buf, size, "(embedded defaults)");
    return buf;
  }
  const char *file = config_setting_source_file(s);
  snprintf(buf, size, "%s:%u", file ? file : "(config)", config_setting_source_line(s));
  return buf;
}

static const char *
type_name(eph_config_type_t t)
{
  switch (t) {
  case EPH_CFG_BOOL:
    return "a boolean (true/false)";
  case EPH_CFG_INT:
    return "an integer";
  case EPH_CFG_STRING:
    return "a string";
  case EPH_CFG_LIST:
    return "a list";
  case EPH_CFG_GROUP:
    return "a group { ... }";
  }
  return "?";
}

static bool
type_matches(const config_setting_t *s, eph_config_type_t t)
{
  int ct = config_setting_type(s);
  switch (t) {
  case EPH_CFG_BOOL:
    return ct == CONFIG_TYPE_BOOL;
  case EPH_CFG_INT:
    return ct == CONFIG_TYPE_INT || ct == CONFIG_TYPE_INT64;
  case EPH_CFG_STRING:
    return ct == CONFIG_TYPE_STRING;
  case EPH_CFG_LIST:
    return ct == CONFIG_TYPE_LIST || ct == CONFIG_TYPE_ARRAY;
  case EPH_CFG_GROUP:
    return ct == CONFIG_TYPE_GROUP;
  }
  return false;
}

static int range_error(const config_setting_t *s, const eph_config_key_t *k, int64_t v,
                       eph_error_t *err);

static int
type_error(const config_setting_t *s, const char *key, eph_config_type_t want, eph_error_t *err)
{
  char where[PATH_MAX + 32], path[512];
  eph_cfg_where(s, where, sizeof where);
  eph_cfg_path(s, path, sizeof path);
  if (strcmp(path, key) == 0)
    return eph_error_set(err, EPH_E_CONFIG, "%s: key '%s': expected %s", where, key,
                         type_name(want));
  return eph_error_set(err, EPH_E_CONFIG, "%s: key '%s': expected %s (%s)", where, key,
                       type_name(want), path);
}

int
eph_cfg_int(const config_setting_t *block, const char *key, int64_t def, int64_t *out,
            eph_error_t *err)
{
  config_setting_t *s = block ? config_setting_get_member(block, key) : NULL;
  if (!s) {
    *out = def;
    return 0;
  }
  if (!type_matches(s, EPH_CFG_INT))
    return type_error(s, key, EPH_CFG_INT, err);
  int64_t v = config_setting_get_int64(s);
  /* The row the key check matched (eph_config_check_keys leaves it on the setting). */
  const eph_config_key_t *k = config_setting_get_hook(s);
  if (k && k->type == EPH_CFG_INT && k->has_range && (v < k->min || v > k->max))
    return range_error(s, k, v, err);
  *out = v;
  return 0;
}

int
eph_cfg_bool(const config_setting_t *block, const char *key, int def, int *out, eph_error_t *err)
{
  config_setting_t *s = block ? config_setting_get_member(block, key) : NULL;
  if (!s) {
    *out = def;
    return 0;
  }
  if (!type_matches(s, EPH_CFG_BOOL))
    return type_error(s, key, EPH_CFG_BOOL, err);
  *out = config_setting_get_bool(s);
  return 0;
}

int
eph_cfg_string(const config_setting_t *block, const char *key, const char *def, const char **out,
               eph_error_t *err)
{
  config_setting_t *s = block ? config_setting_get_member(block, key) : NULL;
  if (!s) {
    *out = def;
    return 0;
  }
  if (!type_matches(s, EPH_CFG_STRING))
    return type_error(s, key, EPH_CFG_STRING, err);
  *out = config_setting_get_string(s);
  return 0;
}

/* "server.max_body_bytes", "backend-qemu.slots", "pricing.models[0].name": the names of s
 * and its parents up to the file's root. */
const char *
eph_cfg_path(const config_setting_t *s, char *buf, size_t size)
{
  const config_setting_t *chain[16];
  size_t n = 0;
  for (; s && config_setting_parent(s) && n < sizeof chain / sizeof chain[0];
       s = config_setting_parent(s))
    chain[n++] = s;
  size_t len = 0;
  buf[0] = '\0';
  while (n-- > 0 && len < size) {
    const char *name = config_setting_name(chain[n]);
    int w = name ? snprintf(buf + len, size - len, "%s%s", len ? "." : "", name)
                 : snprintf(buf + len, size - len, "[%d]", config_setting_index(chain[n]));
    len += w > 0 ? (size_t)w : 0;
  }
  return buf;
}

const char *
eph_config_range_text(const eph_config_key_t *k, char *buf, size_t size)
{
  if (!k->has_range)
    snprintf(buf, size, "%s", "");
  else if (k->max == INT64_MAX)
    snprintf(buf, size, "at least %" PRId64 "%s%s", k->min, k->unit ? " " : "",
             k->unit ? k->unit : "");
  else
    snprintf(buf, size, "%" PRId64 "..%" PRId64 "%s%s", k->min, k->max, k->unit ? " " : "",
             k->unit ? k->unit : "");
  return buf;
}

static int
range_error(const config_setting_t *s, const eph_config_key_t *k, int64_t v, eph_error_t *err)
{
  char where[PATH_MAX + 32], path[512], range[128];
  eph_cfg_where(s, where, sizeof where);
  eph_cfg_path(s, path, sizeof path);
  eph_config_range_text(k, range, sizeof range);
  /* "is outside 1..64", or without a maximum "is not positive", "is negative", "is below
   * at least 100 ms" reads badly: "is below 100 ms". */
  char what[192];
  if (k->max != INT64_MAX)
    snprintf(what, sizeof what, "is outside %s", range);
  else if (k->min == 1)
    snprintf(what, sizeof what, "is not positive");
  else if (k->min == 0)
    snprintf(what, sizeof what, "is negative");
  else
    snprintf(what, sizeof what, "is below %s", range + strlen("at least "));
  if (strcmp(path, k->name) == 0)
    return eph_error_set(err, EPH_E_CONFIG, "%s: key '%s': %" PRId64 " %s", where, k->name, v,
                         what);
  return eph_error_set(err, EPH_E_CONFIG, "%s: key '%s': %" PRId64 " %s (%s)", where, k->name, v,
                       what, path);
}

/* Checks the named settings of group against keys; top: a plugin block or the file's root,
 * where `enabled` and `file` are always accepted. Recurses into rows with their own keys. */
static int
check_group(const config_setting_t *group, const eph_config_key_t *keys, const char *owner,
            bool top, int *warnings, eph_error_t *err)
{
  char where[PATH_MAX + 32];
  int n = config_setting_length(group);
  for (int i = 0; i < n; i++) {
    config_setting_t *s = config_setting_get_elem(group, (unsigned)i);
    const char *name = config_setting_name(s);
    if (!name)
      continue;
    if (top && strcmp(name, "enabled") == 0) {
      if (!type_matches(s, EPH_CFG_BOOL))
        return type_error(s, name, EPH_CFG_BOOL, err);
      continue;
    }
    if (top && strcmp(name, "file") == 0) {
      if (!type_matches(s, EPH_CFG_STRING))
        return type_error(s, name, EPH_CFG_STRING, err);
      continue;
    }
    const eph_config_key_t *k = keys;
    while (k && k->name && strcmp(k->name, name) != 0)
      k++;
    if (!k || !k->name) {
      char path[512];
      const char *names[256];
      size_t nn = 0;
      for (const eph_config_key_t *q = keys; q && q->name && nn < 256; q++)
        names[nn++] = q->name;
      const char *near = eph_closest(name, names, nn);
      eph_warn("%s: unknown key '%s' in %s (ignored)%s%s%s", eph_cfg_where(s, where, sizeof where),
               name, top ? owner : eph_cfg_path(group, path, sizeof path),
               near ? ": did you mean '" : "", near ? near : "", near ? "'?" : "");
      if (warnings)
        (*warnings)++;
      continue;
    }
    if (!type_matches(s, k->type))
      return type_error(s, name, k->type, err);
    /* For cfg_int: the range travels with the setting. */
    config_setting_set_hook(s, (void *)k);
    int r;
    if (k->type == EPH_CFG_INT && k->has_range) {
      int64_t v = config_setting_get_int64(s);
      if (v < k->min || v > k->max)
        return range_error(s, k, v, err);
    } else if (k->type == EPH_CFG_GROUP && k->keys) {
      if ((r = check_group(s, k->keys, owner, false, warnings, err)) < 0)
        return r;
    } else if (k->type == EPH_CFG_LIST && k->keys) {
      for (int j = 0; j < config_setting_length(s); j++) {
        const config_setting_t *e = config_setting_get_elem(s, (unsigned)j);
        if (config_setting_type(e) != CONFIG_TYPE_GROUP)
          return eph_error_set(err, EPH_E_CONFIG, "%s: key '%s': element %d: expected %s",
                               eph_cfg_where(e, where, sizeof where), name, j,
                               type_name(EPH_CFG_GROUP));
        if ((r = check_group(e, k->keys, owner, false, warnings, err)) < 0)
          return r;
      }
    }
  }
  return 0;
}

int
eph_config_check_keys(const config_setting_t *block, const eph_config_key_t *keys,
                      const char *owner, int *warnings, eph_error_t *err)
{
  if (!block)
    return 0;
  return check_group(block, keys, owner, true, warnings, err);
}

void
eph_config_keys_print(FILE *out, const char *block, const eph_config_key_t *keys,
                      const char *prefix)
{
  for (const eph_config_key_t *k = keys; k && k->name; k++) {
    char range[128];
    cleanup_free char *name = eph_xasprintf("%s%s", prefix ? prefix : "", k->name);
    fprintf(out, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", block, name, eph_config_type_word(k->type),
            k->default_text ? k->default_text : "", k->unit ? k->unit : "", k->doc ? k->doc : "",
            eph_config_range_text(k, range, sizeof range));
    if (k->keys) {
      cleanup_free char *sub = eph_xasprintf("%s.", name);
      eph_config_keys_print(out, block, k->keys, sub);
    }
  }
}

const char *
eph_config_type_word(eph_config_type_t t)
{
  switch (t) {
  case EPH_CFG_BOOL:
    return "bool";
  case EPH_CFG_INT:
    return "integer";
  case EPH_CFG_STRING:
    return "string";
  case EPH_CFG_LIST:
    return "list";
  case EPH_CFG_GROUP:
    return "group";
  }
  return "?";
}

/* The key row of ABI 1.0 and 1.1, before ranges and nested keys were appended in 1.2. */
typedef struct key_1_1 {
  const char *name;
  eph_config_type_t type;
  const char *default_text, *unit, *doc;
} key_1_1_t;

eph_config_key_t *
eph_config_keys_upgrade_1_1(const void *rows)
{
  const key_1_1_t *old = rows;
  if (!old)
    return NULL;
  size_t n = 0;
  while (old[n].name)
    n++;
  eph_config_key_t *keys = eph_xcalloc(n + 1, sizeof *keys);
  for (size_t i = 0; i < n; i++)
    keys[i] = (eph_config_key_t){.name = old[i].name,
                                 .type = old[i].type,
                                 .default_text = old[i].default_text,
                                 .unit = old[i].unit,
                                 .doc = old[i].doc};
  return keys;
}
