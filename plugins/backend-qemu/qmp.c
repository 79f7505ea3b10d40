/* A small QMP client (QEMU Machine Protocol: one JSON object per line, json-c parses each).
 * Used for what the command line cannot do: resume after an incoming migration, save a
 * ready guest to a file descriptor. */
#include <config.h>

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "qemu.h"

/* Waits until fd is readable or the deadline passed. */
static int
wait_readable(int fd, int64_t deadline_ms, eph_error_t *err)
{
  for (;;) {
    int64_t left = deadline_ms - eph_now_ms();
    if (left <= 0)
      return eph_error_set(err, ETIMEDOUT, "QMP: no answer from QEMU in time");
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, left > 1000 ? 1000 : (int)left);
    if (r < 0 && errno != EINTR)
      return eph_error_set(err, errno, "QMP: poll: %s", strerror(errno));
    if (r > 0)
      return 0;
  }
}

/* Reads the next JSON object line (events included) into *out. */
static int
read_message(qmp_t *q, int64_t deadline_ms, json_object **out, eph_error_t *err)
{
  *out = NULL;
  for (;;) {
    char *nl = memchr(q->buf, '\n', q->len);
    if (nl) {
      size_t line = (size_t)(nl - q->buf) + 1;
      *nl = '\0';
      json_object *o = json_tokener_parse(q->buf);
      memmove(q->buf, q->buf + line, q->len - line);
      q->len -= line;
      if (!o || !json_object_is_type(o, json_type_object)) {
        json_object_put(o);
        return eph_error_set(err, EPH_E_PROTOCOL, "QMP: a line that is not a JSON object");
      }
      *out = o;
      return 0;
    }
    if (q->len == sizeof q->buf)
      return eph_error_set(err, EPH_E_PROTOCOL, "QMP: a message over %zu bytes", sizeof q->buf);
    int r = wait_readable(q->fd, deadline_ms, err);
    if (r < 0)
      return r;
    ssize_t n = read(q->fd, q->buf + q->len, sizeof q->buf - q->len);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (n < 0)
      return eph_error_set(err, errno, "QMP: read: %s", strerror(errno));
    if (n == 0)
      return eph_error_set(err, EPIPE, "QMP: QEMU closed the monitor (it exited)");
    q->len += (size_t)n;
  }
}

static int
send_all(int fd, const char *text, size_t len, int pass_fd, eph_error_t *err)
{
  size_t off = 0;
  while (off < len) {
    struct iovec iov = {.iov_base = (char *)text + off, .iov_len = len - off};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    union {
      char buf[CMSG_SPACE(sizeof(int))];
      struct cmsghdr align;
    } u;
    if (pass_fd >= 0 && off == 0) {
      memset(&u, 0, sizeof u);
      msg.msg_control = u.buf;
      msg.msg_controllen = sizeof u.buf;
      struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return eph_error_set(err, errno, "QMP: send: %s", strerror(errno));
    off += (size_t)n;
  }
  return 0;
}

int
qmp_exec(qmp_t *q, const char *cmd, json_object *args, int pass_fd, int64_t deadline_ms,
         json_object **ret, eph_error_t *err)
{
  if (ret)
    *ret = NULL;
  json_object *req = json_object_new_object();
  json_object_object_add(req, "execute", json_object_new_string(cmd));
  if (args)
    json_object_object_add(req, "arguments", json_object_get(args));
  size_t len;
  const char *text = json_object_to_json_string_length(req, JSON_C_TO_STRING_PLAIN, &len);
  char *line = malloc(len + 2);
  if (!line) {
    json_object_put(req);
    return eph_error_set(err, ENOMEM, "QMP: out of memory");
  }
  memcpy(line, text, len);
  line[len] = '\n';
  json_object_put(req);
  int r = send_all(q->fd, line, len + 1, pass_fd, err);
  free(line);
  if (r < 0)
    return eph_error_wrap(err, "QMP %s", cmd);
  for (;;) {
    json_object *msg;
    if ((r = read_message(q, deadline_ms, &msg, err)) < 0)
      return eph_error_wrap(err, "QMP %s", cmd);
    json_object *v;
    if (json_object_object_get_ex(msg, "return", &v)) {
      if (ret)
        *ret = json_object_get(v);
      json_object_put(msg);
      return 0;
    }
    if (json_object_object_get_ex(msg, "error", &v)) {
      json_object *cls = NULL, *desc = NULL;
      json_object_object_get_ex(v, "class", &cls);
      json_object_object_get_ex(v, "desc", &desc);
      r = eph_error_set(err, EIO, "QMP %s: %s: %s", cmd,
                        cls ? json_object_get_string(cls) : "error",
                        desc ? json_object_get_string(desc) : "?");
      json_object_put(msg);
      return r;
    }
    json_object_put(msg); /* an event */
  }
}

int
qmp_open(qmp_t *q, int fd, int64_t deadline_ms, eph_error_t *err)
{
  q->fd = fd;
  q->len = 0;
  json_object *greeting;
  int r = read_message(q, deadline_ms, &greeting, err);
  if (r < 0) {
    qmp_close(q);
    return eph_error_wrap(err, "QMP greeting");
  }
  bool ok = json_object_object_get_ex(greeting, "QMP", NULL);
  json_object_put(greeting);
  if (!ok) {
    qmp_close(q);
    return eph_error_set(err, EPH_E_PROTOCOL, "QMP: the first message is no greeting");
  }
  if ((r = qmp_exec(q, "qmp_capabilities", NULL, -1, deadline_ms, NULL, err)) < 0)
    qmp_close(q);
  return r;
}

void
qmp_close(qmp_t *q)
{
  if (q->fd >= 0)
    close(q->fd);
  q->fd = -1;
  q->len = 0;
}

static void
pause_ms(int ms)
{
  struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)ms * 1000000L};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
    ;
}

int
qmp_wait_status(qmp_t *q, const char *const *while_in, int64_t deadline_ms, char *state_out,
                size_t state_size, eph_error_t *err)
{
  for (;;) {
    json_object *ret;
    int r = qmp_exec(q, "query-status", NULL, -1, deadline_ms, &ret, err);
    if (r < 0)
      return r;
    json_object *st = NULL;
    json_object_object_get_ex(ret, "status", &st);
    const char *s = st ? json_object_get_string(st) : "";
    bool waiting = false;
    for (size_t i = 0; while_in[i]; i++)
      waiting |= strcmp(s, while_in[i]) == 0;
    if (state_out)
      snprintf(state_out, state_size, "%s", s);
    json_object_put(ret);
    if (!waiting)
      return 0;
    if (eph_now_ms() >= deadline_ms)
      return eph_error_set(err, ETIMEDOUT, "QMP: the VM stayed '%s' past the deadline",
                           state_out ? state_out : "?");
    pause_ms(5);
  }
}

int
qmp_wait_migration(qmp_t *q, int64_t deadline_ms, uint64_t *bytes, eph_error_t *err)
{
  for (;;) {
    json_object *ret;
    int r = qmp_exec(q, "query-migrate", NULL, -1, deadline_ms, &ret, err);
    if (r < 0)
      return r;
    json_object *st = NULL, *ram = NULL, *tr = NULL;
    json_object_object_get_ex(ret, "status", &st);
    const char *s = st ? json_object_get_string(st) : "";
    if (json_object_object_get_ex(ret, "ram", &ram) &&
        json_object_object_get_ex(ram, "transferred", &tr) && bytes)
      *bytes = (uint64_t)json_object_get_int64(tr);
    if (strcmp(s, "completed") == 0) {
      json_object_put(ret);
      return 0;
    }
    if (strcmp(s, "failed") == 0 || strcmp(s, "cancelled") == 0) {
      json_object *e = NULL;
      json_object_object_get_ex(ret, "error-desc", &e);
      r = eph_error_set(err, EIO, "QMP: migration %s: %s", s,
                        e ? json_object_get_string(e) : "no reason given");
      json_object_put(ret);
      return r;
    }
    json_object_put(ret);
    if (eph_now_ms() >= deadline_ms)
      return eph_error_set(err, ETIMEDOUT, "QMP: the migration did not end in time");
    pause_ms(10);
  }
}
