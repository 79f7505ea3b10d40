/* The connection broker against a real HTTP server on 127.0.0.1 that logs every request:
 * the credential is added by the broker (bearer, basic, header, query), refusals (not
 * granted, method, path, colliding headers) happen before any request reaches the server,
 * and the secret appears in no tool result, event or log line even when the server echoes
 * it back. */
#include <config.h>

#include "tool-connection-tests.h"

static th_httpd_t *httpd;
static char secret_file[256];

static const eph_plugin_slot_t *
load_broker(void)
{
  eph_error_t err = {0};
  int port = th_httpd_port(httpd);
  cleanup_free char *cfg = eph_xasprintf(
      "tool-connection: { connections = ("
      " { name = \"api\"; base_url = \"http://127.0.0.1:%d/v1\"; credential_env = "
      "\"TOOLS_TEST_SECRET\";"
      "   apply = \"bearer\"; methods = [\"GET\", \"POST\"]; path_prefixes = [\"/repos/\", "
      "\"/user\"];"
      "   allow_private_addresses = true; },"
      " { name = \"basic\"; base_url = \"http://127.0.0.1:%d\"; credential_file = \"%s\";"
      "   apply = \"basic\"; methods = [\"GET\"]; path_prefixes = [\"/\"]; allow_private_addresses "
      "= true; },"
      " { name = \"hdr\"; base_url = \"http://127.0.0.1:%d\"; credential_env = "
      "\"TOOLS_TEST_SECRET\";"
      "   apply = \"header\"; header_name = \"X-Api-Key\"; methods = [\"GET\"]; path_prefixes = "
      "[\"/\"];"
      "   allow_private_addresses = true; },"
      " { name = \"qry\"; base_url = \"http://127.0.0.1:%d\"; credential_env = "
      "\"TOOLS_TEST_SECRET\";"
      "   apply = \"query\"; query_param = \"api_key\"; methods = [\"GET\"]; path_prefixes = "
      "[\"/q\"];"
      "   allow_private_addresses = true; },"
      " { name = \"strict\"; base_url = \"http://127.0.0.1:%d\"; credential_env = "
      "\"TOOLS_TEST_SECRET\";"
      "   methods = [\"GET\"]; path_prefixes = [\"/\"]; }"
      "); };",
      port, port, secret_file, port, port, port);
  return th_load(&th_plugins, "tool-connection", cfg, 0, &err);
}

#define ALL_GRANTS                                                                                 \
  "{\"connections\":[{\"name\":\"api\"},{\"name\":\"basic\"},{\"name\":\"hdr\"},"                  \
  "{\"name\":\"qry\"},{\"name\":\"strict\"}]}"

json_object *
request(const eph_plugin_slot_t *s, const char *args, const char *grants)
{
  eph_error_t err = {0};
  json_object *r = th_call(s, "connection_request", args, grants ? grants : ALL_GRANTS, 0, &err);
  if (!r)
    fail_msg("connection_request failed: %s", err.message);
  return r;
}

/* The server's view of the last request. */
static json_object *
last_request(void)
{
  json_object *all = th_httpd_requests(httpd);
  json_object *last = NULL;
  json_object_deep_copy(json_object_array_get_idx(all, json_object_array_length(all) - 1), &last,
                        NULL);
  json_object_put(all);
  return last;
}

static void
assert_no_secret(json_object *result)
{
  const char *forms[] = {SECRET,
                         "s3cr3t-T0ken%2Fwith%2Bchars%3D%3D",
                         BASIC_PW,
                         "s3cr3t-T0ken", /* any escaping (JSON "\\/", %2F) keeps this prefix */
                         "czNjcjN0LVQwa2VuL3dpdGgrY2hhcnM9PQ==", /* base64 of SECRET */
                         "cm9ib3Q6cGE1NS13MHJkLXh5eg==" /* base64 of robot:pa55-w0rd-xyz */};
  cleanup_free char *all = th_everything();
  const char *res = result ? json_object_to_json_string(result) : "";
  for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
    if (strstr(res, forms[i]))
      fail_msg("the secret (%s) is in the tool result: %s", forms[i], res);
    if (strstr(all, forms[i]))
      fail_msg("the secret (%s) is in an event, charge or log line: %s", forms[i], all);
  }
}

static void
test_bearer_added_and_scrubbed(void **state)
{
  const eph_plugin_slot_t *s = load_broker();
  size_t before = th_httpd_count(httpd);
  json_object *r =
      request(s,
              "{\"connection\":\"api\",\"method\":\"get\",\"path\":\"/repos/x?page=2\","
              "\"headers\":{\"Accept\":\"application/json\",\"Authorization\":\"Bearer evil\","
              "\"Cookie\":\"a=b\",\"Proxy-Authorization\":\"x\"}}",
              NULL);
  assert_null(str_of(r, "error"));
  assert_int_equal(th_httpd_count(httpd), before + 1);
  json_object *seen = last_request(), *h = NULL, *q = NULL;
  assert_string_equal(str_of(seen, "method"), "GET");
  assert_string_equal(str_of(seen, "url"), "/v1/repos/x");
  assert_true(json_object_object_get_ex(seen, "headers", &h));
  /* The broker's credential, not the caller's; the caller's cookie and proxy header gone. */
  assert_string_equal(str_of(h, "authorization"), "Bearer " SECRET);
  assert_null(str_of(h, "cookie"));
  assert_null(str_of(h, "proxy-authorization"));
  assert_string_equal(str_of(h, "accept"), "application/json");
  assert_true(json_object_object_get_ex(seen, "query", &q));
  assert_string_equal(str_of(q, "page"), "2");
  json_object_put(seen);
  /* The server echoed the Authorization in its body and a header: both scrubbed. */
  json_object *rh = NULL;
  assert_true(json_object_object_get_ex(r, "headers", &rh));
  assert_string_equal(str_of(rh, "x-echo-authorization"), "Bearer [REDACTED]");
  assert_non_null(strstr(str_of(r, "body"), "[REDACTED]"));
  assert_no_secret(r);
  /* On the timeline: the connection, method and path, never the URL's credential. */
  json_object *ev = NULL;
  for (size_t i = 0; !ev && i < json_object_array_length(th.events); i++)
    if (strcmp(str_of(json_object_array_get_idx(th.events, i), "kind"), "connection_request") == 0)
      ev = json_object_array_get_idx(th.events, i);
  assert_non_null(ev);
  assert_string_equal(str_of(ev, "text"), "GET api /repos/x?page=2");
  json_object_put(r);
}

static void
test_post_body(void **state)
{
  const eph_plugin_slot_t *s = load_broker();
  json_object *r = request(s,
                           "{\"connection\":\"api\",\"method\":\"POST\",\"path\":\"/user\","
                           "\"headers\":{\"Content-Type\":\"application/json\"},"
                           "\"body\":\"{\\\"hello\\\":1}\"}",
                           NULL);
  assert_null(str_of(r, "error"));
  json_object *seen = last_request();
  assert_string_equal(str_of(seen, "method"), "POST");
  assert_string_equal(str_of(seen, "url"), "/v1/user");
  assert_string_equal(str_of(seen, "body"), "{\"hello\":1}");
  json_object_put(seen);
  assert_no_secret(r);
  json_object_put(r);
}

static void
test_basic_header_query(void **state)
{
  const eph_plugin_slot_t *s = load_broker();
  json_object *r =
      request(s, "{\"connection\":\"basic\",\"method\":\"GET\",\"path\":\"/b\"}", NULL);
  json_object *seen = last_request(), *h = NULL, *q = NULL;
  json_object_object_get_ex(seen, "headers", &h);
  assert_string_equal(str_of(h, "authorization"), "Basic cm9ib3Q6cGE1NS13MHJkLXh5eg==");
  json_object_put(seen);
  assert_no_secret(r);
  json_object_put(r);

  r = request(s,
              "{\"connection\":\"hdr\",\"method\":\"GET\",\"path\":\"/h\","
              "\"headers\":{\"x-api-key\":\"mine\"}}",
              NULL);
  seen = last_request();
  json_object_object_get_ex(seen, "headers", &h);
  assert_string_equal(str_of(h, "x-api-key"), SECRET);
  json_object_put(seen);
  json_object *dropped = NULL;
  assert_true(json_object_object_get_ex(r, "dropped_headers", &dropped));
  assert_string_equal(json_object_get_string(json_object_array_get_idx(dropped, 0)), "x-api-key");
  assert_no_secret(r);
  json_object_put(r);

  r = request(s, "{\"connection\":\"qry\",\"method\":\"GET\",\"path\":\"/q?x=1\"}", NULL);
  seen = last_request();
  json_object_object_get_ex(seen, "query", &q);
  assert_string_equal(str_of(q, "api_key"), SECRET);
  assert_string_equal(str_of(q, "x"), "1");
  json_object_put(seen);
  assert_no_secret(r);
  json_object_put(r);
}

static void
expect_refused(const eph_plugin_slot_t *s, const char *args, const char *grants, const char *reason)
{
  size_t before = th_httpd_count(httpd);
  json_object *r = request(s, args, grants);
  if (!str_of(r, "error"))
    fail_msg("not refused: %s -> %s", args, json_object_to_json_string(r));
  if (reason && (!str_of(r, "reason") || strcmp(str_of(r, "reason"), reason) != 0))
    fail_msg("%s: reason %s, want %s", args, str_of(r, "reason"), reason);
  if (th_httpd_count(httpd) != before)
    fail_msg("a refused request reached the server: %s", args);
  assert_no_secret(r);
  json_object_put(r);
}

static void
test_refusals_reach_no_server(void **state)
{
  const eph_plugin_slot_t *s = load_broker();
  /* Not granted (and unknown). */
  expect_refused(s, "{\"connection\":\"api\",\"method\":\"GET\",\"path\":\"/user\"}",
                 "{\"connections\":[{\"name\":\"basic\"}]}", "not_granted");
  expect_refused(s, "{\"connection\":\"api\",\"method\":\"GET\",\"path\":\"/user\"}",
                 "{\"web\":true}", "not_granted");
  expect_refused(s, "{\"connection\":\"nope\",\"method\":\"GET\",\"path\":\"/\"}", NULL,
                 "not_granted");
  /* Method: outside the operator's list, and narrowed by the grant. */
  expect_refused(s, "{\"connection\":\"api\",\"method\":\"DELETE\",\"path\":\"/user\"}", NULL,
                 "method");
  expect_refused(s, "{\"connection\":\"api\",\"method\":\"POST\",\"path\":\"/user\"}",
                 "{\"connections\":[{\"name\":\"api\",\"methods\":[\"GET\"]}]}", "method");
  expect_refused(s, "{\"connection\":\"api\",\"method\":\"G ET\",\"path\":\"/user\"}", NULL,
                 "method");
  /* Paths outside the prefixes, traversal in every spelling, host injection. */
  static const char *const bad[] = {
      "/admin",
      "/userx",
      "/repos",
      "/repos/../admin",
      "/repos/%2e%2e/admin",
      "/repos/%2E%2E/admin",
      "/repos/x%2f..%2fadmin",
      "/repos/.%2e/a",
      "/repos/x/%252e%252e/a",
      "//evil.example/repos/",
      "/repos/x\\\\..\\\\a",
      "/repos/./x",
      "/repos//x",
      "/repos/x;a=b",
      "/repos/x#frag",
      "http://evil/repos/",
      "repos/x",
      "/repos/x y",
      "/repos/%00",
      "/@evil.example/repos/",
      "/repos/x%5c..%5ca",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cleanup_free char *args =
        eph_xasprintf("{\"connection\":\"api\",\"method\":\"GET\",\"path\":\"%s\"}", bad[i]);
    expect_refused(s, args, NULL, "path");
  }
  /* The caller cannot set the query parameter carrying the credential. */
  expect_refused(s, "{\"connection\":\"qry\",\"method\":\"GET\",\"path\":\"/q?api_key=mine\"}",
                 NULL, NULL);
  /* Without allow_private_addresses the loopback server is refused at the address check. */
  expect_refused(s, "{\"connection\":\"strict\",\"method\":\"GET\",\"path\":\"/x\"}", NULL,
                 "address");
  /* Header values with line breaks (request splitting) are refused outright. */
  expect_refused(s,
                 "{\"connection\":\"api\",\"method\":\"GET\",\"path\":\"/user\","
                 "\"headers\":{\"X-A\":\"1\\r\\nAuthorization: x\"}}",
                 NULL, NULL);
  /* Every refusal (but the malformed-argument one) is a "denied" event. */
  size_t denied = 0;
  for (size_t i = 0; i < json_object_array_length(th.events); i++)
    denied += strcmp(str_of(json_object_array_get_idx(th.events, i), "kind"), "denied") == 0;
  assert_true(denied >= 28);
}

static void
test_missing_credential_and_bad_config(void **state)
{
  eph_error_t err = {0};
  cleanup_free char *cfg = eph_xasprintf(
      "tool-connection: { connections = ( { name = \"nocred\"; base_url = \"http://127.0.0.1:%d\";"
      " credential_env = \"TOOLS_TEST_UNSET_VARIABLE\"; methods = [\"GET\"]; path_prefixes = "
      "[\"/\"];"
      " allow_private_addresses = true; } ); };",
      th_httpd_port(httpd));
  const eph_plugin_slot_t *s = th_load(&th_plugins, "tool-connection", cfg, 0, &err);
  expect_refused(s, "{\"connection\":\"nocred\",\"method\":\"GET\",\"path\":\"/\"}",
                 "{\"connections\":[\"nocred\"]}", "unavailable");
  th_unload(&th_plugins);
  th_load(&th_plugins, "tool-connection",
          "tool-connection: { connections = ( { name = \"a\"; base_url = \"http://h/?q=1\";"
          " credential_env = \"X\"; methods = [\"GET\"]; path_prefixes = [\"/\"]; } ); };",
          1, &err);
  assert_non_null(strstr(err.message, "base_url"));
  th_load(&th_plugins, "tool-connection",
          "tool-connection: { connections = ( { name = \"a\"; base_url = \"http://h\";"
          " credential_env = \"X\"; apply = \"cookie\"; methods = [\"GET\"]; path_prefixes = "
          "[\"/\"]; } ); };",
          1, &err);
  assert_non_null(strstr(err.message, "apply"));
  th_load(&th_plugins, "tool-connection",
          "tool-connection: { connections = ( { name = \"a\"; base_url = \"http://h\";"
          " credential_env = \"X\"; methods = [\"GET\"]; path_prefixes = [\"x\"]; } ); };",
          1, &err);
  assert_non_null(strstr(err.message, "prefix"));
  /* The shipped default: an empty list. */
  s = th_load(&th_plugins, "tool-connection", "tool-connection: { connections = (); };", 0, &err);
  expect_refused(s, "{\"connection\":\"api\",\"method\":\"GET\",\"path\":\"/\"}", NULL,
                 "not_granted");
}

static void
test_budget_refused_before_io(void **state)
{
  eph_error_t err = {0};
  cleanup_free char *cfg = eph_xasprintf(
      "tool-connection: { price_micros_per_request = 500; connections = ( { name = \"api\";"
      " base_url = \"http://127.0.0.1:%d\"; credential_env = \"TOOLS_TEST_SECRET\";"
      " methods = [\"GET\"]; path_prefixes = [\"/\"]; allow_private_addresses = true; } ); };",
      th_httpd_port(httpd));
  const eph_plugin_slot_t *s = th_load(&th_plugins, "tool-connection", cfg, 0, &err);
  th.budget_micros = 700;
  json_object *r = request(s, "{\"connection\":\"api\",\"method\":\"GET\",\"path\":\"/a\"}", NULL);
  assert_null(str_of(r, "error"));
  json_object_put(r);
  assert_int_equal(th.charged_micros, 500);
  expect_refused(s, "{\"connection\":\"api\",\"method\":\"GET\",\"path\":\"/a\"}", NULL,
                 "budget_exhausted");
  assert_int_equal(th.charged_micros, 500);
}

/* Finding 6: method and URL override headers (and anything else off the allow-list) never
 * reach the upstream, each drop is an event; the allow-list's headers do reach it. */
static void
test_override_headers_dropped(void **state)
{
  const eph_plugin_slot_t *s = load_broker();
  static const char *const evil[] = {"X-HTTP-Method-Override",
                                     "X-HTTP-Method",
                                     "X-Method-Override",
                                     "X-Original-URL",
                                     "X-Rewrite-URL",
                                     "X-Original-Method",
                                     "X-Override-URL",
                                     "X-Forwarded-Host",
                                     "X-Host",
                                     "Range",
                                     "Accept-Encoding",
                                     "X-Custom",
                                     NULL};
  for (size_t i = 0; evil[i]; i++) {
    size_t events = json_object_array_length(th.events);
    const char *value = strcmp(evil[i], "Range") == 0 ? "bytes=0-3" : "DELETE";
    cleanup_free char *args = eph_xasprintf(
        "{\"connection\":\"api\",\"method\":\"GET\",\"path\":\"/repos/x\","
        "\"headers\":{\"%s\":\"%s\",\"Accept\":\"text/plain\",\"If-None-Match\":\"\\\"e1\\\"\"}}",
        evil[i], value);
    json_object *r =
        request(s, args, "{\"connections\":[{\"name\":\"api\",\"methods\":[\"GET\"]}]}");
    assert_null(str_of(r, "error"));
    json_object *seen = last_request(), *h = NULL;
    assert_string_equal(str_of(seen, "method"), "GET");
    assert_true(json_object_object_get_ex(seen, "headers", &h));
    cleanup_free char *lower = eph_xstrdup(evil[i]);
    for (char *c = lower; *c; c++)
      *c = (char)tolower((unsigned char)*c);
    /* (curl sends its own Accept-Encoding, and decodes what comes back before the scrubber
     * sees it: the caller's value must not be the one that went out.) */
    if (str_of(h, lower) && strcmp(str_of(h, lower), value) == 0)
      fail_msg("%s reached the upstream: %s", evil[i], json_object_to_json_string(seen));
    if (!str_of(h, "accept") || strcmp(str_of(h, "accept"), "text/plain") != 0 ||
        !str_of(h, "if-none-match") || strcmp(str_of(h, "if-none-match"), "\"e1\"") != 0)
      fail_msg("%s: the allowed headers did not reach the upstream: %s", evil[i],
               json_object_to_json_string(seen));
    json_object_put(seen);
    json_object *dropped = NULL;
    assert_true(json_object_object_get_ex(r, "dropped_headers", &dropped));
    assert_string_equal(json_object_get_string(json_object_array_get_idx(dropped, 0)), evil[i]);
    bool evented = false;
    for (size_t e = events; e < json_object_array_length(th.events); e++) {
      json_object *ev = json_object_array_get_idx(th.events, e), *d = NULL, *names = NULL;
      if (strcmp(str_of(ev, "kind"), "header_dropped") == 0 &&
          json_object_object_get_ex(ev, "data", &d) &&
          json_object_object_get_ex(d, "headers", &names) &&
          strcmp(json_object_get_string(json_object_array_get_idx(names, 0)), evil[i]) == 0)
        evented = true;
    }
    if (!evented)
      fail_msg("no header_dropped event for %s", evil[i]);
    json_object_put(r);
  }
}

/* Finding 6: the allow-list is per connection; a header that overrides the checked method
 * or URL, or carries credentials, cannot be put on it. */
static void
test_allowed_headers_config(void **state)
{
  eph_error_t err = {0};
  cleanup_free char *cfg = eph_xasprintf(
      "tool-connection: { connections = ( { name = \"api\"; base_url = \"http://127.0.0.1:%d\";"
      " credential_env = \"TOOLS_TEST_SECRET\"; methods = [\"GET\"]; path_prefixes = [\"/\"];"
      " allowed_headers = [\"X-Custom\"]; allow_private_addresses = true; } ); };",
      th_httpd_port(httpd));
  const eph_plugin_slot_t *s = th_load(&th_plugins, "tool-connection", cfg, 0, &err);
  json_object *r = request(s,
                           "{\"connection\":\"api\",\"method\":\"GET\",\"path\":\"/a\","
                           "\"headers\":{\"x-custom\":\"1\",\"Accept\":\"text/plain\"}}",
                           "{\"connections\":[\"api\"]}");
  json_object *seen = last_request(), *h = NULL;
  json_object_object_get_ex(seen, "headers", &h);
  assert_string_equal(str_of(h, "x-custom"), "1");
  assert_string_equal(str_of(h, "accept"), "*/*"); /* curl's own, not the caller's */
  json_object_put(seen);
  json_object_put(r);
  th_unload(&th_plugins);
  /* A credential carried in a header of the default list: that header drops off the list. */
  cleanup_free char *ua = eph_xasprintf(
      "tool-connection: { connections = ( { name = \"ua\"; base_url = \"http://127.0.0.1:%d\";"
      " credential_env = \"TOOLS_TEST_SECRET\"; apply = \"header\"; header_name = \"User-Agent\";"
      " methods = [\"GET\"]; path_prefixes = [\"/\"]; allow_private_addresses = true; } ); };",
      th_httpd_port(httpd));
  s = th_load(&th_plugins, "tool-connection", ua, 0, &err);
  r = request(s,
              "{\"connection\":\"ua\",\"method\":\"GET\",\"path\":\"/a\","
              "\"headers\":{\"User-Agent\":\"mine\",\"Accept\":\"text/plain\"}}",
              "{\"connections\":[\"ua\"]}");
  seen = last_request();
  json_object_object_get_ex(seen, "headers", &h);
  assert_string_equal(str_of(h, "user-agent"), SECRET);
  assert_string_equal(str_of(h, "accept"), "text/plain");
  json_object_put(seen);
  json_object_put(r);
  th_unload(&th_plugins);
  static const char *const never[] = {"X-HTTP-Method-Override",
                                      "X-Original-URL",
                                      "Authorization",
                                      "Accept-Encoding",
                                      "Range",
                                      "Host",
                                      "X-Rewrite-URL",
                                      NULL};
  for (size_t i = 0; never[i]; i++) {
    cleanup_free char *bad =
        eph_xasprintf("tool-connection: { connections = ( { name = \"a\"; base_url = \"http://h\";"
                      " credential_env = \"X\"; methods = [\"GET\"]; path_prefixes = [\"/\"];"
                      " allowed_headers = [\"Accept\", \"%s\"]; } ); };",
                      never[i]);
    assert_null(th_load(&th_plugins, "tool-connection", bad, 1, &err));
    if (!strcasestr(err.message, never[i]) || !strstr(err.message, "allowed_headers"))
      fail_msg("config error does not name %s: %s", never[i], err.message);
  }
}

/* Finding 6: a body on GET or HEAD is refused before any request. */
static void
test_body_on_get_refused(void **state)
{
  const eph_plugin_slot_t *s = load_broker();
  expect_refused(s,
                 "{\"connection\":\"api\",\"method\":\"GET\",\"path\":\"/user\",\"body\":\"x=1\"}",
                 NULL, "body");
  expect_refused(s, "{\"connection\":\"basic\",\"method\":\"HEAD\",\"path\":\"/b\",\"body\":\"x\"}",
                 "{\"connections\":[\"basic\"]}", NULL);
  /* An empty body is no body. */
  json_object *r = request(
      s, "{\"connection\":\"api\",\"method\":\"GET\",\"path\":\"/user\",\"body\":\"\"}", NULL);
  assert_null(str_of(r, "error"));
  json_object_put(r);
}

/* The scrubber leaves innocent content alone and keeps up with a full-size body: 1 MiB (the
 * default cap) comes back byte for byte, not marked truncated. */
static void
test_large_body_untouched(void **state)
{
  const eph_plugin_slot_t *s = load_broker();
  int64_t t0 = eph_now_ms();
  json_object *r =
      request(s, "{\"connection\":\"hdr\",\"method\":\"GET\",\"path\":\"/big\"}", NULL);
  int64_t ms = eph_now_ms() - t0;
  assert_null(str_of(r, "error"));
  const char *body = str_of(r, "body");
  assert_non_null(body);
  assert_int_equal(strlen(body), 1 << 20);
  assert_true(strspn(body, "x") == 1 << 20);
  json_object *tr = NULL;
  assert_true(json_object_object_get_ex(r, "truncated", &tr));
  assert_false(json_object_get_boolean(tr));
  print_message("# 1 MiB through the broker (fetch + scrub + final check): %lld ms\n",
                (long long)ms);
  json_object_put(r);
}

int
main(void)
{
  setenv("TOOLS_TEST_SECRET", SECRET, 1);
  snprintf(secret_file, sizeof secret_file, "/tmp/eph-tools-test-XXXXXX");
  int fd = mkstemp(secret_file);
  if (fd < 0 ||
      write(fd, BASIC_USER ":" BASIC_PW "\n", sizeof BASIC_USER ":" BASIC_PW "\n" - 1) < 0)
    return 1;
  close(fd);
  httpd = th_httpd_start(NULL);
  hostile_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_bearer_added_and_scrubbed, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_post_body, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_basic_header_query, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_refusals_reach_no_server, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_missing_credential_and_bad_config, th_setup,
                                      th_teardown),
      cmocka_unit_test_setup_teardown(test_budget_refused_before_io, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_hostile_encodings, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_hostile_header_names, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_hostile_split, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_hostile_utf16, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_hostile_truncation, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_override_headers_dropped, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_allowed_headers_config, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_body_on_get_refused, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_large_body_untouched, th_setup, th_teardown),
  };
  int r = cmocka_run_group_tests_name("tool-connection", tests, NULL, NULL);
  th_httpd_stop(httpd);
  MHD_stop_daemon(hostile);
  unlink(secret_file);
  return r;
}
