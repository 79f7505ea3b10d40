/* Configuration loading: ephemeral.conf + conf.d order, file:line errors, key tables. */
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
#include "log.h"
#include "util.h"

static char dir[256];

static void
write_file(const char *rel, const char *text)
{
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, rel);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static int
setup(void **state)
{
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/eph-test-config-XXXXXX");
  assert_non_null(mkdtemp(dir));
  char confd[300];
  snprintf(confd, sizeof confd, "%s/conf.d", dir);
  assert_int_equal(mkdir(confd, 0700), 0);
  return 0;
}

static int
teardown(void **state)
{
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
  return 0;
}

static int
load(eph_config_t *c, eph_error_t *err)
{
  char main_path[300], confd[300];
  snprintf(main_path, sizeof main_path, "%s/ephemeral.conf", dir);
  snprintf(confd, sizeof confd, "%s/conf.d", dir);
  return eph_config_load(c, main_path, confd, err);
}

static void
test_lexical_order_and_blocks(void **state)
{
  (void)state;
  write_file("ephemeral.conf", "max_steps = 7;\n");
  write_file("conf.d/20-b.conf", "beta: { enabled = true; };\n");
  write_file("conf.d/10-a.conf", "alpha: { enabled = false; file = \"x.so\"; };\n");
  write_file("conf.d/README", "not a conf file: ignored\n");
  eph_config_t c;
  eph_error_t err = {0};
  assert_int_equal(load(&c, &err), 0);
  assert_int_equal(c.n_blocks, 2);
  assert_string_equal(c.blocks[0].name, "alpha");
  assert_false(c.blocks[0].enabled);
  assert_string_equal(c.blocks[0].file, "x.so");
  assert_string_equal(c.blocks[1].name, "beta");
  assert_true(c.blocks[1].enabled);
  assert_string_equal(c.blocks[1].file, "beta.so");
  int64_t steps = 0;
  assert_int_equal(eph_cfg_int(c.core, "max_steps", 24, &steps, &err), 0);
  assert_int_equal(steps, 7);
  eph_config_free(&c);
}

static void
test_syntax_error_names_file_and_line(void **state)
{
  (void)state;
  write_file("conf.d/10-bad.conf", "ok: { enabled = true; };\n\nbroken: { enabled = ; };\n");
  eph_config_t c;
  eph_error_t err = {0};
  assert_true(load(&c, &err) < 0);
  assert_int_equal(err.code, EPH_E_CONFIG);
  assert_non_null(strstr(err.message, "10-bad.conf:3:"));
}

static void
test_main_file_syntax_error(void **state)
{
  (void)state;
  write_file("ephemeral.conf", "max_steps = 3;\nlog_level = ;\n");
  eph_config_t c;
  eph_error_t err = {0};
  assert_true(load(&c, &err) < 0);
  assert_non_null(strstr(err.message, "ephemeral.conf:2:"));
}

static void
test_type_error_names_file_and_line(void **state)
{
  (void)state;
  write_file("ephemeral.conf", "\nmax_steps = \"many\";\n");
  eph_config_t c;
  eph_error_t err = {0};
  assert_true(load(&c, &err) < 0);
  assert_non_null(strstr(err.message, "ephemeral.conf:2: key 'max_steps': expected an integer"));
}

static void
test_unknown_key_is_a_warning(void **state)
{
  (void)state;
  write_file("ephemeral.conf", "max_steps = 3;\nmax_stesp = 4;\n");
  eph_config_t c;
  eph_error_t err = {0};
  assert_int_equal(load(&c, &err), 0);
  assert_int_equal(c.warnings, 1);
  eph_config_free(&c);
}

static void
test_duplicate_block(void **state)
{
  (void)state;
  write_file("conf.d/10-a.conf", "same: { enabled = true; };\n");
  write_file("conf.d/20-b.conf", "\nsame: { enabled = true; };\n");
  eph_config_t c;
  eph_error_t err = {0};
  assert_true(load(&c, &err) < 0);
  assert_non_null(strstr(err.message, "20-b.conf:2: duplicate block 'same'"));
  assert_non_null(strstr(err.message, "10-a.conf:1"));
}

static void
test_plugin_key_table(void **state)
{
  (void)state;
  write_file("conf.d/10-p.conf", "p: {\n enabled = true;\n size = 3;\n colour = \"red\";\n};\n");
  eph_config_t c;
  eph_error_t err = {0};
  assert_int_equal(load(&c, &err), 0);
  const eph_config_key_t keys[] = {{"size", EPH_CFG_STRING, "\"s\"", NULL, "doc"}, {0}};
  int warnings = 0;
  assert_true(eph_config_check_keys(c.blocks[0].setting, keys, "p", &warnings, &err) < 0);
  assert_non_null(strstr(err.message, "10-p.conf:3: key 'size': expected a string"));
  const eph_config_key_t keys2[] = {{"size", EPH_CFG_INT, "1", NULL, "doc"}, {0}};
  assert_int_equal(eph_config_check_keys(c.blocks[0].setting, keys2, "p", &warnings, &err), 0);
  assert_int_equal(warnings, 1); /* colour */
  eph_config_free(&c);
}

/* A missing conf.d is an error naming it, never a built-in plugin set (a staged or
 * relocated binary pointed at a directory that is not there must not run anyway). A
 * missing ephemeral.conf beside an existing conf.d still means the core's defaults. */
static void
test_missing_confd_is_an_error(void **state)
{
  (void)state;
  eph_config_t c;
  eph_error_t err = {0};
  assert_true(eph_config_load(&c, "/nonexistent/ephemeral.conf", "/nonexistent/conf.d", &err) < 0);
  assert_non_null(strstr(err.message, "/nonexistent/conf.d"));
  assert_non_null(strstr(err.message, "does not exist"));
  assert_int_equal(c.n_blocks, 0);

  char path[512], confd[512];
  snprintf(path, sizeof path, "%s/ephemeral.conf", dir);
  snprintf(confd, sizeof confd, "%s/conf.d", dir);
  err = (eph_error_t){0};
  write_file("ephemeral.conf", "max_steps = 3;\n");
  assert_true(eph_config_load(&c, NULL, path, &err) < 0); /* a file is not a conf.d */
  assert_non_null(strstr(err.message, "is not a directory"));

  write_file("conf.d/10-a.conf", "alpha: { enabled = true; };\n");
  assert_int_equal(eph_config_load(&c, "/nonexistent/ephemeral.conf", confd, &err), 0);
  assert_null(c.main_path);
  assert_int_equal(c.n_blocks, 1);
  assert_true(eph_config_block(&c, "alpha")->enabled);
  eph_config_free(&c);
}

static void
test_every_core_key_documented(void **state)
{
  (void)state;
  for (const eph_config_key_t *k = eph_core_config_keys; k->name; k++) {
    assert_non_null(k->doc);
    assert_true(strlen(k->doc) > 10);
    assert_non_null(k->default_text);
  }
}

int
main(void)
{
  eph_log_set_level(EPH_LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_lexical_order_and_blocks, setup, teardown),
      cmocka_unit_test_setup_teardown(test_syntax_error_names_file_and_line, setup, teardown),
      cmocka_unit_test_setup_teardown(test_main_file_syntax_error, setup, teardown),
      cmocka_unit_test_setup_teardown(test_type_error_names_file_and_line, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unknown_key_is_a_warning, setup, teardown),
      cmocka_unit_test_setup_teardown(test_duplicate_block, setup, teardown),
      cmocka_unit_test_setup_teardown(test_plugin_key_table, setup, teardown),
      cmocka_unit_test_setup_teardown(test_missing_confd_is_an_error, setup, teardown),
      cmocka_unit_test(test_every_core_key_documented),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
