/* conf5-keys PLUGIN.so...: prints the config key table of each plugin's descriptor as
 * `ephemeral config keys` does (with the same function: block, key, type, default, unit,
 * doc, range; tab-separated; nested keys as group.key), read
 * with dlopen() alone (lazy binding: functions the plugin takes from the core are never
 * called here): no init(). The manual page documents every plugin, including one that
 * cannot start on the build machine (ledger-postgres connects to its database at init).
 * Exits 1 naming the file when one is not a loadable plugin, so no block goes missing. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"

#include <ephemeral/plugin.h>

int
main(int argc, char **argv)
{
  for (int i = 1; i < argc; i++) {
    void *h = dlopen(argv[i], RTLD_LAZY | RTLD_LOCAL);
    const eph_plugin_t *d = h ? dlsym(h, EPH_PLUGIN_SYMBOL) : NULL;
    if (!d || d->abi_major != EPH_ABI_MAJOR || !d->name) {
      fprintf(stderr, "conf5-keys: %s: not a loadable ephemeral plugin: %s\n", argv[i],
              h ? "no descriptor or another ABI" : dlerror());
      return 1;
    }
    /* The rows as the loader reads them (an ABI 1.0/1.1 plugin's shorter layout upgraded),
     * printed by the same function as `ephemeral config keys`. */
    eph_config_key_t *upgraded =
        d->abi_minor < 2 ? eph_config_keys_upgrade_1_1(d->config_keys) : NULL;
    eph_config_keys_print(stdout, d->name, upgraded ? upgraded : d->config_keys, NULL);
    free(upgraded);
    /* No dlclose: the strings printed are the plugin's; the process ends here anyway. */
  }
  return 0;
}
