#include <config.h>

#include "model-harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "context.h"
#include "host.h"
#include "log.h"
#include "util.h"

eph_host_t test_host;
static eph_ctx_t test_ctx;

const char *
builddir(void)
{
  const char *b = getenv("EPH_BUILDDIR");
  return b ? b : EPH_BUILDDIR;
}

const char *
srcdir(void)
{
  const char *s = getenv("EPH_SRCDIR");
  return s ? s : EPH_SRCDIR;
}

void
harness_init(void)
{
  /* The fake server is on 127.0.0.1: a proxy from the environment must not intercept. */
  unsetenv("http_proxy");
  unsetenv("HTTP_PROXY");
  unsetenv("https_proxy");
  unsetenv("HTTPS_PROXY");
  unsetenv("ALL_PROXY");
  unsetenv("all_proxy");
  signal(SIGPIPE, SIG_IGN);
  test_ctx.state_dir = "/tmp";
  eph_host_init(&test_host, &test_ctx);
}

void
fake_start(fake_t *f, const char *key, const char *const *steps)
{
  int out[2], in[2];
  const char *argv[64];
  size_t n = 0;
  cleanup_free char *prog = eph_xasprintf("%s/tests/fake-openai", builddir());

  memset(f, 0, sizeof *f);
  snprintf(f->dir, sizeof f->dir, "/tmp/eph-fake-openai-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  snprintf(f->record, sizeof f->record, "%s/requests.jsonl", f->dir);
  argv[n++] = prog;
  argv[n++] = "--record";
  argv[n++] = f->record;
  if (key) {
    argv[n++] = "--key";
    argv[n++] = key;
  }
  for (size_t i = 0; steps && steps[i] && n < 62; i++)
    argv[n++] = steps[i];
  argv[n] = NULL;

  assert_int_equal(pipe2(out, O_CLOEXEC), 0);
  assert_int_equal(pipe2(in, O_CLOEXEC), 0);
  f->pid = fork();
  assert_true(f->pid >= 0);
  if (f->pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    execv(prog, (char *const *)argv);
    _exit(127);
  }
  close(out[1]);
  close(in[0]);
  f->stdin_fd = in[1];
  char buf[32] = {0};
  ssize_t got = 0, r;
  while (got < (ssize_t)sizeof buf - 1 && (r = read(out[0], buf + got, sizeof buf - 1 - got)) > 0) {
    got += r;
    if (memchr(buf, '\n', (size_t)got))
      break;
  }
  close(out[0]);
  f->port = atoi(buf);
  if (f->port <= 0)
    fail_msg("fake-openai (%s) did not print its port", prog);
}

void
fake_stop(fake_t *f)
{
  int status;
  if (f->pid <= 0)
    return;
  close(f->stdin_fd);
  waitpid(f->pid, &status, 0);
  f->pid = 0;
  unlink(f->record);
  rmdir(f->dir);
}

json_object *
fake_requests(const fake_t *f)
{
  json_object *arr = json_object_new_array();
  FILE *fp = fopen(f->record, "r");
  char *line = NULL;
  size_t cap = 0;
  if (!fp)
    return arr;
  while (getline(&line, &cap, fp) > 0) {
    json_object *o = json_tokener_parse(line);
    assert_non_null(o);
    json_object_array_add(arr, o);
  }
  free(line);
  fclose(fp);
  return arr;
}

int
plugin_load(loaded_t *l, const char *name, const char *conf, eph_error_t *err)
{
  memset(l, 0, sizeof *l);
  config_init(&l->cfg);
  cleanup_free char *text = eph_xasprintf("%s: { %s };\n", name, conf ? conf : "");
  if (config_read_string(&l->cfg, text) != CONFIG_TRUE)
    fail_msg("test config does not parse: %s: %s", config_error_text(&l->cfg), text);
  cleanup_free char *path = eph_xasprintf("%s/plugins/.libs/%s.so", builddir(), name);
  int r = eph_plugin_load_file(&l->ps, path, config_lookup(&l->cfg, name), &test_host, NULL, err);
  if (r == 0) {
    l->slot = eph_plugins_find(&l->ps, name);
    assert_non_null(l->slot);
    assert_int_equal(l->slot->desc->kind, EPH_KIND_MODEL);
    l->ops = l->slot->desc->ops;
    assert_true(EPH_OPS_HAS(l->ops, eph_model_ops_t, complete));
  }
  return r;
}

void
plugin_unload(loaded_t *l)
{
  eph_plugins_unload(&l->ps);
  config_destroy(&l->cfg);
}

int
model_call(loaded_t *l, const eph_model_request_t *req, eph_model_response_t *resp,
           eph_error_t *err)
{
  memset(resp, 0, sizeof *resp);
  resp->struct_size = sizeof *resp;
  return EPH_WITH_PLUGIN(l->slot, l->ops->complete(l->slot->state, req, resp, err));
}

static int saved_stderr = -1;
static char capture_path[64];

void
capture_begin(void)
{
  snprintf(capture_path, sizeof capture_path, "/tmp/eph-model-stderr-XXXXXX");
  int fd = mkstemp(capture_path);
  assert_true(fd >= 0);
  fflush(stderr);
  saved_stderr = dup(2);
  dup2(fd, 2);
  close(fd);
}

char *
capture_end(void)
{
  char *text = NULL;
  eph_error_t err = {0};
  fflush(stderr);
  dup2(saved_stderr, 2);
  close(saved_stderr);
  saved_stderr = -1;
  if (eph_read_file(capture_path, 1 << 20, &text, NULL, &err) < 0)
    fail_msg("%s", err.message);
  unlink(capture_path);
  return text;
}

/* ------------------------------------------------------------------ one model call */

const char harness_tools_json[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"shell\",\"description\":\"Run a shell "
    "command in the sandbox\",\"parameters\":{\"type\":\"object\",\"properties\":{\"command\":"
    "{\"type\":\"string\"}},\"required\":[\"command\"]}}}]";
const char harness_messages_json[] = "[{\"role\":\"system\",\"content\":\"You drive a sandbox.\"},"
                                     "{\"role\":\"user\",\"content\":\"Run whoami.\"}]";

void
call_init(call_t *c, const char *model, const char *messages, int64_t deadline_in_ms)
{
  memset(c, 0, sizeof *c);
  c->messages = json_tokener_parse(messages);
  c->tools = json_tokener_parse(harness_tools_json);
  assert_non_null(c->messages);
  assert_non_null(c->tools);
  c->req.struct_size = sizeof c->req;
  c->req.model = model;
  c->req.messages = c->messages;
  c->req.tools = c->tools;
  c->req.max_output_tokens = 512;
  c->req.deadline_ms = eph_now_ms() + deadline_in_ms;
}

void
call_run(call_t *c, loaded_t *l)
{
  int64_t t0 = eph_now_ms();
  c->r = model_call(l, &c->req, &c->resp, &c->err);
  c->elapsed_ms = eph_now_ms() - t0;
}

void
call_clear(call_t *c)
{
  eph_model_response_clear(&c->resp);
  json_object_put(c->messages);
  json_object_put(c->tools);
}

void
model_load(const char *name, const char *key_env, loaded_t *l, const fake_t *f, const char *extra)
{
  eph_error_t err = {0};
  cleanup_free char *conf = eph_xasprintf(
      "base_url = \"http://127.0.0.1:%d/v1/\"; api_key_env = \"%s\"; max_retries = 2; "
      "backoff_initial_ms = 100; backoff_max_ms = 400; timeout_ms = 5000; %s",
      f->port, key_env, extra ? extra : "");
  if (plugin_load(l, name, conf, &err) < 0)
    fail_msg("loading %s: %s", name, err.message);
}

void
exchange_run(const provider_case_t *pc, fake_t *f, loaded_t *l, call_t *c, const char *const *steps,
             const char *extra, const char *messages, int64_t deadline_in_ms)
{
  fake_start(f, pc->key, steps);
  model_load(pc->plugin, pc->key_env, l, f, extra);
  call_init(c, pc->model, messages, deadline_in_ms);
  call_run(c, l);
}

void
exchange_end(fake_t *f, loaded_t *l, call_t *c)
{
  call_clear(c);
  plugin_unload(l);
  fake_stop(f);
}

json_object *
same_answer(const provider_case_t *pc, const char *step_a, const char *conf_a, const char *step_b,
            const char *conf_b, const char *messages, bool cache_too, eph_model_response_t *out)
{
  fake_t f1, f2;
  loaded_t l1, l2;
  call_t a, b;
  const char *steps1[] = {step_a, NULL}, *steps2[] = {step_b, NULL};
  fake_start(&f1, pc->key, steps1);
  fake_start(&f2, pc->key, steps2);
  model_load(pc->plugin, pc->key_env, &l1, &f1, conf_a);
  model_load(pc->plugin, pc->key_env, &l2, &f2, conf_b);
  call_init(&a, pc->model, messages, 10000);
  call_init(&b, pc->model, messages, 10000);
  call_run(&a, &l1);
  call_run(&b, &l2);
  if (a.r < 0 || b.r < 0)
    fail_msg("%s: %s / %s: %s", step_a, a.err.message, step_b, b.err.message);
  if (!json_object_equal(a.resp.message, b.resp.message))
    fail_msg("%s gave %s, %s gave %s", step_b, json_object_to_json_string(b.resp.message), step_a,
             json_object_to_json_string(a.resp.message));
  assert_string_equal(a.resp.finish_reason, b.resp.finish_reason);
  assert_int_equal(a.resp.input_tokens, b.resp.input_tokens);
  assert_int_equal(a.resp.output_tokens, b.resp.output_tokens);
  if (cache_too) {
    assert_int_equal(a.resp.cache_read_tokens, b.resp.cache_read_tokens);
    assert_int_equal(a.resp.cache_write_tokens, b.resp.cache_write_tokens);
  }
  *out = b.resp;
  b.resp.message = b.resp.raw = NULL;
  json_object *reqs = fake_requests(&f2);
  exchange_end(&f1, &l1, &a);
  exchange_end(&f2, &l2, &b);
  return reqs;
}

char *
wire(const char *kind, const char *file)
{
  return eph_xasprintf("%s:%s/tests/wire/%s", kind, srcdir(), file);
}

json_object *
request_body(json_object *requests, size_t i)
{
  json_object *rec = json_object_array_get_idx(requests, i), *b = NULL;
  assert_non_null(rec);
  assert_true(json_object_object_get_ex(rec, "body", &b));
  json_object *body = json_tokener_parse(json_object_get_string(b));
  assert_non_null(body);
  return body;
}

json_object *
rec_get(json_object *requests, size_t i, const char *key)
{
  json_object *v = NULL;
  assert_true(json_object_object_get_ex(json_object_array_get_idx(requests, i), key, &v));
  return v;
}

int64_t
request_t_ms(json_object *requests, size_t i)
{
  return json_object_get_int64(rec_get(requests, i, "t_ms"));
}
