/* model-replay, loaded by the real loader: the shipped example transcript replays the product
 * page's three model calls (and its token counts price like the page), divergence is caught
 * and named, "replay:PATH" selects a transcript, pacing follows the recording, and a
 * transcript recorded from model-openai's raw bodies replays the same messages. */
#include <config.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"
#include "model-harness.h"
#include "util.h"

/* The prices conf.d sets for openai/gpt-6-luna (micros per million tokens). */
#define INPUT_MICROS_PER_MTOK 50000
#define OUTPUT_MICROS_PER_MTOK 280000

static char example[1024];

static const char tools_json[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"shell\",\"description\":\"Run a shell "
    "command\",\"parameters\":{\"type\":\"object\",\"properties\":{\"command\":"
    "{\"type\":\"string\"}},\"required\":[\"command\"]}}}]";

/* A run's conversation as the core would hold it. */
typedef struct convo {
  json_object *messages, *tools;
  eph_model_request_t req;
} convo_t;

static void
convo_init(convo_t *c, const char *model)
{
  cleanup_free char *req_path = eph_xasprintf("%s/examples/sandbox-proof/request.json", srcdir());
  cleanup_json json_object *request = json_object_from_file(req_path);
  json_object *prompt = NULL;
  assert_non_null(request);
  assert_true(json_object_object_get_ex(request, "prompt", &prompt));
  c->messages = json_object_new_array();
  json_object *sys = json_object_new_object(), *user = json_object_new_object();
  json_object_object_add(sys, "role", json_object_new_string("system"));
  json_object_object_add(sys, "content", json_object_new_string("You drive a sandbox."));
  json_object_object_add(user, "role", json_object_new_string("user"));
  json_object_object_add(user, "content", json_object_get(prompt));
  json_object_array_add(c->messages, sys);
  json_object_array_add(c->messages, user);
  c->tools = json_tokener_parse(tools_json);
  memset(&c->req, 0, sizeof c->req);
  c->req.struct_size = sizeof c->req;
  c->req.model = model;
  c->req.messages = c->messages;
  c->req.tools = c->tools;
  c->req.max_output_tokens = 1024;
  c->req.deadline_ms = eph_now_ms() + 30000;
}

static void
convo_free(convo_t *c)
{
  json_object_put(c->messages);
  json_object_put(c->tools);
}

/* Appends the assistant message and a tool result for each of its tool calls (all of them,
 * or all but the last when drop_last_result). */
static void
convo_answer(convo_t *c, json_object *assistant, int drop_last_result)
{
  json_object *calls = NULL;
  json_object_array_add(c->messages, json_object_get(assistant));
  if (!json_object_object_get_ex(assistant, "tool_calls", &calls))
    return;
  size_t n = json_object_array_length(calls) - (drop_last_result ? 1 : 0);
  for (size_t i = 0; i < n; i++) {
    json_object *id = NULL, *tool = json_object_new_object();
    assert_true(json_object_object_get_ex(json_object_array_get_idx(calls, i), "id", &id));
    json_object_object_add(tool, "role", json_object_new_string("tool"));
    json_object_object_add(tool, "tool_call_id", json_object_get(id));
    /* A result the answer may quote ({{call_N.stdout}}): two stdout lines and stderr,
     * each naming the call. */
    const char *cid = json_object_get_string(id);
    cleanup_free char *content = eph_xasprintf(
        "{\"exit_code\":0,\"stdout\":\"stdout of %s\\nline 2 of %s\\n\",\"stderr\":\"stderr of "
        "%s\\n\"}",
        cid, cid, cid);
    json_object_object_add(tool, "content", json_object_new_string(content));
    json_object_array_add(c->messages, tool);
  }
}

static const char *
tool_command(json_object *assistant, size_t i)
{
  static char buf[1024];
  json_object *calls = NULL, *fn = NULL, *args = NULL, *cmd = NULL;
  assert_true(json_object_object_get_ex(assistant, "tool_calls", &calls));
  assert_true(json_object_object_get_ex(json_object_array_get_idx(calls, i), "function", &fn));
  assert_true(json_object_object_get_ex(fn, "arguments", &args));
  json_object *parsed = json_tokener_parse(json_object_get_string(args));
  assert_non_null(parsed);
  assert_true(json_object_object_get_ex(parsed, "command", &cmd));
  snprintf(buf, sizeof buf, "%s", json_object_get_string(cmd));
  json_object_put(parsed);
  return buf;
}

static void
load_replay(loaded_t *l, const char *conf)
{
  eph_error_t err = {0};
  if (plugin_load(l, "model-replay", conf, &err) < 0)
    fail_msg("loading model-replay: %s", err.message);
}

static void
load_example(loaded_t *l)
{
  cleanup_free char *conf = eph_xasprintf("transcript = \"%s\";", example);
  load_replay(l, conf);
}

/* The example transcript loaded and a conversation for its model: where most tests start. */
static void
example_start(loaded_t *l, convo_t *c)
{
  load_example(l);
  convo_init(c, "openai/gpt-6-luna");
}

static void
convo_end(loaded_t *l, convo_t *c)
{
  convo_free(c);
  plugin_unload(l);
}

/* Rewrites the arguments of tool call i of an answer (a history that claims otherwise). */
static void
set_arguments(json_object *message, size_t i, const char *arguments)
{
  json_object *calls = NULL, *fn = NULL;
  assert_true(json_object_object_get_ex(message, "tool_calls", &calls));
  assert_true(json_object_object_get_ex(json_object_array_get_idx(calls, i), "function", &fn));
  json_object_object_add(fn, "arguments", json_object_new_string(arguments));
}

/* Rounds a call's cost to the nearest micro, as a per-call charge would. */
static int64_t
call_cost_micros(const eph_model_response_t *r)
{
  uint64_t num =
      r->input_tokens * INPUT_MICROS_PER_MTOK + r->output_tokens * OUTPUT_MICROS_PER_MTOK;
  return (int64_t)((num + 500000) / 1000000);
}

static void
test_example_replays_three_calls(void **state)
{
  loaded_t l;
  convo_t c;
  eph_model_response_t r;
  eph_error_t err = {0};
  uint64_t tokens = 0;
  int64_t cost = 0;
  json_object *v = NULL;

  example_start(&l, &c);

  if (model_call(&l, &c.req, &r, &err) < 0)
    fail_msg("call 1: %s", err.message);
  assert_string_equal(r.finish_reason, "tool_calls");
  assert_string_equal(tool_command(r.message, 0), "pwd; whoami");
  assert_string_equal(tool_command(r.message, 1),
                      "command -v curl && curl -sS -m 8 https://example.com");
  tokens += r.input_tokens + r.output_tokens;
  cost += call_cost_micros(&r);
  assert_non_null(r.raw);
  convo_answer(&c, r.message, 0);
  eph_model_response_clear(&r);

  if (model_call(&l, &c.req, &r, &err) < 0)
    fail_msg("call 2: %s", err.message);
  assert_string_equal(r.finish_reason, "tool_calls");
  assert_non_null(strstr(tool_command(r.message, 0), "> primes.py && python3 primes.py"));
  assert_string_equal(tool_command(r.message, 1),
                      "printf 'sandbox proof\\n' > /tmp/proof.txt && ls -l /tmp/proof.txt");
  tokens += r.input_tokens + r.output_tokens;
  cost += call_cost_micros(&r);
  convo_answer(&c, r.message, 0);
  eph_model_response_clear(&r);

  if (model_call(&l, &c.req, &r, &err) < 0)
    fail_msg("call 3: %s", err.message);
  assert_string_equal(r.finish_reason, "stop");
  assert_false(json_object_object_get_ex(r.message, "tool_calls", &v));
  assert_true(json_object_object_get_ex(r.message, "content", &v));
  const char *answer = json_object_get_string(v);
  /* The answer quotes this run's tool results, not the recorded run's (honest replay):
   * call 1 is `pwd; whoami`, call 2 curl, call 3 the prime script, call 4 ls -l. */
  assert_non_null(strstr(answer, "output:** `stdout of call_H5uWd1Gq7rN9sBf3\nline 2 of"));
  assert_non_null(strstr(answer, "**whoami:** `line 2 of call_Q7mZk2Rw9fH1aLx4`"));
  assert_non_null(strstr(answer, "**pwd:** `stdout of call_Q7mZk2Rw9fH1aLx4`"));
  assert_non_null(strstr(answer, "`stderr of call_V3nTs8Yb0cJ6eKp2`"));
  assert_non_null(strstr(answer, "`ls -l`: `stdout of call_X8oLe4Mt2vC0iZy6\nline 2 of"));
  assert_null(strstr(answer, "{{"));
  assert_null(strstr(answer, "s2TPIy"));
  assert_non_null(strstr(answer, "The network call did not succeed."));
  /* And it says where it came from. */
  assert_non_null(strstr(r.replayed_from, "transcript.jsonl:3"));
  assert_string_equal(r.recorded_model, "gpt-6-luna");
  tokens += r.input_tokens + r.output_tokens;
  cost += call_cost_micros(&r);
  eph_model_response_clear(&r);

  /* The product page: "3 model calls, 5,214 tokens", "Model $0.00033". */
  assert_int_equal(tokens, 5214);
  if (cost < 325 || cost > 335)
    fail_msg("the transcript's model cost is %lld micros, the page shows 330", (long long)cost);

  convo_end(&l, &c);
}

/* The recorded prime one-liner really writes a script printing the first 15 primes. */
static void
test_recorded_prime_command_runs(void **state)
{
  loaded_t l;
  convo_t c;
  eph_model_response_t r;
  eph_error_t err = {0};
  if (access("/usr/bin/python3", X_OK) != 0) {
    skip();
    return;
  }
  example_start(&l, &c);
  assert_int_equal(model_call(&l, &c.req, &r, &err), 0);
  convo_answer(&c, r.message, 0);
  eph_model_response_clear(&r);
  assert_int_equal(model_call(&l, &c.req, &r, &err), 0);
  cleanup_free char *cmd = eph_xstrdup(tool_command(r.message, 0));
  eph_model_response_clear(&r);

  char dir[] = "/tmp/eph-replay-primes-XXXXXX";
  assert_non_null(mkdtemp(dir));
  cleanup_free char *shell = eph_xasprintf("cd '%s' && %s", dir, cmd);
  FILE *p = popen(shell, "r");
  assert_non_null(p);
  char out[256] = {0};
  size_t n = fread(out, 1, sizeof out - 1, p);
  int status = pclose(p);
  out[n] = '\0';
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  assert_string_equal(out, "2 3 5 7 11 13 17 19 23 29 31 37 41 43 47\n");
  cleanup_free char *script = eph_xasprintf("%s/primes.py", dir);
  unlink(script);
  rmdir(dir);
  convo_end(&l, &c);
}

static void
test_changed_arguments_diverge(void **state)
{
  loaded_t l;
  convo_t c;
  eph_model_response_t r;
  eph_error_t err = {0};
  example_start(&l, &c);
  assert_int_equal(model_call(&l, &c.req, &r, &err), 0);
  /* The history claims the model asked for something else in its second call. */
  set_arguments(r.message, 1, "{\"command\": \"id\"}");
  convo_answer(&c, r.message, 0);
  eph_model_response_clear(&r);

  int ret = model_call(&l, &c.req, &r, &err);
  assert_int_equal(ret, -EPH_E_DIVERGED);
  cleanup_free char *where = eph_xasprintf("%s:1:", example);
  if (!strstr(err.message, where) || !strstr(err.message, "tool call 2") ||
      !strstr(err.message, "arguments"))
    fail_msg("message: %s", err.message);
  assert_null(r.message);
  convo_end(&l, &c);
}

static void
test_arguments_compared_as_json(void **state)
{
  loaded_t l;
  convo_t c;
  eph_model_response_t r;
  eph_error_t err = {0};
  example_start(&l, &c);
  assert_int_equal(model_call(&l, &c.req, &r, &err), 0);
  /* Same value, other spacing: not a divergence. */
  set_arguments(r.message, 0, "{ \"command\" :\"pwd; whoami\" }");
  convo_answer(&c, r.message, 0);
  eph_model_response_clear(&r);
  if (model_call(&l, &c.req, &r, &err) < 0)
    fail_msg("%s", err.message);
  eph_model_response_clear(&r);
  convo_end(&l, &c);
}

static void
test_missing_tool_result_diverges(void **state)
{
  loaded_t l;
  convo_t c;
  eph_model_response_t r;
  eph_error_t err = {0};
  example_start(&l, &c);
  assert_int_equal(model_call(&l, &c.req, &r, &err), 0);
  convo_answer(&c, r.message, 1);
  eph_model_response_clear(&r);
  assert_int_equal(model_call(&l, &c.req, &r, &err), -EPH_E_DIVERGED);
  if (!strstr(err.message, "call_V3nTs8Yb0cJ6eKp2") || !strstr(err.message, "no tool message"))
    fail_msg("message: %s", err.message);
  convo_end(&l, &c);
}

static void
test_exhausted_transcript_diverges(void **state)
{
  loaded_t l;
  convo_t c;
  eph_model_response_t r;
  eph_error_t err = {0};
  example_start(&l, &c);
  for (int i = 0; i < 3; i++) {
    if (model_call(&l, &c.req, &r, &err) < 0)
      fail_msg("call %d: %s", i + 1, err.message);
    convo_answer(&c, r.message, 0);
    eph_model_response_clear(&r);
  }
  json_object *user = json_object_new_object();
  json_object_object_add(user, "role", json_object_new_string("user"));
  json_object_object_add(user, "content", json_object_new_string("And again?"));
  json_object_array_add(c.messages, user);
  assert_int_equal(model_call(&l, &c.req, &r, &err), -EPH_E_DIVERGED);
  if (!strstr(err.message, "exhausted") || !strstr(err.message, "response 4"))
    fail_msg("message: %s", err.message);
  convo_end(&l, &c);
}

/* The gate, not the replay, refuses tools the run does not offer. */
static void
test_unoffered_tool_is_not_divergence(void **state)
{
  loaded_t l;
  convo_t c;
  eph_model_response_t r;
  eph_error_t err = {0};
  example_start(&l, &c);
  c.req.tools = NULL;
  if (model_call(&l, &c.req, &r, &err) < 0)
    fail_msg("%s", err.message);
  assert_string_equal(tool_command(r.message, 0), "pwd; whoami");
  eph_model_response_clear(&r);
  convo_end(&l, &c);
}

static void
write_one_line_transcript(const char *path, const char *content, int latency_ms)
{
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f,
          "\n{\"id\":\"chatcmpl-t\",\"object\":\"chat.completion\",\"model\":\"m\",\"choices\":"
          "[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"%s\"},"
          "\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3,"
          "\"total_tokens\":10},\"x_latency_ms\":%d}\n",
          content, latency_ms);
  fclose(f);
}

static const char *
content_of(json_object *msg)
{
  json_object *v = NULL;
  assert_true(json_object_object_get_ex(msg, "content", &v));
  return json_object_get_string(v);
}

static void
test_model_name_selects_transcript(void **state)
{
  loaded_t l;
  convo_t c;
  eph_model_response_t r;
  eph_error_t err = {0};
  char dir[] = "/tmp/eph-replay-select-XXXXXX";
  char cwd[4096];
  assert_non_null(mkdtemp(dir));
  cleanup_free char *path = eph_xasprintf("%s/other.jsonl", dir);
  write_one_line_transcript(path, "from the other transcript", 0);

  load_replay(&l, NULL); /* no configured transcript */
  convo_init(&c, "openai/gpt-6-luna");
  assert_int_equal(model_call(&l, &c.req, &r, &err), -EPH_E_CONFIG);
  assert_non_null(strstr(err.message, "replay:PATH"));

  cleanup_free char *model = eph_xasprintf("replay:%s", path);
  c.req.model = model;
  if (model_call(&l, &c.req, &r, &err) < 0)
    fail_msg("%s", err.message);
  assert_string_equal(content_of(r.message), "from the other transcript");
  assert_int_equal(r.input_tokens, 7);
  assert_int_equal(r.output_tokens, 3);
  eph_model_response_clear(&r);

  /* Relative to the current directory. */
  assert_non_null(getcwd(cwd, sizeof cwd));
  assert_int_equal(chdir(dir), 0);
  c.req.model = "replay:other.jsonl";
  int ret = model_call(&l, &c.req, &r, &err);
  assert_int_equal(chdir(cwd), 0);
  if (ret < 0)
    fail_msg("%s", err.message);
  assert_string_equal(content_of(r.message), "from the other transcript");
  eph_model_response_clear(&r);

  c.req.model = "replay:/nonexistent/transcript.jsonl";
  assert_true(model_call(&l, &c.req, &r, &err) < 0);
  assert_non_null(strstr(err.message, "/nonexistent/transcript.jsonl"));
  convo_end(&l, &c);

  /* "replay:" wins over the configured transcript. */
  load_example(&l);
  convo_init(&c, model);
  assert_int_equal(model_call(&l, &c.req, &r, &err), 0);
  assert_string_equal(content_of(r.message), "from the other transcript");
  eph_model_response_clear(&r);
  convo_end(&l, &c);
  unlink(path);
  rmdir(dir);
}

/* A transcript line is one JSON object and blanks, read to its length: bytes after the
 * object (another object, text, or text behind a NUL) are an error naming the line, as
 * model-openai refuses such a body, not a silently shorter response. */
static void
test_line_with_bytes_after_the_object_refused(void **state)
{
  static const char body[] =
      "{\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"hi\"},"
      "\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}";
  static const char *const tails[] = {" {\"x\":1}\n", " trailing\n", "\0{\"x\":1}\n"};
  static const size_t tail_len[] = {9, 10, 9};
  char dir[] = "/tmp/eph-replay-tail-XXXXXX";
  assert_non_null(mkdtemp(dir));
  cleanup_free char *path = eph_xasprintf("%s/t.jsonl", dir);
  cleanup_free char *model = eph_xasprintf("replay:%s", path);
  loaded_t l;
  load_replay(&l, NULL);
  for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(body, 1, sizeof body - 1, f), sizeof body - 1);
    assert_int_equal(fwrite(tails[i], 1, tail_len[i], f), tail_len[i]);
    fclose(f);
    convo_t c;
    eph_model_response_t r = {.struct_size = sizeof r};
    eph_error_t err = {0};
    convo_init(&c, model);
    assert_int_equal(model_call(&l, &c.req, &r, &err), -EPH_E_PROTOCOL);
    assert_non_null(strstr(err.message, "t.jsonl:1"));
    assert_non_null(strstr(err.message, "bytes after the object"));
    convo_free(&c);
  }
  /* The same line without the tail replays. */
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "%s\n", body);
  fclose(f);
  convo_t c;
  eph_model_response_t r = {.struct_size = sizeof r};
  eph_error_t err = {0};
  convo_init(&c, model);
  if (model_call(&l, &c.req, &r, &err) < 0)
    fail_msg("%s", err.message);
  assert_string_equal(content_of(r.message), "hi");
  eph_model_response_clear(&r);
  convo_end(&l, &c);
  unlink(path);
  rmdir(dir);
}

/* conf.d's relative `transcript` is found under the data directory (the source tree here). */
static void
test_configured_transcript_under_data_dir(void **state)
{
  loaded_t l;
  convo_t c;
  eph_model_response_t r;
  eph_error_t err = {0};
  const char *saved = test_host.data_dir;
  char cwd[4096];
  assert_non_null(getcwd(cwd, sizeof cwd));
  assert_int_equal(chdir("/"), 0); /* not found relative to the current directory */
  test_host.data_dir = srcdir();
  load_replay(&l, "transcript = \"examples/sandbox-proof/transcript.jsonl\";");
  test_host.data_dir = saved;
  convo_init(&c, "openai/gpt-6-luna");
  int ret = model_call(&l, &c.req, &r, &err);
  assert_int_equal(chdir(cwd), 0);
  if (ret < 0)
    fail_msg("%s", err.message);
  assert_string_equal(tool_command(r.message, 0), "pwd; whoami");
  eph_model_response_clear(&r);
  convo_end(&l, &c);
}

static void
test_pace_follows_recorded_latency(void **state)
{
  loaded_t l;
  convo_t c;
  eph_model_response_t r;
  eph_error_t err = {0};
  char dir[] = "/tmp/eph-replay-pace-XXXXXX";
  assert_non_null(mkdtemp(dir));
  cleanup_free char *path = eph_xasprintf("%s/t.jsonl", dir);
  write_one_line_transcript(path, "paced", 300);
  cleanup_free char *conf = eph_xasprintf("transcript = \"%s\"; pace = true;", path);
  load_replay(&l, conf);
  convo_init(&c, "openai/gpt-6-luna");
  int64_t t0 = eph_now_ms();
  assert_int_equal(model_call(&l, &c.req, &r, &err), 0);
  int64_t took = eph_now_ms() - t0;
  if (took < 300 || took > 1000)
    fail_msg("paced answer after %lld ms, recorded 300", (long long)took);
  eph_model_response_clear(&r);

  c.req.deadline_ms = eph_now_ms() + 100;
  t0 = eph_now_ms();
  assert_int_equal(model_call(&l, &c.req, &r, &err), -ETIMEDOUT);
  took = eph_now_ms() - t0;
  assert_true(took >= 90 && took < 250);
  convo_end(&l, &c);
  unlink(path);
  rmdir(dir);
}

/* model-openai's raw bodies, written one per line (what --record does), replay to the same
 * messages and token counts: the example lines are served by fake-openai. */
static void
test_recorded_raw_bodies_replay_identically(void **state)
{
  cleanup_free char *so = eph_xasprintf("%s/plugins/.libs/model-openai.so", builddir());
  if (access(so, R_OK) != 0) {
    skip();
    return;
  }
  char dir[] = "/tmp/eph-replay-record-XXXXXX";
  assert_non_null(mkdtemp(dir));
  cleanup_free char *rec_path = eph_xasprintf("%s/recorded.jsonl", dir);
  cleanup_free char *s1 = eph_xasprintf("line:%s:1", example);
  cleanup_free char *s2 = eph_xasprintf("line:%s:2", example);
  cleanup_free char *s3 = eph_xasprintf("line:%s:3", example);
  const char *steps[] = {s1, s2, s3, NULL};
  fake_t f;
  fake_start(&f, "sk-record-test-key-000000000000", steps);
  setenv("EPH_TEST_RECORD_KEY", "sk-record-test-key-000000000000", 1);

  loaded_t live, replay;
  eph_error_t err = {0};
  cleanup_free char *conf = eph_xasprintf(
      "base_url = \"http://127.0.0.1:%d/v1\"; api_key_env = \"EPH_TEST_RECORD_KEY\";", f.port);
  if (plugin_load(&live, "model-openai", conf, &err) < 0)
    fail_msg("%s", err.message);
  convo_t c;
  convo_init(&c, "openai/gpt-6-luna");
  json_object *live_msgs[3];
  FILE *rec = fopen(rec_path, "w");
  assert_non_null(rec);
  for (int i = 0; i < 3; i++) {
    eph_model_response_t r;
    if (model_call(&live, &c.req, &r, &err) < 0)
      fail_msg("live call %d: %s", i + 1, err.message);
    fprintf(rec, "%s\n", json_object_to_json_string_ext(r.raw, JSON_C_TO_STRING_PLAIN));
    live_msgs[i] = json_object_get(r.message);
    convo_answer(&c, r.message, 0);
    eph_model_response_clear(&r);
  }
  fclose(rec);
  convo_free(&c);
  plugin_unload(&live);
  fake_stop(&f);

  cleanup_free char *rconf = eph_xasprintf("transcript = \"%s\";", rec_path);
  load_replay(&replay, rconf);
  convo_init(&c, "openai/gpt-6-luna");
  for (int i = 0; i < 3; i++) {
    eph_model_response_t r;
    if (model_call(&replay, &c.req, &r, &err) < 0)
      fail_msg("replayed call %d: %s", i + 1, err.message);
    /* The answer (line 3) quotes the tool results: the replay fills them in. */
    if (i < 2)
      assert_true(json_object_equal(r.message, live_msgs[i]));
    else
      assert_null(strstr(json_object_get_string(r.message), "{{call_"));
    convo_answer(&c, r.message, 0);
    eph_model_response_clear(&r);
    json_object_put(live_msgs[i]);
  }
  convo_free(&c);
  plugin_unload(&replay);
  unlink(rec_path);
  rmdir(dir);
}

/* An answer quoting a tool call the run did not make, or a field its result lacks, is a
 * divergence naming the transcript line; a malformed reference is a transcript error. */
static void
test_quoted_results_must_exist(void **state)
{
  static const char *const cases[][2] = {
      {"pwd is {{call_2.stdout}}", "the run made 1 tool call"},
      {"pwd is {{call_1.nosuch}}", "has no 'nosuch'"},
      {"pwd is {{call_1.stdout#9}}", "fewer lines"},
      {"pwd is {{call_x}}", "is not {{call_N.FIELD}}"},
  };
  char dir[] = "/tmp/eph-replay-quote.XXXXXX";
  assert_non_null(mkdtemp(dir));
  cleanup_free char *path = eph_xasprintf("%s/t.jsonl", dir);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "{\"object\":\"chat.completion\",\"model\":\"m\",\"choices\":[{\"index\":0,"
            "\"message\":{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":"
            "\"c1\",\"type\":\"function\",\"function\":{\"name\":\"shell\",\"arguments\":"
            "\"{}\"}}]},\"finish_reason\":\"tool_calls\"}],\"usage\":{\"prompt_tokens\":1,"
            "\"completion_tokens\":1}}\n"
            "{\"object\":\"chat.completion\",\"model\":\"m\",\"choices\":[{\"index\":0,"
            "\"message\":{\"role\":\"assistant\",\"content\":\"%s\"},\"finish_reason\":"
            "\"stop\"}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n",
            cases[i][0]);
    fclose(f);
    loaded_t l;
    convo_t c;
    eph_model_response_t r;
    eph_error_t err = {0};
    cleanup_free char *model = eph_xasprintf("replay:%s", path);
    load_replay(&l, "");
    convo_init(&c, model);
    if (model_call(&l, &c.req, &r, &err) < 0)
      fail_msg("call 1: %s", err.message);
    convo_answer(&c, r.message, 0);
    eph_model_response_clear(&r);
    assert_true(model_call(&l, &c.req, &r, &err) < 0);
    if (!strstr(err.message, cases[i][1]) || !strstr(err.message, "t.jsonl:2"))
      fail_msg("case %zu: %s", i, err.message);
    assert_int_equal(err.code, i == 3 ? EPH_E_PROTOCOL : EPH_E_DIVERGED);
    convo_end(&l, &c);
  }
  unlink(path);
  rmdir(dir);
  (void)state;
}

/* Replays the example's three calls on c (a fresh conversation), returning the final
 * answer's text (owned by the caller). */
static char *
replay_three(loaded_t *l, convo_t *c)
{
  eph_model_response_t r;
  eph_error_t err = {0};
  for (int call = 1; call <= 2; call++) {
    if (model_call(l, &c->req, &r, &err) < 0)
      fail_msg("call %d: %s", call, err.message);
    convo_answer(c, r.message, 0);
    eph_model_response_clear(&r);
  }
  if (model_call(l, &c->req, &r, &err) < 0)
    fail_msg("call 3: %s", err.message);
  char *answer = eph_xstrdup(content_of(r.message));
  eph_model_response_clear(&r);
  return answer;
}

static void
write_text(const char *path, const char *text)
{
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  assert_int_equal(fputs(text, f) >= 0, 1);
  assert_int_equal(fclose(f), 0);
}

static size_t
count_of(const char *text, const char *needle)
{
  size_t n = 0;
  for (const char *p = text; (p = strstr(p, needle)); p++)
    n++;
  return n;
}

/* A run's calls parse its transcript once, not once per call (which made a run's cost grow
 * with the square of its length); a transcript edited between calls is still read as it
 * is at the call, never as it was cached. */
static void
test_transcript_parsed_once_per_content(void **state)
{
  char dir[] = "/tmp/eph-replay-cache-XXXXXX";
  assert_non_null(mkdtemp(dir));
  cleanup_free char *path = eph_xasprintf("%s/t.jsonl", dir);
  cleanup_free char *text = NULL;
  eph_error_t err = {0};
  if (eph_read_file(example, 1 << 20, &text, NULL, &err) < 0)
    fail_msg("%s", err.message);
  write_text(path, text);
  cleanup_free char *conf = eph_xasprintf("transcript = \"%s\";", path);
  loaded_t l;
  convo_t c;
  load_replay(&l, conf);

  eph_log_set_level(EPH_LOG_DEBUG);
  capture_begin();
  convo_init(&c, "openai/gpt-6-luna");
  cleanup_free char *first = replay_three(&l, &c);
  convo_free(&c);
  cleanup_free char *log1 = capture_end();
  assert_non_null(strstr(first, "The network call did not succeed."));
  assert_int_equal(count_of(log1, "responses parsed"), 1);
  assert_int_equal(count_of(log1, "replayed "), 3);

  /* The same file rewritten in place: the next run answers with what it says now. */
  char *at = strstr(text, "The network call did not succeed.");
  assert_non_null(at);
  memcpy(at, "The network call was edited away.", strlen("The network call did not succeed."));
  write_text(path, text);
  capture_begin();
  convo_init(&c, "openai/gpt-6-luna");
  cleanup_free char *second = replay_three(&l, &c);
  convo_free(&c);
  cleanup_free char *log2 = capture_end();
  eph_log_set_level(EPH_LOG_ERROR);
  assert_non_null(strstr(second, "The network call was edited away."));
  assert_int_equal(count_of(log2, "responses parsed"), 1);

  plugin_unload(&l);
  unlink(path);
  rmdir(dir);
  (void)state;
}

int
main(void)
{
  harness_init();
  eph_log_set_level(EPH_LOG_ERROR);
  snprintf(example, sizeof example, "%s/examples/sandbox-proof/transcript.jsonl", srcdir());
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_example_replays_three_calls),
      cmocka_unit_test(test_recorded_prime_command_runs),
      cmocka_unit_test(test_changed_arguments_diverge),
      cmocka_unit_test(test_arguments_compared_as_json),
      cmocka_unit_test(test_missing_tool_result_diverges),
      cmocka_unit_test(test_exhausted_transcript_diverges),
      cmocka_unit_test(test_unoffered_tool_is_not_divergence),
      cmocka_unit_test(test_model_name_selects_transcript),
      cmocka_unit_test(test_line_with_bytes_after_the_object_refused),
      cmocka_unit_test(test_configured_transcript_under_data_dir),
      cmocka_unit_test(test_pace_follows_recorded_latency),
      cmocka_unit_test(test_recorded_raw_bodies_replay_identically),
      cmocka_unit_test(test_quoted_results_must_exist),
      cmocka_unit_test(test_transcript_parsed_once_per_content),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
