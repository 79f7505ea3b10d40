/* GET /v1/runs/{id}/events: the run's timeline as Server-Sent Events.
 *
 * Each event is sent as `id: <seq>`, `event: <kind>`, `data: <event JSON>`; the stream opens
 * with `retry: SSE_RETRY_MS` and ends after the `settled` event (always the last one). A
 * client that reconnects with Last-Event-ID: N gets the events after N, none twice. A
 * reconnect whose cursor is the run's last event (nothing will ever follow) gets 204: the
 * EventSource spec's "stop reconnecting" (a 200 with an empty stream would make a browser
 * reconnect every few seconds forever). A cursor that names no event of a settled run (not a
 * number, or past its last event) is refused with 400 rather than answered with an empty
 * stream; a running run is given the benefit of the doubt.
 *
 * A live run is read from memory: when nothing is new the connection is suspended and the
 * run's observer resumes it at the next event (the ticker resumes it every 15 s for a
 * keep-alive comment). A run no longer in memory is read from the store in one go; on a
 * cluster's shared store (PostgreSQL) it may be executing on another node, so its stored
 * events are read again whenever that node announces one (NOTIFY eph_events, delivered by
 * server_listen.c), and at the latest every cluster_poll_ms (every SSE_REMOTE_POLL_MS while
 * the listener is down), until its `settled` event (docs/cluster.md).
 *
 * The API key that opened a stream is verified again in the store before each batch of
 * events it sends: a key revoked (on any node of a cluster) while its streams are open ends
 * them before anything more of the run goes out (at the latest at the next keep-alive, when
 * nothing happens), as every new request with it is refused; a reconnect gets 401. */
#include <config.h>

#include "server_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "admin.h"
#include "log.h"
#include "util.h"

/* The reconnection delay an EventSource is told to use after a dropped stream. */
#define SSE_RETRY_MS 2000
/* How often a stream of a run executing on another cluster node polls the store while the
 * listener is down. */
#define SSE_REMOTE_POLL_MS 200

typedef struct sse {
  eph_server_t *srv;
  live_t *live; /* a ref, or NULL: read from the store */
  bool remote;  /* not live here, the store shared (PostgreSQL): follow it until settled */
  char run_id[EPH_SRV_PARAM_BYTES + 1]; /* the route's {id}, whole */
  char *key_id; /* the key that opened the stream, verified before each batch; owned */
  int64_t last_seq;
  char *buf;
  size_t len, off;
  bool done;
  int64_t keepalive_at;
  /* A followed run of another node (remote): the store is read when an event is announced
   * (events_gen moved past slept_gen) or at poll_at (the safety poll), not at every
   * keep-alive. slept: the last read found nothing and the stream went to sleep. */
  bool slept;
  uint64_t slept_gen;
  int64_t poll_at;
  waiter_t waiter;
} sse_t;

static void
append_events(sse_t *s, json_object *events, bool from_store)
{
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  for (size_t i = 0; i < json_object_array_length(events); i++) {
    json_object *e = json_object_array_get_idx(events, i), *v = NULL;
    cleanup_json json_object *conv = from_store ? eph_event_json_from_store(e) : NULL;
    if (conv)
      e = conv;
    int64_t seq = json_object_object_get_ex(e, "seq", &v) ? json_object_get_int64(v) : 0;
    const char *kind = json_object_object_get_ex(e, "kind", &v) ? json_object_get_string(v) : "";
    fprintf(
        f, "id: %" PRId64 "\nevent: %s\ndata: %s\n\n", seq, kind,
        json_object_to_json_string_ext(e, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
    s->last_seq = seq;
    if (strcmp(kind, "settled") == 0)
      s->done = true; /* always the last event of a run */
  }
  fclose(f);
  free(s->buf);
  s->buf = text;
  s->len = len;
  s->off = 0;
}

/* When the keep-alive deadline has passed: queues an SSE comment as the next output (so a
 * quiet stream is not closed by a proxy) and returns true. */
static bool
keepalive_due(sse_t *s, int64_t now)
{
  if (!s->keepalive_at || now < s->keepalive_at)
    return false;
  s->keepalive_at = 0;
  static const char ka[] = ": keep-alive\n\n";
  free(s->buf);
  s->buf = eph_xstrdup(ka);
  s->len = sizeof ka - 1;
  s->off = 0;
  return true;
}

/* False when the stream's key no longer authenticates (revoked): the stream is ended with
 * a comment saying so. A store that cannot answer ends it too (fail closed: the client
 * reconnects with Last-Event-ID and is authenticated afresh). */
static bool
key_still_valid(sse_t *s)
{
  if (!s->key_id)
    return true;
  cleanup_free char *org = NULL;
  eph_error_t err = {0};
  int r = eph_admin_key_org(s->srv->store, s->key_id, &org, &err);
  if (r == 0)
    return true;
  static const char revoked[] = ": the API key of this stream was revoked\n\n";
  static const char failed[] = ": the API key of this stream could not be verified\n\n";
  if (r != -ENOENT)
    eph_warn("events of %s: verifying the stream's key: %s", s->run_id, err.message);
  free(s->buf);
  s->buf = eph_xstrdup(r == -ENOENT ? revoked : failed);
  s->len = strlen(s->buf);
  s->off = 0;
  s->done = true;
  return false;
}

static ssize_t
sse_read(void *cls, uint64_t pos, char *out, size_t max)
{
  (void)pos;
  sse_t *s = cls;
  eph_server_t *srv = s->srv;
  /* Once per call that produces output (MHD calls again after each resume): before the
   * batch of events or the keep-alive it sends. */
  bool verified = false;
  for (;;) {
    if (s->off < s->len) {
      size_t n = s->len - s->off < max ? s->len - s->off : max;
      memcpy(out, s->buf + s->off, n);
      s->off += n;
      return (ssize_t)n;
    }
    if (s->done)
      return MHD_CONTENT_READER_END_OF_STREAM;
    if (!verified) {
      verified = true;
      if (!key_still_valid(s))
        continue;
    }
    if (!s->live) {
      pthread_mutex_lock(&srv->lock);
      uint64_t gen = srv->events_gen;
      pthread_mutex_unlock(&srv->lock);
      int64_t now = eph_now_ms();
      /* The store is read unless this wake is the keep-alive's only: nothing announced
       * since the last read found nothing new, and the safety poll not due. */
      bool read = !s->slept || gen != s->slept_gen || now >= s->poll_at;
      s->slept = false;
      if (read) {
        cleanup_json json_object *events = NULL;
        eph_error_t err = {0};
        if (eph_store_events_since(srv->store, s->run_id, s->last_seq, 0, &events, &err) < 0) {
          eph_warn("events of %s: %s", s->run_id, err.message);
          return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        bool got = json_object_array_length(events) > 0;
        append_events(s, events, true); /* done once `settled` went out */
        /* One host: a run out of memory has nothing more to say. A cluster: it may be
         * running on another node, whose events arrive in the store, announced. */
        if (!s->remote)
          s->done = true;
        if (got || s->done)
          continue;
        s->poll_at = now + eph_srv_poll_ms(srv, SSE_REMOTE_POLL_MS);
      }
      if (keepalive_due(s, now)) {
        s->slept = true; /* what follows the comment is a keep-alive's wake, not a read's */
        s->slept_gen = gen;
        continue;
      }
      if (!s->keepalive_at)
        s->keepalive_at = now + SSE_KEEPALIVE_MS;
      pthread_mutex_lock(&srv->lock);
      if (srv->stopping) {
        pthread_mutex_unlock(&srv->lock);
        s->done = true;
        continue;
      }
      if (srv->events_gen != gen) {
        /* An event was announced since the read: read again rather than sleep on it. */
        pthread_mutex_unlock(&srv->lock);
        continue;
      }
      s->slept = true;
      s->slept_gen = gen;
      s->waiter.live = NULL;
      s->waiter.events = false;
      s->waiter.remote_id = s->run_id;
      s->waiter.deadline_ms = s->poll_at < s->keepalive_at ? s->poll_at : s->keepalive_at;
      eph_srv_wait_add(srv, &s->waiter);
      pthread_mutex_unlock(&srv->lock);
      return 0; /* suspended: its announced event (server_listen.c) or the deadline resumes it */
    }
    bool settled = eph_run_settled(s->live->run);
    cleanup_json json_object *events = eph_run_events_json(s->live->run, s->last_seq);
    if (json_object_array_length(events) > 0) {
      /* Sent only once stored: a client resuming after a crash must find them there. */
      eph_run_sync_events(s->live->run);
      append_events(s, events, false);
      continue;
    }
    if (settled) {
      s->done = true;
      continue;
    }
    int64_t now = eph_now_ms();
    if (keepalive_due(s, now))
      continue;
    pthread_mutex_lock(&srv->lock);
    if (srv->stopping) {
      pthread_mutex_unlock(&srv->lock);
      s->done = true;
      continue;
    }
    /* Counted as a stream of the run first, then checked again: an event appended before
     * the count is seen here, one after it wakes us (server_live.c obs_wake). */
    s->waiter.live = s->live;
    s->waiter.events = true;
    eph_srv_count_event_waiter(&s->waiter);
    if (eph_run_wait_events(s->live->run, s->last_seq, 0)) {
      eph_srv_wait_remove(srv, &s->waiter);
      pthread_mutex_unlock(&srv->lock);
      continue;
    }
    if (!s->keepalive_at)
      s->keepalive_at = now + SSE_KEEPALIVE_MS;
    s->waiter.remote_id = NULL;
    s->waiter.deadline_ms = s->keepalive_at;
    eph_srv_wait_add(srv, &s->waiter);
    pthread_mutex_unlock(&srv->lock);
    return 0; /* suspended: MHD asks again once resumed */
  }
}

static void
sse_free(void *cls)
{
  sse_t *s = cls;
  pthread_mutex_lock(&s->srv->lock);
  eph_srv_wait_remove(s->srv, &s->waiter);
  pthread_mutex_unlock(&s->srv->lock);
  eph_srv_live_put(s->live);
  free(s->buf);
  free(s->key_id);
  free(s);
}

static MHD_RESULT
bad_cursor(eph_server_t *srv, struct MHD_Connection *c, const char *text)
{
  return eph_srv_error(c, srv, MHD_HTTP_BAD_REQUEST, "invalid_request", "Last-Event-ID",
                       "Last-Event-ID '%.64s' names no event of this run", text);
}

/* 204 to a reconnect after the run's last event: an EventSource stops reconnecting. */
static MHD_RESULT
no_more_events(eph_server_t *srv, struct MHD_Connection *c)
{
  struct MHD_Response *resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
  if (!resp)
    return MHD_NO;
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  eph_srv_secure_headers(resp, NULL);
  MHD_RESULT r = MHD_queue_response(c, MHD_HTTP_NO_CONTENT, resp);
  MHD_destroy_response(resp);
  eph_srv_count(srv, MHD_HTTP_NO_CONTENT);
  return r;
}

MHD_RESULT
eph_srv_runs_events(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  const char *id = req->param;
  const char *cursor = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID");
  int64_t last = 0;
  if (cursor) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(cursor, &end, 10);
    if (!*cursor || errno || *end || v < 0)
      return bad_cursor(srv, c, cursor);
    last = v;
  }
  live_t *l = eph_srv_live_get(srv, id);
  if (l && strcmp(l->org, req->org) != 0) {
    eph_srv_live_put(l);
    return eph_srv_error(c, srv, MHD_HTTP_NOT_FOUND, "not_found", NULL, "run %s does not exist",
                         id);
  }
  eph_error_t err = {0};
  if (l) {
    /* The cursor must name an event that exists: seq `last` itself. A running run may
     * still reach it; a settled one never will. */
    if (last > 0) {
      cleanup_json json_object *from = eph_run_events_json(l->run, last - 1);
      json_object *first = json_object_array_get_idx(from, 0), *kind = NULL;
      /* Named by its kind, not by eph_run_settled(): the flag is set moments after the
       * settled event is out, and a reconnect may come in between. */
      bool at_end = first && json_object_object_get_ex(first, "kind", &kind) &&
                    strcmp(json_object_get_string(kind), "settled") == 0;
      if (at_end || (!first && eph_run_settled(l->run))) {
        eph_srv_live_put(l);
        return at_end ? no_more_events(srv, c) : bad_cursor(srv, c, cursor);
      }
    }
  } else {
    cleanup_json json_object *row = NULL;
    if (eph_store_run_get(srv->store, id, req->org, &row, &err) < 0) {
      if (err.code == ENOENT)
        return eph_srv_error(c, srv, MHD_HTTP_NOT_FOUND, "not_found", NULL, "%s", err.message);
      eph_error("%s", err.message);
      return eph_srv_error(c, srv, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal_error", NULL,
                           "the store failed; see the daemon's log");
    }
    if (last > 0) {
      cleanup_json json_object *from = NULL;
      if (eph_store_events_since(srv->store, id, last - 1, 2, &from, &err) < 0 ||
          json_object_array_length(from) == 0)
        return bad_cursor(srv, c, cursor);
      json_object *at = json_object_array_get_idx(from, 0), *kind = NULL;
      bool at_end = json_object_object_get_ex(at, "kind", &kind) &&
                    strcmp(json_object_get_string(kind), "settled") == 0;
      /* Out of memory on one host, or settled: nothing will follow. */
      if (json_object_array_length(from) == 1 &&
          (at_end || eph_store_kind(srv->store) != EPH_STORE_POSTGRES))
        return no_more_events(srv, c);
    }
  }
  sse_t *s = eph_xcalloc(1, sizeof *s);
  s->srv = srv;
  s->live = l;
  s->remote = !l && eph_store_kind(srv->store) == EPH_STORE_POSTGRES;
  s->last_seq = last;
  s->key_id = req->key_id ? eph_xstrdup(req->key_id) : NULL;
  s->waiter.conn = c;
  snprintf(s->run_id, sizeof s->run_id, "%s", id);
  s->buf = eph_xasprintf("retry: %d\n\n", SSE_RETRY_MS);
  s->len = strlen(s->buf);
  struct MHD_Response *resp =
      MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_read, s, sse_free);
  if (!resp) {
    sse_free(s);
    return MHD_NO;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  MHD_add_response_header(resp, "X-Accel-Buffering", "no");
  eph_srv_secure_headers(resp, "text/event-stream");
  MHD_RESULT r = MHD_queue_response(c, MHD_HTTP_OK, resp);
  MHD_destroy_response(resp);
  eph_srv_count(srv, MHD_HTTP_OK);
  return r;
}
