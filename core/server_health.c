/* ephemeral's health and reconciler: a thread that, every second, completes what runs left
 * unfinished (eph_runstore_recover: reservations a failed settle left open, records a
 * failed write left incomplete, runs of a process that died) and re-checks the components
 * (eph_health_check). GET /v1/health answers from the last check, without touching
 * SQLite on an HTTP thread: 200 {"status":"ok"} or 503 {"status":"degraded"} with a reason
 * per component, the status codes a load balancer acts on. */
#include <config.h>

#include "server_int.h"

#include <string.h>
#include <time.h>

#include "health.h"
#include "log.h"
#include "runstore.h"
#include "util.h"
#include "webhook.h"

#define RECONCILE_INTERVAL_MS 1000

/* One pass: recover, then check. Called by the thread, and once before serving. */
static void
reconcile(eph_server_t *srv)
{
  int pending = 0;
  int n = eph_runstore_recover(srv->ctx, srv->store, true, &pending);
  if (n > 0)
    eph_info("reconciler: completed %d run(s) left unsettled or unrecorded", n);
  /* Those runs, and the ones recovered before this daemon's webhook sender existed (at its
   * start, by the CLI), settled without finished(): their ends are announced from the
   * store. */
  eph_webhooks_catch_up(srv->webhooks, eph_srv_run_from_store);
  bool healthy = false, storage_ok = false;
  json_object *report = eph_health_check(srv->ctx, srv->store, NULL, &healthy, &storage_ok);
  if (pending > 0) {
    /* Money still held: the ledger cannot settle or the store cannot record. */
    json_object *c = NULL;
    json_object_object_get_ex(report, "ledger", &c);
    if (c && !json_object_object_get_ex(c, "reason", NULL)) {
      cleanup_free char *why =
          eph_xasprintf("%d run(s) wait to be settled and recorded; retried every second", pending);
      json_object_object_add(c, "pending_runs", json_object_new_int(pending));
      json_object_object_add(c, "note", json_object_new_string(why));
    }
  }
  pthread_mutex_lock(&srv->lock);
  bool was_healthy = srv->healthy;
  if (srv->health)
    json_object_put(srv->health);
  srv->health = report;
  srv->healthy = healthy;
  srv->storage_ok = storage_ok;
  pthread_mutex_unlock(&srv->lock);
  if (was_healthy != healthy && healthy)
    eph_info("health: ok");
  /* One line per degraded component, as `ephemeral doctor` prints it (the report's JSON,
   * logged whole, read as a crash to a new operator). */
  for (size_t i = 0; was_healthy != healthy && !healthy && i < 4; i++) {
    json_object *c = NULL, *v = NULL;
    json_object_object_get_ex(report, eph_health_components[i], &c);
    if (c && json_object_object_get_ex(c, "reason", &v))
      eph_log(EPH_LOG_ERROR, "health: %s: degraded: %s", eph_health_components[i],
              json_object_get_string(v));
  }
}

static void *
reconciler_main(void *arg)
{
  eph_server_t *srv = arg;
  const struct timespec step = {0, 50 * 1000000};
  for (;;) {
    for (int waited = 0; waited < RECONCILE_INTERVAL_MS; waited += 50) {
      nanosleep(&step, NULL);
      pthread_mutex_lock(&srv->lock);
      bool stop = srv->stopping;
      pthread_mutex_unlock(&srv->lock);
      if (stop)
        return NULL;
    }
    reconcile(srv);
  }
}

int
eph_srv_health_start(eph_server_t *srv, eph_error_t *err)
{
  /* A daemon without its ledger would answer every run with 503 while /v1/health said
   * ok: it refuses to start instead (the ledger's own refusal, naming its file, is
   * logged above by the loader). */
  if (!eph_plugins_first(&srv->ctx->plugins, EPH_KIND_LEDGER))
    return eph_error_set(err, EPH_E_CONFIG,
                         "no ledger plugin is loaded (see the refusal above): refusing to "
                         "serve runs that could not be billed");
  srv->healthy = true;
  reconcile(srv);
  int r = pthread_create(&srv->reconciler, NULL, reconciler_main, srv);
  if (r != 0)
    return eph_error_set(err, r, "starting the reconciler: %s", strerror(r));
  srv->reconciler_started = true;
  return 0;
}

void
eph_srv_health_stop(eph_server_t *srv)
{
  if (srv->reconciler_started)
    pthread_join(srv->reconciler, NULL);
  srv->reconciler_started = false;
  pthread_mutex_lock(&srv->lock);
  if (srv->health)
    json_object_put(srv->health);
  srv->health = NULL;
  pthread_mutex_unlock(&srv->lock);
}

bool
eph_srv_storage_ok(eph_server_t *srv, char *why, size_t size)
{
  pthread_mutex_lock(&srv->lock);
  bool ok = srv->storage_ok;
  if (!ok && why) {
    json_object *c = NULL, *v = NULL;
    const char *reason = "storage is failing";
    if ((json_object_object_get_ex(srv->health, "store", &c) &&
         json_object_object_get_ex(c, "reason", &v)) ||
        (json_object_object_get_ex(srv->health, "ledger", &c) &&
         json_object_object_get_ex(c, "reason", &v)))
      reason = json_object_get_string(v);
    snprintf(why, size, "%s", reason);
  }
  pthread_mutex_unlock(&srv->lock);
  return ok;
}

MHD_RESULT
eph_srv_health(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  (void)req;
  pthread_mutex_lock(&srv->lock);
  bool ok = srv->healthy && !srv->draining;
  json_object *o = json_object_new_object();
  json_object_object_add(o, "status",
                         json_object_new_string(srv->draining  ? "draining"
                                                : srv->healthy ? "ok"
                                                               : "degraded"));
  json_object_object_add(o, "version", json_object_new_string(PACKAGE_VERSION));
  json_object_object_add(o, "queued", json_object_new_int(srv->queued));
  json_object_object_add(o, "running", json_object_new_int(srv->running));
  json_object *copy = NULL;
  if (srv->health)
    json_object_deep_copy(srv->health, &copy, NULL);
  json_object_object_add(o, "components", copy ? copy : json_object_new_object());
  pthread_mutex_unlock(&srv->lock);
  return eph_srv_json(c, srv, ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, o);
}
