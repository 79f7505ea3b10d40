/* ephemerald's small pages: /metrics (Prometheus text), the OpenAPI document and the
 * playground's static files, read from the data directory. */
#include <config.h>

#include "server_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "util.h"

#define STATIC_MAX_BYTES (4u << 20)

MHD_RESULT
eph_srv_metrics(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  (void)req;
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  pthread_mutex_lock(&srv->lock);
  fprintf(f,
          "# HELP ephemeral_runs_created_total Runs admitted since the daemon started.\n"
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
  pthread_mutex_lock(&srv->conns_lock);
  fprintf(f,
          "# HELP ephemeral_http_deadline_closes_total Connections closed for a request head or "
          "body later than its deadline.\n"
          "# TYPE ephemeral_http_deadline_closes_total counter\n"
          "ephemeral_http_deadline_closes_total %" PRIu64 "\n"
          "# HELP ephemeral_http_inflight_refusals_total Requests refused with 503: too many "
          "body bytes in flight.\n"
          "# TYPE ephemeral_http_inflight_refusals_total counter\n"
          "ephemeral_http_inflight_refusals_total %" PRIu64 "\n"
          "# HELP ephemeral_http_inflight_body_bytes Request body bytes booked now.\n"
          "# TYPE ephemeral_http_inflight_body_bytes gauge\n"
          "ephemeral_http_inflight_body_bytes %zu\n"
          "# HELP ephemeral_http_connections_refused_total Connections closed at accept: over "
          "max_connections or max_connections_per_ip.\n"
          "# TYPE ephemeral_http_connections_refused_total counter\n"
          "ephemeral_http_connections_refused_total %" PRIu64 "\n",
          srv->deadline_closes, srv->inflight_refusals, srv->inflight_body_bytes,
          srv->connections_refused);
  pthread_mutex_unlock(&srv->conns_lock);
  fprintf(f, "# HELP ephemeral_http_responses_total HTTP responses by status class.\n"
             "# TYPE ephemeral_http_responses_total counter\n");
  for (int k = 1; k <= 5; k++)
    fprintf(f, "ephemeral_http_responses_total{code=\"%dxx\"} %" PRIu64 "\n", k,
            srv->http_responses[k]);
  pthread_mutex_unlock(&srv->lock);
  fclose(f);
  return eph_srv_send(c, srv, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", text, len,
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
    return eph_srv_error(c, srv, MHD_HTTP_NOT_FOUND, "not_found", NULL, "%s is not installed", rel);
  }
  return eph_srv_send(c, srv, MHD_HTTP_OK, type, data, len, NULL, NULL);
}

MHD_RESULT
eph_srv_openapi(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  (void)req;
  return send_file(srv, c, "openapi.json", "application/json");
}

MHD_RESULT
eph_srv_playground(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  (void)req;
  return send_file(srv, c, "playground/index.html", "text/html; charset=utf-8");
}

MHD_RESULT
eph_srv_static(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  const char *name = req->param;
  /* Only plain file names: no dot-files, no path of any kind. */
  if (!name[0] || name[0] == '.' ||
      strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789-_.") != strlen(name))
    return eph_srv_error(c, srv, MHD_HTTP_NOT_FOUND, "not_found", NULL, "no such file");
  const char *dot = strrchr(name, '.');
  const char *type = !dot                        ? "application/octet-stream"
                     : strcmp(dot, ".js") == 0   ? "text/javascript; charset=utf-8"
                     : strcmp(dot, ".css") == 0  ? "text/css; charset=utf-8"
                     : strcmp(dot, ".html") == 0 ? "text/html; charset=utf-8"
                     : strcmp(dot, ".json") == 0 ? "application/json"
                     : strcmp(dot, ".svg") == 0  ? "image/svg+xml"
                                                 : "application/octet-stream";
  /* The page imports the TypeScript SDK itself (one ESM file, no dependencies): in the
   * source tree it is read where it is kept (data_path adds core/), installed it sits
   * under playground/sdk/. */
  bool sdk = strcmp(name, "ephemeral.js") == 0;
  cleanup_free char *rel = !sdk ? eph_xasprintf("playground/%s", name)
                           : srv->ctx->paths.build_tree && srv->ctx->paths.src_dir
                               ? eph_xstrdup("../sdk/typescript/src/index.js")
                               : eph_xstrdup("playground/sdk/index.js");
  return send_file(srv, c, rel, type);
}
