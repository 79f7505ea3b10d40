/* The configuration is documented from one source: the key tables (eph_core_config_keys and
 * each plugin descriptor's config_keys) that the loader checks conf files against, and from
 * which ephemeral.conf(5) is generated. This test holds the three ends together:
 *   (a) every key in the tables has a type, a default and a description;
 *   (b) every key the shipped ephemeral.conf and conf.d/NN-NAME.conf files use is in the tables,
 * with the right type, and every key nested in a group is named by that group's description; (c)
 * the generated manual page (build tree docs/man/ephemeral.conf.5) carries every key of every table
 * under its block's section; (d) every value the shipped ephemeral.conf sets is its row's default
 * (the file says so); (e) the page carries every nested key (GROUP.KEY) and every row's range. The
 * plugins are the real ones of the build tree (plugins/.libs/NAME.so), opened with dlopen. */
#include <config.h>

#include <dirent.h>
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <libconfig.h>

#include "conf.h"
#include "util.h"

typedef struct table {
  char *block; /* "ephemeral.conf" or the plugin's name */
  const eph_config_key_t *keys;
  void *dl;
} table_t;

static table_t tables[64];
static size_t n_tables;
static int failures;

static const char *
env_dir(const char *name)
{
  const char *v = getenv(name);
  return v && *v ? v : ".";
}

static int
so_filter(const struct dirent *d)
{
  size_t n = strlen(d->d_name);
  return n > 3 && strcmp(d->d_name + n - 3, ".so") == 0;
}

static int
setup(void **state)
{
  (void)state;
  tables[n_tables++] = (table_t){eph_xstrdup("ephemeral.conf"), eph_core_config_keys, NULL};
  cleanup_free char *dir = eph_xasprintf("%s/plugins/.libs", env_dir("EPH_BUILDDIR"));
  struct dirent **names = NULL;
  int n = scandir(dir, &names, so_filter, alphasort);
  for (int i = 0; i < n; i++) {
    cleanup_free char *path = eph_xasprintf("%s/%s", dir, names[i]->d_name);
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    const eph_plugin_t *p = dl ? dlsym(dl, EPH_PLUGIN_SYMBOL) : NULL;
    if (!p) {
      print_error("%s: %s\n", path, dl ? "no eph_plugin descriptor" : dlerror());
      failures++;
    } else if (n_tables < sizeof tables / sizeof tables[0]) {
      tables[n_tables++] = (table_t){eph_xstrdup(p->name), p->config_keys, dl};
      dl = NULL;
    }
    if (dl)
      dlclose(dl);
    free(names[i]);
  }
  free(names);
  return 0;
}

static int
teardown(void **state)
{
  (void)state;
  for (size_t i = 0; i < n_tables; i++) {
    free(tables[i].block);
    if (tables[i].dl)
      dlclose(tables[i].dl);
  }
  return 0;
}

static const table_t *
find_table(const char *block)
{
  for (size_t i = 0; i < n_tables; i++)
    if (strcmp(tables[i].block, block) == 0)
      return &tables[i];
  return NULL;
}

static const eph_config_key_t *
find_key(const eph_config_key_t *keys, const char *name)
{
  for (const eph_config_key_t *k = keys; k && k->name; k++)
    if (strcmp(k->name, name) == 0)
      return k;
  return NULL;
}

static bool
empty(const char *s)
{
  return !s || !*s;
}

/* (a) */
static void
every_key_is_documented(void **state)
{
  (void)state;
  int bad = failures;
  /* The core and at least the plugins every build has (configure enables all by default). */
  assert_true(n_tables >= 2);
  for (size_t i = 0; i < n_tables; i++) {
    for (const eph_config_key_t *k = tables[i].keys; k && k->name; k++) {
      if (empty(k->name) || k->type < EPH_CFG_BOOL || k->type > EPH_CFG_GROUP ||
          empty(k->default_text) || empty(k->doc)) {
        print_error("%s: key '%s': type, default or doc missing\n", tables[i].block, k->name);
        bad++;
      }
      if (find_key(tables[i].keys, k->name) != k) {
        print_error("%s: key '%s' listed twice\n", tables[i].block, k->name);
        bad++;
      }
      if (strcmp(k->name, "enabled") == 0 || strcmp(k->name, "file") == 0) {
        print_error("%s: key '%s' is reserved for every block\n", tables[i].block, k->name);
        bad++;
      }
    }
  }
  assert_int_equal(bad, 0);
}

/* True when name appears in text as a whole word ([a-z0-9_] around it do not count). */
static bool
names_word(const char *text, const char *name)
{
  size_t n = strlen(name);
  for (const char *p = text; (p = strstr(p, name)); p++) {
    bool before = p > text && (p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z') ||
                               (p[-1] >= '0' && p[-1] <= '9'));
    char c = p[n];
    bool after = c == '_' || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (!before && !after)
      return true;
  }
  return false;
}

/* Every named setting below a group key must be named by the key's doc. */
static int
check_nested(const config_setting_t *s, const eph_config_key_t *k, const char *block)
{
  int bad = 0;
  int n = config_setting_length(s);
  for (int i = 0; i < n; i++) {
    const config_setting_t *c = config_setting_get_elem(s, (unsigned)i);
    const char *name = config_setting_name(c);
    if (name && !names_word(k->doc, name)) {
      print_error("%s:%u: %s: '%s' inside '%s' is not named by the documentation of '%s'\n",
                  config_setting_source_file(c), config_setting_source_line(c), block, name,
                  k->name, k->name);
      bad++;
    }
    if (config_setting_is_aggregate(c))
      bad += check_nested(c, k, block);
  }
  return bad;
}

static int
check_block(const config_setting_t *block, const table_t *t)
{
  eph_error_t err = {0};
  int warnings = 0;
  int bad = 0;
  /* The loader's own check: wrong type = error, unknown key = warning. */
  if (eph_config_check_keys(block, t->keys, t->block, &warnings, &err) < 0) {
    print_error("%s\n", err.message);
    bad++;
  }
  bad += warnings;
  int n = config_setting_length(block);
  for (int i = 0; i < n; i++) {
    const config_setting_t *s = config_setting_get_elem(block, (unsigned)i);
    const eph_config_key_t *k = find_key(t->keys, config_setting_name(s));
    if (k && k->type == EPH_CFG_GROUP)
      bad += check_nested(s, k, t->block);
    if (k && k->type == EPH_CFG_LIST)
      for (int j = 0; j < config_setting_length(s); j++)
        if (config_setting_is_aggregate(config_setting_get_elem(s, (unsigned)j)))
          bad += check_nested(config_setting_get_elem(s, (unsigned)j), k, t->block);
  }
  return bad;
}

static int
read_conf(config_t *cfg, const char *path)
{
  config_init(cfg);
  if (config_read_file(cfg, path) == CONFIG_TRUE)
    return 0;
  print_error("%s:%d: %s\n", path, config_error_line(cfg), config_error_text(cfg));
  config_destroy(cfg);
  return -1;
}

static int
conf_filter(const struct dirent *d)
{
  size_t n = strlen(d->d_name);
  return d->d_name[0] != '.' && n > 5 && strcmp(d->d_name + n - 5, ".conf") == 0;
}

/* (b) */
static void
shipped_files_use_only_documented_keys(void **state)
{
  (void)state;
  const char *src = env_dir("EPH_SRCDIR");
  int bad = 0, blocks = 0;
  config_t cfg;
  cleanup_free char *main_conf = eph_xasprintf("%s/ephemeral.conf", src);
  assert_int_equal(read_conf(&cfg, main_conf), 0);
  bad += check_block(config_root_setting(&cfg), find_table("ephemeral.conf"));
  config_destroy(&cfg);

  cleanup_free char *confd = eph_xasprintf("%s/conf.d", src);
  struct dirent **names = NULL;
  int n = scandir(confd, &names, conf_filter, alphasort);
  assert_true(n > 0);
  for (int i = 0; i < n; i++) {
    cleanup_free char *path = eph_xasprintf("%s/%s", confd, names[i]->d_name);
    free(names[i]);
    if (read_conf(&cfg, path) < 0) {
      bad++;
      continue;
    }
    config_setting_t *root = config_root_setting(&cfg);
    for (int j = 0; j < config_setting_length(root); j++) {
      config_setting_t *b = config_setting_get_elem(root, (unsigned)j);
      const table_t *t = find_table(config_setting_name(b));
      if (!t) {
        /* A plugin configure was told not to build: its file cannot be checked here. */
        printf("# %s: plugin '%s' not built, its block is not checked\n", path,
               config_setting_name(b));
        continue;
      }
      blocks++;
      bad += check_block(b, t);
    }
    config_destroy(&cfg);
  }
  free(names);
  assert_true(blocks > 0);
  assert_int_equal(bad, 0);
}

/* The page's spelling of a name: troff needs '-' as "\-". */
static char *
troff_name(const char *s)
{
  char *out = eph_xcalloc(2 * strlen(s) + 1, 1);
  char *o = out;
  for (; *s; s++) {
    if (*s == '-')
      *o++ = '\\';
    *o++ = *s;
  }
  return out;
}

/* (c) */
static void
manual_page_carries_every_key(void **state)
{
  (void)state;
  cleanup_free char *path = eph_xasprintf("%s/docs/man/ephemeral.conf.5", env_dir("EPH_BUILDDIR"));
  FILE *f = fopen(path, "r");
  if (!f)
    fail_msg("%s: cannot open (it is generated by `make`)", path);
  /* Collect the page's (section, key) pairs. */
  char line[4096], section[256] = "";
  char **pairs = NULL;
  size_t n_pairs = 0;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    if (strncmp(line, ".SS ", 4) == 0) {
      size_t len = strcspn(line + 4, " ");
      if (len >= sizeof section)
        len = sizeof section - 1;
      memcpy(section, line + 4, len);
      section[len] = '\0';
    } else if (strncmp(line, ".B ", 3) == 0 && *section) {
      pairs = eph_xrealloc(pairs, (n_pairs + 1) * sizeof *pairs);
      pairs[n_pairs++] = eph_xasprintf("%s %s", section, line + 3);
    }
  }
  fclose(f);
  int bad = 0, keys = 0;
  for (size_t i = 0; i < n_tables; i++) {
    for (const eph_config_key_t *k = tables[i].keys; k && k->name; k++) {
      cleanup_free char *b = troff_name(tables[i].block);
      cleanup_free char *kn = troff_name(k->name);
      cleanup_free char *want = eph_xasprintf("%s %s", b, kn);
      bool found = false;
      for (size_t j = 0; j < n_pairs && !found; j++)
        found = strcmp(pairs[j], want) == 0;
      if (!found) {
        print_error("%s: no entry for %s key '%s'\n", path, tables[i].block, k->name);
        bad++;
      }
      keys++;
    }
  }
  for (size_t j = 0; j < n_pairs; j++)
    free(pairs[j]);
  free(pairs);
  assert_true(keys > 0);
  assert_int_equal(bad, 0);
}

/* (d) The shipped ephemeral.conf says its values are the embedded defaults: each value it
 * sets (nested groups included, list elements aside) equals its row's default, so the file
 * and the table cannot drift apart. */
static int
values_are_defaults(const config_setting_t *g, const eph_config_key_t *keys, const char *prefix)
{
  int bad = 0;
  for (int i = 0; i < config_setting_length(g); i++) {
    const config_setting_t *s = config_setting_get_elem(g, (unsigned)i);
    const eph_config_key_t *k = find_key(keys, config_setting_name(s));
    if (!k)
      continue; /* (b) reports it */
    cleanup_free char *value = NULL;
    switch (config_setting_type(s)) {
    case CONFIG_TYPE_INT:
    case CONFIG_TYPE_INT64:
      value = eph_xasprintf("%lld", (long long)config_setting_get_int64(s));
      break;
    case CONFIG_TYPE_STRING:
      value = eph_xasprintf("\"%s\"", config_setting_get_string(s));
      break;
    case CONFIG_TYPE_BOOL:
      value = eph_xstrdup(config_setting_get_bool(s) ? "true" : "false");
      break;
    case CONFIG_TYPE_GROUP:
      if (k->keys) {
        cleanup_free char *sub = eph_xasprintf("%s%s.", prefix, k->name);
        bad += values_are_defaults(s, k->keys, sub);
      }
      continue;
    default:
      continue;
    }
    if (k->default_text[0] != '(' && strcmp(value, k->default_text) != 0) {
      print_error("%s:%u: %s%s = %s, but its row's default is %s\n", config_setting_source_file(s),
                  config_setting_source_line(s), prefix, k->name, value, k->default_text);
      bad++;
    }
  }
  return bad;
}

static void
shipped_ephemeral_conf_states_the_defaults(void **state)
{
  (void)state;
  config_t cfg;
  cleanup_free char *main_conf = eph_xasprintf("%s/ephemeral.conf", env_dir("EPH_SRCDIR"));
  assert_int_equal(read_conf(&cfg, main_conf), 0);
  int bad = values_are_defaults(config_root_setting(&cfg), eph_core_config_keys, "");
  config_destroy(&cfg);
  assert_int_equal(bad, 0);
}

/* (e) The page carries every nested key of the core's groups as GROUP.KEY and every range
 * of every row, as the rows say it. */
static int
page_has(const char *page, const char *needle, const char *what)
{
  if (strstr(page, needle))
    return 0;
  print_error("docs/man/ephemeral.conf.5: no %s\n", what);
  return 1;
}

static int
page_rows(const char *page, const eph_config_key_t *keys, const char *prefix, int *ranges)
{
  int bad = 0;
  for (const eph_config_key_t *k = keys; k && k->name; k++) {
    cleanup_free char *name = eph_xasprintf("%s%s", prefix, k->name);
    if (*prefix) {
      cleanup_free char *tn = troff_name(name);
      cleanup_free char *b = eph_xasprintf("\n.B %s\n", tn);
      bad += page_has(page, b, name);
    }
    if (k->has_range) {
      char range[128];
      eph_config_range_text(k, range, sizeof range);
      cleanup_free char *tr = troff_name(range);
      cleanup_free char *want = eph_xasprintf("range %s)", tr);
      bad += page_has(page, want, want);
      (*ranges)++;
    }
    if (k->keys) {
      cleanup_free char *sub = eph_xasprintf("%s.", name);
      bad += page_rows(page, k->keys, sub, ranges);
    }
  }
  return bad;
}

static void
manual_page_shows_nested_keys_and_ranges(void **state)
{
  (void)state;
  cleanup_free char *path = eph_xasprintf("%s/docs/man/ephemeral.conf.5", env_dir("EPH_BUILDDIR"));
  char *page = NULL;
  size_t len = 0;
  eph_error_t err = {0};
  if (eph_read_file(path, 1 << 22, &page, &len, &err) < 0)
    fail_msg("%s", err.message);
  int ranges = 0, bad = 0;
  for (size_t i = 0; i < n_tables; i++)
    bad += page_rows(page, tables[i].keys, "", &ranges);
  free(page);
  assert_true(ranges > 20);
  assert_int_equal(bad, 0);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_key_is_documented),
      cmocka_unit_test(shipped_files_use_only_documented_keys),
      cmocka_unit_test(manual_page_carries_every_key),
      cmocka_unit_test(shipped_ephemeral_conf_states_the_defaults),
      cmocka_unit_test(manual_page_shows_nested_keys_and_ranges),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
