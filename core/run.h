/* A run: one request executed end to end. The state machine:
 *
 *   queued ─► (reserve) ─► running: sandbox ready ─► agent loop ─► sandbox destroyed
 *          ─► ended (exactly one terminal event: succeeded | failed | timed_out |
 *             budget_exhausted | cancelled, with a reason) ─► settled (billed + released
 *             = reserved; always the last event)
 *
 * The gate is consulted before every tool call and every model call together with the
 * deadline and the remaining reservation; compute is charged while the sandbox lives.
 * Everything observable is an event {seq, t, source, kind, text, data}. */
#ifndef EPH_RUN_H
#define EPH_RUN_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <ephemeral/plugin.h>

#include "context.h"
#include "request.h"

typedef enum eph_run_status {
  EPH_RUN_QUEUED = 0,
  EPH_RUN_RUNNING,
  EPH_RUN_SUCCEEDED,
  EPH_RUN_FAILED,
  EPH_RUN_TIMED_OUT,
  EPH_RUN_BUDGET_EXHAUSTED,
  EPH_RUN_CANCELLED,
} eph_run_status_t;

/* "queued", "running", "succeeded", ... */
const char *eph_run_status_name(eph_run_status_t s);
/* CLI exit code per end state: 0 succeeded, 1 failed, 3 timed_out, 4 budget_exhausted,
 * 5 cancelled (2 is kept for usage and request errors). */
int eph_run_status_exit_code(eph_run_status_t s);

/* One timeline event. Strings owned by the event. */
typedef struct eph_event {
  int64_t seq;       /* 1, 2, 3, ... per run, monotonic */
  int64_t t_ms;      /* milliseconds since the run was queued */
  char *source;      /* the timeline's source column: "Queued", "Sandbox", "Shell", ... */
  char *kind;        /* machine word: reserved, sandbox_ready, worker_started, model_call,
                        tool_call, tool_result, denied, sandbox_destroyed, ended, settled */
  char *text;        /* one line for people */
  json_object *data; /* details, or NULL; owned */
  bool content;      /* text/data carry run content (prompt, commands, outputs): redacted on
                        disk under zero data retention */
} eph_event_t;

/* Callbacks the owner of a run installs (CLI printing, store persistence, SSE wake-ups).
 * Called on the run's thread, in seq order, with the run's lock NOT held. */
typedef struct eph_run_observer {
  void (*on_event)(void *opaque, eph_run_t *run, const eph_event_t *ev);
  /* Status or usage changed (after ended/settled too). */
  void (*on_update)(void *opaque, eph_run_t *run);
  /* Makes every event seen by on_event so far durable (the store's batches, evqueue.h),
   * before they are shown outside this process (eph_run_sync_events). May be NULL. Called
   * with the run's emit lock held, from any thread. */
  void (*on_sync)(void *opaque, eph_run_t *run);
  void *opaque;
} eph_run_observer_t;

typedef struct eph_run_options {
  const char *org;            /* organisation billed */
  const char *run_id;         /* NULL = a fresh "run_" + 32 hex */
  const char *backend;        /* NULL = config `backend` */
  const char *model_override; /* CLI --replay: "replay:PATH" */
  const char *record_path;    /* CLI --record: append raw model responses (JSONL) */
  eph_run_observer_t observer;
  /* > 0: this run's budget is already reserved in the ledger, for this org and run_id, by
   * the cluster node that admitted it (the shared queue, docs/cluster.md): eph_run_new
   * makes no second reservation and rebuilds the `reserved` event (seq 1, already stored)
   * in memory only. Must equal the request's max_cost_micros. 0: reserve here. */
  int64_t adopt_reserved_micros;
  int64_t created_us; /* with adopt_reserved_micros: the stored run's creation time */
} eph_run_options_t;

/* A lazy context (eph_ctx_options_t.lazy_plugins: the CLI's `run`) loads the plugins one
 * run uses instead of every enabled one (each costs its dynamic linking: tool-web pulls in
 * libcurl and ~25 libraries): every block but the backends (eph_ctx_backend loads the one
 * used), the tools and the models; the shipped tool plugins (tool-shell, tool-web,
 * tool-file, tool-connection) only when req grants their row, other tool plugins always
 * (what they serve is known once loaded); model-replay alone for a "replay:" model, else
 * every model plugin (routing asks each). Then completes the runs of dead processes
 * (eph_runstore_recover), as eph_ctx_open does when it loads everything.
 * req == NULL: loads the tool plugins still missing (a model asked for a tool no loaded
 * plugin serves: its answer must not depend on what was left out).
 * Returns how many plugins were loaded (0 when ctx is not lazy). A plugin that does not
 * load is logged and counted in ctx->plugins.refused, as at start-up; the run's own checks
 * then name what is missing (no ledger, a granted row no plugin serves). */
int eph_run_load_plugins(eph_ctx_t *ctx, const eph_request_t *req, const char *model);

/* Creates a run for a parsed request; takes ownership of *req (zeroed). The ledger
 * reservation is made here: on -EPH_E_INSUFFICIENT (balance) or any other error nothing is
 * reserved and *out stays NULL. Free with eph_run_free() after eph_run_execute(). */
int eph_run_new(eph_ctx_t *ctx, eph_request_t *req, const eph_run_options_t *opt, eph_run_t **out,
                eph_error_t *err);

/* Installs (replaces) the observer and replays the events emitted so far to it (the
 * reservation event), so an observer installed after eph_run_new — e.g. once the store row
 * exists — misses nothing. Call before eph_run_execute / eph_run_abandon. */
void eph_run_set_observer(eph_run_t *run, const eph_run_observer_t *obs);

/* Returns once every event the run has emitted is in the store (or the write failed and
 * the run has its storage error): called before a live run's events leave the process (an
 * API answer, an SSE batch), so a client never holds an event a kill -9 could lose, whose
 * seq the recovered record would then give to another event. Takes the run's emit lock
 * (an event half-way through emit is finished first): call it with no other lock held. */
void eph_run_sync_events(eph_run_t *run);
/* The same, replaying only the events after after_seq (those the observer has not seen:
 * an adopted run's stored `reserved` event is not stored twice). */
void eph_run_set_observer_after(eph_run_t *run, const eph_run_observer_t *obs, int64_t after_seq);

/* Gives up a run that was admitted and queued here but is executed by whichever cluster
 * node claims it (docs/cluster.md): its reservation and record now belong to that node, so
 * this process forgets it without settling, and removes its crash-recovery lock file (its
 * reconciler must not settle it). Then eph_run_free. */
void eph_run_disown(eph_run_t *run);

/* Executes the run to its end on the calling thread (sandbox, agent loop, destroy, settle).
 * Returns the final status. */
eph_run_status_t eph_run_execute(eph_run_t *run);

/* Ends a queued run without executing it (daemon drain): terminal `cancelled`, settled. */
void eph_run_abandon(eph_run_t *run, const char *reason);

/* Reports that a write of the run's record (store) or money (ledger) failed (thread-safe;
 * message borrowed, the first one is kept). The run stops at once and ends `failed` with
 * reason `storage_error`, unless its ended event was already stored; its lock file is then
 * left for the reconciler (eph_runstore_recover) to complete the record and settle. */
void eph_run_storage_failed(eph_run_t *run, const char *message);

/* Asks the run to stop (thread-safe, async-signal-unsafe): ends as cancelled. */
void eph_run_cancel(eph_run_t *run);

void eph_run_free(eph_run_t *run);

/* Accessors (thread-safe). */
const char *eph_run_id(const eph_run_t *run);
const char *eph_run_org(const eph_run_t *run);
/* When the run was created (its created_at), CLOCK_REALTIME micros. */
int64_t eph_run_created_us(const eph_run_t *run);
eph_run_status_t eph_run_status(eph_run_t *run);
bool eph_run_zdr(const eph_run_t *run);
/* How long its events may wait to be committed to the store together (config event_flush_ms;
 * evqueue.h). */
int64_t eph_run_event_flush_ms(const eph_run_t *run);

/* What a run has used so far; after settle, the ledger's totals. Micros throughout. */
typedef struct eph_run_usage {
  int64_t model_calls, input_tokens, output_tokens;
  int64_t reserved_micros, billed_micros, released_micros;
  int64_t model_micros, web_micros, compute_micros;
} eph_run_usage_t;
/* A consistent snapshot (thread-safe). */
void eph_run_usage(eph_run_t *run, eph_run_usage_t *out);
/* The run object: id, status, reason, created_at, request, events, output, usage.
 * New reference owned by the caller. include_events=false omits "events". */
json_object *eph_run_to_json(eph_run_t *run, bool include_events);
/* Copies of events with seq > after_seq into a new JSON array (owned by the caller). */
json_object *eph_run_events_json(eph_run_t *run, int64_t after_seq);
/* Blocks until an event with seq > after_seq exists, the run has settled, or timeout_ms
 * passes. Returns true when there is something new or the run is over. */
bool eph_run_wait_events(eph_run_t *run, int64_t after_seq, int timeout_ms);
bool eph_run_settled(eph_run_t *run);

/* An event as JSON {seq, t, source, kind, text, data}; redact drops content (ZDR on disk).
 * New reference. */
json_object *eph_event_to_json(const eph_event_t *ev, bool redact);

/* A stored run in the API's run shape, the same keys and order eph_run_to_json gives a run in
 * memory: row as eph_store_run_get returns it (id, org, status, created_at_us, request,
 * output, usage: the facts runstore.c keeps in usage are lifted to their places), events
 * (or NULL: no "events" key) as eph_store_events_since returns them, each converted by
 * eph_event_json_from_store. Both borrowed; new reference owned by the caller. What GET
 * /v1/runs/{id} answers for a run no longer in memory, and what `ephemeral runs show`
 * prints. */
json_object *eph_run_json_from_store(json_object *row, json_object *events);
/* A stored event ({seq, t_ms, source, kind, text, data}, borrowed) as the API's event
 * ({seq, t (seconds), source, kind, text, data}). New reference. */
json_object *eph_event_json_from_store(json_object *stored);

/* Adds a run's money as the API and the timeline name it to the object o: reserved_micros,
 * billed_micros, released_micros, model_micros, web_micros, compute_micros (t's fields). */
void eph_run_json_money(json_object *o, const eph_ledger_totals_t *t);

/* Fills the per-run services of the host table (emit, charge, sandbox_*). */
void eph_run_host_services(eph_host_t *host);

#endif
