/* The egress proxy's socket I/O: bounded waits and sends, its own short answers, reading a
 * request head and the client's first TLS record, the upstream connect. Internal to
 * core/egress.c (declared in egress_int.h). */
#include <config.h>

#include "egress_int.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util.h"

#define REPLY_WAIT_MS 2000 /* for a client to take one of the proxy's own answers */

/* Waits until fd is ready for `events`, at most idle_ms and never past end_ms (EINTR
 * retried). Returns 1 when ready, 0 when the wait ran out or failed: the callers give the
 * connection up either way. */
int
egress_wait_ready(int fd, short events, int64_t idle_ms, int64_t end_ms)
{
  for (;;) {
    int64_t left = end_ms - eph_now_ms();
    if (left <= 0)
      return 0;
    struct pollfd pf = {.fd = fd, .events = events};
    int pr = poll(&pf, 1, (int)(left < idle_ms ? left : idle_ms));
    if (pr < 0 && errno == EINTR)
      continue;
    return pr > 0;
  }
}

/* Sends all of data unless the peer takes nothing for idle_ms or end_ms passes. The
 * sockets are blocking, and a peer that stops reading once held a connection thread (and
 * the upstream connection with it) for as long as the run lived, whatever idle_ms and
 * max_connection_ms said. */
bool
egress_send_until(int fd, const char *data, size_t bytes, int64_t idle_ms, int64_t end_ms)
{
  while (bytes > 0) {
    ssize_t w = send(fd, data, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!egress_wait_ready(fd, POLLOUT, idle_ms, end_ms))
        return false;
      continue;
    }
    if (w <= 0)
      return false;
    data += w;
    bytes -= (size_t)w;
  }
  return true;
}

/* The proxy's own short messages (an HTTP answer, a TLS alert, the CONNECT's 200). */
void
egress_send_all(int fd, const char *data, size_t bytes)
{
  (void)egress_send_until(fd, data, bytes, REPLY_WAIT_MS, eph_now_ms() + REPLY_WAIT_MS);
}

void
egress_reply(int fd, int status, const char *reason, const char *msg)
{
  char body[1200], head[256];
  int n = snprintf(body, sizeof body, "ephemeral egress: %s\n", msg);
  if (n < 0 || (size_t)n >= sizeof body)
    n = (int)sizeof body - 1;
  int h = snprintf(head, sizeof head,
                   "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\n"
                   "Content-Length: %d\r\nConnection: close\r\n\r\n",
                   status, reason, n);
  egress_send_all(fd, head, (size_t)h);
  egress_send_all(fd, body, (size_t)n);
}

/* Reads until the end of the request head. Returns the head length (up to and including
 * the blank line) with *got the bytes in buf (may include bytes after the head), 0 on EOF,
 * idle_ms without a byte or end_ms passed (a head trickled a byte at a time once kept its
 * connection past max_connection_ms), -1 when the head is too large. */
ssize_t
egress_read_head(int fd, char *buf, size_t size, size_t *got, int64_t idle_ms, int64_t end_ms)
{
  *got = 0;
  for (;;) {
    buf[*got] = '\0';
    char *end = strstr(buf, "\r\n\r\n");
    if (end)
      return end + 4 - buf;
    if (*got + 1 >= size)
      return -1;
    if (!egress_wait_ready(fd, POLLIN, idle_ms, end_ms))
      return 0;
    ssize_t n = recv(fd, buf + *got, size - 1 - *got, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return 0;
    *got += (size_t)n;
  }
}

int
egress_connect(const struct sockaddr_storage *ss, int64_t timeout_ms, eph_error_t *err)
{
  socklen_t len =
      ss->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
  int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return eph_error_set(err, errno, "socket: %s", strerror(errno));
  if (connect(fd, (const struct sockaddr *)ss, len) < 0 && errno != EINPROGRESS) {
    int e = errno;
    close(fd);
    return eph_error_set(err, e, "connect: %s", strerror(e));
  }
  struct pollfd pf = {.fd = fd, .events = POLLOUT};
  int pr;
  do
    pr = poll(&pf, 1, (int)timeout_ms);
  while (pr < 0 && errno == EINTR);
  int soerr = 0;
  socklen_t sl = sizeof soerr;
  if (pr <= 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0 || soerr) {
    int e = pr == 0 ? ETIMEDOUT : soerr ? soerr : errno;
    close(fd);
    return eph_error_set(err, e, "connect: %s", strerror(e));
  }
  int fl = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}

/* Reads the client's first TLS record into rec (which already holds `have` bytes the
 * client sent right after its CONNECT head). Returns its length, or 0 when the client
 * went quiet, closed, or sent something that is not a TLS record (then rec holds what
 * came, for the caller's verdict). */
size_t
egress_read_tls_record(int fd, uint8_t *rec, size_t have, int64_t idle_ms, int64_t end_ms)
{
  for (;;) {
    if (have >= TLS_HEADER_BYTES) {
      size_t want = TLS_HEADER_BYTES + ((size_t)rec[3] << 8 | rec[4]);
      if (rec[0] != 22 || want > TLS_HEADER_BYTES + TLS_RECORD_MAX)
        return have; /* not TLS, or too long: the parser refuses it */
      if (have >= want)
        return have;
    } else if (have > 0 && rec[0] != 22) {
      return have;
    }
    if (!egress_wait_ready(fd, POLLIN, idle_ms, end_ms))
      return 0;
    /* Never more than the record: what follows it is the client's and goes upstream
     * through relay() after the verdict. */
    size_t want = have < TLS_HEADER_BYTES ? TLS_HEADER_BYTES
                                          : TLS_HEADER_BYTES + ((size_t)rec[3] << 8 | rec[4]);
    ssize_t r = recv(fd, rec + have, want - have, 0);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return 0;
    have += (size_t)r;
  }
}

/* Sends a fatal TLS alert (RFC 8446 6.2) so a refused client sees why, in its own
 * protocol: the tunnel is already open. */
void
egress_tls_alert(int fd, uint8_t description)
{
  const char a[] = {0x15, 0x03, 0x03, 0x00, 0x02, 0x02, (char)description};
  egress_send_all(fd, a, sizeof a);
}
