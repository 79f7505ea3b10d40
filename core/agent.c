/* The agent loop: ask the model, run the tool calls it makes through the gate, until it
 * answers or something stops the run (cancel, deadline, budget, storage, step limit). */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "log.h"
#include "run_int.h"
#include "util.h"

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
    run->replayed_from =
        line ? eph_xasprintf("%.*s", (int)(line - resp->replayed_from), resp->replayed_from)
             : eph_xstrdup(resp->replayed_from);
  }
  if (!run->recorded_model && resp->recorded_model[0])
    run->recorded_model = eph_xstrdup(resp->recorded_model);
  pthread_mutex_unlock(&run->lock);
  snprintf(buf, size, " · replayed from %s", resp->replayed_from);
  return buf;
}

/* ------------------------------------------------------------------ streamed model text */

/* One coalesced `model_delta` event: the streamed text of the running model call. */
static void
delta_emit(void *opaque, int stream, const char *text, size_t bytes, uint64_t dropped_bytes)
{
  eph_run_t *run = opaque;
  json_object *d = json_object_new_object();
  json_object_object_add(d, "call", json_object_new_int64(run->delta_step));
  json_object_object_add(d, "attempt", json_object_new_int64(run->delta_attempt));
  if (stream) {
    json_object_object_add(d, "bytes", json_object_new_int64((int64_t)bytes));
    eph_run_emit_full(run, "Model", "model_delta", text, d, true);
  } else {
    json_object_object_add(d, "dropped_bytes", json_object_new_int64((int64_t)dropped_bytes));
    char marker[96];
    snprintf(marker, sizeof marker, "[... %" PRIu64 " bytes of model text not shown live]",
             dropped_bytes);
    eph_run_emit_full(run, "Model", "model_delta", marker, d, true);
  }
  json_object_put(d);
}

/* eph_model_request_t.on_delta: a piece of the answer's text as the provider streams it.
 * Model text is content: nothing under zero data retention. Text NULL: the provider retries
 * the call; what the failed attempt streamed is flushed and declared discarded by a
 * `model_retry` event, and the retry's deltas carry the next attempt number, so a reader
 * of the timeline never joins two attempts' text into one answer. */
static void
model_delta(void *opaque, const char *text, size_t bytes)
{
  eph_run_t *run = opaque;
  if (!text) {
    eph_live_end(&run->delta, delta_emit, run);
    json_object *d = json_object_new_object();
    json_object_object_add(d, "call", json_object_new_int64(run->delta_step));
    json_object_object_add(d, "attempt", json_object_new_int64(run->delta_attempt + 1));
    eph_run_emit(run, "Model", "model_retry", false, d,
                 "model call %" PRId64 ": attempt %" PRId64
                 " failed and is retried; any text it streamed is discarded",
                 run->delta_step, run->delta_attempt);
    run->delta_attempt++;
    eph_live_begin(&run->delta, 0);
    return;
  }
  if (!run->req.zero_data_retention)
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
  run->delta_attempt = 1;
  eph_live_begin(&run->delta, 0);
  int r = EPH_WITH_PLUGIN(run->model, mops->complete(run->model->state, mreq, resp, err));
  eph_live_end(&run->delta, delta_emit, run);
  return r;
}

/* ------------------------------------------------------------------ the loop */

/* Ends the loop for a storage failure, cancellation, deadline or budget; true when it
 * did. */
static bool
check_stop(eph_run_t *run)
{
  if (atomic_load(&run->storage_failed)) {
    eph_run_set_end_storage(run);
    return true;
  }
  if (atomic_load(&run->cancel)) {
    eph_run_set_end(run, EPH_RUN_CANCELLED, "cancelled", NULL);
    return true;
  }
  if (atomic_load(&run->budget_exhausted)) {
    eph_run_set_end(run, EPH_RUN_BUDGET_EXHAUSTED, "budget_exhausted", NULL);
    return true;
  }
  if (eph_now_ms() >= run->deadline_ms) {
    eph_run_set_end(run, EPH_RUN_TIMED_OUT, "timeout", NULL);
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

void
eph_agent_loop(eph_run_t *run)
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
  cleanup_json json_object *tools = eph_tools_offered(run);
  const eph_model_ops_t *mops = run->model->desc->ops;
  /* The conversation's length as JSON, kept as messages are appended (they are not changed
   * once in the array): serialising the whole of it before every model call, only to
   * measure it, made a run's cost grow with the square of its tool calls. */
  size_t wire_bytes = 2, counted = 0; /* "[" "]" */

  for (int64_t step = 1;; step++) {
    if (check_stop(run))
      return;
    if (step > run->max_steps) {
      eph_run_set_end(run, EPH_RUN_FAILED, "step_limit", "the run reached its step limit");
      return;
    }
    /* Pre-authorisation at the worst case: the prompt as it stands (~1 token per 3 bytes,
     * rounded up) plus max output tokens; the output allowance shrinks to what the
     * remaining reservation can pay, and below a useful minimum the run stops. */
    for (size_t n = json_object_array_length(messages); counted < n; counted++) {
      size_t len = 0;
      json_object_to_json_string_length(json_object_array_get_idx(messages, counted),
                                        JSON_C_TO_STRING_PLAIN, &len);
      wire_bytes += len + (counted ? 1 : 0); /* "," between elements */
    }
    int64_t est_in = (int64_t)wire_bytes / 3 + 1;
    int64_t left = eph_meter_remaining(run);
    int64_t max_out = run->max_output_tokens;
    /* The prompt may be billed as a cache write (Anthropic: 1.25x input), so the estimate
     * takes the dearer of the two prices. */
    int64_t prompt_price = run->in_price_mtok > run->cache_write_price_mtok
                               ? run->in_price_mtok
                               : run->cache_write_price_mtok;
    int64_t in_cost_x = est_in * prompt_price; /* micros * 1e6 */
    if (run->out_price_mtok > 0) {
      int64_t affordable = (left * 1000000 - in_cost_x) / run->out_price_mtok;
      if (affordable < max_out)
        max_out = affordable;
    }
    if (max_out < MIN_OUTPUT_TOKENS || in_cost_x > left * 1000000) {
      eph_run_set_end(run, EPH_RUN_BUDGET_EXHAUSTED, "budget_exhausted",
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
        eph_run_set_end(run, EPH_RUN_TIMED_OUT, "timeout", err.message);
      else if (err.code == EPH_E_DIVERGED)
        eph_run_set_end(run, EPH_RUN_FAILED, "transcript_diverged", err.message);
      else
        eph_run_set_end(run, EPH_RUN_FAILED, "model_error", err.message);
      eph_run_emit(run, "Model", "model_error", false, NULL, "model call %" PRId64 " failed: %s",
                   step, err.message);
      return;
    }
    int64_t cost = eph_meter_model_cost(run, &resp);
    eph_meter_charge(run, EPH_COST_MODEL, cost, "model call");
    pthread_mutex_lock(&run->lock);
    run->model_calls++;
    run->input_tokens += (int64_t)resp.input_tokens;
    run->output_tokens += (int64_t)resp.output_tokens;
    pthread_mutex_unlock(&run->lock);
    if (run->record && resp.raw) {
      fprintf(run->record, "%s\n",
              json_object_to_json_string_ext(resp.raw, JSON_C_TO_STRING_PLAIN));
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
    eph_run_emit(run, "Model", "model_call", false, d,
                 "model call %" PRId64 "%s · %" PRIu64 " in / %" PRIu64 " out tokens", step,
                 replayed, resp.input_tokens, resp.output_tokens);
    eph_run_notify_update(run);

    json_object *msg = resp.message;
    json_object *tcs = NULL, *content = NULL;
    if (!msg || !json_object_is_type(msg, json_type_object)) {
      eph_model_response_clear(&resp);
      eph_run_set_end(run, EPH_RUN_FAILED, "model_error", "the model returned no message");
      return;
    }
    /* Everything the run keeps and shows of the model's turn comes from this message: a
     * string that is not valid UTF-8 (a raw 9B is a CSI to a terminal in an 8-bit mode)
     * went into the timeline, the record and every JSON rendering of them as it came
     * (json-c writes a string's bytes unchecked). Held here for every model plugin, not
     * only the shared wire code: the run fails, saying so. */
    const char *wire = json_object_to_json_string_ext(msg, JSON_C_TO_STRING_PLAIN);
    size_t bad = eph_utf8_invalid_at(wire, strlen(wire));
    if (bad != SIZE_MAX) {
      char why[128];
      snprintf(why, sizeof why,
               "the model's answer is not valid UTF-8 (byte %zu of its message): refused", bad);
      eph_model_response_clear(&resp);
      eph_run_set_end(run, EPH_RUN_FAILED, "model_error", why);
      eph_run_emit(run, "Model", "model_error", false, NULL, "model call %" PRId64 " failed: %s",
                   step, why);
      return;
    }
    json_object_array_add(messages, json_object_get(msg));
    json_object_object_get_ex(msg, "tool_calls", &tcs);
    json_object_object_get_ex(msg, "content", &content);
    size_t n_calls =
        tcs && json_object_is_type(tcs, json_type_array) ? json_object_array_length(tcs) : 0;
    if (n_calls == 0) {
      run->answer = eph_xstrdup(content && json_object_is_type(content, json_type_string)
                                    ? json_object_get_string(content)
                                    : "");
      eph_model_response_clear(&resp);
      bool refused = strcmp(resp.finish_reason, "content_filter") == 0;
      bool truncated = strcmp(resp.finish_reason, "length") == 0;
      /* A model plugin continues a paused turn itself (model-anthropic, up to its
       * max_continuations); a pause that still reaches the core is an unfinished turn. */
      bool paused = strcmp(resp.finish_reason, "pause_turn") == 0;
      if (atomic_load(&run->storage_failed))
        eph_run_set_end_storage(run);
      else if (atomic_load(&run->budget_exhausted))
        eph_run_set_end(run, EPH_RUN_BUDGET_EXHAUSTED, "budget_exhausted", NULL);
      else if (refused) /* Anthropic refusal, OpenAI content_filter: no answer was given */
        eph_run_set_end(run, EPH_RUN_FAILED, "refusal",
                        "the model refused to answer (stop reason: refusal / content filter)");
      else if (truncated) /* the text stopped at the output limit: not a whole answer */
        eph_run_set_end(run, EPH_RUN_FAILED, "max_tokens",
                        "the model's answer was cut off at its output token limit");
      else if (paused)
        eph_run_set_end(run, EPH_RUN_FAILED, "pause_limit",
                        "the model paused its turn (stop reason pause_turn) more often than the "
                        "model plugin continues one (model-anthropic: max_continuations)");
      else
        eph_run_set_end(run, EPH_RUN_SUCCEEDED, "final_answer", NULL);
      eph_model_response_clear(&resp);
      return;
    }
    /* Several calls per turn, as the product page's model does; each passes the gate. */
    for (size_t i = 0; i < n_calls; i++) {
      if (check_stop(run))
        break;
      eph_tools_call(run, json_object_array_get_idx(tcs, i), messages);
    }
    eph_model_response_clear(&resp);
  }
}
