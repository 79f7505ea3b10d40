/* Request v1 parsing: every field, every invalid shape names its field; nothing is
 * clamped. */
#include <config.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <string.h>

#include "loader.h"
#include "request.h"
#include "util.h"

static const eph_request_limits_t limits = {
    .max_timeout_seconds = 900,
    .max_cost_micros = 10000000,
    .max_files_total_bytes = 64,
    .default_model = "openai/gpt-6-luna",
};

#define BASE "\"prompt\":\"hi\",\"timeout_seconds\":120,\"max_cost_micros\":40000"

static void
expect_field(const char *json, const char *field, const char *needle)
{
  eph_request_t req;
  eph_error_t err = {0};
  const char *got = NULL;
  int r = eph_request_parse(json, strlen(json), &limits, &req, &got, &err);
  if (r >= 0)
    fail_msg("accepted: %s", json);
  if (!got || strcmp(got, field) != 0)
    fail_msg("field %s, want %s (%s) for %s", got ? got : "(none)", field, err.message, json);
  if (needle && !strstr(err.message, needle))
    fail_msg("message '%s' lacks '%s'", err.message, needle);
  char want[128];
  snprintf(want, sizeof want, "field '%s'", field);
  assert_non_null(strstr(err.message, want));
}

static void
test_product_page_request(void **state)
{
  (void)state;
  cleanup_free char *json = NULL;
  size_t len = 0;
  eph_error_t err = {0};
  cleanup_free char *path =
      eph_xasprintf("%s/examples/sandbox-proof/request.json", getenv("EPH_SRCDIR"));
  assert_int_equal(eph_read_file(path, 1 << 20, &json, &len, &err), 0);
  eph_request_t req;
  assert_int_equal(eph_request_parse(json, len, &limits, &req, NULL, &err), 0);
  assert_true(req.shell);
  assert_false(req.web);
  assert_false(req.files_granted);
  assert_int_equal(req.timeout_seconds, 120);
  assert_int_equal(req.max_cost_micros, 40000);
  assert_string_equal(req.model, "openai/gpt-6-luna");
  assert_non_null(strstr(req.prompt, "first 15 prime numbers"));
  eph_request_free(&req);
}

static void
test_full_request(void **state)
{
  (void)state;
  const char *json =
      "{" BASE ",\"model\":\"m\",\"web\":true,\"shell\":false,\"zero_data_retention\":true,"
      "\"files\":[{\"path\":\"a/b.txt\",\"content\":\"hey\"},"
      "{\"path\":\"bin\",\"content\":\"AAEC/w==\",\"encoding\":\"base64\"}],"
      "\"connections\":[\"github\",{\"name\":\"crm\",\"methods\":[\"get\"]}],"
      "\"outputs\":[\"out.txt\"],\"metadata\":{\"team\":\"x\"}}";
  eph_request_t req;
  eph_error_t err = {0};
  assert_int_equal(eph_request_parse(json, strlen(json), &limits, &req, NULL, &err), 0);
  assert_true(req.web);
  assert_true(req.files_granted);
  assert_int_equal(req.n_files, 2);
  assert_int_equal(req.files[1].bytes, 4);
  assert_memory_equal(req.files[1].data, "\x00\x01\x02\xff", 4);
  assert_int_equal(req.n_connections, 2);
  assert_null(req.connections[0].methods);
  assert_string_equal(req.connections[1].methods[0], "GET");
  json_object *o = eph_request_to_json(&req);
  /* Zero data retention: the prompt and file names are not in the stored request. */
  assert_false(json_object_object_get_ex(o, "prompt", NULL));
  json_object_put(o);
  eph_request_free(&req);
}

static void
test_invalid_fields(void **state)
{
  (void)state;
  expect_field("{\"timeout_seconds\":120,\"max_cost_micros\":1}", "prompt", "required");
  expect_field("{\"prompt\":\"\",\"timeout_seconds\":120,\"max_cost_micros\":1}", "prompt", NULL);
  expect_field("{\"prompt\":5,\"timeout_seconds\":120,\"max_cost_micros\":1}", "prompt",
               "expected a string");
  expect_field("{\"prompt\":\"x\",\"max_cost_micros\":1}", "timeout_seconds", "required");
  expect_field("{\"prompt\":\"x\",\"timeout_seconds\":1}", "max_cost_micros", "required");
  expect_field("{" BASE ",\"bogus\":1}", "bogus", "unknown field");
  expect_field("{" BASE ",\"model\":7}", "model", "expected a string");
  expect_field("{" BASE ",\"model\":\"\"}", "model", NULL);
  expect_field("{" BASE ",\"web\":\"yes\"}", "web", "expected a boolean");
  expect_field("{" BASE ",\"shell\":1}", "shell", "expected a boolean");
  expect_field("{" BASE ",\"zero_data_retention\":null}", "zero_data_retention", NULL);
  expect_field("{\"prompt\":\"x\",\"timeout_seconds\":0,\"max_cost_micros\":1}", "timeout_seconds",
               "at least 1");
  expect_field("{\"prompt\":\"x\",\"timeout_seconds\":901,\"max_cost_micros\":1}",
               "timeout_seconds", "not clamped");
  expect_field("{\"prompt\":\"x\",\"timeout_seconds\":1.5,\"max_cost_micros\":1}",
               "timeout_seconds", "expected an integer");
  /* json-c takes these even in strict mode; the error names them (not "a fraction"). */
  expect_field("{\"prompt\":\"x\",\"timeout_seconds\":NaN,\"max_cost_micros\":1}",
               "timeout_seconds", "got NaN, Infinity or a number out of range");
  expect_field("{\"prompt\":\"x\",\"timeout_seconds\":10,\"max_cost_micros\":-Infinity}",
               "max_cost_micros", "(not JSON: RFC 8259 section 6)");
  expect_field("{\"prompt\":\"x\",\"timeout_seconds\":1e999,\"max_cost_micros\":1}",
               "timeout_seconds", "got NaN, Infinity");
  expect_field("{\"prompt\":\"x\",\"timeout_seconds\":10,\"max_cost_micros\":0}", "max_cost_micros",
               "at least 1");
  expect_field("{\"prompt\":\"x\",\"timeout_seconds\":10,\"max_cost_micros\":10000001}",
               "max_cost_micros", "operator's maximum");
  expect_field("{" BASE ",\"files\":{}}", "files", "expected an array");
  expect_field("{" BASE ",\"files\":[1]}", "files[0]", "expected an object");
  /* A path alone, as one might guess: the error says what a file is. */
  expect_field("{" BASE ",\"files\":[\"/etc/passwd\"]}", "files[0]",
               "expected an object {\"path\", \"content\"[, \"encoding\"]}");
  expect_field("{" BASE ",\"files\":[{\"content\":\"x\"}]}", "files[0].path", "required");
  expect_field("{" BASE ",\"files\":[{\"path\":\"../x\",\"content\":\"x\"}]}", "files[0].path",
               "relative path");
  expect_field("{" BASE ",\"files\":[{\"path\":\"/etc/x\",\"content\":\"x\"}]}", "files[0].path",
               NULL);
  expect_field("{" BASE ",\"files\":[{\"path\":\"a\"}]}", "files[0].content", "required");
  expect_field("{" BASE
               ",\"files\":[{\"path\":\"a\",\"content\":\"@@@\",\"encoding\":\"base64\"}]}",
               "files[0].content", "invalid base64");
  expect_field("{" BASE ",\"files\":[{\"path\":\"a\",\"content\":\"x\",\"encoding\":\"rot13\"}]}",
               "files[0].encoding", NULL);
  expect_field("{" BASE ",\"files\":[{\"path\":\"a\",\"content\":\"x\",\"mode\":1}]}",
               "files[0].mode", "unknown field (a file has path, content, encoding)");
  expect_field(
      "{" BASE
      ",\"files\":[{\"path\":\"a\",\"content\":\"x\"},{\"path\":\"a\",\"content\":\"y\"}]}",
      "files[1].path", "duplicate");
  expect_field("{" BASE ",\"files\":[{\"path\":\"a\",\"content\":"
               "\"0123456789012345678901234567890123456789012345678901234567890123456789\"}]}",
               "files[0].content", "in total");
  expect_field("{" BASE ",\"connections\":\"github\"}", "connections", "expected an array");
  expect_field("{" BASE ",\"connections\":[{\"methods\":[\"GET\"]}]}", "connections[0].name",
               "required");
  expect_field("{" BASE ",\"connections\":[{\"name\":\"x\",\"methods\":[\"FLY\"]}]}",
               "connections[0].methods[0]", "unknown HTTP method");
  expect_field("{" BASE ",\"connections\":[{\"name\":\"x\",\"scope\":1}]}", "connections[0].scope",
               "unknown field (a connection has name, methods)");
  expect_field("{" BASE ",\"outputs\":[\"../../etc/passwd\"]}", "outputs[0]", NULL);
  expect_field("{" BASE ",\"metadata\":[]}", "metadata", "expected an object");
  expect_field("{" BASE ",\"metadata\":{\"a\":1}}", "metadata.a", "expected a string");
}

static void
test_malformed_json(void **state)
{
  (void)state;
  const char *bad[] = {"{", "{\"prompt\":\"x\",}", "[1,2]", "{} trailing", ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    eph_request_t req;
    eph_error_t err = {0};
    assert_true(eph_request_parse(bad[i], strlen(bad[i]), &limits, &req, NULL, &err) < 0);
  }
  eph_request_t req;
  eph_error_t err = {0};
  assert_int_equal(eph_request_parse("{\"a\":", 5, &limits, &req, NULL, &err), -EBADMSG);
  /* A complete request but for a trailing comma is malformed (json-c accepted it unless
   * strict), and the error locates it by line and column: request files are hand-edited. */
  const char *comma = "{\"prompt\": \"hi\", \"timeout_seconds\": 60,\n"
                      "  \"max_cost_micros\": 1000,\n}";
  err = (eph_error_t){0};
  assert_int_equal(eph_request_parse(comma, strlen(comma), &limits, &req, NULL, &err), -EBADMSG);
  assert_non_null(strstr(err.message, "malformed JSON at line 3, column 1"));
}

/* A tool plugin of this test that defines one connection, "crm", and one of ABI 1.1 whose
 * table ends before connection_defined (it confirms nothing). */
static int
fake_defined(void *state, const char *name)
{
  (void)state;
  return strcmp(name, "crm") == 0;
}

static void
test_connections_defined(void **state)
{
  (void)state;
  static const eph_tool_ops_t ops = {.struct_size = sizeof ops, .connection_defined = fake_defined};
  static const eph_tool_ops_t old_ops = {.struct_size =
                                             offsetof(eph_tool_ops_t, connection_defined),
                                         .connection_defined = fake_defined};
  eph_plugin_t desc = {.name = "tool-fake", .kind = EPH_KIND_TOOL, .ops = &ops};
  eph_plugin_t old_desc = {.name = "tool-old", .kind = EPH_KIND_TOOL, .ops = &old_ops};
  eph_plugin_slot_t slots[] = {{.desc = &old_desc}, {.desc = &desc}};
  eph_plugins_t ps = {.slots = slots, .n = 2};
  eph_request_limits_t with = limits;
  with.plugins = &ps;
  const char *ok_json = "{" BASE ",\"connections\":[\"crm\",{\"name\":\"crm\"}]}";
  eph_request_t req;
  eph_error_t err = {0};
  assert_int_equal(eph_request_parse(ok_json, strlen(ok_json), &with, &req, NULL, &err), 0);
  eph_request_free(&req);
  /* Undefined: named, whatever the grant's form; nothing else is judged undefined. */
  const char *bad[][2] = {
      {"{" BASE ",\"connections\":[{\"name\":\"nosuch\"}]}", "connections[0].name"},
      {"{" BASE ",\"connections\":[\"crm\",\"nosuch\"]}", "connections[1].name"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *got = NULL;
    assert_int_equal(eph_request_parse(bad[i][0], strlen(bad[i][0]), &with, &req, &got, &err),
                     -EINVAL);
    assert_string_equal(got, bad[i][1]);
    assert_non_null(strstr(err.message, "'nosuch' is defined"));
  }
  /* Only the 1.1 plugin loaded: nobody confirms, so even "crm" is refused. */
  ps.slots = slots;
  ps.n = 1;
  const char *got = NULL;
  const char *crm = "{" BASE ",\"connections\":[\"crm\"]}";
  assert_int_equal(eph_request_parse(crm, strlen(crm), &with, &req, &got, &err), -EINVAL);
  assert_string_equal(got, "connections[0].name");
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_product_page_request), cmocka_unit_test(test_full_request),
      cmocka_unit_test(test_invalid_fields),       cmocka_unit_test(test_malformed_json),
      cmocka_unit_test(test_connections_defined),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
