/* Internals shared by core/server*.c (not installed, not used elsewhere). */
#ifndef EPH_SERVER_INT_H
#define EPH_SERVER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <microhttpd.h>

#include "run.h"
#include "server.h"
#include "store.h"

#if MHD_VERSION < 0x00097002
typedef int MHD_RESULT;
#else
typedef enum MHD_Result MHD_RESULT;
#endif

/* Status codes whose MHD_HTTP_* names changed across libmicrohttpd releases. */
#define HTTP_UNPROCESSABLE 422
#define HTTP_CONTENT_TOO_LARGE 413

#define LIVE_BUCKETS 256
#define SSE_KEEPALIVE_MS 15000
#define WAIT_MAX_SECONDS 600

typedef struct live live_t;

/* A suspended connection waiting for a run's news or a deadline. Lives inside the request
 * or SSE state that owns it; listed in srv->waiters while suspended. */
typedef struct waiter {
  struct MHD_Connection *conn;
  live_t *live; /* whose end (and, with events, whose events) wakes it, or NULL */
  /* Woken by each of live's events (an SSE stream), not only by its end (a ?wait=): counted
   * in live->event_waiters while listed, so that an event nobody streams takes no lock. */
  bool events;
  bool counted; /* counted in live->event_waiters (eph_srv_count_event_waiter) */
  /* A run executing on another cluster node whose announced events (NOTIFY eph_events)
   * wake it, or NULL; borrowed from the owner of the waiter. */
  const char *remote_id;
  int64_t deadline_ms; /* CLOCK_MONOTONIC; the ticker resumes it then */
  bool listed;
  struct waiter *prev, *next;
} waiter_t;

/* A run in memory: queued, running, or settled less than live_grace_ms ago. */
struct live {
  eph_server_t *srv;
  eph_run_t *run;
  char id[40];
  char *org;
  int refs; /* the table's own ref + readers; freed at 0 */
  /* Listed waiters woken by its events (waiter_t.events): an event takes srv->lock, to wake
   * them, only when there is one. Changed under srv->lock, read without it. */
  atomic_int event_waiters;
  bool in_table, queued, running, settled;
  int64_t settled_ms;
  live_t *bucket_next;
  live_t *queue_next;
};

typedef struct route route_t;

/* One open client connection (MHD's socket_context), listed in srv->conns so that the guard
 * thread can end one that misses its deadline: libmicrohttpd only knows an idle timeout, which
 * a client sending one byte every few seconds resets forever. */
typedef struct conn_track {
  int fd;              /* the connection's socket (MHD's; shut down, never closed, here) */
  int64_t deadline_ms; /* CLOCK_MONOTONIC; 0 = none (the request is being answered) */
  const char *phase;   /* "head" or "body": what it was late with, for the log */
  struct conn_track *prev, *next;
} conn_track_t;

/* The longest {id} segment a route captures: the longest id the store keeps (run ids, up
 * to 128 bytes), so a 64-byte organisation (EPH_ORG_NAME_MAX_BYTES) is routed and a longer
 * one (up to 128 bytes) reaches its handler, refused there as 400 naming org rather than as
 * no route (404). */
#define EPH_SRV_PARAM_BYTES 128

/* Per-request state (MHD's con_cls). */
typedef struct conn_req {
  bool started; /* the first on_request call (complete head) happened */
  bool bad_uri; /* the raw request target has an encoded '/', '\\' or NUL */
  const route_t *route;
  /* the {id} segment */
  char param[EPH_SRV_PARAM_BYTES + 1];
  char *org;    /* authenticated organisation; owned */
  char *key_id; /* the key that authenticated it ("key_..."); owned */
  char *body;
  size_t body_len, body_cap;
  bool body_refused;
  /* A refusal decided at the head but answered once the body is read and discarded: a
   * client that is still sending (Python's urllib, Node's fetch) sees a reset instead of the
   * answer when the connection closes under its upload. 0 = none. */
  unsigned refuse_status;
  const char *refuse_type;
  const char *refuse_field; /* static, or NULL */
  const char *refuse_hname; /* one extra header of the answer (static), or NULL */
  char refuse_hval[64];
  char refuse_msg[160];
  size_t inflight_bytes; /* this request's share of srv->inflight_body_bytes */
  bool admitted;         /* POST /v1/runs: the run exists, maybe waiting */
  int status;            /* HTTP status of the first answer (201 or 200) */
  live_t *live;          /* a ref while waiting */
  char run_id[40];
  int64_t wait_until_ms;
  json_object *created; /* the run as admitted (status queued): the answer without ?wait */
  waiter_t waiter;
} conn_req_t;

struct eph_server {
  eph_ctx_t *ctx;
  eph_server_options_t opt;
  eph_store_t *store;
  struct MHD_Daemon *mhd;
  int listen_fd;
  char url[320];
  eph_request_limits_t limits;
  /* Requests may name a transcript ("replay:PATH", a host path the daemon opens) only on a
   * daemon whose operator made it an offline replayer (model_plugin = "model-replay"). */
  bool replay_models;

  pthread_mutex_t lock;  /* table, queue, waiters, counters */
  pthread_cond_t cond;   /* workers: queue; drain: runs ended */
  pthread_mutex_t admit; /* POST /v1/runs: idempotency claim .. run row, one at a time */
  live_t *table[LIVE_BUCKETS];
  live_t *queue_head, *queue_tail;
  int queued, running, live_count;
  waiter_t *waiters;
  bool draining, stopping;
  /* PostgreSQL: runs are admitted into the cluster's shared queue and workers claim from it
   * (docs/cluster.md); false (SQLite): the in-memory queue only. */
  bool shared_queue;
  /* PostgreSQL: the other nodes' announcements (server_listen.c); NULL on SQLite. While it
   * is up, the database is polled every cluster_poll_ms only, for what a lost
   * notification would miss; while it is down, at the old pace (200-250 ms). */
  eph_store_listener_t *listener;
  int64_t cluster_poll_ms;
  /* Raised (under lock) by every announcement of a queued run / of any run's event: a
   * worker or a follower that read the database before a raise reads again instead of
   * sleeping through what it announced. */
  uint64_t queue_gen, events_gen;
  int64_t next_purge_ms;
  pthread_t *workers;
  int n_workers;
  pthread_t ticker;
  bool ticker_started;

  /* Metrics since start. */
  uint64_t runs_created;
  uint64_t runs_ended[EPH_RUN_CANCELLED + 1];
  int64_t billed_model_micros, billed_web_micros, billed_compute_micros;
  uint64_t http_responses[6]; /* by first digit of the status: 1xx .. 5xx */
  uint64_t idempotent_replays;
  uint64_t queue_full_refusals;

  /* The connection guard (server.c): open connections and their deadlines. */
  pthread_mutex_t conns_lock;
  pthread_cond_t guard_cond;
  conn_track_t *conns;
  bool guard_started, guard_stop;
  pthread_t guard;
  size_t inflight_body_bytes;                  /* under conns_lock */
  uint64_t deadline_closes, inflight_refusals; /* under conns_lock */
  uint64_t connections_refused, refused_said;  /* under conns_lock */
  int64_t refused_said_ms;
  /* server_health.c: the reconciler thread and the last health check (under lock). */
  pthread_t reconciler;
  bool reconciler_started;
  json_object *health; /* components, as eph_health_check returns them */
  bool healthy, storage_ok;
  struct eph_webhooks *webhooks; /* core/webhook.c: run-end deliveries */
};

/* server_http.c */
/* Sends data (malloc'd, taken) with the secure headers, one optional extra header and, for
 * a 503, a default Retry-After; counts the status. */
MHD_RESULT eph_srv_send(struct MHD_Connection *c, eph_server_t *srv, unsigned status,
                        const char *type, char *data, size_t len, const char *hname,
                        const char *hval);
MHD_RESULT eph_srv_json(struct MHD_Connection *c, eph_server_t *srv, unsigned status,
                        json_object *body);
/* {"object":"list","data":data}: a list answer (data consumed). */
json_object *eph_srv_list(json_object *data);
/* The `limit` query parameter into *limit: def when absent; -1 when it is not an integer
 * within 1..max (the caller answers 400 naming limit, "limit: expected 1..max"). */
int eph_srv_query_limit(struct MHD_Connection *c, long def, long max, long *limit);
MHD_RESULT eph_srv_error(struct MHD_Connection *c, eph_server_t *srv, unsigned status,
                         const char *type, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
MHD_RESULT eph_srv_error_h(struct MHD_Connection *c, eph_server_t *srv, unsigned status,
                           const char *hname, const char *hval, const char *type, const char *field,
                           const char *fmt, ...) __attribute__((format(printf, 8, 9)));
void eph_srv_count(eph_server_t *srv, unsigned status);
/* Adds the headers every answer carries (nosniff, no framing, a Content-Security-Policy for
 * `content_type`). */
void eph_srv_secure_headers(struct MHD_Response *resp, const char *content_type);

/* server_live.c: the runs in memory (srv->lock taken inside unless the name ends in
 * _locked, when the caller holds it). */
live_t *eph_srv_live_get(eph_server_t *srv, const char *id); /* a ref, or NULL */
void eph_srv_live_put(live_t *l);
/* A new live_t of run (borrowed until the live is freed; org taken) with refs references,
 * not yet in the table; *obs is the observer that wakes its waiters (attach it with the
 * run's store link). */
live_t *eph_srv_live_new(eph_server_t *srv, eph_run_t *run, char *org, int refs,
                         eph_run_observer_t *obs);
/* Puts l in the table (srv->lock held). */
void eph_srv_live_insert_locked(eph_server_t *srv, live_t *l);
/* Detaches l's run from the store, frees the run and l (the last ref is gone). */
void eph_srv_live_free(live_t *l);
/* Takes out of the table the runs settled live_grace_ms before now_ms (all of them when
 * all) and returns, chained by bucket_next, those whose last ref that dropped (srv->lock
 * held); eph_srv_live_free_chain frees them once the lock is released (true when it freed
 * any). */
live_t *eph_srv_live_unlink_locked(eph_server_t *srv, bool all, int64_t now_ms);
bool eph_srv_live_free_chain(live_t *dead);
/* Resumes every connection waiting on l (all of them when l is NULL); one waiter. */
void eph_srv_wake_locked(eph_server_t *srv, live_t *l);
/* Under srv->lock: counts w (events, live set) in w->live->event_waiters before the caller
 * checks for new events and suspends it with eph_srv_wait_add: an event appended before the
 * count is seen by that check, one after it wakes w. Removing w uncounts it. */
void eph_srv_count_event_waiter(waiter_t *w);
void eph_srv_resume_locked(eph_server_t *srv, waiter_t *w);
/* Books a run that has settled: counters, waiters, the drain's condition, its webhook. */
void eph_srv_live_finished(eph_server_t *srv, live_t *l);
/* A run leaving this node's memory queue on a cluster (a zero-data-retention run, counted in
 * the shared queue as a local_only row for its bound): it leaves the count too, whether it
 * starts, is cancelled or is abandoned by a drain. A no-op for a run that has no row. */
void eph_srv_leave_shared_queue(eph_server_t *srv, live_t *l);
/* Cancels a run live on this node (queued: abandoned; running: told to stop). False when
 * it has already ended. */
bool eph_srv_cancel_live(eph_server_t *srv, live_t *l);
/* Takes a run still waiting in this node's memory queue out of it and ends it cancelled
 * with `reason`, settled. False (nothing done) when a worker already took it. */
bool eph_srv_unqueue_live(eph_server_t *srv, live_t *l, const char *reason);

/* server_workers.c: the worker pool and the ticker. */
int eph_srv_runs_init(eph_server_t *srv, eph_error_t *err);

/* How long a cluster node waits before looking at the database again for something other
 * nodes announce (a queued run, an event, a cancel): the long safety poll while the
 * listener is up, else fallback_ms (the pace from before the listener). */
static inline int64_t
eph_srv_poll_ms(eph_server_t *srv, int64_t fallback_ms)
{
  return eph_store_listener_up(srv->listener) ? srv->cluster_poll_ms : fallback_ms;
}

/* server_listen.c: starts listening for other nodes' announcements on a PostgreSQL store
 * (no-op on SQLite; a failure to start is logged and the node polls). Called before the
 * workers start; stopped once they and the ticker have (eph_server_free). */
void eph_srv_listen_start(eph_server_t *srv);
void eph_srv_listen_stop(eph_server_t *srv);
/* server_live.c: cancels, among the run ids of a JSON array, those live on this node (a
 * cancel request made on another node). */
void eph_srv_cancel_ids(eph_server_t *srv, json_object *ids);

/* Cluster duties run by the ticker (server_cluster.c); a no-op unless the store is
 * PostgreSQL. */
typedef struct eph_srv_cluster {
  bool enabled;
  int64_t lease_every_ms, last_cancel_poll_ms, next_lease_ms;
} eph_srv_cluster_t;
void eph_srv_cluster_init(eph_server_t *srv, eph_srv_cluster_t *c);
/* Returns the ids (a new JSON array, or NULL) of runs other nodes were asked to cancel: the
 * caller cancels those live here and puts the array. */
json_object *eph_srv_cluster_tick(eph_server_t *srv, eph_srv_cluster_t *c, int64_t now_ms);
/* Claims the oldest run of the shared queue this node may take and builds it with the
 * admitting node's reservation (never reserving again): the run (its `reserved` event,
 * seq 1, is already stored: attach it with eph_runstore_adopt(..., 1, ...)), *org_out
 * (heap) its organisation; NULL when nothing is queued for this node, or when the claimed
 * run is one this node already holds in memory (local_only, zero data retention) or could
 * not be rebuilt (then it is ended host_lost and settled, and a warning logged). */
eph_run_t *eph_srv_cluster_claim(eph_server_t *srv, char **org_out);
/* A cancel of run id while it waits in the shared queue (not live on this node): takes it
 * out of the queue (eph_store_queue_take: of a claim and this, exactly one gets it) and ends
 * it cancelled here and now, its whole reservation released, as a claimer would end it.
 * 1 when done; 0 when it was not in the queue (claimed meanwhile: the caller requests the
 * cancel from its claimer; or a zero-data-retention run held by its admitting node);
 * -1 with err set when the store failed. */
int eph_srv_cluster_cancel_queued(eph_server_t *srv, const char *id, eph_error_t *err);

void eph_srv_wait_add(eph_server_t *srv, waiter_t *w);    /* srv->lock held: suspends w->conn */
void eph_srv_wait_remove(eph_server_t *srv, waiter_t *w); /* srv->lock held */
json_object *eph_srv_run_object(eph_server_t *srv, const char *id, const char *org, bool events,
                                eph_error_t *err);
/* A store row (eph_store_run_get, borrowed) as the API's run object, without events: the
 * webhooks' renderer (eph_run_json_from_store, run.h, renders a stored run for every route). */
json_object *eph_srv_run_from_store(json_object *row);
/* server_live.c: makes a created run live on this node: recorded through the store (its
 * row and events), put in the table and at the end of the in-memory queue for a worker. On
 * failure the run's reservation is settled (eph_run_abandon) and the run freed: -1 with err
 * set. *created (when not NULL) receives the run as admitted, rendered before a worker can
 * touch it. */
int eph_srv_live_enqueue(eph_server_t *srv, eph_run_t *run, const char *org, json_object **created,
                         eph_error_t *err);
/* A store error answered: 404 for ENOENT, otherwise 500 (the reason goes to the log). */
MHD_RESULT eph_srv_store_failure(eph_server_t *srv, struct MHD_Connection *c,
                                 const eph_error_t *err);
/* server_admit.c: POST /v1/runs. */
MHD_RESULT eph_srv_runs_create(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);
/* server_runs.c: the run routes (continue: a created run's answer, or its ?wait=). */
MHD_RESULT eph_srv_runs_continue(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);
MHD_RESULT eph_srv_runs_get(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);
MHD_RESULT eph_srv_runs_list(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);
MHD_RESULT eph_srv_runs_cancel(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);
/* server_workers.c */
void eph_srv_runs_drain(eph_server_t *srv, int grace_seconds);
void eph_srv_runs_stop(eph_server_t *srv);
/* server_live.c: a request's wait and its ref let go. */
void eph_srv_req_done(eph_server_t *srv, conn_req_t *req);

/* server_health.c */
int eph_srv_health_start(eph_server_t *srv, eph_error_t *err); /* first check, thread */
void eph_srv_health_stop(eph_server_t *srv);                   /* after srv->stopping is set */
/* False while the store or the ledger fails its probe; why receives the reason. */
bool eph_srv_storage_ok(eph_server_t *srv, char *why, size_t size);
MHD_RESULT eph_srv_health(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);

/* server_webhooks.c */
MHD_RESULT eph_srv_webhooks_create(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);
MHD_RESULT eph_srv_webhooks_list(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);
MHD_RESULT eph_srv_webhooks_delete(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);
MHD_RESULT eph_srv_webhooks_secret(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);
MHD_RESULT eph_srv_webhooks_deliveries(eph_server_t *srv, struct MHD_Connection *c,
                                       conn_req_t *req);

/* server_admin.c: the /v1/admin/ routes (admin keys only; every call audited) */
MHD_RESULT eph_srv_admin_keys_create(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);
MHD_RESULT eph_srv_admin_keys_list(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);
MHD_RESULT eph_srv_admin_keys_revoke(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);
MHD_RESULT eph_srv_admin_credit(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);
MHD_RESULT eph_srv_admin_balance(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);
MHD_RESULT eph_srv_admin_usage(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);
MHD_RESULT eph_srv_admin_audit(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);

/* server_sse.c */
MHD_RESULT eph_srv_runs_events(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);

/* server_pages.c */
MHD_RESULT eph_srv_metrics(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);
MHD_RESULT eph_srv_openapi(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);
MHD_RESULT eph_srv_playground(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);
MHD_RESULT eph_srv_static(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req);

#endif
