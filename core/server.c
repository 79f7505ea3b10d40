/* ephemerald's HTTP front: the listening socket, libmicrohttpd set-up, routing,
 * authentication and connection limits. Options from ephemeral.conf are read in
 * server_config.c; answers (JSON, errors, secure headers) are built in server_http.c; runs
 * live in server_runs.c, SSE in server_sse.c, health in server_health.c, metrics, the
 * OpenAPI document and the playground in server_pages.c; this unit routes to them and none
 * of them calls back into it. */
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
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cluster.h"
#include "log.h"
#include "util.h"
#include "webhook.h"

#define GUARD_PERIOD_MS 250

typedef MHD_RESULT (*handler_fn)(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);

struct route {
  const char *method;
  const char *path; /* segments; "{id}" / "{file}" match one non-empty segment */
  bool auth;        /* needs Authorization: Bearer */
  bool body;        /* reads a JSON body */
  handler_fn fn;
};

/* Every route the daemon serves; core/openapi.json documents exactly these (checked by
 * tests/daemon.test through `ephemerald --routes`). */
static const route_t routes[] = {
    {"GET", "/", false, false, eph_srv_playground},
    {"GET", "/playground/{file}", false, false, eph_srv_static},
    {"GET", "/v1/health", false, false, eph_srv_health},
    {"GET", "/metrics", false, false, eph_srv_metrics},
    {"GET", "/v1/openapi.json", false, false, eph_srv_openapi},
    {"POST", "/v1/runs", true, true, eph_srv_runs_create},
    {"GET", "/v1/runs", true, false, eph_srv_runs_list},
    {"GET", "/v1/runs/{id}", true, false, eph_srv_runs_get},
    {"GET", "/v1/runs/{id}/events", true, false, eph_srv_runs_events},
    {"POST", "/v1/runs/{id}/cancel", true, false, eph_srv_runs_cancel},
    {"POST", "/v1/webhooks", true, true, eph_srv_webhooks_create},
    {"GET", "/v1/webhooks", true, false, eph_srv_webhooks_list},
    /* Before "/v1/webhooks/{id}": the first path and method that match win. */
    {"GET", "/v1/webhooks/deliveries", true, false, eph_srv_webhooks_deliveries},
    {"GET", "/v1/webhooks/secret", true, false, eph_srv_webhooks_secret},
    {"DELETE", "/v1/webhooks/{id}", true, false, eph_srv_webhooks_delete},
    {"POST", "/v1/admin/keys", true, true, eph_srv_admin_keys_create},
    {"GET", "/v1/admin/keys", true, false, eph_srv_admin_keys_list},
    {"POST", "/v1/admin/keys/{id}/revoke", true, false, eph_srv_admin_keys_revoke},
    {"POST", "/v1/admin/orgs/{id}/credit", true, true, eph_srv_admin_credit},
    {"GET", "/v1/admin/orgs/{id}/balance", true, false, eph_srv_admin_balance},
    {"GET", "/v1/admin/orgs/{id}/usage", true, false, eph_srv_admin_usage},
    {"GET", "/v1/admin/audit", true, false, eph_srv_admin_audit},
};
#define N_ROUTES (sizeof routes / sizeof routes[0])

void
eph_server_print_routes(FILE *out)
{
  for (size_t i = 0; i < N_ROUTES; i++)
    fprintf(out, "%s %s\n", routes[i].method, routes[i].path);
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
  return eph_store_key_verify(srv->store, key, &req->org, &req->key_id, &err) < 0 ? -1 : 0;
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

/* ------------------------------------------------------------------ the connection guard */

static conn_track_t *
track_of(struct MHD_Connection *c)
{
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

/* Sets the connection's next deadline (seconds from now; 0 = none). */
static void
track_deadline(eph_server_t *srv, struct MHD_Connection *c, int seconds, const char *phase)
{
  conn_track_t *t = track_of(c);
  if (!t)
    return;
  pthread_mutex_lock(&srv->conns_lock);
  t->deadline_ms = seconds ? eph_now_ms() + (int64_t)seconds * 1000 : 0;
  t->phase = phase;
  pthread_mutex_unlock(&srv->conns_lock);
}

/* MHD_OPTION_NOTIFY_CONNECTION: lists each connection with the head's deadline. MHD calls
 * CLOSED before it closes the socket, and the guard shuts sockets down only under
 * conns_lock, so the guard never touches a number the kernel gave to someone else. */
static void
on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
              enum MHD_ConnectionNotificationCode code)
{
  eph_server_t *srv = cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    conn_track_t *t = eph_xcalloc(1, sizeof *t);
    t->fd = ci ? (int)ci->connect_fd : -1;
    t->deadline_ms = eph_now_ms() + (int64_t)srv->opt.header_timeout_seconds * 1000;
    t->phase = "head";
    pthread_mutex_lock(&srv->conns_lock);
    t->next = srv->conns;
    if (srv->conns)
      srv->conns->prev = t;
    srv->conns = t;
    pthread_mutex_unlock(&srv->conns_lock);
    *socket_context = t;
    return;
  }
  conn_track_t *t = *socket_context;
  if (!t)
    return;
  pthread_mutex_lock(&srv->conns_lock);
  if (t->prev)
    t->prev->next = t->next;
  else
    srv->conns = t->next;
  if (t->next)
    t->next->prev = t->prev;
  pthread_mutex_unlock(&srv->conns_lock);
  free(t);
  *socket_context = NULL;
}

/* Ends connections that are late with their head or body: shutdown() makes MHD read
 * end-of-file and close the connection in its own thread. */
static void *
guard_main(void *arg)
{
  eph_server_t *srv = arg;
  pthread_mutex_lock(&srv->conns_lock);
  while (!srv->guard_stop) {
    int64_t now = eph_now_ms();
    for (conn_track_t *t = srv->conns; t; t = t->next) {
      if (!t->deadline_ms || now < t->deadline_ms || t->fd < 0)
        continue;
      t->deadline_ms = 0;
      srv->deadline_closes++;
      eph_debug("closing a connection late with its request %s", t->phase);
      shutdown(t->fd, SHUT_RDWR);
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += GUARD_PERIOD_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&srv->guard_cond, &srv->conns_lock, &ts);
  }
  pthread_mutex_unlock(&srv->conns_lock);
  return NULL;
}

/* Books n more bytes of request body in flight; false when the daemon-wide bound would
 * pass. */
static bool
inflight_take(eph_server_t *srv, conn_req_t *req, size_t n)
{
  pthread_mutex_lock(&srv->conns_lock);
  bool ok = srv->inflight_body_bytes + n <= srv->opt.max_inflight_body_bytes;
  if (ok) {
    srv->inflight_body_bytes += n;
    req->inflight_bytes += n;
  } else {
    srv->inflight_refusals++;
  }
  pthread_mutex_unlock(&srv->conns_lock);
  return ok;
}

static void
inflight_release(eph_server_t *srv, conn_req_t *req)
{
  pthread_mutex_lock(&srv->conns_lock);
  srv->inflight_body_bytes -= req->inflight_bytes;
  req->inflight_bytes = 0;
  pthread_mutex_unlock(&srv->conns_lock);
}

/* MHD_OPTION_EXTERNAL_LOGGER: libmicrohttpd's messages go to our log: what one client's
 * connection did (closed early, malformed, timed out) at debug level, so that a hostile
 * client cannot fill the log; the rest (the daemon's own trouble: accept, epoll, threads)
 * as warnings. One line per connection rejected over max_connections or
 * max_connections_per_ip would be thousands for one flood: those are counted, and said at
 * most every 10 s. */
static void
on_mhd_log(void *cls, const char *fmt, va_list ap)
{
  eph_server_t *srv = cls;
  if (strncmp(fmt, "Server reached connection limit", 31) != 0) {
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    msg[strcspn(msg, "\n")] = '\0';
    bool client = strcasestr(fmt, "connection") || strcasestr(fmt, "request") ||
                  strcasestr(fmt, "header") || strcasestr(fmt, "closed");
    eph_log(client ? EPH_LOG_DEBUG : EPH_LOG_WARN, "libmicrohttpd: %s", msg);
    return;
  }
  int64_t now = eph_now_ms();
  uint64_t n = 0;
  pthread_mutex_lock(&srv->conns_lock);
  srv->connections_refused++;
  if (now - srv->refused_said_ms >= 10000) {
    n = srv->connections_refused - srv->refused_said;
    srv->refused_said = srv->connections_refused;
    srv->refused_said_ms = now;
  }
  pthread_mutex_unlock(&srv->conns_lock);
  if (n)
    eph_warn("%" PRIu64 " connection(s) closed at accept: over server.max_connections or "
             "server.max_connections_per_ip (said at most every 10 s)",
             n);
}

/* ------------------------------------------------------------------ requests */

/* The request target's path part has "%2f", "%5c" or "%00" (any case), or its query "%00":
 * libmicrohttpd decodes them before routing, so "/v1/runs/a%2f..%2fb" would be routed as
 * a path of five segments and "%00" cut a value short. No route needs them: refused. */
static bool
uri_smuggles(const char *uri)
{
  bool query = false;
  for (const char *p = uri; *p; p++) {
    if (*p == '?')
      query = true;
    if (*p != '%')
      continue;
    if (strncmp(p + 1, "00", 2) == 0)
      return true;
    if (!query && (strncasecmp(p + 1, "2f", 2) == 0 || strncasecmp(p + 1, "5c", 2) == 0))
      return true;
  }
  return false;
}

/* MHD_OPTION_URI_LOG_CALLBACK: sees the request target as sent, before any decoding; what it
 * returns is the request's con_cls. */
static void *
on_uri(void *cls, const char *uri, struct MHD_Connection *c)
{
  (void)cls;
  (void)c;
  conn_req_t *req = eph_xcalloc(1, sizeof *req);
  req->bad_uri = uri_smuggles(uri);
  return req;
}

struct header_count {
  const char *name;
  unsigned n;
};

static MHD_RESULT
count_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
  (void)kind;
  (void)value;
  struct header_count *hc = cls;
  if (strcasecmp(key, hc->name) == 0)
    hc->n++;
  return MHD_YES;
}

/* How many times the request's head has the header `name` (MHD's lookup sees the first). */
static unsigned
header_count(struct MHD_Connection *c, const char *name)
{
  struct header_count hc = {name, 0};
  MHD_get_connection_values(c, MHD_HEADER_KIND, count_header, &hc);
  return hc.n;
}

/* The body the head announces: Content-Length, SIZE_MAX for a chunked one, 0 for none. */
static uint64_t
announced_body(struct MHD_Connection *c)
{
  if (MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING))
    return UINT64_MAX;
  const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  return cl ? strtoull(cl, NULL, 10) : 0;
}

/* Refuses the request decided at its head. Without a body the answer goes at once. With
 * one, MHD would stop reading and close the socket under an upload still arriving, and a
 * client that sends its whole body before reading (Python's urllib, Node's fetch) sees a
 * reset instead of the answer: so a body up to 4 times max_body_bytes is read and dropped
 * first (within body_timeout_seconds); beyond, the answer goes at once with
 * Connection: close. hname/hval: one extra header (hval copied), or NULL. */
__attribute__((format(printf, 9, 10))) static MHD_RESULT
refuse(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req, unsigned status,
       const char *type, const char *field, const char *hname, const char *hval, const char *fmt,
       ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(req->refuse_msg, sizeof req->refuse_msg, fmt, ap);
  va_end(ap);
  uint64_t body = announced_body(c);
  /* A client that sent "Expect: 100-continue" waits for a word before its body: the answer
   * can go at once, nothing is under way to be reset. */
  const char *expect = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
  bool waits = expect && strcasecmp(expect, "100-continue") == 0;
  if (body == 0 || waits || (body != UINT64_MAX && body / 4 > srv->opt.max_body_bytes)) {
    if (body && !hname) {
      hname = MHD_HTTP_HEADER_CONNECTION;
      hval = "close";
    }
    return eph_srv_error_h(c, srv, status, hname, hval, type, field, "%s", req->refuse_msg);
  }
  req->refuse_status = status;
  req->refuse_type = type;
  req->refuse_field = field;
  req->refuse_hname = hname;
  snprintf(req->refuse_hval, sizeof req->refuse_hval, "%s", hval ? hval : "");
  req->body_refused = true;
  free(req->body);
  req->body = NULL;
  req->body_len = req->body_cap = 0;
  return MHD_YES;
}

/* The first call, with the complete head: route, authenticate, judge the framing and the
 * size. */
static MHD_RESULT
on_head(eph_server_t *srv, struct MHD_Connection *c, const char *url, const char *method,
        conn_req_t *req)
{
  req->started = true;
  track_deadline(srv, c, srv->opt.body_timeout_seconds, "body");
  /* Two framings for one body is how requests are smuggled past a proxy: refused, and the
   * connection is closed after the answer, so whatever the second framing hid is never
   * read as a request. */
  unsigned n_cl = header_count(c, MHD_HTTP_HEADER_CONTENT_LENGTH);
  if (n_cl > 1 || (n_cl && header_count(c, MHD_HTTP_HEADER_TRANSFER_ENCODING)))
    return refuse(srv, c, req, MHD_HTTP_BAD_REQUEST, "invalid_request", "Content-Length",
                  MHD_HTTP_HEADER_CONNECTION, "close",
                  "Content-Length: exactly one, and not with Transfer-Encoding");
  /* libmicrohttpd decodes only "chunked"; with any other coding it reads the body until the
   * client closes and never answers (RFC 9112 6.1: 400 and close when chunked is not the
   * final coding). A body whose length cannot be determined is refused at once, before a
   * byte of it is read, and the connection closed. */
  const char *te =
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
  if (te &&
      (header_count(c, MHD_HTTP_HEADER_TRANSFER_ENCODING) > 1 || strcasecmp(te, "chunked") != 0))
    return eph_srv_error_h(c, srv, MHD_HTTP_BAD_REQUEST, MHD_HTTP_HEADER_CONNECTION, "close",
                           "invalid_request", "Transfer-Encoding", "%s",
                           "Transfer-Encoding: only 'chunked' is accepted");
  if (req->bad_uri)
    return refuse(srv, c, req, MHD_HTTP_BAD_REQUEST, "invalid_request", "path", NULL, NULL,
                  "the request target must not encode '/', '\\' or NUL (%%2F, %%5C, %%00)");
  char allow[64];
  req->route = route_find(method, url, req->param, sizeof req->param, allow, sizeof allow);
  if (!req->route) {
    if (allow[0])
      return refuse(srv, c, req, MHD_HTTP_METHOD_NOT_ALLOWED, "method_not_allowed", NULL, "Allow",
                    allow, "%s is not allowed on %s (allowed: %s)", method, url, allow);
    return refuse(srv, c, req, MHD_HTTP_NOT_FOUND, "not_found", NULL, NULL, NULL, "no route %s %s",
                  method, url);
  }
  if (req->route->auth && authenticate(srv, c, req) < 0)
    return refuse(srv, c, req, MHD_HTTP_UNAUTHORIZED, "authentication_error", NULL,
                  MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"ephemeral\"",
                  "a valid API key is required: Authorization: Bearer KEY");
  if (!req->route->body)
    return MHD_YES;
  if (!content_type_json(c))
    return refuse(srv, c, req, MHD_HTTP_UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", NULL,
                  NULL, NULL, "Content-Type must be application/json");
  pthread_mutex_lock(&srv->lock);
  bool draining = srv->draining;
  pthread_mutex_unlock(&srv->lock);
  if (draining)
    return refuse(srv, c, req, MHD_HTTP_SERVICE_UNAVAILABLE, "unavailable", NULL, NULL, NULL,
                  "the daemon is shutting down; retry on another instance");
  uint64_t declared = announced_body(c);
  if (declared == UINT64_MAX)
    return MHD_YES; /* chunked: booked as it comes */
  if (declared > srv->opt.max_body_bytes)
    return refuse(srv, c, req, HTTP_CONTENT_TOO_LARGE, "payload_too_large", NULL,
                  MHD_HTTP_HEADER_CONNECTION, "close", "the body is larger than %zu bytes",
                  srv->opt.max_body_bytes);
  /* The declared size is booked before a byte arrives: 40 clients announcing 20 MiB each
   * cannot make the daemon hold 800 MiB. */
  if (!inflight_take(srv, req, (size_t)declared))
    return refuse(srv, c, req, MHD_HTTP_SERVICE_UNAVAILABLE, "overloaded", NULL, NULL, NULL,
                  "too many request bodies are being received; retry later");
  return MHD_YES;
}

static MHD_RESULT
on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
           const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls)
{
  (void)version;
  eph_server_t *srv = cls;
  conn_req_t *req = *con_cls;
  if (!req) /* not through on_uri (cannot happen with the callback set): be safe */
    *con_cls = req = eph_xcalloc(1, sizeof *req);
  if (!req->started)
    return on_head(srv, c, url, method, req);
  if (*upload_data_size) {
    size_t n = *upload_data_size;
    *upload_data_size = 0;
    if (req->body_refused || !req->route->body)
      return MHD_YES;
    if (req->body_len + n > srv->opt.max_body_bytes)
      return refuse(srv, c, req, HTTP_CONTENT_TOO_LARGE, "payload_too_large", NULL,
                    MHD_HTTP_HEADER_CONNECTION, "close", "the body is larger than %zu bytes",
                    srv->opt.max_body_bytes);
    /* Without a Content-Length (chunked) the body is booked as it grows. */
    if (req->body_len + n > req->inflight_bytes &&
        !inflight_take(srv, req, req->body_len + n - req->inflight_bytes))
      return refuse(srv, c, req, MHD_HTTP_SERVICE_UNAVAILABLE, "overloaded", NULL, NULL, NULL,
                    "too many request bodies are being received; retry later");
    if (req->body_len + n + 1 > req->body_cap) {
      /* A declared length (booked already, at most max_body_bytes): one allocation of
       * exactly that, no doubling and no copies on the way. Chunked: doubling. */
      uint64_t declared = announced_body(c);
      req->body_cap = declared != UINT64_MAX && declared >= req->body_len + n
                          ? (size_t)declared + 1
                          : (req->body_len + n + 1) * 2;
      if (req->body_cap > srv->opt.max_body_bytes + 1)
        req->body_cap = srv->opt.max_body_bytes + 1;
      req->body = eph_xrealloc(req->body, req->body_cap);
    }
    memcpy(req->body + req->body_len, upload_data, n);
    req->body_len += n;
    req->body[req->body_len] = '\0';
    return MHD_YES;
  }
  /* The request is complete: what follows is the answer (which may wait: ?wait, SSE). */
  track_deadline(srv, c, 0, NULL);
  if (req->refuse_status)
    return eph_srv_error_h(c, srv, req->refuse_status, req->refuse_hname,
                           req->refuse_hname ? req->refuse_hval : NULL, req->refuse_type,
                           req->refuse_field, "%s", req->refuse_msg);
  if (req->admitted)
    return eph_srv_runs_continue(srv, c, req);
  return req->route->fn(srv, c, req);
}

static void
on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
             enum MHD_RequestTerminationCode toe)
{
  (void)toe;
  eph_server_t *srv = cls;
  conn_req_t *req = *con_cls;
  /* A kept-alive connection has a head's time again for its next request. */
  track_deadline(srv, c, srv->opt.header_timeout_seconds, "head");
  if (!req)
    return;
  eph_srv_req_done(srv, req);
  inflight_release(srv, req);
  if (req->created)
    json_object_put(req->created);
  free(req->org);
  free(req->key_id);
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
  pthread_mutex_init(&srv->conns_lock, NULL);
  eph_cond_init_monotonic(&srv->cond);
  eph_cond_init_monotonic(&srv->guard_cond);

  /* Request limits: the same operator maxima as the CLI's. */
  const eph_core_conf_t *conf = eph_config_values(&ctx->config);
  int r;
  srv->limits.max_timeout_seconds = conf->max_timeout_seconds;
  srv->limits.max_cost_micros = conf->max_cost_micros;
  srv->limits.default_model = conf->default_model;
  srv->limits.max_files_total_bytes = (size_t)conf->max_inline_files_bytes;
  srv->limits.plugins = &ctx->plugins;
  srv->replay_models = strcmp(conf->model_plugin, "model-replay") == 0;

  /* The daemon opens once: the whole file is checked, however large. */
  eph_store_options_t so = {.idempotency_hours = opt->idempotency_hours, .check_whole = true};
  if ((r = eph_store_open_ctx(ctx, &so, true, &srv->store, err)) < 0)
    goto fail;
  if ((r = eph_webhooks_start(ctx, srv->store, &srv->webhooks, err)) < 0)
    goto fail;
  if ((r = open_listener(srv, err)) < 0)
    goto fail;
  /* Before the workers: they read srv->listener from their first wait. */
  eph_srv_listen_start(srv);
  if ((r = eph_srv_runs_init(srv, err)) < 0)
    goto fail;

  /* Every connection costs a descriptor: a limit the open-file limit cannot honour would
   * turn into failing accept()s for everyone, so it is lowered to fit. */
  unsigned max_conns = (unsigned)opt->max_connections;
  struct rlimit nofile;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY &&
      nofile.rlim_cur < (rlim_t)max_conns + 256) {
    unsigned fit = nofile.rlim_cur > 512 ? (unsigned)nofile.rlim_cur - 256 : 256;
    eph_warn("server.max_connections = %u does not fit the open-file limit (%llu): using %u",
             max_conns, (unsigned long long)nofile.rlim_cur, fit);
    max_conns = fit;
  }
  if (pthread_create(&srv->guard, NULL, guard_main, srv) != 0) {
    r = eph_error_set(err, EAGAIN, "starting the connection guard thread failed");
    goto fail;
  }
  srv->guard_started = true;
  srv->mhd = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
          MHD_USE_ERROR_LOG,
      /* The logger first: MHD reports problems with the options that follow through
       * whatever logger is set when it reads them (stderr before this one). */
      0, NULL, NULL, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, srv,
      MHD_OPTION_LISTEN_SOCKET, srv->listen_fd, MHD_OPTION_THREAD_POOL_SIZE,
      (unsigned)opt->http_threads, MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
      MHD_OPTION_NOTIFY_CONNECTION, on_connection, srv, MHD_OPTION_URI_LOG_CALLBACK, on_uri, srv,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)opt->idle_timeout_seconds,
      MHD_OPTION_CONNECTION_LIMIT, max_conns, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
      (unsigned)opt->max_connections_per_ip, MHD_OPTION_END);
  if (!srv->mhd) {
    r = eph_error_set(err, EIO, "listen %s: libmicrohttpd refused to start", opt->listen);
    goto fail;
  }
  srv->listen_fd = -1; /* MHD's now: MHD_stop_daemon closes it */
  *out = srv;
  return 0;

fail:
  eph_srv_runs_stop(srv);
  eph_server_free(srv);
  return r;
}

static void
stop_guard(eph_server_t *srv)
{
  if (!srv->guard_started)
    return;
  pthread_mutex_lock(&srv->conns_lock);
  srv->guard_stop = true;
  pthread_cond_broadcast(&srv->guard_cond);
  pthread_mutex_unlock(&srv->conns_lock);
  pthread_join(srv->guard, NULL);
  srv->guard_started = false;
}

void
eph_server_drain(eph_server_t *srv, int grace_seconds)
{
  pthread_mutex_lock(&srv->lock);
  srv->draining = true;
  pthread_mutex_unlock(&srv->lock);
  /* The listening socket stays open while runs finish: a client connecting now reads a 503
   * with Retry-After (and can go elsewhere) rather than a refused connection. */
  eph_srv_runs_drain(srv, grace_seconds);
  eph_srv_runs_stop(srv);
  /* Every run has settled and queued its deliveries; the pending ones wait in the store. */
  eph_webhooks_stop(srv->webhooks);
  srv->webhooks = NULL;
  if (srv->mhd) {
    MHD_stop_daemon(srv->mhd);
    srv->mhd = NULL;
  }
  stop_guard(srv);
}

void
eph_server_free(eph_server_t *srv)
{
  if (!srv)
    return;
  if (srv->mhd)
    MHD_stop_daemon(srv->mhd);
  stop_guard(srv);
  if (srv->listen_fd >= 0)
    close(srv->listen_fd);
  eph_webhooks_stop(srv->webhooks);
  /* After the workers and the ticker (they ask whether it is up), before the store. */
  eph_srv_listen_stop(srv);
  if (srv->store)
    eph_store_close(srv->store);
  free(srv->workers);
  pthread_mutex_destroy(&srv->lock);
  pthread_mutex_destroy(&srv->admit);
  pthread_mutex_destroy(&srv->conns_lock);
  pthread_cond_destroy(&srv->cond);
  pthread_cond_destroy(&srv->guard_cond);
  free(srv);
}
