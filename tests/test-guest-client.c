/* The core's guest client facing a broken or hostile guest (raw frames, wrong replies, a
 * silent peer), its output capture, and the shell tool plugin over a real ephemeral-guest
 * (tests/guest_fixture.c). Needs root for the real guest: those cases skip otherwise. */
#include <config.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <libconfig.h>

#include "conf.h"
#include "guest_client.h"
#include "guest_fixture.h"
#include "protocol.h"
#include "util.h"

/* Reads frames from the raw stream until one of type `type`; returns it (owned). */
static json_object *
raw_expect(int fd, const char *type)
{
  eph_frame_reader_t rd = {0};
  json_object *o = NULL;
  int64_t end = eph_now_ms() + 10000;
  while (eph_now_ms() < end) {
    int r = eph_frame_reader_feed(&rd, fd, &o);
    if (r == 1) {
      const char *t = eph_json_get_string(o, "type");
      if (t && strcmp(t, type) == 0)
        break;
      json_object_put(o);
      o = NULL;
    } else if (r < 0) {
      break;
    }
  }
  eph_frame_reader_clear(&rd);
  return o;
}

static void
expect_session_ends(const unsigned char *bytes, size_t n, const char *why_part)
{
  guest_proc_t gp;
  spawn_guest(&gp);
  json_object *hello = raw_expect(gp.fd, "hello");
  assert_non_null(hello);
  json_object_put(hello);
  assert_int_equal(write(gp.fd, bytes, n), (ssize_t)n);
  json_object *e = raw_expect(gp.fd, "error");
  assert_non_null(e);
  json_object *fatal;
  assert_true(json_object_object_get_ex(e, "fatal", &fatal) && json_object_get_boolean(fatal));
  assert_non_null(strstr(eph_json_get_string(e, "message"), why_part));
  json_object_put(e);
  /* Then the stream ends and the guest exits by itself, with status 1 (not a crash). */
  char c; /* 0, or ECONNRESET when the guest left our extra bytes unread */
  assert_true(read(gp.fd, &c, 1) <= 0);
  assert_int_equal(wait_exit(gp.pid, 10000), 1);
  close(gp.fd);
}

static void
test_garbage_and_oversized_frames(void **state)
{
  (void)state;
  static const unsigned char garbage[] = "\x00\x00\x00\x10GET / HTTP/1.1\r\n";
  expect_session_ends(garbage, sizeof garbage - 1, "not JSON");
  static const unsigned char oversized[] = {0x7f, 0xff, 0xff, 0xff, '{'};
  expect_session_ends(oversized, sizeof oversized, "outside 1..");
  static const unsigned char array[] = "\x00\x00\x00\x02[]";
  expect_session_ends(array, sizeof array - 1, "not exactly one JSON object");
  static const unsigned char two[] = "\x00\x00\x00\x04{}{}";
  expect_session_ends(two, sizeof two - 1, "not exactly one JSON object");
  unsigned char rnd[4096];
  eph_random_bytes(rnd, sizeof rnd);
  rnd[0] = 0x00; /* a 256-byte frame of random bytes */
  rnd[1] = 0x00;
  rnd[2] = 0x01;
  rnd[3] = 0x00;
  rnd[4] = '\x01'; /* never valid JSON */
  expect_session_ends(rnd, sizeof rnd, "JSON");

  /* Well-formed frames with bad content get a per-request error; the session goes on. */
  guest_proc_t gp;
  start_guest(&gp);
  eph_error_t err = {0};
  eph_exec_request_t req = {.struct_size = sizeof req, .command = "true", .cwd = "relative"};
  eph_exec_result_t res;
  assert_int_equal(eph_guest_exec(gp.g, &req, &res, &err), -EINVAL);
  assert_non_null(strstr(err.message, "cwd"));
  assert_false(eph_guest_broken(gp.g));
  guest_run(&gp, "echo still", 0, &res);
  assert_string_equal(res.stdout_text, "still\n");
  eph_exec_result_clear(&res);
  stop_guest(&gp);
}

/* A broken guest on the other side: the client reports it and never crashes. */
static void
test_client_rejects_bad_guest(void **state)
{
  (void)state;
  static const struct {
    const char *bytes;
    size_t n;
    int code;
  } cases[] = {
      {"\xff\xff\xff\xff", 4, EPH_E_PROTOCOL},
      {"\x00\x00\x00\x05hello", 9, EPH_E_PROTOCOL},
      {"\x00\x00\x00\x1c{\"type\":\"hello\",\"version\":2}", 32, EPH_E_PROTOCOL},
      {"\x00\x00\x00\x0a{\"type\":1}", 14, EPH_E_PROTOCOL},
      {"\x00\x00", 2, EPH_E_PROTOCOL}, /* ends inside a frame */
      {"", 0, EPIPE},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    assert_int_equal(write(sv[1], cases[i].bytes, cases[i].n), (ssize_t)cases[i].n);
    close(sv[1]);
    eph_guest_t *g = NULL;
    eph_error_t err = {0};
    int r = eph_guest_open(sv[0], eph_now_ms() + 2000, &g, &err);
    assert_int_equal(r, -cases[i].code);
    assert_null(g);
  }
  /* Silence: the hello deadline holds. */
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  eph_guest_t *g = NULL;
  eph_error_t err = {0};
  int64_t t0 = eph_now_ms();
  assert_int_equal(eph_guest_open(sv[0], t0 + 300, &g, &err), -ETIMEDOUT);
  assert_true(eph_now_ms() - t0 >= 300);
  close(sv[1]);
}

/* Writes obj as one frame to fd (the fake guest's side of a socketpair). */
static void
fake_send(int fd, const char *json)
{
  json_object *o = json_tokener_parse(json);
  assert_non_null(o);
  assert_int_equal(eph_proto_write_frame(fd, o), 0);
  json_object_put(o);
}

/* A guest answering the right id with the wrong type. The client used to free the frame
 * and then print its `type` into the error (a use-after-free ASan reports); now the error
 * names the type and the connection is marked unusable. */
static void
test_client_wrong_reply_type(void **state)
{
  (void)state;
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  fake_send(sv[1], "{\"type\":\"hello\",\"version\":1,\"scratch\":\"/s\",\"kernel\":\"k\"}");
  /* Request 1 will be list_dir; its reply comes with another type (a long one, so a
   * freed string would be a real heap block). */
  fake_send(sv[1], "{\"type\":\"entries-but-not-really-the-type-that-was-asked-for\",\"id\":1}");
  eph_guest_t *g = NULL;
  eph_error_t err = {0};
  assert_int_equal(eph_guest_open(sv[0], eph_now_ms() + 2000, &g, &err), 0);
  eph_dirent_t *ents = NULL;
  size_t n = 0;
  int r = eph_guest_list(g, "", &ents, &n, &err);
  assert_int_equal(r, -EPH_E_PROTOCOL);
  assert_non_null(strstr(err.message, "got 'entries-but-not-really"));
  assert_true(eph_guest_broken(g));
  eph_guest_close(g);
  close(sv[1]);

  /* The same handling from bytes alone, as the fuzz target drives it. */
  static const struct {
    const char *body;
    int64_t id;
    int want_r;
    bool fatal;
    size_t extra; /* bytes after the string's end counted in (its NUL) */
  } cases[] = {
      {"{\"type\":\"entries\",\"id\":3}", 3, EPH_GUEST_REPLY_MATCH, false, 0},
      {"{\"type\":\"entries\",\"id\":2}", 3, EPH_GUEST_REPLY_STALE, false, 0},
      {"{\"type\":\"pong\",\"id\":3}", 3, -EPH_E_PROTOCOL, true, 0},
      {"{\"id\":3}", 3, -EPH_E_PROTOCOL, true, 0},
      {"{\"type\":\"error\",\"id\":3,\"errno\":2,\"message\":\"m\"}", 3, -ENOENT, false, 0},
      {"{\"type\":\"error\",\"fatal\":true}", 3, -EPH_E_PROTOCOL, true, 0},
      {"{\"type\":\"entries\",\"id\":3}{}", 3, -EPH_E_PROTOCOL, true, 0},
      {"[1]", 3, -EPH_E_PROTOCOL, true, 0},
      {"{\"type\":\"entries\",\"id\":3}", 3, -EPH_E_PROTOCOL, true, 1}, /* a NUL after it */
      /* json-c's comment extension is not JSON (the frame fuzzer's find) */
      {"{\"type\":\"entries\",\"id\":3}//x", 3, -EPH_E_PROTOCOL, true, 0},
      {"{\"type\":\"entries\",/*x*/\"id\":3}", 3, -EPH_E_PROTOCOL, true, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    json_object *out = NULL;
    bool fatal = false;
    eph_error_t e = {0};
    size_t len = strlen(cases[i].body) + cases[i].extra;
    r = eph_guest_reply_bytes(cases[i].body, len, cases[i].id, "entries", &out, &fatal, &e);
    assert_int_equal(r, cases[i].want_r);
    assert_int_equal(fatal, cases[i].fatal);
    assert_true((out != NULL) == (r == EPH_GUEST_REPLY_MATCH));
    json_object_put(out);
  }
}

static void
test_capture(void **state)
{
  (void)state;
  eph_capture_t c;
  size_t n;
  int trunc;
  uint64_t dropped;
  eph_capture_init(&c, 10);
  eph_capture_add(&c, "abc", 3);
  char *s = eph_capture_finish(&c, &n, &trunc, &dropped);
  assert_string_equal(s, "abc");
  assert_int_equal(trunc, 0);
  free(s);

  eph_capture_init(&c, 10);
  eph_capture_add(&c, "0123456789", 10); /* exactly the cap: nothing dropped */
  s = eph_capture_finish(&c, &n, &trunc, &dropped);
  assert_string_equal(s, "0123456789");
  assert_int_equal(trunc, 0);
  free(s);

  eph_capture_init(&c, 10);
  for (char ch = 'a'; ch <= 'z'; ch++) /* byte by byte through the ring */
    eph_capture_add(&c, &ch, 1);
  s = eph_capture_finish(&c, &n, &trunc, &dropped);
  assert_string_equal(s, "abcde\n[... 16 bytes dropped ...]\nvwxyz");
  assert_int_equal(trunc, 1);
  assert_int_equal(dropped, 16);
  assert_int_equal(n, strlen(s));
  free(s);

  eph_capture_init(&c, 10);
  eph_capture_add(&c, "ABCDEFG", 7);
  eph_capture_add(&c, "HIJKLMNOPQRSTUVWXYZ", 19); /* one chunk larger than the tail */
  eph_capture_add(&c, "12", 2);
  s = eph_capture_finish(&c, &n, &trunc, &dropped);
  assert_string_equal(s, "ABCDE\n[... 18 bytes dropped ...]\nXYZ12");
  free(s);
}

/* ---------------------------------------------------------------- the shell tool */

/* A fake core for the tool-shell plugin: its sandbox_exec reaches a real guest. */
static eph_guest_t *tool_guest;

static int
fake_sandbox_exec(eph_run_t *run, const eph_exec_request_t *req, eph_exec_result_t *result,
                  eph_error_t *err)
{
  (void)run;
  return eph_guest_exec(tool_guest, req, result, err);
}

static json_object *
tool_call(const eph_plugin_t *p, void *st, const char *args_json, int64_t deadline_ms)
{
  const eph_tool_ops_t *ops = p->ops;
  json_object *args = json_tokener_parse(args_json);
  assert_non_null(args);
  eph_tool_call_t call = {.struct_size = sizeof call,
                          .run_id = "run_test",
                          .tool = "shell",
                          .args = args,
                          .deadline_ms = deadline_ms};
  json_object *result = NULL;
  eph_error_t err = {0};
  int r = ops->call(st, &call, &result, &err);
  json_object_put(args);
  if (r < 0)
    fail_msg("shell call: %s", err.message);
  return result;
}

static const char *
jstr(json_object *o, const char *key)
{
  json_object *v;
  return json_object_object_get_ex(o, key, &v) ? json_object_get_string(v) : NULL;
}

static int64_t
jint(json_object *o, const char *key)
{
  json_object *v;
  return json_object_object_get_ex(o, key, &v) ? json_object_get_int64(v) : -999;
}

static void
test_shell_tool(void **state)
{
  (void)state;
  const char *b = getenv("EPH_BUILDDIR");
  char so[4096];
  snprintf(so, sizeof so, "%s/plugins/.libs/tool-shell.so", b ? b : EPH_BUILDDIR);
  void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!h)
    skip(); /* built with --disable-tool-shell */
  const eph_plugin_t *p = dlsym(h, EPH_PLUGIN_SYMBOL);
  assert_non_null(p);
  assert_string_equal(p->name, "tool-shell");
  assert_int_equal(p->kind, EPH_KIND_TOOL);
  const eph_tool_ops_t *ops = p->ops;
  assert_int_equal(ops->n_tools, 1);
  assert_string_equal(ops->tools[0].name, "shell");
  assert_int_equal(ops->tools[0].permission, EPH_PERM_SHELL);
  json_object *schema = json_tokener_parse(ops->tools[0].parameters_json);
  assert_non_null(schema);
  json_object_put(schema);

  guest_proc_t gp;
  start_guest(&gp);
  tool_guest = gp.g;
  eph_host_t host = {.struct_size = sizeof host,
                     .abi_major = EPH_ABI_MAJOR,
                     .abi_minor = EPH_ABI_MINOR,
                     .cfg_int = eph_cfg_int,
                     .cfg_bool = eph_cfg_bool,
                     .cfg_string = eph_cfg_string,
                     .sandbox_exec = fake_sandbox_exec,
                     .exec_result_clear = eph_exec_result_clear};
  config_t cfg;
  config_init(&cfg);
  assert_int_equal(config_read_string(&cfg,
                                      "tool-shell: { output_cap_bytes = 100; "
                                      "max_timeout_seconds = 2; default_timeout_seconds = 2; };"),
                   CONFIG_TRUE);
  void *st = NULL;
  eph_error_t err = {0};
  assert_int_equal(p->init(&host, config_lookup(&cfg, "tool-shell"), &st, &err), 0);

  json_object *r = tool_call(p, st, "{\"command\":\"echo hi; echo err >&2; exit 2\"}", 0);
  assert_int_equal(jint(r, "exit_code"), 2);
  assert_string_equal(jstr(r, "stdout"), "hi\n");
  assert_string_equal(jstr(r, "stderr"), "err\n");
  assert_string_equal(jstr(r, "reason"), "exited");
  assert_string_equal(jstr(r, "stdout_truncated"), "false");
  assert_true(jint(r, "duration_ms") >= 0);
  assert_int_equal(jint(r, "signal"), -999);
  json_object_put(r);

  /* The configured cap: head and tail of 50 bytes each, the middle replaced. */
  r = tool_call(p, st, "{\"command\":\"seq 1 10000\"}", 0);
  assert_string_equal(jstr(r, "stdout_truncated"), "true");
  assert_non_null(strstr(jstr(r, "stdout"), "bytes dropped ...]"));
  assert_memory_equal(jstr(r, "stdout"), "1\n2\n3\n", 6);
  const char *out = jstr(r, "stdout");
  assert_string_equal(out + strlen(out) - 6, "10000\n");
  json_object_put(r);

  /* A timeout above max_timeout_seconds (2) is lowered to it. */
  int64_t t0 = eph_now_ms();
  r = tool_call(p, st, "{\"command\":\"sleep 20\",\"timeout_seconds\":100}", 0);
  assert_string_equal(jstr(r, "reason"), "timeout");
  assert_int_equal(jint(r, "signal"), SIGKILL);
  assert_int_equal(jint(r, "exit_code"), 128 + SIGKILL);
  assert_true(eph_now_ms() - t0 < 6000);
  json_object_put(r);

  /* The run deadline cuts a command short too. */
  t0 = eph_now_ms();
  r = tool_call(p, st, "{\"command\":\"sleep 20\"}", t0 + 400);
  assert_string_equal(jstr(r, "reason"), "timeout");
  json_object_put(r);
  r = tool_call(p, st, "{\"command\":\"true\"}", eph_now_ms() - 1);
  assert_non_null(jstr(r, "error"));
  json_object_put(r);

  /* Bytes that are not UTF-8 reach the model as U+FFFD, so the result is valid JSON. */
  r = tool_call(p, st, "{\"command\":\"printf 'a\\\\377b\\\\000c'\"}", 0);
  assert_string_equal(jstr(r, "stdout"), "a\xef\xbf\xbd"
                                         "b\xef\xbf\xbd"
                                         "c");
  json_object_put(r);

  /* Bad arguments are answers for the model, not tool failures. */
  r = tool_call(p, st, "{}", 0);
  assert_non_null(strstr(jstr(r, "error"), "command"));
  json_object_put(r);
  r = tool_call(p, st, "{\"command\":\"true\",\"timeout_seconds\":\"soon\"}", 0);
  assert_non_null(strstr(jstr(r, "error"), "timeout_seconds"));
  json_object_put(r);

  p->fini(st);
  config_destroy(&cfg);
  stop_guest(&gp);
  tool_guest = NULL;
  dlclose(h);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_capture),
      cmocka_unit_test(test_client_rejects_bad_guest),
      cmocka_unit_test(test_client_wrong_reply_type),
      cmocka_unit_test(test_garbage_and_oversized_frames),
      cmocka_unit_test(test_shell_tool),
  };
  return cmocka_run_group_tests(tests, guest_fixture_setup, NULL);
}
