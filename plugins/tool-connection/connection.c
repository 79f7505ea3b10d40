/* tool-connection: the broker. The operator defines connections in conf.d (base URL,
 * credential, how it is applied, allowed methods and path prefixes); a run's permission
 * table names the connections it may use and may narrow their methods. The tool call names
 * a connection, a method and a path; everything is decided here, on the host, BEFORE any
 * network I/O: grant, method (operator ∩ grant), path (normalised, under an allowed
 * prefix), headers (the caller cannot place or override the credential). The credential
 * is read at init, added per request, and scrubbed (raw, base64, URL-encoded and JSON-escaped
 * forms)
 * from everything that leaves: results, events, logs. Redirects are never followed: a
 * credential must not travel to a Location the operator did not name. In the spirit of
 * OpenSSH's monitor: the side holding secrets serves a fixed table of allowed requests. */
#include "config.h"

#include <ctype.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include <curl/curl.h>

#include <ephemeral/plugin.h>

#include "../tool-web/net.h"
#include "../tool-web/plugin-util.h"

typedef enum apply { APPLY_BEARER, APPLY_BASIC, APPLY_HEADER, APPLY_QUERY } apply_t;

typedef struct conn {
  char *name;
  char *base_url;  /* without trailing '/' */
  char *base_path; /* path part of base_url, without trailing '/' ("" for the root) */
  char *secret;    /* NULL when the credential could not be read: the connection refuses */
  apply_t apply;
  char *header_name; /* APPLY_HEADER */
  char *query_param; /* APPLY_QUERY */
  char **methods;
  size_t n_methods;
  char **prefixes;
  size_t n_prefixes;
  eph_net_policy_t policy;
  char *scrub[8]; /* forms of the secret to remove from anything returned */
  size_t n_scrub;
} conn_t;

typedef struct broker {
  const eph_host_t *host;
  conn_t *conns;
  size_t n_conns;
  int64_t max_response_bytes, timeout_ms, price_micros;
} broker_t;

static const eph_config_key_t broker_keys[] = {
    {"connections", EPH_CFG_LIST, "()", NULL,
     "The connections, a list of groups: name, base_url, credential_file or credential_env, "
     "apply (\"bearer\" | \"basic\" | \"header\" | \"query\"), header_name / query_param, "
     "methods (list), path_prefixes (list), allow_private_addresses (bool: also allows "
     "loopback). Empty: the broker offers nothing."},
    {"max_response_bytes", EPH_CFG_INT, "1048576", "bytes",
     "Response body bytes read at most; the transfer stops there."},
    {"timeout_ms", EPH_CFG_INT, "30000", "milliseconds", "Time limit of one request."},
    {"price_micros_per_request", EPH_CFG_INT, "0", "micros",
     "Charged to the run (category web) before each request."},
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

/* ---------------------------------------------------------------- config */

static void
strv_free(char **v, size_t n)
{
  for (size_t i = 0; i < n; i++)
    free(v[i]);
  free(v);
}

static void
conn_clear(conn_t *c)
{
  free(c->name);
  free(c->base_url);
  free(c->base_path);
  if (c->secret) {
    explicit_bzero(c->secret, strlen(c->secret));
    free(c->secret);
  }
  free(c->header_name);
  free(c->query_param);
  strv_free(c->methods, c->n_methods);
  strv_free(c->prefixes, c->n_prefixes);
  eph_net_policy_free(&c->policy);
  for (size_t i = 0; i < c->n_scrub; i++) {
    explicit_bzero(c->scrub[i], strlen(c->scrub[i]));
    free(c->scrub[i]);
  }
  memset(c, 0, sizeof *c);
}

__attribute__((format(printf, 3, 4))) static int
cfg_fail(const config_setting_t *s, eph_error_t *err, const char *fmt, ...)
{
  const char *f = s ? config_setting_source_file(s) : NULL;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return eph_error_set(err, EPH_E_CONFIG, "%s:%d: tool-connection: %s", f ? f : "?",
                       s ? config_setting_source_line(s) : 0, msg);
}

static int
str_list(const config_setting_t *g, const char *key, bool upper, char ***out, size_t *n,
         eph_error_t *err)
{
  config_setting_t *l = config_setting_get_member(g, key);
  if (!l || !config_setting_is_aggregate(l) || config_setting_length(l) == 0)
    return cfg_fail(l ? l : g, err, "key '%s': a non-empty list of strings is required", key);
  int count = config_setting_length(l);
  *out = calloc((size_t)count + 1, sizeof **out);
  if (!*out)
    return eph_error_set(err, ENOMEM, "out of memory");
  for (int i = 0; i < count; i++) {
    const char *s = config_setting_get_string_elem(l, i);
    if (!s || !*s)
      return cfg_fail(l, err, "key '%s': every element must be a non-empty string", key);
    (*out)[i] = strdup(s);
    (*n)++;
    if (upper)
      for (char *c = (*out)[i]; *c; c++)
        *c = (char)toupper((unsigned char)*c);
  }
  return 0;
}

/* Reads the credential: first line of credential_file, or the value of credential_env. */
static char *
read_secret(const eph_host_t *host, const config_setting_t *g, const char *name)
{
  const char *file = NULL, *env = NULL;
  config_setting_lookup_string(g, "credential_file", &file);
  config_setting_lookup_string(g, "credential_env", &env);
  if (file) {
    int fd = open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > 65536) {
      if (fd >= 0)
        close(fd);
      host->log(EPH_LOG_WARN, "connection '%s': credential_file %s unreadable", name, file);
      return NULL;
    }
    if (st.st_mode & 0077)
      host->log(EPH_LOG_WARN, "connection '%s': credential_file %s is readable by others (mode %o)",
                name, file, st.st_mode & 0777);
    char *buf = calloc(1, (size_t)st.st_size + 1);
    ssize_t got = buf ? read(fd, buf, (size_t)st.st_size) : -1;
    close(fd);
    if (got < 0) {
      free(buf);
      return NULL;
    }
    buf[got] = 0;
    buf[strcspn(buf, "\r\n")] = 0;
    if (!*buf) {
      free(buf);
      host->log(EPH_LOG_WARN, "connection '%s': credential_file %s is empty", name, file);
      return NULL;
    }
    return buf;
  }
  if (env) {
    const char *v = getenv(env);
    if (v && *v)
      return strdup(v);
    host->log(EPH_LOG_WARN, "connection '%s': credential_env %s is not set", name, env);
    return NULL;
  }
  host->log(EPH_LOG_WARN, "connection '%s': neither credential_file nor credential_env", name);
  return NULL;
}

static bool
valid_token(const char *s)
{
  if (!*s)
    return false;
  for (; *s; s++)
    if (!isalnum((unsigned char)*s) && !strchr("!#$%&'*+-.^_`|~", *s))
      return false;
  return true;
}

static void
add_scrub(conn_t *c, char *form)
{
  if (form && strlen(form) >= 4 && c->n_scrub < sizeof c->scrub / sizeof c->scrub[0])
    c->scrub[c->n_scrub++] = form;
  else
    free(form);
}

static int
conn_load(const eph_host_t *host, const config_setting_t *g, conn_t *c, eph_error_t *err)
{
  const char *name = NULL, *base = NULL, *apply = "bearer", *hn = NULL, *qp = NULL;
  int r;
  if (!config_setting_is_group(g))
    return cfg_fail(g, err, "%s", "each element of 'connections' must be a group");
  if (!config_setting_lookup_string(g, "name", &name) || !*name)
    return cfg_fail(g, err, "%s", "connection without 'name'");
  c->name = strdup(name);
  if (!config_setting_lookup_string(g, "base_url", &base))
    return cfg_fail(g, err, "connection '%s': 'base_url' is required", name);
  config_setting_lookup_string(g, "apply", &apply);
  if (strcmp(apply, "bearer") == 0)
    c->apply = APPLY_BEARER;
  else if (strcmp(apply, "basic") == 0)
    c->apply = APPLY_BASIC;
  else if (strcmp(apply, "header") == 0) {
    c->apply = APPLY_HEADER;
    if (!config_setting_lookup_string(g, "header_name", &hn) || !valid_token(hn))
      return cfg_fail(g, err, "connection '%s': apply = \"header\" needs a valid header_name",
                      name);
    c->header_name = strdup(hn);
  } else if (strcmp(apply, "query") == 0) {
    c->apply = APPLY_QUERY;
    if (!config_setting_lookup_string(g, "query_param", &qp) || !*qp || strpbrk(qp, "&=#?/ "))
      return cfg_fail(g, err, "connection '%s': apply = \"query\" needs a valid query_param",
                      name);
    c->query_param = strdup(qp);
  } else
    return cfg_fail(g, err, "connection '%s': apply must be bearer, basic, header or query",
                    name);
  if ((r = str_list(g, "methods", true, &c->methods, &c->n_methods, err)) < 0 ||
      (r = str_list(g, "path_prefixes", false, &c->prefixes, &c->n_prefixes, err)) < 0)
    return r;
  for (size_t i = 0; i < c->n_prefixes; i++)
    if (c->prefixes[i][0] != '/')
      return cfg_fail(g, err, "connection '%s': every path prefix must start with '/'", name);

  /* base_url: http(s), no query, no fragment, no credentials; kept without trailing '/'. */
  CURLU *u = curl_url();
  char *scheme = NULL, *path = NULL, *query = NULL, *frag = NULL, *user = NULL;
  r = 0;
  if (!u || curl_url_set(u, CURLUPART_URL, base, 0) != CURLUE_OK ||
      curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
      (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0) ||
      curl_url_get(u, CURLUPART_QUERY, &query, 0) == CURLUE_OK ||
      curl_url_get(u, CURLUPART_FRAGMENT, &frag, 0) == CURLUE_OK ||
      curl_url_get(u, CURLUPART_USER, &user, 0) == CURLUE_OK ||
      curl_url_get(u, CURLUPART_PATH, &path, 0) != CURLUE_OK)
    r = cfg_fail(g, err, "connection '%s': base_url must be an http(s) URL without query, "
                         "fragment or credentials", name);
  if (r == 0) {
    size_t n = strlen(path);
    while (n > 0 && path[n - 1] == '/')
      path[--n] = 0;
    c->base_path = strdup(path);
    size_t b = strlen(base);
    c->base_url = strdup(base);
    while (b > 0 && c->base_url[b - 1] == '/')
      c->base_url[--b] = 0;
  }
  curl_free(scheme);
  curl_free(path);
  curl_free(query);
  curl_free(frag);
  curl_free(user);
  curl_url_cleanup(u);
  if (r < 0)
    return r;

  int priv = 0;
  config_setting_lookup_bool(g, "allow_private_addresses", &priv);
  c->policy.allow_private = c->policy.allow_loopback = priv;

  c->secret = read_secret(host, g, name);
  if (c->secret) {
    if (strpbrk(c->secret, "\r\n")) { /* header injection through the credential itself */
      explicit_bzero(c->secret, strlen(c->secret));
      free(c->secret);
      c->secret = NULL;
      return cfg_fail(g, err, "connection '%s': credential contains a line break", name);
    }
    add_scrub(c, strdup(c->secret));
    add_scrub(c, pu_b64_encode(c->secret, strlen(c->secret), NULL));
    char *esc = curl_easy_escape(NULL, c->secret, 0);
    if (esc && strcmp(esc, c->secret) != 0)
      add_scrub(c, strdup(esc));
    curl_free(esc);
    /* As it appears inside a JSON string an API echoes back ("/" as "\/", ...). */
    json_object *js = json_object_new_string(c->secret);
    const char *jt = json_object_to_json_string_ext(js, JSON_C_TO_STRING_PLAIN);
    size_t jl = strlen(jt);
    if (jl >= 2 && (jl - 2 != strlen(c->secret) || strncmp(jt + 1, c->secret, jl - 2) != 0))
      add_scrub(c, strndup(jt + 1, jl - 2));
    json_object_put(js);
    const char *colon = c->apply == APPLY_BASIC ? strchr(c->secret, ':') : NULL;
    if (colon)
      add_scrub(c, strdup(colon + 1)); /* the password alone */
  }
  return 0;
}

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

/* Headers the caller may never set: anything that carries or routes credentials, or that
 * the transport owns. */
static bool
header_forbidden(const conn_t *c, const char *name)
{
  static const char *const no[] = {"authorization", "cookie", "host", "content-length",
                                   "transfer-encoding", "connection", "upgrade", "te",
                                   "keep-alive", "expect", "forwarded", NULL};
  for (size_t i = 0; no[i]; i++)
    if (strcasecmp(name, no[i]) == 0)
      return true;
  if (strncasecmp(name, "proxy-", 6) == 0 || strncasecmp(name, "x-forwarded-", 12) == 0)
    return true;
  return c->header_name && strcasecmp(name, c->header_name) == 0;
}

/* Replaces every scrub form in buf (n bytes) by "[REDACTED]"-sized stars in place when it
 * fits, else builds a new buffer. Returns the (possibly reallocated) buffer. */
static char *
scrub(const conn_t *c, char *buf, size_t *n)
{
  static const char mark[] = "[REDACTED]";
  for (size_t k = 0; k < c->n_scrub; k++) {
    const char *s = c->scrub[k];
    size_t sl = strlen(s);
    char *hit;
    size_t from = 0;
    while (*n >= sl && (hit = memmem(buf + from, *n - from, s, sl))) {
      size_t at = (size_t)(hit - buf), ml = sizeof mark - 1;
      char *nb = malloc(*n - sl + ml + 1);
      if (!nb) { /* cannot grow: blank the secret in place instead */
        memset(hit, '*', sl);
        from = at + sl;
        continue;
      }
      memcpy(nb, buf, at);
      memcpy(nb + at, mark, ml);
      memcpy(nb + at + ml, buf + at + sl, *n - at - sl);
      *n = *n - sl + ml;
      nb[*n] = 0;
      free(buf);
      buf = nb;
      from = at + ml;
    }
  }
  return buf;
}

static char *
scrub_str(const conn_t *c, const char *s)
{
  size_t n = strlen(s);
  char *d = malloc(n + 1);
  if (!d)
    return NULL;
  memcpy(d, s, n + 1);
  return scrub(c, d, &n);
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
  if (x->b->price_micros > 0 &&
      (r = host->charge(x->call->run, EPH_COST_WEB, x->b->price_micros, "connection_request",
                        err)) < 0)
    return r;
  cleanup_json json_object *data = json_object_new_object();
  json_object_object_add(data, "connection", json_object_new_string(x->c->name));
  json_object_object_add(data, "method", json_object_new_string(method));
  cleanup_free char *text = NULL;
  if (x->call->zero_data_retention)
    r = asprintf(&text, "%s %s (path withheld: zero data retention)", method, x->c->name);
  else {
    json_object_object_add(data, "path", json_object_new_string(x->path));
    r = asprintf(&text, "%s %s %s", method, x->c->name, x->path);
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

static const char *
arg_str(json_object *args, const char *key)
{
  json_object *v = NULL;
  if (!json_object_object_get_ex(args, key, &v) || !json_object_is_type(v, json_type_string))
    return NULL;
  return json_object_get_string(v);
}

static int
broker_call(void *state, const eph_tool_call_t *call, json_object **result, eph_error_t *err)
{
  broker_t *b = state;
  if (strcmp(call->tool, "connection_request") != 0)
    return eph_error_set(err, EINVAL, "tool-connection has no tool '%s'", call->tool);
  const char *name = arg_str(call->args, "connection"), *m = arg_str(call->args, "method"),
             *path = arg_str(call->args, "path");
  if (!name || !m || !path) {
    *result = pu_error_result("arguments 'connection', 'method' and 'path' (strings) are required");
    return 0;
  }
  const conn_t *c = find_conn(b, name);
  json_object *grant = find_grant(call->grants, name);
  if (!c || !grant) {
    *result = refuse(b, call, NULL, "not_granted",
                     "this run is not granted that connection");
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
      if (strncmp(p + 1, c->query_param, ql) == 0 && (p[1 + ql] == '=' || p[1 + ql] == '&' ||
                                                     p[1 + ql] == 0)) {
        *result = refuse(b, call, c, "header", "the query parameter carrying the credential "
                                               "is set by the broker");
        return 0;
      }
  }
  if (!c->secret) {
    *result = refuse(b, call, c, "unavailable",
                     "the connection's credential is not available on this host");
    return 0;
  }

  /* Headers: the caller's, minus anything that could place or replace the credential. */
  struct curl_slist *hdrs = NULL;
  json_object *jh = NULL;
  json_object *dropped = json_object_new_array();
  if (json_object_object_get_ex(call->args, "headers", &jh) && jh) {
    if (!json_object_is_type(jh, json_type_object)) {
      json_object_put(dropped);
      *result = pu_error_result("argument 'headers' must be an object of strings");
      return 0;
    }
    json_object_object_foreach(jh, hk, hv)
    {
      const char *v = json_object_get_string(hv);
      if (!valid_token(hk) || !json_object_is_type(hv, json_type_string) || strpbrk(v, "\r\n")) {
        curl_slist_free_all(hdrs);
        json_object_put(dropped);
        *result = pu_error_result("headers must be token names with single-line string values");
        return 0;
      }
      if (header_forbidden(c, hk)) {
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
    char *enc = pu_b64_encode(c->secret, strlen(c->secret), NULL);
    r = enc ? asprintf(&cred_line, "Authorization: Basic %s", enc) : -1;
    if (enc) {
      explicit_bzero(enc, strlen(enc));
      free(enc);
    }
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
    if (eph_net_url_host(c->base_url, &h1, &p1, &ig) < 0 || eph_net_url_host(url, &h2, &p2, &ig) < 0 ||
        strcmp(h1, h2) != 0 || p1 != p2) {
      explicit_bzero(url, strlen(url));
      curl_slist_free_all(hdrs);
      if (cred_line) {
        explicit_bzero(cred_line, strlen(cred_line));
        free(cred_line);
      }
      json_object_put(dropped);
      *result = refuse(b, call, c, "path", "path changes the connection's host");
      return 0;
    }
  }
  const char *body = arg_str(call->args, "body");
  int64_t t = b->timeout_ms;
  if (call->deadline_ms > 0 && call->deadline_ms - eph_now_ms() < t)
    t = call->deadline_ms - eph_now_ms();
  req_ctx_t ctx = {b, call, c, path};
  eph_net_request_t req = {
      .url = url,
      .method = method,
      .headers = hdrs,
      .body = body,
      .body_bytes = body ? strlen(body) : 0,
      .max_response_bytes = (size_t)b->max_response_bytes,
      .timeout_ms = t > 0 ? t : 1,
      .max_redirects = 0,
      .check_domains = 0,
      .before_request = before_request,
      .opaque = &ctx,
  };
  eph_net_response_t resp;
  eph_error_t e = {0};
  r = t > 0 ? eph_net_fetch(&c->policy, &req, &resp, &e)
            : eph_error_set(&e, ETIMEDOUT, "the run deadline has passed");
  curl_slist_free_all(hdrs);
  if (cred_line) {
    explicit_bzero(cred_line, strlen(cred_line));
    free(cred_line);
  }
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

  json_object *res = json_object_new_object();
  json_object_object_add(res, "connection", json_object_new_string(c->name));
  json_object_object_add(res, "status", json_object_new_int((int)resp.status));
  json_object *outh = json_object_new_object();
  json_object_object_foreach(resp.headers, rk, rv)
  {
    if (strcasecmp(rk, "set-cookie") == 0)
      continue; /* session material of the connection, not the run's */
    cleanup_free char *v = scrub_str(c, json_object_get_string(rv));
    json_object_object_add(outh, rk, json_object_new_string(v ? v : ""));
  }
  json_object_object_add(res, "headers", outh);
  resp.body = resp.body ? scrub(c, resp.body, &resp.body_bytes) : NULL;
  if (resp.body_bytes == 0)
    json_object_object_add(res, "body", json_object_new_string(""));
  else if (pu_is_utf8_text((const unsigned char *)resp.body, resp.body_bytes))
    json_object_object_add(res, "body", json_object_new_string_len(resp.body, (int)resp.body_bytes));
  else {
    cleanup_free char *enc = pu_b64_encode(resp.body, resp.body_bytes, NULL);
    json_object_object_add(res, "body_base64", json_object_new_string(enc ? enc : ""));
  }
  json_object_object_add(res, "truncated", json_object_new_boolean(resp.truncated));
  if (json_object_array_length(dropped) > 0)
    json_object_object_add(res, "dropped_headers", dropped);
  else
    json_object_put(dropped);
  eph_net_response_clear(&resp);
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
broker_init(const eph_host_t *host, const config_setting_t *config, void **state,
            eph_error_t *err)
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
  if (b->max_response_bytes <= 0 || b->timeout_ms <= 0 || b->price_micros < 0) {
    r = eph_error_set(err, EPH_E_CONFIG, "tool-connection: max_response_bytes and timeout_ms "
                                         "must be positive, price_micros_per_request not negative");
    goto fail;
  }
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
