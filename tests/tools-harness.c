/* Test harness of the tool plugins; see tools-harness.h. */
#include <config.h>

#include "tools-harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "conf.h"
#include "util.h"

/* ---------------------------------------------------------------- loading and calling */

static config_t *loaded_configs[16];
static size_t n_loaded_configs;

const eph_plugin_slot_t *
th_load(eph_plugins_t *ps, const char *name, const char *config_text, int expect_fail,
        eph_error_t *err)
{
  const char *builddir = getenv("EPH_BUILDDIR");
  cleanup_free char *path =
      eph_xasprintf("%s/plugins/.libs/%s.so", builddir ? builddir : ".", name);
  config_t *cfg = eph_xcalloc(1, sizeof *cfg);
  config_init(cfg);
  if (config_read_string(cfg, config_text ? config_text : "") != CONFIG_TRUE)
    fail_msg("test config line %d: %s", config_error_line(cfg), config_error_text(cfg));
  assert_true(n_loaded_configs < sizeof loaded_configs / sizeof loaded_configs[0]);
  loaded_configs[n_loaded_configs++] = cfg;
  const config_setting_t *block = config_lookup(cfg, name);
  int warnings = 0;
  int r = eph_plugin_load_file(ps, path, block, &th_host, &warnings, err);
  if (expect_fail) {
    assert_true(r < 0);
    return NULL;
  }
  if (r < 0)
    fail_msg("loading %s: %s", path, err->message);
  assert_int_equal(warnings, 0);
  return eph_plugins_find(ps, name);
}

eph_plugins_t th_plugins;

int
th_setup(void **state)
{
  (void)state;
  th_reset(1000000);
  return 0;
}

int
th_teardown(void **state)
{
  (void)state;
  th_unload(&th_plugins);
  th_free();
  return 0;
}

void
th_unload(eph_plugins_t *ps)
{
  eph_plugins_unload(ps);
  memset(ps, 0, sizeof *ps);
  for (size_t i = 0; i < n_loaded_configs; i++) {
    config_destroy(loaded_configs[i]);
    free(loaded_configs[i]);
  }
  n_loaded_configs = 0;
}

json_object *
th_call(const eph_plugin_slot_t *slot, const char *tool, const char *args, const char *grants,
        int zdr, eph_error_t *err)
{
  const eph_tool_ops_t *ops = slot->desc->ops;
  json_object *jargs = json_tokener_parse(args);
  json_object *jgrants = grants ? json_tokener_parse(grants) : NULL;
  assert_non_null(jargs);
  eph_tool_call_t call = {
      .struct_size = sizeof call,
      .run_id = "run_0123456789abcdef0123456789abcdef",
      .tool = tool,
      .args = jargs,
      .grants = jgrants,
      .zero_data_retention = zdr,
      .deadline_ms = eph_now_ms() + 60000,
      .run = (eph_run_t *)(uintptr_t)0x1,
  };
  json_object *result = NULL;
  int r = ops->call(slot->state, &call, &result, err);
  json_object_put(jargs);
  json_object_put(jgrants);
  if (r < 0) {
    assert_null(result);
    return NULL;
  }
  assert_non_null(result);
  return result;
}

/* ---------------------------------------------------------------- HTTP server */

struct th_httpd {
  struct MHD_Daemon *d;
  int port;
  pthread_mutex_t lock;
  json_object *requests;
};

typedef struct upload {
  char *body;
  size_t len;
} upload_t;

static enum MHD_Result
collect(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
  json_object *o = cls;
  char lower[256];
  snprintf(lower, sizeof lower, "%s", key);
  for (char *c = lower; *c; c++)
    *c = (char)(*c >= 'A' && *c <= 'Z' ? *c + 32 : *c);
  json_object_object_add(o, lower, json_object_new_string(value ? value : ""));
  return MHD_YES;
}

static enum MHD_Result
reply(struct MHD_Connection *c, unsigned status, const char *type, const char *body, size_t len,
      const char *hname, const char *hvalue)
{
  struct MHD_Response *r =
      MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
  MHD_add_response_header(r, "Content-Type", type);
  if (hname && hvalue)
    MHD_add_response_header(r, hname, hvalue);
  enum MHD_Result ret = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result
handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
       const char *version, const char *upload_data, size_t *upload_size, void **con_cls)
{
  th_httpd_t *h = cls;
  upload_t *up = *con_cls;
  if (!up) {
    up = eph_xcalloc(1, sizeof *up);
    *con_cls = up;
    return MHD_YES;
  }
  if (*upload_size) {
    up->body = eph_xrealloc(up->body, up->len + *upload_size + 1);
    memcpy(up->body + up->len, upload_data, *upload_size);
    up->len += *upload_size;
    up->body[up->len] = 0;
    *upload_size = 0;
    return MHD_YES;
  }
  json_object *headers = json_object_new_object(), *query = json_object_new_object();
  MHD_get_connection_values(c, MHD_HEADER_KIND, collect, headers);
  MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, collect, query);
  json_object *rec = json_object_new_object();
  json_object_object_add(rec, "method", json_object_new_string(method));
  json_object_object_add(rec, "url", json_object_new_string(url));
  json_object_object_add(rec, "query", query);
  json_object_object_add(rec, "headers", headers);
  json_object_object_add(rec, "body",
                         json_object_new_string_len(up->body ? up->body : "", (int)up->len));
  pthread_mutex_lock(&h->lock);
  json_object_array_add(h->requests, json_object_get(rec));
  pthread_mutex_unlock(&h->lock);

  enum MHD_Result ret;
  if (strcmp(url, "/page.html") == 0) {
    static const char page[] =
        "<!DOCTYPE html><html><head><title>Sandbox   proof</title>"
        "<style>body { color: red; }</style><script>var secret = 'script text';</script>"
        "</head><body><h1>Primes</h1><p>Two,\n   three   and <b>five</b>.</p>"
        "<script>document.write('more script')</script><ul><li>seven</li><li>eleven</li></ul>"
        "</body></html>";
    ret = reply(c, 200, "text/html; charset=utf-8", page, sizeof page - 1, NULL, NULL);
  } else if (strcmp(url, "/text") == 0) {
    ret = reply(c, 200, "text/plain", "plain text body", 15, NULL, NULL);
  } else if (strcmp(url, "/big") == 0) {
    size_t n = 1 << 20;
    char *big = eph_xmalloc(n);
    memset(big, 'x', n);
    ret = reply(c, 200, "text/plain", big, n, NULL, NULL);
    free(big);
  } else if (strcmp(url, "/redirect") == 0) {
    const char *to = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "to");
    ret = reply(c, 302, "text/plain", "moved", 5, "Location", to ? to : "/redirect");
  } else if (strcmp(url, "/search") == 0) {
    const char *q = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "q");
    json_object *doc = json_object_new_object(), *res = json_object_new_array();
    for (int i = 1; i <= 3; i++) {
      json_object *it = json_object_new_object();
      char buf[256];
      snprintf(buf, sizeof buf, "Result %d for %s", i, q ? q : "");
      json_object_object_add(it, "title", json_object_new_string(buf));
      snprintf(buf, sizeof buf, "https://example.org/%d", i);
      json_object_object_add(it, "url", json_object_new_string(buf));
      json_object_object_add(it, "content", json_object_new_string("snippet"));
      json_object_object_add(it, "engine", json_object_new_string("dropped"));
      json_object_array_add(res, it);
    }
    json_object_object_add(doc, "results", res);
    const char *s = json_object_to_json_string(doc);
    ret = reply(c, 200, "application/json", s, strlen(s), NULL, NULL);
    json_object_put(doc);
  } else {
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *s = json_object_to_json_string(rec);
    ret = reply(c, 200, "application/json", s, strlen(s), "X-Echo-Authorization", auth);
  }
  json_object_put(rec);
  return ret;
}

static void
completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode t)
{
  upload_t *up = *con_cls;
  if (up) {
    free(up->body);
    free(up);
  }
  *con_cls = NULL;
}

const char *
str_of(json_object *o, const char *key)
{
  json_object *v = NULL;
  return json_object_object_get_ex(o, key, &v) ? json_object_get_string(v) : NULL;
}

th_httpd_t *
th_httpd_start(const char *ipv4)
{
  th_httpd_t *h = eph_xcalloc(1, sizeof *h);
  pthread_mutex_init(&h->lock, NULL);
  h->requests = json_object_new_array();
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
  assert_int_equal(inet_pton(AF_INET, ipv4 ? ipv4 : "127.0.0.1", &sa.sin_addr), 1);
  h->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL,
                          handle, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                          MHD_OPTION_NOTIFY_COMPLETED, completed, NULL, MHD_OPTION_END);
  assert_non_null(h->d);
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
  assert_non_null(info);
  h->port = info->port;
  assert_true(h->port > 0);
  return h;
}

int
th_httpd_port(const th_httpd_t *h)
{
  return h->port;
}

size_t
th_httpd_count(th_httpd_t *h)
{
  pthread_mutex_lock(&h->lock);
  size_t n = json_object_array_length(h->requests);
  pthread_mutex_unlock(&h->lock);
  return n;
}

json_object *
th_httpd_requests(th_httpd_t *h)
{
  json_object *copy = NULL;
  pthread_mutex_lock(&h->lock);
  json_object_deep_copy(h->requests, &copy, NULL);
  pthread_mutex_unlock(&h->lock);
  return copy;
}

void
th_httpd_stop(th_httpd_t *h)
{
  if (!h)
    return;
  MHD_stop_daemon(h->d);
  json_object_put(h->requests);
  pthread_mutex_destroy(&h->lock);
  free(h);
}
