/* ephemerald's HTTP front: options, the listening socket, libmicrohttpd set-up, routing,
 * authentication, JSON answers and errors, health, metrics, the OpenAPI document and the
 * playground's static files. Runs live in server_runs.c, SSE in server_sse.c. */
#include <config.h>

#include "server_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

#define STATIC_MAX_BYTES (4u << 20)

typedef MHD_RESULT (*handler_fn)(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);

struct route {
  const char *method;
  const char *path; /* segments; "{id}" / "{file}" match one non-empty segment */
  bool auth;        /* needs Authorization: Bearer */
  bool body;        /* reads a JSON body */
  handler_fn fn;
};

static MHD_RESULT h_playground(eph_server_t *, struct MHD_Connection *, conn_req_t *);
static MHD_RESULT h_static(eph_server_t *, struct MHD_Connection *, conn_req_t *);
static MHD_RESULT h_metrics(eph_server_t *, struct MHD_Connection *, conn_req_t *);
static MHD_RESULT h_openapi(eph_server_t *, struct MHD_Connection *, conn_req_t *);

/* Every route the daemon serves; core/openapi.json documents exactly these (checked by
 * tests/daemon.test through `ephemerald --routes`). */
static const route_t routes[] = {
    {"GET", "/", false, false, h_playground},
    {"GET", "/playground/{file}", false, false, h_static},
    {"GET", "/v1/health", false, false, eph_srv_health},
    {"GET", "/metrics", false, false, h_metrics},
    {"GET", "/v1/openapi.json", false, false, h_openapi},
    {"POST", "/v1/runs", true, true, eph_srv_runs_create},
    {"GET", "/v1/runs", true, false, eph_srv_runs_list},
    {"GET", "/v1/runs/{id}", true, false, eph_srv_runs_get},
    {"GET", "/v1/runs/{id}/events", true, false, eph_srv_runs_events},
    {"POST", "/v1/runs/{id}/cancel", true, false, eph_srv_runs_cancel},
};
#define N_ROUTES (sizeof routes / sizeof routes[0])

void
eph_server_print_routes(FILE *out)
{
  for (size_t i = 0; i < N_ROUTES; i++)
    fprintf(out, "%s %s\n", routes[i].method, routes[i].path);
}

/* ------------------------------------------------------------------ options */

static int
server_int(const config_setting_t *group, const char *key, int64_t def, int64_t min,
           int64_t max, int64_t *out, eph_error_t *err)
{
  int r = eph_cfg_int(group, key, def, out, err);
  if (r < 0)
    return r;
  if (*out < min || *out > max) {
    char where[512];
    return eph_error_set(err, EPH_E_CONFIG, "%s: server.%s = %" PRId64 ": expected %" PRId64
                         "..%" PRId64, eph_cfg_where(group ? config_setting_get_member(group, key)
                                                           : NULL, where, sizeof where),
                         key, *out, min, max);
  }
  return 0;
}

/* The keys of the `server` group (ephemeral.conf); the same text as core/conf.c's summary. */
static const eph_config_key_t server_keys[] = {
    {"listen", EPH_CFG_STRING, "\"127.0.0.1:8080\"", NULL,
     "Address to listen on: \"ADDR:PORT\" or \"[V6ADDR]:PORT\"; port 0 picks a free port."},
    {"max_concurrent_runs", EPH_CFG_INT, "4", NULL, "Runs executing at once (run workers)."},
    {"max_queued_runs", EPH_CFG_INT, "64", NULL,
     "Runs admitted beyond those executing; POST /v1/runs answers 429 beyond."},
    {"max_body_bytes", EPH_CFG_INT, "25165824", "bytes", "Request body limit; larger is 413."},
    {"drain_grace_seconds", EPH_CFG_INT, "30", "seconds",
     "On SIGTERM, how long running runs may go on before they are cancelled."},
    {"idempotency_hours", EPH_CFG_INT, "24", "hours",
     "How long an Idempotency-Key is remembered per organisation (at least 24)."},
    {0},
};

int
eph_server_options_from_config(eph_ctx_t *ctx, eph_server_options_t *opt, eph_error_t *err)
{
  memset(opt, 0, sizeof *opt);
  const config_setting_t *core = ctx->config.core;
  const config_setting_t *g = core ? config_setting_get_member(core, "server") : NULL;
  const char *listen = NULL;
  int64_t conc, queued, body, grace, idem;
  int r;
  if (g && (r = eph_config_check_keys(g, server_keys, "server", &ctx->config.warnings, err)) < 0)
    return r;
  if ((r = eph_cfg_string(g, "listen", "127.0.0.1:8080", &listen, err)) < 0 ||
      (r = server_int(g, "max_concurrent_runs", 4, 1, 1024, &conc, err)) < 0 ||
      (r = server_int(g, "max_queued_runs", 64, 0, 100000, &queued, err)) < 0 ||
      (r = server_int(g, "max_body_bytes", 24 << 20, 1024, (int64_t)1 << 30, &body, err)) < 0 ||
      (r = server_int(g, "drain_grace_seconds", 30, 0, 86400, &grace, err)) < 0 ||
      (r = server_int(g, "idempotency_hours", 24, 24, 24 * 365, &idem, err)) < 0)
    return r;
  snprintf(opt->listen, sizeof opt->listen, "%s", listen);
  opt->max_concurrent_runs = (int)conc;
  opt->max_queued_runs = (int)queued;
  opt->max_body_bytes = (size_t)body;
  opt->drain_grace_seconds = (int)grace;
  opt->idempotency_hours = (int)idem;
  opt->live_grace_ms = 5000;
  opt->http_threads = 4;
  return 0;
}

int
eph_server_parse_listen(const char *text, struct sockaddr_storage *ss, unsigned *len,
                        eph_error_t *err)
{
  memset(ss, 0, sizeof *ss);
  char host[256];
  const char *port_text;
  if (text[0] == '[') {
    const char *close = strchr(text, ']');
    if (!close || close[1] != ':' || (size_t)(close - text - 1) >= sizeof host)
      return eph_error_set(err, EINVAL, "listen '%s': expected [IPV6]:PORT", text);
    memcpy(host, text + 1, (size_t)(close - text - 1));
    host[close - text - 1] = '\0';
    port_text = close + 2;
  } else {
    const char *colon = strrchr(text, ':');
    if (!colon || (size_t)(colon - text) >= sizeof host || strchr(text, ':') != colon)
      return eph_error_set(err, EINVAL, "listen '%s': expected ADDR:PORT or [IPV6]:PORT", text);
    memcpy(host, text, (size_t)(colon - text));
    host[colon - text] = '\0';
    port_text = colon + 1;
  }
  char *end = NULL;
  errno = 0;
  long port = strtol(port_text, &end, 10);
  if (!*port_text || errno || *end || port < 0 || port > 65535)
    return eph_error_set(err, EINVAL, "listen '%s': port must be 0..65535", text);
  struct sockaddr_in *in4 = (struct sockaddr_in *)ss;
  struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
  if (inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
    in4->sin_family = AF_INET;
    in4->sin_port = htons((uint16_t)port);
    *len = sizeof *in4;
  } else if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons((uint16_t)port);
    *len = sizeof *in6;
  } else {
    return eph_error_set(err, EINVAL, "listen '%s': '%s' is not a numeric IPv4 or IPv6 address",
                         text, host);
  }
  return 0;
}

static int
open_listener(eph_server_t *srv, eph_error_t *err)
{
  struct sockaddr_storage ss;
  unsigned len = 0;
  int r = eph_server_parse_listen(srv->opt.listen, &ss, &len, err);
  if (r < 0)
    return r;
  cleanup_close int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return eph_error_set(err, errno, "listen %s: socket: %s", srv->opt.listen, strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (ss.ss_family == AF_INET6)
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&ss, len) < 0)
    return eph_error_set(err, errno, "listen %s: bind: %s", srv->opt.listen, strerror(errno));
  if (listen(fd, 1024) < 0)
    return eph_error_set(err, errno, "listen %s: %s", srv->opt.listen, strerror(errno));
  struct sockaddr_storage got;
  socklen_t gl = sizeof got;
  getsockname(fd, (struct sockaddr *)&got, &gl);
  char addr[INET6_ADDRSTRLEN];
  if (got.ss_family == AF_INET6) {
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&got;
    inet_ntop(AF_INET6, &in6->sin6_addr, addr, sizeof addr);
    snprintf(srv->url, sizeof srv->url, "http://[%s]:%u", addr, ntohs(in6->sin6_port));
  } else {
    struct sockaddr_in *in4 = (struct sockaddr_in *)&got;
    inet_ntop(AF_INET, &in4->sin_addr, addr, sizeof addr);
    snprintf(srv->url, sizeof srv->url, "http://%s:%u", addr, ntohs(in4->sin_port));
  }
  srv->listen_fd = steal_fd(&fd);
  return 0;
}

const char *
eph_server_url(const eph_server_t *srv)
{
  return srv->url;
}

/* ------------------------------------------------------------------ answers */

void
eph_srv_count(eph_server_t *srv, unsigned status)
{
  unsigned k = status / 100;
  if (k >= 1 && k <= 5) {
    pthread_mutex_lock(&srv->lock);
    srv->http_responses[k]++;
    pthread_mutex_unlock(&srv->lock);
  }
}

static MHD_RESULT
send_buffer(struct MHD_Connection *c, eph_server_t *srv, unsigned status, const char *type,
            char *data, size_t len, const char *hname, const char *hval)
{
  struct MHD_Response *resp =
      MHD_create_response_from_buffer(len, data, MHD_RESPMEM_MUST_FREE);
  if (!resp) {
    free(data);
    return MHD_NO;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  if (hname && hval)
    MHD_add_response_header(resp, hname, hval);
  MHD_RESULT r = MHD_queue_response(c, status, resp);
  MHD_destroy_response(resp);
  eph_srv_count(srv, status);
  return r;
}

static MHD_RESULT
json_h(struct MHD_Connection *c, eph_server_t *srv, unsigned status, json_object *body,
       const char *hname, const char *hval)
{
  const char *text =
      json_object_to_json_string_ext(body, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
  char *copy = eph_xasprintf("%s\n", text);
  json_object_put(body);
  return send_buffer(c, srv, status, "application/json", copy, strlen(copy), hname, hval);
}

MHD_RESULT
eph_srv_json(struct MHD_Connection *c, eph_server_t *srv, unsigned status, json_object *body)
{
  return json_h(c, srv, status, body, NULL, NULL);
}

static MHD_RESULT
error_v(struct MHD_Connection *c, eph_server_t *srv, unsigned status, const char *hname,
        const char *hval, const char *type, const char *field, const char *fmt, va_list ap)
{
  char msg[1200];
  vsnprintf(msg, sizeof msg, fmt, ap);
  json_object *e = json_object_new_object();
  json_object_object_add(e, "type", json_object_new_string(type));
  json_object_object_add(e, "message", json_object_new_string(msg));
  json_object_object_add(e, "field", field ? json_object_new_string(field) : NULL);
  json_object *o = json_object_new_object();
  json_object_object_add(o, "error", e);
  return json_h(c, srv, status, o, hname, hval);
}

MHD_RESULT
eph_srv_error(struct MHD_Connection *c, eph_server_t *srv, unsigned status, const char *type,
              const char *field, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  MHD_RESULT r = error_v(c, srv, status, NULL, NULL, type, field, fmt, ap);
  va_end(ap);
  return r;
}

MHD_RESULT
eph_srv_error_h(struct MHD_Connection *c, eph_server_t *srv, unsigned status, const char *hname,
                const char *hval, const char *type, const char *field, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  MHD_RESULT r = error_v(c, srv, status, hname, hval, type, field, fmt, ap);
  va_end(ap);
  return r;
}

/* ------------------------------------------------------------------ small handlers */

static MHD_RESULT
h_metrics(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  (void)req;
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  pthread_mutex_lock(&srv->lock);
  fprintf(f, "# HELP ephemeral_runs_created_total Runs admitted since the daemon started.\n"
             "# TYPE ephemeral_runs_created_total counter\n"
             "ephemeral_runs_created_total %" PRIu64 "\n",
          srv->runs_created);
  fprintf(f, "# HELP ephemeral_runs_ended_total Runs that reached an end state, by state.\n"
             "# TYPE ephemeral_runs_ended_total counter\n");
  for (int s = EPH_RUN_SUCCEEDED; s <= EPH_RUN_CANCELLED; s++)
    fprintf(f, "ephemeral_runs_ended_total{status=\"%s\"} %" PRIu64 "\n",
            eph_run_status_name((eph_run_status_t)s), srv->runs_ended[s]);
  fprintf(f,
          "# HELP ephemeral_runs_queued Runs admitted and waiting for a worker.\n"
          "# TYPE ephemeral_runs_queued gauge\n"
          "ephemeral_runs_queued %d\n"
          "# HELP ephemeral_runs_running Runs executing now.\n"
          "# TYPE ephemeral_runs_running gauge\n"
          "ephemeral_runs_running %d\n"
          "# HELP ephemeral_sandboxes_alive Sandboxes alive (one per running run).\n"
          "# TYPE ephemeral_sandboxes_alive gauge\n"
          "ephemeral_sandboxes_alive %d\n"
          "# HELP ephemeral_runs_in_memory Runs held in memory (live or settled moments ago).\n"
          "# TYPE ephemeral_runs_in_memory gauge\n"
          "ephemeral_runs_in_memory %d\n",
          srv->queued, srv->running, srv->running, srv->live_count);
  fprintf(f,
          "# HELP ephemeral_billed_micros_total Micro-dollars billed by settled runs, by "
          "category.\n"
          "# TYPE ephemeral_billed_micros_total counter\n"
          "ephemeral_billed_micros_total{category=\"model\"} %" PRId64 "\n"
          "ephemeral_billed_micros_total{category=\"web\"} %" PRId64 "\n"
          "ephemeral_billed_micros_total{category=\"compute\"} %" PRId64 "\n",
          srv->billed_model_micros, srv->billed_web_micros, srv->billed_compute_micros);
  fprintf(f,
          "# HELP ephemeral_idempotent_replays_total POSTs answered with an earlier run.\n"
          "# TYPE ephemeral_idempotent_replays_total counter\n"
          "ephemeral_idempotent_replays_total %" PRIu64 "\n"
          "# HELP ephemeral_queue_full_total POSTs refused with 429 (queue full).\n"
          "# TYPE ephemeral_queue_full_total counter\n"
          "ephemeral_queue_full_total %" PRIu64 "\n",
          srv->idempotent_replays, srv->queue_full_refusals);
  fprintf(f, "# HELP ephemeral_http_responses_total HTTP responses by status class.\n"
             "# TYPE ephemeral_http_responses_total counter\n");
  for (int k = 1; k <= 5; k++)
    fprintf(f, "ephemeral_http_responses_total{code=\"%dxx\"} %" PRIu64 "\n", k,
            srv->http_responses[k]);
  pthread_mutex_unlock(&srv->lock);
  fclose(f);
  return send_buffer(c, srv, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", text, len,
                     NULL, NULL);
}

/* Files shipped in the data directory: installed under <pkgdatadir>, in the source tree
 * under core/ (the top-level layout is fixed). */
static char *
data_path(eph_server_t *srv, const char *rel)
{
  if (srv->ctx->paths.build_tree && srv->ctx->paths.src_dir)
    return eph_xasprintf("%s/core/%s", srv->ctx->paths.src_dir, rel);
  return eph_xasprintf("%s/%s", srv->ctx->paths.data_dir, rel);
}

static MHD_RESULT
send_file(eph_server_t *srv, struct MHD_Connection *c, const char *rel, const char *type)
{
  cleanup_free char *path = data_path(srv, rel);
  char *data = NULL;
  size_t len = 0;
  eph_error_t err = {0};
  if (eph_read_file(path, STATIC_MAX_BYTES, &data, &len, &err) < 0) {
    eph_warn("%s", err.message);
    return eph_srv_error(c, srv, MHD_HTTP_NOT_FOUND, "not_found", NULL, "%s is not installed",
                         rel);
  }
  return send_buffer(c, srv, MHD_HTTP_OK, type, data, len, NULL, NULL);
}

static MHD_RESULT
h_openapi(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  (void)req;
  return send_file(srv, c, "openapi.json", "application/json");
}

static MHD_RESULT
h_playground(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  (void)req;
  return send_file(srv, c, "playground/index.html", "text/html; charset=utf-8");
}

static MHD_RESULT
h_static(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  const char *name = req->param;
  /* Only plain file names: no dot-files, no path of any kind. */
  if (!name[0] || name[0] == '.' ||
      strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789-_.") != strlen(name))
    return eph_srv_error(c, srv, MHD_HTTP_NOT_FOUND, "not_found", NULL, "no such file");
  const char *dot = strrchr(name, '.');
  const char *type = !dot                     ? "application/octet-stream"
                     : strcmp(dot, ".js") == 0  ? "text/javascript; charset=utf-8"
                     : strcmp(dot, ".css") == 0 ? "text/css; charset=utf-8"
                     : strcmp(dot, ".html") == 0 ? "text/html; charset=utf-8"
                     : strcmp(dot, ".json") == 0 ? "application/json"
                     : strcmp(dot, ".svg") == 0  ? "image/svg+xml"
                                                 : "application/octet-stream";
  cleanup_free char *rel = eph_xasprintf("playground/%s", name);
  return send_file(srv, c, rel, type);
}

/* ------------------------------------------------------------------ routing */

/* Matches url against a pattern; captures the one {param} segment. */
static bool
path_matches(const char *pattern, const char *url, char *param, size_t param_size)
{
  const char *p = pattern, *u = url;
  while (*p && *u) {
    if (*p == '{') {
      const char *pe = strchr(p, '}');
      size_t n = strcspn(u, "/");
      if (!pe || n == 0 || n >= param_size)
        return false;
      memcpy(param, u, n);
      param[n] = '\0';
      p = pe + 1;
      u += n;
      continue;
    }
    if (*p != *u)
      return false;
    p++;
    u++;
  }
  return *p == '\0' && *u == '\0';
}

static const route_t *
route_find(const char *method, const char *url, char *param, size_t param_size, char *allow,
           size_t allow_size)
{
  allow[0] = '\0';
  for (size_t i = 0; i < N_ROUTES; i++) {
    if (!path_matches(routes[i].path, url, param, param_size))
      continue;
    if (strcmp(routes[i].method, method) == 0 ||
        (strcmp(method, "HEAD") == 0 && strcmp(routes[i].method, "GET") == 0))
      return &routes[i];
    size_t used = strlen(allow);
    snprintf(allow + used, allow_size - used, "%s%s", used ? ", " : "", routes[i].method);
  }
  return NULL;
}

static int
authenticate(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  if (!h || strncasecmp(h, "Bearer ", 7) != 0)
    return -1;
  const char *key = h + 7;
  while (*key == ' ')
    key++;
  eph_error_t err = {0};
  return eph_store_key_verify(srv->store, key, &req->org, NULL, &err) < 0 ? -1 : 0;
}

static bool
content_type_json(struct MHD_Connection *c)
{
  const char *t = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
  if (!t)
    return false;
  size_t n = strcspn(t, "; \t");
  return n == 16 && strncasecmp(t, "application/json", 16) == 0;
}

static MHD_RESULT
on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
           const char *version, const char *upload_data, size_t *upload_data_size,
           void **con_cls)
{
  (void)version;
  eph_server_t *srv = cls;
  conn_req_t *req = *con_cls;
  if (!req) {
    req = eph_xcalloc(1, sizeof *req);
    *con_cls = req;
    char allow[64];
    req->route = route_find(method, url, req->param, sizeof req->param, allow, sizeof allow);
    if (!req->route) {
      if (allow[0])
        return eph_srv_error_h(c, srv, MHD_HTTP_METHOD_NOT_ALLOWED, "Allow", allow,
                               "method_not_allowed", NULL, "%s is not allowed on %s (allowed: %s)",
                               method, url, allow);
      return eph_srv_error(c, srv, MHD_HTTP_NOT_FOUND, "not_found", NULL, "no route %s %s",
                           method, url);
    }
    if (req->route->auth && authenticate(srv, c, req) < 0)
      return eph_srv_error_h(c, srv, MHD_HTTP_UNAUTHORIZED, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
                             "Bearer realm=\"ephemeral\"", "authentication_error", NULL,
                             "a valid API key is required: Authorization: Bearer KEY");
    if (req->route->body) {
      if (!content_type_json(c))
        return eph_srv_error(c, srv, MHD_HTTP_UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type",
                             NULL, "Content-Type must be application/json");
      const char *cl =
          MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
      if (cl && strtoull(cl, NULL, 10) > srv->opt.max_body_bytes)
        return eph_srv_error(c, srv, HTTP_CONTENT_TOO_LARGE, "payload_too_large", NULL,
                             "the body is larger than %zu bytes", srv->opt.max_body_bytes);
    }
    return MHD_YES;
  }
  if (*upload_data_size) {
    size_t n = *upload_data_size;
    *upload_data_size = 0;
    if (!req->route->body || req->body_refused)
      return MHD_YES;
    if (req->body_len + n > srv->opt.max_body_bytes) {
      req->body_refused = true;
      free(req->body);
      req->body = NULL;
      req->body_len = 0;
      return MHD_YES;
    }
    if (req->body_len + n + 1 > req->body_cap) {
      req->body_cap = (req->body_len + n + 1) * 2;
      if (req->body_cap > srv->opt.max_body_bytes + 1)
        req->body_cap = srv->opt.max_body_bytes + 1;
      req->body = eph_xrealloc(req->body, req->body_cap);
    }
    memcpy(req->body + req->body_len, upload_data, n);
    req->body_len += n;
    req->body[req->body_len] = '\0';
    return MHD_YES;
  }
  if (req->body_refused)
    return eph_srv_error(c, srv, HTTP_CONTENT_TOO_LARGE, "payload_too_large", NULL,
                         "the body is larger than %zu bytes", srv->opt.max_body_bytes);
  if (req->admitted)
    return eph_srv_runs_continue(srv, c, req);
  return req->route->fn(srv, c, req);
}

static void
on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
             enum MHD_RequestTerminationCode toe)
{
  (void)c;
  (void)toe;
  eph_server_t *srv = cls;
  conn_req_t *req = *con_cls;
  if (!req)
    return;
  eph_srv_req_done(srv, req);
  if (req->created)
    json_object_put(req->created);
  free(req->org);
  free(req->body);
  free(req);
  *con_cls = NULL;
}

/* ------------------------------------------------------------------ life cycle */

int
eph_server_start(eph_ctx_t *ctx, const eph_server_options_t *opt, eph_server_t **out,
                 eph_error_t *err)
{
  eph_server_t *srv = eph_xcalloc(1, sizeof *srv);
  srv->ctx = ctx;
  srv->opt = *opt;
  srv->listen_fd = -1;
  pthread_mutex_init(&srv->lock, NULL);
  pthread_mutex_init(&srv->admit, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&srv->cond, &ca);
  pthread_condattr_destroy(&ca);

  cleanup_free char *path = NULL; /* before the first goto: fail: frees it */
  /* Request limits: the same operator maxima as the CLI's. */
  int64_t files_max = 0;
  const config_setting_t *core = ctx->config.core;
  int r;
  if ((r = eph_cfg_int(core, "max_timeout_seconds", 900, &srv->limits.max_timeout_seconds,
                       err)) < 0 ||
      (r = eph_cfg_int(core, "max_cost_micros", 10000000, &srv->limits.max_cost_micros, err)) <
          0 ||
      (r = eph_cfg_int(core, "max_inline_files_bytes", 16 * 1024 * 1024, &files_max, err)) < 0 ||
      (r = eph_cfg_string(core, "default_model", "openai/gpt-6-luna", &srv->limits.default_model,
                          err)) < 0)
    goto fail;
  srv->limits.max_files_total_bytes = (size_t)files_max;
  const char *model_plugin = NULL;
  if ((r = eph_cfg_string(core, "model_plugin", "model-openai", &model_plugin, err)) < 0)
    goto fail;
  srv->replay_models = strcmp(model_plugin, "model-replay") == 0;

  path = eph_xasprintf("%s/ephemeral.sqlite", ctx->state_dir);
  eph_store_options_t so = {.idempotency_hours = opt->idempotency_hours};
  if ((r = eph_store_open(path, &so, &srv->store, err)) < 0)
    goto fail;
  if ((r = open_listener(srv, err)) < 0)
    goto fail;
  if ((r = eph_srv_runs_init(srv, err)) < 0)
    goto fail;

  srv->mhd = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
          MHD_USE_ERROR_LOG,
      0, NULL, NULL, on_request, srv, MHD_OPTION_LISTEN_SOCKET, srv->listen_fd,
      MHD_OPTION_THREAD_POOL_SIZE, (unsigned)opt->http_threads, MHD_OPTION_NOTIFY_COMPLETED,
      on_completed, srv, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)4096, MHD_OPTION_END);
  if (!srv->mhd) {
    r = eph_error_set(err, EIO, "listen %s: libmicrohttpd refused to start", opt->listen);
    goto fail;
  }
  *out = srv;
  return 0;

fail:
  eph_srv_runs_stop(srv);
  eph_server_free(srv);
  return r;
}

void
eph_server_drain(eph_server_t *srv, int grace_seconds)
{
  pthread_mutex_lock(&srv->lock);
  srv->draining = true;
  pthread_mutex_unlock(&srv->lock);
  /* No new connections: the listening socket goes first. */
  if (srv->mhd) {
    MHD_socket fd = MHD_quiesce_daemon(srv->mhd);
    if (fd != MHD_INVALID_SOCKET)
      close(fd);
    srv->listen_fd = -1;
  }
  eph_srv_runs_drain(srv, grace_seconds);
  eph_srv_runs_stop(srv);
  if (srv->mhd) {
    MHD_stop_daemon(srv->mhd);
    srv->mhd = NULL;
  }
}

void
eph_server_free(eph_server_t *srv)
{
  if (!srv)
    return;
  if (srv->mhd)
    MHD_stop_daemon(srv->mhd);
  if (srv->listen_fd >= 0)
    close(srv->listen_fd);
  if (srv->store)
    eph_store_close(srv->store);
  free(srv->workers);
  pthread_mutex_destroy(&srv->lock);
  pthread_mutex_destroy(&srv->admit);
  pthread_cond_destroy(&srv->cond);
  free(srv);
}
