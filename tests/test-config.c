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

/* Runs load() with warnings written to a file instead of stderr; returns load's result and
 * the warnings text in out (static buffer). */
static int
load_capturing(eph_config_t *c, eph_error_t *err, char *out, size_t size)
{
  char path[300];
  snprintf(path, sizeof path, "%s/stderr.txt", dir);
  fflush(stderr);
  int saved = dup(2);
  FILE *f = fopen(path, "w+");
  assert_non_null(f);
  dup2(fileno(f), 2);
  eph_log_set_level(EPH_LOG_WARN);
  int r = load(c, err);
  eph_log_set_level(EPH_LOG_ERROR);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  rewind(f);
  size_t n = fread(out, 1, size - 1, f);
  out[n] = '\0';
  fclose(f);
  return r;
}

/* Unknown keys inside the core's groups are reported like top-level ones: a warning naming
 * file:line and the group (config check accepted `server: { max_body_byte = 1; }` silently,
 * and the operator believed the limit was in force). */
static void
test_unknown_key_in_a_group_is_a_warning(void **state)
{
  (void)state;
  write_file("ephemeral.conf", "server: {\n  max_body_byte = 2048;\n};\n"
                               "egress: { prot = 1; };\n"
                               "pricing: {\n compute_micros_per_secnd = 1;\n"
                               " models = ( { name = \"m\"; input_micros_per_mtk = 1; "
                               "input_micros_per_mtok = 1; output_micros_per_mtok = 1; } );\n};\n"
                               "webhooks: { retry_hour = 2; };\n");
  eph_config_t c;
  eph_error_t err = {0};
  char text[4096];
  assert_int_equal(load_capturing(&c, &err, text, sizeof text), 0);
  assert_int_equal(c.warnings, 5);
  assert_non_null(strstr(text, "ephemeral.conf:2: unknown key 'max_body_byte' in server"));
  assert_non_null(strstr(text, "ephemeral.conf:4: unknown key 'prot' in egress"));
  assert_non_null(strstr(text, "ephemeral.conf:6: unknown key 'compute_micros_per_secnd' in "
                               "pricing"));
  assert_non_null(strstr(text, "ephemeral.conf:7: unknown key 'input_micros_per_mtk' in "
                               "pricing.models[0]"));
  assert_non_null(strstr(text, "ephemeral.conf:9: unknown key 'retry_hour' in webhooks"));
  /* The misspelt key did not set anything: the row's default holds. */
  assert_int_equal(c.values.server.max_body_bytes, 25165824);
  eph_config_free(&c);
}

/* Out of range and wrong type inside a group: an error naming file:line, the dotted key and
 * the allowed range with its unit. */
static void
test_group_range_and_type_errors(void **state)
{
  (void)state;
  eph_config_t c;
  eph_error_t err = {0};
  write_file("ephemeral.conf", "log_level = \"warn\";\nserver: {\n  max_body_bytes = 5;\n};\n");
  assert_true(load(&c, &err) < 0);
  assert_non_null(strstr(err.message, "ephemeral.conf:3: key 'max_body_bytes': 5 is outside "
                                      "1024..1073741824 bytes (server.max_body_bytes)"));
  err = (eph_error_t){0};
  write_file("ephemeral.conf", "egress: {\n port = 70000;\n};\n");
  assert_true(load(&c, &err) < 0);
  assert_non_null(strstr(err.message, "ephemeral.conf:2: key 'port': 70000 is outside 1..65535 "
                                      "(egress.port)"));
  err = (eph_error_t){0};
  write_file("ephemeral.conf", "webhooks: { timeout_ms = 0; };\n");
  assert_true(load(&c, &err) < 0);
  assert_non_null(strstr(err.message, "ephemeral.conf:1: key 'timeout_ms': 0 is outside "
                                      "100..120000 ms (webhooks.timeout_ms)"));
  err = (eph_error_t){0};
  write_file("ephemeral.conf", "\npricing: { models = ( { name = \"m\"; "
                               "cached_input_micros_per_mtok = -1; } ); };\n");
  assert_true(load(&c, &err) < 0);
  assert_non_null(strstr(err.message, "ephemeral.conf:2: key 'cached_input_micros_per_mtok': -1 "
                                      "is outside 0..100000000000 micros "
                                      "(pricing.models[0].cached_input_micros_per_mtok)"));
  err = (eph_error_t){0};
  write_file("ephemeral.conf", "server: {\n\n listen = 8080;\n};\n");
  assert_true(load(&c, &err) < 0);
  assert_non_null(strstr(err.message, "ephemeral.conf:3: key 'listen': expected a string "
                                      "(server.listen)"));
  err = (eph_error_t){0};
  write_file("ephemeral.conf", "pricing: { models = ( \"m\" ); };\n");
  assert_true(load(&c, &err) < 0);
  assert_non_null(strstr(err.message, "ephemeral.conf:1: key 'models': element 0: expected a "
                                      "group"));
  /* A cross-key rule still names its file:line. */
  err = (eph_error_t){0};
  write_file("ephemeral.conf", "server: {\n max_body_bytes = 4096;\n max_inflight_body_bytes = "
                               "2048;\n};\n");
  assert_true(load(&c, &err) < 0);
  assert_non_null(strstr(err.message, "ephemeral.conf:3: server.max_inflight_body_bytes"));
}

/* Every core value is parsed once: defaults from the rows, values from the file. */
static void
test_values_parsed_once(void **state)
{
  (void)state;
  eph_config_t c;
  eph_error_t err = {0};
  /* No ephemeral.conf: the embedded defaults, which are the rows' defaults. */
  assert_int_equal(load(&c, &err), 0);
  assert_null(c.core);
  assert_int_equal(c.values.max_steps, 24);
  assert_string_equal(c.values.server.listen, "127.0.0.1:8080");
  assert_null(c.values.pricing.models);
  eph_config_free(&c);
  /* A context built without loading a configuration (unit tests) reads the same defaults. */
  eph_config_t zero = {0};
  assert_int_equal(eph_config_values(&zero)->max_steps, 24);
  assert_string_equal(eph_config_values(&zero)->model_plugin, "model-openai");
  assert_int_equal(eph_config_values(NULL)->server.max_body_bytes, 25165824);
  write_file("ephemeral.conf", "max_steps = 7;\nserver: { listen = \"127.0.0.1:1\"; };\n"
                               "pricing: { models = ( { name = \"m\"; input_micros_per_mtok = 5; "
                               "output_micros_per_mtok = 6; } ); };\n");
  assert_int_equal(load(&c, &err), 0);
  assert_int_equal(c.values.max_steps, 7);
  assert_int_equal(c.values.max_output_tokens, 4096);
  assert_string_equal(c.values.log_level, "warn");
  assert_null(c.values.state_dir);
  assert_string_equal(c.values.server.listen, "127.0.0.1:1");
  assert_int_equal(c.values.server.max_concurrent_runs, 4);
  assert_int_equal(c.values.egress.port, 3128);
  assert_string_equal(c.values.egress.pool, "10.213.0.0/16");
  assert_int_equal(c.values.webhooks.retry_hours, 24);
  assert_false(c.values.webhooks.allow_loopback);
  assert_int_equal(c.values.pricing.compute_micros_per_second, 240);
  assert_int_equal(c.values.pricing.n_models, 1);
  assert_string_equal(c.values.pricing.models[0].name, "m");
  assert_int_equal(c.values.pricing.models[0].output_micros_per_mtok, 6);
  /* Derived default: cached input costs the input price. */
  assert_int_equal(c.values.pricing.models[0].cached_input_micros_per_mtok, 5);
  assert_int_equal(c.values.pricing.models[0].cache_write_micros_per_mtok, 5);
  eph_config_free(&c);
}

/* A plugin's key row with a range: the host refuses a value outside it at load (file:line,
 * the key, the range with its unit, the dotted key) and cfg_int refuses it too. 0 is a
 * legitimate bound: a row with EPH_CFG_RANGE(0, 0) accepts 0 and refuses 1; a row without
 * a range accepts anything. */
static void
test_plugin_key_range(void **state)
{
  (void)state;
  write_file("conf.d/10-p.conf", "p: {\n enabled = true;\n slots = 0;\n};\n"
                                 "q: { zero = 1; };\n"
                                 "r: { free = -5; ok = 0; };\n");
  eph_config_t c;
  eph_error_t err = {0};
  assert_int_equal(load(&c, &err), 0);
  const eph_config_key_t keys[] = {
      {"slots", EPH_CFG_INT, "1", "slots", "doc", EPH_CFG_RANGE(1, 64)},
      {"zero", EPH_CFG_INT, "0", NULL, "doc", EPH_CFG_RANGE(0, 0)},
      {"free", EPH_CFG_INT, "0", NULL, "doc"},
      {.name = "ok", .type = EPH_CFG_INT, .default_text = "0", .doc = "doc", EPH_CFG_RANGE(0, 0)},
      {0}};
  const config_setting_t *p = eph_config_block(&c, "p")->setting;
  const config_setting_t *q = eph_config_block(&c, "q")->setting;
  const config_setting_t *r = eph_config_block(&c, "r")->setting;
  int warnings = 0;
  assert_true(eph_config_check_keys(p, keys, "p", &warnings, &err) < 0);
  assert_non_null(strstr(err.message, "10-p.conf:3: key 'slots': 0 is outside 1..64 slots "
                                      "(p.slots)"));
  /* The same refusal through the getter plugins call (the host's cfg_int). */
  int64_t v = 99;
  err = (eph_error_t){0};
  assert_true(eph_cfg_int(p, "slots", 1, &v, &err) < 0);
  assert_non_null(strstr(err.message, "10-p.conf:3: key 'slots': 0 is outside 1..64 slots"));
  assert_int_equal(v, 99);
  /* 0..0 is a range: 1 is outside it. */
  err = (eph_error_t){0};
  assert_true(eph_config_check_keys(q, keys, "q", &warnings, &err) < 0);
  assert_non_null(strstr(err.message, "10-p.conf:5: key 'zero': 1 is outside 0..0 (q.zero)"));
  assert_true(eph_cfg_int(q, "zero", 0, &v, &err) < 0);
  /* No range: unchecked; 0 inside 0..0 is accepted. */
  assert_int_equal(eph_config_check_keys(r, keys, "r", &warnings, &err), 0);
  assert_int_equal(eph_cfg_int(r, "free", 0, &v, &err), 0);
  assert_int_equal(v, -5);
  assert_int_equal(eph_cfg_int(r, "ok", 3, &v, &err), 0);
  assert_int_equal(v, 0);
  /* Missing key: the plugin's default, unchecked. */
  assert_int_equal(eph_cfg_int(r, "absent", 7, &v, &err), 0);
  assert_int_equal(v, 7);
  assert_int_equal(warnings, 0);
  eph_config_free(&c);
}

/* `config keys` and ephemeral.conf(5) print the range from the row. */
static void
test_keys_print_ranges(void **state)
{
  (void)state;
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  eph_config_keys_print(f, "ephemeral.conf", eph_core_config_keys, NULL);
  fclose(f);
  assert_non_null(
      strstr(text, "ephemeral.conf\tserver.max_body_bytes\tinteger\t25165824\tbytes\t"));
  assert_non_null(strstr(text, "\t1024..1073741824 bytes\n"));
  assert_non_null(strstr(text, "ephemeral.conf\tmax_steps\tinteger\t24\t\t"));
  assert_non_null(strstr(text, "ephemeral.conf\tegress.max_bytes\tinteger\t67108864\tbytes\t"));
  assert_non_null(strstr(text, "\tat least 1 bytes\n"));
  assert_non_null(strstr(text, "ephemeral.conf\tpricing.models.cached_input_micros_per_mtok\t"));
  free(text);
}

/* A plugin built against ABI 1.0/1.1 has the shorter key rows: the loader reads them in
 * today's layout (without it the core would read every row after the first at the wrong
 * offset). */
static void
test_old_key_rows_upgraded(void **state)
{
  (void)state;
  static const struct {
    const char *name;
    eph_config_type_t type;
    const char *default_text, *unit, *doc;
  } old[] = {
      {"a", EPH_CFG_INT, "1", "ms", "doc a"}, {"b", EPH_CFG_STRING, "\"x\"", NULL, "doc b"}, {0}};
  eph_config_key_t *k = eph_config_keys_upgrade_1_1(old);
  assert_string_equal(k[0].name, "a");
  assert_string_equal(k[0].unit, "ms");
  assert_false(k[0].has_range);
  assert_null(k[0].keys);
  assert_string_equal(k[1].name, "b");
  assert_int_equal(k[1].type, EPH_CFG_STRING);
  assert_string_equal(k[1].doc, "doc b");
  assert_null(k[2].name);
  free(k);
  assert_null(eph_config_keys_upgrade_1_1(NULL));
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
      cmocka_unit_test_setup_teardown(test_unknown_key_in_a_group_is_a_warning, setup, teardown),
      cmocka_unit_test_setup_teardown(test_group_range_and_type_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_values_parsed_once, setup, teardown),
      cmocka_unit_test_setup_teardown(test_plugin_key_range, setup, teardown),
      cmocka_unit_test(test_keys_print_ranges),
      cmocka_unit_test(test_old_key_rows_upgraded),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
