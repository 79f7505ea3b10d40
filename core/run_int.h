/* Internals of a run, shared by the units that make it up (not used outside them):
 *
 *   run.c       the state machine: create and reserve, execute, end, settle, free
 *   run_state.c status, end state, events and observer, cancel, accessors (the lowest unit:
 *               every other unit of the run may call it, it calls none of them)
 *   agent.c     the agent loop: model calls, tool calls, when to stop
 *   meter.c     money: prices, capped charges to the ledger, the compute meter
 *   tools.c     the tool index: which loaded plugin serves which tool; one tool call
 *   run_egress.c the per-run web egress proxy (web charges, egress events)
 *   run_json.c  the run and its events as JSON (API, store, CLI)
 *   host.c      the host services table plugins call back into (emit, charge, sandbox_*)
 *
 * Lock order (see docs/ARCHITECTURE.md): emit_lock before lock; no plugin call, no disk
 * I/O and no other run's lock while `lock` is held. */
#ifndef EPH_RUN_INT_H
#define EPH_RUN_INT_H

#include <stdatomic.h>
#include <stdio.h>

#include "egress.h"
#include "gate.h"
#include "live.h"
#include "run.h"
#include "sandbox.h"

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
  /* Serialises the run's charges (meter.c): held across the ledger call so a charge's
   * check and its write are one step, while `lock` is not (readers never wait on disk). */
  pthread_mutex_t money_lock;
  pthread_cond_t cond; /* broadcast on every event, the end, a cancel (with `lock`) */
  /* The compute meter's own wake-up (with `lock`): a charge (the cap may be closer) or the
   * stop. Not `cond`: waking the meter thread on each of a call's events cost a context
   * switch per event for nothing. */
  pthread_cond_t meter_cond;
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
  char *model_call_name;    /* what the model plugin is asked for (may be "replay:...") */
  eph_live_t live;          /* the running command's live output (live.h) */
  eph_live_t delta;         /* the running model call's streamed text (model_delta) */
  int64_t delta_step;       /* its model call number */
  int64_t delta_attempt;    /* its attempt (1 + retries so far): a retry discards the text */
  const char *live_call_id; /* the tool call running, borrowed for its duration */
  const char *live_source;  /* its timeline source ("Shell") */
  char *replayed_from;      /* the transcript answering the model calls, NULL for a real model */
  char *recorded_model;     /* the model the transcript recorded (see note_replay) */
  char *backend_name;
  eph_sbx_t *sbx;

  /* Usage and money (micros). billed mirrors the ledger's accepted charges. */
  int64_t model_calls, input_tokens, output_tokens;
  int64_t reserved, billed, released, model_micros, web_micros, compute_micros;
  int64_t in_price_mtok, out_price_mtok, compute_price_s, meter_ms;
  int64_t event_flush_ms; /* config event_flush_ms: the store's batches (evqueue.h) */
  int64_t cache_read_price_mtok, cache_write_price_mtok; /* cached prompt tokens */
  int64_t max_steps, max_output_tokens;
  int64_t max_output_files_bytes;   /* request.outputs: all files together (conf_core.h) */
  int64_t max_stored_results_bytes; /* tool_result events' data, all together (conf_core.h) */
  int64_t stored_results_bytes;     /* what they hold so far (the agent loop's thread) */

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

static inline const eph_ledger_ops_t *
eph_run_ledger_ops(eph_run_t *run)
{
  return run->ledger->desc->ops;
}

/* run_state.c: events and end states. */
/* Appends an event (text copied, data referenced) and hands it to the observer, in seq
 * order, from any thread. */
void eph_run_emit_full(eph_run_t *run, const char *source, const char *kind, const char *text,
                       json_object *data, bool content);
/* The same with printf text; takes ownership of data (may be NULL). */
void eph_run_emit(eph_run_t *run, const char *source, const char *kind, bool content,
                  json_object *data, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
void eph_run_notify_update(eph_run_t *run);
/* Sets the end state unless one is set already (the first cause wins). */
void eph_run_set_end(eph_run_t *run, eph_run_status_t s, const char *reason, const char *error);
/* failed/storage_error with the first storage error as the run's error. */
void eph_run_set_end_storage(eph_run_t *run);

/* meter.c: money. All amounts in micros. */
/* Reads the core's [pricing] for the run's model into run->*_price_*. */
int eph_meter_prices(eph_run_t *run, eph_error_t *err);
/* Charges up to `micros`; when that would pass the reservation, charges what is left and
 * flags the budget as exhausted. Returns the micros actually charged. */
int64_t eph_meter_charge(eph_run_t *run, eph_cost_t cat, int64_t micros, const char *memo);
/* Charges exactly `micros` or nothing: -EPH_E_BUDGET (budget flagged exhausted) when it does
 * not fit, -EIO when the ledger could not record it. */
int eph_meter_charge_exact(eph_run_t *run, eph_cost_t cat, int64_t micros, const char *memo,
                           eph_error_t *err);
/* Micros of the reservation not yet billed. */
int64_t eph_meter_remaining(eph_run_t *run);
/* Micros of one model call, rounded up, saturating at INT64_MAX. */
int64_t eph_meter_model_cost(const eph_run_t *run, const eph_model_response_t *resp);
/* The compute meter: charges while the sandbox lives (start when it is ready, stop before
 * it is destroyed; stop charges the last interval). */
void eph_meter_start(eph_run_t *run);
void eph_meter_stop(eph_run_t *run);

/* tools.c: the tool index. */
typedef struct eph_tool_ref {
  const eph_plugin_slot_t *slot;
  const eph_tool_def_t *def;
} eph_tool_ref_t;
/* The one walk over the loaded tools: every tool of every loaded tool plugin that can be
 * called, in load order. Start with *cursor = 0; false when there are no more. */
bool eph_tools_next(const eph_ctx_t *ctx, size_t *cursor, eph_tool_ref_t *out);
/* Whether a run of req needs plugin block `block` if it is a tool plugin: a shipped tool
 * plugin only when its permission row is granted; any other block name: true. */
bool eph_tools_block_wanted(const char *block, const eph_request_t *req);
/* In a lazy context: loads the enabled tool-plugin blocks not loaded yet that a run of req
 * needs (eph_tools_block_wanted), or all of them when req is NULL. Load errors are logged.
 * Returns how many were loaded (0 in an eager context). */
int eph_tools_load_blocks(eph_ctx_t *ctx, const eph_request_t *req);
/* Refuses (EINVAL naming the field) a granted permission no loaded plugin serves. */
int eph_tools_check_grants(const eph_ctx_t *ctx, const eph_gate_t *g, eph_error_t *err);
/* The tools the permission table grants, in the model's function-tool shape (new ref). */
json_object *eph_tools_offered(eph_run_t *run);
/* Runs one tool call (the model's tool_calls[i]) through the gate; appends the tool
 * message to `messages`. */
void eph_tools_call(eph_run_t *run, json_object *tc, json_object *messages);

/* agent.c: the loop; returns with the end state set. */
void eph_agent_loop(eph_run_t *run);

/* run_egress.c: what a run with `web` needs for its sandbox's one way out (egress.h). */
typedef struct eph_run_egress {
  eph_run_t *run;
  eph_egress_t *proxy;
  eph_net_policy_t policy;
  int64_t price_micros; /* per connection: egress.price_micros_per_request */
  /* Connections that cost the run nothing (refused, or allowed at price 0), counted from
   * the proxy's threads: past EPH_EGRESS_UNCHARGED_EVENTS they get no event of their own. */
  atomic_int_fast64_t uncharged;
} eph_run_egress_t;
/* Uncharged connections shown one `egress` event each; the rest are counted in one
 * `egress_dropped` event when the proxy stops. Charged ones are all shown (the budget
 * bounds them). */
#define EPH_EGRESS_UNCHARGED_EVENTS 256
/* Starts the run's proxy and points the spec at it. On failure the sandbox gets no
 * network (fail closed) and the timeline says why. */
void eph_run_egress_start(eph_run_egress_t *eg, eph_sandbox_spec_t *spec, const char *source);
void eph_run_egress_stop(eph_run_egress_t *eg);

/* run_json.c */
/* Events with seq > after_seq as a new JSON array; run->lock held. */
json_object *eph_run_events_locked(eph_run_t *run, int64_t after_seq);

#endif
