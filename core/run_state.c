/* A run's observable state, shared by every unit of the run: its status and end, its
 * timeline (events reach the observer in seq order from any thread), cancellation and the
 * thread-safe accessors. The lowest unit of the run: it calls none of the others. */
#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "run_int.h"
#include "util.h"

const char *
eph_run_status_name(eph_run_status_t s)
{
  static const char *const names[] = {"queued",    "running",          "succeeded", "failed",
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

/* A heap copy of s as valid UTF-8 (eph_utf8_repair when it is not). */
static char *
utf8_copy(const char *s)
{
  if (eph_utf8_invalid_at(s, strlen(s)) == SIZE_MAX)
    return eph_xstrdup(s);
  char *r = eph_utf8_repair(s, strlen(s), NULL);
  if (!r)
    abort(); /* out of memory, as eph_xstrdup */
  return r;
}

void
eph_run_emit_full(eph_run_t *run, const char *source, const char *kind, const char *text,
                  json_object *data, bool content)
{
  /* What plugins and sandboxes wrote (a provider's error text, a file name a sandbox made,
   * a model's finish_reason) reaches the record only as valid UTF-8: json-c writes a
   * string's bytes unchecked, and one raw byte made `runs show` and the API's answers
   * invalid JSON text (red-team finding). The text is copied so below (utf8_copy). */
  if (data)
    eph_json_utf8_repair(data);
  /* The egress proxy emits from its own threads: without this lock two observers' calls
   * (store, CLI) could interleave out of seq order. */
  pthread_mutex_lock(&run->emit_lock);
  pthread_mutex_lock(&run->lock);
  if (run->n_events == run->cap_events) {
    run->cap_events = run->cap_events ? run->cap_events * 2 : 32;
    run->events = eph_xrealloc(run->events, run->cap_events * sizeof *run->events);
  }
  /* t counts from the first event, the reservation (run.c): its t is 0 exactly, on the
   * admitting node and on a node that claims the run and rebuilds it alike. */
  int64_t now_ms = eph_now_ms();
  if (run->n_events == 0)
    run->start_ms = now_ms;
  eph_event_t *ev = &run->events[run->n_events];
  *ev = (eph_event_t){
      .seq = (int64_t)run->n_events + 1,
      .t_ms = now_ms - run->start_ms,
      .source = eph_xstrdup(source),
      .kind = eph_xstrdup(kind),
      .text = utf8_copy(text ? text : ""),
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

void
eph_run_emit(eph_run_t *run, const char *source, const char *kind, bool content, json_object *data,
             const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  char *text = NULL;
  if (vasprintf(&text, fmt, ap) < 0)
    text = NULL;
  va_end(ap);
  eph_run_emit_full(run, source, kind, text ? text : "", data, content);
  free(text);
  if (data)
    json_object_put(data);
}

void
eph_run_notify_update(eph_run_t *run)
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

void
eph_run_set_end(eph_run_t *run, eph_run_status_t s, const char *reason, const char *error)
{
  pthread_mutex_lock(&run->lock);
  if (run->status == EPH_RUN_RUNNING || run->status == EPH_RUN_QUEUED) {
    run->status = s;
    snprintf(run->reason, sizeof run->reason, "%s", reason);
    free(run->error);
    /* A plugin's message (a provider's error body) may hold bytes that are not UTF-8. */
    run->error = error ? utf8_copy(error) : NULL;
  }
  pthread_mutex_unlock(&run->lock);
}

/* failed/storage_error with the first storage error as the run's error. */
void
eph_run_set_end_storage(eph_run_t *run)
{
  pthread_mutex_lock(&run->lock);
  char msg[sizeof run->storage_error];
  snprintf(msg, sizeof msg, "%s", run->storage_error);
  pthread_mutex_unlock(&run->lock);
  eph_run_set_end(run, EPH_RUN_FAILED, "storage_error", msg);
}

void
eph_run_set_observer(eph_run_t *run, const eph_run_observer_t *obs)
{
  eph_run_set_observer_after(run, obs, 0);
}

void
eph_run_sync_events(eph_run_t *run)
{
  pthread_mutex_lock(&run->emit_lock);
  if (run->obs.on_sync)
    run->obs.on_sync(run->obs.opaque, run);
  pthread_mutex_unlock(&run->emit_lock);
}

void
eph_run_set_observer_after(eph_run_t *run, const eph_run_observer_t *obs, int64_t after_seq)
{
  run->obs = *obs;
  for (size_t i = after_seq > 0 ? (size_t)after_seq : 0; i < run->n_events; i++)
    if (run->obs.on_event)
      run->obs.on_event(run->obs.opaque, run, &run->events[i]);
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

int64_t
eph_run_created_us(const eph_run_t *run)
{
  return run->created_us;
}

bool
eph_run_zdr(const eph_run_t *run)
{
  return run->req.zero_data_retention;
}

int64_t
eph_run_event_flush_ms(const eph_run_t *run)
{
  return run->event_flush_ms;
}

eph_run_status_t
eph_run_status(eph_run_t *run)
{
  pthread_mutex_lock(&run->lock);
  eph_run_status_t s = run->status;
  pthread_mutex_unlock(&run->lock);
  return s;
}

void
eph_run_usage(eph_run_t *run, eph_run_usage_t *out)
{
  pthread_mutex_lock(&run->lock);
  *out = (eph_run_usage_t){
      .model_calls = run->model_calls,
      .input_tokens = run->input_tokens,
      .output_tokens = run->output_tokens,
      .reserved_micros = run->reserved,
      .billed_micros = run->billed,
      .released_micros = run->released,
      .model_micros = run->model_micros,
      .web_micros = run->web_micros,
      .compute_micros = run->compute_micros,
  };
  pthread_mutex_unlock(&run->lock);
}

bool
eph_run_settled(eph_run_t *run)
{
  pthread_mutex_lock(&run->lock);
  bool s = run->settled;
  pthread_mutex_unlock(&run->lock);
  return s;
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
