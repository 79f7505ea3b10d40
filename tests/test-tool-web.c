/* tool-web against a real HTTP server on 127.0.0.1, loaded through the real loader with a
 * fake host: allowed fetches work, are charged before I/O and shown on the timeline;
 * denied domains, private, loopback, link-local and IPv6 loopback addresses, the host's own
 * interface addresses, ports off allowed_ports and redirects to any of them are refused; no
 * request of a refused call reaches the server. */
#include <config.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools-harness.h"
#include "util.h"

static th_httpd_t *httpd, *private_httpd, *self_httpd, *public_self_httpd;

/* "allowed_ports = [...];" naming every test server's port (and 80): tests about other
 * checks must not be refused for the port. Static buffer. */
static const char *
ports_cfg(void)
{
  static char buf[160];
  th_httpd_t *all[] = {httpd, private_httpd, self_httpd, public_self_httpd};
  int n = snprintf(buf, sizeof buf, "allowed_ports = [80");
  for (size_t i = 0; i < 4; i++)
    if (all[i])
      n += snprintf(buf + n, sizeof buf - (size_t)n, ", %d", th_httpd_port(all[i]));
  snprintf(buf + n, sizeof buf - (size_t)n, "];");
  return buf;
}

static int
int_of(json_object *o, const char *key)
{
  json_object *v = NULL;
  return json_object_object_get_ex(o, key, &v) ? json_object_get_int(v) : -1;
}

/* Loads tool-web with loopback allowed (the test server is the outside world) plus extra
 * config text. */
static const eph_plugin_slot_t *
load_web(const char *extra)
{
  eph_error_t err = {0};
  cleanup_free char *cfg = eph_xasprintf(
      "tool-web: { allow_loopback = true; price_micros_per_request = 250; max_redirects = 3;"
      " deny_domains = [\"denied.test\"]; max_response_bytes = 65536; %s %s };",
      ports_cfg(), extra ? extra : "");
  return th_load(&th_plugins, "tool-web", cfg, 0, &err);
}

static json_object *
fetch(const eph_plugin_slot_t *s, const char *url, const char *method)
{
  eph_error_t err = {0};
  cleanup_free char *args = method
                                ? eph_xasprintf("{\"url\":\"%s\",\"method\":\"%s\"}", url, method)
                                : eph_xasprintf("{\"url\":\"%s\"}", url);
  json_object *r = th_call(s, "web_fetch", args, "{\"web\":true}", 0, &err);
  if (!r)
    fail_msg("web_fetch returned an error: %s", err.message);
  return r;
}

static void
test_fetch_allowed_page_reduces_html(void **state)
{
  const eph_plugin_slot_t *s = load_web(NULL);
  size_t before = th_httpd_count(httpd);
  cleanup_free char *url = eph_xasprintf("http://127.0.0.1:%d/page.html", th_httpd_port(httpd));
  json_object *r = fetch(s, url, NULL);
  assert_null(str_of(r, "error"));
  assert_int_equal(int_of(r, "status"), 200);
  assert_non_null(strstr(str_of(r, "content_type"), "text/html"));
  const char *text = str_of(r, "text");
  assert_non_null(text);
  /* Title first, whitespace collapsed, block elements on their own lines. */
  assert_string_equal(text, "Sandbox proof\n\nPrimes\n\nTwo, three and five.\n\nseven\neleven");
  assert_null(strstr(text, "script"));
  assert_null(strstr(text, "color"));
  assert_int_equal(th_httpd_count(httpd), before + 1);
  /* Charged once, before the request, and on the timeline. */
  assert_int_equal(json_object_array_length(th.charges), 1);
  assert_int_equal(th.charged_micros, 250);
  json_object *ev = json_object_array_get_idx(th.events, 0);
  assert_string_equal(str_of(ev, "source"), "Web");
  assert_string_equal(str_of(ev, "kind"), "web_request");
  cleanup_free char *want = eph_xasprintf("GET %s", url);
  assert_string_equal(str_of(ev, "text"), want);
  json_object_put(r);
}

static void
test_head_and_text_and_size_cap(void **state)
{
  const eph_plugin_slot_t *s = load_web("methods = [\"GET\", \"HEAD\"];");
  int port = th_httpd_port(httpd);
  cleanup_free char *t = eph_xasprintf("http://127.0.0.1:%d/text", port);
  json_object *r = fetch(s, t, "head");
  assert_int_equal(int_of(r, "status"), 200);
  assert_int_equal(int_of(r, "body_bytes"), 0);
  json_object_put(r);
  r = fetch(s, t, NULL);
  assert_string_equal(str_of(r, "text"), "plain text body");
  json_object_put(r);
  cleanup_free char *big = eph_xasprintf("http://127.0.0.1:%d/big", port);
  r = fetch(s, big, NULL);
  json_object *tr = NULL;
  assert_true(json_object_object_get_ex(r, "truncated", &tr) && json_object_get_boolean(tr));
  assert_int_equal(int_of(r, "body_bytes"), 65536);
  json_object_put(r);
  /* A method outside the configured list is refused without a request. */
  size_t before = th_httpd_count(httpd);
  r = fetch(s, t, "DELETE");
  assert_non_null(str_of(r, "error"));
  assert_int_equal(th_httpd_count(httpd), before);
  json_object_put(r);
}

static void
expect_refused(const eph_plugin_slot_t *s, const char *url, const char *needle)
{
  size_t before = th_httpd_count(httpd);
  int64_t charged = th.charged_micros;
  json_object *r = fetch(s, url, NULL);
  const char *e = str_of(r, "error");
  if (!e)
    fail_msg("%s was not refused: %s", url, json_object_to_json_string(r));
  if (!strstr(e, needle))
    fail_msg("%s: error '%s' lacks '%s'", url, e, needle);
  assert_int_equal(th_httpd_count(httpd), before);
  (void)charged;
  json_object_put(r);
}

static void
test_refusals(void **state)
{
  /* Loopback NOT allowed here: the default configuration. */
  eph_error_t err = {0};
  cleanup_free char *cfg =
      eph_xasprintf("tool-web: { deny_domains = [\"denied.test\"]; %s };", ports_cfg());
  const eph_plugin_slot_t *s = th_load(&th_plugins, "tool-web", cfg, 0, &err);
  int port = th_httpd_port(httpd);
  cleanup_free char *lo = eph_xasprintf("http://127.0.0.1:%d/text", port);
  expect_refused(s, lo, "loopback");
  cleanup_free char *lo2 = eph_xasprintf("http://localhost:%d/text", port);
  expect_refused(s, lo2, "loopback");
  cleanup_free char *lo3 = eph_xasprintf("http://127.1:%d/text", port);
  expect_refused(s, lo3, "loopback");
  cleanup_free char *lo6 = eph_xasprintf("http://[::1]:%d/text", port);
  expect_refused(s, lo6, "loopback");
  cleanup_free char *mapped = eph_xasprintf("http://[::ffff:127.0.0.1]:%d/text", port);
  expect_refused(s, mapped, "loopback");
  expect_refused(s, "http://169.254.169.254/latest/meta-data/", "link-local");
  expect_refused(s, "http://10.1.2.3/", "private");
  expect_refused(s, "http://192.168.0.1/", "private");
  expect_refused(s, "http://172.16.5.4/", "private");
  expect_refused(s, "http://100.64.0.1/", "CGNAT");
  expect_refused(s, "http://0.0.0.0/", "unspecified");
  expect_refused(s, "http://[fd00::1]/", "unique local");
  expect_refused(s, "http://[fe80::1]/", "link-local");
  expect_refused(s, "http://224.0.0.1/", "multicast");
  expect_refused(s, "http://www.denied.test/", "deny list");
  expect_refused(s, "ftp://127.0.0.1/", "only http");
  expect_refused(s, "http://user:pw@127.0.0.1/", "credentials");
  expect_refused(s, "file:///etc/passwd", "only http");
  /* A host libcurl decodes into bytes no name has (0xff 0xfe, an overlong NUL) is refused before
   * any charge or resolution and never quoted (it once put invalid UTF-8 in the result). */
  expect_refused(s, "http://%ff%fe.example/", "the URL's host has bytes no host name has");
  expect_refused(s, "http://a%c0%80b.example/", "the URL's host has bytes no host name has");
  /* Every refusal is on the timeline. */
  size_t refused = 0;
  for (size_t i = 0; i < json_object_array_length(th.events); i++)
    refused += strcmp(str_of(json_object_array_get_idx(th.events, i), "kind"), "web_refused") == 0;
  assert_true(refused >= 15);
}

static void
test_allow_list_is_label_suffix(void **state)
{
  const eph_plugin_slot_t *s = load_web("allow_domains = [\"localhost\"];");
  int port = th_httpd_port(httpd);
  cleanup_free char *ip = eph_xasprintf("http://127.0.0.1:%d/text", port);
  expect_refused(s, ip, "allow list");
  cleanup_free char *name = eph_xasprintf("http://localhost:%d/text", port);
  json_object *r = fetch(s, name, NULL);
  if (str_of(r, "error") && strstr(str_of(r, "error"), "resolve"))
    skip(); /* no /etc/hosts entry for localhost on this machine */
  assert_string_equal(str_of(r, "text"), "plain text body");
  json_object_put(r);
}

static void
test_redirects(void **state)
{
  const eph_plugin_slot_t *s = load_web(NULL);
  int port = th_httpd_port(httpd);
  /* An allowed redirect is followed and charged per hop. */
  cleanup_free char *ok = eph_xasprintf("http://127.0.0.1:%d/redirect?to=/text", port);
  json_object *r = fetch(s, ok, NULL);
  assert_int_equal(int_of(r, "status"), 200);
  assert_int_equal(int_of(r, "redirects"), 1);
  assert_string_equal(str_of(r, "text"), "plain text body");
  assert_int_equal(th.charged_micros, 500);
  json_object_put(r);
  /* A redirect to the metadata address or a denied domain is refused at that hop. */
  size_t before = th_httpd_count(httpd);
  cleanup_free char *meta = eph_xasprintf(
      "http://127.0.0.1:%d/redirect?to=http%%3A%%2F%%2F169.254.169.254%%2Flatest", port);
  r = fetch(s, meta, NULL);
  assert_non_null(str_of(r, "error"));
  assert_non_null(strstr(str_of(r, "error"), "169.254.169.254"));
  assert_int_equal(th_httpd_count(httpd), before + 1); /* only the first hop */
  json_object_put(r);
  cleanup_free char *den =
      eph_xasprintf("http://127.0.0.1:%d/redirect?to=http%%3A%%2F%%2Fx.denied.test%%2F", port);
  r = fetch(s, den, NULL);
  assert_non_null(strstr(str_of(r, "error"), "deny list"));
  json_object_put(r);
  /* A redirect loop stops at max_redirects. */
  cleanup_free char *loop = eph_xasprintf("http://127.0.0.1:%d/redirect", port);
  r = fetch(s, loop, NULL);
  assert_non_null(strstr(str_of(r, "error"), "too many redirects"));
  json_object_put(r);
}

/* The first hop goes to a private address (10.200.0.1, another machine: a network
 * namespace this test created, behind a veth), allowed by allow_private_addresses; it
 * redirects to the loopback test server, which the same configuration does not allow: the
 * second hop is refused and the loopback server never sees a request. */
static void
test_redirect_to_loopback_refused(void **state)
{
  if (!private_httpd)
    skip();
  eph_error_t err = {0};
  cleanup_free char *cfg = eph_xasprintf(
      "tool-web: { allow_private_addresses = true; max_redirects = 3; %s };", ports_cfg());
  const eph_plugin_slot_t *s = th_load(&th_plugins, "tool-web", cfg, 0, &err);
  size_t lo_before = th_httpd_count(httpd), priv_before = th_httpd_count(private_httpd);
  cleanup_free char *u =
      eph_xasprintf("http://10.200.0.1:%d/redirect?to=http%%3A%%2F%%2F127.0.0.1%%3A%d%%2Ftext",
                    th_httpd_port(private_httpd), th_httpd_port(httpd));
  json_object *r = fetch(s, u, NULL);
  assert_non_null(str_of(r, "error"));
  assert_non_null(strstr(str_of(r, "error"), "loopback"));
  assert_int_equal(th_httpd_count(private_httpd), priv_before + 1);
  assert_int_equal(th_httpd_count(httpd), lo_before);
  json_object_put(r);
  /* The same through the IPv4-mapped IPv6 form. */
  cleanup_free char *u6 =
      eph_xasprintf("http://10.200.0.1:%d/"
                    "redirect?to=http%%3A%%2F%%2F%%5B%%3A%%3Affff%%3A127.0.0.1%%5D%%3A%d%%2F",
                    th_httpd_port(private_httpd), th_httpd_port(httpd));
  r = fetch(s, u6, NULL);
  assert_non_null(strstr(str_of(r, "error"), "loopback"));
  assert_int_equal(th_httpd_count(httpd), lo_before);
  json_object_put(r);
  /* And a direct private fetch works under this configuration. */
  cleanup_free char *ok = eph_xasprintf("http://10.200.0.1:%d/text", th_httpd_port(private_httpd));
  r = fetch(s, ok, NULL);
  assert_string_equal(str_of(r, "text"), "plain text body");
  json_object_put(r);
}

/* Issue 11 finding 7: the host's own addresses. The test's "host" namespace holds
 * 10.201.0.1 (private), 11.200.0.1 (public-looking; no packet leaves these namespaces) and
 * fd00:201::1 on its interfaces, with servers on the two IPv4 ones. Whatever
 * allow_private_addresses says, none is reachable: not directly, not in an IPv6 form that
 * carries the IPv4 (mapped, NAT64, 6to4), not as a redirect hop; while 10.200.0.1, a private
 * address of another machine, is. */
static void
test_host_own_addresses_refused(void **state)
{
  if (!self_httpd || !private_httpd)
    skip();
  eph_error_t err = {0};
  cleanup_free char *cfg = eph_xasprintf(
      "tool-web: { allow_private_addresses = true; max_redirects = 3; %s };", ports_cfg());
  const eph_plugin_slot_t *s = th_load(&th_plugins, "tool-web", cfg, 0, &err);
  int sp = th_httpd_port(self_httpd);
  size_t self_before = th_httpd_count(self_httpd);
  const char *const hosts[] = {"10.201.0.1", "[::ffff:10.201.0.1]", "[fd00:201::1]",
                               "[64:ff9b::10.201.0.1]", "[2002:ac9:1::1]"};
  for (size_t i = 0; i < 5; i++) {
    cleanup_free char *u = eph_xasprintf("http://%s:%d/text", hosts[i], sp);
    json_object *r = fetch(s, u, NULL);
    if (!str_of(r, "error") || !strstr(str_of(r, "error"), "this host's own interfaces"))
      fail_msg("%s: not refused as the host's own address: %s", u, json_object_to_json_string(r));
    json_object_put(r);
  }
  /* A redirect from another machine to the host's own address is refused at that hop. */
  size_t priv_before = th_httpd_count(private_httpd);
  cleanup_free char *hop =
      eph_xasprintf("http://10.200.0.1:%d/redirect?to=http%%3A%%2F%%2F10.201.0.1%%3A%d%%2Ftext",
                    th_httpd_port(private_httpd), sp);
  json_object *r = fetch(s, hop, NULL);
  assert_non_null(str_of(r, "error"));
  assert_non_null(strstr(str_of(r, "error"), "this host's own interfaces"));
  assert_int_equal(th_httpd_count(private_httpd), priv_before + 1);
  json_object_put(r);
  assert_int_equal(th_httpd_count(self_httpd), self_before);
  /* Every refusal is on the timeline. */
  size_t refused = 0;
  for (size_t i = 0; i < json_object_array_length(th.events); i++) {
    json_object *ev = json_object_array_get_idx(th.events, i);
    refused += strcmp(str_of(ev, "kind"), "web_refused") == 0 &&
               strstr(json_object_to_json_string(ev), "own interfaces");
  }
  assert_int_equal(refused, 6);
  /* The private address of another machine stays reachable under this policy. */
  cleanup_free char *ok = eph_xasprintf("http://10.200.0.1:%d/text", th_httpd_port(private_httpd));
  r = fetch(s, ok, NULL);
  assert_string_equal(str_of(r, "text"), "plain text body");
  json_object_put(r);
  th_unload(&th_plugins);
  /* The default policy: a public address of the host is refused too. */
  cleanup_free char *cfg2 = eph_xasprintf("tool-web: { %s };", ports_cfg());
  s = th_load(&th_plugins, "tool-web", cfg2, 0, &err);
  size_t pub_before = th_httpd_count(public_self_httpd);
  cleanup_free char *pub =
      eph_xasprintf("http://11.200.0.1:%d/text", th_httpd_port(public_self_httpd));
  r = fetch(s, pub, NULL);
  if (!str_of(r, "error") || !strstr(str_of(r, "error"), "this host's own interfaces"))
    fail_msg("%s: not refused: %s", pub, json_object_to_json_string(r));
  assert_int_equal(th_httpd_count(public_self_httpd), pub_before);
  json_object_put(r);
}

/* Ports: only allowed_ports (default 80 and 443), on the first hop and every redirect. */
static void
test_ports_refused(void **state)
{
  eph_error_t err = {0};
  const eph_plugin_slot_t *s =
      th_load(&th_plugins, "tool-web", "tool-web: { allow_loopback = true; };", 0, &err);
  int port = th_httpd_port(httpd);
  cleanup_free char *u = eph_xasprintf("http://127.0.0.1:%d/text", port);
  expect_refused(s, u, "allowed_ports");
  th_unload(&th_plugins);
  cleanup_free char *cfg = eph_xasprintf(
      "tool-web: { allow_loopback = true; allowed_ports = [%d]; max_redirects = 3; };", port);
  s = th_load(&th_plugins, "tool-web", cfg, 0, &err);
  json_object *r = fetch(s, u, NULL);
  assert_string_equal(str_of(r, "text"), "plain text body");
  json_object_put(r);
  size_t before = th_httpd_count(httpd);
  cleanup_free char *hop =
      eph_xasprintf("http://127.0.0.1:%d/redirect?to=http%%3A%%2F%%2F127.0.0.1%%3A2222%%2F", port);
  r = fetch(s, hop, NULL);
  assert_non_null(str_of(r, "error"));
  assert_non_null(strstr(str_of(r, "error"), "port 2222"));
  assert_int_equal(th_httpd_count(httpd), before + 1); /* only the first hop */
  json_object_put(r);
  /* Bad lists are configuration errors naming the key. */
  th_unload(&th_plugins);
  const char *const bad[] = {"[]", "[0]", "[65536]", "[\"80\"]", "80"};
  for (size_t i = 0; i < 5; i++) {
    cleanup_free char *b = eph_xasprintf("tool-web: { allowed_ports = %s; };", bad[i]);
    memset(&err, 0, sizeof err);
    assert_null(th_load(&th_plugins, "tool-web", b, 1, &err));
    if (!strstr(err.message, "allowed_ports"))
      fail_msg("allowed_ports = %s: error '%s' does not name the key", bad[i], err.message);
  }
}

static void
test_budget_refused_before_io(void **state)
{
  const eph_plugin_slot_t *s = load_web(NULL);
  th.budget_micros = 100; /* less than one request */
  size_t before = th_httpd_count(httpd);
  cleanup_free char *u = eph_xasprintf("http://127.0.0.1:%d/text", th_httpd_port(httpd));
  json_object *r = fetch(s, u, NULL);
  assert_string_equal(str_of(r, "reason"), "budget_exhausted");
  assert_int_equal(th_httpd_count(httpd), before);
  assert_int_equal(th.charged_micros, 0);
  json_object *ev = json_object_array_get_idx(th.events, json_object_array_length(th.events) - 1);
  assert_string_equal(str_of(ev, "kind"), "denied");
  json_object_put(r);
}

static void
test_zero_data_retention_hides_url(void **state)
{
  const eph_plugin_slot_t *s = load_web(NULL);
  eph_error_t err = {0};
  cleanup_free char *args =
      eph_xasprintf("{\"url\":\"http://127.0.0.1:%d/text?private=1\"}", th_httpd_port(httpd));
  json_object *r = th_call(s, "web_fetch", args, "{\"web\":true}", 1, &err);
  assert_string_equal(str_of(r, "text"), "plain text body");
  cleanup_free char *all = th_everything();
  assert_null(strstr(all, "private=1"));
  assert_null(strstr(all, "127.0.0.1"));
  json_object_put(r);
}

static void
test_search(void **state)
{
  cleanup_free char *extra = eph_xasprintf("search_url = \"http://127.0.0.1:%d/search\"; "
                                           "search_max_results = 2;",
                                           th_httpd_port(httpd));
  const eph_plugin_slot_t *s = load_web(extra);
  eph_error_t err = {0};
  json_object *r =
      th_call(s, "web_search", "{\"query\":\"prime numbers & more\"}", "{\"web\":true}", 0, &err);
  assert_non_null(r);
  json_object *res = NULL;
  assert_true(json_object_object_get_ex(r, "results", &res));
  assert_int_equal(json_object_array_length(res), 2);
  json_object *first = json_object_array_get_idx(res, 0);
  assert_string_equal(str_of(first, "title"), "Result 1 for prime numbers & more");
  assert_string_equal(str_of(first, "url"), "https://example.org/1");
  assert_string_equal(str_of(first, "content"), "snippet");
  assert_null(str_of(first, "engine"));
  assert_int_equal(th.charged_micros, 250);
  /* The server saw format=json and the query decoded intact. */
  json_object *reqs = th_httpd_requests(httpd);
  json_object *last = json_object_array_get_idx(reqs, json_object_array_length(reqs) - 1);
  json_object *q = NULL;
  assert_true(json_object_object_get_ex(last, "query", &q));
  assert_string_equal(str_of(q, "format"), "json");
  assert_string_equal(str_of(q, "q"), "prime numbers & more");
  json_object_put(reqs);
  json_object_put(r);
}

static void
test_search_unconfigured_and_private(void **state)
{
  eph_error_t err = {0};
  const eph_plugin_slot_t *s = th_load(&th_plugins, "tool-web", "tool-web: { };", 0, &err);
  json_object *r = th_call(s, "web_search", "{\"query\":\"x\"}", NULL, 0, &err);
  assert_non_null(strstr(str_of(r, "error"), "no search API"));
  json_object_put(r);
  th_unload(&th_plugins);
  /* A loopback search_url needs search_allow_private_addresses. */
  size_t before = th_httpd_count(httpd);
  cleanup_free char *cfg = eph_xasprintf(
      "tool-web: { search_url = \"http://127.0.0.1:%d/search\"; };", th_httpd_port(httpd));
  s = th_load(&th_plugins, "tool-web", cfg, 0, &err);
  r = th_call(s, "web_search", "{\"query\":\"x\"}", NULL, 0, &err);
  assert_non_null(strstr(str_of(r, "error"), "loopback"));
  assert_int_equal(th_httpd_count(httpd), before);
  json_object_put(r);
}

static void
test_bad_config_refused(void **state)
{
  eph_error_t err = {0};
  th_load(&th_plugins, "tool-web", "tool-web: { max_response_bytes = -1; };", 1, &err);
  assert_non_null(strstr(err.message, "positive"));
  th_load(&th_plugins, "tool-web", "tool-web: { search_url = \"ftp://x/\"; };", 1, &err);
  assert_non_null(strstr(err.message, "search_url"));
}

/* Runs `ip` commands; false when one fails. */
static bool
ip(const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  cleanup_free char *cmd = NULL;
  bool ok = vasprintf(&cmd, fmt, ap) >= 0 && system(cmd) == 0;
  va_end(ap);
  return ok;
}

int
main(void)
{
  /* Two network namespaces of our own (without the privilege, the tests that need them
   * are skipped). "host", where the test and web_fetch run: lo up, and on lo the host's
   * own addresses 10.201.0.1, 11.200.0.1 and fd00:201::1 with servers on the IPv4 ones.
   * "other", another machine behind a veth: 10.200.0.1 (a private address), reached from
   * 10.200.0.2. */
  if (unshare(CLONE_NEWNET) == 0) {
    int host_ns = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (host_ns < 0 || !ip("ip link set lo up")) {
      fprintf(stderr, "Bail out! cannot bring lo up in the test's network namespace\n");
      return 1;
    }
    if (ip("ip addr add 10.201.0.1/32 dev lo && ip addr add 11.200.0.1/32 dev lo && "
           "ip addr add fd00:201::1/128 dev lo")) {
      self_httpd = th_httpd_start("10.201.0.1");
      public_self_httpd = th_httpd_start("11.200.0.1");
    }
    int other_ns = -1;
    if (ip("ip link add eph-h type veth peer name eph-o && ip addr add 10.200.0.2/24 dev eph-h "
           "&& ip link set eph-h up") &&
        unshare(CLONE_NEWNET) == 0 &&
        (other_ns = open("/proc/thread-self/ns/net", O_RDONLY)) >= 0 &&
        setns(host_ns, CLONE_NEWNET) == 0 &&
        ip("ip link set eph-o netns /proc/%d/fd/%d", (int)getpid(), other_ns) &&
        setns(other_ns, CLONE_NEWNET) == 0 &&
        ip("ip link set lo up && ip addr add 10.200.0.1/24 dev eph-o && ip link set eph-o up"))
      private_httpd = th_httpd_start("10.200.0.1"); /* its socket stays in "other" */
    if (setns(host_ns, CLONE_NEWNET) < 0) {
      fprintf(stderr, "Bail out! cannot return to the test's network namespace\n");
      return 1;
    }
    if (other_ns >= 0)
      close(other_ns);
    close(host_ns);
  }
  httpd = th_httpd_start(NULL);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_fetch_allowed_page_reduces_html, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_head_and_text_and_size_cap, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_refusals, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_allow_list_is_label_suffix, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_redirects, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_redirect_to_loopback_refused, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_host_own_addresses_refused, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_ports_refused, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_budget_refused_before_io, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_zero_data_retention_hides_url, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_search, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_search_unconfigured_and_private, th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_bad_config_refused, th_setup, th_teardown),
  };
  int r = cmocka_run_group_tests_name("tool-web", tests, NULL, NULL);
  th_httpd_stop(httpd);
  th_httpd_stop(private_httpd);
  th_httpd_stop(self_httpd);
  th_httpd_stop(public_self_httpd);
  return r;
}
