/* A run and its events as JSON: the API's run object, the timeline, what the store keeps. */
#include <config.h>

#include <string.h>
#include <time.h>

#include "run_int.h"
#include "util.h"

/* An event's time, milliseconds since the run's start, as the API's seconds: a number
 * written as the decimal it is ("0.004", "1.5", "2.0"), whatever process renders it. A plain
 * double is printed with json-c's global format, "%.17g" ("0.0040000000000000001") unless
 * the process changed it, as ephemerald does: `runs show` printed other digits than
 * GET /v1/runs/{id} for the same run (tests/daemon.test). */
static json_object *
seconds_json(int64_t t_ms)
{
  char text[32];
  double s = (double)t_ms / 1000.0;
  int n = snprintf(text, sizeof text, "%.15g", s);
  /* A whole number keeps its ".0", as json-c writes a double ("3.0", not "3"). */
  if (n > 0 && (size_t)n + 2 < sizeof text && !strpbrk(text, ".e"))
    memcpy(text + n, ".0", 3);
  return json_object_new_double_s(s, text);
}

json_object *
eph_event_to_json(const eph_event_t *ev, bool redact)
{
  json_object *o = json_object_new_object();
  json_object_object_add(o, "seq", json_object_new_int64(ev->seq));
  json_object_object_add(o, "t", seconds_json(ev->t_ms));
  json_object_object_add(o, "source", json_object_new_string(ev->source));
  json_object_object_add(o, "kind", json_object_new_string(ev->kind));
  bool hide = redact && ev->content;
  json_object_object_add(
      o, "text", json_object_new_string(hide ? "[redacted: zero data retention]" : ev->text));
  if (ev->data && !hide)
    json_object_object_add(o, "data", json_object_get(ev->data));
  return o;
}

void
eph_run_json_money(json_object *o, const eph_ledger_totals_t *t)
{
  json_object_object_add(o, "reserved_micros", json_object_new_int64(t->reserved_micros));
  json_object_object_add(o, "billed_micros", json_object_new_int64(t->billed_micros));
  json_object_object_add(o, "released_micros", json_object_new_int64(t->released_micros));
  json_object_object_add(o, "model_micros", json_object_new_int64(t->model_micros));
  json_object_object_add(o, "web_micros", json_object_new_int64(t->web_micros));
  json_object_object_add(o, "compute_micros", json_object_new_int64(t->compute_micros));
}

json_object *
eph_run_events_locked(eph_run_t *run, int64_t after_seq)
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
  json_object *a = eph_run_events_locked(run, after_seq);
  pthread_mutex_unlock(&run->lock);
  return a;
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
  eph_format_iso8601(run->created_us, created, sizeof created);
  json_object_object_add(o, "created_at", json_object_new_string(created));
  json_object_object_add(o, "organisation", json_object_new_string(run->org));
  json_object_object_add(o, "backend", json_object_new_string(run->backend_name));
  json_object_object_add(o, "request", eph_request_to_json(&run->req));
  /* The model that answered: the transcript's recorded one when the run was replayed. */
  json_object_object_add(o, "model",
                         json_object_new_string(run->recorded_model ? run->recorded_model
                                                : run->req.model    ? run->req.model
                                                                    : ""));
  json_object_object_add(o, "replayed", json_object_new_boolean(run->replayed_from != NULL));
  if (run->replayed_from)
    json_object_object_add(o, "transcript", json_object_new_string(run->replayed_from));
  if (include_events)
    json_object_object_add(o, "events", eph_run_events_locked(run, 0));
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
  eph_run_json_money(u, &(eph_ledger_totals_t){.reserved_micros = run->reserved,
                                               .billed_micros = run->billed,
                                               .released_micros = run->released,
                                               .model_micros = run->model_micros,
                                               .web_micros = run->web_micros,
                                               .compute_micros = run->compute_micros});
  json_object_object_add(o, "usage", u);
  pthread_mutex_unlock(&run->lock);
  return o;
}

/* ------------------------------------------------------------------ stored runs in the API's shape
 * Pure conversions of a store row (no run in memory): the daemon's GET of a stored run, its
 * lists, streams and webhooks, and `ephemeral runs show` all render a stored run here. */

json_object *
eph_event_json_from_store(json_object *e)
{
  json_object *o = json_object_new_object(), *v = NULL;
  int64_t t_ms = json_object_object_get_ex(e, "t_ms", &v) ? json_object_get_int64(v) : 0;
  json_object_object_add(o, "seq",
                         json_object_new_int64(json_object_object_get_ex(e, "seq", &v)
                                                   ? json_object_get_int64(v)
                                                   : 0));
  json_object_object_add(o, "t", seconds_json(t_ms));
  static const char *const keys[] = {"source", "kind", "text", "data"};
  for (size_t i = 0; i < 4; i++)
    if (json_object_object_get_ex(e, keys[i], &v))
      json_object_object_add(o, keys[i], json_object_get(v));
  return o;
}

json_object *
eph_run_json_from_store(json_object *row, json_object *events)
{
  json_object *o = json_object_new_object(), *v = NULL, *usage = NULL;
  json_object_object_get_ex(row, "usage", &usage);
  json_object_object_add(o, "id", json_object_get(json_object_object_get(row, "id")));
  json_object_object_add(o, "object", json_object_new_string("run"));
  json_object_object_add(o, "status", json_object_get(json_object_object_get(row, "status")));
  if (usage && json_object_object_get_ex(usage, "reason", &v))
    json_object_object_add(o, "reason", json_object_get(v));
  if (usage && json_object_object_get_ex(usage, "error", &v))
    json_object_object_add(o, "error", json_object_get(v));
  char created[40];
  eph_format_iso8601(json_object_object_get_ex(row, "created_at_us", &v) ? json_object_get_int64(v)
                                                                         : 0,
                     created, sizeof created);
  json_object_object_add(o, "created_at", json_object_new_string(created));
  json_object_object_add(o, "organisation", json_object_get(json_object_object_get(row, "org")));
  /* The facts of the run the executing node keeps in usage (core/runstore.c), in the places
   * and order of the live object (eph_run_to_json): any node answers the same object. A row
   * no node has run yet has no backend; its model is the one requested. */
  if (usage && json_object_object_get_ex(usage, "backend", &v))
    json_object_object_add(o, "backend", json_object_get(v));
  json_object *request = NULL, *model = NULL;
  if (json_object_object_get_ex(row, "request", &request))
    json_object_object_add(o, "request", json_object_get(request));
  if ((usage && json_object_object_get_ex(usage, "model", &model)) ||
      (request && json_object_object_get_ex(request, "model", &model)))
    json_object_object_add(o, "model", json_object_get(model));
  bool replayed =
      usage && json_object_object_get_ex(usage, "replayed", &v) && json_object_get_boolean(v);
  json_object_object_add(o, "replayed", json_object_new_boolean(replayed));
  if (replayed && json_object_object_get_ex(usage, "transcript", &v))
    json_object_object_add(o, "transcript", json_object_get(v));
  if (events) {
    json_object *a = json_object_new_array();
    for (size_t i = 0; i < json_object_array_length(events); i++)
      json_object_array_add(a, eph_event_json_from_store(json_object_array_get_idx(events, i)));
    json_object_object_add(o, "events", a);
  }
  if (json_object_object_get_ex(row, "output", &v) && v)
    json_object_object_add(o, "output", json_object_get(v));
  else if (json_object_object_get_ex(row, "request", &v))
    json_object_object_add(o, "output", json_object_new_object());
  json_object *u = json_object_new_object();
  static const char *const lifted[] = {"reason", "error",    "backend",
                                       "model",  "replayed", "transcript"};
  if (usage) {
    json_object_object_foreach(usage, k, uv) {
      size_t i = 0;
      while (i < sizeof lifted / sizeof lifted[0] && strcmp(k, lifted[i]) != 0)
        i++;
      if (i == sizeof lifted / sizeof lifted[0])
        json_object_object_add(u, k, json_object_get(uv));
    }
  }
  json_object_object_add(o, "usage", u);
  return o;
}
