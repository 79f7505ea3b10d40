/* The run state machine and the agent loop, without root: every end state, a denial, a
 * budget cut, a cancel, a timeout. The ledger is the real ledger-sqlite plugin (SQLite in a
 * temporary state directory); the backend, the model and the tool are fixtures compiled
 * into this program and put into the context's plugin table (in-process plugins):
 *
 *   backend-fixture  create() starts a thread that speaks the guest protocol (hello, bye)
 *                    on a socketpair: the core's real guest client and sandbox handle
 *   model-fixture    answers from a per-test script (final answer, tool calls, an error,
 *                    a token count the budget cannot pay, waiting for the deadline)
 *   tool-fixture     `echo` (shell row) and `fetch` (web row); counts its calls
 *
 * The ledger's charge can be made to fail (ledger_charge_fails: the ledger cannot record, as
 * on a full disk) through a wrapper of ledger-sqlite's own operations.
 *
 * Each test checks the run's end (status, reason), that the timeline has exactly one
 * `ended` and ends with `settled`, and that the ledger's billed + released = reserved.
 * Every end reason the core sets has a test: final_answer, denied calls, model_error,
 * step_limit, refusal, max_tokens, transcript_diverged, host_error (sandbox creation, file
 * placement), storage_error, budget_exhausted (cut, too small), cancelled (queued, before
 * and during execution, abandoned), timeout (model call, sandbox creation). */
#include <config.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "context.h"
#include "host.h"
#include "loader.h"
#include "log.h"
#include "protocol.h"
#include "run.h"
#include "util.h"

/* While mono_stepping is set each reading of CLOCK_MONOTONIC comes 1 ms after the last (a
 * loaded machine), for this program's own code (eph_now_ms is inline in the SDK). */
static atomic_bool mono_stepping;
static atomic_llong mono_extra_ns; /* kept after: the clock stays monotonic */

int
clock_gettime(clockid_t id, struct timespec *ts)
{
  int r = (int)syscall(SYS_clock_gettime, id, ts);
  long long step = id == CLOCK_MONOTONIC && atomic_load(&mono_stepping) ? 1000000 : 0;
  long long ns = ts->tv_nsec + (id == CLOCK_MONOTONIC ? atomic_fetch_add(&mono_extra_ns, step) : 0);
  ts->tv_sec += (time_t)(ns / 1000000000);
  ts->tv_nsec = (long)(ns % 1000000000);
  return r;
}

/* ------------------------------------------------------------------ backend-fixture */

typedef struct fixture_box {
  int fd;
  pthread_t guest;
} fixture_box_t;

static atomic_int backend_creates, backend_destroys, backend_fail;
enum { BACKEND_OK, BACKEND_FAILS, BACKEND_SLOW }; /* backend_fail */

/* The guest end: hello, then a `bye` for shutdown and a per-request error for anything
 * else; ends at shutdown or when the host closes the stream. */
static void *
fake_guest(void *arg)
{
  int fd = (int)(intptr_t)arg;
  json_object *hello = json_tokener_parse(
      "{\"type\":\"hello\",\"version\":1,\"kernel\":\"fixture\",\"scratch\":\"/fixture/scratch\","
      "\"uid\":1000,\"gid\":1000,\"pid1\":true,\"max_frame_bytes\":1048576}");
  eph_proto_write_frame(fd, hello);
  json_object_put(hello);
  eph_frame_reader_t rd = {0};
  for (;;) {
    json_object *msg = NULL;
    int r = eph_frame_reader_feed(&rd, fd, &msg);
    if (r < 0)
      break;
    if (r == 0)
      continue;
    const char *type = eph_json_get_string(msg, "type");
    int64_t id = 0;
    eph_proto_int(msg, "id", &id);
    bool bye = type && strcmp(type, "shutdown") == 0;
    if (type && strcmp(type, "kill") != 0) {
      json_object *reply = json_object_new_object();
      json_object_object_add(reply, "type", json_object_new_string(bye ? "bye" : "error"));
      json_object_object_add(reply, "id", json_object_new_int64(id));
      if (!bye) {
        json_object_object_add(reply, "errno", json_object_new_int(ENOSYS));
        json_object_object_add(reply, "message", json_object_new_string("fixture guest"));
      }
      eph_proto_write_frame(fd, reply);
      json_object_put(reply);
    }
    json_object_put(msg);
    if (bye)
      break;
  }
  eph_frame_reader_clear(&rd);
  close(fd);
  return NULL;
}

static int
backend_create(void *state, const eph_sandbox_spec_t *spec, eph_sandbox_t **sandbox, int *guest_fd,
               eph_error_t *err)
{
  (void)state;
  if (atomic_load(&backend_fail) == BACKEND_SLOW) {
    /* A backend that cannot start the sandbox before the run's deadline (a slow boot):
     * returns only once the deadline (CLOCK_MONOTONIC ms) has passed. */
    struct timespec ts = {.tv_sec = (spec->deadline_ms + 1) / 1000,
                          .tv_nsec = ((spec->deadline_ms + 1) % 1000) * 1000000};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
      ;
    return eph_error_set(err, ETIMEDOUT, "the fixture backend did not start in time");
  }
  if (atomic_load(&backend_fail))
    return eph_error_set(err, EIO, "the fixture backend was told to fail");
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
    return eph_error_set(err, errno, "socketpair: %s", strerror(errno));
  fixture_box_t *box = eph_xcalloc(1, sizeof *box);
  box->fd = sv[1];
  if (pthread_create(&box->guest, NULL, fake_guest, (void *)(intptr_t)sv[1]) != 0) {
    close(sv[0]);
    close(sv[1]);
    free(box);
    return eph_error_set(err, EAGAIN, "pthread_create");
  }
  atomic_fetch_add(&backend_creates, 1);
  *sandbox = (eph_sandbox_t *)box;
  *guest_fd = sv[0];
  return 0;
}

static int
backend_destroy(void *state, eph_sandbox_t *sandbox, eph_sandbox_report_t *report, eph_error_t *err)
{
  (void)state, (void)err;
  fixture_box_t *box = (fixture_box_t *)sandbox;
  /* The guest thread ends after `bye` or when the core closed its end. */
  shutdown(box->fd, SHUT_RDWR);
  pthread_join(box->guest, NULL);
  free(box);
  if (report) {
    report->processes_left = 0;
    report->files_left = 0;
  }
  atomic_fetch_add(&backend_destroys, 1);
  return 0;
}

static const eph_backend_ops_t backend_ops = {.struct_size = sizeof backend_ops,
                                              .source = "Sandbox",
                                              .noun = "sandbox",
                                              .create = backend_create,
                                              .destroy = backend_destroy};
static const eph_plugin_t backend_desc = {.abi_major = EPH_ABI_MAJOR,
                                          .abi_minor = EPH_ABI_MINOR,
                                          .struct_size = sizeof(eph_plugin_t),
                                          .name = "backend-fixture",
                                          .kind = EPH_KIND_BACKEND,
                                          .version = "0",
                                          .ops = &backend_ops};

/* ------------------------------------------------------------------ tool-fixture */

static atomic_int echo_calls, fetch_calls;
static sem_t tool_entered, tool_release;
static bool tool_blocks;

static int
tool_call(void *state, const eph_tool_call_t *call, json_object **result, eph_error_t *err)
{
  (void)state, (void)err;
  if (strcmp(call->tool, "fetch") == 0) {
    atomic_fetch_add(&fetch_calls, 1);
  } else {
    atomic_fetch_add(&echo_calls, 1);
    if (tool_blocks) {
      /* Holds the call until the test has cancelled the run (bounded). */
      sem_post(&tool_entered);
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_sec += 10;
      while (sem_timedwait(&tool_release, &ts) < 0 && errno == EINTR)
        ;
    }
  }
  *result = json_object_new_object();
  json_object_object_add(*result, "ok", json_object_new_boolean(1));
  return 0;
}

static const eph_tool_def_t tool_defs[] = {
    {"echo", "Echoes.", "{\"type\":\"object\"}", EPH_PERM_SHELL},
    {"fetch", "Fetches.", "{\"type\":\"object\"}", EPH_PERM_WEB},
    /* Provides the files row (a request with inline files needs one); never called. */
    {"put", "Puts a file.", "{\"type\":\"object\"}", EPH_PERM_FILES},
};
static const eph_tool_ops_t tool_ops = {
    .struct_size = sizeof tool_ops, .tools = tool_defs, .n_tools = 3, .call = tool_call};
static const eph_plugin_t tool_desc = {.abi_major = EPH_ABI_MAJOR,
                                       .abi_minor = EPH_ABI_MINOR,
                                       .struct_size = sizeof(eph_plugin_t),
                                       .name = "tool-fixture",
                                       .kind = EPH_KIND_TOOL,
                                       .version = "0",
                                       .ops = &tool_ops};

/* ------------------------------------------------------------------ model-fixture */

typedef enum script {
  ANSWER,             /* a final answer at once */
  TOOL_THEN_ANSWER,   /* echo, then the answer */
  DENIED_THEN_ANSWER, /* fetch (web, not granted) and echo in one turn, then the answer */
  ALWAYS_TOOL,        /* never stops asking for echo */
  MODEL_ERROR,        /* the provider fails */
  EXPENSIVE,          /* a token count the reservation cannot pay */
  SLOW,               /* returns only when the run's deadline has passed */
  REFUSAL,            /* an answer stopped by the provider's content filter */
  TRUNCATED,          /* an answer cut off at the output token limit */
  DIVERGED,           /* a replayed transcript no longer matches the run */
} script_t;

static script_t script;
static atomic_int model_calls;

static json_object *
tool_call_msg(const char *const *names, size_t n)
{
  json_object *calls = json_object_new_array();
  for (size_t i = 0; i < n; i++) {
    json_object *fn = json_object_new_object();
    json_object_object_add(fn, "name", json_object_new_string(names[i]));
    json_object_object_add(fn, "arguments", json_object_new_string("{}"));
    json_object *c = json_object_new_object();
    char id[16];
    snprintf(id, sizeof id, "call_%zu", i);
    json_object_object_add(c, "id", json_object_new_string(id));
    json_object_object_add(c, "type", json_object_new_string("function"));
    json_object_object_add(c, "function", fn);
    json_object_array_add(calls, c);
  }
  json_object *m = json_object_new_object();
  json_object_object_add(m, "role", json_object_new_string("assistant"));
  json_object_object_add(m, "tool_calls", calls);
  return m;
}

static json_object *
answer_msg(void)
{
  json_object *m = json_object_new_object();
  json_object_object_add(m, "role", json_object_new_string("assistant"));
  json_object_object_add(m, "content", json_object_new_string("done"));
  return m;
}

static int
model_complete(void *state, const eph_model_request_t *req, eph_model_response_t *resp,
               eph_error_t *err)
{
  (void)state;
  int call = atomic_fetch_add(&model_calls, 1) + 1;
  resp->input_tokens = 100;
  resp->output_tokens = 10;
  snprintf(resp->finish_reason, sizeof resp->finish_reason, "stop");
  static const char *const echo[] = {"echo"}, *const both[] = {"fetch", "echo"};
  switch (script) {
  case ANSWER:
    resp->message = answer_msg();
    break;
  case TOOL_THEN_ANSWER:
    resp->message = call == 1 ? tool_call_msg(echo, 1) : answer_msg();
    break;
  case DENIED_THEN_ANSWER:
    resp->message = call == 1 ? tool_call_msg(both, 2) : answer_msg();
    break;
  case ALWAYS_TOOL:
    resp->message = tool_call_msg(echo, 1);
    break;
  case MODEL_ERROR:
    return eph_error_set(err, EPH_E_UPSTREAM, "the fixture provider is down");
  case EXPENSIVE:
    resp->input_tokens = 1000000000;
    resp->message = answer_msg();
    break;
  case SLOW: {
    /* What a provider that does not answer in time does: the call ends at the deadline. */
    struct timespec ts = {.tv_sec = req->deadline_ms / 1000,
                          .tv_nsec = (req->deadline_ms % 1000) * 1000000};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
      ;
    return eph_error_set(err, ETIMEDOUT, "the fixture provider did not answer in time");
  }
  case REFUSAL:
    resp->message = answer_msg();
    snprintf(resp->finish_reason, sizeof resp->finish_reason, "content_filter");
    break;
  case TRUNCATED:
    resp->message = answer_msg();
    snprintf(resp->finish_reason, sizeof resp->finish_reason, "length");
    break;
  case DIVERGED:
    return eph_error_set(err, EPH_E_DIVERGED, "the fixture transcript does not match");
  }
  return 0;
}

static int
model_serves(void *state, const char *model)
{
  (void)state;
  return strncmp(model, "fixture/", 8) == 0 ? 9 : 0;
}

static const eph_model_ops_t model_ops = {
    .struct_size = sizeof model_ops, .complete = model_complete, .serves = model_serves};
static const eph_plugin_t model_desc = {.abi_major = EPH_ABI_MAJOR,
                                        .abi_minor = EPH_ABI_MINOR,
                                        .struct_size = sizeof(eph_plugin_t),
                                        .name = "model-fixture",
                                        .kind = EPH_KIND_MODEL,
                                        .version = "0",
                                        .ops = &model_ops};

/* ------------------------------------------------------------------ ledger wrapper */

/* ledger-sqlite's operations, but charge() fails as a ledger that cannot write does when
 * ledger_charge_fails is set. */
static atomic_bool ledger_charge_fails;
static const eph_ledger_ops_t *real_ledger_ops;
static eph_ledger_ops_t wrapped_ledger_ops;
static eph_plugin_t wrapped_ledger_desc;

static int
failing_charge(void *state, const char *run_id, eph_cost_t category, int64_t micros,
               const char *memo, eph_error_t *err)
{
  if (atomic_load(&ledger_charge_fails))
    return eph_error_set(err, EIO, "the fixture ledger cannot write (disk full)");
  return real_ledger_ops->charge(state, run_id, category, micros, memo, err);
}

static void
wrap_ledger(eph_plugin_slot_t *slot)
{
  real_ledger_ops = slot->desc->ops;
  wrapped_ledger_ops = *real_ledger_ops;
  wrapped_ledger_ops.charge = failing_charge;
  wrapped_ledger_desc = *slot->desc;
  wrapped_ledger_desc.ops = &wrapped_ledger_ops;
  slot->desc = &wrapped_ledger_desc;
}

/* ------------------------------------------------------------------ the context */

typedef struct world {
  eph_ctx_t ctx;
  char dir[64];
  size_t n_loaded; /* plugins loaded by the loader (unloaded by it); the rest are ours */
} world_t;

static void
add_slot(world_t *w, const eph_plugin_t *desc)
{
  eph_plugins_t *ps = &w->ctx.plugins;
  ps->slots = eph_xrealloc(ps->slots, (ps->n + 1) * sizeof *ps->slots);
  ps->slots[ps->n++] = (eph_plugin_slot_t){.desc = desc, .path = NULL};
}

static int
setup(void **state)
{
  world_t *w = eph_xcalloc(1, sizeof *w);
  snprintf(w->dir, sizeof w->dir, "/tmp/eph-run-machine-XXXXXX");
  assert_non_null(mkdtemp(w->dir));
  w->ctx.state_dir = eph_xstrdup(w->dir);
  eph_host_init(&w->ctx.host, &w->ctx);
  const char *b = getenv("EPH_BUILDDIR");
  cleanup_free char *ledger = eph_xasprintf("%s/plugins/.libs/ledger-sqlite.so", b ? b : ".");
  eph_error_t err = {0};
  if (eph_plugin_load_file(&w->ctx.plugins, ledger, NULL, &w->ctx.host, NULL, &err) < 0)
    fail_msg("%s", err.message);
  w->n_loaded = w->ctx.plugins.n;
  wrap_ledger(&w->ctx.plugins.slots[0]);
  atomic_store(&ledger_charge_fails, false);
  add_slot(w, &backend_desc);
  add_slot(w, &model_desc);
  add_slot(w, &tool_desc);
  const eph_plugin_slot_t *l = eph_plugins_first(&w->ctx.plugins, EPH_KIND_LEDGER);
  const eph_ledger_ops_t *lo = l->desc->ops;
  assert_int_equal(lo->credit(l->state, "acme", 1000000, &err), 0);
  atomic_store(&echo_calls, 0);
  atomic_store(&fetch_calls, 0);
  atomic_store(&model_calls, 0);
  atomic_store(&backend_creates, 0);
  atomic_store(&backend_destroys, 0);
  atomic_store(&backend_fail, 0);
  tool_blocks = false;
  *state = w;
  return 0;
}

static int
teardown(void **state)
{
  world_t *w = *state;
  w->ctx.plugins.n = w->n_loaded; /* ours were never dlopen()ed */
  eph_plugins_unload(&w->ctx.plugins);
  cleanup_free char *cmd = eph_xasprintf("rm -rf '%s'", w->dir);
  assert_int_equal(system(cmd), 0);
  free(w->ctx.state_dir);
  free(w);
  return 0;
}

static eph_run_t *
new_run(world_t *w, const char *json)
{
  eph_request_limits_t limits = {
      .max_timeout_seconds = 3600, .max_cost_micros = 1000000, .max_files_total_bytes = 1 << 20};
  eph_request_t req;
  eph_error_t err = {0};
  if (eph_request_parse(json, strlen(json), &limits, &req, NULL, &err) < 0)
    fail_msg("request: %s", err.message);
  eph_run_options_t opt = {.org = "acme", .backend = "fixture"};
  eph_run_t *run = NULL;
  if (eph_run_new(&w->ctx, &req, &opt, &run, &err) < 0)
    fail_msg("eph_run_new: %s", err.message);
  eph_request_free(&req);
  return run;
}

#define REQUEST(extra)                                                                             \
  "{\"prompt\":\"p\",\"model\":\"fixture/m\",\"shell\":true,\"timeout_seconds\":30,"               \
  "\"max_cost_micros\":40000" extra "}"

static int
count_kind(json_object *events, const char *kind)
{
  int n = 0;
  for (size_t i = 0; i < json_object_array_length(events); i++) {
    json_object *k = NULL;
    json_object_object_get_ex(json_object_array_get_idx(events, i), "kind", &k);
    n += strcmp(json_object_get_string(k), kind) == 0;
  }
  return n;
}

/* The end every run must reach, whatever the path: one `ended`, `settled` last, the
 * ledger's money adding up, the sandbox (if any) destroyed. */
static void
expect_end(world_t *w, eph_run_t *run, eph_run_status_t status, const char *reason)
{
  assert_true(eph_run_settled(run));
  assert_int_equal(eph_run_status(run), status);
  cleanup_json json_object *o = eph_run_to_json(run, true);
  json_object *v = NULL, *events = NULL;
  json_object_object_get_ex(o, "reason", &v);
  if (!v || strcmp(json_object_get_string(v), reason) != 0)
    fail_msg("reason %s, want %s", v ? json_object_get_string(v) : "(none)", reason);
  json_object_object_get_ex(o, "events", &events);
  assert_int_equal(count_kind(events, "ended"), 1);
  assert_int_equal(count_kind(events, "settled"), 1);
  json_object *last = json_object_array_get_idx(events, json_object_array_length(events) - 1);
  json_object_object_get_ex(last, "kind", &v);
  assert_string_equal(json_object_get_string(v), "settled");
  eph_run_usage_t u;
  eph_run_usage(run, &u);
  assert_int_equal(u.billed_micros + u.released_micros, u.reserved_micros);
  assert_int_equal(u.billed_micros, u.model_micros + u.web_micros + u.compute_micros);
  const eph_plugin_slot_t *l = eph_plugins_first(&w->ctx.plugins, EPH_KIND_LEDGER);
  const eph_ledger_ops_t *lo = l->desc->ops;
  eph_ledger_totals_t t = {0};
  eph_error_t err = {0};
  assert_int_equal(lo->totals(l->state, eph_run_id(run), &t, &err), 0);
  assert_true(t.settled);
  assert_int_equal(t.billed_micros, u.billed_micros);
  assert_int_equal(t.released_micros, u.released_micros);
  assert_int_equal(atomic_load(&backend_creates), atomic_load(&backend_destroys));
}

/* ------------------------------------------------------------------ the tests */

static void
test_succeeded(void **state)
{
  world_t *w = *state;
  script = TOOL_THEN_ANSWER;
  eph_run_t *run = new_run(w, REQUEST(""));
  assert_int_equal(eph_run_execute(run), EPH_RUN_SUCCEEDED);
  expect_end(w, run, EPH_RUN_SUCCEEDED, "final_answer");
  assert_int_equal(atomic_load(&echo_calls), 1);
  assert_int_equal(atomic_load(&model_calls), 2);
  eph_run_usage_t u;
  eph_run_usage(run, &u);
  assert_int_equal(u.model_calls, 2);
  assert_true(u.model_micros > 0);
  eph_run_free(run);
}

static void
test_denied_tool_never_entered(void **state)
{
  world_t *w = *state;
  script = DENIED_THEN_ANSWER;
  eph_run_t *run = new_run(w, REQUEST(""));
  assert_int_equal(eph_run_execute(run), EPH_RUN_SUCCEEDED);
  expect_end(w, run, EPH_RUN_SUCCEEDED, "final_answer");
  /* fetch (web) was not granted: denied by the gate, the plugin never entered; the echo of
   * the same turn ran. */
  assert_int_equal(atomic_load(&fetch_calls), 0);
  assert_int_equal(atomic_load(&echo_calls), 1);
  cleanup_json json_object *events = eph_run_events_json(run, 0);
  assert_int_equal(count_kind(events, "denied"), 1);
  eph_run_free(run);
}

static void
test_model_error_fails(void **state)
{
  world_t *w = *state;
  script = MODEL_ERROR;
  eph_run_t *run = new_run(w, REQUEST(""));
  assert_int_equal(eph_run_execute(run), EPH_RUN_FAILED);
  expect_end(w, run, EPH_RUN_FAILED, "model_error");
  eph_run_free(run);
}

static void
test_step_limit_fails(void **state)
{
  world_t *w = *state;
  script = ALWAYS_TOOL;
  eph_run_t *run = new_run(w, REQUEST(""));
  assert_int_equal(eph_run_execute(run), EPH_RUN_FAILED);
  expect_end(w, run, EPH_RUN_FAILED, "step_limit");
  assert_int_equal(atomic_load(&model_calls), 24); /* max_steps' default */
  eph_run_free(run);
}

static void
test_sandbox_failure_is_host_error(void **state)
{
  world_t *w = *state;
  script = ANSWER;
  atomic_store(&backend_fail, 1);
  eph_run_t *run = new_run(w, REQUEST(""));
  assert_int_equal(eph_run_execute(run), EPH_RUN_FAILED);
  expect_end(w, run, EPH_RUN_FAILED, "host_error");
  assert_int_equal(atomic_load(&model_calls), 0);
  eph_run_usage_t u;
  eph_run_usage(run, &u);
  assert_int_equal(u.billed_micros, 0);
  eph_run_free(run);
}

static void
test_budget_cut(void **state)
{
  world_t *w = *state;
  script = EXPENSIVE;
  eph_run_t *run = new_run(w, REQUEST(""));
  assert_int_equal(eph_run_execute(run), EPH_RUN_BUDGET_EXHAUSTED);
  expect_end(w, run, EPH_RUN_BUDGET_EXHAUSTED, "budget_exhausted");
  /* The call cost more than the reservation: what was left is billed, never more. */
  eph_run_usage_t u;
  eph_run_usage(run, &u);
  assert_int_equal(u.billed_micros, u.reserved_micros);
  eph_run_free(run);
}

static void
test_budget_too_small_for_a_call(void **state)
{
  world_t *w = *state;
  script = ANSWER;
  eph_run_t *run = new_run(w, "{\"prompt\":\"p\",\"model\":\"fixture/m\",\"shell\":true,"
                              "\"timeout_seconds\":30,\"max_cost_micros\":1}");
  assert_int_equal(eph_run_execute(run), EPH_RUN_BUDGET_EXHAUSTED);
  expect_end(w, run, EPH_RUN_BUDGET_EXHAUSTED, "budget_exhausted");
  assert_int_equal(atomic_load(&model_calls), 0); /* refused before the call */
  eph_run_free(run);
}

static void *
execute_thread(void *arg)
{
  eph_run_execute(arg);
  return NULL;
}

static void
test_cancel_during_a_tool_call(void **state)
{
  world_t *w = *state;
  script = ALWAYS_TOOL;
  tool_blocks = true;
  sem_init(&tool_entered, 0, 0);
  sem_init(&tool_release, 0, 0);
  eph_run_t *run = new_run(w, REQUEST(""));
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, execute_thread, run), 0);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += 10;
  assert_int_equal(sem_timedwait(&tool_entered, &ts), 0);
  eph_run_cancel(run);
  tool_blocks = false;
  sem_post(&tool_release);
  pthread_join(t, NULL);
  expect_end(w, run, EPH_RUN_CANCELLED, "cancelled");
  assert_int_equal(atomic_load(&model_calls), 1); /* no model call after the cancel */
  eph_run_free(run);
  sem_destroy(&tool_entered);
  sem_destroy(&tool_release);
}

static void
test_cancel_before_execute(void **state)
{
  world_t *w = *state;
  script = ANSWER;
  eph_run_t *run = new_run(w, REQUEST(""));
  eph_run_cancel(run);
  assert_int_equal(eph_run_execute(run), EPH_RUN_CANCELLED);
  expect_end(w, run, EPH_RUN_CANCELLED, "cancelled");
  assert_int_equal(atomic_load(&backend_creates), 0);
  eph_run_free(run);
}

/* Abandoned while queued: nothing billed. Its first event, the reservation, is at t = 0
 * exactly, however slowly the clock is read (t counts from it): a cluster's claimer emits a
 * `reserved` of its own in memory beside the admitting node's stored one, and any other t
 * would make the two timelines differ (tests/cluster.test compares them). */
static void
test_abandoned_while_queued(void **state)
{
  world_t *w = *state;
  atomic_store(&mono_stepping, true);
  eph_run_t *run = new_run(w, REQUEST(""));
  atomic_store(&mono_stepping, false);
  cleanup_json json_object *events = eph_run_events_json(run, 0);
  json_object *t = NULL;
  json_object_object_get_ex(json_object_array_get_idx(events, 0), "t", &t);
  assert_true(t && json_object_get_double(t) == 0.0);
  eph_run_abandon(run, "shutdown");
  expect_end(w, run, EPH_RUN_CANCELLED, "shutdown");
  eph_run_usage_t u;
  eph_run_usage(run, &u);
  assert_int_equal(u.billed_micros, 0);
  assert_int_equal(u.released_micros, u.reserved_micros);
  eph_run_free(run);
}

static void
test_timeout(void **state)
{
  world_t *w = *state;
  script = SLOW;
  eph_run_t *run = new_run(w, "{\"prompt\":\"p\",\"model\":\"fixture/m\",\"shell\":true,"
                              "\"timeout_seconds\":1,\"max_cost_micros\":40000}");
  int64_t t0 = eph_now_ms();
  assert_int_equal(eph_run_execute(run), EPH_RUN_TIMED_OUT);
  assert_true(eph_now_ms() - t0 < 10000);
  expect_end(w, run, EPH_RUN_TIMED_OUT, "timeout");
  eph_run_free(run);
}

static void
test_refusal_fails(void **state)
{
  world_t *w = *state;
  script = REFUSAL;
  eph_run_t *run = new_run(w, REQUEST(""));
  assert_int_equal(eph_run_execute(run), EPH_RUN_FAILED);
  expect_end(w, run, EPH_RUN_FAILED, "refusal");
  eph_run_usage_t u;
  eph_run_usage(run, &u);
  assert_true(u.model_micros > 0); /* the refused call was made and is billed */
  eph_run_free(run);
}

static void
test_truncated_answer_fails(void **state)
{
  world_t *w = *state;
  script = TRUNCATED;
  eph_run_t *run = new_run(w, REQUEST(""));
  assert_int_equal(eph_run_execute(run), EPH_RUN_FAILED);
  expect_end(w, run, EPH_RUN_FAILED, "max_tokens");
  eph_run_free(run);
}

static void
test_diverged_transcript_fails(void **state)
{
  world_t *w = *state;
  script = DIVERGED;
  eph_run_t *run = new_run(w, REQUEST(""));
  assert_int_equal(eph_run_execute(run), EPH_RUN_FAILED);
  expect_end(w, run, EPH_RUN_FAILED, "transcript_diverged");
  cleanup_json json_object *events = eph_run_events_json(run, 0);
  assert_int_equal(count_kind(events, "model_error"), 1);
  eph_run_free(run);
}

static void
test_file_placement_failure_is_host_error(void **state)
{
  world_t *w = *state;
  script = ANSWER;
  /* The fixture guest refuses every write: the request's file cannot be placed. */
  eph_run_t *run = new_run(w, REQUEST(",\"files\":[{\"path\":\"in.txt\",\"content\":\"x\"}]"));
  assert_int_equal(eph_run_execute(run), EPH_RUN_FAILED);
  expect_end(w, run, EPH_RUN_FAILED, "host_error");
  assert_int_equal(atomic_load(&model_calls), 0); /* the agent never started */
  cleanup_json json_object *o = eph_run_to_json(run, false);
  json_object *e = NULL;
  assert_true(json_object_object_get_ex(o, "error", &e));
  if (!strstr(json_object_get_string(e), "placing files[0]"))
    fail_msg("error: %s", json_object_get_string(e));
  eph_run_free(run);
}

static void
test_ledger_failure_is_storage_error(void **state)
{
  world_t *w = *state;
  script = TOOL_THEN_ANSWER;
  atomic_store(&ledger_charge_fails, true);
  eph_run_t *run = new_run(w, REQUEST(""));
  assert_int_equal(eph_run_execute(run), EPH_RUN_FAILED);
  /* The first charge (the model call) could not be recorded: the work stops, nothing
   * unrecorded is billed, and the run says why even though the model answered. */
  expect_end(w, run, EPH_RUN_FAILED, "storage_error");
  eph_run_usage_t u;
  eph_run_usage(run, &u);
  assert_int_equal(u.billed_micros, 0);
  assert_int_equal(u.released_micros, u.reserved_micros);
  eph_run_free(run);
}

static void
test_sandbox_start_past_deadline_times_out(void **state)
{
  world_t *w = *state;
  script = ANSWER;
  atomic_store(&backend_fail, BACKEND_SLOW);
  eph_run_t *run = new_run(w, "{\"prompt\":\"p\",\"model\":\"fixture/m\",\"shell\":true,"
                              "\"timeout_seconds\":1,\"max_cost_micros\":40000}");
  assert_int_equal(eph_run_execute(run), EPH_RUN_TIMED_OUT);
  expect_end(w, run, EPH_RUN_TIMED_OUT, "timeout");
  assert_int_equal(atomic_load(&model_calls), 0);
  eph_run_usage_t u;
  eph_run_usage(run, &u);
  assert_int_equal(u.billed_micros, 0);
  eph_run_free(run);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_succeeded, setup, teardown),
      cmocka_unit_test_setup_teardown(test_denied_tool_never_entered, setup, teardown),
      cmocka_unit_test_setup_teardown(test_model_error_fails, setup, teardown),
      cmocka_unit_test_setup_teardown(test_step_limit_fails, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sandbox_failure_is_host_error, setup, teardown),
      cmocka_unit_test_setup_teardown(test_budget_cut, setup, teardown),
      cmocka_unit_test_setup_teardown(test_budget_too_small_for_a_call, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cancel_during_a_tool_call, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cancel_before_execute, setup, teardown),
      cmocka_unit_test_setup_teardown(test_abandoned_while_queued, setup, teardown),
      cmocka_unit_test_setup_teardown(test_timeout, setup, teardown),
      cmocka_unit_test_setup_teardown(test_refusal_fails, setup, teardown),
      cmocka_unit_test_setup_teardown(test_truncated_answer_fails, setup, teardown),
      cmocka_unit_test_setup_teardown(test_diverged_transcript_fails, setup, teardown),
      cmocka_unit_test_setup_teardown(test_file_placement_failure_is_host_error, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ledger_failure_is_storage_error, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sandbox_start_past_deadline_times_out, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
