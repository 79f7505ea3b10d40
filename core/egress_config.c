/* The egress proxy's configuration (core/egress.h): the core's own `egress` group, read
 * from its rows (core/conf_core.h), and the upgrade check that refuses a sandbox policy left
 * in another block. Split from egress.c, which runs the proxy. */
#include <config.h>

#include "egress.h"

#include <string.h>

#include "conf.h"
#include "log.h"
#include "util.h"

/* Does a plugin block's value of a policy key confine more than the egress default (no
 * allow list, no deny list, ports 80 and 443)? Only such a value was lost when the proxy
 * stopped reading the web plugin's block; a wider one never confined a sandbox. */
static bool
narrower_than_default(const char *key, const config_setting_t *s)
{
  if (!config_setting_is_list(s) && !config_setting_is_array(s))
    return true; /* not a list: nobody can tell what was meant */
  if (strcmp(key, "allowed_ports") != 0)
    return config_setting_length(s) > 0;
  bool has80 = false, has443 = false;
  for (int i = 0; i < config_setting_length(s); i++) {
    const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
    int type = config_setting_type(e);
    long long v =
        type == CONFIG_TYPE_INT || type == CONFIG_TYPE_INT64 ? config_setting_get_int64(e) : -1;
    has80 |= v == 80;
    has443 |= v == 443;
  }
  return !has80 || !has443;
}

int
eph_egress_check_config(const eph_config_t *config, eph_error_t *err)
{
  /* The keys the sandbox proxy used to take from another block (the web plugin's) before
   * the core's egress group was the one place. An installation upgraded with a narrowed
   * list left there would let its sandboxes reach more than it says, silently: refuse
   * until egress sets the key (to any value, the operator's decision). Generic: any block
   * carrying the key, the core names no plugin. */
  static const char *const keys[] = {"allow_domains", "deny_domains", "allowed_ports"};
  const config_setting_t *g =
      config->core ? config_setting_get_member(config->core, "egress") : NULL;
  for (size_t i = 0; i < config->n_blocks; i++) {
    const eph_config_block_t *b = &config->blocks[i];
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
      const config_setting_t *s = config_setting_get_member(b->setting, keys[k]);
      if (!s || (g && config_setting_get_member(g, keys[k])) || !narrower_than_default(keys[k], s))
        continue;
      char where[PATH_MAX + 32];
      return eph_error_set(err, EPH_E_CONFIG,
                           "%s: '%s.%s' confines only that plugin's own requests, not the "
                           "sandboxes: where sandboxes may go is ephemeral.conf's egress "
                           "group, which does not set '%s' (sandboxes would reach more than "
                           "this says). Set egress.%s in ephemeral.conf (the same value to "
                           "keep sandboxes confined; the default to allow them more)",
                           eph_cfg_where(s, where, sizeof where), b->name, keys[k], keys[k],
                           keys[k]);
    }
  }
  return 0;
}

int
eph_egress_load_config(const eph_config_t *config, const eph_host_t *host,
                       eph_egress_options_t *opt, eph_net_policy_t *policy, eph_error_t *err)
{
  /* Checked against their rows' ranges by eph_config_load (core/conf_core.h). */
  const eph_egress_conf_t *v = &eph_config_values(config)->egress;
  memset(opt, 0, sizeof *opt);
  int r;
  if ((r = eph_egress_check_config(config, err)) < 0)
    return r;
  opt->pool = v->pool;
  opt->max_bytes = v->max_bytes;
  opt->max_connection_ms = v->max_connection_ms;
  opt->idle_ms = v->idle_ms;
  opt->port = (int)v->port;
  opt->max_connections = (int)v->max_connections;
  opt->price_micros = v->price_micros_per_request;
  /* Where sandboxes may go is said here, in the core's own block, and nowhere else: the
   * core reads no plugin's configuration (a web tool's own keys govern only the requests
   * it makes on the host). The policy's lists are read from the block itself (their
   * rows only check their type). */
  const config_setting_t *g =
      config->core ? config_setting_get_member(config->core, "egress") : NULL;
  return eph_net_policy_load(policy, host, g, err);
}
