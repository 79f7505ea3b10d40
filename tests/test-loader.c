/* The loader refuses bad plugins with an error naming the file and never half-loads. */
#include <config.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "conf.h"
#include "context.h"
#include "host.h"
#include "loader.h"
#include "log.h"
#include "util.h"

static char fixtures[512];
static eph_host_t host;

static char *
fixture(const char *name)
{
  return eph_xasprintf("%s/%s.so", fixtures, name);
}

static void
expect_refused(const char *name, const char *needle)
{
  eph_plugins_t ps = {0};
  eph_error_t err = {0};
  cleanup_free char *path = fixture(name);
  assert_true(eph_plugin_load_file(&ps, path, NULL, &host, NULL, &err) < 0);
  assert_non_null(strstr(err.message, path));
  if (!strstr(err.message, needle))
    fail_msg("message '%s' lacks '%s'", err.message, needle);
  assert_int_equal(ps.n, 0);
  eph_plugins_unload(&ps);
}

static void
test_good_plugin_loads(void **state)
{
  (void)state;
  eph_plugins_t ps = {0};
  eph_error_t err = {0};
  cleanup_free char *path = fixture("fixture-good");
  assert_int_equal(eph_plugin_load_file(&ps, path, NULL, &host, NULL, &err), 0);
  assert_int_equal(ps.n, 1);
  const eph_plugin_slot_t *s = eph_plugins_find(&ps, "fixture-good");
  assert_non_null(s);
  assert_int_equal(s->desc->kind, EPH_KIND_TOOL);
  assert_string_equal(s->desc->version, "1.2.3");
  assert_ptr_equal(eph_plugins_first(&ps, EPH_KIND_TOOL), s);
  assert_null(eph_plugins_first(&ps, EPH_KIND_LEDGER));
  const eph_tool_ops_t *ops = s->desc->ops;
  assert_true(EPH_OPS_HAS(ops, eph_tool_ops_t, call));
  eph_plugins_unload(&ps);
}

static void
test_abi_mismatch(void **state)
{
  (void)state;
  expect_refused("fixture-abi", "plugin ABI 99.");
}

static void
test_missing_descriptor(void **state)
{
  (void)state;
  expect_refused("fixture-nosym", "no 'eph_plugin' descriptor");
}

static void
test_failing_init(void **state)
{
  (void)state;
  expect_refused("fixture-failinit", "fixture refuses to start");
}

static void
test_unknown_kind(void **state)
{
  (void)state;
  expect_refused("fixture-badkind", "unknown kind 42");
}

/* A kind's required operation missing: refused at load, naming the file and the operation,
 * and never initialised. */
static void
test_missing_operation(void **state)
{
  (void)state;
  expect_refused("fixture-nocall",
                 "tool plugin 'fixture-nocall' lacks the required operation 'call'");
  expect_refused("fixture-ledger",
                 "ledger plugin 'fixture-ledger' lacks the required operation 'totals'");
}

static void
test_missing_file(void **state)
{
  (void)state;
  expect_refused("no-such-plugin", "cannot load");
}

static void
test_duplicate_name(void **state)
{
  (void)state;
  eph_plugins_t ps = {0};
  eph_error_t err = {0};
  cleanup_free char *good = fixture("fixture-good");
  cleanup_free char *dup = fixture("fixture-dup");
  assert_int_equal(eph_plugin_load_file(&ps, good, NULL, &host, NULL, &err), 0);
  assert_true(eph_plugin_load_file(&ps, dup, NULL, &host, NULL, &err) < 0);
  assert_non_null(strstr(err.message, dup));
  assert_non_null(strstr(err.message, "duplicate plugin name 'fixture-good'"));
  assert_int_equal(ps.n, 1);
  eph_plugins_unload(&ps);
}

static void
test_config_type_error_refuses(void **state)
{
  (void)state;
  char tmp[] = "/tmp/eph-test-loader-XXXXXX";
  assert_non_null(mkdtemp(tmp));
  cleanup_free char *path = eph_xasprintf("%s/x.conf", tmp);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("fixture-good: {\n  enabled = true;\n  greeting = 5;\n};\n", f);
  fclose(f);
  config_t cfg;
  config_init(&cfg);
  assert_int_equal(config_read_file(&cfg, path), CONFIG_TRUE);
  config_setting_t *block = config_lookup(&cfg, "fixture-good");
  eph_plugins_t ps = {0};
  eph_error_t err = {0};
  cleanup_free char *so = fixture("fixture-good");
  assert_true(eph_plugin_load_file(&ps, so, block, &host, NULL, &err) < 0);
  assert_non_null(strstr(err.message, "x.conf:3: key 'greeting': expected a string"));
  assert_int_equal(ps.n, 0);
  config_destroy(&cfg);
  unlink(path);
  rmdir(tmp);
}

/* A configured plugin directory that does not exist is one error naming it; nothing is
 * loaded (not one "cannot load" per plugin and a daemon serving without them). */
static void
test_missing_plugin_dir(void **state)
{
  (void)state;
  char tmp[] = "/tmp/eph-test-loader-XXXXXX";
  assert_non_null(mkdtemp(tmp));
  cleanup_free char *confd = eph_xasprintf("%s/conf.d", tmp);
  cleanup_free char *conf = eph_xasprintf("%s/10-good.conf", confd);
  cleanup_free char *missing = eph_xasprintf("%s/no-such-plugins", tmp);
  assert_int_equal(mkdir(confd, 0700), 0);
  FILE *f = fopen(conf, "w");
  assert_non_null(f);
  fputs("fixture-good: { enabled = true; };\n", f);
  fclose(f);
  eph_config_t cfg;
  eph_error_t err = {0};
  assert_int_equal(eph_config_load(&cfg, NULL, confd, &err), 0);
  eph_plugins_t ps = {0};
  assert_true(eph_plugins_load(&ps, &cfg, missing, &host, &err) < 0);
  if (!strstr(err.message, missing) || !strstr(err.message, "fixture-good"))
    fail_msg("message '%s' lacks the directory or the plugin", err.message);
  assert_int_equal(ps.n, 0);
  eph_plugins_unload(&ps);
  /* The same blocks from the real directory load. */
  err = (eph_error_t){0};
  assert_int_equal(eph_plugins_load(&ps, &cfg, fixtures, &host, &err), 0);
  assert_int_equal(ps.n, 1);
  eph_plugins_unload(&ps);
  eph_config_free(&cfg);
  unlink(conf);
  rmdir(confd);
  rmdir(tmp);
}

int
main(void)
{
  eph_log_set_level(EPH_LOG_ERROR);
  const char *b = getenv("EPH_BUILDDIR");
  snprintf(fixtures, sizeof fixtures, "%s/tests/fixtures/.libs", b ? b : ".");
  eph_ctx_t ctx = {0};
  ctx.state_dir = "/tmp";
  eph_host_init(&host, &ctx);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_good_plugin_loads),  cmocka_unit_test(test_abi_mismatch),
      cmocka_unit_test(test_missing_descriptor), cmocka_unit_test(test_failing_init),
      cmocka_unit_test(test_unknown_kind),       cmocka_unit_test(test_missing_file),
      cmocka_unit_test(test_duplicate_name),     cmocka_unit_test(test_config_type_error_refuses),
      cmocka_unit_test(test_missing_operation),  cmocka_unit_test(test_missing_plugin_dir),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
