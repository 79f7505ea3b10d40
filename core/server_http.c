/* ephemerald's answers: JSON bodies, problem-style errors (with paths scrubbed), the headers
 * every answer carries, the per-status counters. The lowest unit of the daemon: the router
 * (server.c) and the handlers (server_runs.c, server_sse.c, server_health.c) call it; it
 * calls none of them. */
#include <config.h>

#include "server_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "util.h"

#define RETRY_AFTER_SECONDS "2"

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

/* Content-Security-Policy of the playground page: its own script and style files only (no
 * inline script, no eval), fetches to this origin only, never inside a frame. */
#define CSP_PAGE                                                                                   \
  "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "                  \
  "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
/* Everything else (JSON, SSE, metrics, static files) is data, never a document. */
#define CSP_DATA "default-src 'none'; frame-ancestors 'none'; sandbox"

void
eph_srv_secure_headers(struct MHD_Response *resp, const char *content_type)
{
  bool page = content_type && strncmp(content_type, "text/html", 9) == 0;
  MHD_add_response_header(resp, "Content-Security-Policy", page ? CSP_PAGE : CSP_DATA);
  MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
  MHD_add_response_header(resp, "X-Frame-Options", "DENY");
  MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
}

/* hname/hval: one extra header (or NULL). A 500 or 503 always says when to come back: a
 * default Retry-After unless the caller gave one. */
MHD_RESULT
eph_srv_send(struct MHD_Connection *c, eph_server_t *srv, unsigned status, const char *type,
             char *data, size_t len, const char *hname, const char *hval)
{
  struct MHD_Response *resp = MHD_create_response_from_buffer(len, data, MHD_RESPMEM_MUST_FREE);
  if (!resp) {
    free(data);
    return MHD_NO;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  eph_srv_secure_headers(resp, type);
  if (hname && hval)
    MHD_add_response_header(resp, hname, hval);
  if ((status == MHD_HTTP_INTERNAL_SERVER_ERROR || status == MHD_HTTP_SERVICE_UNAVAILABLE) &&
      !(hname && strcasecmp(hname, MHD_HTTP_HEADER_RETRY_AFTER) == 0))
    MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, RETRY_AFTER_SECONDS);
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
  return eph_srv_send(c, srv, status, "application/json", copy, strlen(copy), hname, hval);
}

MHD_RESULT
eph_srv_json(struct MHD_Connection *c, eph_server_t *srv, unsigned status, json_object *body)
{
  return json_h(c, srv, status, body, NULL, NULL);
}

/* True for a character that may end a path in a message. */
static bool
path_end(char ch)
{
  return !ch || strchr(" \t\n'\"`),;:]}", ch) != NULL;
}

/* Copies msg into out with every absolute host path ("/var/lib/x/y", "'/etc/z'") replaced by
 * "[path]": error bodies go to clients, paths of the host are the operator's business (the
 * log has them). The API's own paths ("/v1/...", "/playground/...") stay. Returns the
 * number of paths replaced. */
static int
scrub_paths(const char *msg, char *out, size_t size)
{
  size_t o = 0;
  int n = 0;
  for (size_t i = 0; msg[i] && o + 1 < size;) {
    bool boundary = i == 0 || strchr(" \t'\"`(=:,[{", msg[i - 1]) != NULL;
    if (msg[i] == '/' && boundary && strncmp(msg + i, "/v1/", 4) != 0 &&
        strncmp(msg + i, "/playground/", 12) != 0) {
      size_t end = i + 1;
      bool nested = false;
      while (!path_end(msg[end])) {
        nested |= msg[end] == '/';
        end++;
      }
      if (nested) {
        int w = snprintf(out + o, size - o, "[path]");
        o += w > 0 ? (size_t)w : 0;
        if (o >= size)
          o = size - 1;
        i = end;
        n++;
        continue;
      }
    }
    out[o++] = msg[i++];
  }
  out[o] = '\0';
  return n;
}

static MHD_RESULT
error_v(struct MHD_Connection *c, eph_server_t *srv, unsigned status, const char *hname,
        const char *hval, const char *type, const char *field, const char *fmt, va_list ap)
{
  char msg[1200], pub[1300];
  vsnprintf(msg, sizeof msg, fmt, ap);
  int paths = scrub_paths(msg, pub, sizeof pub);
  if (status >= 500) {
    /* A server-side failure: the client gets a stable type and a reference, the log gets the
     * detail (the message may name files, plugins, SQLite errors of the host). */
    char ref[9];
    eph_random_hex(ref, 4);
    /* A 503 is the daemon defending itself (draining, overloaded): expected under load. */
    eph_log(status == MHD_HTTP_SERVICE_UNAVAILABLE ? EPH_LOG_INFO : EPH_LOG_WARN,
            "HTTP %u %s (ref %s): %s", status, type, ref, msg);
    if (paths || strchr(msg, '/'))
      snprintf(pub, sizeof pub, "%s; the daemon's log has the details (ref %s)",
               status == MHD_HTTP_SERVICE_UNAVAILABLE ? "the service cannot take this now"
                                                      : "internal error",
               ref);
    else
      snprintf(pub, sizeof pub, "%s (ref %s)", msg, ref);
  } else if (paths) {
    eph_info("HTTP %u %s: %s", status, type, msg);
  }
  json_object *e = json_object_new_object();
  json_object_object_add(e, "type", json_object_new_string(type));
  json_object_object_add(e, "message", json_object_new_string(pub));
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

/* ------------------------------------------------------------------ stored runs for webhooks */

json_object *
eph_srv_run_from_store(json_object *row)
{
  return eph_run_json_from_store(row, NULL);
}

json_object *
eph_srv_list(json_object *data)
{
  json_object *o = json_object_new_object();
  json_object_object_add(o, "object", json_object_new_string("list"));
  json_object_object_add(o, "data", data);
  return o;
}

int
eph_srv_query_limit(struct MHD_Connection *c, long def, long max, long *limit)
{
  const char *ls = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit");
  *limit = def;
  if (!ls)
    return 0;
  char *end = NULL;
  errno = 0;
  long n = strtol(ls, &end, 10);
  if (!*ls || errno || *end || n < 1 || n > max)
    return -1;
  *limit = n;
  return 0;
}
