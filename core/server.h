/* The HTTP API of ephemerald (libmicrohttpd): runs, live events (SSE), health, metrics,
 * the OpenAPI document and the playground page. See docs in core/openapi.json and
 * ephemerald --help.
 *
 * Threads: MHD's internal epoll threads (a small pool) answer requests and never block: a
 * request that waits (POST ?wait=, an SSE stream with nothing new) is suspended and
 * resumed by the run's observer or by the server's ticker. A fixed pool of run workers
 * (max_concurrent_runs) executes runs from a bounded queue.
 *
 * Memory: a run stays in memory while it is queued or running and for live_grace_ms after
 * it settled (so a ?wait or an SSE stream finishes from memory); afterwards every read
 * comes from the store, so the daemon's memory does not grow with history. */
#ifndef EPH_SERVER_H
#define EPH_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ephemeral/plugin.h>

#include "context.h"

typedef struct eph_server eph_server_t;

/* Server settings: the `server` group of ephemeral.conf (documented in core/conf.c's key
 * table and ephemeral.conf), overridden by command-line options. */
typedef struct eph_server_options {
  char listen[300];        /* "ADDR:PORT", "[V6ADDR]:PORT"; port 0 = any free port */
  int max_concurrent_runs; /* run workers: runs executing at once */
  int max_queued_runs;     /* runs admitted beyond those executing; more: 429 */
  size_t max_body_bytes;   /* request body limit; more: 413 */
  int drain_grace_seconds; /* SIGTERM: how long running runs may go on before cancel */
  int idempotency_hours;   /* how long an idempotency key is remembered (>= 24) */
  int live_grace_ms;       /* how long a settled run stays in memory */
  int http_threads;        /* MHD thread pool size */
  /* The HTTP boundary against slow or greedy clients (see docs/http-api.md, "Limits"). */
  int max_connections;            /* connections open at once; more are closed at accept */
  int max_connections_per_ip;     /* connections open at once from one client address */
  int header_timeout_seconds;     /* from connect (or the previous answer) to a complete head */
  int body_timeout_seconds;       /* from a complete head to a complete body */
  int idle_timeout_seconds;       /* a connection with no traffic at all is closed */
  size_t max_inflight_body_bytes; /* request bodies held or announced at once, all clients;
                                     more: 503 with Retry-After */
} eph_server_options_t;

/* Fills opt from the config's `server` group, already checked and parsed by
 * eph_config_load (rows: core/conf_core.h; a wrong type or an out-of-range value failed
 * there with file:line). Returns 0. */
int eph_server_options_from_config(eph_ctx_t *ctx, eph_server_options_t *opt, eph_error_t *err);

/* Opens the store, binds the listening socket, starts the run workers and the HTTP threads.
 * ctx (opened with plugins) must outlive the server. *out owned by the caller: drain then
 * free. Errors: -EADDRINUSE and friends naming the address, store errors. */
int eph_server_start(eph_ctx_t *ctx, const eph_server_options_t *opt, eph_server_t **out,
                     eph_error_t *err);

/* The bound address as "http://127.0.0.1:8080" (the real port when 0 was asked). Borrowed. */
const char *eph_server_url(const eph_server_t *srv);

/* Graceful stop (SIGTERM): stops accepting connections, refuses new runs (503), abandons
 * the queued runs (cancelled, settled), lets running runs finish for grace_seconds, cancels
 * those still running, waits for every run to settle, ends waits and SSE streams, stops the
 * HTTP threads. Every reservation is settled when it returns. */
void eph_server_drain(eph_server_t *srv, int grace_seconds);

/* Frees the server (after eph_server_drain). */
void eph_server_free(eph_server_t *srv);

/* The routes the server serves, "METHOD PATH" with {param} placeholders, one per line, for
 * `ephemerald --routes` (the OpenAPI test compares them with the document). */
void eph_server_print_routes(FILE *out);

/* Parses "ADDR:PORT" / "[V6]:PORT" into a sockaddr (numeric addresses only). Returns 0 or
 * -EINVAL naming the text. */
struct sockaddr_storage;
int eph_server_parse_listen(const char *text, struct sockaddr_storage *ss, unsigned *len,
                            eph_error_t *err);

#endif
