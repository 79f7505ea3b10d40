/* The run's state machine (see run.h): create and reserve, execute (sandbox, agent loop,
 * destroy), end exactly once, settle; its events, owner lock and accessors. The agent loop,
 * money, tools, egress, JSON and plugin-facing services live in the units named in
 * run_int.h. */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include "log.h"
#include "run_int.h"
#include "runstore.h"
#include "util.h"

static const char *
status_source(eph_run_status_t s)
{
  switch (s) {
  case EPH_RUN_SUCCEEDED:
    return "Succeeded";
  case EPH_RUN_TIMED_OUT:
    return "Timed out";
  case EPH_RUN_BUDGET_EXHAUSTED:
    return "Budget exhausted";
  case EPH_RUN_CANCELLED:
    return "Cancelled";
  default:
    return "Failed";
  }
}

/* Marks this run as owned by a live process: an exclusive flock on <state_dir>/runs/<id>.lock,
 * taken before the reservation and dropped after settle, so a process that finds the file
 * lockable knows the owner died and settles the reservation (context.c). The lock is taken on
 * a private name first and renamed into place, so the file is never seen unlocked. */
/* The owner lock file's note (eph_runstore_recover reads it): the run's org and creation
 * time, which its record needs if the process dies before storing it. */
static void
owner_note(const eph_run_t *run, json_object *note)
{
  json_object_object_add(note, "org", json_object_new_string(run->org));
  json_object_object_add(note, "created_at_us", json_object_new_int64(run->created_us));
}

/* note as OWNER_NOTE_BYTES bytes: its JSON, space-padded, newline-ended (without its
 * "error" member when the whole does not fit). */
static void
note_bytes(json_object *note, char buf[OWNER_NOTE_BYTES])
{
  memset(buf, ' ', OWNER_NOTE_BYTES);
  buf[OWNER_NOTE_BYTES - 1] = '\n';
  const char *text = json_object_to_json_string_ext(note, JSON_C_TO_STRING_PLAIN);
  size_t n = strlen(text);
  if (n >= OWNER_NOTE_BYTES - 1) {
    json_object_object_del(note, "error");
    text = json_object_to_json_string_ext(note, JSON_C_TO_STRING_PLAIN);
    n = strlen(text);
  }
  memcpy(buf, text, n < OWNER_NOTE_BYTES - 1 ? n : OWNER_NOTE_BYTES - 1);
}

/* A reserve that failed for one of these reserved nothing: the ledger refused it before
 * writing (balance, a bad name or amount, a duplicate run id). Any other error (EIO,
 * ENOSPC, EBUSY) may come after the write: nobody can tell from here. */
static bool
reserve_refused(int code)
{
  return code == EPH_E_INSUFFICIENT || code == EPH_E_BUDGET || code == EINVAL || code == EEXIST ||
         code == EOVERFLOW;
}

static int
take_owner_lock(eph_run_t *run, eph_error_t *err)
{
  cleanup_free char *dir = eph_xasprintf("%s/runs", run->ctx->state_dir);
  int r = eph_mkdir_p(dir, 0700, err);
  if (r < 0)
    return r;
  cleanup_free char *tmp = eph_xasprintf("%s/.%s.%d", dir, run->id, (int)getpid());
  int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return eph_error_set(err, errno, "%s: %s", tmp, strerror(errno));
  /* The note starts as who the run is for and when it was queued (owner_note): a process
   * killed between the reservation and the record's insert leaves the reconciler enough to
   * record the run it settles (eph_runstore_recover). Its bytes are also the room for the
   * note abandon_owner_lock() may have to write on a full disk; a disk that cannot hold
   * them refuses the run before anything is reserved. */
  char blank[OWNER_NOTE_BYTES];
  json_object *note = json_object_new_object();
  owner_note(run, note);
  note_bytes(note, blank);
  json_object_put(note);
  if (pwrite(fd, blank, sizeof blank, 0) != (ssize_t)sizeof blank) {
    int e = errno ? errno : ENOSPC;
    r = eph_error_set(err, e, "%s: %s", tmp, strerror(e));
    unlink(tmp);
    close(fd);
    return r;
  }
  run->lock_path = eph_xasprintf("%s/%s.lock", dir, run->id);
  if (flock(fd, LOCK_EX) < 0 || rename(tmp, run->lock_path) < 0) {
    r = eph_error_set(err, errno, "%s: %s", run->lock_path, strerror(errno));
    unlink(tmp);
    close(fd);
    free(run->lock_path);
    run->lock_path = NULL;
    return r;
  }
  run->owner_fd = fd;
  return 0;
}

/* Leaves the lock file for the reconciler (eph_runstore_recover) when the run's end could
 * not be recorded (ledger or store failing): the note says how the run ended, written in
 * place into the space reserved at creation, and closing the descriptor releases the
 * flock so the file reads as "owner gone". */
static void
abandon_owner_lock(eph_run_t *run)
{
  if (run->owner_fd < 0)
    return;
  json_object *note = json_object_new_object();
  owner_note(run, note);
  pthread_mutex_lock(&run->lock);
  json_object_object_add(note, "status", json_object_new_string(eph_run_status_name(run->status)));
  json_object_object_add(note, "reason", json_object_new_string(run->reason));
  if (run->error && !run->req.zero_data_retention)
    json_object_object_add(note, "error", json_object_new_string(run->error));
  pthread_mutex_unlock(&run->lock);
  char buf[OWNER_NOTE_BYTES];
  note_bytes(note, buf); /* too long with the error: the rest fits */
  if (pwrite(run->owner_fd, buf, sizeof buf, 0) != (ssize_t)sizeof buf)
    eph_warn("run %s: %s: writing its end: %s (it will be recovered as host_lost)", run->id,
             run->lock_path, strerror(errno));
  json_object_put(note);
  close(run->owner_fd);
  run->owner_fd = -1;
  free(run->lock_path);
  run->lock_path = NULL;
}

static void
drop_owner_lock(eph_run_t *run)
{
  if (run->lock_path)
    unlink(run->lock_path);
  if (run->owner_fd >= 0)
    close(run->owner_fd);
  run->owner_fd = -1;
  free(run->lock_path);
  run->lock_path = NULL;
}

int
eph_run_load_plugins(eph_ctx_t *ctx, const eph_request_t *req, const char *model)
{
  if (!ctx->lazy_plugins)
    return 0;
  int loaded = eph_tools_load_blocks(ctx, req);
  for (size_t i = 0; req && i < ctx->config.n_blocks; i++) {
    const eph_config_block_t *b = &ctx->config.blocks[i];
    bool want;
    if (!b->enabled || strncmp(b->name, "backend-", 8) == 0 || strncmp(b->name, "tool-", 5) == 0 ||
        eph_plugins_find(&ctx->plugins, b->name))
      continue;
    if (strncmp(b->name, "model-", 6) == 0)
      want = strncmp(model, "replay:", 7) != 0 || strcmp(b->name, "model-replay") == 0;
    else
      want = true;
    if (!want)
      continue;
    loaded +=
        eph_plugins_load_logged(&ctx->plugins, &ctx->config, ctx->plugin_dir, &ctx->host, b->name);
  }
  if (req)
    eph_runstore_recover(ctx, NULL, false, NULL);
  return loaded;
}

int
eph_run_new(eph_ctx_t *ctx, eph_request_t *req, const eph_run_options_t *opt, eph_run_t **out,
            eph_error_t *err)
{
  *out = NULL;
  eph_run_t *run = eph_xcalloc(1, sizeof *run);
  pthread_mutex_init(&run->lock, NULL);
  pthread_mutex_init(&run->emit_lock, NULL);
  pthread_mutex_init(&run->money_lock, NULL);
  eph_cond_init_monotonic(&run->cond);
  eph_cond_init_monotonic(&run->meter_cond);
  run->ctx = ctx;
  run->owner_fd = -1;
  run->req = *req;
  memset(req, 0, sizeof *req);
  run->org = eph_xstrdup(opt->org ? opt->org : "local");
  run->obs = opt->observer;
  run->status = EPH_RUN_QUEUED;
  run->created_us = eph_wall_us();
  run->start_ms = eph_now_ms();
  run->grants = eph_request_grants(&run->req);
  if (opt->run_id) {
    snprintf(run->id, sizeof run->id, "%s", opt->run_id);
  } else {
    memcpy(run->id, "run_", 4);
    eph_random_hex(run->id + 4, 16);
  }
  int r;
  const eph_core_conf_t *conf = eph_config_values(&ctx->config);
  run->max_steps = conf->max_steps;
  run->max_output_files_bytes = conf->max_output_files_bytes;
  run->max_stored_results_bytes = conf->max_stored_results_bytes;
  run->max_output_tokens = conf->max_output_tokens;
  run->meter_ms = conf->compute_meter_ms; /* at least 10: its row's range */
  run->event_flush_ms = conf->event_flush_ms;

  run->ledger = eph_plugins_first(&ctx->plugins, EPH_KIND_LEDGER);
  if (!run->ledger) {
    r = eph_error_set(err, ENOENT, "no ledger plugin is loaded (enable ledger-sqlite in conf.d)");
    goto fail;
  }
  eph_error_t berr = {0};
  run->backend = eph_ctx_backend(ctx, opt->backend, &berr);
  if (!run->backend) {
    r = eph_error_set(err, berr.code, "%s", berr.message);
    goto fail;
  }
  run->backend_name = eph_xstrdup(run->backend->desc->name);
  run->model_call_name = eph_xstrdup(opt->model_override ? opt->model_override : run->req.model);
  if (!(run->model = eph_ctx_model(ctx, run->model_call_name, err))) {
    r = -err->code;
    goto fail;
  }
  /* A call that cannot be made now (a hosted provider without its key, a transcript that
   * does not open) is said before anything is reserved or booted: the run used to reserve,
   * boot a sandbox and fail at its first model call (new-user finding). The plugin's
   * `ready` is the health check's: cheap, no network. */
  const eph_model_ops_t *mo = run->model->desc->ops;
  if (EPH_OPS_HAS(mo, eph_model_ops_t, ready) &&
      (r = EPH_WITH_PLUGIN(run->model, mo->ready(run->model->state, run->model_call_name, err))) <
          0) {
    if (!*err->message)
      eph_error_set(err, EIO, "%s: not ready (no reason given)", run->model->desc->name);
    /* A transcript the request names (replay:PATH) is the request's mistake: 400 naming
     * `model` (exit 2); a provider without its key is the operator's: 503 (exit 1). */
    bool replay = strncmp(run->model_call_name, "replay:", 7) == 0;
    err->code = replay ? EINVAL : EPH_E_CONFIG;
    r = replay ? eph_error_wrap(err, "field 'model'") : -err->code;
    goto fail;
  }
  if ((r = eph_meter_prices(run, err)) < 0)
    goto fail;
  eph_gate_init(&run->gate, &run->req, ctx);
  if ((r = eph_tools_check_grants(ctx, &run->gate, err)) < 0)
    goto fail;
  if (opt->record_path) {
    run->record = fopen(opt->record_path, "a");
    if (!run->record) {
      r = eph_error_set(err, errno, "--record %s: %s", opt->record_path, strerror(errno));
      goto fail;
    }
  }

  if (opt->adopt_reserved_micros > 0 && opt->created_us > 0)
    run->created_us = opt->created_us; /* queued when the admitting node reserved */
  /* The reservation is the last step: any failure above reserved nothing. */
  if ((r = take_owner_lock(run, err)) < 0)
    goto fail;
  if (opt->adopt_reserved_micros > 0) {
    /* Reserved by the admitting node (shared queue): reserving again would hold the
     * budget twice; the record and the ledger agree on the one reservation. */
    if (opt->adopt_reserved_micros != run->req.max_cost_micros) {
      r = eph_error_set(err, EINVAL, "run %s: adopted reservation %lld != max_cost_micros %lld",
                        run->id, (long long)opt->adopt_reserved_micros,
                        (long long)run->req.max_cost_micros);
      goto fail;
    }
  } else {
    r = EPH_WITH_PLUGIN(run->ledger,
                        eph_run_ledger_ops(run)->reserve(run->ledger->state, run->org, run->id,
                                                         run->req.max_cost_micros, err));
    if (r < 0 && !reserve_refused(err->code)) {
      /* Not a refusal: the ledger failed (an I/O error on its commit's sync), and what it
       * wrote may hold (SQLite's frames reached the WAL before the fsync failed). The lock
       * file stays, released, with the run's org in its note: the reconciler settles what
       * was reserved and records the run, or finds nothing and removes the file. */
      close(run->owner_fd);
      run->owner_fd = -1;
      free(run->lock_path);
      run->lock_path = NULL;
    }
    if (r < 0)
      goto fail;
  }
  run->reserved = run->req.max_cost_micros;
  /* t = 0 is the moment the run is queued with its reservation, as on the product page:
   * its `reserved` event, the first, sets start_ms (eph_run_emit_full). */
  char budget[32];
  eph_run_emit(run, "Queued", "reserved", false, ({
                 json_object *d = json_object_new_object();
                 json_object_object_add(d, "reserved_micros", json_object_new_int64(run->reserved));
                 d;
               }),
               "budget of %s reserved", eph_format_dollars(run->reserved, budget, sizeof budget));
  *out = run;
  return 0;

fail:
  /* Nothing was reserved: only memory to release. */
  run->settled = true;
  eph_run_free(run);
  return r;
}

static void
collect_outputs(eph_run_t *run)
{
  if (!run->req.n_outputs || !run->sbx)
    return;
  run->output_files = json_object_new_array();
  /* The record keeps what is saved (base64) for the retention period: a run's files are
   * bounded together, not only each (32 files of 1 MiB stored 44.5 MB for $0.0002). */
  uint64_t left = (uint64_t)run->max_output_files_bytes;
  for (size_t i = 0; i < run->req.n_outputs; i++) {
    json_object *f = json_object_new_object();
    json_object_object_add(f, "path", json_object_new_string(run->req.outputs[i]));
    if (left == 0) {
      char why[160];
      snprintf(why, sizeof why,
               "not read: the run's saved files reached max_output_files_bytes (%" PRId64 " bytes)",
               run->max_output_files_bytes);
      json_object_object_add(f, "error", json_object_new_string(why));
      json_object_array_add(run->output_files, f);
      continue;
    }
    void *data = NULL;
    size_t bytes = 0;
    int truncated = 0;
    eph_error_t err = {0};
    size_t max = left < 1024 * 1024 ? (size_t)left : 1024 * 1024;
    if (eph_sbx_read(run->sbx, run->req.outputs[i], max, &data, &bytes, &truncated, &err) < 0) {
      json_object_object_add(f, "error", json_object_new_string(err.message));
    } else {
      cleanup_free char *b64 = eph_base64_encode(data, bytes);
      if (!b64) /* out of memory (data is at most 1 MiB): the core does not limp on */
        abort();
      json_object_object_add(f, "encoding", json_object_new_string("base64"));
      json_object_object_add(f, "content", json_object_new_string(b64));
      json_object_object_add(f, "bytes", json_object_new_int64((int64_t)bytes));
      json_object_object_add(f, "truncated", json_object_new_boolean(truncated));
      left -= bytes < left ? bytes : left;
    }
    free(data);
    json_object_array_add(run->output_files, f);
  }
  eph_json_utf8_repair(run->output_files); /* a guest's error text: kept as valid UTF-8 */
}

static void
end_and_settle(eph_run_t *run)
{
  pthread_mutex_lock(&run->lock);
  /* A write that failed during the run decides the end whatever the agent achieved: the
   * record of that work is incomplete, so it is not reported as a success. */
  bool failed_before = atomic_load(&run->storage_failed);
  if (failed_before) {
    run->status = EPH_RUN_FAILED;
    snprintf(run->reason, sizeof run->reason, "storage_error");
    free(run->error);
    run->error = eph_xstrdup(run->storage_error);
  }
  eph_run_status_t s = run->status;
  if (s == EPH_RUN_QUEUED || s == EPH_RUN_RUNNING) {
    s = run->status = EPH_RUN_FAILED;
    snprintf(run->reason, sizeof run->reason, "host_error");
  }
  run->ended = true;
  int64_t calls = run->model_calls, tokens = run->input_tokens + run->output_tokens;
  pthread_mutex_unlock(&run->lock);

  json_object *d = json_object_new_object();
  json_object_object_add(d, "status", json_object_new_string(eph_run_status_name(s)));
  json_object_object_add(d, "reason", json_object_new_string(run->reason));
  json_object_object_add(d, "model_calls", json_object_new_int64(calls));
  json_object_object_add(d, "input_tokens", json_object_new_int64(run->input_tokens));
  json_object_object_add(d, "output_tokens", json_object_new_int64(run->output_tokens));
  if (run->error)
    json_object_object_add(d, "error", json_object_new_string(run->error));
  char tok[32];
  /* "5,214": thousands separators as the product page prints them. */
  char raw[32];
  snprintf(raw, sizeof raw, "%" PRId64, tokens);
  size_t n = strlen(raw), j = 0;
  for (size_t i = 0; i < n; i++) {
    tok[j++] = raw[i];
    if ((n - i - 1) % 3 == 0 && i + 1 < n)
      tok[j++] = ',';
  }
  tok[j] = '\0';
  if (s == EPH_RUN_SUCCEEDED)
    eph_run_emit(run, status_source(s), "ended", false, d, "%" PRId64 " model call%s, %s tokens",
                 calls, calls == 1 ? "" : "s", tok);
  else
    eph_run_emit(run, status_source(s), "ended", false, d,
                 "%s · %" PRId64 " model call%s, %s tokens%s%s", run->reason, calls,
                 calls == 1 ? "" : "s", tok, run->error ? " · " : "", run->error ? run->error : "");

  if (!failed_before && atomic_load(&run->storage_failed)) {
    /* The ended event itself could not be stored: the record will say failed
     * (storage_error) once the reconciler writes it, so the answers from memory say so too. */
    pthread_mutex_lock(&run->lock);
    run->status = EPH_RUN_FAILED;
    snprintf(run->reason, sizeof run->reason, "storage_error");
    free(run->error);
    run->error = eph_xstrdup(run->storage_error);
    pthread_mutex_unlock(&run->lock);
  }

  eph_ledger_totals_t totals = {0};
  eph_error_t err = {0};
  int r = EPH_WITH_PLUGIN(
      run->ledger, eph_run_ledger_ops(run)->settle(run->ledger->state, run->id, &totals, &err));
  if (r < 0) {
    /* The reservation stays open: no settled event claims what the ledger did not record.
     * The lock file is left with the run's end in it; the reconciler (daemon) or the next
     * start of any process settles it and completes the record. */
    eph_error("run %s: settle failed: %s (left to the reconciler)", run->id, err.message);
    eph_run_storage_failed(run, err.message);
    /* The last write of the run's own before the lock goes: once released, the reconciler
     * may complete the record at any moment and nothing here may overwrite it. */
    eph_run_notify_update(run);
    abandon_owner_lock(run);
    pthread_mutex_lock(&run->lock);
    run->settled = true;
    pthread_cond_broadcast(&run->cond);
    pthread_mutex_unlock(&run->lock);
    return;
  }
  pthread_mutex_lock(&run->lock);
  run->billed = totals.billed_micros;
  run->released = totals.released_micros;
  run->model_micros = totals.model_micros;
  run->web_micros = totals.web_micros;
  run->compute_micros = totals.compute_micros;
  pthread_mutex_unlock(&run->lock);
  char settled[64];
  json_object *sd = json_object_new_object();
  eph_run_json_money(sd, &totals);
  /* The product page's words for the last line of the timeline. */
  eph_run_emit(
      run, "Worker destroyed", "settled", false, sd, "%s",
      eph_format_settled(totals.billed_micros, totals.released_micros, settled, sizeof settled));
  eph_run_notify_update(run);
  /* Money settled; if any write of the record failed on the way, the lock file stays so
   * the reconciler completes the record (ended, settled, the ledger's totals). */
  if (atomic_load(&run->storage_failed))
    abandon_owner_lock(run);
  else
    drop_owner_lock(run);
  pthread_mutex_lock(&run->lock);
  run->settled = true;
  pthread_cond_broadcast(&run->cond);
  pthread_mutex_unlock(&run->lock);
}

eph_run_status_t
eph_run_execute(eph_run_t *run)
{
  pthread_mutex_lock(&run->lock);
  bool cancelled = atomic_load(&run->cancel);
  if (!cancelled)
    run->status = EPH_RUN_RUNNING;
  /* The deadline counts from the start of execution: queueing time is not the run's. */
  run->deadline_ms = eph_now_ms() + run->req.timeout_seconds * 1000;
  pthread_mutex_unlock(&run->lock);
  if (cancelled) {
    eph_run_set_end(run, EPH_RUN_CANCELLED, "cancelled", NULL);
    end_and_settle(run);
    return eph_run_status(run);
  }
  eph_run_notify_update(run);

  const eph_backend_ops_t *bops = run->backend->desc->ops;
  const char *source = bops->source ? bops->source : "Sandbox";
  const char *noun = bops->noun ? bops->noun : "sandbox";
  eph_sandbox_spec_t spec = {
      .struct_size = sizeof spec,
      .run_id = run->id,
      .deadline_ms = run->deadline_ms,
      .network = 0,
  };
  eph_error_t err = {0};
  eph_sbx_t *sbx = NULL;
  eph_run_egress_t egress = {.run = run};
  if (run->req.web)
    eph_run_egress_start(&egress, &spec, source);
  int cr = eph_sbx_create(run->backend, &spec, &sbx, &err);
  if (cr < 0 && spec.network) {
    /* Fail closed: a sandbox whose egress rules could not all be applied gets none. The
     * timeline blames the egress only when a sandbox without it starts, or fails otherwise:
     * a failure of the sandbox itself (a missing guest image) is told once, as that. */
    eph_error_t first = err;
    eph_run_egress_stop(&egress);
    spec.network = 0;
    spec.proxy_url = NULL;
    spec.proxy_netns_fd = -1;
    spec.proxy_attach = NULL;
    spec.proxy_ctx = NULL;
    err = (eph_error_t){0};
    cr = eph_sbx_create(run->backend, &spec, &sbx, &err);
    if (cr == 0 || strcmp(first.message, err.message) != 0)
      eph_run_emit(run, source, "egress_error", false, NULL,
                   "web egress could not be set up: %s · the sandbox has no network",
                   first.message);
  }
  if (cr < 0) {
    eph_run_egress_stop(&egress);
    if (eph_now_ms() >= run->deadline_ms)
      eph_run_set_end(run, EPH_RUN_TIMED_OUT, "timeout", err.message);
    else
      eph_run_set_end(run, EPH_RUN_FAILED, "host_error", err.message);
    eph_run_emit(run, source, "sandbox_error", false, NULL, "%s failed to start: %s", noun,
                 err.message);
    end_and_settle(run);
    return eph_run_status(run);
  }
  pthread_mutex_lock(&run->lock);
  run->sbx = sbx;
  pthread_mutex_unlock(&run->lock);
  eph_meter_start(run);
  json_object *rd = json_object_new_object();
  json_object_object_add(rd, "backend", json_object_new_string(run->backend_name));
  json_object_object_add(rd, "scratch", json_object_new_string(eph_sbx_scratch(sbx)));
  if (spec.network)
    json_object_object_add(rd, "proxy_url", json_object_new_string(spec.proxy_url));
  eph_run_emit(run, source, "sandbox_ready", false, rd, "%s ready", noun);

  bool ok = true;
  for (size_t i = 0; i < run->req.n_files && ok; i++) {
    if (eph_sbx_write(sbx, run->req.files[i].path, run->req.files[i].data, run->req.files[i].bytes,
                      &err) < 0) {
      char msg[1200];
      snprintf(msg, sizeof msg, "placing files[%zu]: %s", i, err.message);
      eph_run_set_end(run, EPH_RUN_FAILED, "host_error", msg);
      ok = false;
    }
  }
  if (ok) {
    eph_run_emit(run, source, "worker_started", false, NULL, "worker started · shell %s · web %s",
                 run->req.shell ? "on" : "off", run->req.web ? "on" : "off");
    eph_agent_loop(run);
    collect_outputs(run);
  }
  eph_meter_stop(run);

  pthread_mutex_lock(&run->lock);
  run->sbx = NULL;
  pthread_mutex_unlock(&run->lock);
  eph_sandbox_report_t report = {.struct_size = sizeof report};
  err = (eph_error_t){0};
  int r = eph_sbx_destroy(sbx, &report, &err);
  json_object *dd = json_object_new_object();
  json_object_object_add(dd, "processes_left", json_object_new_int(report.processes_left));
  json_object_object_add(dd, "files_left", json_object_new_int(report.files_left));
  json_object_object_add(dd, "lifetime_ms", json_object_new_int64(report.lifetime_ms));
  if (r < 0) {
    eph_run_emit(run, source, "sandbox_error", false, dd, "%s destroy incomplete: %s", noun,
                 err.message);
    eph_run_set_end(run, EPH_RUN_FAILED, "host_error", err.message);
  } else {
    eph_run_emit(run, source, "sandbox_destroyed", false, dd, "%s destroyed", noun);
  }
  eph_run_egress_stop(&egress);
  end_and_settle(run);
  return eph_run_status(run);
}

void
eph_run_abandon(eph_run_t *run, const char *reason)
{
  eph_run_set_end(run, EPH_RUN_CANCELLED, reason ? reason : "cancelled", NULL);
  end_and_settle(run);
}

void
eph_run_disown(eph_run_t *run)
{
  drop_owner_lock(run);
}

void
eph_run_free(eph_run_t *run)
{
  if (!run)
    return;
  if (run->owner_fd >= 0) {
    /* Never reserved (eph_run_new failed): nothing to settle, the file goes. Reserved but
     * not settled: the file stays for the next start to settle. */
    if (run->reserved == 0)
      drop_owner_lock(run);
    else {
      close(run->owner_fd);
      free(run->lock_path);
    }
  }
  for (size_t i = 0; i < run->n_events; i++) {
    free(run->events[i].source);
    free(run->events[i].kind);
    free(run->events[i].text);
    if (run->events[i].data)
      json_object_put(run->events[i].data);
  }
  free(run->events);
  eph_request_free(&run->req);
  eph_gate_free(&run->gate);
  if (run->grants)
    json_object_put(run->grants);
  if (run->output_files)
    json_object_put(run->output_files);
  if (run->record)
    fclose(run->record);
  free(run->answer);
  free(run->error);
  free(run->org);
  free(run->model_call_name);
  free(run->replayed_from);
  free(run->recorded_model);
  free(run->backend_name);
  pthread_mutex_destroy(&run->lock);
  pthread_mutex_destroy(&run->emit_lock);
  pthread_mutex_destroy(&run->money_lock);
  pthread_cond_destroy(&run->cond);
  pthread_cond_destroy(&run->meter_cond);
  free(run);
}
