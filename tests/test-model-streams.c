/* model-openai's Responses API, its streams (Chat Completions chunks with tool_call deltas,
 * Responses SSE events) and its operator-defined providers, against tests/fake-openai on
 * 127.0.0.1: a streamed answer reads exactly as the same answer not streamed, the request
 * shapes are the APIs' own, a stream cut short or too slow is an error, and a model whose
 * prefix names an operator's provider goes to that provider's server. */
#include <config.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "model-harness.h"
#include "util.h"

#define KEY "sk-test-5e7a9c1b3d5f7a9c2e4b6d8f0a1c3e5b"
#define KEY_ENV "EPH_TEST_OPENAI_KEY"

#define PLUGIN "model-openai"

static const provider_case_t PROVIDER = {PLUGIN, KEY, KEY_ENV, "openai/gpt-6-luna"};

static const char second_turn_json[] =
    "[{\"role\":\"system\",\"content\":\"You drive a sandbox.\"},"
    "{\"role\":\"user\",\"content\":\"Run whoami.\"},"
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
    "{\"id\":\"call_fake_1\",\"type\":\"function\",\"function\":{\"name\":\"shell\","
    "\"arguments\":\"{\\\"command\\\": \\\"pwd; whoami\\\"}\"}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call_fake_1\",\"content\":\"worker\"}]";

static void
test_chat_stream_same_as_json(void **state)
{
  eph_model_response_t r;
  cleanup_free char *sse1 = wire("sse", "chat-tool_calls.sse");
  cleanup_json json_object *reqs = same_answer(&PROVIDER, "tool_calls", NULL, sse1,
                                               "stream = true;", harness_messages_json, false, &r);
  json_object *calls = NULL, *v = NULL;
  assert_string_equal(r.finish_reason, "tool_calls");
  assert_true(json_object_object_get_ex(r.message, "tool_calls", &calls));
  assert_int_equal(json_object_array_length(calls), 2);
  /* what --record writes of the stream is a chat.completion a replay reads */
  assert_true(json_object_object_get_ex(r.raw, "object", &v));
  assert_string_equal(json_object_get_string(v), "chat.completion");
  eph_model_response_clear(&r);
  cleanup_json json_object *body = request_body(reqs, 0);
  assert_true(json_object_object_get_ex(body, "stream", &v) && json_object_get_boolean(v));
  json_object *so = NULL;
  assert_true(json_object_object_get_ex(body, "stream_options", &so));
  assert_true(json_object_object_get_ex(so, "include_usage", &v) && json_object_get_boolean(v));
  assert_string_equal(json_object_get_string(rec_get(reqs, 0, "accept")), "text/event-stream");

  /* a server repeating id and name in every chunk (as some compatible servers do) */
  cleanup_free char *sse3 = wire("sse", "chat-tool_calls-repeated.sse");
  cleanup_json json_object *reqs3 = same_answer(&PROVIDER, "tool_calls", NULL, sse3,
                                                "stream = true;", harness_messages_json, false, &r);
  eph_model_response_clear(&r);

  cleanup_free char *sse2 = wire("sse", "chat-final.sse");
  cleanup_json json_object *reqs2 = same_answer(&PROVIDER, "final", NULL, sse2, "stream = true;",
                                                harness_messages_json, false, &r);
  assert_string_equal(r.finish_reason, "stop");
  assert_int_equal(r.cache_read_tokens, 100); /* usage.prompt_tokens_details.cached_tokens */
  eph_model_response_clear(&r);
}

static void
test_responses_json_and_stream(void **state)
{
  static const char *const pairs[][2] = {{"responses-tool.json", "responses-tool.sse"},
                                         {"responses-final.json", "responses-final.sse"}};
  for (size_t i = 0; i < 2; i++) {
    eph_model_response_t r;
    cleanup_free char *a = wire("file", pairs[i][0]);
    cleanup_free char *b = wire("sse", pairs[i][1]);
    cleanup_json json_object *reqs =
        same_answer(&PROVIDER, a, "api = \"responses\";", b, "api = \"responses\"; stream = true;",
                    i == 0 ? harness_messages_json : second_turn_json, false, &r);
    json_object *v = NULL;
    assert_string_equal(json_object_get_string(rec_get(reqs, 0, "path")), "/v1/responses");
    cleanup_json json_object *body = request_body(reqs, 0);
    assert_true(json_object_object_get_ex(body, "model", &v));
    assert_string_equal(json_object_get_string(v), "gpt-6-luna");
    assert_true(json_object_object_get_ex(body, "store", &v) && !json_object_get_boolean(v));
    assert_true(json_object_object_get_ex(body, "max_output_tokens", &v));
    assert_int_equal(json_object_get_int(v), 512);
    assert_true(json_object_object_get_ex(body, "stream", &v) && json_object_get_boolean(v));
    cleanup_json json_object *want_tools = json_tokener_parse(
        "[{\"type\":\"function\",\"name\":\"shell\",\"description\":\"Run a shell command in the "
        "sandbox\",\"parameters\":{\"type\":\"object\",\"properties\":{\"command\":{\"type\":"
        "\"string\"}},\"required\":[\"command\"]}}]");
    assert_true(json_object_object_get_ex(body, "tools", &v));
    assert_true(json_object_equal(v, want_tools));
    assert_true(json_object_object_get_ex(r.raw, "object", &v));
    assert_string_equal(json_object_get_string(v), "response");
    if (i == 0) {
      json_object *calls = NULL, *c0 = NULL;
      assert_string_equal(r.finish_reason, "tool_calls");
      assert_int_equal(r.input_tokens, 100);
      assert_int_equal(r.output_tokens, 20);
      assert_true(json_object_object_get_ex(r.message, "tool_calls", &calls));
      assert_int_equal(json_object_array_length(calls), 2);
      c0 = json_object_array_get_idx(calls, 0);
      assert_true(json_object_object_get_ex(c0, "id", &v));
      assert_string_equal(json_object_get_string(v), "call_fake_1"); /* the call_id */
      cleanup_json json_object *want_input = json_tokener_parse(
          "[{\"type\":\"message\",\"role\":\"system\",\"content\":\"You drive a sandbox.\"},"
          "{\"type\":\"message\",\"role\":\"user\",\"content\":\"Run whoami.\"}]");
      assert_true(json_object_object_get_ex(body, "input", &v));
      assert_true(json_object_equal(v, want_input));
    } else {
      assert_string_equal(r.finish_reason, "stop");
      assert_true(json_object_object_get_ex(r.message, "content", &v));
      assert_string_equal(json_object_get_string(v), "done"); /* from output_text.delta */
      assert_int_equal(r.cache_read_tokens, 100); /* usage.input_tokens_details.cached_tokens */
      cleanup_json json_object *want_input = json_tokener_parse(
          "[{\"type\":\"message\",\"role\":\"system\",\"content\":\"You drive a sandbox.\"},"
          "{\"type\":\"message\",\"role\":\"user\",\"content\":\"Run whoami.\"},"
          "{\"type\":\"function_call\",\"call_id\":\"call_fake_1\",\"name\":\"shell\","
          "\"arguments\":\"{\\\"command\\\": \\\"pwd; whoami\\\"}\"},"
          "{\"type\":\"function_call_output\",\"call_id\":\"call_fake_1\",\"output\":\"worker\"}]");
      assert_true(json_object_object_get_ex(body, "input", &v));
      if (!json_object_equal(v, want_input))
        fail_msg("input sent: %s", json_object_to_json_string(v));
    }
    eph_model_response_clear(&r);
  }
}

static void
test_truncated_and_malformed_streams(void **state)
{
  struct {
    const char *kind, *file, *conf, *want;
  } cases[] = {
      {"ssecut", "chat-tool_calls.sse:900", "stream = true;", "before data: [DONE]"},
      {"ssecut", "responses-tool.sse:2000", "api = \"responses\"; stream = true;",
       "before response.completed"},
      {"sse", "chat-malformed.sse", "stream = true;", "not a JSON object"},
      /* a Chat Completions stream where Responses events are due: its [DONE] is no event */
      {"sse", "chat-final.sse", "api = \"responses\"; stream = true;", "not a JSON object"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fake_t f;
    loaded_t l;
    call_t c;
    cleanup_free char *step = wire(cases[i].kind, cases[i].file);
    const char *steps[] = {step, "final", NULL};
    exchange_run(&PROVIDER, &f, &l, &c, steps, cases[i].conf, harness_messages_json, 10000);
    if (c.r != -EPH_E_PROTOCOL || !strstr(c.err.message, cases[i].want))
      fail_msg("case %zu: r=%d: %s", i, c.r, c.err.message);
    assert_null(c.resp.message);
    cleanup_json json_object *reqs = fake_requests(&f);
    assert_int_equal(json_object_array_length(reqs), 1); /* a started stream is not retried */
    exchange_end(&f, &l, &c);
  }
}

/* The provider reports a failure inside the stream: an upstream error with its message. */
static void
test_failed_stream_carries_message(void **state)
{
  fake_t f;
  loaded_t l;
  call_t c;
  cleanup_free char *step = wire("sse", "responses-failed.sse");
  const char *steps[] = {step, "final", NULL};
  exchange_run(&PROVIDER, &f, &l, &c, steps, "api = \"responses\"; stream = true;",
               harness_messages_json, 10000);
  if (c.r != -EPH_E_UPSTREAM || !strstr(c.err.message, "response.failed") ||
      !strstr(c.err.message, "The model failed to generate a response."))
    fail_msg("r=%d: %s", c.r, c.err.message);
  assert_null(c.resp.message);
  exchange_end(&f, &l, &c);
}

static void
test_slow_stream_cut_by_deadline(void **state)
{
  fake_t f;
  loaded_t l;
  call_t c;
  cleanup_free char *step = wire("sseslow", "chat-tool_calls.sse:300");
  const char *steps[] = {step, NULL};
  exchange_run(&PROVIDER, &f, &l, &c, steps, "stream = true;", harness_messages_json, 900);
  assert_int_equal(c.r, -ETIMEDOUT);
  if (c.elapsed_ms < 800 || c.elapsed_ms > 1500)
    fail_msg("after %lld ms: %s", (long long)c.elapsed_ms, c.err.message);
  exchange_end(&f, &l, &c);
}

/* "local/qwen3" goes to the operator's server as "qwen3", without the OpenAI key. */
static void
test_operator_provider_by_prefix(void **state)
{
  fake_t main_f, local_f;
  loaded_t l;
  call_t c;
  const char *steps[] = {"final", NULL};
  fake_start(&main_f, KEY, steps);
  fake_start(&local_f, NULL, steps);
  cleanup_free char *extra =
      eph_xasprintf("providers = ( { prefix = \"local/\"; base_url = \"http://127.0.0.1:%d/v1\"; "
                    "api_key_env = \"\"; max_tokens_field = \"max_tokens\"; } );",
                    local_f.port);
  model_load(PLUGIN, KEY_ENV, &l, &main_f, extra);
  assert_true(l.ops->serves(l.slot->state, "openai/gpt-6-luna"));
  assert_int_equal(l.ops->serves(l.slot->state, "local/qwen3"), 7);
  assert_false(l.ops->serves(l.slot->state, "anthropic/claude-fake-4"));
  assert_false(l.ops->serves(l.slot->state, "qwen3"));
  call_init(&c, "local/qwen3", harness_messages_json, 10000);
  call_run(&c, &l);
  if (c.r < 0)
    fail_msg("complete: %s", c.err.message);
  cleanup_json json_object *main_reqs = fake_requests(&main_f);
  cleanup_json json_object *local_reqs = fake_requests(&local_f);
  assert_int_equal(json_object_array_length(main_reqs), 0);
  assert_int_equal(json_object_array_length(local_reqs), 1);
  assert_false(json_object_get_boolean(rec_get(local_reqs, 0, "has_authorization")));
  cleanup_json json_object *body = request_body(local_reqs, 0);
  json_object *v = NULL;
  assert_true(json_object_object_get_ex(body, "model", &v));
  assert_string_equal(json_object_get_string(v), "qwen3");
  assert_true(json_object_object_get_ex(body, "max_tokens", &v));
  assert_false(json_object_object_get_ex(body, "max_completion_tokens", &v));
  call_clear(&c);

  /* and "openai/..." still goes to OpenAI, with its key */
  call_init(&c, "openai/gpt-6-luna", harness_messages_json, 10000);
  call_run(&c, &l);
  if (c.r < 0)
    fail_msg("complete: %s", c.err.message);
  cleanup_json json_object *main2 = fake_requests(&main_f);
  assert_int_equal(json_object_array_length(main2), 1);
  assert_true(json_object_get_boolean(rec_get(main2, 0, "auth_ok")));
  exchange_end(&main_f, &l, &c);
  fake_stop(&local_f);
}

static void
test_bad_provider_config_refused(void **state)
{
  static const char *const confs[][2] = {
      {"providers = ( { base_url = \"http://127.0.0.1:1/v1\"; } );", "providers[0]: prefix"},
      {"providers = ( { prefix = \"local/\"; } );", "providers[0]: base_url is required"},
      {"providers = ( { prefix = \"openai/\"; base_url = \"http://127.0.0.1:1/v1\"; } );",
       "already used"},
      {"providers = ( { prefix = \"x/\"; base_url = \"http://example.com/v1\"; } );", "plain http"},
      {"api = \"completions\";", "api \"completions\""},
      {"max_response_bytes = 4294967296L;", "max_response_bytes within"},
      {"providers = ( { prefix = \"x/\"; base_url = \"http://127.0.0.1:1/v1\"; "
       "api_key_evn = \"K\"; } );",
       "config:1: model-openai providers[0]: unknown key 'api_key_evn'"},
  };
  for (size_t i = 0; i < sizeof confs / sizeof confs[0]; i++) {
    loaded_t l;
    eph_error_t err = {0};
    cleanup_free char *conf = eph_xasprintf("api_key_env = \"%s\"; %s", KEY_ENV, confs[i][0]);
    capture_begin();
    int r = plugin_load(&l, "model-openai", conf, &err);
    free(capture_end());
    if (r >= 0 || !strstr(err.message, confs[i][1]))
      fail_msg("case %zu: r=%d: %s", i, r, err.message);
    plugin_unload(&l);
  }
}

int
main(void)
{
  harness_init();
  setenv(KEY_ENV, KEY, 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chat_stream_same_as_json),
      cmocka_unit_test(test_responses_json_and_stream),
      cmocka_unit_test(test_truncated_and_malformed_streams),
      cmocka_unit_test(test_failed_stream_carries_message),
      cmocka_unit_test(test_slow_stream_cut_by_deadline),
      cmocka_unit_test(test_operator_provider_by_prefix),
      cmocka_unit_test(test_bad_provider_config_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
