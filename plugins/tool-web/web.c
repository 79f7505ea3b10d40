/* tool-web: web_fetch and web_search, run on the host (the sandbox never sees the network
 * through this tool). Every request: URL and domain checks, a charge (EPH_COST_WEB) before
 * any I/O, an event on the timeline, then net.c's pinned fetch (addresses resolved and
 * checked here, redirects re-checked hop by hop). HTML is reduced to readable text with
 * libxml2's HTML parser. */
#include "config.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>
#include <libxml/HTMLparser.h>
#include <libxml/tree.h>

#include <ephemeral/plugin.h>

#include "support/cleanup.h"
#include "support/net.h"
#include "support/text.h"

typedef struct web {
  const eph_host_t *host;
  eph_net_policy_t policy;
  eph_net_policy_t search_policy; /* the operator's search API: domain lists do not apply */
  char **methods;
  size_t n_methods;
  int64_t max_response_bytes, max_text_bytes, timeout_ms, max_redirects;
  int64_t price_micros;
  const char *search_url;
  int64_t search_max_results;
} web_t;

static const eph_config_key_t web_keys[] = {
    {"allow_domains", EPH_CFG_LIST, "[]", NULL,
     "Domains web_fetch may reach (a name matches itself and its subdomains). Empty: every "
     "domain not denied."},
    {"deny_domains", EPH_CFG_LIST, "[]", NULL,
     "Domains web_fetch must not reach, with their subdomains. Wins over allow_domains."},
    {"allow_private_addresses", EPH_CFG_BOOL, "false", NULL,
     "Allow private addresses (RFC 1918, CGNAT 100.64/10, IPv6 ULA). Link-local (cloud "
     "metadata), multicast and unspecified addresses stay refused."},
    {"allow_loopback", EPH_CFG_BOOL, "false", NULL,
     "Allow loopback addresses (127/8, ::1). For tests against a local server."},
    {"allowed_ports", EPH_CFG_LIST, "[80, 443]", NULL,
     "TCP ports web_fetch (every redirect hop) and the sandbox's egress proxy may connect "
     "to. Not empty. The host's own interface addresses are refused on every port."},
    {"methods", EPH_CFG_LIST, "[\"GET\", \"HEAD\"]", NULL,
     "HTTP methods web_fetch accepts (upper case)."},
    {"max_response_bytes", EPH_CFG_INT, "2097152", "bytes",
     "Response body bytes read at most; the transfer stops there.", EPH_CFG_RANGE(1, INT64_MAX)},
    {"max_text_bytes", EPH_CFG_INT, "65536", "bytes",
     "Text bytes handed to the model at most (after HTML reduction).", EPH_CFG_RANGE(1, INT64_MAX)},
    {"timeout_ms", EPH_CFG_INT, "20000", "milliseconds",
     "Time limit of one web_fetch or web_search, redirects included (the run deadline also "
     "applies).",
     EPH_CFG_RANGE(1, INT64_MAX)},
    {"max_redirects", EPH_CFG_INT, "5", NULL, "Redirects followed at most; each is re-checked.",
     EPH_CFG_RANGE(0, INT64_MAX)},
    {"price_micros_per_request", EPH_CFG_INT, "1000", "micros",
     "Charged to the run (category web) before each HTTP request, redirects included.",
     EPH_CFG_RANGE(0, INT64_MAX)},
    {"search_url", EPH_CFG_STRING, "\"\"", NULL,
     "Search API with SearXNG's JSON shape: GET <search_url>?q=...&format=json. Empty: "
     "web_search answers that no search API is configured."},
    {"search_allow_private_addresses", EPH_CFG_BOOL, "false", NULL,
     "Let search_url be on a private or loopback address (a SearXNG next to the host)."},
    {"search_max_results", EPH_CFG_INT, "8", NULL, "Results web_search returns at most.",
     EPH_CFG_RANGE(1, INT64_MAX)},
    {0},
};

static const eph_tool_def_t web_tools[] = {
    {"web_fetch",
     "Fetch a web page (http or https) and return its status, content type and readable text "
     "(HTML is reduced to text).",
     "{\"type\":\"object\",\"properties\":{"
     "\"url\":{\"type\":\"string\",\"description\":\"absolute http(s) URL\"},"
     "\"method\":{\"type\":\"string\",\"description\":\"GET (default) or HEAD\"}},"
     "\"required\":[\"url\"],\"additionalProperties\":false}",
     EPH_PERM_WEB},
    {"web_search", "Search the web; returns a list of results with title, url and snippet.",
     "{\"type\":\"object\",\"properties\":{"
     "\"query\":{\"type\":\"string\",\"description\":\"search terms\"}},"
     "\"required\":[\"query\"],\"additionalProperties\":false}",
     EPH_PERM_WEB},
};

/* ---------------------------------------------------------------- HTML to text */

typedef struct text {
  char *buf;
  size_t len, cap, limit;
  int pending_space, pending_newlines, full;
} text_t;

static void
text_put(text_t *t, const char *s, size_t n)
{
  if (t->full)
    return;
  if (t->len + n + 1 > t->cap) {
    size_t cap = t->cap ? t->cap : 4096;
    while (cap < t->len + n + 1)
      cap *= 2;
    char *b = realloc(t->buf, cap);
    if (!b) {
      t->full = 1;
      return;
    }
    t->buf = b;
    t->cap = cap;
  }
  memcpy(t->buf + t->len, s, n);
  t->len += n;
  t->buf[t->len] = 0;
  if (t->len >= t->limit)
    t->full = 1;
}

/* Appends text with whitespace runs collapsed to one space; block boundaries (newlines)
 * are emitted lazily so none leads or trails. */
static void
text_words(text_t *t, const char *s)
{
  for (const char *p = s; *p && !t->full;) {
    if (isspace((unsigned char)*p)) {
      t->pending_space = 1;
      p++;
      continue;
    }
    const char *w = p;
    while (*p && !isspace((unsigned char)*p))
      p++;
    if (t->len > 0) {
      if (t->pending_newlines)
        text_put(t, "\n\n", t->pending_newlines > 1 ? 2 : 1);
      else if (t->pending_space)
        text_put(t, " ", 1);
    }
    t->pending_space = t->pending_newlines = 0;
    text_put(t, w, (size_t)(p - w));
  }
}

static bool
name_in(const xmlChar *name, const char *const *list)
{
  for (; *list; list++)
    if (xmlStrcasecmp(name, (const xmlChar *)*list) == 0)
      return true;
  return false;
}

static void
walk(text_t *t, xmlNode *n)
{
  static const char *const skip[] = {"script", "style",  "noscript", "template", "svg",
                                     "iframe", "object", "head",     NULL};
  static const char *const para[] = {"p",          "h1",    "h2", "h3", "h4", "h5", "h6", "pre",
                                     "blockquote", "table", "ul", "ol", "dl", "hr", NULL};
  static const char *const line[] = {"br",      "div",     "li",     "tr",     "dt",  "dd",
                                     "section", "article", "header", "footer", "nav", "main",
                                     "aside",   "form",    "title",  "td",     "th",  NULL};
  for (; n && !t->full; n = n->next) {
    if (n->type == XML_TEXT_NODE || n->type == XML_CDATA_SECTION_NODE) {
      if (n->content)
        text_words(t, (const char *)n->content);
      continue;
    }
    if (n->type != XML_ELEMENT_NODE)
      continue;
    if (name_in(n->name, skip))
      continue;
    int nl = name_in(n->name, para) ? 2 : name_in(n->name, line) ? 1 : 0;
    if (nl && t->pending_newlines < nl)
      t->pending_newlines = nl;
    walk(t, n->children);
    if (nl && t->pending_newlines < nl)
      t->pending_newlines = nl;
  }
}

/* Readable text of an HTML document (title first), at most limit bytes. Heap string owned
 * by the caller; "" when nothing readable. */
static char *
html_to_text(const char *html, size_t bytes, const char *url, size_t limit, int *truncated)
{
  text_t t = {.limit = limit};
  htmlDocPtr doc = htmlReadMemory(html, (int)(bytes > INT32_MAX ? INT32_MAX : bytes), url, NULL,
                                  HTML_PARSE_RECOVER | HTML_PARSE_NOERROR | HTML_PARSE_NOWARNING |
                                      HTML_PARSE_NONET | HTML_PARSE_NOIMPLIED);
  if (doc) {
    xmlNode *root = xmlDocGetRootElement(doc);
    /* The title lives in <head>, which walk() skips with its scripts and styles. */
    for (xmlNode *h = root ? root->children : NULL; h; h = h->next)
      if (h->type == XML_ELEMENT_NODE && xmlStrcasecmp(h->name, (const xmlChar *)"head") == 0)
        for (xmlNode *c = h->children; c; c = c->next)
          if (c->type == XML_ELEMENT_NODE &&
              xmlStrcasecmp(c->name, (const xmlChar *)"title") == 0) {
            xmlChar *s = xmlNodeGetContent(c);
            if (s) {
              text_words(&t, (const char *)s);
              t.pending_newlines = 2;
            }
            xmlFree(s);
          }
    walk(&t, root);
    xmlFreeDoc(doc);
  }
  *truncated = t.full;
  if (!t.buf)
    return strdup("");
  t.len = eph_utf8_clip(t.buf, t.len > limit ? limit : t.len);
  t.buf[t.len] = 0;
  return t.buf;
}

static bool
is_html(const char *ct)
{
  return ct && (strncasecmp(ct, "text/html", 9) == 0 ||
                strncasecmp(ct, "application/xhtml+xml", 21) == 0);
}

static bool
is_textual(const char *ct)
{
  if (!ct)
    return false;
  return strncasecmp(ct, "text/", 5) == 0 || strcasestr(ct, "json") || strcasestr(ct, "xml") ||
         strcasestr(ct, "javascript");
}

/* ---------------------------------------------------------------- per request */

typedef struct req_ctx {
  web_t *w;
  const eph_tool_call_t *call;
  const char *tool;
} req_ctx_t;

static int
before_request(void *opaque, const char *method, const char *url, int hop, eph_error_t *err)
{
  req_ctx_t *c = opaque;
  const eph_host_t *host = c->w->host;
  int r;
  if (c->w->price_micros > 0 &&
      (r = host->charge(c->call->run, EPH_COST_WEB, c->w->price_micros, c->tool, err)) < 0)
    return r;
  cleanup_json json_object *data = json_object_new_object();
  json_object_object_add(data, "tool", json_object_new_string(c->tool));
  json_object_object_add(data, "method", json_object_new_string(method));
  json_object_object_add(data, "hop", json_object_new_int(hop));
  json_object_object_add(data, "price_micros", json_object_new_int64(c->w->price_micros));
  cleanup_free char *text = NULL;
  if (c->call->zero_data_retention) {
    r = asprintf(&text, "%s (URL withheld: zero data retention)", method);
  } else {
    json_object_object_add(data, "url", json_object_new_string(url));
    r = asprintf(&text, "%s %s", method, url);
  }
  if (r < 0)
    return eph_error_set(err, ENOMEM, "out of memory");
  return host->emit(c->call->run, "Web", "web_request", text, data, err);
}

/* A refusal or failure the model should see, also put on the timeline. */
static json_object *
refused(web_t *w, const eph_tool_call_t *call, const char *kind, const eph_error_t *e)
{
  eph_error_t ignore = {0};
  const char *reason = e->code == EPH_E_BUDGET   ? "budget_exhausted"
                       : e->code == EPH_E_DENIED ? "denied"
                       : e->code == ETIMEDOUT    ? "timeout"
                                                 : "failed";
  cleanup_json json_object *data = json_object_new_object();
  json_object_object_add(data, "reason", json_object_new_string(reason));
  /* The message names the host or address: withheld under zero data retention. */
  const char *msg = call->zero_data_retention ? reason : e->message;
  w->host->emit(call->run, "Web", e->code == EPH_E_BUDGET ? "denied" : kind, msg, data, &ignore);
  json_object *res = json_object_new_object();
  json_object_object_add(res, "error", json_object_new_string(e->message));
  json_object_object_add(res, "reason", json_object_new_string(reason));
  return res;
}

static int
do_fetch(web_t *w, const eph_tool_call_t *call, json_object **result, eph_error_t *err)
{
  json_object *jurl = NULL, *jm = NULL;
  if (!json_object_object_get_ex(call->args, "url", &jurl) ||
      !json_object_is_type(jurl, json_type_string)) {
    *result = eph_error_result("argument 'url' (string) is required");
    return 0;
  }
  char method[16] = "GET";
  if (json_object_object_get_ex(call->args, "method", &jm) && jm) {
    const char *m = json_object_get_string(jm);
    if (!json_object_is_type(jm, json_type_string) || strlen(m) >= sizeof method) {
      *result = eph_error_result("argument 'method' must be a short string");
      return 0;
    }
    for (size_t i = 0; m[i]; i++)
      method[i] = (char)toupper((unsigned char)m[i]);
    method[strlen(m)] = 0;
  }
  bool allowed = false;
  for (size_t i = 0; i < w->n_methods; i++)
    allowed |= strcmp(method, w->methods[i]) == 0;
  if (!allowed) {
    eph_error_t e = {0};
    eph_error_set(&e, EPH_E_DENIED, "method %s is not allowed for web_fetch", method);
    *result = refused(w, call, "web_refused", &e);
    return 0;
  }
  int64_t t = eph_net_time_left(w->timeout_ms, call->deadline_ms);
  req_ctx_t ctx = {w, call, "web_fetch"};
  eph_net_request_t req = {
      .url = json_object_get_string(jurl),
      .method = method,
      .max_response_bytes = (size_t)w->max_response_bytes,
      .timeout_ms = t > 0 ? t : 1,
      .max_redirects = (int)w->max_redirects,
      .check_domains = 1,
      .before_request = before_request,
      .opaque = &ctx,
  };
  eph_net_response_t resp;
  eph_error_t e = {0};
  if (t <= 0) {
    eph_error_set(&e, ETIMEDOUT, "the run deadline has passed");
    *result = refused(w, call, "web_refused", &e);
    return 0;
  }
  if (eph_net_fetch(&w->policy, &req, &resp, &e) < 0) {
    *result = refused(w, call, e.code == EPH_E_DENIED ? "web_refused" : "web_failed", &e);
    return 0;
  }
  json_object *res = json_object_new_object();
  json_object_object_add(res, "url", json_object_new_string(req.url));
  json_object_object_add(res, "final_url", json_object_new_string(resp.final_url));
  json_object_object_add(res, "status", json_object_new_int((int)resp.status));
  json_object_object_add(res, "content_type",
                         resp.content_type ? json_object_new_string(resp.content_type) : NULL);
  json_object_object_add(res, "redirects", json_object_new_int(resp.redirects));
  int text_truncated = 0;
  if (resp.body_bytes > 0 && is_html(resp.content_type)) {
    cleanup_free char *text = html_to_text(resp.body, resp.body_bytes, resp.final_url,
                                           (size_t)w->max_text_bytes, &text_truncated);
    json_object_object_add(res, "text", json_object_new_string(text ? text : ""));
  } else if (resp.body_bytes > 0 &&
             (is_textual(resp.content_type) ||
              eph_utf8_is_text((const unsigned char *)resp.body, resp.body_bytes))) {
    size_t n = resp.body_bytes;
    if (n > (size_t)w->max_text_bytes) {
      n = eph_utf8_clip(resp.body, (size_t)w->max_text_bytes);
      text_truncated = 1;
    }
    if (eph_utf8_is_text((const unsigned char *)resp.body, n))
      json_object_object_add(res, "text", json_object_new_string_len(resp.body, (int)n));
    else
      json_object_object_add(res, "note",
                             json_object_new_string("body is not valid UTF-8 text; not shown"));
  } else if (resp.body_bytes > 0) {
    json_object_object_add(res, "note", json_object_new_string("binary content; not shown"));
  } else {
    json_object_object_add(res, "text", json_object_new_string(""));
  }
  json_object_object_add(res, "body_bytes", json_object_new_int64((int64_t)resp.body_bytes));
  json_object_object_add(res, "truncated",
                         json_object_new_boolean(resp.truncated || text_truncated));
  eph_net_response_clear(&resp);
  *result = res;
  return 0;
}

static int
do_search(web_t *w, const eph_tool_call_t *call, json_object **result, eph_error_t *err)
{
  json_object *jq = NULL;
  if (!json_object_object_get_ex(call->args, "query", &jq) ||
      !json_object_is_type(jq, json_type_string) || !*json_object_get_string(jq)) {
    *result = eph_error_result("argument 'query' (non-empty string) is required");
    return 0;
  }
  if (!w->search_url || !*w->search_url) {
    *result = eph_error_result("no search API is configured (tool-web: search_url)");
    return 0;
  }
  char *q = curl_easy_escape(NULL, json_object_get_string(jq), 0);
  if (!q)
    return eph_error_set(err, ENOMEM, "out of memory");
  cleanup_free char *url = NULL;
  int r = asprintf(&url, "%s%sq=%s&format=json", w->search_url,
                   strchr(w->search_url, '?') ? "&" : "?", q);
  curl_free(q);
  if (r < 0)
    return eph_error_set(err, ENOMEM, "out of memory");
  int64_t t = eph_net_time_left(w->timeout_ms, call->deadline_ms);
  req_ctx_t ctx = {w, call, "web_search"};
  struct curl_slist *hdr = curl_slist_append(NULL, "Accept: application/json");
  eph_net_request_t req = {
      .url = url,
      .method = "GET",
      .headers = hdr,
      .max_response_bytes = (size_t)w->max_response_bytes,
      .max_redirects = 0,
      .check_domains = 0,
      .before_request = before_request,
      .opaque = &ctx,
  };
  eph_net_response_t resp;
  eph_error_t e = {0};
  r = eph_net_fetch_within(&w->search_policy, &req, t, &resp, &e);
  curl_slist_free_all(hdr);
  if (r < 0) {
    *result = refused(w, call, e.code == EPH_E_DENIED ? "web_refused" : "web_failed", &e);
    return 0;
  }
  if (resp.status != 200) {
    char msg[128];
    snprintf(msg, sizeof msg, "search API answered HTTP %ld", resp.status);
    eph_net_response_clear(&resp);
    *result = eph_error_result(msg);
    return 0;
  }
  json_tokener *tok = json_tokener_new();
  json_object *doc =
      tok ? json_tokener_parse_ex(tok, resp.body ? resp.body : "", (int)resp.body_bytes) : NULL;
  if (tok)
    json_tokener_free(tok);
  eph_net_response_clear(&resp);
  json_object *list = NULL;
  if (!doc || !json_object_object_get_ex(doc, "results", &list) ||
      !json_object_is_type(list, json_type_array)) {
    json_object_put(doc);
    *result = eph_error_result("search API answered something other than {\"results\": [...]}");
    return 0;
  }
  json_object *out = json_object_new_array();
  size_t n = json_object_array_length(list);
  for (size_t i = 0; i < n && (int64_t)json_object_array_length(out) < w->search_max_results; i++) {
    json_object *it = json_object_array_get_idx(list, i), *v;
    if (!json_object_is_type(it, json_type_object))
      continue;
    json_object *o = json_object_new_object();
    static const char *const fields[] = {"title", "url", "content"};
    for (size_t k = 0; k < 3; k++)
      if (json_object_object_get_ex(it, fields[k], &v) && json_object_is_type(v, json_type_string))
        json_object_object_add(o, fields[k], json_object_new_string(json_object_get_string(v)));
    json_object_array_add(out, o);
  }
  json_object_put(doc);
  json_object *res = json_object_new_object();
  json_object_object_add(res, "query", json_object_new_string(json_object_get_string(jq)));
  json_object_object_add(res, "results", out);
  *result = res;
  return 0;
}

static int
web_call(void *state, const eph_tool_call_t *call, json_object **result, eph_error_t *err)
{
  web_t *w = state;
  if (strcmp(call->tool, "web_fetch") == 0)
    return do_fetch(w, call, result, err);
  if (strcmp(call->tool, "web_search") == 0)
    return do_search(w, call, result, err);
  return eph_error_set(err, EINVAL, "tool-web has no tool '%s'", call->tool);
}

/* ---------------------------------------------------------------- lifecycle */

static void
web_fini(void *state)
{
  web_t *w = state;
  if (!w)
    return;
  eph_net_policy_free(&w->policy);
  eph_net_policy_free(&w->search_policy);
  for (size_t i = 0; i < w->n_methods; i++)
    free(w->methods[i]);
  free(w->methods);
  free(w);
  curl_global_cleanup();
}

static int
load_methods(web_t *w, const config_setting_t *block, eph_error_t *err)
{
  config_setting_t *l = block ? config_setting_get_member(block, "methods") : NULL;
  int n = l ? config_setting_length(l) : 2;
  w->methods = calloc((size_t)n + 1, sizeof *w->methods);
  if (!w->methods)
    return eph_error_set(err, ENOMEM, "out of memory");
  for (int i = 0; i < n; i++) {
    const char *m = l ? config_setting_get_string_elem(l, i) : (i ? "HEAD" : "GET");
    if (!m || !*m || strlen(m) > 15)
      return eph_error_set(err, EPH_E_CONFIG, "%s:%d: key 'methods': element %d is not a method",
                           config_setting_source_file(l) ? config_setting_source_file(l) : "?",
                           config_setting_source_line(l), i);
    w->methods[i] = strdup(m);
    w->n_methods++;
    for (char *c = w->methods[i]; c && *c; c++)
      *c = (char)toupper((unsigned char)*c);
  }
  return 0;
}

static int
web_init(const eph_host_t *host, const config_setting_t *config, void **state, eph_error_t *err)
{
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
    return eph_error_set(err, EIO, "curl_global_init failed");
  xmlInitParser();
  web_t *w = calloc(1, sizeof *w);
  int r, priv = 0;
  if (!w) {
    curl_global_cleanup();
    return eph_error_set(err, ENOMEM, "out of memory");
  }
  w->host = host;
  if ((r = eph_net_policy_load(&w->policy, host, config, err)) < 0 ||
      (r = load_methods(w, config, err)) < 0 ||
      (r = host->cfg_int(config, "max_response_bytes", 2097152, &w->max_response_bytes, err)) < 0 ||
      (r = host->cfg_int(config, "max_text_bytes", 65536, &w->max_text_bytes, err)) < 0 ||
      (r = host->cfg_int(config, "timeout_ms", 20000, &w->timeout_ms, err)) < 0 ||
      (r = host->cfg_int(config, "max_redirects", 5, &w->max_redirects, err)) < 0 ||
      (r = host->cfg_int(config, "price_micros_per_request", 1000, &w->price_micros, err)) < 0 ||
      (r = host->cfg_string(config, "search_url", "", &w->search_url, err)) < 0 ||
      (r = host->cfg_bool(config, "search_allow_private_addresses", 0, &priv, err)) < 0 ||
      (r = host->cfg_int(config, "search_max_results", 8, &w->search_max_results, err)) < 0)
    goto fail;
  w->search_policy.allow_private = priv || w->policy.allow_private;
  w->search_policy.allow_loopback = priv || w->policy.allow_loopback;
  /* search_url is the operator's, not the model's: a SearXNG on the host itself is what
   * search_allow_private_addresses is for. */
  w->search_policy.allow_host_addresses = priv;
  if (*w->search_url) {
    cleanup_free char *h = NULL;
    int port;
    if ((r = eph_net_url_host(w->search_url, &h, &port, err)) < 0) {
      eph_error_wrap(err, "tool-web: search_url");
      goto fail;
    }
  }
  *state = w;
  return 0;
fail:
  web_fini(w);
  return r;
}

static const eph_tool_ops_t web_ops = {
    .struct_size = sizeof(eph_tool_ops_t),
    .tools = web_tools,
    .n_tools = sizeof web_tools / sizeof web_tools[0],
    .call = web_call,
};

EPH_PLUGIN_EXPORT = {
    .abi_major = EPH_ABI_MAJOR,
    .abi_minor = EPH_ABI_MINOR,
    .struct_size = sizeof(eph_plugin_t),
    .name = "tool-web",
    .kind = EPH_KIND_TOOL,
    .version = PACKAGE_VERSION,
    .description = "web_fetch and web_search on the host, with domain and address checks",
    .config_keys = web_keys,
    .init = web_init,
    .fini = web_fini,
    .ops = &web_ops,
};
