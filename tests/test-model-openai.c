/* model-openai against tests/fake-openai (real HTTP on 127.0.0.1), loaded by the real loader:
 * what it sends, how it parses, retries, backs off, honours deadlines and keeps the key out
 * of bodies, logs and error messages. */
#include <config.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "model-harness.h"
#include "util.h"

#define KEY "sk-test-7f3a9c1e5b2d4f6a8c0e1b3d5f7a9c2e"
#define KEY_ENV "EPH_TEST_OPENAI_KEY"

#define PLUGIN "model-openai"
#define MODEL "openai/gpt-6-luna"

static const provider_case_t PROVIDER = {PLUGIN, KEY, KEY_ENV, MODEL};

static void
test_tool_calls_parsed_and_request_shape(void **state)
{
  fake_t f;
  loaded_t l;
  call_t c;
  const char *steps[] = {"tool_calls", NULL};
  exchange_run(&PROVIDER, &f, &l, &c, steps, NULL, harness_messages_json, 10000);
  if (c.r < 0)
    fail_msg("complete: %s", c.err.message);

  assert_string_equal(c.resp.finish_reason, "tool_calls");
  assert_int_equal(c.resp.input_tokens, 100);
  assert_int_equal(c.resp.output_tokens, 20);
  json_object *calls = NULL, *content = NULL, *v = NULL;
  assert_true(json_object_object_get_ex(c.resp.message, "content", &content));
  assert_null(content);
  assert_true(json_object_object_get_ex(c.resp.message, "tool_calls", &calls));
  assert_int_equal(json_object_array_length(calls), 2);
  json_object *fn = NULL;
  assert_true(json_object_object_get_ex(json_object_array_get_idx(calls, 0), "function", &fn));
  assert_true(json_object_object_get_ex(fn, "name", &v));
  assert_string_equal(json_object_get_string(v), "shell");
  assert_true(json_object_object_get_ex(fn, "arguments", &v));
  cleanup_json json_object *args = json_tokener_parse(json_object_get_string(v));
  assert_true(json_object_object_get_ex(args, "command", &v));
  assert_string_equal(json_object_get_string(v), "pwd; whoami");
  assert_true(json_object_object_get_ex(json_object_array_get_idx(calls, 1), "id", &v));
  assert_string_equal(json_object_get_string(v), "call_fake_2");
  /* raw is the body as received, plus the measured latency for --record. */
  assert_true(json_object_object_get_ex(c.resp.raw, "id", &v));
  assert_string_equal(json_object_get_string(v), "chatcmpl-fake1");
  assert_true(json_object_object_get_ex(c.resp.raw, "x_latency_ms", &v));
  assert_true(json_object_get_int64(v) >= 0);

  cleanup_json json_object *reqs = fake_requests(&f);
  assert_int_equal(json_object_array_length(reqs), 1);
  json_object *rec = json_object_array_get_idx(reqs, 0);
  assert_true(json_object_object_get_ex(rec, "auth_ok", &v));
  assert_true(json_object_get_boolean(v));
  assert_true(json_object_object_get_ex(rec, "content_type", &v));
  assert_string_equal(json_object_get_string(v), "application/json");
  assert_true(json_object_object_get_ex(rec, "body", &v));
  assert_null(strstr(json_object_get_string(v), KEY));
  cleanup_json json_object *body = request_body(reqs, 0);
  assert_true(json_object_object_get_ex(body, "model", &v));
  assert_string_equal(json_object_get_string(v), "gpt-6-luna");
  assert_true(json_object_object_get_ex(body, "tools", &v));
  assert_true(json_object_equal(v, c.tools));
  assert_true(json_object_object_get_ex(body, "tool_choice", &v));
  assert_string_equal(json_object_get_string(v), "auto");
  assert_true(json_object_object_get_ex(body, "max_completion_tokens", &v));
  assert_int_equal(json_object_get_int(v), 512);
  assert_true(json_object_object_get_ex(body, "messages", &v));
  assert_true(json_object_equal(v, c.messages));

  exchange_end(&f, &l, &c);
}

static void
test_retry_after_429(void **state)
{
  fake_t f;
  loaded_t l;
  call_t c;
  const char *steps[] = {"429:1", "tool_calls", NULL};
  exchange_run(&PROVIDER, &f, &l, &c, steps, NULL, harness_messages_json, 10000);
  if (c.r < 0)
    fail_msg("complete: %s", c.err.message);
  assert_string_equal(c.resp.finish_reason, "tool_calls");
  cleanup_json json_object *reqs = fake_requests(&f);
  assert_int_equal(json_object_array_length(reqs), 2);
  /* Retry-After: 1 wins over the 100 ms backoff: the second request came a second later. */
  int64_t gap = request_t_ms(reqs, 1) - request_t_ms(reqs, 0);
  if (gap < 990)
    fail_msg("retry after %lld ms, Retry-After asked for 1000", (long long)gap);
  assert_true(c.elapsed_ms >= 1000);
  exchange_end(&f, &l, &c);
}

static void
test_retry_500_then_success(void **state)
{
  fake_t f;
  loaded_t l;
  call_t c;
  const char *steps[] = {"500", "final", NULL};
  exchange_run(&PROVIDER, &f, &l, &c, steps, NULL, harness_messages_json, 10000);
  if (c.r < 0)
    fail_msg("complete: %s", c.err.message);
  json_object *v = NULL;
  assert_true(json_object_object_get_ex(c.resp.message, "content", &v));
  assert_string_equal(json_object_get_string(v), "done");
  assert_false(json_object_object_get_ex(c.resp.message, "tool_calls", &v));
  assert_string_equal(c.resp.finish_reason, "stop");
  cleanup_json json_object *reqs = fake_requests(&f);
  assert_int_equal(json_object_array_length(reqs), 2);
  /* Backoff with jitter: between half and all of backoff_initial_ms (100). */
  int64_t gap = request_t_ms(reqs, 1) - request_t_ms(reqs, 0);
  if (gap < 49 || gap > 600)
    fail_msg("first retry after %lld ms, expected 50..100 (+ scheduling)", (long long)gap);
  exchange_end(&f, &l, &c);
}

static void
test_500_forever_gives_upstream(void **state)
{
  fake_t f;
  loaded_t l;
  call_t c;
  const char *steps[] = {"500*", NULL};
  exchange_run(&PROVIDER, &f, &l, &c, steps, NULL, harness_messages_json, 10000);
  assert_int_equal(c.r, -EPH_E_UPSTREAM);
  assert_int_equal(c.err.code, EPH_E_UPSTREAM);
  if (!strstr(c.err.message, "after 3 attempts") ||
      !strstr(c.err.message, "The server had an error"))
    fail_msg("message: %s", c.err.message);
  assert_null(c.resp.message);
  cleanup_json json_object *reqs = fake_requests(&f);
  assert_int_equal(json_object_array_length(reqs), 3); /* 1 + max_retries */
  /* Exponential: the second wait (100..200 ms... capped 50..200) follows the first. */
  int64_t g1 = request_t_ms(reqs, 1) - request_t_ms(reqs, 0);
  int64_t g2 = request_t_ms(reqs, 2) - request_t_ms(reqs, 1);
  if (g1 < 49 || g2 < 99)
    fail_msg("backoffs %lld then %lld ms, expected >= 50 then >= 100", (long long)g1,
             (long long)g2);
  exchange_end(&f, &l, &c);
}

static void
test_malformed_body_is_protocol_error(void **state)
{
  fake_t f;
  loaded_t l;
  call_t c;
  const char *steps[] = {"malformed", "final", NULL};
  exchange_run(&PROVIDER, &f, &l, &c, steps, NULL, harness_messages_json, 10000);
  assert_int_equal(c.r, -EPH_E_PROTOCOL);
  if (!strstr(c.err.message, "not valid JSON"))
    fail_msg("message: %s", c.err.message);
  cleanup_json json_object *reqs = fake_requests(&f);
  assert_int_equal(json_object_array_length(reqs), 1); /* not retried */
  exchange_end(&f, &l, &c);
}

static void
test_client_error_carries_api_message(void **state)
{
  fake_t f;
  loaded_t l;
  call_t c;
  const char *steps[] = {"400", "final", NULL};
  exchange_run(&PROVIDER, &f, &l, &c, steps, NULL, harness_messages_json, 10000);
  assert_int_equal(c.r, -EPH_E_UPSTREAM);
  if (!strstr(c.err.message, "HTTP 400") || !strstr(c.err.message, "fake rejection"))
    fail_msg("message: %s", c.err.message);
  cleanup_json json_object *reqs = fake_requests(&f);
  assert_int_equal(json_object_array_length(reqs), 1);
  exchange_end(&f, &l, &c);
}

static void
test_slow_answer_times_out_at_deadline(void **state)
{
  fake_t f;
  loaded_t l;
  call_t c;
  const char *steps[] = {"slow:5000", NULL};
  exchange_run(&PROVIDER, &f, &l, &c, steps, NULL, harness_messages_json, 800);
  assert_int_equal(c.r, -ETIMEDOUT);
  if (c.elapsed_ms < 700 || c.elapsed_ms > 1200)
    fail_msg("returned after %lld ms for an 800 ms deadline", (long long)c.elapsed_ms);
  exchange_end(&f, &l, &c);
}

static void
test_retry_after_past_deadline_is_not_waited(void **state)
{
  fake_t f;
  loaded_t l;
  call_t c;
  const char *steps[] = {"429:30", "final", NULL};
  exchange_run(&PROVIDER, &f, &l, &c, steps, NULL, harness_messages_json, 2000);
  assert_int_equal(c.r, -EPH_E_UPSTREAM);
  if (!strstr(c.err.message, "HTTP 429") || !strstr(c.err.message, "deadline"))
    fail_msg("message: %s", c.err.message);
  assert_true(c.elapsed_ms < 1000);
  exchange_end(&f, &l, &c);
}

/* A Retry-After date far ahead (year 2^31, which curl_getdate accepts) is not a delay: it
 * once overflowed the milliseconds (UBSan: signed overflow; found by tests/fuzz openai).
 * Ignored like any delay above 10^6 s, the call retries after its own backoff. */
static void
test_retry_after_date_far_ahead_ignored(void **state)
{
  fake_t f;
  loaded_t l;
  call_t c;
  const char *steps[] = {"429:Sun, 06 Nov 2147483647 08:49:37 GMT", "final", NULL};
  exchange_run(&PROVIDER, &f, &l, &c, steps, NULL, harness_messages_json, 10000);
  if (c.r < 0)
    fail_msg("complete: %s", c.err.message);
  assert_string_equal(c.resp.finish_reason, "stop");
  assert_true(c.elapsed_ms < 5000);
  exchange_end(&f, &l, &c);
}

static void
test_key_from_file(void **state)
{
  fake_t f;
  loaded_t l;
  call_t c;
  char dir[] = "/tmp/eph-openai-key-XXXXXX";
  const char *steps[] = {"final", NULL};
  assert_non_null(mkdtemp(dir));
  cleanup_free char *path = eph_xasprintf("%s/key", dir);
  FILE *kf = fopen(path, "w");
  assert_non_null(kf);
  fprintf(kf, "  %s\n", KEY);
  fclose(kf);
  chmod(path, 0600);
  unsetenv(KEY_ENV); /* the file is the only source */

  fake_start(&f, KEY, steps);
  cleanup_free char *extra = eph_xasprintf("api_key_file = \"%s\";", path);
  model_load(PLUGIN, KEY_ENV, &l, &f, extra);
  call_init(&c, MODEL, harness_messages_json, 10000);
  call_run(&c, &l);
  if (c.r < 0)
    fail_msg("complete: %s", c.err.message);
  cleanup_json json_object *reqs = fake_requests(&f);
  json_object *v = NULL;
  assert_true(json_object_object_get_ex(json_object_array_get_idx(reqs, 0), "auth_ok", &v));
  assert_true(json_object_get_boolean(v));
  exchange_end(&f, &l, &c);
  unlink(path);
  rmdir(dir);
  setenv(KEY_ENV, KEY, 1);
}

static void
test_missing_key_fails_before_sending(void **state)
{
  fake_t f;
  loaded_t l;
  call_t c;
  const char *steps[] = {"final", NULL};
  unsetenv(KEY_ENV);
  exchange_run(&PROVIDER, &f, &l, &c, steps, NULL, harness_messages_json, 10000);
  assert_int_equal(c.r, -EPH_E_CONFIG);
  if (!strstr(c.err.message, KEY_ENV))
    fail_msg("message does not name the variable: %s", c.err.message);
  cleanup_json json_object *reqs = fake_requests(&f);
  assert_int_equal(json_object_array_length(reqs), 0);
  exchange_end(&f, &l, &c);
  setenv(KEY_ENV, KEY, 1);
}

/* The server echoes a wrong key in its 401 text (as OpenAI does); retries log the API's
 * text at warn. Neither the error message nor stderr (at debug level) may hold a key. */
static void
test_key_never_in_logs_or_errors(void **state)
{
  const char *wrong = "sk-wrong-0123456789abcdef0123456789";
  fake_t f;
  loaded_t l;
  call_t c;
  const char *steps[] = {"500", "tool_calls", NULL};
  fake_start(&f, KEY, steps);

  eph_log_set_level(EPH_LOG_DEBUG);
  capture_begin();
  model_load(PLUGIN, KEY_ENV, &l, &f, NULL);
  call_init(&c, MODEL, harness_messages_json, 10000);
  call_run(&c, &l);
  int r1 = c.r;
  call_clear(&c);
  plugin_unload(&l);

  setenv(KEY_ENV, wrong, 1);
  model_load(PLUGIN, KEY_ENV, &l, &f, NULL);
  call_init(&c, MODEL, harness_messages_json, 10000);
  call_run(&c, &l);
  cleanup_free char *logged = capture_end();
  eph_log_set_level(EPH_LOG_ERROR);
  setenv(KEY_ENV, KEY, 1);

  assert_int_equal(r1, 0);
  assert_int_equal(c.r, -EPH_E_UPSTREAM);
  if (!strstr(c.err.message, "HTTP 401") || !strstr(c.err.message, "Incorrect API key") ||
      !strstr(c.err.message, "[redacted]"))
    fail_msg("message: %s", c.err.message);
  assert_null(strstr(c.err.message, wrong));
  assert_null(strstr(c.err.message, "0123456789abcdef"));
  /* The capture saw the plugin's lines (the retry warning), and no key in them. */
  if (!strstr(logged, "retry 1/2"))
    fail_msg("stderr lacks the retry warning: %s", logged);
  assert_null(strstr(logged, KEY));
  assert_null(strstr(logged, wrong));
  cleanup_json json_object *reqs = fake_requests(&f);
  for (size_t i = 0; i < json_object_array_length(reqs); i++) {
    json_object *b = NULL;
    assert_true(json_object_object_get_ex(json_object_array_get_idx(reqs, i), "body", &b));
    assert_null(strstr(json_object_get_string(b), KEY));
    assert_null(strstr(json_object_get_string(b), wrong));
  }
  exchange_end(&f, &l, &c);
}

static void
test_plain_http_to_remote_host_refused(void **state)
{
  loaded_t l;
  eph_error_t err = {0};
  int r = plugin_load(&l, "model-openai", "base_url = \"http://api.example.com/v1\";", &err);
  assert_true(r < 0);
  if (!strstr(err.message, "plain http"))
    fail_msg("message: %s", err.message);
  plugin_unload(&l);
}

/* ready(): per provider, without the network. The block's own provider has no key here;
 * a local provider that needs none is ready all the same. */
static void
test_ready_per_provider(void **state)
{
  fake_t f;
  loaded_t l, nokey;
  const char *steps[] = {NULL};
  fake_start(&f, KEY, steps);
  model_load(PLUGIN, KEY_ENV, &l, &f, NULL);
  unsetenv("EPH_TEST_OPENAI_NO_KEY");
  model_load(PLUGIN, "EPH_TEST_OPENAI_NO_KEY", &nokey, &f,
             "providers = ( { prefix = \"local/\"; base_url = \"http://127.0.0.1:1/v1\"; } );");
  assert_true(EPH_OPS_HAS(l.ops, eph_model_ops_t, ready));
  eph_error_t err = {0};
  assert_int_equal(l.ops->ready(l.slot->state, MODEL, &err), 0);
  assert_int_equal(nokey.ops->ready(nokey.slot->state, "local/qwen3", &err), 0);
  assert_true(nokey.ops->ready(nokey.slot->state, MODEL, &err) < 0);
  assert_non_null(strstr(err.message, "model-openai: no API key"));
  assert_non_null(strstr(err.message, "EPH_TEST_OPENAI_NO_KEY"));
  cleanup_json json_object *reqs = fake_requests(&f);
  assert_int_equal(json_object_array_length(reqs), 0);
  plugin_unload(&nokey);
  plugin_unload(&l);
  fake_stop(&f);
}

int
main(void)
{
  harness_init();
  eph_log_set_level(EPH_LOG_ERROR);
  setenv(KEY_ENV, KEY, 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tool_calls_parsed_and_request_shape),
      cmocka_unit_test(test_retry_after_429),
      cmocka_unit_test(test_retry_500_then_success),
      cmocka_unit_test(test_500_forever_gives_upstream),
      cmocka_unit_test(test_malformed_body_is_protocol_error),
      cmocka_unit_test(test_client_error_carries_api_message),
      cmocka_unit_test(test_slow_answer_times_out_at_deadline),
      cmocka_unit_test(test_retry_after_past_deadline_is_not_waited),
      cmocka_unit_test(test_retry_after_date_far_ahead_ignored),
      cmocka_unit_test(test_key_from_file),
      cmocka_unit_test(test_missing_key_fails_before_sending),
      cmocka_unit_test(test_key_never_in_logs_or_errors),
      cmocka_unit_test(test_plain_http_to_remote_host_refused),
      cmocka_unit_test(test_ready_per_provider),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
