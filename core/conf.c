#include "conf.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <config.h>
#include "log.h"
#include "util.h"

/* The core's own keys. Kept in one table so `config check`, the unknown-key warnings and
 * ephemeral.conf(5) all read the same source. */
const eph_config_key_t eph_core_config_keys[] = {
    {"plugin_dir", EPH_CFG_STRING, "(build tree or <libdir>/ephemeral/plugins)", NULL,
     "Directory the plugins' .so files are loaded from."},
    {"state_dir", EPH_CFG_STRING, "(see ephemeral(1))", NULL,
     "Directory of the SQLite files (ledger, run history). Overridden by --state-dir and "
     "EPHEMERAL_STATE_DIR."},
    {"database", EPH_CFG_STRING, "(unset: <state_dir>/ephemeral.sqlite)", NULL,
     "Shared PostgreSQL database for runs, queue and keys (\"postgresql://...\" URI or libpq "
     "key=value string; docs/cluster.md). Overridden by --database and EPHEMERAL_DATABASE."},
    {"node_name", EPH_CFG_STRING, "(the hostname)", NULL,
     "Name of this host in a cluster (runs it claims carry it)."},
    {"lease_seconds", EPH_CFG_INT, "15", "seconds",
     "A cluster node's lease on its runs: a run whose node stops renewing it for this long is "
     "ended host_lost and settled by another node."},
    {"log_level", EPH_CFG_STRING, "\"warn\"", NULL,
     "Least severe level logged to stderr: error, warn, info or debug."},
    {"backend", EPH_CFG_STRING, "\"backend-jail\"", NULL,
     "Backend plugin used when a request or command does not name one."},
    {"model_plugin", EPH_CFG_STRING, "\"model-openai\"", NULL,
     "Model plugin serving model calls; model names starting with \"replay:\" always go to "
     "model-replay (ephemerald refuses them from requests unless this is \"model-replay\"). "
     "\"model-replay\" makes every run replay model-replay's configured "
     "transcript (an offline daemon: demos, tests)."},
    {"default_model", EPH_CFG_STRING, "\"openai/gpt-6-luna\"", NULL,
     "Model used when the request does not name one (the product page's model)."},
    {"max_timeout_seconds", EPH_CFG_INT, "900", "seconds",
     "Largest timeout_seconds a request may ask for; larger requests are refused."},
    {"max_cost_micros", EPH_CFG_INT, "10000000", "micros",
     "Largest max_cost_micros (budget) a request may ask for; larger requests are refused."},
    {"max_steps", EPH_CFG_INT, "24", NULL,
     "Most model calls one run may make before it ends with reason step_limit."},
    {"max_output_tokens", EPH_CFG_INT, "4096", "tokens",
     "Output tokens each model call may produce; the call is pre-authorised at this worst "
     "case."},
    {"compute_meter_ms", EPH_CFG_INT, "2000", "ms",
     "How often sandbox compute is charged while a run lives (a crash loses at most one "
     "interval)."},
    {"retention_days", EPH_CFG_INT, "30", "days",
     "Runs and their events older than this are purged (the product page keeps 30 days)."},
    {"cli_org", EPH_CFG_STRING, "\"local\"", NULL,
     "Organisation the CLI's runs are billed to."},
    {"cli_credit_micros", EPH_CFG_INT, "10000000", "micros",
     "Credit given to cli_org the first time the CLI uses a new state directory."},
    {"pricing", EPH_CFG_GROUP, "(see below)", NULL,
     "Prices in micros: compute_micros_per_second (sandbox time) and a list `models` of "
     "{name, input_micros_per_mtok, output_micros_per_mtok, cached_input_micros_per_mtok "
     "(prompt tokens read from the provider's cache; default: the input price), "
     "cache_write_micros_per_mtok (prompt tokens written to it, Anthropic; default: the input "
     "price)}, name being the full model name with its provider prefix. Web requests are priced in the "
     "tool-web block (price_micros_per_request); sandbox limits in the backend's block."},
    {"max_inline_files_bytes", EPH_CFG_INT, "16777216", "bytes",
     "Largest total size of a request's inline files (after base64 decoding)."},
    {"egress", EPH_CFG_GROUP, "(see below)", NULL,
     "The sandbox egress proxy of runs granting web: pool (private IPv4 range the "
     "per-sandbox /30s come from, default \"10.213.0.0/16\"), port (3128), max_connections "
     "(32 open at once per run), max_bytes (per connection, 67108864), max_connection_ms "
     "(300000) and idle_ms (30000); what a connection costs, price_micros_per_request (1000, "
     "category web); and where sandboxes may go, the one place saying so (tool-web's keys "
     "govern its own host-side requests only): allow_domains, deny_domains (lists, empty: "
     "any name not denied), allowed_ports (default [80, 443]), allow_private_addresses and "
     "allow_loopback (both false); addresses of the host's interfaces are always refused."},
    {"webhooks", EPH_CFG_GROUP, "(see below)", NULL,
     "Where and how run-end webhooks are delivered (POST /v1/webhooks registers one): "
     "retry_hours (how long a failing endpoint is retried after the run ended, default 24, "
     "1..720); retry_base_ms (the first retry's delay, doubling per attempt up to an hour, "
     "default 10000); timeout_ms (one attempt, default 10000); and the address policy, read "
     "like tool-web's: allow_domains, deny_domains, allowed_ports (default [80, 443]), "
     "allow_private_addresses and allow_loopback (both false: a tenant's endpoint on the "
     "operator's own or private network is refused at registration and at every attempt; "
     "addresses of the host's interfaces are always refused)."},
    {"server", EPH_CFG_GROUP, "(see below)", NULL,
     "ephemerald's settings: listen (\"ADDR:PORT\" or \"[V6]:PORT\", default "
     "\"127.0.0.1:8080\"); max_concurrent_runs (runs executing at once, default 4); "
     "max_queued_runs (runs admitted beyond those, default 64; more are refused with 429); "
     "max_body_bytes (request body limit, default 25165824; more is 413); "
     "drain_grace_seconds (on SIGTERM, how long running runs may finish before they are "
     "cancelled, default 30); idempotency_hours (how long an Idempotency-Key is remembered, "
     "at least and by default 24); max_inflight_body_bytes (request bodies being received at "
     "once, all clients together, a declared Content-Length counting in full, default "
     "100663296; more is 503 with Retry-After); max_connections (HTTP connections open at "
     "once, default 4096, lowered to fit the open-file limit); max_connections_per_ip "
     "(connections open at once from one client address, default 64); "
     "header_timeout_seconds (a connection must send a complete request head within this, "
     "default 10); body_timeout_seconds (a request body must be complete within this after "
     "its head, default 60); idle_timeout_seconds (a connection without traffic is closed, "
     "default 60)."},
    {0},
};

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

static int
type_error(const config_setting_t *s, const char *key, eph_config_type_t want, eph_error_t *err)
{
  char where[PATH_MAX + 32];
  return eph_error_set(err, EPH_E_CONFIG, "%s: key '%s': expected %s",
                       eph_cfg_where(s, where, sizeof where), key, type_name(want));
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
  *out = config_setting_get_int64(s);
  return 0;
}

int
eph_cfg_bool(const config_setting_t *block, const char *key, int def, int *out,
             eph_error_t *err)
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
eph_cfg_string(const config_setting_t *block, const char *key, const char *def,
               const char **out, eph_error_t *err)
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

int
eph_config_check_keys(const config_setting_t *block, const eph_config_key_t *keys,
                      const char *owner, int *warnings, eph_error_t *err)
{
  if (!block)
    return 0;
  char where[PATH_MAX + 32];
  int n = config_setting_length(block);
  for (int i = 0; i < n; i++) {
    config_setting_t *s = config_setting_get_elem(block, (unsigned)i);
    const char *name = config_setting_name(s);
    if (!name)
      continue;
    if (strcmp(name, "enabled") == 0) {
      if (!type_matches(s, EPH_CFG_BOOL))
        return type_error(s, name, EPH_CFG_BOOL, err);
      continue;
    }
    if (strcmp(name, "file") == 0) {
      if (!type_matches(s, EPH_CFG_STRING))
        return type_error(s, name, EPH_CFG_STRING, err);
      continue;
    }
    const eph_config_key_t *k = keys;
    while (k && k->name && strcmp(k->name, name) != 0)
      k++;
    if (!k || !k->name) {
      eph_warn("%s: unknown key '%s' in %s (ignored)", eph_cfg_where(s, where, sizeof where),
               name, owner);
      if (warnings)
        (*warnings)++;
      continue;
    }
    if (!type_matches(s, k->type))
      return type_error(s, name, k->type, err);
  }
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
add_block(eph_config_t *c, const char *name, config_setting_t *s, bool enabled,
          const char *file, const char *where)
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
      return eph_error_set(err, EPH_E_CONFIG, "%s: duplicate block '%s' (first at %s)", where,
                           name, prev->where);
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

int
eph_config_load(eph_config_t *c, const char *main_path, const char *confd_path,
                eph_error_t *err)
{
  memset(c, 0, sizeof *c);
  int r = 0;
  struct dirent **names = NULL;
  int n_names = 0;
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
    r = eph_config_check_keys(c->core, eph_core_config_keys, "ephemeral.conf", &c->warnings,
                              err);
    if (r < 0)
      goto out;
  } else {
    if (main_path)
      eph_debug("%s: not found, using the embedded defaults", main_path);
    config_init(&c->files[0]);
    c->n_files = 1;
  }

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
