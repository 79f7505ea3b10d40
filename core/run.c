#include <config.h>

#include "run.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include "egress.h"
#include "gate.h"
#include "live.h"
#include "log.h"
#include "sandbox.h"
#include "util.h"

/* Smallest useful answer: below this many affordable output tokens a model call is not
 * worth making and the run ends budget_exhausted instead. */
#define MIN_OUTPUT_TOKENS 64

/* The owner lock file is created this long and filled with spaces, so that writing the
 * run's end into it (when its record could not be stored) never needs a new block: it
 * must work on the full disk that caused the failure. */
#define OWNER_NOTE_BYTES 512

struct eph_run {
  pthread_mutex_t lock;
  pthread_mutex_t emit_lock; /* events reach the observer in seq order, from any thread */
  pthread_cond_t cond;
  eph_ctx_t *ctx;
  char id[40];
  char *org;
  eph_request_t req;
  json_object *grants;
  eph_gate_t gate;
  eph_run_observer_t obs;

  eph_run_status_t status;
  char reason[64];
  char *error;
  int64_t created_us; /* wall clock, for created_at */
  int64_t start_ms;   /* CLOCK_MONOTONIC at queue time: t = 0 */
  int64_t deadline_ms;
  bool ended, settled;
  atomic_bool cancel;
  atomic_bool budget_exhausted;
  atomic_bool storage_failed; /* a ledger or store write failed: see eph_run_storage_failed */
  char storage_error[512];    /* its first message, under lock */

  eph_event_t *events;
  size_t n_events, cap_events;

  const eph_plugin_slot_t *ledger, *backend, *model;
  char *model_call_name; /* what the model plugin is asked for (may be "replay:...") */
  eph_live_t live;          /* the running command's live output (live.h) */
  eph_live_t delta;         /* the running model call's streamed text (model_delta) */
  int64_t delta_step;       /* its model call number */
  const char *live_call_id; /* the tool call running, borrowed for its duration */
  const char *live_source;  /* its timeline source ("Shell") */
  char *replayed_from;   /* the transcript answering the model calls, NULL for a real model */
  char *recorded_model;  /* the model the transcript recorded (see note_replay) */
  char *backend_name;
  eph_sbx_t *sbx;

  /* Usage and money (micros). billed mirrors the ledger's accepted charges. */
  int64_t model_calls, input_tokens, output_tokens;
  int64_t reserved, billed, released, model_micros, web_micros, compute_micros;
  int64_t in_price_mtok, out_price_mtok, compute_price_s, meter_ms;
  int64_t cache_read_price_mtok, cache_write_price_mtok; /* cached prompt tokens */
  int64_t max_steps, max_output_tokens;

  /* The compute meter: charges while the sandbox lives. */
  pthread_t meter;
  bool meter_running, meter_stop;
  int64_t sandbox_start_ms;
  int64_t compute_due_charged; /* micros of compute already charged */

  char *answer;
  json_object *output_files;
  FILE *record;

  int owner_fd;    /* flock held on lock_path while the reservation may be open */
  char *lock_path; /* <state_dir>/runs/<id>.lock */
};


const char *
eph_run_status_name(eph_run_status_t s)
{
  static const char *const names[] = {"queued", "running", "succeeded", "failed",
                                      "timed_out", "budget_exhausted", "cancelled"};
  return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "unknown";
}

int
eph_run_status_exit_code(eph_run_status_t s)
{
  switch (s) {
  case EPH_RUN_SUCCEEDED:
    return 0;
  case EPH_RUN_TIMED_OUT:
    return 3;
  case EPH_RUN_BUDGET_EXHAUSTED:
    return 4;
  case EPH_RUN_CANCELLED:
    return 5;
  default:
    return 1;
  }
}

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

/* ------------------------------------------------------------------ events */

json_object *
eph_event_to_json(const eph_event_t *ev, bool redact)
{
  json_object *o = json_object_new_object();
  json_object_object_add(o, "seq", json_object_new_int64(ev->seq));
  json_object_object_add(o, "t", json_object_new_double((double)ev->t_ms / 1000.0));
  json_object_object_add(o, "source", json_object_new_string(ev->source));
  json_object_object_add(o, "kind", json_object_new_string(ev->kind));
  bool hide = redact && ev->content;
  json_object_object_add(o, "text", json_object_new_string(hide ? "[redacted: zero data retention]"
                                                                : ev->text));
  if (ev->data && !hide)
    json_object_object_add(o, "data", json_object_get(ev->data));
  return o;
}

static void
emit_full(eph_run_t *run, const char *source, const char *kind, const char *text,
          json_object *data, bool content)
{
  /* The egress proxy emits from its own threads: without this lock two observers' calls
   * (store, CLI) could interleave out of seq order. */
  pthread_mutex_lock(&run->emit_lock);
  pthread_mutex_lock(&run->lock);
  if (run->n_events == run->cap_events) {
    run->cap_events = run->cap_events ? run->cap_events * 2 : 32;
    run->events = eph_xrealloc(run->events, run->cap_events * sizeof *run->events);
  }
  eph_event_t *ev = &run->events[run->n_events];
  *ev = (eph_event_t){
      .seq = (int64_t)run->n_events + 1,
      .t_ms = eph_now_ms() - run->start_ms,
      .source = eph_xstrdup(source),
      .kind = eph_xstrdup(kind),
      .text = eph_xstrdup(text),
      .data = data ? json_object_get(data) : NULL,
      .content = content,
  };
  run->n_events++;
  /* A copy for the observer: the array may move once the lock is released. */
  eph_event_t copy = *ev;
  pthread_cond_broadcast(&run->cond);
  pthread_mutex_unlock(&run->lock);
  if (run->obs.on_event)
    run->obs.on_event(run->obs.opaque, run, &copy);
  pthread_mutex_unlock(&run->emit_lock);
}

static void
emit(eph_run_t *run, const char *source, const char *kind, bool content, json_object *data,
     const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static void
emit(eph_run_t *run, const char *source, const char *kind, bool content, json_object *data,
     const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  char *text = NULL;
  if (vasprintf(&text, fmt, ap) < 0)
    text = NULL;
  va_end(ap);
  emit_full(run, source, kind, text ? text : "", data, content);
  free(text);
  if (data)
    json_object_put(data);
}

static void
notify_update(eph_run_t *run)
{
  if (run->obs.on_update)
    run->obs.on_update(run->obs.opaque, run);
}

void
eph_run_storage_failed(eph_run_t *run, const char *message)
{
  pthread_mutex_lock(&run->lock);
  if (!run->storage_error[0])
    snprintf(run->storage_error, sizeof run->storage_error, "%s",
             message && *message ? message : "a write to storage failed");
  atomic_store(&run->storage_failed, true);
  /* Stop the work at once: nothing it does now could be recorded or billed. */
  if (run->sbx)
    eph_sbx_cancel(run->sbx);
  pthread_cond_broadcast(&run->cond);
  pthread_mutex_unlock(&run->lock);
}

/* ------------------------------------------------------------------ money */

static const eph_ledger_ops_t *
ledger_ops(eph_run_t *run)
{
  return run->ledger->desc->ops;
}

/* Charges up to `micros`; when that would pass the reservation, charges what is left and
 * flags the budget as exhausted. Returns the micros actually charged. */
static int64_t
charge_capped(eph_run_t *run, eph_cost_t cat, int64_t micros, const char *memo)
{
  if (micros <= 0)
    return 0;
  pthread_mutex_lock(&run->lock);
  int64_t left = run->reserved - run->billed;
  int64_t amount = micros > left ? left : micros;
  bool short_of_budget = micros > left;
  int64_t charged = 0;
  if (amount > 0) {
    eph_error_t err = {0};
    int r = EPH_WITH_PLUGIN(run->ledger, ledger_ops(run)->charge(run->ledger->state, run->id,
                                                                 cat, amount, memo, &err));
    if (r < 0 && err.code == EPH_E_BUDGET) {
      short_of_budget = true;
    } else if (r < 0) {
      /* Not the budget: the ledger could not record the charge (full disk, I/O error).
       * The run stops as failed/storage_error; what was not recorded is not billed. */
      eph_error("run %s: ledger charge of %" PRId64 " micros failed: %s", run->id, amount,
                err.message);
      pthread_mutex_unlock(&run->lock);
      eph_run_storage_failed(run, err.message);
      pthread_mutex_lock(&run->lock);
    } else {
      charged = amount;
      run->billed += amount;
      if (cat == EPH_COST_MODEL)
        run->model_micros += amount;
      else if (cat == EPH_COST_WEB)
        run->web_micros += amount;
      else
        run->compute_micros += amount;
    }
  }
  pthread_mutex_unlock(&run->lock);
  if (short_of_budget) {
    atomic_store(&run->budget_exhausted, true);
    if (run->sbx)
      eph_sbx_cancel(run->sbx);
  }
  return charged;
}

static int64_t
remaining_micros(eph_run_t *run)
{
  pthread_mutex_lock(&run->lock);
  int64_t left = run->reserved - run->billed;
  pthread_mutex_unlock(&run->lock);
  return left;
}

/* Micros of one model call, rounded up. The token counts come from the model's answer
 * (or a transcript): absurd counts must not overflow int64 into a negative, free call, so
 * the cost saturates at INT64_MAX and charge_capped() bills what the reservation has left. */
static int64_t
model_call_cost(const eph_run_t *run, const eph_model_response_t *resp)
{
  uint64_t input_tokens = resp->input_tokens, output_tokens = resp->output_tokens;
  /* Cached prompt tokens are part of input_tokens and priced at their own rates; counts
   * that claim more cached tokens than prompt tokens are billed as if all were uncached. */
  uint64_t cr = resp->cache_read_tokens, cw = resp->cache_write_tokens;
  if (cr > input_tokens || cw > input_tokens - cr)
    cr = cw = 0;
  int64_t in_x, out_x, cr_x, cw_x, sum;
  if (input_tokens > INT64_MAX || output_tokens > INT64_MAX ||
      __builtin_mul_overflow((int64_t)(input_tokens - cr - cw), run->in_price_mtok, &in_x) ||
      __builtin_mul_overflow((int64_t)cr, run->cache_read_price_mtok, &cr_x) ||
      __builtin_mul_overflow((int64_t)cw, run->cache_write_price_mtok, &cw_x) ||
      __builtin_mul_overflow((int64_t)output_tokens, run->out_price_mtok, &out_x) ||
      __builtin_add_overflow(in_x, out_x, &sum) || __builtin_add_overflow(sum, cr_x, &sum) ||
      __builtin_add_overflow(sum, cw_x, &sum) || __builtin_add_overflow(sum, 999999, &sum))
    return INT64_MAX;
  return sum / 1000000;
}

/* Compute is charged continuously so a crash loses at most one interval, and the meter
 * wakes early enough to stop the sandbox before compute could pass the cap. */
static void
meter_tick(eph_run_t *run, int64_t now)
{
  /* Never past the deadline the client bought: a daemon stopped (SIGSTOP, a frozen host)
   * and continued later finds its run over, not a bill for the time it was away. */
  if (now > run->deadline_ms)
    now = run->deadline_ms;
  int64_t elapsed = now - run->sandbox_start_ms;
  /* Charged per started millisecond-priced micro: due = ceil(ms * price / 1000). */
  int64_t due = (elapsed * run->compute_price_s + 999) / 1000;
  int64_t delta = due - run->compute_due_charged;
  if (delta > 0) {
    int64_t charged = charge_capped(run, EPH_COST_COMPUTE, delta, "sandbox compute");
    run->compute_due_charged += charged;
  }
}

static void *
meter_main(void *arg)
{
  eph_run_t *run = arg;
  pthread_mutex_lock(&run->lock);
  while (!run->meter_stop) {
    int64_t left = run->reserved - run->billed;
    int64_t wait_ms = run->meter_ms;
    if (run->compute_price_s > 0) {
      int64_t until_cap = left * 1000 / run->compute_price_s;
      if (until_cap < wait_ms)
        wait_ms = until_cap > 5 ? until_cap : 5;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += wait_ms / 1000;
    ts.tv_nsec += (wait_ms % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&run->cond, &run->lock, &ts);
    if (run->meter_stop)
      break;
    pthread_mutex_unlock(&run->lock);
    meter_tick(run, eph_now_ms());
    pthread_mutex_lock(&run->lock);
  }
  pthread_mutex_unlock(&run->lock);
  return NULL;
}

static void
meter_start(eph_run_t *run)
{
  run->sandbox_start_ms = eph_now_ms();
  pthread_condattr_t attr;
  (void)attr;
  if (pthread_create(&run->meter, NULL, meter_main, run) == 0)
    run->meter_running = true;
}

static void
meter_stop(eph_run_t *run)
{
  if (!run->meter_running)
    return;
  pthread_mutex_lock(&run->lock);
  run->meter_stop = true;
  pthread_cond_broadcast(&run->cond);
  pthread_mutex_unlock(&run->lock);
  pthread_join(run->meter, NULL);
  run->meter_running = false;
  meter_tick(run, eph_now_ms());
}

/* ------------------------------------------------------------------ set-up */

static int
price_for_model(eph_run_t *run, eph_error_t *err)
{
  const config_setting_t *core = run->ctx->config.core;
  config_setting_t *pricing = core ? config_setting_get_member(core, "pricing") : NULL;
  int r = eph_cfg_int(pricing, "compute_micros_per_second", 240, &run->compute_price_s, err);
  if (r < 0)
    return r;
  /* Embedded default: the product page's model at the example's prices. */
  run->in_price_mtok = run->cache_read_price_mtok = run->cache_write_price_mtok = 50000;
  run->out_price_mtok = 280000;
  config_setting_t *models = pricing ? config_setting_get_member(pricing, "models") : NULL;
  if (models) {
    bool found = false;
    for (int i = 0; i < config_setting_length(models); i++) {
      config_setting_t *m = config_setting_get_elem(models, (unsigned)i);
      const char *name = NULL;
      if ((r = eph_cfg_string(m, "name", NULL, &name, err)) < 0)
        return r;
      if (!name || strcmp(name, run->req.model) != 0)
        continue;
      if ((r = eph_cfg_int(m, "input_micros_per_mtok", 0, &run->in_price_mtok, err)) < 0 ||
          (r = eph_cfg_int(m, "output_micros_per_mtok", 0, &run->out_price_mtok, err)) < 0 ||
          (r = eph_cfg_int(m, "cached_input_micros_per_mtok", run->in_price_mtok,
                           &run->cache_read_price_mtok, err)) < 0 ||
          (r = eph_cfg_int(m, "cache_write_micros_per_mtok", run->in_price_mtok,
                           &run->cache_write_price_mtok, err)) < 0)
        return r;
      found = true;
    }
    if (!found && strncmp(run->model_call_name, "replay:", 7) != 0)
      return eph_error_set(err, EINVAL, "field 'model': no price configured for model '%s'",
                           run->req.model);
  }
  return 0;
}

/* True when a loaded tool plugin offers a tool of permission row p. */
static bool
tool_loaded_for(const eph_ctx_t *ctx, eph_permission_t p)
{
  for (size_t i = 0; i < ctx->plugins.n; i++) {
    const eph_plugin_slot_t *s = &ctx->plugins.slots[i];
    if (s->desc->kind != EPH_KIND_TOOL)
      continue;
    const eph_tool_ops_t *ops = s->desc->ops;
    if (!EPH_OPS_HAS(ops, eph_tool_ops_t, call))
      continue;
    for (size_t j = 0; j < ops->n_tools; j++)
      if (ops->tools[j].permission == p)
        return true;
  }
  return false;
}

/* A granted row no loaded plugin serves (its plugin disabled or refused at load) would
 * reserve, boot, report "shell on" and then deny every call as an unknown tool: refused
 * before anything is reserved instead. */
static int
check_grants_served(const eph_ctx_t *ctx, const eph_gate_t *g, eph_error_t *err)
{
  static const struct {
    eph_permission_t p;
    const char *field, *plugin;
  } rows[] = {
      {EPH_PERM_SHELL, "shell", "tool-shell"},
      {EPH_PERM_WEB, "web", "tool-web"},
      {EPH_PERM_FILES, "files", "tool-file"},
      {EPH_PERM_CONNECTIONS, "connections", "tool-connection"},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    bool granted = rows[i].p == EPH_PERM_SHELL ? g->shell
                   : rows[i].p == EPH_PERM_WEB  ? g->web
                   : rows[i].p == EPH_PERM_FILES ? g->files
                                                 : g->n_connections > 0;
    if (granted && !tool_loaded_for(ctx, rows[i].p))
      return eph_error_set(err, EINVAL, "field '%s': granted, but no loaded plugin provides "
                           "it (is %s enabled and loading? see `ephemeral plugins`)",
                           rows[i].field, rows[i].plugin);
  }
  return 0;
}

/* Marks this run as owned by a live process: an exclusive flock on <state_dir>/runs/<id>.lock,
 * taken before the reservation and dropped after settle, so a process that finds the file
 * lockable knows the owner died and settles the reservation (context.c). The lock is taken on
 * a private name first and renamed into place, so the file is never seen unlocked. */
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
  /* Room for the note abandon_owner_lock() may have to write on a full disk; a disk
   * that cannot hold these bytes refuses the run before anything is reserved. */
  char blank[OWNER_NOTE_BYTES];
  memset(blank, ' ', sizeof blank);
  blank[sizeof blank - 1] = '\n';
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
  pthread_mutex_lock(&run->lock);
  json_object_object_add(note, "status",
                         json_object_new_string(eph_run_status_name(run->status)));
  json_object_object_add(note, "reason", json_object_new_string(run->reason));
  if (run->error && !run->req.zero_data_retention)
    json_object_object_add(note, "error", json_object_new_string(run->error));
  pthread_mutex_unlock(&run->lock);
  char buf[OWNER_NOTE_BYTES];
  memset(buf, ' ', sizeof buf);
  buf[sizeof buf - 1] = '\n';
  const char *text = json_object_to_json_string_ext(note, JSON_C_TO_STRING_PLAIN);
  size_t n = strlen(text);
  if (n >= sizeof buf - 1) {
    /* Too long with the error: status and reason alone fit. */
    json_object_object_del(note, "error");
    text = json_object_to_json_string_ext(note, JSON_C_TO_STRING_PLAIN);
    n = strlen(text);
  }
  memcpy(buf, text, n < sizeof buf - 1 ? n : sizeof buf - 1);
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
eph_run_new(eph_ctx_t *ctx, eph_request_t *req, const eph_run_options_t *opt,
            eph_run_t **out, eph_error_t *err)
{
  *out = NULL;
  eph_run_t *run = eph_xcalloc(1, sizeof *run);
  pthread_mutex_init(&run->lock, NULL);
  pthread_mutex_init(&run->emit_lock, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&run->cond, &ca);
  pthread_condattr_destroy(&ca);
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
  const config_setting_t *core = ctx->config.core;
  if ((r = eph_cfg_int(core, "max_steps", 24, &run->max_steps, err)) < 0 ||
      (r = eph_cfg_int(core, "max_output_tokens", 4096, &run->max_output_tokens, err)) < 0 ||
      (r = eph_cfg_int(core, "compute_meter_ms", 2000, &run->meter_ms, err)) < 0)
    goto fail;
  if (run->meter_ms < 10)
    run->meter_ms = 10;

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
  run->model_call_name =
      eph_xstrdup(opt->model_override ? opt->model_override : run->req.model);
  const char *model_plugin = NULL;
  if (strncmp(run->model_call_name, "replay:", 7) == 0)
    model_plugin = "model-replay";
  else if ((r = eph_cfg_string(core, "model_plugin", "model-openai", &model_plugin, err)) < 0)
    goto fail;
  /* Routing by the model's provider prefix ("openai/", "anthropic/", an operator's
   * "local/"): the model plugin serving the name with the most specific prefix takes the
   * run. An offline daemon (model-replay) replays every run; plugins without serves()
   * leave the choice to model_plugin. A name nobody serves is the client's error, refused
   * here, before anything is reserved. */
  if (strcmp(model_plugin, "model-replay") != 0) {
    bool default_declined = false;
    const eph_plugin_slot_t *routed = NULL;
    int best = 0;
    for (size_t i = 0; i < ctx->plugins.n; i++) {
      const eph_plugin_slot_t *s = &ctx->plugins.slots[i];
      const eph_model_ops_t *mo = s->desc->ops;
      if (s->desc->kind != EPH_KIND_MODEL || !EPH_OPS_HAS(mo, eph_model_ops_t, serves))
        continue;
      int score = EPH_WITH_PLUGIN(s, mo->serves(s->state, run->model_call_name));
      if (score > best) {
        best = score;
        routed = s;
      } else if (score <= 0 && strcmp(s->desc->name, model_plugin) == 0) {
        default_declined = true;
      }
    }
    if (routed) {
      model_plugin = routed->desc->name;
    } else if (default_declined) {
      r = eph_error_set(err, EINVAL,
                        "field 'model': no loaded model provider serves '%s' (its prefix, such "
                        "as \"openai/\" or \"anthropic/\", names the provider)",
                        run->model_call_name);
      goto fail;
    }
  }
  run->model = eph_plugins_find(&ctx->plugins, model_plugin);
  if (!run->model || run->model->desc->kind != EPH_KIND_MODEL) {
    r = eph_error_set(err, ENOENT, "model plugin '%s' is not loaded (enable it in conf.d)",
                      model_plugin);
    goto fail;
  }
  if ((r = price_for_model(run, err)) < 0)
    goto fail;
  eph_gate_init(&run->gate, &run->req, ctx);
  if ((r = check_grants_served(ctx, &run->gate, err)) < 0)
    goto fail;
  if (opt->record_path) {
    run->record = fopen(opt->record_path, "a");
    if (!run->record) {
      r = eph_error_set(err, errno, "--record %s: %s", opt->record_path, strerror(errno));
      goto fail;
    }
  }

  /* The reservation is the last step: any failure above reserved nothing. */
  if ((r = take_owner_lock(run, err)) < 0)
    goto fail;
  r = EPH_WITH_PLUGIN(run->ledger,
                      ledger_ops(run)->reserve(run->ledger->state, run->org, run->id,
                                               run->req.max_cost_micros, err));
  if (r < 0)
    goto fail;
  run->reserved = run->req.max_cost_micros;
  /* t = 0 is the moment the run is queued with its reservation, as on the product page. */
  run->start_ms = eph_now_ms();
  char budget[32];
  emit(run, "Queued", "reserved", false,
       ({
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

/* ------------------------------------------------------------------ tools */

static const char *
perm_source(eph_permission_t p)
{
  switch (p) {
  case EPH_PERM_SHELL:
    return "Shell";
  case EPH_PERM_WEB:
    return "Web";
  case EPH_PERM_FILES:
    return "Files";
  case EPH_PERM_CONNECTIONS:
    return "Connection";
  }
  return "Tool";
}

typedef struct tool_ref {
  const eph_plugin_slot_t *slot;
  const eph_tool_def_t *def;
} tool_ref_t;

static bool
find_tool(eph_run_t *run, const char *name, tool_ref_t *out)
{
  for (size_t i = 0; i < run->ctx->plugins.n; i++) {
    const eph_plugin_slot_t *s = &run->ctx->plugins.slots[i];
    if (s->desc->kind != EPH_KIND_TOOL)
      continue;
    const eph_tool_ops_t *ops = s->desc->ops;
    if (!EPH_OPS_HAS(ops, eph_tool_ops_t, call))
      continue;
    for (size_t j = 0; j < ops->n_tools; j++)
      if (strcmp(ops->tools[j].name, name) == 0) {
        out->slot = s;
        out->def = &ops->tools[j];
        return true;
      }
  }
  return false;
}

/* Only the tools the permission table grants are offered to the model. */
static json_object *
permitted_tools(eph_run_t *run)
{
  json_object *tools = json_object_new_array();
  for (size_t i = 0; i < run->ctx->plugins.n; i++) {
    const eph_plugin_slot_t *s = &run->ctx->plugins.slots[i];
    if (s->desc->kind != EPH_KIND_TOOL)
      continue;
    const eph_tool_ops_t *ops = s->desc->ops;
    if (!EPH_OPS_HAS(ops, eph_tool_ops_t, call))
      continue;
    for (size_t j = 0; j < ops->n_tools; j++) {
      const eph_tool_def_t *d = &ops->tools[j];
      if (!eph_gate_permits(&run->gate, d->permission))
        continue;
      json_object *params = json_tokener_parse(d->parameters_json);
      if (!params) {
        eph_warn("%s: tool '%s' has invalid parameters JSON; not offered", s->desc->name,
                 d->name);
        continue;
      }
      json_object *fn = json_object_new_object();
      json_object_object_add(fn, "name", json_object_new_string(d->name));
      json_object_object_add(fn, "description", json_object_new_string(d->description));
      json_object_object_add(fn, "parameters", params);
      json_object *t = json_object_new_object();
      json_object_object_add(t, "type", json_object_new_string("function"));
      json_object_object_add(t, "function", fn);
      json_object_array_add(tools, t);
    }
  }
  return tools;
}

static json_object *
tool_message(const char *call_id, json_object *result)
{
  json_object *m = json_object_new_object();
  json_object_object_add(m, "role", json_object_new_string("tool"));
  json_object_object_add(m, "tool_call_id", json_object_new_string(call_id ? call_id : ""));
  json_object_object_add(
      m, "content",
      json_object_new_string(json_object_to_json_string_ext(result, JSON_C_TO_STRING_PLAIN)));
  return m;
}

static json_object *
error_result(const char *msg)
{
  json_object *o = json_object_new_object();
  json_object_object_add(o, "error", json_object_new_string(msg));
  return o;
}

/* A one-line description of a call for the timeline: "$ cmd" for the shell. */
static char *
call_text(const char *name, json_object *args)
{
  json_object *cmd = NULL;
  if (strcmp(name, "shell") == 0 && json_object_object_get_ex(args, "command", &cmd) &&
      json_object_is_type(cmd, json_type_string))
    return eph_xasprintf("$ %s", json_object_get_string(cmd));
  const char *a = json_object_to_json_string_ext(args, JSON_C_TO_STRING_PLAIN);
  return eph_xasprintf("%s %.300s", name, a);
}

static char *
result_text(json_object *result)
{
  json_object *x;
  if (json_object_object_get_ex(result, "error", &x))
    return eph_xasprintf("error: %.200s", json_object_get_string(x));
  if (json_object_object_get_ex(result, "exit_code", &x)) {
    json_object *d = NULL, *reason = NULL;
    json_object_object_get_ex(result, "duration_ms", &d);
    json_object_object_get_ex(result, "reason", &reason);
    const char *why = reason ? json_object_get_string(reason) : "exited";
    if (strcmp(why, "exited") != 0)
      return eph_xasprintf("%s · %.2f s", why, d ? json_object_get_int64(d) / 1000.0 : 0.0);
    return eph_xasprintf("exit %d · %.2f s", json_object_get_int(x),
                         d ? json_object_get_int64(d) / 1000.0 : 0.0);
  }
  if (json_object_object_get_ex(result, "status", &x))
    return eph_xasprintf("HTTP %d", json_object_get_int(x));
  return eph_xstrdup("done");
}

/* Runs one tool call through the gate. Appends the tool message to `messages`. */
static void
run_tool_call(eph_run_t *run, json_object *tc, json_object *messages)
{
  json_object *id = NULL, *fn = NULL, *jname = NULL, *jargs = NULL;
  json_object_object_get_ex(tc, "id", &id);
  json_object_object_get_ex(tc, "function", &fn);
  if (fn) {
    json_object_object_get_ex(fn, "name", &jname);
    json_object_object_get_ex(fn, "arguments", &jargs);
  }
  const char *call_id = id ? json_object_get_string(id) : "";
  const char *name = jname ? json_object_get_string(jname) : "";
  cleanup_json json_object *args = NULL;
  if (jargs && json_object_is_type(jargs, json_type_string))
    args = json_tokener_parse(json_object_get_string(jargs));
  else if (jargs && json_object_is_type(jargs, json_type_object))
    args = json_object_get(jargs);

  tool_ref_t ref = {0};
  if (!find_tool(run, name, &ref)) {
    cleanup_json json_object *res = error_result("unknown tool: no such tool is available");
    emit(run, "Gate", "denied", true, NULL, "%.64s denied: unknown tool", name);
    json_object_array_add(messages, tool_message(call_id, res));
    return;
  }
  const char *source = perm_source(ref.def->permission);
  char why[256];
  if (eph_gate_check_tool(&run->gate, ref.def, args, why, sizeof why) < 0) {
    /* The plugin is never entered: the model gets a plain denial, the timeline an event. */
    cleanup_json json_object *res = error_result(why);
    json_object *d = json_object_new_object();
    json_object_object_add(d, "tool", json_object_new_string(name));
    json_object_object_add(d, "reason", json_object_new_string(why));
    emit(run, source, "denied", false, d, "%s denied: %s", name, why);
    json_object_array_add(messages, tool_message(call_id, res));
    return;
  }
  if (!args || !json_object_is_type(args, json_type_object)) {
    cleanup_json json_object *res = error_result("arguments must be a JSON object");
    json_object_array_add(messages, tool_message(call_id, res));
    return;
  }
  cleanup_free char *text = call_text(name, args);
  json_object *d = json_object_new_object();
  json_object_object_add(d, "tool", json_object_new_string(name));
  json_object_object_add(d, "call_id", json_object_new_string(call_id));
  json_object_object_add(d, "arguments", json_object_get(args));
  emit(run, source, "tool_call", true, d, "%s", text);

  eph_tool_call_t call = {
      .struct_size = sizeof call,
      .run_id = run->id,
      .tool = name,
      .args = args,
      .grants = run->grants,
      .zero_data_retention = run->req.zero_data_retention,
      .deadline_ms = run->deadline_ms,
      .run = run,
  };
  const eph_tool_ops_t *ops = ref.slot->desc->ops;
  json_object *result = NULL;
  eph_error_t err = {0};
  int64_t t0 = eph_now_ms();
  run->live_call_id = call_id;
  run->live_source = source;
  int r = EPH_WITH_PLUGIN(ref.slot, ops->call(ref.slot->state, &call, &result, &err));
  run->live_call_id = NULL;
  if (r < 0 || !result) {
    if (result)
      json_object_put(result);
    result = error_result(r < 0 ? err.message : "the tool returned nothing");
    eph_warn("run %s: tool %s failed: %s", run->id, name,
             run->req.zero_data_retention ? "(redacted)" : err.message);
  }
  cleanup_free char *rtext = result_text(result);
  json_object *rd = json_object_new_object();
  json_object_object_add(rd, "tool", json_object_new_string(name));
  json_object_object_add(rd, "call_id", json_object_new_string(call_id));
  json_object_object_add(rd, "result", json_object_get(result));
  json_object_object_add(rd, "duration_ms", json_object_new_int64(eph_now_ms() - t0));
  emit(run, source, "tool_result", true, rd, "%s", rtext);
  json_object_array_add(messages, tool_message(call_id, result));
  json_object_put(result);
}

/* ------------------------------------------------------------------ honest replay */

/* A model answer from a recording (model-replay) says so: the run remembers the transcript
 * and the model it recorded, reports "replayed": true and the recorded model, and the model
 * event reads "replayed from TRANSCRIPT:LINE". Returns the event text's middle part ("" for
 * a real model call), valid until the next call. */
static const char *
note_replay(eph_run_t *run, const eph_model_response_t *resp, char *buf, size_t size)
{
  if (!EPH_MODEL_RESPONSE_HAS_REPLAY(resp) || !resp->replayed_from[0])
    return "";
  pthread_mutex_lock(&run->lock);
  if (!run->replayed_from) {
    const char *line = strrchr(resp->replayed_from, ':');
    run->replayed_from = line ? eph_xasprintf("%.*s", (int)(line - resp->replayed_from),
                                              resp->replayed_from)
                              : eph_xstrdup(resp->replayed_from);
  }
  if (!run->recorded_model && resp->recorded_model[0])
    run->recorded_model = eph_xstrdup(resp->recorded_model);
  pthread_mutex_unlock(&run->lock);
  snprintf(buf, size, " · replayed from %s", resp->replayed_from);
  return buf;
}

static int complete_streaming(eph_run_t *run, const eph_model_ops_t *mops,
                              eph_model_request_t *mreq, eph_model_response_t *resp,
                              eph_error_t *err, int64_t step);

/* ------------------------------------------------------------------ agent loop */

static void
set_end(eph_run_t *run, eph_run_status_t s, const char *reason, const char *error)
{
  pthread_mutex_lock(&run->lock);
  if (run->status == EPH_RUN_RUNNING || run->status == EPH_RUN_QUEUED) {
    run->status = s;
    snprintf(run->reason, sizeof run->reason, "%s", reason);
    free(run->error);
    run->error = error ? eph_xstrdup(error) : NULL;
  }
  pthread_mutex_unlock(&run->lock);
}

/* failed/storage_error with the first storage error as the run's error. */
static void
set_end_storage(eph_run_t *run)
{
  pthread_mutex_lock(&run->lock);
  char msg[sizeof run->storage_error];
  snprintf(msg, sizeof msg, "%s", run->storage_error);
  pthread_mutex_unlock(&run->lock);
  set_end(run, EPH_RUN_FAILED, "storage_error", msg);
}

/* Ends the loop for a storage failure, cancellation, deadline or budget; true when it
 * did. */
static bool
check_stop(eph_run_t *run)
{
  if (atomic_load(&run->storage_failed)) {
    set_end_storage(run);
    return true;
  }
  if (atomic_load(&run->cancel)) {
    set_end(run, EPH_RUN_CANCELLED, "cancelled", NULL);
    return true;
  }
  if (atomic_load(&run->budget_exhausted)) {
    set_end(run, EPH_RUN_BUDGET_EXHAUSTED, "budget_exhausted", NULL);
    return true;
  }
  if (eph_now_ms() >= run->deadline_ms) {
    set_end(run, EPH_RUN_TIMED_OUT, "timeout", NULL);
    return true;
  }
  return false;
}

static char *
system_prompt(eph_run_t *run)
{
  const char *scratch = run->sbx ? eph_sbx_scratch(run->sbx) : "(scratch)";
  return eph_xasprintf(
      "You are an agent inside a disposable, isolated Linux sandbox that is destroyed after "
      "this run. You act only through the tools offered; anything not offered is not "
      "available. Commands run as the unprivileged user `worker` in the scratch directory "
      "%s. Report real outputs, never what you expect. Shell: %s. Web: %s.",
      scratch, run->req.shell ? "on" : "off", run->req.web ? "on" : "off");
}

static void
agent_loop(eph_run_t *run)
{
  cleanup_json json_object *messages = json_object_new_array();
  cleanup_free char *sys = system_prompt(run);
  json_object *m = json_object_new_object();
  json_object_object_add(m, "role", json_object_new_string("system"));
  json_object_object_add(m, "content", json_object_new_string(sys));
  json_object_array_add(messages, m);
  m = json_object_new_object();
  json_object_object_add(m, "role", json_object_new_string("user"));
  json_object_object_add(m, "content", json_object_new_string(run->req.prompt));
  json_object_array_add(messages, m);
  cleanup_json json_object *tools = permitted_tools(run);
  const eph_model_ops_t *mops = run->model->desc->ops;

  for (int64_t step = 1;; step++) {
    if (check_stop(run))
      return;
    if (step > run->max_steps) {
      set_end(run, EPH_RUN_FAILED, "step_limit", "the run reached its step limit");
      return;
    }
    /* Pre-authorisation at the worst case: the prompt as it stands (~1 token per 3 bytes,
     * rounded up) plus max output tokens; the output allowance shrinks to what the
     * remaining reservation can pay, and below a useful minimum the run stops. */
    const char *wire = json_object_to_json_string_ext(messages, JSON_C_TO_STRING_PLAIN);
    int64_t est_in = (int64_t)strlen(wire) / 3 + 1;
    int64_t left = remaining_micros(run);
    int64_t max_out = run->max_output_tokens;
    int64_t in_cost_x = est_in * run->in_price_mtok; /* micros * 1e6 */
    if (run->out_price_mtok > 0) {
      int64_t affordable = (left * 1000000 - in_cost_x) / run->out_price_mtok;
      if (affordable < max_out)
        max_out = affordable;
    }
    if (max_out < MIN_OUTPUT_TOKENS || in_cost_x > left * 1000000) {
      set_end(run, EPH_RUN_BUDGET_EXHAUSTED, "budget_exhausted",
              "the remaining budget cannot pay for another model call");
      return;
    }
    eph_model_request_t mreq = {
        .struct_size = sizeof mreq,
        .model = run->model_call_name,
        .messages = messages,
        .tools = json_object_array_length(tools) ? tools : NULL,
        .max_output_tokens = (uint32_t)max_out,
        .deadline_ms = run->deadline_ms,
    };
    eph_model_response_t resp = {.struct_size = sizeof resp};
    eph_error_t err = {0};
    int64_t t0 = eph_now_ms();
    int r = complete_streaming(run, mops, &mreq, &resp, &err, step);
    if (r < 0) {
      eph_model_response_clear(&resp);
      if (err.code == ETIMEDOUT || eph_now_ms() >= run->deadline_ms)
        set_end(run, EPH_RUN_TIMED_OUT, "timeout", err.message);
      else if (err.code == EPH_E_DIVERGED)
        set_end(run, EPH_RUN_FAILED, "transcript_diverged", err.message);
      else
        set_end(run, EPH_RUN_FAILED, "model_error", err.message);
      emit(run, "Model", "model_error", false, NULL, "model call %" PRId64 " failed: %s", step,
           err.message);
      return;
    }
    int64_t cost = model_call_cost(run, &resp);
    charge_capped(run, EPH_COST_MODEL, cost, "model call");
    pthread_mutex_lock(&run->lock);
    run->model_calls++;
    run->input_tokens += (int64_t)resp.input_tokens;
    run->output_tokens += (int64_t)resp.output_tokens;
    pthread_mutex_unlock(&run->lock);
    if (run->record && resp.raw) {
      fprintf(run->record, "%s\n", json_object_to_json_string_ext(resp.raw, JSON_C_TO_STRING_PLAIN));
      fflush(run->record);
    }
    json_object *d = json_object_new_object();
    json_object_object_add(d, "input_tokens", json_object_new_int64((int64_t)resp.input_tokens));
    json_object_object_add(d, "output_tokens", json_object_new_int64((int64_t)resp.output_tokens));
    if (resp.cache_read_tokens || resp.cache_write_tokens) {
      json_object_object_add(d, "cache_read_tokens",
                             json_object_new_int64((int64_t)resp.cache_read_tokens));
      json_object_object_add(d, "cache_write_tokens",
                             json_object_new_int64((int64_t)resp.cache_write_tokens));
    }
    json_object_object_add(d, "cost_micros", json_object_new_int64(cost));
    json_object_object_add(d, "latency_ms", json_object_new_int64(eph_now_ms() - t0));
    json_object_object_add(d, "finish_reason", json_object_new_string(resp.finish_reason));
    char replay_buf[4200];
    const char *replayed = note_replay(run, &resp, replay_buf, sizeof replay_buf);
    if (*replayed)
      json_object_object_add(d, "replayed_from", json_object_new_string(resp.replayed_from));
    emit(run, "Model", "model_call", false, d,
         "model call %" PRId64 "%s · %" PRIu64 " in / %" PRIu64 " out tokens", step, replayed,
         resp.input_tokens, resp.output_tokens);
    notify_update(run);

    json_object *msg = resp.message;
    json_object *tcs = NULL, *content = NULL;
    if (!msg || !json_object_is_type(msg, json_type_object)) {
      eph_model_response_clear(&resp);
      set_end(run, EPH_RUN_FAILED, "model_error", "the model returned no message");
      return;
    }
    json_object_array_add(messages, json_object_get(msg));
    json_object_object_get_ex(msg, "tool_calls", &tcs);
    json_object_object_get_ex(msg, "content", &content);
    size_t n_calls = tcs && json_object_is_type(tcs, json_type_array)
                         ? json_object_array_length(tcs) : 0;
    if (n_calls == 0) {
      run->answer = eph_xstrdup(content && json_object_is_type(content, json_type_string)
                                    ? json_object_get_string(content) : "");
      eph_model_response_clear(&resp);
      if (atomic_load(&run->storage_failed))
        set_end_storage(run);
      else if (atomic_load(&run->budget_exhausted))
        set_end(run, EPH_RUN_BUDGET_EXHAUSTED, "budget_exhausted", NULL);
      else
        set_end(run, EPH_RUN_SUCCEEDED, "final_answer", NULL);
      return;
    }
    /* Several calls per turn, as the product page's model does; each passes the gate. */
    for (size_t i = 0; i < n_calls; i++) {
      if (check_stop(run))
        break;
      run_tool_call(run, json_object_array_get_idx(tcs, i), messages);
    }
    eph_model_response_clear(&resp);
  }
}

/* ------------------------------------------------------------------ execute */

static void
collect_outputs(eph_run_t *run)
{
  if (!run->req.n_outputs || !run->sbx)
    return;
  run->output_files = json_object_new_array();
  for (size_t i = 0; i < run->req.n_outputs; i++) {
    json_object *f = json_object_new_object();
    json_object_object_add(f, "path", json_object_new_string(run->req.outputs[i]));
    void *data = NULL;
    size_t bytes = 0;
    int truncated = 0;
    eph_error_t err = {0};
    if (eph_sbx_read(run->sbx, run->req.outputs[i], 1024 * 1024, &data, &bytes, &truncated,
                     &err) < 0) {
      json_object_object_add(f, "error", json_object_new_string(err.message));
    } else {
      cleanup_free char *b64 = eph_base64_encode(data, bytes);
      json_object_object_add(f, "encoding", json_object_new_string("base64"));
      json_object_object_add(f, "content", json_object_new_string(b64));
      json_object_object_add(f, "bytes", json_object_new_int64((int64_t)bytes));
      json_object_object_add(f, "truncated", json_object_new_boolean(truncated));
    }
    free(data);
    json_object_array_add(run->output_files, f);
  }
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
    emit(run, status_source(s), "ended", false, d, "%" PRId64 " model call%s, %s tokens", calls,
         calls == 1 ? "" : "s", tok);
  else
    emit(run, status_source(s), "ended", false, d, "%s · %" PRId64 " model call%s, %s tokens%s%s",
         run->reason, calls, calls == 1 ? "" : "s", tok, run->error ? " · " : "",
         run->error ? run->error : "");

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
  int r = EPH_WITH_PLUGIN(run->ledger,
                          ledger_ops(run)->settle(run->ledger->state, run->id, &totals, &err));
  if (r < 0) {
    /* The reservation stays open: no settled event claims what the ledger did not record.
     * The lock file is left with the run's end in it; the reconciler (daemon) or the next
     * start of any process settles it and completes the record. */
    eph_error("run %s: settle failed: %s (left to the reconciler)", run->id, err.message);
    eph_run_storage_failed(run, err.message);
    /* The last write of the run's own before the lock goes: once released, the reconciler
     * may complete the record at any moment and nothing here may overwrite it. */
    notify_update(run);
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
  char billed[32], released[32];
  json_object *sd = json_object_new_object();
  json_object_object_add(sd, "reserved_micros", json_object_new_int64(totals.reserved_micros));
  json_object_object_add(sd, "billed_micros", json_object_new_int64(totals.billed_micros));
  json_object_object_add(sd, "released_micros", json_object_new_int64(totals.released_micros));
  json_object_object_add(sd, "model_micros", json_object_new_int64(run->model_micros));
  json_object_object_add(sd, "web_micros", json_object_new_int64(run->web_micros));
  json_object_object_add(sd, "compute_micros", json_object_new_int64(run->compute_micros));
  /* The product page's words for the last line of the timeline. */
  emit(run, "Worker destroyed", "settled", false, sd, "%s billed, %s released",
       eph_format_dollars(totals.billed_micros, billed, sizeof billed),
       eph_format_dollars(totals.released_micros, released, sizeof released));
  notify_update(run);
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

/* ------------------------------------------------------------------ egress */

static int host_charge(eph_run_t *run, eph_cost_t category, int64_t micros, const char *memo,
                       eph_error_t *err);

/* What a run with `web` needs for its sandbox's one way out (see egress.h). */
typedef struct run_egress {
  eph_run_t *run;
  eph_egress_t *proxy;
  eph_net_policy_t policy;
  int64_t price_micros; /* per connection: tool-web's price_micros_per_request */
} run_egress_t;

/* Every connection through the proxy: an event, and for an allowed one a web charge
 * first; a refused charge refuses the connection. */
static int
egress_announce(void *opaque, const char *method, const char *target, const char *refusal,
                eph_error_t *err)
{
  run_egress_t *eg = opaque;
  eph_run_t *run = eg->run;
  json_object *d = json_object_new_object();
  json_object_object_add(d, "method", json_object_new_string(method));
  json_object_object_add(d, "target", json_object_new_string(target));
  if (!refusal && (atomic_load(&run->cancel) || eph_now_ms() >= run->deadline_ms))
    refusal = "the run is ending";
  if (!refusal && eg->price_micros > 0 &&
      host_charge(run, EPH_COST_WEB, eg->price_micros, "egress connection", err) < 0)
    refusal = err->message;
  json_object_object_add(d, "allowed", json_object_new_boolean(!refusal));
  if (refusal) {
    json_object_object_add(d, "reason", json_object_new_string(refusal));
    emit(run, "Web", "egress", true, d, "%s %s · refused: %s", method, target, refusal);
    return eph_error_set(err, EPH_E_DENIED, "%s", refusal);
  }
  json_object_object_add(d, "charged_micros", json_object_new_int64(eg->price_micros));
  emit(run, "Web", "egress", true, d, "%s %s", method, target);
  return 0;
}

/* Starts the run's proxy and points the spec at it. On failure the sandbox gets no network
 * (fail closed) and the timeline says why. */
static void
egress_start(run_egress_t *eg, eph_sandbox_spec_t *spec, const char *source)
{
  eph_error_t err = {0};
  eph_egress_options_t opt;
  /* The web's price is tool-web's: a connection costs what one web_fetch costs. */
  const eph_config_block_t *web = eph_config_block(&eg->run->ctx->config, "tool-web");
  int r = eph_cfg_int(web ? web->setting : NULL, "price_micros_per_request", 1000,
                      &eg->price_micros, &err);
  if (r == 0)
    r = eph_egress_load_config(&eg->run->ctx->config, &eg->run->ctx->host, &opt, &eg->policy,
                               &err);
  if (r == 0) {
    opt.policy = &eg->policy;
    opt.announce = egress_announce;
    opt.opaque = eg;
    r = eph_egress_start(&opt, &eg->proxy, &err);
  }
  if (r < 0) {
    emit(eg->run, source, "egress_error", false, NULL,
         "web egress could not be set up: %s · the sandbox has no network", err.message);
    eph_net_policy_free(&eg->policy);
    return;
  }
  spec->network = 1;
  spec->proxy_url = eph_egress_url(eg->proxy);
  spec->proxy_netns_fd = eph_egress_netns_fd(eg->proxy);
}

static void
egress_stop(run_egress_t *eg)
{
  eph_egress_stop(eg->proxy);
  eg->proxy = NULL;
  eph_net_policy_free(&eg->policy);
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
    set_end(run, EPH_RUN_CANCELLED, "cancelled", NULL);
    end_and_settle(run);
    return eph_run_status(run);
  }
  notify_update(run);

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
  run_egress_t egress = {.run = run};
  if (run->req.web)
    egress_start(&egress, &spec, source);
  int cr = eph_sbx_create(run->backend, &spec, &sbx, &err);
  if (cr < 0 && spec.network) {
    /* Fail closed: a sandbox whose egress rules could not all be applied gets none. */
    emit(run, source, "egress_error", false, NULL,
         "web egress could not be set up: %s · the sandbox has no network", err.message);
    egress_stop(&egress);
    spec.network = 0;
    spec.proxy_url = NULL;
    spec.proxy_netns_fd = -1;
    err = (eph_error_t){0};
    cr = eph_sbx_create(run->backend, &spec, &sbx, &err);
  }
  if (cr < 0) {
    egress_stop(&egress);
    if (eph_now_ms() >= run->deadline_ms)
      set_end(run, EPH_RUN_TIMED_OUT, "timeout", err.message);
    else
      set_end(run, EPH_RUN_FAILED, "host_error", err.message);
    emit(run, source, "sandbox_error", false, NULL, "%s failed to start: %s", noun, err.message);
    end_and_settle(run);
    return eph_run_status(run);
  }
  pthread_mutex_lock(&run->lock);
  run->sbx = sbx;
  pthread_mutex_unlock(&run->lock);
  meter_start(run);
  json_object *rd = json_object_new_object();
  json_object_object_add(rd, "backend", json_object_new_string(run->backend_name));
  json_object_object_add(rd, "scratch", json_object_new_string(eph_sbx_scratch(sbx)));
  if (spec.network)
    json_object_object_add(rd, "proxy_url", json_object_new_string(spec.proxy_url));
  emit(run, source, "sandbox_ready", false, rd, "%s ready", noun);

  bool ok = true;
  for (size_t i = 0; i < run->req.n_files && ok; i++) {
    if (eph_sbx_write(sbx, run->req.files[i].path, run->req.files[i].data,
                      run->req.files[i].bytes, &err) < 0) {
      char msg[1200];
      snprintf(msg, sizeof msg, "placing files[%zu]: %s", i, err.message);
      set_end(run, EPH_RUN_FAILED, "host_error", msg);
      ok = false;
    }
  }
  if (ok) {
    emit(run, source, "worker_started", false, NULL, "worker started · shell %s · web %s",
         run->req.shell ? "on" : "off", run->req.web ? "on" : "off");
    agent_loop(run);
    collect_outputs(run);
  }
  meter_stop(run);

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
    emit(run, source, "sandbox_error", false, dd, "%s destroy incomplete: %s", noun, err.message);
    set_end(run, EPH_RUN_FAILED, "host_error", err.message);
  } else {
    emit(run, source, "sandbox_destroyed", false, dd, "%s destroyed", noun);
  }
  egress_stop(&egress);
  end_and_settle(run);
  return eph_run_status(run);
}

void
eph_run_set_observer(eph_run_t *run, const eph_run_observer_t *obs)
{
  run->obs = *obs;
  for (size_t i = 0; i < run->n_events; i++)
    if (run->obs.on_event)
      run->obs.on_event(run->obs.opaque, run, &run->events[i]);
}

void
eph_run_abandon(eph_run_t *run, const char *reason)
{
  set_end(run, EPH_RUN_CANCELLED, reason ? reason : "cancelled", NULL);
  end_and_settle(run);
}

void
eph_run_cancel(eph_run_t *run)
{
  atomic_store(&run->cancel, true);
  pthread_mutex_lock(&run->lock);
  if (run->sbx)
    eph_sbx_cancel(run->sbx);
  pthread_cond_broadcast(&run->cond);
  pthread_mutex_unlock(&run->lock);
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
  pthread_cond_destroy(&run->cond);
  free(run);
}

/* ------------------------------------------------------------------ accessors */

const char *
eph_run_id(const eph_run_t *run)
{
  return run->id;
}

const char *
eph_run_org(const eph_run_t *run)
{
  return run->org;
}

bool
eph_run_zdr(const eph_run_t *run)
{
  return run->req.zero_data_retention;
}

eph_run_status_t
eph_run_status(eph_run_t *run)
{
  pthread_mutex_lock(&run->lock);
  eph_run_status_t s = run->status;
  pthread_mutex_unlock(&run->lock);
  return s;
}

bool
eph_run_settled(eph_run_t *run)
{
  pthread_mutex_lock(&run->lock);
  bool s = run->settled;
  pthread_mutex_unlock(&run->lock);
  return s;
}

static json_object *
events_locked(eph_run_t *run, int64_t after_seq)
{
  json_object *a = json_object_new_array();
  for (size_t i = 0; i < run->n_events; i++)
    if (run->events[i].seq > after_seq)
      json_object_array_add(a, eph_event_to_json(&run->events[i], false));
  return a;
}

json_object *
eph_run_events_json(eph_run_t *run, int64_t after_seq)
{
  pthread_mutex_lock(&run->lock);
  json_object *a = events_locked(run, after_seq);
  pthread_mutex_unlock(&run->lock);
  return a;
}

bool
eph_run_wait_events(eph_run_t *run, int64_t after_seq, int timeout_ms)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += timeout_ms / 1000;
  ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
  if (ts.tv_nsec >= 1000000000) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000;
  }
  pthread_mutex_lock(&run->lock);
  while ((int64_t)run->n_events <= after_seq && !run->settled)
    if (pthread_cond_timedwait(&run->cond, &run->lock, &ts) == ETIMEDOUT)
      break;
  bool ready = (int64_t)run->n_events > after_seq || run->settled;
  pthread_mutex_unlock(&run->lock);
  return ready;
}

static void
iso8601(int64_t us, char *buf, size_t size)
{
  time_t s = (time_t)(us / 1000000);
  struct tm tm;
  gmtime_r(&s, &tm);
  char base[32];
  strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(buf, size, "%s.%03dZ", base, (int)((us / 1000) % 1000));
}

json_object *
eph_run_to_json(eph_run_t *run, bool include_events)
{
  pthread_mutex_lock(&run->lock);
  json_object *o = json_object_new_object();
  json_object_object_add(o, "id", json_object_new_string(run->id));
  json_object_object_add(o, "object", json_object_new_string("run"));
  json_object_object_add(o, "status", json_object_new_string(eph_run_status_name(run->status)));
  if (run->ended)
    json_object_object_add(o, "reason", json_object_new_string(run->reason));
  if (run->error)
    json_object_object_add(o, "error", json_object_new_string(run->error));
  char created[40];
  iso8601(run->created_us, created, sizeof created);
  json_object_object_add(o, "created_at", json_object_new_string(created));
  json_object_object_add(o, "organisation", json_object_new_string(run->org));
  json_object_object_add(o, "backend", json_object_new_string(run->backend_name));
  json_object_object_add(o, "request", eph_request_to_json(&run->req));
  /* The model that answered: the transcript's recorded one when the run was replayed. */
  json_object_object_add(o, "model", json_object_new_string(run->recorded_model ? run->recorded_model
                                                            : run->req.model ? run->req.model : ""));
  json_object_object_add(o, "replayed", json_object_new_boolean(run->replayed_from != NULL));
  if (run->replayed_from)
    json_object_object_add(o, "transcript", json_object_new_string(run->replayed_from));
  if (include_events)
    json_object_object_add(o, "events", events_locked(run, 0));
  json_object *output = json_object_new_object();
  if (run->answer)
    json_object_object_add(output, "answer", json_object_new_string(run->answer));
  if (run->output_files)
    json_object_object_add(output, "files", json_object_get(run->output_files));
  json_object_object_add(o, "output", output);
  json_object *u = json_object_new_object();
  json_object_object_add(u, "model_calls", json_object_new_int64(run->model_calls));
  json_object_object_add(u, "input_tokens", json_object_new_int64(run->input_tokens));
  json_object_object_add(u, "output_tokens", json_object_new_int64(run->output_tokens));
  json_object_object_add(u, "reserved_micros", json_object_new_int64(run->reserved));
  json_object_object_add(u, "billed_micros", json_object_new_int64(run->billed));
  json_object_object_add(u, "released_micros", json_object_new_int64(run->released));
  json_object_object_add(u, "model_micros", json_object_new_int64(run->model_micros));
  json_object_object_add(u, "web_micros", json_object_new_int64(run->web_micros));
  json_object_object_add(u, "compute_micros", json_object_new_int64(run->compute_micros));
  json_object_object_add(o, "usage", u);
  pthread_mutex_unlock(&run->lock);
  return o;
}

/* ------------------------------------------------------------------ host services */

static int
host_emit(eph_run_t *run, const char *source, const char *kind, const char *text,
          json_object *data, eph_error_t *err)
{
  if (!run || !source || !kind || !text)
    return eph_error_set(err, EINVAL, "emit: run, source, kind and text are required");
  emit_full(run, source, kind, text, data, true);
  return 0;
}

static int
host_charge(eph_run_t *run, eph_cost_t category, int64_t micros, const char *memo,
            eph_error_t *err)
{
  if (!run || micros < 0)
    return eph_error_set(err, EINVAL, "charge: invalid run or amount");
  /* A plugin's charge is all or nothing: it is refused when it does not fit. */
  if (micros > remaining_micros(run)) {
    atomic_store(&run->budget_exhausted, true);
    return eph_error_set(err, EPH_E_BUDGET, "the run's budget cannot pay %" PRId64 " micros",
                         micros);
  }
  if (micros > 0 && charge_capped(run, category, micros, memo ? memo : "plugin charge") == 0)
    return eph_error_set(err, EIO, "the charge could not be recorded: the ledger is failing");
  return 0;
}

static int
need_sandbox(eph_run_t *run, eph_error_t *err)
{
  if (!run || !run->sbx)
    return eph_error_set(err, ENXIO, "no sandbox for this call");
  return 0;
}

/* ------------------------------------------------------------------ live output */

/* One coalesced `output` event of the running tool call (live.h); stream 0 is the
 * end-of-command marker counting what was not shown live. */
static void
live_emit(void *opaque, int stream, const char *text, size_t bytes, uint64_t dropped_bytes)
{
  eph_run_t *run = opaque;
  json_object *d = json_object_new_object();
  json_object_object_add(d, "call_id", json_object_new_string(run->live_call_id ? run->live_call_id
                                                                                : ""));
  if (stream) {
    json_object_object_add(d, "stream", json_object_new_string(stream == 2 ? "stderr" : "stdout"));
    json_object_object_add(d, "bytes", json_object_new_int64((int64_t)bytes));
    emit_full(run, run->live_source ? run->live_source : "Shell", "output", text, d, true);
  } else {
    json_object_object_add(d, "dropped_bytes", json_object_new_int64((int64_t)dropped_bytes));
    char marker[96];
    snprintf(marker, sizeof marker, "[... %" PRIu64 " bytes of output not shown live]",
             dropped_bytes);
    emit_full(run, run->live_source ? run->live_source : "Shell", "output", marker, d, true);
  }
  json_object_put(d);
}

/* host->output: a chunk of the running command's output. Content: under zero data
 * retention it is neither shown nor stored. */
static void
host_output(eph_run_t *run, int stream, const char *data, size_t bytes)
{
  if (!run || !data || run->req.zero_data_retention || !run->live_call_id)
    return;
  eph_live_add(&run->live, stream, data, bytes, live_emit, run);
}

/* One coalesced `model_delta` event: the streamed text of the running model call. */
static void
delta_emit(void *opaque, int stream, const char *text, size_t bytes, uint64_t dropped_bytes)
{
  eph_run_t *run = opaque;
  json_object *d = json_object_new_object();
  json_object_object_add(d, "call", json_object_new_int64(run->delta_step));
  if (stream) {
    json_object_object_add(d, "bytes", json_object_new_int64((int64_t)bytes));
    emit_full(run, "Model", "model_delta", text, d, true);
  } else {
    json_object_object_add(d, "dropped_bytes", json_object_new_int64((int64_t)dropped_bytes));
    char marker[96];
    snprintf(marker, sizeof marker, "[... %" PRIu64 " bytes of model text not shown live]",
             dropped_bytes);
    emit_full(run, "Model", "model_delta", marker, d, true);
  }
  json_object_put(d);
}

/* eph_model_request_t.on_delta: a piece of the answer's text as the provider streams it.
 * Model text is content: nothing under zero data retention. */
static void
model_delta(void *opaque, const char *text, size_t bytes)
{
  eph_run_t *run = opaque;
  if (!run->req.zero_data_retention && text)
    eph_live_add(&run->delta, 1, text, bytes, delta_emit, run);
}

/* Wraps one model call so its streamed text reaches the timeline live. */
static int
complete_streaming(eph_run_t *run, const eph_model_ops_t *mops, eph_model_request_t *mreq,
                   eph_model_response_t *resp, eph_error_t *err, int64_t step)
{
  mreq->on_delta = model_delta;
  mreq->delta_opaque = run;
  run->delta_step = step;
  eph_live_begin(&run->delta, 0);
  int r = EPH_WITH_PLUGIN(run->model, mops->complete(run->model->state, mreq, resp, err));
  eph_live_end(&run->delta, delta_emit, run);
  return r;
}

static int
host_exec(eph_run_t *run, const eph_exec_request_t *req, eph_exec_result_t *result,
          eph_error_t *err)
{
  int r = need_sandbox(run, err);
  if (r < 0)
    return r;
  /* The run's deadline bounds every command. */
  eph_exec_request_t bounded = *req;
  int64_t left = run->deadline_ms - eph_now_ms();
  if (left <= 0)
    return eph_error_set(err, ETIMEDOUT, "the run's deadline has passed");
  if (bounded.timeout_ms == 0 || (int64_t)bounded.timeout_ms > left)
    bounded.timeout_ms = (uint32_t)left;
  eph_live_begin(&run->live, bounded.output_cap_bytes);
  r = eph_sbx_exec(run->sbx, &bounded, result, err);
  eph_live_end(&run->live, live_emit, run);
  return r;
}

static int
host_write(eph_run_t *run, const char *path, const void *data, size_t bytes, eph_error_t *err)
{
  int r = need_sandbox(run, err);
  return r < 0 ? r : eph_sbx_write(run->sbx, path, data, bytes, err);
}

static int
host_read(eph_run_t *run, const char *path, size_t max_bytes, void **data, size_t *bytes,
          int *truncated, eph_error_t *err)
{
  int r = need_sandbox(run, err);
  return r < 0 ? r : eph_sbx_read(run->sbx, path, max_bytes, data, bytes, truncated, err);
}

static int
host_list(eph_run_t *run, const char *path, eph_dirent_t **entries, size_t *count,
          eph_error_t *err)
{
  int r = need_sandbox(run, err);
  return r < 0 ? r : eph_sbx_list(run->sbx, path, entries, count, err);
}

void
eph_run_host_services(eph_host_t *host)
{
  host->emit = host_emit;
  host->charge = host_charge;
  host->sandbox_exec = host_exec;
  host->exec_result_clear = eph_exec_result_clear;
  host->sandbox_write = host_write;
  host->sandbox_read = host_read;
  host->sandbox_list = host_list;
  host->dirents_free = eph_dirents_free;
  host->output = host_output;
}

