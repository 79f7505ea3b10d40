/* ephemeral — the admission of runs: POST /v1/runs (docs/api.md).
 *
 * Judges a request, claims its Idempotency-Key, reserves its budget (eph_run_new) and hands
 * the run to server_runs.c's queue. Sits above server_runs.c: it calls down into it, never
 * the other way round (tests/check-cycles). */
#include <config.h>

#include "server_int.h"

#include <errno.h>
#include <stdint.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "runstore.h"
#include "util.h"
#include "webhook.h"

/* How long an admission waits for the run row of an idempotency key claimed by another
 * cluster node before answering 503 (retry with the same key). */
#define CLUSTER_CLAIM_WAIT_MS 5000

static int
parse_wait(struct MHD_Connection *c, int64_t *until_ms)
{
  *until_ms = 0;
  const char *w = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "wait");
  if (!w)
    return 0;
  char *end = NULL;
  errno = 0;
  long v = strtol(w, &end, 10);
  if (!*w || errno || *end || v < 0 || v > WAIT_MAX_SECONDS)
    return -1;
  if (v > 0)
    *until_ms = eph_now_ms() + v * 1000;
  return 0;
}

static bool
valid_idempotency_key(const char *k)
{
  size_t n = strlen(k);
  if (n == 0 || n > 255)
    return false;
  for (const unsigned char *p = (const unsigned char *)k; *p; p++)
    if (*p < 0x21 || *p > 0x7e)
      return false;
  return true;
}

/* The admission of a request with an Idempotency-Key is marked by an flock on
 * <state_dir>/runs/.claim-<run_id>, held from before the key is claimed until the run's row
 * is stored (or the claim released). Another process on the same state directory (a second
 * daemon) that finds the key claimed but no row can then tell "still being admitted" (the
 * mark is locked) from "its admitter died" (it is not): before, it took the second for the
 * first, claimed the key again and created and reserved a second run. */
static char *
claim_mark_path(eph_server_t *srv, const char *run_id)
{
  if (strspn(run_id, "abcdefghijklmnopqrstuvwxyz0123456789_") != strlen(run_id))
    return NULL; /* not a name of ours */
  return eph_xasprintf("%s/runs/.claim-%s", srv->ctx->state_dir, run_id);
}

/* The mark of run_id, locked: its descriptor, or -1 with err set. */
static int
claim_mark(eph_server_t *srv, const char *run_id, eph_error_t *err)
{
  cleanup_free char *dir = eph_xasprintf("%s/runs", srv->ctx->state_dir);
  if (eph_mkdir_p(dir, 0700, err) < 0)
    return -1;
  cleanup_free char *path = claim_mark_path(srv, run_id);
  if (!path)
    return eph_error_set(err, EINVAL, "run id %s: not a name of ours", run_id), -1;
  /* Locked under a private name, then renamed into place: the mark is never seen unlocked
   * (the reconciler removes unlocked ones). */
  cleanup_free char *tmp = eph_xasprintf("%s/.mark-%s", dir, run_id);
  int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return eph_error_set(err, errno, "%s: %s", tmp, strerror(errno)), -1;
  if (flock(fd, LOCK_EX) < 0 || rename(tmp, path) < 0) {
    eph_error_set(err, errno, "%s: %s", path, strerror(errno));
    unlink(tmp);
    close(fd);
    return -1;
  }
  return fd;
}

/* Removed only after the row is stored (or the claim released): whoever finds the mark
 * gone reads the row again. */
static void
claim_unmark(eph_server_t *srv, const char *run_id, int *fd)
{
  if (*fd < 0)
    return;
  cleanup_free char *path = claim_mark_path(srv, run_id);
  if (path)
    unlink(path);
  close(*fd);
  *fd = -1;
}

/* True while the process that claimed a key for run_id is still admitting it. A mark left
 * by a process that died is removed. */
static bool
claim_in_progress(eph_server_t *srv, const char *run_id)
{
  cleanup_free char *path = claim_mark_path(srv, run_id);
  if (!path)
    return false;
  int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return false;
  bool alive = flock(fd, LOCK_EX | LOCK_NB) < 0 && errno == EWOULDBLOCK;
  if (!alive)
    unlink(path);
  close(fd);
  return alive;
}

MHD_RESULT
eph_srv_runs_create(eph_server_t *srv, struct MHD_Connection *c, conn_req_t *req)
{
  if (parse_wait(c, &req->wait_until_ms) < 0)
    return eph_srv_error(c, srv, MHD_HTTP_BAD_REQUEST, "invalid_request", "wait",
                         "wait: expected whole seconds 0..%d", WAIT_MAX_SECONDS);
  const char *idem = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Idempotency-Key");
  if (idem && !valid_idempotency_key(idem))
    return eph_srv_error(c, srv, MHD_HTTP_BAD_REQUEST, "invalid_request", "Idempotency-Key",
                         "Idempotency-Key: 1 to 255 printable ASCII characters");
  /* Everything that can be judged from the request alone is judged before any claim, row
   * or reservation exists. */
  eph_request_t rq;
  const char *field = NULL;
  eph_error_t err = {0};
  if (eph_request_parse(req->body ? req->body : "", req->body_len, &srv->limits, &rq, &field,
                        &err) < 0)
    return eph_srv_error(c, srv, MHD_HTTP_BAD_REQUEST, "invalid_request", field, "%s", err.message);
  /* "replay:PATH" makes the daemon (root) open PATH: a file-existence oracle, any JSONL
   * on the host replayed as answers, free model calls. Only an offline daemon serves it. */
  if (!srv->replay_models && strncmp(rq.model, "replay:", 7) == 0) {
    eph_request_free(&rq);
    return eph_srv_error(c, srv, MHD_HTTP_BAD_REQUEST, "invalid_request", "model",
                         "field 'model': replay transcripts are not served by this daemon "
                         "(model_plugin is not \"model-replay\")");
  }
  if (rq.webhook_url && eph_webhooks_check_url(srv->webhooks, rq.webhook_url, &err) < 0) {
    eph_request_free(&rq);
    return eph_srv_error(c, srv, MHD_HTTP_BAD_REQUEST, "invalid_request", "webhook_url",
                         "field 'webhook_url': %s", err.message);
  }
  char sha[65];
  if (idem && eph_sha256_hex(req->body ? req->body : "", req->body_len, sha, &err) < 0) {
    eph_request_free(&rq);
    return eph_srv_store_failure(srv, c, &err);
  }
  char run_id[40] = "run_";
  eph_random_hex(run_id + 4, 16);

  pthread_mutex_lock(&srv->admit);
  unsigned status = 0;
  const char *type = NULL, *efield = NULL;
  char msg[1100] = "";
  bool claimed = false;
  int mark = -1;
  if (srv->draining) {
    status = MHD_HTTP_SERVICE_UNAVAILABLE;
    type = "unavailable";
    snprintf(msg, sizeof msg, "the daemon is shutting down; retry on another instance");
    goto refused;
  }
  /* While the store or the ledger cannot commit, a run could be neither recorded nor
   * billed: refused before anything is claimed or reserved, with a time to come back. */
  char why[600];
  if (!eph_srv_storage_ok(srv, why, sizeof why)) {
    status = MHD_HTTP_SERVICE_UNAVAILABLE;
    type = "storage_unavailable";
    snprintf(msg, sizeof msg, "storage is failing, no run can be recorded: %s", why);
    goto refused;
  }
  /* The claim, then the reservation and the run row, under `admit`: a second request with
   * the same key waits here and then finds the run in the table or the store. */
  if (idem && (mark = claim_mark(srv, run_id, &err)) < 0) {
    eph_error("%s", err.message);
    status = MHD_HTTP_SERVICE_UNAVAILABLE;
    type = "storage_unavailable";
    snprintf(msg, sizeof msg, "the state directory cannot be written; see the daemon's log");
    goto refused;
  }
  for (int attempt = 0; idem && attempt < 2 && !claimed; attempt++) {
    char *existing = NULL;
    int r = eph_store_idem_claim(srv->store, req->org, idem, sha, run_id, &existing, &err);
    if (r == -EBUSY) {
      status = HTTP_UNPROCESSABLE;
      type = "idempotency_error";
      efield = "Idempotency-Key";
      snprintf(msg, sizeof msg, "%s", err.message);
      goto refused;
    }
    if (r < 0) {
      eph_error("%s", err.message);
      status = MHD_HTTP_INTERNAL_SERVER_ERROR;
      type = "internal_error";
      snprintf(msg, sizeof msg, "the store failed; see the daemon's log");
      goto refused;
    }
    if (r == 0) {
      claimed = true;
      break;
    }
    /* Same key, same body: the first run is the answer. */
    json_object *o = eph_srv_run_object(srv, existing, req->org, false, &err);
    bool busy = false;
    if (!o && err.code == ENOENT && eph_store_kind(srv->store) == EPH_STORE_POSTGRES) {
      /* A cluster: the claim may be another node's admission in progress, whose mark is in
       * that node's state directory. Its row normally follows within milliseconds: wait
       * for it (bounded); a claim still without a row is never released from here (that
       * would make a second run), the client is told to retry. */
      for (int i = 0; i < CLUSTER_CLAIM_WAIT_MS / 20 && !o && err.code == ENOENT; i++) {
        nanosleep(&(struct timespec){0, 20 * 1000000}, NULL);
        err = (eph_error_t){0};
        o = eph_srv_run_object(srv, existing, req->org, false, &err);
      }
      busy = !o && err.code == ENOENT;
    } else if (!o && err.code == ENOENT && (busy = claim_in_progress(srv, existing)) == false) {
      /* Its admitter is gone: it may have stored the row and removed its mark just now. */
      err = (eph_error_t){0};
      o = eph_srv_run_object(srv, existing, req->org, false, &err);
    }
    if (!o && (busy || err.code != ENOENT)) {
      /* Being admitted by another process on this state directory, or the store failed
       * to say: claiming the key again would make a second run. */
      if (!busy)
        eph_error("reading run %s of an idempotency key: %s", existing, err.message);
      free(existing);
      status = MHD_HTTP_SERVICE_UNAVAILABLE;
      type = "unavailable";
      snprintf(msg, sizeof msg, "%s",
               busy ? "a request with this Idempotency-Key is being admitted; retry with the "
                      "same key"
                    : "the store failed; see the daemon's log");
      goto refused;
    }
    if (o) {
      json_object_put(o);
      claim_unmark(srv, run_id, &mark);
      pthread_mutex_unlock(&srv->admit);
      eph_request_free(&rq);
      pthread_mutex_lock(&srv->lock);
      srv->idempotent_replays++;
      pthread_mutex_unlock(&srv->lock);
      snprintf(req->run_id, sizeof req->run_id, "%s", existing);
      free(existing);
      req->admitted = true;
      req->status = MHD_HTTP_OK;
      return eph_srv_runs_continue(srv, c, req);
    }
    /* A claim whose run never got its row: its process died in between. Judge afresh. */
    eph_warn("idempotency key of %s names run %s which does not exist; claiming it again", req->org,
             existing);
    eph_store_idem_release(srv->store, req->org, idem, existing, &err);
    free(existing);
  }

  /* On a cluster the bound is the shared queue's length (server.max_queued_runs runs
   * waiting for any node); checked here before anything is reserved, and again, atomically
   * across nodes, when the run is pushed. */
  int64_t shared_len = 0;
  if (srv->shared_queue && eph_store_queue_length(srv->store, &shared_len, &err) < 0) {
    eph_error("%s", err.message);
    status = MHD_HTTP_SERVICE_UNAVAILABLE;
    type = "storage_unavailable";
    snprintf(msg, sizeof msg, "the store failed; see the daemon's log");
    goto refused;
  }
  pthread_mutex_lock(&srv->lock);
  bool full = srv->shared_queue ? shared_len >= srv->opt.max_queued_runs
                                : srv->queued + srv->running >=
                                      srv->opt.max_concurrent_runs + srv->opt.max_queued_runs;
  if (full)
    srv->queue_full_refusals++;
  pthread_mutex_unlock(&srv->lock);
  if (full) {
  queue_full:
    status = MHD_HTTP_TOO_MANY_REQUESTS;
    type = "rate_limited";
    if (srv->shared_queue)
      snprintf(msg, sizeof msg, "the cluster's run queue is full (%d queued); retry later",
               srv->opt.max_queued_runs);
    else
      snprintf(msg, sizeof msg, "the run queue is full (%d running, %d queued); retry later",
               srv->opt.max_concurrent_runs, srv->opt.max_queued_runs);
    goto refused;
  }

  const int64_t budget = rq.max_cost_micros; /* rq is the run's once eph_run_new took it */
  eph_run_options_t ro = {.org = req->org, .run_id = run_id};
  eph_run_t *run = NULL;
  if (eph_run_new(srv->ctx, &rq, &ro, &run, &err) < 0) {
    if (err.code == EPH_E_INSUFFICIENT) {
      status = MHD_HTTP_PAYMENT_REQUIRED;
      type = "insufficient_balance";
      efield = "max_cost_micros";
    } else if (err.code == EINVAL) {
      status = MHD_HTTP_BAD_REQUEST;
      type = "invalid_request";
      efield = strncmp(err.message, "field 'model'", 13) == 0 ? "model" : NULL;
    } else if (err.code == ENOSPC || err.code == EIO || err.code == EBUSY || err.code == EROFS ||
               err.code == EDQUOT) {
      eph_error("creating a run for %s: %s", req->org, err.message);
      status = MHD_HTTP_SERVICE_UNAVAILABLE;
      type = "storage_unavailable";
    } else {
      eph_error("creating a run for %s: %s", req->org, err.message);
      status = MHD_HTTP_SERVICE_UNAVAILABLE;
      type = "unavailable";
    }
    snprintf(msg, sizeof msg, "%s", err.message);
    goto refused;
  }
  if (srv->shared_queue && !eph_run_zdr(run)) {
    /* Recorded (row, `reserved` event) and pushed into the shared queue; whichever node
     * claims it executes it with this reservation. This node forgets it. */
    int r = eph_runstore_attach(srv->store, run, NULL, &err);
    if (r == 0) {
      req->created = eph_run_to_json(run, true);
      r = eph_store_queue_push(srv->store, run_id, budget, false, srv->opt.max_queued_runs, &err);
    }
    if (r < 0) {
      /* Refused after the reservation (another node filled the queue in between, or the
       * store failed): the reservation is released and the record says so. */
      eph_run_abandon(run, r == -EAGAIN ? "queue_full" : "storage_error");
      eph_run_free(run);
      eph_runstore_detach(run);
      json_object_put(req->created);
      req->created = NULL;
      if (r == -EAGAIN)
        goto queue_full;
      eph_error("run %s: %s", run_id, err.message);
      status = MHD_HTTP_SERVICE_UNAVAILABLE;
      type = "storage_unavailable";
      snprintf(msg, sizeof msg, "the store cannot record the run: %s", err.message);
      goto refused;
    }
    eph_run_disown(run);
    eph_run_free(run);
    eph_runstore_detach(run);
    pthread_mutex_lock(&srv->lock);
    srv->runs_created++;
    pthread_cond_broadcast(&srv->cond); /* an idle worker here claims it at once */
    pthread_mutex_unlock(&srv->lock);
  } else {
    bool zdr = srv->shared_queue;
    if (eph_srv_live_enqueue(srv, run, req->org, &req->created, &err) < 0) {
      status = MHD_HTTP_SERVICE_UNAVAILABLE;
      type = "storage_unavailable";
      snprintf(msg, sizeof msg, "the store cannot record the run: %s", err.message);
      goto refused;
    }
    /* Zero data retention on a cluster: the request's content exists only in this node's
     * memory, so the run waits in its memory queue and only it executes it; it is counted
     * in the shared queue (local_only) so the cluster's bound includes it. The push checks
     * the bound again, atomically across nodes: another node may have filled the queue
     * since the check above. Then the run is refused as a non-ZDR one is (ended
     * queue_full, reservation released), unless a worker here already took it. */
    int pr =
        zdr ? eph_store_queue_push(srv->store, run_id, 0, true, srv->opt.max_queued_runs, &err) : 0;
    if (pr == -EAGAIN) {
      live_t *l = eph_srv_live_get(srv, run_id);
      bool refused = l && eph_srv_unqueue_live(srv, l, "queue_full");
      eph_srv_live_put(l);
      if (refused) {
        json_object_put(req->created);
        req->created = NULL;
        goto queue_full;
      }
    } else if (pr < 0) {
      eph_warn("run %s: counting it in the shared queue: %s", run_id, err.message);
    }
  }
  claim_unmark(srv, run_id, &mark); /* the row is stored */
  pthread_mutex_unlock(&srv->admit);

  snprintf(req->run_id, sizeof req->run_id, "%s", run_id);
  req->admitted = true;
  req->status = MHD_HTTP_CREATED;
  return eph_srv_runs_continue(srv, c, req);

refused:
  /* A refused request leaves nothing behind: no claim, no row, no reservation. */
  if (claimed && eph_store_idem_release(srv->store, req->org, idem, run_id, &err) < 0)
    eph_error("releasing an idempotency key: %s", err.message);
  claim_unmark(srv, run_id, &mark);
  pthread_mutex_unlock(&srv->admit);
  eph_request_free(&rq);
  if (status == MHD_HTTP_TOO_MANY_REQUESTS || status == MHD_HTTP_SERVICE_UNAVAILABLE)
    return eph_srv_error_h(c, srv, status, MHD_HTTP_HEADER_RETRY_AFTER,
                           status == MHD_HTTP_TOO_MANY_REQUESTS ? "2" : "5", type, efield, "%s",
                           msg);
  return eph_srv_error(c, srv, status, type, efield, "%s", msg);
}
