/* The host side of the guest protocol. See guest_client.h for the contract and
 * guest/PROTOCOL.md for the messages. */
#include <config.h>

#include "guest_client.h"

#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "../guest/protocol.h"
#include "util.h"

struct eph_guest {
  int fd;
  eph_frame_reader_t rd;
  pthread_mutex_t write_lock; /* one frame at a time; held across that frame's write */
  /* A kill() that found write_lock taken (an operation's frame being written, perhaps to a
   * guest that stopped reading) leaves it here instead of waiting: 1 kill, 2 kill all. The
   * thread holding the lock sends it when its frame is written (unlock_writer). */
  atomic_int kill_pending;
  int64_t next_id;
  int version;
  char *scratch;
  char *kernel;
  bool broken;
  char broken_why[256];
  unsigned char *decode; /* one decoded payload at a time: EPH_PROTO_MAX_FRAME_BYTES */
};

/* ---------------------------------------------------------------- capture */

void
eph_capture_init(eph_capture_t *c, size_t cap_bytes)
{
  memset(c, 0, sizeof *c);
  if (cap_bytes == 0)
    cap_bytes = EPH_GUEST_DEFAULT_OUTPUT_CAP_BYTES;
  if (cap_bytes < 2)
    cap_bytes = 2;
  c->head_cap = cap_bytes / 2;
  c->tail_cap = cap_bytes - c->head_cap;
}

void
eph_capture_add(eph_capture_t *c, const void *data, size_t bytes)
{
  const char *p = data;
  c->total_bytes += bytes;
  if (c->head_len < c->head_cap) {
    size_t take = bytes < c->head_cap - c->head_len ? bytes : c->head_cap - c->head_len;
    if (!c->head)
      c->head = eph_xmalloc(c->head_cap);
    memcpy(c->head + c->head_len, p, take);
    c->head_len += take;
    p += take;
    bytes -= take;
  }
  if (bytes == 0)
    return;
  if (!c->tail)
    c->tail = eph_xmalloc(c->tail_cap);
  /* Only the last tail_cap bytes of this chunk can survive. */
  if (bytes > c->tail_cap) {
    p += bytes - c->tail_cap;
    bytes = c->tail_cap;
  }
  size_t w = (c->tail_pos + c->tail_len) % c->tail_cap;
  size_t first = bytes < c->tail_cap - w ? bytes : c->tail_cap - w;
  memcpy(c->tail + w, p, first);
  memcpy(c->tail, p + first, bytes - first);
  c->tail_len += bytes;
  if (c->tail_len > c->tail_cap) { /* the oldest bytes were overwritten */
    c->tail_pos = (c->tail_pos + c->tail_len - c->tail_cap) % c->tail_cap;
    c->tail_len = c->tail_cap;
  }
}

char *
eph_capture_finish(eph_capture_t *c, size_t *bytes, int *truncated, uint64_t *dropped)
{
  uint64_t kept = c->head_len + c->tail_len;
  uint64_t drop = c->total_bytes - kept;
  char marker[80] = "";
  if (drop > 0)
    snprintf(marker, sizeof marker, "\n[... %" PRIu64 " bytes dropped ...]\n", drop);
  size_t mlen = strlen(marker);
  char *out = eph_xmalloc(kept + mlen + 1);
  size_t o = 0;
  if (c->head_len)
    memcpy(out, c->head, c->head_len);
  o += c->head_len;
  memcpy(out + o, marker, mlen);
  o += mlen;
  for (size_t i = 0; i < c->tail_len; i++)
    out[o++] = c->tail[(c->tail_pos + i) % c->tail_cap];
  out[o] = '\0';
  *bytes = o;
  *truncated = drop > 0;
  *dropped = drop;
  eph_capture_clear(c);
  return out;
}

void
eph_capture_clear(eph_capture_t *c)
{
  free(c->head);
  free(c->tail);
  size_t h = c->head_cap, t = c->tail_cap;
  memset(c, 0, sizeof *c);
  c->head_cap = h;
  c->tail_cap = t;
}

/* ---------------------------------------------------------------- frames */

static int mark_broken(eph_guest_t *g, int code, eph_error_t *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int
mark_broken(eph_guest_t *g, int code, eph_error_t *err, const char *fmt, ...)
{
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (!g->broken) {
    g->broken = true;
    snprintf(g->broken_why, sizeof g->broken_why, "%s", msg);
  }
  return eph_error_set(err, code, "guest: %s", msg);
}

static int
check_usable(eph_guest_t *g, eph_error_t *err)
{
  if (g->broken)
    return eph_error_set(err, EPH_E_PROTOCOL, "guest: connection unusable after: %s",
                         g->broken_why);
  return 0;
}

/* Writes a kill frame; write_lock held. */
static int
write_kill(eph_guest_t *g, bool all)
{
  json_object *o = json_object_new_object();
  json_object_object_add(o, "type", json_object_new_string("kill"));
  json_object_object_add(o, "all", json_object_new_boolean(all));
  int r = eph_proto_write_frame(g->fd, o);
  json_object_put(o);
  return r;
}

/* Releases write_lock, first sending a kill another thread left pending. A kill() whose
 * trylock failed after that check finds its flag seen here, after the unlock: this thread
 * (or whoever holds the lock next, which does the same) sends it. No kill is lost and none
 * waits for another frame. */
static void
unlock_writer(eph_guest_t *g)
{
  for (;;) {
    int k = atomic_exchange(&g->kill_pending, 0);
    if (k)
      (void)write_kill(g, k == 2);
    pthread_mutex_unlock(&g->write_lock);
    if (!atomic_load(&g->kill_pending) || pthread_mutex_trylock(&g->write_lock) != 0)
      return;
  }
}

static int
send_frame(eph_guest_t *g, json_object *obj, eph_error_t *err)
{
  pthread_mutex_lock(&g->write_lock);
  int r = eph_proto_write_frame(g->fd, obj);
  unlock_writer(g);
  if (r == -EMSGSIZE)
    return eph_error_set(err, E2BIG, "guest: request over the %u-byte frame limit",
                         EPH_PROTO_MAX_FRAME_BYTES);
  if (r < 0)
    return mark_broken(g, -r, err, "sending a request: %s", strerror(-r));
  return 0;
}

/* Reads the next frame, waiting until deadline_ms. *out is NULL unless it returns 0 (a
 * caller's loop may put it on any failure, the deadline's included). */
static int
read_frame(eph_guest_t *g, int64_t deadline_ms, json_object **out, eph_error_t *err)
{
  *out = NULL;
  for (;;) {
    int64_t left = deadline_ms - eph_now_ms();
    if (left <= 0)
      return mark_broken(g, ETIMEDOUT, err, "no answer in time");
    struct pollfd p = {.fd = g->fd, .events = POLLIN};
    int pr = poll(&p, 1, left > INT32_MAX ? INT32_MAX : (int)left);
    if (pr < 0 && errno != EINTR)
      return mark_broken(g, errno, err, "poll: %s", strerror(errno));
    if (pr <= 0)
      continue;
    int r = eph_frame_reader_feed(&g->rd, g->fd, out);
    if (r == 1)
      return 0;
    if (r == 0)
      continue;
    if (r == -EPIPE)
      return mark_broken(g, EPIPE, err, "the guest closed the stream");
    if (r == -EPROTO || r == -EMSGSIZE)
      return mark_broken(g, EPH_E_PROTOCOL, err, "%s", g->rd.why);
    return mark_broken(g, -r, err, "reading: %s", strerror(-r));
  }
}

static json_object *
new_request(eph_guest_t *g, const char *type, int64_t *id)
{
  json_object *o = json_object_new_object();
  *id = ++g->next_id;
  json_object_object_add(o, "type", json_object_new_string(type));
  json_object_object_add(o, "id", json_object_new_int64(*id));
  return o;
}

/* Turns an "error" frame into an error. A fatal one (the guest ends the session) sets
 * *fatal; a per-request one keeps the connection usable and carries the guest's errno. */
static int
reply_error(json_object *frame, bool *fatal, eph_error_t *err)
{
  const char *msg = eph_json_get_string(frame, "message");
  int64_t e = EIO;
  eph_proto_int(frame, "errno", &e);
  json_object *fv;
  if (json_object_object_get_ex(frame, "fatal", &fv) && json_object_get_boolean(fv)) {
    *fatal = true;
    return eph_error_set(err, EPH_E_PROTOCOL, "guest: guest ended the session: %s",
                         msg ? msg : "(no message)");
  }
  return eph_error_set(err, e > 0 && e < EPH_E_BASE ? (int)e : EIO, "guest: %s",
                       msg ? msg : "(no message)");
}

int
eph_guest_classify_reply(json_object *frame, int64_t id, const char *want, bool *fatal,
                         eph_error_t *err)
{
  *fatal = false;
  const char *type = eph_json_get_string(frame, "type");
  int64_t fid = -1;
  bool has_id = eph_proto_int(frame, "id", &fid);
  if (type && strcmp(type, "error") == 0 && (!has_id || fid == id))
    return reply_error(frame, fatal, err);
  if (has_id && fid != id)
    return EPH_GUEST_REPLY_STALE;
  if (!type || strcmp(type, want) != 0) {
    /* The message is built while the frame (which owns `type`) is alive. */
    *fatal = true;
    return eph_error_set(err, EPH_E_PROTOCOL,
                         "guest: expected '%s' for request %" PRId64 ", got '%.64s'", want, id,
                         type ? type : "(no type)");
  }
  return EPH_GUEST_REPLY_MATCH;
}

int
eph_guest_reply_bytes(const char *body, size_t len, int64_t id, const char *want, json_object **out,
                      bool *fatal, eph_error_t *err)
{
  *out = NULL;
  *fatal = false;
  char why[160];
  json_object *f = NULL;
  int r = eph_proto_parse_body(body, len, &f, why, sizeof why);
  if (r == -ENOMEM)
    return eph_error_set(err, ENOMEM, "out of memory");
  if (r < 0) {
    *fatal = true;
    return eph_error_set(err, EPH_E_PROTOCOL, "guest: %s", why);
  }
  r = eph_guest_classify_reply(f, id, want, fatal, err);
  if (r == EPH_GUEST_REPLY_MATCH)
    *out = f;
  else
    json_object_put(f);
  return r;
}

/* A verdict of eph_guest_classify_reply that breaks the connection marks it so. */
static int
reply_failed(eph_guest_t *g, int r, bool fatal, eph_error_t *err)
{
  if (fatal && !g->broken) {
    g->broken = true;
    snprintf(g->broken_why, sizeof g->broken_why, "%.200s", err ? err->message : "protocol error");
  }
  return r;
}

/* Waits for the reply to request id: returns the frame (owned by the caller). Frames of
 * other ids are stale replies of an abandoned operation and are skipped. */
static int
await_reply(eph_guest_t *g, int64_t id, const char *want, int64_t deadline_ms, json_object **out,
            eph_error_t *err)
{
  for (;;) {
    json_object *f = NULL;
    int r = read_frame(g, deadline_ms, &f, err);
    if (r < 0)
      return r;
    bool fatal;
    r = eph_guest_classify_reply(f, id, want, &fatal, err);
    if (r == EPH_GUEST_REPLY_MATCH) {
      *out = f;
      return 0;
    }
    json_object_put(f);
    if (r < 0)
      return reply_failed(g, r, fatal, err);
  }
}

/* ---------------------------------------------------------------- open / close */

int
eph_guest_open(int fd, int64_t deadline_ms, eph_guest_t **out, eph_error_t *err)
{
  eph_guest_t *g = eph_xcalloc(1, sizeof *g);
  g->fd = fd;
  pthread_mutex_init(&g->write_lock, NULL);
  g->decode = eph_xmalloc(EPH_PROTO_MAX_FRAME_BYTES);
  json_object *hello = NULL;
  int r = read_frame(g, deadline_ms, &hello, err);
  if (r < 0) {
    eph_error_wrap(err, "waiting for the guest's hello");
    eph_guest_close(g);
    return r;
  }
  const char *type = eph_json_get_string(hello, "type");
  const char *scratch = eph_json_get_string(hello, "scratch");
  const char *kernel = eph_json_get_string(hello, "kernel");
  int64_t version = 0;
  eph_proto_int(hello, "version", &version);
  if (type && strcmp(type, "error") == 0) {
    r = eph_error_set(err, EPH_E_PROTOCOL, "guest failed to start: %s",
                      eph_json_get_string(hello, "message") ? eph_json_get_string(hello, "message")
                                                            : "?");
  } else if (!type || strcmp(type, "hello") != 0) {
    r = eph_error_set(err, EPH_E_PROTOCOL, "guest: first frame is '%s', expected 'hello'",
                      type ? type : "(no type)");
  } else if (version != EPH_PROTO_VERSION) {
    r = eph_error_set(err, EPH_E_PROTOCOL,
                      "guest speaks protocol version %" PRId64 ", this core speaks %d", version,
                      EPH_PROTO_VERSION);
  } else if (!scratch || scratch[0] != '/') {
    r = eph_error_set(err, EPH_E_PROTOCOL, "guest hello: 'scratch' missing or not absolute");
  }
  if (r < 0) {
    json_object_put(hello);
    eph_guest_close(g);
    return r;
  }
  g->version = (int)version;
  g->scratch = eph_xstrdup(scratch);
  g->kernel = eph_xstrdup(kernel ? kernel : "");
  json_object_put(hello);
  *out = g;
  return 0;
}

const char *
eph_guest_scratch(const eph_guest_t *g)
{
  return g->scratch;
}

const char *
eph_guest_kernel(const eph_guest_t *g)
{
  return g->kernel;
}

int
eph_guest_version(const eph_guest_t *g)
{
  return g->version;
}

bool
eph_guest_broken(const eph_guest_t *g)
{
  return g->broken;
}

void
eph_guest_close(eph_guest_t *g)
{
  if (!g)
    return;
  if (g->fd >= 0)
    close(g->fd);
  eph_frame_reader_clear(&g->rd);
  pthread_mutex_destroy(&g->write_lock);
  free(g->decode);
  free(g->scratch);
  free(g->kernel);
  free(g);
}

int
eph_guest_kill(eph_guest_t *g, bool all)
{
  if (!g || g->fd < 0)
    return -EBADF;
  /* Called with a run's lock held (a cancel, a budget cut): it must not wait for another
   * thread's frame, which a guest that stopped reading can hold up indefinitely. The kill is
   * flagged (the stronger of two kept), then sent now if the lock is free, else by its
   * holder once its frame is written. */
  int want = all ? 2 : 1, cur = atomic_load(&g->kill_pending);
  while (cur < want && !atomic_compare_exchange_weak(&g->kill_pending, &cur, want))
    ;
  if (pthread_mutex_trylock(&g->write_lock) == 0)
    unlock_writer(g);
  return 0;
}

int
eph_guest_shutdown(eph_guest_t *g, int64_t deadline_ms, eph_error_t *err)
{
  int r = check_usable(g, err);
  if (r < 0)
    return r;
  int64_t id;
  json_object *req = new_request(g, "shutdown", &id);
  r = send_frame(g, req, err);
  json_object_put(req);
  if (r < 0)
    return r;
  json_object *bye = NULL;
  r = await_reply(g, id, "bye", deadline_ms, &bye, err);
  json_object_put(bye);
  g->broken = true; /* nothing more can be asked of it */
  snprintf(g->broken_why, sizeof g->broken_why, "the guest was shut down");
  return r;
}

/* ---------------------------------------------------------------- exec */

static eph_end_reason_t
parse_reason(const char *s)
{
  static const struct {
    const char *name;
    eph_end_reason_t reason;
  } map[] = {{"exited", EPH_END_EXITED}, {"timeout", EPH_END_TIMEOUT},
             {"killed", EPH_END_KILLED}, {"disk_full", EPH_END_DISK_FULL},
             {"oom", EPH_END_OOM},       {"pids_exhausted", EPH_END_PIDS_EXHAUSTED}};
  for (size_t i = 0; s && i < sizeof map / sizeof map[0]; i++)
    if (strcmp(s, map[i].name) == 0)
      return map[i].reason;
  return EPH_END_EXITED;
}

void
eph_exec_result_clear(eph_exec_result_t *result)
{
  if (!result)
    return;
  free(result->stdout_text);
  free(result->stderr_text);
  result->stdout_text = result->stderr_text = NULL;
  result->stdout_bytes = result->stderr_bytes = 0;
}

static json_object *
strv_json(const char *const *v)
{
  json_object *a = json_object_new_array();
  for (size_t i = 0; v && v[i]; i++)
    json_object_array_add(a, json_object_new_string(v[i]));
  return a;
}

int
eph_guest_exec(eph_guest_t *g, const eph_exec_request_t *req, eph_exec_result_t *result,
               eph_error_t *err)
{
  int r = check_usable(g, err);
  if (r < 0)
    return r;
  if (!req || (!req->command) == (!req->argv) || (req->argv && !req->argv[0]))
    return eph_error_set(err, EINVAL, "exec: exactly one of 'command' or a non-empty 'argv'");
  if (req->stdin_bytes > EPH_PROTO_MAX_DATA_BYTES)
    return eph_error_set(err, E2BIG, "exec: stdin_bytes %zu over the %u-byte limit",
                         req->stdin_bytes, EPH_PROTO_MAX_DATA_BYTES);
  int64_t id;
  cleanup_json json_object *o = new_request(g, "exec", &id);
  if (req->command)
    json_object_object_add(o, "command", json_object_new_string(req->command));
  else
    json_object_object_add(o, "argv", strv_json(req->argv));
  if (req->env)
    json_object_object_add(o, "env", strv_json(req->env));
  if (req->cwd)
    json_object_object_add(o, "cwd", json_object_new_string(req->cwd));
  if (req->stdin_data && req->stdin_bytes)
    eph_proto_add_b64(o, "stdin", req->stdin_data, req->stdin_bytes);
  if (req->timeout_ms)
    json_object_object_add(o, "timeout_ms", json_object_new_int64(req->timeout_ms));
  r = send_frame(g, o, err);
  if (r < 0)
    return r;

  /* The guest enforces the timeout; the host only gives up if the guest stops answering. */
  int64_t deadline = eph_now_ms() +
                     (req->timeout_ms ? req->timeout_ms : EPH_GUEST_DEFAULT_TIMEOUT_MS) +
                     EPH_GUEST_GRACE_MS;
  eph_capture_t cap[3];
  eph_capture_init(&cap[1], req->output_cap_bytes);
  eph_capture_init(&cap[2], req->output_cap_bytes);
  json_object *f = NULL;
  for (;;) {
    r = read_frame(g, deadline, &f, err);
    if (r < 0)
      goto fail;
    const char *type = eph_json_get_string(f, "type");
    int64_t fid = -1;
    bool has_id = eph_proto_int(f, "id", &fid);
    if (type && strcmp(type, "error") == 0 && (!has_id || fid == id)) {
      bool fatal = false;
      r = reply_failed(g, reply_error(f, &fatal, err), fatal, err);
      goto fail;
    }
    if (has_id && fid != id) { /* a stale reply */
      json_object_put(f);
      f = NULL;
      continue;
    }
    if (type && strcmp(type, "output") == 0) {
      int64_t stream = 0;
      json_object *data;
      if (!eph_proto_int(f, "stream", &stream) || (stream != 1 && stream != 2) ||
          !json_object_object_get_ex(f, "data", &data) ||
          !json_object_is_type(data, json_type_string)) {
        r = mark_broken(g, EPH_E_PROTOCOL, err, "malformed 'output' frame");
        goto fail;
      }
      ssize_t n = eph_base64_decode_into(json_object_get_string(data),
                                         (size_t)json_object_get_string_len(data), g->decode,
                                         EPH_PROTO_MAX_FRAME_BYTES);
      if (n < 0) {
        r = mark_broken(g, EPH_E_PROTOCOL, err, "'output' data is not base64");
        goto fail;
      }
      if (req->on_output)
        req->on_output(req->opaque, (int)stream, (const char *)g->decode, (size_t)n);
      eph_capture_add(&cap[stream], g->decode, (size_t)n);
      json_object_put(f);
      f = NULL; /* a deadline next (the command outlived its timeout) ends at `fail` */
      continue;
    }
    if (type && strcmp(type, "exit") == 0)
      break;
    r = mark_broken(g, EPH_E_PROTOCOL, err, "unexpected '%s' frame during exec",
                    type ? type : "(no type)");
    goto fail;
  }
  int64_t v = 0;
  memset(result, 0, sizeof *result);
  result->struct_size = sizeof *result;
  if (eph_proto_int(f, "signal", &v))
    result->signal = (int)v;
  else if (eph_proto_int(f, "exit_code", &v))
    result->exit_code = (int)v;
  result->reason = parse_reason(eph_json_get_string(f, "reason"));
  if (eph_proto_int(f, "duration_ms", &v))
    result->duration_ms = v;
  json_object_put(f);
  result->stdout_text = eph_capture_finish(
      &cap[1], &result->stdout_bytes, &result->stdout_truncated, &result->stdout_dropped_bytes);
  result->stderr_text = eph_capture_finish(
      &cap[2], &result->stderr_bytes, &result->stderr_truncated, &result->stderr_dropped_bytes);
  return 0;
fail:
  json_object_put(f);
  eph_capture_clear(&cap[1]);
  eph_capture_clear(&cap[2]);
  if (g->broken && g->fd >= 0)
    eph_guest_kill(g, false); /* best effort: do not leave the command running */
  return r;
}

/* ---------------------------------------------------------------- files */

#define FILE_OP_TIMEOUT_MS 30000

int
eph_guest_write(eph_guest_t *g, const char *path, const void *data, size_t bytes, eph_error_t *err)
{
  int r = check_usable(g, err);
  if (r < 0)
    return r;
  if (!path || !*path)
    return eph_error_set(err, EINVAL, "write: 'path' is empty");
  size_t off = 0;
  int64_t size = -1;
  do {
    size_t n = bytes - off < EPH_PROTO_MAX_DATA_BYTES ? bytes - off : EPH_PROTO_MAX_DATA_BYTES;
    int64_t id;
    cleanup_json json_object *o = new_request(g, "write_file", &id);
    json_object_object_add(o, "path", json_object_new_string(path));
    eph_proto_add_b64(o, "data", (const char *)data + off, n);
    json_object_object_add(o, "append", json_object_new_boolean(off > 0));
    json_object_object_add(o, "mkdirs", json_object_new_boolean(true));
    if ((r = send_frame(g, o, err)) < 0)
      return r;
    cleanup_json json_object *reply = NULL;
    if ((r = await_reply(g, id, "ok", eph_now_ms() + FILE_OP_TIMEOUT_MS, &reply, err)) < 0)
      return eph_error_wrap(err, "writing %s", path);
    if (!eph_proto_int(reply, "bytes", &size))
      return mark_broken(g, EPH_E_PROTOCOL, err, "write_file reply without 'bytes'");
    off += n;
  } while (off < bytes);
  if (size != (int64_t)bytes)
    return eph_error_set(err, EIO, "writing %s: the guest confirmed %" PRId64 " of %zu bytes", path,
                         size, bytes);
  return 0;
}

int
eph_guest_read(eph_guest_t *g, const char *path, size_t max_bytes, void **data, size_t *bytes,
               int *truncated, eph_error_t *err)
{
  int r = check_usable(g, err);
  if (r < 0)
    return r;
  if (!path || !*path)
    return eph_error_set(err, EINVAL, "read: 'path' is empty");
  cleanup_free char *buf = NULL;
  size_t got = 0;
  int64_t size = 0;
  bool eof = false;
  for (;;) {
    size_t want =
        max_bytes - got < EPH_PROTO_MAX_DATA_BYTES ? max_bytes - got : EPH_PROTO_MAX_DATA_BYTES;
    int64_t id;
    cleanup_json json_object *o = new_request(g, "read_file", &id);
    json_object_object_add(o, "path", json_object_new_string(path));
    json_object_object_add(o, "offset", json_object_new_int64((int64_t)got));
    json_object_object_add(o, "max", json_object_new_int64((int64_t)want));
    if ((r = send_frame(g, o, err)) < 0)
      return r;
    cleanup_json json_object *reply = NULL;
    if ((r = await_reply(g, id, "data", eph_now_ms() + FILE_OP_TIMEOUT_MS, &reply, err)) < 0)
      return eph_error_wrap(err, "reading %s", path);
    void *chunk = NULL;
    size_t n = 0;
    json_object *eofv;
    if (!eph_proto_int(reply, "size", &size) ||
        eph_proto_get_b64(reply, "data", want, &chunk, &n) < 0)
      return mark_broken(g, EPH_E_PROTOCOL, err, "malformed read_file reply");
    eof = json_object_object_get_ex(reply, "eof", &eofv) && json_object_get_boolean(eofv);
    buf = eph_xrealloc(buf, got + n + 1);
    memcpy(buf + got, chunk, n);
    free(chunk);
    got += n;
    buf[got] = '\0';
    if (eof || got >= max_bytes || n == 0)
      break;
  }
  if (!buf)
    buf = eph_xcalloc(1, 1);
  *truncated = (uint64_t)size > got;
  *bytes = got;
  *data = steal_pointer(&buf);
  return 0;
}

void
eph_dirents_free(eph_dirent_t *entries, size_t count)
{
  for (size_t i = 0; entries && i < count; i++)
    free(entries[i].name);
  free(entries);
}

int
eph_guest_list(eph_guest_t *g, const char *path, eph_dirent_t **entries, size_t *count,
               eph_error_t *err)
{
  int r = check_usable(g, err);
  if (r < 0)
    return r;
  int64_t id;
  cleanup_json json_object *o = new_request(g, "list_dir", &id);
  json_object_object_add(o, "path", json_object_new_string(path ? path : ""));
  if ((r = send_frame(g, o, err)) < 0)
    return r;
  cleanup_json json_object *reply = NULL;
  if ((r = await_reply(g, id, "entries", eph_now_ms() + FILE_OP_TIMEOUT_MS, &reply, err)) < 0)
    return eph_error_wrap(err, "listing %s", path && *path ? path : "scratch");
  json_object *arr;
  if (!json_object_object_get_ex(reply, "entries", &arr) ||
      !json_object_is_type(arr, json_type_array))
    return mark_broken(g, EPH_E_PROTOCOL, err, "list_dir reply without 'entries'");
  size_t n = json_object_array_length(arr);
  eph_dirent_t *out = eph_xcalloc(n ? n : 1, sizeof *out);
  for (size_t i = 0; i < n; i++) {
    json_object *e = json_object_array_get_idx(arr, i);
    const char *name = eph_json_get_string(e, "name");
    const char *type = eph_json_get_string(e, "type");
    int64_t size = 0, mtime = 0;
    eph_proto_int(e, "size", &size);
    eph_proto_int(e, "mtime", &mtime);
    out[i].name = eph_xstrdup(name ? name : "");
    out[i].type = type && strchr("fdl", type[0]) && type[0] ? type[0] : '?';
    out[i].size_bytes = size > 0 ? (uint64_t)size : 0;
    out[i].mtime_s = mtime;
  }
  *entries = out;
  *count = n;
  return 0;
}
