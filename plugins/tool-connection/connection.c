/* tool-connection: the broker. The operator defines connections in conf.d (base URL,
 * credential, how it is applied, allowed methods and path prefixes); a run's permission
 * table names the connections it may use and may narrow their methods. The tool call names
 * a connection, a method and a path; everything is decided here, on the host, BEFORE any
 * network I/O: grant, method (operator ∩ grant), path (normalised, under an allowed
 * prefix), headers (only the connection's allow-list; the caller cannot place or override
 * the credential, nor override the method or URL). The credential is read at init, added per
 * request, and scrubbed in every form the scrubber knows (see "the scrubber") from
 * everything that leaves: results, events, logs. Redirects are never followed: a
 * credential must not travel to a Location the operator did not name. In the spirit of
 * OpenSSH's monitor: the side holding secrets serves a fixed table of allowed requests. */
#include "config.h"

#include <ctype.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <curl/curl.h>
#include <openssl/crypto.h>

#include <ephemeral/plugin.h>

#include "connection.h"
#include "support/base64.h"
#include "support/cleanup.h"
#include "support/text.h"

static const eph_config_key_t broker_keys[] = {
    {"connections", EPH_CFG_LIST, "()", NULL,
     "The connections, a list of groups: name, base_url, credential_file or credential_env, "
     "apply (\"bearer\" | \"basic\" | \"header\" | \"query\"), header_name / query_param, "
     "methods (list), path_prefixes (list), allowed_headers (list: the only caller headers "
     "that go out, case-insensitive; default Accept, Accept-Language, Content-Type, "
     "User-Agent, If-Match, If-None-Match, If-Modified-Since, If-Unmodified-Since; others are "
     "dropped with a header_dropped event; credential, transport, Accept-Encoding, Range and "
     "method/URL override headers cannot be listed), allow_private_addresses (bool: also "
     "allows loopback). Empty: the broker offers nothing."},
    {"max_response_bytes", EPH_CFG_INT, "1048576", "bytes",
     "Response body bytes kept, at most 1073741824. The broker reads a little further (about "
     "32 times the credential's length) so that a form of the credential the cut falls into "
     "is scrubbed whole before the body is cut here.",
     EPH_CFG_RANGE(1, 1073741824)},
    {"timeout_ms", EPH_CFG_INT, "30000", "milliseconds", "Time limit of one request.",
     EPH_CFG_RANGE(1, INT64_MAX)},
    {"price_micros_per_request", EPH_CFG_INT, "0", "micros",
     "Charged to the run (category web) before each request.", EPH_CFG_RANGE(0, INT64_MAX)},
    {0},
};

static const eph_tool_def_t broker_tools[] = {
    {"connection_request",
     "Call an operator-defined API connection. The broker adds the credential; you choose "
     "only the connection, method, path (relative to the connection's base URL, starting "
     "with /), optional headers and body. Returns status, headers and body.",
     "{\"type\":\"object\",\"properties\":{"
     "\"connection\":{\"type\":\"string\"},"
     "\"method\":{\"type\":\"string\"},"
     "\"path\":{\"type\":\"string\",\"description\":\"starts with /, may carry ?query\"},"
     "\"headers\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"}},"
     "\"body\":{\"type\":\"string\"}},"
     "\"required\":[\"connection\",\"method\",\"path\"],\"additionalProperties\":false}",
     EPH_PERM_CONNECTIONS},
};

/* ---------------------------------------------------------------- checks */

static const conn_t *
find_conn(const broker_t *b, const char *name)
{
  for (size_t i = 0; i < b->n_conns; i++)
    if (strcmp(b->conns[i].name, name) == 0)
      return &b->conns[i];
  return NULL;
}

/* The grant for `name` in the run's permission table, or NULL. */
static json_object *
find_grant(json_object *grants, const char *name)
{
  json_object *list = NULL;
  if (!grants || !json_object_object_get_ex(grants, "connections", &list) ||
      !json_object_is_type(list, json_type_array))
    return NULL;
  for (size_t i = 0; i < json_object_array_length(list); i++) {
    json_object *g = json_object_array_get_idx(list, i), *n = NULL;
    if (json_object_is_type(g, json_type_string) && strcmp(json_object_get_string(g), name) == 0)
      return g;
    if (json_object_is_type(g, json_type_object) && json_object_object_get_ex(g, "name", &n) &&
        json_object_is_type(n, json_type_string) && strcmp(json_object_get_string(n), name) == 0)
      return g;
  }
  return NULL;
}

static bool
method_allowed(const conn_t *c, json_object *grant, const char *method)
{
  bool op = false;
  for (size_t i = 0; i < c->n_methods; i++)
    op |= strcmp(c->methods[i], method) == 0;
  if (!op)
    return false;
  json_object *ms = NULL;
  if (!json_object_is_type(grant, json_type_object) ||
      !json_object_object_get_ex(grant, "methods", &ms) || !ms)
    return true; /* the grant does not narrow */
  if (!json_object_is_type(ms, json_type_array))
    return false;
  for (size_t i = 0; i < json_object_array_length(ms); i++) {
    const char *m = json_object_get_string(json_object_array_get_idx(ms, i));
    if (m && strcasecmp(m, method) == 0)
      return true;
  }
  return false;
}

/* Checks the caller's path (relative to base_url): NULL when acceptable, else why not.
 * Conservative on purpose: encoded dots, slashes, backslashes and percent signs, dot
 * segments, empty segments, ';' parameters, backslashes, controls and anything that could
 * read as a scheme or authority are refused rather than normalised, so what the server
 * sees is exactly what was checked. */
static const char *
path_refusal(const conn_t *c, const char *path)
{
  if (path[0] != '/')
    return "path must start with '/'";
  if (path[1] == '/')
    return "path must not start with '//'";
  size_t plen = strcspn(path, "?");
  for (const char *p = path; *p; p++) {
    unsigned char ch = (unsigned char)*p;
    if (ch <= 0x20 || ch >= 0x7f)
      return "path contains a space, control or non-ASCII byte (percent-encode it)";
    if (ch == '\\')
      return "path contains a backslash";
    if (ch == '#')
      return "path contains a fragment";
    if (ch == '%') {
      if (!isxdigit((unsigned char)p[1]) || !isxdigit((unsigned char)p[2]))
        return "path contains a malformed percent escape";
      if ((size_t)(p - path) < plen) {
        char h[3] = {p[1], p[2], 0};
        long v = strtol(h, NULL, 16);
        if (v == '.' || v == '/' || v == '\\' || v == '%' || v == ';' || v == '?' || v == '#' ||
            v < 0x20)
          return "path contains an encoded '.', '/', '\\', '%', ';', '?', '#' or control";
      }
    }
  }
  /* Segments of the path part. */
  for (const char *s = path + 1; (size_t)(s - path) <= plen;) {
    size_t n = strcspn(s, "/?");
    if ((size_t)(s - path) + n > plen)
      n = plen - (size_t)(s - path);
    if ((n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
      return "path contains a '.' or '..' segment";
    if (n == 0 && (size_t)(s - path) < plen)
      return "path contains an empty segment ('//')";
    if (memchr(s, ';', n))
      return "path contains ';'";
    s += n + 1;
  }
  for (size_t i = 0; i < c->n_prefixes; i++) {
    const char *pre = c->prefixes[i];
    size_t n = strlen(pre);
    if (strncmp(path, pre, n) != 0 || n > plen)
      continue;
    /* "/repos" allows "/repos" and "/repos/..." but not "/reposx". */
    if (pre[n - 1] == '/' || n == plen || path[n] == '/')
      return NULL;
  }
  return "path is outside the connection's allowed path prefixes";
}

/* ---------------------------------------------------------------- the call */

typedef struct req_ctx {
  broker_t *b;
  const eph_tool_call_t *call;
  const conn_t *c;
  const char *path; /* as the caller gave it: never carries the secret */
} req_ctx_t;

static int
before_request(void *opaque, const char *method, const char *url, int hop, eph_error_t *err)
{
  (void)url; /* may carry the credential (apply = query): never emitted */
  req_ctx_t *x = opaque;
  const eph_host_t *host = x->b->host;
  int r;
  if (x->b->price_micros > 0 && (r = host->charge(x->call->run, EPH_COST_WEB, x->b->price_micros,
                                                  "connection_request", err)) < 0)
    return r;
  cleanup_json json_object *data = json_object_new_object();
  json_object_object_add(data, "connection", json_object_new_string(x->c->name));
  json_object_object_add(data, "method", json_object_new_string(method));
  cleanup_free char *text = NULL;
  /* The path is the caller's, but nothing is stored that the scrubber has not seen. */
  cleanup_free char *path = scrub_str(x->c, x->path);
  if (!path)
    return eph_error_set(err, ENOMEM, "out of memory");
  if (x->call->zero_data_retention)
    r = asprintf(&text, "%s %s (path withheld: zero data retention)", method, x->c->name);
  else {
    json_object_object_add(data, "path", json_object_new_string(path));
    r = asprintf(&text, "%s %s %s", method, x->c->name, path);
  }
  if (r < 0)
    return eph_error_set(err, ENOMEM, "out of memory");
  return host->emit(x->call->run, "Connection", "connection_request", text, data, err);
}

static json_object *
refuse(broker_t *b, const eph_tool_call_t *call, const conn_t *c, const char *reason,
       const char *msg)
{
  eph_error_t ignore = {0};
  cleanup_free char *clean = c ? scrub_str(c, msg) : strdup(msg);
  cleanup_json json_object *data = json_object_new_object();
  json_object_object_add(data, "reason", json_object_new_string(reason));
  b->host->emit(call->run, "Connection", "denied",
                call->zero_data_retention ? reason : (clean ? clean : reason), data, &ignore);
  json_object *res = json_object_new_object();
  json_object_object_add(res, "error", json_object_new_string(clean ? clean : reason));
  json_object_object_add(res, "reason", json_object_new_string(reason));
  return res;
}

/* The caller's headers that were not on the connection's allow-list: an event, so the
 * timeline shows what was withheld from the upstream. Names only (never values); under zero
 * data retention only how many. */
static void
emit_dropped(broker_t *b, const eph_tool_call_t *call, const conn_t *c, const char *method,
             json_object *dropped)
{
  eph_error_t ignore = {0};
  size_t n = json_object_array_length(dropped);
  cleanup_json json_object *data = json_object_new_object();
  json_object_object_add(data, "connection", json_object_new_string(c->name));
  json_object_object_add(data, "method", json_object_new_string(method));
  json_object_object_add(data, "count", json_object_new_int((int)n));
  cleanup_free char *text = NULL;
  if (call->zero_data_retention) {
    if (asprintf(&text, "%s %s: %zu header%s not allowed, dropped", method, c->name, n,
                 n == 1 ? "" : "s") < 0)
      text = NULL;
  } else {
    /* The names are the caller's, but nothing is stored that the scrubber has not seen. */
    json_object *list = json_object_new_array();
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
      char *name = scrub_str(c, json_object_get_string(json_object_array_get_idx(dropped, i)));
      json_object_array_add(list, json_object_new_string(name ? name : "?"));
      len += (name ? strlen(name) : 1) + 2;
      free(name);
    }
    json_object_object_add(data, "headers", list);
    cleanup_free char *names = calloc(1, len + 1);
    for (size_t i = 0; names && i < n; i++) {
      if (i)
        strcat(names, ", ");
      strcat(names, json_object_get_string(json_object_array_get_idx(list, i)));
    }
    if (asprintf(&text, "%s %s: header%s not allowed, dropped: %s", method, c->name,
                 n == 1 ? "" : "s", names ? names : "?") < 0)
      text = NULL;
  }
  b->host->emit(call->run, "Connection", "header_dropped", text ? text : "headers dropped", data,
                &ignore);
}

static int
broker_call(void *state, const eph_tool_call_t *call, json_object **result, eph_error_t *err)
{
  broker_t *b = state;
  if (strcmp(call->tool, "connection_request") != 0)
    return eph_error_set(err, EINVAL, "tool-connection has no tool '%s'", call->tool);
  const char *name = eph_json_get_string(call->args, "connection"),
             *m = eph_json_get_string(call->args, "method"),
             *path = eph_json_get_string(call->args, "path");
  if (!name || !m || !path) {
    *result =
        eph_error_result("arguments 'connection', 'method' and 'path' (strings) are required");
    return 0;
  }
  const conn_t *c = find_conn(b, name);
  json_object *grant = find_grant(call->grants, name);
  if (!c || !grant) {
    *result = refuse(b, call, NULL, "not_granted", "this run is not granted that connection");
    return 0;
  }
  char method[16];
  size_t ml = strlen(m);
  if (ml == 0 || ml >= sizeof method) {
    *result = refuse(b, call, c, "method", "method is not allowed");
    return 0;
  }
  for (size_t i = 0; i <= ml; i++)
    method[i] = (char)toupper((unsigned char)m[i]);
  if (!valid_token(method) || !method_allowed(c, grant, method)) {
    char msg[128];
    snprintf(msg, sizeof msg, "method %s is not allowed on connection '%s'", method, c->name);
    *result = refuse(b, call, c, "method", msg);
    return 0;
  }
  const char *why = path_refusal(c, path);
  if (why) {
    *result = refuse(b, call, c, "path", why);
    return 0;
  }
  if (c->apply == APPLY_QUERY) {
    /* The caller cannot set (or shadow) the broker's query parameter. */
    const char *q = strchr(path, '?');
    size_t ql = strlen(c->query_param);
    for (const char *p = q; p && *p; p = strchr(p + 1, '&'))
      if (strncmp(p + 1, c->query_param, ql) == 0 &&
          (p[1 + ql] == '=' || p[1 + ql] == '&' || p[1 + ql] == 0)) {
        *result = refuse(b, call, c, "header",
                         "the query parameter carrying the credential "
                         "is set by the broker");
        return 0;
      }
  }
  if (!c->secret) {
    *result = refuse(b, call, c, "unavailable",
                     "the connection's credential is not available on this host");
    return 0;
  }

  /* A body on GET or HEAD: servers and proxies disagree on whether it is part of the
   * request or the start of the next one, so it is refused rather than sent. */
  json_object *jb = NULL;
  if (json_object_object_get_ex(call->args, "body", &jb) && jb) {
    if (!json_object_is_type(jb, json_type_string)) {
      *result = eph_error_result("argument 'body' must be a string");
      return 0;
    }
    if (json_object_get_string_len(jb) > 0 &&
        (strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0)) {
      char msg[128];
      snprintf(msg, sizeof msg,
               "a %s request cannot carry a body: drop 'body' or use a method "
               "that takes one",
               method);
      *result = refuse(b, call, c, "body", msg);
      return 0;
    }
  }

  /* Headers: only the connection's allow-list goes out; the rest are dropped (and the drop
   * is an event). The credential, routing, encoding and method/URL override headers can
   * never be on the list. */
  struct curl_slist *hdrs = NULL;
  json_object *jh = NULL;
  json_object *dropped = json_object_new_array();
  if (json_object_object_get_ex(call->args, "headers", &jh) && jh) {
    if (!json_object_is_type(jh, json_type_object)) {
      json_object_put(dropped);
      *result = eph_error_result("argument 'headers' must be an object of strings");
      return 0;
    }
    json_object_object_foreach(jh, hk, hv) {
      const char *v = json_object_get_string(hv);
      if (!valid_token(hk) || !json_object_is_type(hv, json_type_string) || strpbrk(v, "\r\n")) {
        curl_slist_free_all(hdrs);
        json_object_put(dropped);
        *result = eph_error_result("headers must be token names with single-line string values");
        return 0;
      }
      if (!header_allowed(c, hk)) {
        json_object_array_add(dropped, json_object_new_string(hk));
        continue;
      }
      cleanup_free char *line = NULL;
      if (asprintf(&line, *v ? "%s: %s" : "%s;", hk, v) < 0)
        break;
      hdrs = curl_slist_append(hdrs, line);
    }
  }
  /* curl adds these unless told not to; the broker's request must not carry an Expect. */
  hdrs = curl_slist_append(hdrs, "Expect:");
  char *cred_line = NULL;
  cleanup_free char *url = NULL;
  int r = 0;
  switch (c->apply) {
  case APPLY_BEARER:
    r = asprintf(&cred_line, "Authorization: Bearer %s", c->secret);
    break;
  case APPLY_BASIC: {
    char *enc = eph_base64_encode(c->secret, strlen(c->secret));
    r = enc ? asprintf(&cred_line, "Authorization: Basic %s", enc) : -1;
    eph_free_secret(enc);
    break;
  }
  case APPLY_HEADER:
    r = asprintf(&cred_line, "%s: %s", c->header_name, c->secret);
    break;
  case APPLY_QUERY:
    break;
  }
  if (r < 0) {
    curl_slist_free_all(hdrs);
    json_object_put(dropped);
    return eph_error_set(err, ENOMEM, "out of memory");
  }
  if (cred_line)
    hdrs = curl_slist_append(hdrs, cred_line);
  if (c->apply == APPLY_QUERY) {
    char *esc = curl_easy_escape(NULL, c->secret, 0);
    r = esc ? asprintf(&url, "%s%s%s%s=%s", c->base_url, path, strchr(path, '?') ? "&" : "?",
                       c->query_param, esc)
            : -1;
    if (esc) {
      explicit_bzero(esc, strlen(esc));
      curl_free(esc);
    }
  } else
    r = asprintf(&url, "%s%s", c->base_url, path);
  if (r < 0) {
    url = NULL;
    curl_slist_free_all(hdrs);
    json_object_put(dropped);
    return eph_error_set(err, ENOMEM, "out of memory");
  }

  /* Defence in depth: whatever the path held, the URL must still name the base's host. */
  {
    cleanup_free char *h1 = NULL, *h2 = NULL;
    int p1 = 0, p2 = 0;
    eph_error_t ig = {0};
    if (eph_net_url_host(c->base_url, &h1, &p1, &ig) < 0 ||
        eph_net_url_host(url, &h2, &p2, &ig) < 0 || strcmp(h1, h2) != 0 || p1 != p2) {
      explicit_bzero(url, strlen(url));
      curl_slist_free_all(hdrs);
      eph_free_secret(cred_line);
      json_object_put(dropped);
      *result = refuse(b, call, c, "path", "path changes the connection's host");
      return 0;
    }
  }
  if (json_object_array_length(dropped) > 0)
    emit_dropped(b, call, c, method, dropped);
  const char *body = eph_json_get_string(call->args, "body");
  int64_t t = eph_net_time_left(b->timeout_ms, call->deadline_ms);
  req_ctx_t ctx = {b, call, c, path};
  eph_net_request_t req = {
      .url = url,
      .method = method,
      .headers = hdrs,
      .body = body,
      .body_bytes = body ? strlen(body) : 0,
      /* Past the cap by the longest escaped form of the secret: scrubbed, then cut. */
      .max_response_bytes = (size_t)b->max_response_bytes + c->margin_bytes,
      .max_redirects = 0,
      .check_domains = 0,
      .before_request = before_request,
      .opaque = &ctx,
  };
  eph_net_response_t resp;
  eph_error_t e = {0};
  r = eph_net_fetch_within(&c->policy, &req, t, &resp, &e);
  curl_slist_free_all(hdrs);
  eph_free_secret(cred_line);
  explicit_bzero(url, strlen(url));
  if (r < 0) {
    json_object_put(dropped);
    *result = refuse(b, call, c,
                     e.code == EPH_E_BUDGET   ? "budget_exhausted"
                     : e.code == EPH_E_DENIED ? "address"
                                              : "failed",
                     e.message);
    return 0;
  }

  /* Everything from the upstream passes the scrubber before it is kept: header names and
   * values, and the body, scrubbed whole (up to the cap plus the margin) and then cut at the
   * cap. Out of memory while scrubbing fails closed. */
  json_object *res = json_object_new_object();
  json_object_object_add(res, "connection", json_object_new_string(c->name));
  json_object_object_add(res, "status", json_object_new_int((int)resp.status));
  json_object *outh = json_object_new_object();
  bool clean = true;
  json_object_object_foreach(resp.headers, rk, rv) {
    if (strcasecmp(rk, "set-cookie") == 0)
      continue; /* session material of the connection, not the run's */
    cleanup_free char *k = scrub_str(c, rk);
    cleanup_free char *v = scrub_str(c, json_object_get_string(rv));
    clean = clean && k && v;
    json_object *prev = NULL;
    if (k && v && json_object_object_get_ex(outh, k, &prev)) {
      /* Two names scrubbed to the same text: keep both values, as repeated headers are. */
      cleanup_free char *joined = NULL;
      if (asprintf(&joined, "%s, %s", json_object_get_string(prev), v) < 0)
        joined = NULL;
      clean = clean && joined;
      json_object_object_add(outh, k, json_object_new_string(joined ? joined : ""));
    } else if (k && v)
      json_object_object_add(outh, k, json_object_new_string(v));
  }
  json_object_object_add(res, "headers", outh);
  size_t cap = (size_t)b->max_response_bytes, bn = 0;
  cleanup_free char *body_out =
      resp.body ? scrub_copy(c, resp.body, resp.body_bytes, cap, &bn) : strdup("");
  clean = clean && body_out;
  if (body_out && bn == 0)
    json_object_object_add(res, "body", json_object_new_string(""));
  else if (body_out && eph_utf8_is_text((const unsigned char *)body_out, bn))
    json_object_object_add(res, "body", json_object_new_string_len(body_out, (int)bn));
  else if (body_out) {
    cleanup_free char *enc = eph_base64_encode(body_out, bn);
    clean = clean && enc;
    json_object_object_add(res, "body_base64", json_object_new_string(enc ? enc : ""));
  }
  json_object_object_add(res, "truncated",
                         json_object_new_boolean(resp.truncated || resp.body_bytes > cap));
  if (json_object_array_length(dropped) > 0)
    json_object_object_add(res, "dropped_headers", dropped);
  else
    json_object_put(dropped);
  eph_net_response_clear(&resp);
  /* Last look, at the very text that will be stored and shown: nothing the scrubber has not
   * passed leaves, even if a part above was missed. */
  const char *txt = json_object_to_json_string_ext(res, JSON_C_TO_STRING_PLAIN);
  span_t *sp = NULL;
  ssize_t ns = clean ? find_spans(c, txt, strlen(txt), &sp) : -1;
  free(sp);
  if (ns != 0) {
    json_object_put(res);
    *result = refuse(b, call, c, "scrub",
                     ns < 0 ? "the response could not be scrubbed (out of memory): withheld"
                            : "the response still carried the credential after scrubbing: "
                              "withheld");
    return 0;
  }
  *result = res;
  return 0;
}

/* ---------------------------------------------------------------- lifecycle */

static void
broker_fini(void *state)
{
  broker_t *b = state;
  if (!b)
    return;
  for (size_t i = 0; i < b->n_conns; i++)
    conn_clear(&b->conns[i]);
  free(b->conns);
  free(b);
  curl_global_cleanup();
}

static int
broker_init(const eph_host_t *host, const config_setting_t *config, void **state, eph_error_t *err)
{
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
    return eph_error_set(err, EIO, "curl_global_init failed");
  broker_t *b = calloc(1, sizeof *b);
  int r;
  if (!b) {
    curl_global_cleanup();
    return eph_error_set(err, ENOMEM, "out of memory");
  }
  b->host = host;
  if ((r = host->cfg_int(config, "max_response_bytes", 1048576, &b->max_response_bytes, err)) < 0 ||
      (r = host->cfg_int(config, "timeout_ms", 30000, &b->timeout_ms, err)) < 0 ||
      (r = host->cfg_int(config, "price_micros_per_request", 0, &b->price_micros, err)) < 0)
    goto fail;
  config_setting_t *list = config ? config_setting_get_member(config, "connections") : NULL;
  int n = list ? config_setting_length(list) : 0;
  if (list && !config_setting_is_aggregate(list)) {
    r = cfg_fail(list, err, "%s", "'connections' must be a list of groups");
    goto fail;
  }
  b->conns = calloc((size_t)n + 1, sizeof *b->conns);
  if (!b->conns) {
    r = eph_error_set(err, ENOMEM, "out of memory");
    goto fail;
  }
  for (int i = 0; i < n; i++) {
    b->n_conns++;
    if ((r = conn_load(host, config_setting_get_elem(list, (unsigned)i), &b->conns[i], err)) < 0)
      goto fail;
    for (int j = 0; j < i; j++)
      if (strcmp(b->conns[j].name, b->conns[i].name) == 0) {
        r = cfg_fail(config_setting_get_elem(list, (unsigned)i), err,
                     "connection '%s' is defined twice", b->conns[i].name);
        goto fail;
      }
  }
  *state = b;
  return 0;
fail:
  broker_fini(b);
  return r;
}

/* The core asks before admitting a run that grants `name` (the connections are fixed at
 * init: nothing to lock). */
static int
broker_connection_defined(void *state, const char *name)
{
  return find_conn(state, name) ? 1 : 0;
}

static const eph_tool_ops_t broker_ops = {
    .struct_size = sizeof(eph_tool_ops_t),
    .tools = broker_tools,
    .n_tools = sizeof broker_tools / sizeof broker_tools[0],
    .call = broker_call,
    .connection_defined = broker_connection_defined,
};

EPH_PLUGIN_EXPORT = {
    .abi_major = EPH_ABI_MAJOR,
    .abi_minor = EPH_ABI_MINOR,
    .struct_size = sizeof(eph_plugin_t),
    .name = "tool-connection",
    .kind = EPH_KIND_TOOL,
    .version = PACKAGE_VERSION,
    .description = "the connection broker: operator-defined API connections, credentials "
                   "added on the host",
    .config_keys = broker_keys,
    .init = broker_init,
    .fini = broker_fini,
    .ops = &broker_ops,
};
