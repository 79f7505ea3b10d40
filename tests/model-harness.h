/* Shared by the model plugin tests: starts tests/fake-openai, loads a model plugin through
 * the real loader with a config block given as libconfig text, captures stderr. */
#ifndef EPH_TEST_MODEL_HARNESS_H
#define EPH_TEST_MODEL_HARNESS_H

#include <stddef.h>
#include <sys/types.h>

#include <ephemeral/plugin.h>

#include "loader.h"

typedef struct fake {
  pid_t pid;
  int stdin_fd; /* closing it stops the server */
  int port;
  char record[256]; /* JSONL of the requests it received */
  char dir[128];
} fake_t;

/* Starts fake-openai expecting `key` (NULL: no check) with the NULL-terminated steps.
 * Fails the test on error. */
void fake_start(fake_t *f, const char *key, const char *const *steps);
void fake_stop(fake_t *f);
/* The requests received so far: a json array (owned by the caller) of the record lines. */
json_object *fake_requests(const fake_t *f);

/* A loaded plugin with the config it was given. */
typedef struct loaded {
  config_t cfg;
  eph_plugins_t ps;
  const eph_plugin_slot_t *slot;
  const eph_model_ops_t *ops;
} loaded_t;

/* Loads $EPH_BUILDDIR/plugins/.libs/<name>.so with the block `<name>: { conf };`.
 * Returns the loader's result; on success l->ops is the model table. */
int plugin_load(loaded_t *l, const char *name, const char *conf, eph_error_t *err);
void plugin_unload(loaded_t *l);
int model_call(loaded_t *l, const eph_model_request_t *req, eph_model_response_t *resp,
               eph_error_t *err);

/* The conversation (a system and a user message) and the tool (shell) the provider tests
 * send, as JSON text. */
extern const char harness_messages_json[];
extern const char harness_tools_json[];

/* One model call of a test: the request built from JSON text, its answer and timing. */
typedef struct call {
  json_object *messages, *tools;
  eph_model_request_t req;
  eph_model_response_t resp;
  eph_error_t err;
  int r;
  int64_t elapsed_ms;
} call_t;

/* A request for model with messages (JSON text), harness_tools_json, 512 output tokens
 * and a deadline deadline_in_ms from now. */
void call_init(call_t *c, const char *model, const char *messages, int64_t deadline_in_ms);
/* model_call() of c's request into c->r, c->resp, c->err, c->elapsed_ms. */
void call_run(call_t *c, loaded_t *l);
void call_clear(call_t *c);

/* Loads plugin `name` pointed at f's http://127.0.0.1:PORT/v1/, its key read from the
 * environment variable key_env, short backoffs (max_retries 2, 100..400 ms, timeout_ms
 * 5000); extra (libconfig text, may be NULL) appended. Fails the test on error. */
void model_load(const char *name, const char *key_env, loaded_t *l, const fake_t *f,
                const char *extra);

/* What a provider test talks to: the plugin, the key the fake expects and the environment
 * variable the plugin reads it from, the model the calls ask for. */
typedef struct provider_case {
  const char *plugin, *key, *key_env, *model;
} provider_case_t;

/* The set-up of a one-call provider test: fake_start(f, pc->key, steps), model_load(pc->plugin,
 * pc->key_env, l, f, extra), call_init(c, pc->model, messages, deadline_in_ms), call_run(c,
 * l). Its teardown, exchange_end: call_clear(c), plugin_unload(l), fake_stop(f). */
void exchange_run(const provider_case_t *pc, fake_t *f, loaded_t *l, call_t *c,
                  const char *const *steps, const char *extra, const char *messages,
                  int64_t deadline_in_ms);
void exchange_end(fake_t *f, loaded_t *l, call_t *c);

/* Runs step_a on a plain provider and step_b on a streaming one (pc's plugin, key and model;
 * conf_a / conf_b its extra config each) and asserts both answers are the same: message,
 * finish reason, token counts and, when cache_too, the cache counts (the fake's built-in
 * answers count no cache). *out takes the streamed answer (clear it with
 * eph_model_response_clear). Returns the streamed call's requests (owned by the caller). */
json_object *same_answer(const provider_case_t *pc, const char *step_a, const char *conf_a,
                         const char *step_b, const char *conf_b, const char *messages,
                         bool cache_too, eph_model_response_t *out);

/* A fake-openai step answering with a file of tests/wire: "<kind>:<srcdir>/tests/wire/<file>"
 * (heap). */
char *wire(const char *kind, const char *file);
/* The body of the i-th request the fake recorded, parsed (owned by the caller); record
 * field key of it (borrowed). Both fail the test when missing. */
json_object *request_body(json_object *requests, size_t i);
json_object *rec_get(json_object *requests, size_t i, const char *key);
/* When the fake received the i-th request (its record's t_ms, monotonic ms). */
int64_t request_t_ms(json_object *requests, size_t i);

/* Redirects fd 2 to a temporary file until capture_end(), which returns what was written
 * (heap string, caller frees). */
void capture_begin(void);
char *capture_end(void);

/* The host table the tests load plugins with (the core's own, from eph_host_init). */
extern eph_host_t test_host;
void harness_init(void);
const char *builddir(void);
const char *srcdir(void);

#endif
