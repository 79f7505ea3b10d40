/* conf5-keys PLUGIN.so...: prints the config key table of each plugin's descriptor as
 * `ephemeral config keys` does (block, key, type, default, unit, doc; tab-separated), read
 * with dlopen() alone (lazy binding: functions the plugin takes from the core are never
 * called here): no init(). The manual page documents every plugin, including one that
 * cannot start on the build machine (ledger-postgres connects to its database at init).
 * Exits 1 naming the file when one is not a loadable plugin, so no block goes missing. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include <ephemeral/plugin.h>

static const char *
type_word(eph_config_type_t t)
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
    for (const eph_config_key_t *k = d->config_keys; k && k->name; k++)
      printf("%s\t%s\t%s\t%s\t%s\t%s\n", d->name, k->name, type_word(k->type),
             k->default_text ? k->default_text : "", k->unit ? k->unit : "",
             k->doc ? k->doc : "");
    /* No dlclose: the strings printed are the plugin's; the process ends here anyway. */
  }
  return 0;
}
