#include <config.h>

#include "conf.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "log.h"
#include "util.h"

/* ------------------------------------------------------------------ the core's tables */

/* How a row's value lands in its struct (conf_core.h): generated from the same row. */
typedef struct conf_table conf_table_t;
typedef struct conf_bind {
  size_t offset;           /* of the member; SIZE_MAX: no member (an L row) */
  int64_t def_int;         /* I rows; INT64_MIN for IX rows (the finish function sets it) */
  const char *def_str;     /* S rows; NULL for SX rows */
  bool def_bool;           /* B rows */
  const conf_table_t *sub; /* G and LG rows */
  size_t count_offset;     /* LG rows: offset of n_NAME */
} conf_bind_t;

struct conf_table {
  const eph_config_key_t *keys; /* {0}-terminated */
  const conf_bind_t *bind;      /* one per row */
  size_t size;                  /* sizeof the struct (elements of an LG row) */
  /* Cross-key rules and derived defaults, after the rows; g may be NULL (defaults). */
  int (*finish)(void *values, const config_setting_t *g, eph_error_t *err);
};

#define ROW_I(n, def, lo, hi, u, d)                                                                \
  {.name = #n,                                                                                     \
   .type = EPH_CFG_INT,                                                                            \
   .default_text = #def,                                                                           \
   .unit = u,                                                                                      \
   .doc = d,                                                                                       \
   EPH_CFG_RANGE(lo, hi)},
#define ROW_IX(n, text, lo, hi, u, d)                                                              \
  {.name = #n,                                                                                     \
   .type = EPH_CFG_INT,                                                                            \
   .default_text = text,                                                                           \
   .unit = u,                                                                                      \
   .doc = d,                                                                                       \
   EPH_CFG_RANGE(lo, hi)},
#define ROW_S(n, def, d) {.name = #n, .type = EPH_CFG_STRING, .default_text = #def, .doc = d},
#define ROW_SX(n, text, d) {.name = #n, .type = EPH_CFG_STRING, .default_text = text, .doc = d},
#define ROW_B(n, def, d) {.name = #n, .type = EPH_CFG_BOOL, .default_text = #def, .doc = d},
#define ROW_L(n, text, d) {.name = #n, .type = EPH_CFG_LIST, .default_text = text, .doc = d},
#define ROW_LG(n, ty_, sb_, text, d)                                                               \
  {.name = #n, .type = EPH_CFG_LIST, .default_text = text, .doc = d, .keys = sb_##_keys},
#define ROW_G(n, ty_, sb_, d)                                                                      \
  {.name = #n, .type = EPH_CFG_GROUP, .default_text = "(see below)", .doc = d, .keys = sb_##_keys},
#define ROWS(LIST) LIST(ROW_I, ROW_IX, ROW_S, ROW_SX, ROW_B, ROW_L, ROW_LG, ROW_G)

#define BIND_I(n, def, ...) {.offset = offsetof(CUR_T, n), .def_int = def},
#define BIND_IX(n, ...) {.offset = offsetof(CUR_T, n), .def_int = INT64_MIN},
#define BIND_S(n, def, ...) {.offset = offsetof(CUR_T, n), .def_str = def},
#define BIND_SX(n, ...) {.offset = offsetof(CUR_T, n)},
#define BIND_B(n, def, ...) {.offset = offsetof(CUR_T, n), .def_bool = def},
#define BIND_L(n, ...) {.offset = SIZE_MAX},
#define BIND_LG(n, ty_, sb_, ...)                                                                  \
  {.offset = offsetof(CUR_T, n), .count_offset = offsetof(CUR_T, n_##n), .sub = &sb_##_table},
#define BIND_G(n, ty_, sb_, ...) {.offset = offsetof(CUR_T, n), .sub = &sb_##_table},
#define BINDS(LIST) LIST(BIND_I, BIND_IX, BIND_S, BIND_SX, BIND_B, BIND_L, BIND_LG, BIND_G)

static int price_model_finish(void *values, const config_setting_t *g, eph_error_t *err);
static int server_finish(void *values, const config_setting_t *g, eph_error_t *err);
static int core_finish(void *values, const config_setting_t *g, eph_error_t *err);

#define TABLE(sub, type, LIST, fin)                                                                \
  static const eph_config_key_t sub##_keys[] = {ROWS(LIST){0}};                                    \
  static const conf_bind_t sub##_bind[] = {BINDS(LIST)};                                           \
  static const conf_table_t sub##_table = {sub##_keys, sub##_bind, sizeof(type), fin};

#define CUR_T eph_price_model_t
TABLE(price_model, eph_price_model_t, EPH_PRICE_MODEL_KEYS, price_model_finish)
#undef CUR_T
#define CUR_T eph_pricing_conf_t
TABLE(pricing, eph_pricing_conf_t, EPH_PRICING_KEYS, NULL)
#undef CUR_T
#define CUR_T eph_egress_conf_t
TABLE(egress, eph_egress_conf_t, EPH_EGRESS_KEYS, NULL)
#undef CUR_T
#define CUR_T eph_webhooks_conf_t
TABLE(webhooks, eph_webhooks_conf_t, EPH_WEBHOOKS_KEYS, NULL)
#undef CUR_T
#define CUR_T eph_server_conf_t
TABLE(server, eph_server_conf_t, EPH_SERVER_KEYS, server_finish)
#undef CUR_T

/* The core's own keys: `config check`, the unknown-key warnings, `config keys` and
 * ephemeral.conf(5) all read this table (rows: conf_core.h). */
const eph_config_key_t eph_core_config_keys[] = {ROWS(EPH_CORE_KEYS){0}};
#define CUR_T eph_core_conf_t
static const conf_bind_t core_bind[] = {BINDS(EPH_CORE_KEYS)};
#undef CUR_T
static const conf_table_t core_table = {eph_core_config_keys, core_bind, sizeof(eph_core_conf_t),
                                        core_finish};

/* ------------------------------------------------------------------ parsing the core */

static int
parse_table(const conf_table_t *t, const config_setting_t *g, void *values, eph_error_t *err)
{
  char *base = values;
  int r;
  for (size_t i = 0; t->keys[i].name; i++) {
    const eph_config_key_t *k = &t->keys[i];
    const conf_bind_t *b = &t->bind[i];
    const config_setting_t *s = g ? config_setting_get_member(g, k->name) : NULL;
    if (b->offset == SIZE_MAX)
      continue;
    /* Types and ranges were checked by check_group (parse runs after it). */
    switch (k->type) {
    case EPH_CFG_INT:
      *(int64_t *)(base + b->offset) = s ? config_setting_get_int64(s) : b->def_int;
      break;
    case EPH_CFG_STRING:
      *(const char **)(base + b->offset) = s ? config_setting_get_string(s) : b->def_str;
      break;
    case EPH_CFG_BOOL:
      *(bool *)(base + b->offset) = s ? config_setting_get_bool(s) : b->def_bool;
      break;
    case EPH_CFG_GROUP:
      if ((r = parse_table(b->sub, s, base + b->offset, err)) < 0)
        return r;
      break;
    case EPH_CFG_LIST: {
      /* Given but empty is not absent: elems is NULL only for an absent list. */
      size_t n = s ? (size_t)config_setting_length(s) : 0;
      char *elems = s ? eph_xcalloc(n ? n : 1, b->sub->size) : NULL;
      *(void **)(base + b->offset) = elems;
      *(size_t *)(base + b->count_offset) = n;
      for (size_t j = 0; j < n; j++)
        if ((r = parse_table(b->sub, config_setting_get_elem(s, (unsigned)j),
                             elems + j * b->sub->size, err)) < 0)
          return r;
      break;
    }
    }
  }
  return t->finish ? t->finish(values, g, err) : 0;
}

static void
free_table(const conf_table_t *t, void *values)
{
  char *base = values;
  for (size_t i = 0; t->keys[i].name; i++) {
    const conf_bind_t *b = &t->bind[i];
    if (b->offset == SIZE_MAX || !b->sub)
      continue;
    if (t->keys[i].type == EPH_CFG_GROUP) {
      free_table(b->sub, base + b->offset);
      continue;
    }
    char *elems = *(void **)(base + b->offset);
    size_t n = *(size_t *)(base + b->count_offset);
    for (size_t j = 0; j < n; j++)
      free_table(b->sub, elems + j * b->sub->size);
    free(elems);
  }
}

static const char *
member_where(const config_setting_t *g, const char *key, char *buf, size_t size)
{
  return eph_cfg_where(g ? config_setting_get_member(g, key) : NULL, buf, size);
}

static eph_core_conf_t defaults;
static pthread_once_t defaults_once = PTHREAD_ONCE_INIT;

static void
parse_defaults(void)
{
  /* No group: every row's default; the finish functions cannot fail on them. */
  parse_table(&core_table, NULL, &defaults, NULL);
}

const eph_core_conf_t *
eph_config_values(const eph_config_t *c)
{
  if (c && c->parsed)
    return &c->values;
  pthread_once(&defaults_once, parse_defaults);
  return &defaults;
}

/* A row's name and both prices are required: a mistyped or forgotten price would
 * otherwise bill that model's tokens at 0 (fail closed: the configuration is refused).
 * Cached prompt tokens cost the input price unless said otherwise. */
static int
price_model_finish(void *values, const config_setting_t *g, eph_error_t *err)
{
  eph_price_model_t *m = values;
  const char *missing = !m->name                                 ? "name"
                        : m->input_micros_per_mtok == INT64_MIN  ? "input_micros_per_mtok"
                        : m->output_micros_per_mtok == INT64_MIN ? "output_micros_per_mtok"
                                                                 : NULL;
  if (missing) {
    char where[PATH_MAX + 32], path[512];
    return eph_error_set(
        err, EPH_E_CONFIG, "%s: key '%s' is required in every row of pricing.models (%s%s%s%s)",
        eph_cfg_where(g, where, sizeof where), missing, eph_cfg_path(g, path, sizeof path),
        m->name ? ": \"" : "", m->name ? m->name : "", m->name ? "\"" : "");
  }
  if (m->cached_input_micros_per_mtok == INT64_MIN)
    m->cached_input_micros_per_mtok = m->input_micros_per_mtok;
  if (m->cache_write_micros_per_mtok == INT64_MIN)
    m->cache_write_micros_per_mtok = m->input_micros_per_mtok;
  return 0;
}

static int
server_finish(void *values, const config_setting_t *g, eph_error_t *err)
{
  const eph_server_conf_t *v = values;
  char where[PATH_MAX + 32];
  if (v->max_inflight_body_bytes < v->max_body_bytes)
    return eph_error_set(err, EPH_E_CONFIG,
                         "%s: server.max_inflight_body_bytes = %" PRId64
                         ": must be at least server.max_body_bytes (%" PRId64 ")",
                         member_where(g, "max_inflight_body_bytes", where, sizeof where),
                         v->max_inflight_body_bytes, v->max_body_bytes);
  return 0;
}

static int
core_finish(void *values, const config_setting_t *g, eph_error_t *err)
{
  const eph_core_conf_t *v = values;
  char where[PATH_MAX + 32];
  if (eph_log_level_parse(v->log_level) < 0)
    return eph_error_set(err, EPH_E_CONFIG, "%s: log_level: expected error, warn, info or debug",
                         member_where(g, "log_level", where, sizeof where));
  return 0;
}

static int
confd_filter(const struct dirent *d)
{
  size_t n = strlen(d->d_name);
  return d->d_name[0] != '.' && n > 5 && strcmp(d->d_name + n - 5, ".conf") == 0;
}

static int
parse_file(config_t *cfg, const char *path, eph_error_t *err)
{
  config_init(cfg);
  /* @include paths are relative to the including file's directory. */
  cleanup_free char *dir = eph_xstrdup(path);
  char *slash = strrchr(dir, '/');
  if (slash) {
    *slash = '\0';
    config_set_include_dir(cfg, dir);
  }
  if (config_read_file(cfg, path) == CONFIG_TRUE)
    return 0;
  int r;
  if (config_error_type(cfg) == CONFIG_ERR_FILE_IO)
    r = eph_error_set(err, EPH_E_CONFIG, "%s: cannot read file", path);
  else
    r = eph_error_set(err, EPH_E_CONFIG, "%s:%d: %s",
                      config_error_file(cfg) ? config_error_file(cfg) : path,
                      config_error_line(cfg), config_error_text(cfg));
  config_destroy(cfg);
  return r;
}

static bool
is_file(const char *path)
{
  struct stat st;
  return path && stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static bool
is_dir(const char *path)
{
  struct stat st;
  return path && stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static void
add_block(eph_config_t *c, const char *name, config_setting_t *s, bool enabled, const char *file,
          const char *where)
{
  c->blocks = eph_xrealloc(c->blocks, (c->n_blocks + 1) * sizeof *c->blocks);
  eph_config_block_t *b = &c->blocks[c->n_blocks++];
  b->name = eph_xstrdup(name);
  b->setting = s;
  b->enabled = enabled;
  b->file = file ? eph_xstrdup(file) : eph_xasprintf("%s.so", name);
  b->where = eph_xstrdup(where);
}

static int
collect_blocks(eph_config_t *c, config_t *cfg, eph_error_t *err)
{
  config_setting_t *root = config_root_setting(cfg);
  char where[PATH_MAX + 32];
  int n = config_setting_length(root);
  for (int i = 0; i < n; i++) {
    config_setting_t *s = config_setting_get_elem(root, (unsigned)i);
    const char *name = config_setting_name(s);
    eph_cfg_where(s, where, sizeof where);
    if (config_setting_type(s) != CONFIG_TYPE_GROUP)
      return eph_error_set(err, EPH_E_CONFIG,
                           "%s: '%s': conf.d holds plugin blocks only (name: { enabled = true; "
                           "... };)",
                           where, name);
    for (const char *p = name; *p; p++)
      if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '_'))
        return eph_error_set(err, EPH_E_CONFIG,
                             "%s: '%s': plugin names use lowercase letters, digits, '-'", where,
                             name);
    const eph_config_block_t *prev = eph_config_block(c, name);
    if (prev)
      return eph_error_set(err, EPH_E_CONFIG, "%s: duplicate block '%s' (first at %s)", where, name,
                           prev->where);
    int enabled = 0;
    const char *file = NULL;
    int r = eph_cfg_bool(s, "enabled", 0, &enabled, err);
    if (r < 0)
      return r;
    r = eph_cfg_string(s, "file", NULL, &file, err);
    if (r < 0)
      return r;
    add_block(c, name, s, enabled, file, where);
  }
  return 0;
}

const char *
eph_config_database(const eph_config_t *c)
{
  const char *env = getenv("EPHEMERAL_DATABASE");
  if (env && *env)
    return env;
  const char *db = eph_config_values(c)->database;
  return db && *db ? db : NULL;
}

/* Which ledger block is loaded (core key `ledger`, docs/cluster.md). Money must live where
 * every node of a cluster finds it: with a PostgreSQL `database` and no `ledger` chosen,
 * the ledger is ledger-postgres (in that database unless its block names another), never
 * a per-node ledger-sqlite file the shipped conf.d enables for one host. A named ledger is
 * loaded whatever its block's `enabled` says, and no other ledger-* block is. Without
 * either, the first enabled ledger block is the ledger, as on one host. */
static int
choose_ledger(eph_config_t *c, eph_error_t *err)
{
  const char *want = c->values.ledger;
  bool named = want && *want;
  if (!named) {
    /* Any database means the shared store: one that is not a PostgreSQL target is refused
     * where the store is opened (core/cluster.c), before any money moves. */
    if (!eph_config_database(c))
      return 0;
    want = "ledger-postgres";
  }
  bool found = false;
  for (size_t i = 0; i < c->n_blocks; i++) {
    eph_config_block_t *b = &c->blocks[i];
    bool is = strcmp(b->name, want) == 0;
    if (!is && strncmp(b->name, "ledger-", 7) != 0)
      continue;
    found = found || is;
    b->enabled = is;
  }
  if (!found && named) {
    char where[PATH_MAX + 32];
    const config_setting_t *s = c->core ? config_setting_get_member(c->core, "ledger") : NULL;
    return eph_error_set(err, EPH_E_CONFIG,
                         "%s: ledger = \"%s\": conf.d (%s) has no block '%s'; add one "
                         "(%s: { };) or unset `ledger`",
                         eph_cfg_where(s, where, sizeof where), want, c->confd_path, want, want);
  }
  if (!found) /* an older conf.d without its block: the plugin's defaults */
    add_block(c, want, NULL, true, NULL, "(chosen by `database`: no block in conf.d)");
  eph_debug("ledger: %s (%s)", want,
            named ? "ephemeral.conf's `ledger`" : "the database is PostgreSQL");
  return 0;
}

int
eph_config_load(eph_config_t *c, const char *main_path, const char *confd_path, eph_error_t *err)
{
  memset(c, 0, sizeof *c);
  int r = 0;
  struct dirent **names = NULL;
  int n_names = 0;
  /* `--config /etc/ephemeral` (the directory) is a likely slip: name the file it meant,
   * instead of a conf.d missing beside the directory. */
  if (is_dir(main_path))
    return eph_error_set(err, EPH_E_CONFIG,
                         "%s: is a directory: --config and EPHEMERAL_CONFIG name the "
                         "ephemeral.conf file (%s%sephemeral.conf?)",
                         main_path, main_path, main_path[strlen(main_path) - 1] == '/' ? "" : "/");
  /* No conf.d is an error, never a fallback: a missing directory is a wrong --sysconfdir,
   * a staging copy looking at the host's /etc, or a half-removed package, and a built-in
   * plugin set would hide which configuration (or none) the run got. */
  if (!confd_path || !is_dir(confd_path)) {
    int e = confd_path && stat(confd_path, &(struct stat){0}) == 0 ? ENOTDIR : ENOENT;
    return eph_error_set(err, EPH_E_CONFIG,
                         "%s: the plugin configuration directory (conf.d) %s: no plugin "
                         "would be enabled; create it, or name an ephemeral.conf with a "
                         "conf.d beside it (--config, EPHEMERAL_CONFIG)",
                         confd_path ? confd_path : "(none)",
                         e == ENOTDIR ? "is not a directory" : "does not exist");
  }
  n_names = scandir(confd_path, &names, confd_filter, alphasort);
  if (n_names < 0)
    return eph_error_set(err, errno, "%s: %s", confd_path, strerror(errno));
  c->files = eph_xcalloc((size_t)n_names + 1, sizeof *c->files);

  if (is_file(main_path)) {
    r = parse_file(&c->files[0], main_path, err);
    if (r < 0)
      goto out;
    c->n_files = 1;
    c->main_path = eph_xstrdup(main_path);
    c->core = config_root_setting(&c->files[0]);
    r = eph_config_check_keys(c->core, eph_core_config_keys, "ephemeral.conf", &c->warnings, err);
    if (r < 0)
      goto out;
  } else {
    if (main_path)
      eph_debug("%s: not found, using the embedded defaults", main_path);
    config_init(&c->files[0]);
    c->n_files = 1;
  }

  /* Every core value, defaults applied, once (c->core is NULL: the embedded defaults). */
  r = parse_table(&core_table, c->core, &c->values, err);
  if (r < 0)
    goto out;
  c->parsed = true;

  c->confd_path = eph_xstrdup(confd_path);
  for (int i = 0; i < n_names; i++) {
    cleanup_free char *path = eph_xasprintf("%s/%s", confd_path, names[i]->d_name);
    r = parse_file(&c->files[c->n_files], path, err);
    if (r < 0)
      goto out;
    c->n_files++;
    r = collect_blocks(c, &c->files[c->n_files - 1], err);
    if (r < 0)
      goto out;
  }
  r = choose_ledger(c, err);

out:
  for (int i = 0; i < n_names; i++)
    free(names[i]);
  free(names);
  if (r < 0)
    eph_config_free(c);
  return r;
}

void
eph_config_free(eph_config_t *c)
{
  for (size_t i = 0; i < c->n_blocks; i++) {
    free(c->blocks[i].name);
    free(c->blocks[i].file);
    free(c->blocks[i].where);
  }
  free(c->blocks);
  free_table(&core_table, &c->values);
  for (size_t i = 0; i < c->n_files; i++)
    config_destroy(&c->files[i]);
  free(c->files);
  free(c->main_path);
  free(c->confd_path);
  memset(c, 0, sizeof *c);
}

const eph_config_block_t *
eph_config_block(const eph_config_t *c, const char *name)
{
  for (size_t i = 0; i < c->n_blocks; i++)
    if (strcmp(c->blocks[i].name, name) == 0)
      return &c->blocks[i];
  return NULL;
}
