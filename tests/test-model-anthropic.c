/* model-anthropic against tests/fake-openai's /v1/messages (Anthropic's wire format, JSON
 * and Server-Sent Events, on 127.0.0.1), loaded by the real loader: what it sends, how it
 * reads tool_use blocks and usage (cache tokens included), that streaming gives the same
 * result as not streaming, retries (429 with retry-after, 529 overloaded, 5xx), malformed
 * and truncated streams, deadlines, pause_turn, and that the key stays out of messages. */
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

#define KEY "sk-ant-test-4b8d2f6a0c1e3579bdf02468ace13579"
#define KEY_ENV "EPH_TEST_ANTHROPIC_KEY"

#define PLUGIN "model-anthropic"
#define MODEL "anthropic/claude-fake-4"

static const provider_case_t PROVIDER = {PLUGIN, KEY, KEY_ENV, MODEL};

/* The second turn: the assistant asked for two calls, both answered. */
static const char second_turn_json[] =
    "[{\"role\":\"system\",\"content\":\"You drive a sandbox.\"},"
    "{\"role\":\"user\",\"content\":\"Run whoami.\"},"
    "{\"role\":\"assistant\",\"content\":\"Running two commands.\",\"tool_calls\":["
    "{\"id\":\"toolu_fake_1\",\"type\":\"function\",\"function\":{\"name\":\"shell\","
    "\"arguments\":\"{\\\"command\\\":\\\"pwd; whoami\\\"}\"}},"
    "{\"id\":\"toolu_fake_2\",\"type\":\"function\",\"function\":{\"name\":\"shell\","
    "\"arguments\":\"{\\\"command\\\":\\\"echo hi\\\"}\"}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"toolu_fake_1\",\"content\":\"/tmp\\nworker\"},"
    "{\"role\":\"tool\",\"tool_call_id\":\"toolu_fake_2\",\"content\":\"hi\"}]";

static const char *
rec_string(json_object *requests, size_t i, const char *key)
{
  return json_object_get_string(rec_get(requests, i, key));
}

static void
check_tool_use_answer(const eph_model_response_t *resp)
{
  json_object *calls = NULL, *v = NULL, *fn = NULL;
  assert_string_equal(resp->finish_reason, "tool_calls");
  /* every prompt token: 100 uncached + 2000 written to the cache */
  assert_int_equal(resp->input_tokens, 2100);
  assert_int_equal(resp->cache_write_tokens, 2000);
  assert_int_equal(resp->cache_read_tokens, 0);
  assert_int_equal(resp->output_tokens, 20);
  assert_true(json_object_object_get_ex(resp->message, "content", &v));
  assert_string_equal(json_object_get_string(v), "Running two commands.");
  assert_true(json_object_object_get_ex(resp->message, "tool_calls", &calls));
  assert_int_equal(json_object_array_length(calls), 2);
  static const char *const ids[] = {"toolu_fake_1", "toolu_fake_2"};
  static const char *const cmds[] = {"pwd; whoami", "echo hi"};
  for (size_t i = 0; i < 2; i++) {
    json_object *c = json_object_array_get_idx(calls, i);
    assert_true(json_object_object_get_ex(c, "id", &v));
    assert_string_equal(json_object_get_string(v), ids[i]);
    assert_true(json_object_object_get_ex(c, "function", &fn));
    assert_true(json_object_object_get_ex(fn, "name", &v));
    assert_string_equal(json_object_get_string(v), "shell");
    assert_true(json_object_object_get_ex(fn, "arguments", &v));
    cleanup_json json_object *args = json_tokener_parse(json_object_get_string(v));
    assert_non_null(args);
    assert_true(json_object_object_get_ex(args, "command", &v));
    assert_string_equal(json_object_get_string(v), cmds[i]);
  }
}

static void
test_tool_use_parsed_and_request_shape(void **state)
{
  fake_t f;
  loaded_t l;
  call_t c;
  cleanup_free char *step = wire("file", "anthropic-tool_use.json");
  const char *steps[] = {step, NULL};
  exchange_run(&PROVIDER, &f, &l, &c, steps, NULL, harness_messages_json, 10000);
  if (c.r < 0)
    fail_msg("complete: %s", c.err.message);
  check_tool_use_answer(&c.resp);
  json_object *v = NULL;
  assert_true(json_object_object_get_ex(c.resp.raw, "id", &v));
  assert_string_equal(json_object_get_string(v), "msg_fake1");

  cleanup_json json_object *reqs = fake_requests(&f);
  assert_int_equal(json_object_array_length(reqs), 1);
  assert_string_equal(rec_string(reqs, 0, "path"), "/v1/messages");
  assert_string_equal(rec_string(reqs, 0, "anthropic_version"), "2023-06-01");
  assert_string_equal(rec_string(reqs, 0, "content_type"), "application/json");
  assert_true(json_object_object_get_ex(json_object_array_get_idx(reqs, 0), "auth_ok", &v));
  assert_true(json_object_get_boolean(v)); /* x-api-key, and no Authorization header */
  assert_null(strstr(rec_string(reqs, 0, "body"), KEY));
  cleanup_json json_object *body = request_body(reqs, 0);
  assert_true(json_object_object_get_ex(body, "model", &v));
  assert_string_equal(json_object_get_string(v), "claude-fake-4");
  assert_true(json_object_object_get_ex(body, "max_tokens", &v));
  assert_int_equal(json_object_get_int(v), 512);
  assert_true(json_object_object_get_ex(body, "system", &v));
  assert_string_equal(json_object_get_string(v), "You drive a sandbox.");
  assert_false(json_object_object_get_ex(body, "stream", &v));
  cleanup_json json_object *want_msgs = json_tokener_parse(
      "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Run whoami.\","
      "\"cache_control\":{\"type\":\"ephemeral\"}}]}]");
  /* prompt caching (on by default): the last tool and the last block carry cache_control */
  assert_true(json_object_object_get_ex(body, "messages", &v));
  if (!json_object_equal(v, want_msgs))
    fail_msg("messages sent: %s", json_object_to_json_string(v));
  cleanup_json json_object *want_tools = json_tokener_parse(
      "[{\"name\":\"shell\",\"description\":\"Run a shell command in the sandbox\","
      "\"input_schema\":{\"type\":\"object\",\"properties\":{\"command\":{\"type\":\"string\"}},"
      "\"required\":[\"command\"]},\"cache_control\":{\"type\":\"ephemeral\"}}]");
  assert_true(json_object_object_get_ex(body, "tools", &v));
  if (!json_object_equal(v, want_tools))
    fail_msg("tools sent: %s", json_object_to_json_string(v));
  cleanup_json json_object *want_choice = json_tokener_parse("{\"type\":\"auto\"}");
  assert_true(json_object_object_get_ex(body, "tool_choice", &v));
  assert_true(json_object_equal(v, want_choice));
  exchange_end(&f, &l, &c);
}

/* The second turn's tool results travel as tool_result blocks in ONE user message, after
 * the assistant's text and tool_use blocks. */
static void
test_tool_results_sent_as_blocks(void **state)
{
  fake_t f;
  loaded_t l;
  call_t c;
  cleanup_free char *step = wire("file", "anthropic-final.json");
  const char *steps[] = {step, NULL};
  exchange_run(&PROVIDER, &f, &l, &c, steps, "prompt_cache = false;", second_turn_json, 10000);
  if (c.r < 0)
    fail_msg("complete: %s", c.err.message);
  json_object *v = NULL;
  assert_string_equal(c.resp.finish_reason, "stop");
  assert_int_equal(c.resp.input_tokens, 2150);
  assert_int_equal(c.resp.cache_read_tokens, 2000);
  assert_int_equal(c.resp.cache_write_tokens, 0);
  assert_true(json_object_object_get_ex(c.resp.message, "content", &v));
  assert_string_equal(json_object_get_string(v), "done");
  assert_false(json_object_object_get_ex(c.resp.message, "tool_calls", &v));

  cleanup_json json_object *reqs = fake_requests(&f);
  cleanup_json json_object *body = request_body(reqs, 0);
  cleanup_json json_object *want = json_tokener_parse(
      "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Run whoami.\"}]},"
      "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"Running two commands.\"},"
      "{\"type\":\"tool_use\",\"id\":\"toolu_fake_1\",\"name\":\"shell\",\"input\":{\"command\":"
      "\"pwd; whoami\"}},{\"type\":\"tool_use\",\"id\":\"toolu_fake_2\",\"name\":\"shell\","
      "\"input\":{\"command\":\"echo hi\"}}]},"
      "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_fake_1\","
      "\"content\":\"/tmp\\nworker\"},{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_fake_2\","
      "\"content\":\"hi\"}]}]");
  assert_true(json_object_object_get_ex(body, "messages", &v));
  if (!json_object_equal(v, want))
    fail_msg("messages sent: %s", json_object_to_json_string(v));
  exchange_end(&f, &l, &c);
}

/* The same answers streamed (7 bytes per read, a comment and a ping in between, CRLF line
 * ends in the second) read exactly as the JSON ones. */
static void
test_stream_gives_same_result(void **state)
{
  static const char *const names[][2] = {{"anthropic-tool_use.json", "anthropic-tool_use.sse"},
                                         {"anthropic-final.json", "anthropic-final.sse"}};
  for (size_t i = 0; i < 2; i++) {
    cleanup_free char *s1 = wire("file", names[i][0]);
    cleanup_free char *s2 = wire("sse", names[i][1]);
    eph_model_response_t r;
    cleanup_json json_object *reqs =
        same_answer(&PROVIDER, s1, NULL, s2, "stream = true;", harness_messages_json, true, &r);
    if (i == 0)
      check_tool_use_answer(&r);
    /* What --record writes of the stream is the message object a replay reads. */
    json_object *v = NULL;
    assert_true(json_object_object_get_ex(r.raw, "type", &v));
    assert_string_equal(json_object_get_string(v), "message");
    eph_model_response_clear(&r);
    cleanup_json json_object *body = request_body(reqs, 0);
    assert_true(json_object_object_get_ex(body, "stream", &v));
    assert_true(json_object_get_boolean(v));
    assert_string_equal(rec_string(reqs, 0, "accept"), "text/event-stream");
  }
}

static void
test_429_retry_after_then_529_then_success(void **state)
{
  fake_t f;
  loaded_t l;
  call_t c;
  cleanup_free char *step = wire("file", "anthropic-final.json");
  const char *steps[] = {"429:1", "529", step, NULL};
  exchange_run(&PROVIDER, &f, &l, &c, steps, NULL, harness_messages_json, 10000);
  if (c.r < 0)
    fail_msg("complete: %s", c.err.message);
  assert_string_equal(c.resp.finish_reason, "stop");
  cleanup_json json_object *reqs = fake_requests(&f);
  assert_int_equal(json_object_array_length(reqs), 3);
  int64_t gap = request_t_ms(reqs, 1) - request_t_ms(reqs, 0);
  if (gap < 990)
    fail_msg("retry after %lld ms, retry-after asked for 1000", (long long)gap);
  exchange_end(&f, &l, &c);
}

static void
test_overloaded_forever_and_500(void **state)
{
  fake_t f;
  loaded_t l;
  call_t c;
  const char *steps[] = {"500", "529*", NULL};
  exchange_run(&PROVIDER, &f, &l, &c, steps, NULL, harness_messages_json, 10000);
  assert_int_equal(c.r, -EPH_E_UPSTREAM);
  if (!strstr(c.err.message, "after 3 attempts") || !strstr(c.err.message, "HTTP 529") ||
      !strstr(c.err.message, "Overloaded"))
    fail_msg("message: %s", c.err.message);
  assert_null(c.resp.message);
  cleanup_json json_object *reqs = fake_requests(&f);
  assert_int_equal(json_object_array_length(reqs), 3);
  exchange_end(&f, &l, &c);
}

/* A malformed body, a stream cut short, a stream carrying an error event: clear errors,
 * no answer, not retried (a started stream has been billed by the provider). */
static void
test_malformed_and_truncated(void **state)
{
  struct {
    const char *kind, *file, *stream, *want;
    int code;
  } cases[] = {
      {"malformed", NULL, "", "not valid JSON", EPH_E_PROTOCOL},
      {"ssecut", "anthropic-tool_use.sse:1200", "stream = true;", "before message_stop",
       EPH_E_PROTOCOL},
      {"ssecut", "anthropic-tool_use.sse:1500", "stream = true;", "", EPH_E_PROTOCOL},
      {"sse", "anthropic-error.sse", "stream = true;", "Overloaded", EPH_E_UPSTREAM},
      {"sse", "anthropic-tool_use.json", "stream = true;", "before message_stop", EPH_E_PROTOCOL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fake_t f;
    loaded_t l;
    call_t c;
    cleanup_free char *step =
        cases[i].file ? wire(cases[i].kind, cases[i].file) : eph_xstrdup(cases[i].kind);
    cleanup_free char *ok = wire("file", "anthropic-final.json");
    const char *steps[] = {step, ok, NULL};
    exchange_run(&PROVIDER, &f, &l, &c, steps, cases[i].stream, harness_messages_json, 10000);
    if (c.r != -cases[i].code || !strstr(c.err.message, cases[i].want))
      fail_msg("case %zu: r=%d: %s", i, c.r, c.err.message);
    assert_null(c.resp.message);
    assert_null(c.resp.raw);
    cleanup_json json_object *reqs = fake_requests(&f);
    assert_int_equal(json_object_array_length(reqs), 1);
    exchange_end(&f, &l, &c);
  }
}

/* A hostile or broken provider: a stream larger than max_response_bytes is cut (the
 * parser never grows past the cap), a content block index far out of range is refused. */
static void
test_hostile_streams_bounded(void **state)
{
  struct {
    const char *file, *conf, *want;
  } cases[] = {
      {"anthropic-tool_use.sse", "stream = true; max_response_bytes = 1024;",
       "larger than max_response_bytes"},
      {"anthropic-hostile-index.sse", "stream = true;", "index 100000 out of range"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fake_t f;
    loaded_t l;
    call_t c;
    cleanup_free char *step = wire("sse", cases[i].file);
    const char *steps[] = {step, NULL};
    exchange_run(&PROVIDER, &f, &l, &c, steps, cases[i].conf, harness_messages_json, 10000);
    if (c.r != -EPH_E_PROTOCOL || !strstr(c.err.message, cases[i].want))
      fail_msg("case %zu: r=%d: %s", i, c.r, c.err.message);
    assert_null(c.resp.message);
    exchange_end(&f, &l, &c);
  }
}

static void
test_slow_stream_cut_by_deadline(void **state)
{
  fake_t f;
  loaded_t l;
  call_t c;
  cleanup_free char *step = wire("sseslow", "anthropic-tool_use.sse:200");
  const char *steps[] = {step, NULL};
  exchange_run(&PROVIDER, &f, &l, &c, steps, "stream = true;", harness_messages_json, 900);
  assert_int_equal(c.r, -ETIMEDOUT);
  if (c.elapsed_ms < 800 || c.elapsed_ms > 1500 || !strstr(c.err.message, "stream"))
    fail_msg("after %lld ms: %s", (long long)c.elapsed_ms, c.err.message);
  assert_null(c.resp.message);
  exchange_end(&f, &l, &c);
}

/* pause_turn: the paused content is sent back as-is and the two answers are one. */
static void
test_pause_turn_is_continued(void **state)
{
  fake_t f;
  loaded_t l;
  call_t c;
  cleanup_free char *s1 = wire("file", "anthropic-pause_turn.json");
  cleanup_free char *s2 = wire("file", "anthropic-final.json");
  const char *steps[] = {s1, s2, NULL};
  exchange_run(&PROVIDER, &f, &l, &c, steps, "prompt_cache = false;", harness_messages_json, 10000);
  if (c.r < 0)
    fail_msg("complete: %s", c.err.message);
  json_object *v = NULL;
  assert_true(json_object_object_get_ex(c.resp.message, "content", &v));
  assert_string_equal(json_object_get_string(v), "Thinking about it. done");
  assert_string_equal(c.resp.finish_reason, "stop");
  assert_int_equal(c.resp.output_tokens, 15);
  assert_int_equal(c.resp.input_tokens, 100 + 2150);
  assert_int_equal(c.resp.cache_read_tokens, 2000);
  cleanup_json json_object *reqs = fake_requests(&f);
  assert_int_equal(json_object_array_length(reqs), 2);
  cleanup_json json_object *body = request_body(reqs, 1);
  assert_true(json_object_object_get_ex(body, "messages", &v));
  json_object *last = json_object_array_get_idx(v, json_object_array_length(v) - 1);
  cleanup_json json_object *want =
      json_tokener_parse("{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":"
                         "\"Thinking about it. \"}]}");
  if (!json_object_equal(last, want))
    fail_msg("continuation ends with %s", json_object_to_json_string(last));
  exchange_end(&f, &l, &c);
}

/* A wrong key: 401 in Anthropic's shape; the key is in no message, log or body. */
static void
test_key_kept_out(void **state)
{
  fake_t f;
  loaded_t l;
  call_t c;
  const char *steps[] = {NULL};
  const char *wrong = "sk-ant-wrong-0123456789abcdef0123456789";
  setenv(KEY_ENV, wrong, 1);
  fake_start(&f, KEY, steps);
  capture_begin();
  model_load(PLUGIN, KEY_ENV, &l, &f, NULL);
  call_init(&c, MODEL, harness_messages_json, 10000);
  call_run(&c, &l);
  cleanup_free char *logged = capture_end();
  assert_int_equal(c.r, -EPH_E_UPSTREAM);
  if (!strstr(c.err.message, "HTTP 401") || !strstr(c.err.message, "invalid x-api-key"))
    fail_msg("message: %s", c.err.message);
  assert_null(strstr(c.err.message, wrong));
  assert_null(strstr(logged, wrong));
  cleanup_json json_object *reqs = fake_requests(&f);
  for (size_t i = 0; i < json_object_array_length(reqs); i++)
    assert_null(strstr(rec_string(reqs, i, "body"), wrong));
  exchange_end(&f, &l, &c);
  setenv(KEY_ENV, KEY, 1);

  /* No key at all: refused before anything is sent. */
  unsetenv(KEY_ENV);
  exchange_run(&PROVIDER, &f, &l, &c, steps, NULL, harness_messages_json, 10000);
  assert_int_equal(c.r, -EPH_E_CONFIG);
  assert_non_null(strstr(c.err.message, KEY_ENV));
  cleanup_json json_object *none = fake_requests(&f);
  assert_int_equal(json_object_array_length(none), 0);
  exchange_end(&f, &l, &c);
  setenv(KEY_ENV, KEY, 1);
}

static void
test_serves_its_prefix_only(void **state)
{
  fake_t f;
  loaded_t l;
  const char *steps[] = {NULL};
  fake_start(&f, KEY, steps);
  model_load(PLUGIN, KEY_ENV, &l, &f, NULL);
  assert_true(EPH_OPS_HAS(l.ops, eph_model_ops_t, serves));
  /* 1 + the length of the matched prefix: the core prefers the most specific */
  assert_int_equal(l.ops->serves(l.slot->state, "anthropic/claude-fake-4"), 11);
  assert_false(l.ops->serves(l.slot->state, "openai/gpt-6-luna"));
  assert_false(l.ops->serves(l.slot->state, "claude-fake-4"));
  plugin_unload(&l);
  fake_stop(&f);
}

/* ready(): whether a call could be made now, decided without the network (the health
 * check calls it every second). With the key: ready; without: not, naming the variable. */
static void
test_ready_needs_the_key(void **state)
{
  fake_t f;
  loaded_t l, nokey;
  const char *steps[] = {NULL};
  fake_start(&f, KEY, steps);
  model_load(PLUGIN, KEY_ENV, &l, &f, NULL);
  unsetenv("EPH_TEST_ANTHROPIC_NO_KEY");
  model_load(PLUGIN, "EPH_TEST_ANTHROPIC_NO_KEY", &nokey, &f, NULL);
  assert_true(EPH_OPS_HAS(l.ops, eph_model_ops_t, ready));
  eph_error_t err = {0};
  assert_int_equal(l.ops->ready(l.slot->state, MODEL, &err), 0);
  assert_true(nokey.ops->ready(nokey.slot->state, MODEL, &err) < 0);
  assert_non_null(strstr(err.message, "model-anthropic: no API key"));
  assert_non_null(strstr(err.message, "EPH_TEST_ANTHROPIC_NO_KEY"));
  err = (eph_error_t){0};
  assert_true(l.ops->ready(l.slot->state, "openai/gpt-6-luna", &err) < 0); /* not its model */
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
  setenv(KEY_ENV, KEY, 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tool_use_parsed_and_request_shape),
      cmocka_unit_test(test_tool_results_sent_as_blocks),
      cmocka_unit_test(test_stream_gives_same_result),
      cmocka_unit_test(test_429_retry_after_then_529_then_success),
      cmocka_unit_test(test_overloaded_forever_and_500),
      cmocka_unit_test(test_malformed_and_truncated),
      cmocka_unit_test(test_hostile_streams_bounded),
      cmocka_unit_test(test_slow_stream_cut_by_deadline),
      cmocka_unit_test(test_pause_turn_is_continued),
      cmocka_unit_test(test_key_kept_out),
      cmocka_unit_test(test_serves_its_prefix_only),
      cmocka_unit_test(test_ready_needs_the_key),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
