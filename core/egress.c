/* The sandbox egress proxy; see egress.h for what it promises.
 *
 * Why the request head is read by hand and not by libmicrohttpd: a proxy must hand the raw
 * socket over to a byte tunnel after CONNECT and must forward a response it never parses;
 * libmicrohttpd serves responses it builds itself. What is read here is only the request
 * line and header lines of one head (at most HEAD_MAX_BYTES), split on CRLF; URLs are
 * parsed by libcurl's URL API. */
#include <config.h>

#include "egress.h"
#include "egress_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <curl/curl.h>

#include "log.h"
#include "util.h"

#ifndef SO_NETNS_COOKIE
#define SO_NETNS_COOKIE 71 /* Linux 5.14, asm-generic/socket.h */
#endif

#define HEAD_MAX_BYTES 16384
#define RELAY_CHUNK 16384
#define CONNECT_TIMEOUT_MS 10000
#define CLIENT_BUF_BYTES (128 * 1024) /* SO_SNDBUF/SO_RCVBUF of a sandbox's connection (x2) */

struct eph_egress {
  eph_egress_options_t opt;
  uint32_t addr; /* P, the proxy's address (host byte order) */
  int listen_fd; /* the backend's listener (eph_egress_attach), in the sandbox's reach; or -1 */
  int lock_fd;   /* bound to P:port in the host's netns: the /30 is ours */
  int wake[2];
  /* The host's network namespace (of the thread that started the proxy): connection
   * threads must be in it, since the host-address check lists the interfaces of the
   * calling thread's namespace. */
  dev_t host_netns_dev;
  ino_t host_netns_ino;
  char url[64];
  pthread_t acceptor;
  bool acceptor_running;

  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool stopping;
  int active;
  struct conn *conns; /* open connections, for stop */
  int64_t allowed, refused;
};

typedef struct conn {
  struct conn *next, *prev;
  eph_egress_t *e;
  int client, upstream;
  pthread_t thread;
} conn_t;

/* Copies bytes both ways (or only upstream -> client when !both) until either side closes,
 * the byte cap, the idle timeout or the wall-clock cap. */
static void
relay(eph_egress_t *e, int client, int upstream, bool both, int64_t end_ms)
{
  char buf[RELAY_CHUNK];
  int64_t moved = 0;
  struct pollfd pf[2] = {{.fd = client, .events = both ? POLLIN : 0},
                         {.fd = upstream, .events = POLLIN}};
  while (moved < e->opt.max_bytes) {
    int64_t left = end_ms - eph_now_ms();
    if (left <= 0)
      return;
    int wait = (int)(left < e->opt.idle_ms ? left : e->opt.idle_ms);
    int pr = poll(pf, 2, wait);
    if (pr < 0 && errno == EINTR)
      continue;
    if (pr <= 0)
      return; /* idle or error */
    for (int i = 0; i < 2; i++) {
      if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
        continue;
      int64_t room = e->opt.max_bytes - moved;
      ssize_t n = recv(pf[i].fd, buf, room < (int64_t)sizeof buf ? (size_t)room : sizeof buf, 0);
      if (n <= 0 || !egress_send_until(pf[1 - i].fd, buf, (size_t)n, e->opt.idle_ms, end_ms))
        return;
      moved += n;
    }
  }
}

/* ------------------------------------------------------------------ one connection */

static void
count(eph_egress_t *e, bool ok)
{
  pthread_mutex_lock(&e->lock);
  if (ok)
    e->allowed++;
  else
    e->refused++;
  pthread_mutex_unlock(&e->lock);
}

/* Refuses with an event: the announce callback reports it, the client gets `status` (or,
 * status 0, nothing more: the caller already answered in the tunnel's own protocol). */
static void
refuse(eph_egress_t *e, int fd, const char *method, const char *target, int status,
       const char *reason, const char *why)
{
  eph_error_t ignored = {0};
  e->opt.announce(e->opt.opaque, method, target, why, &ignored);
  count(e, false);
  if (status)
    egress_reply(fd, status, reason, why);
}

/* Whether the calling thread is in the host's network namespace (see host_netns_ino). */
static bool
in_host_netns(const eph_egress_t *e)
{
  struct stat st;
  return stat("/proc/thread-self/ns/net", &st) == 0 && st.st_dev == e->host_netns_dev &&
         st.st_ino == e->host_netns_ino;
}

static void
serve(conn_t *c)
{
  eph_egress_t *e = c->e;
  int64_t end_ms = eph_now_ms() + e->opt.max_connection_ms;
  char *buf = eph_xmalloc(HEAD_MAX_BYTES);
  uint8_t *rec = NULL;
  size_t got = 0;
  ssize_t head = egress_read_head(c->client, buf, HEAD_MAX_BYTES, &got, e->opt.idle_ms, end_ms);
  if (head <= 0) {
    if (head < 0)
      egress_reply(c->client, 431, "Request Header Fields Too Large", "request head too large");
    free(buf);
    return;
  }
  /* Lines end in CRLF and nothing else: a bare CR, a bare LF or a NUL inside the head is a
   * line break to some servers and not to this parser, so a header the proxy never checked
   * (`X: a\rHost: other`) would reach the upstream. Refuse the head (RFC 9112 2.2 lets a
   * recipient reject a bare CR). */
  for (ssize_t i = 0; i < head; i++) {
    bool bad = buf[i] == '\0' || (buf[i] == '\r' && (i + 1 >= head || buf[i + 1] != '\n')) ||
               (buf[i] == '\n' && (i == 0 || buf[i - 1] != '\r'));
    if (bad) {
      egress_reply(c->client, 400, "Bad Request", "bare CR, LF or NUL in the request head");
      free(buf);
      return;
    }
  }
  char method[16], target[2048], version[16];
  const char *line_end = strstr(buf, "\r\n");
  /* The request line is ASCII (a method, a URI, a version: RFC 9112 3): a byte outside
   * printable ASCII is refused before the target reaches an event, where it once put raw
   * control bytes and invalid UTF-8 into the run's record and every JSON rendering of it. */
  for (const char *q = buf; q < line_end; q++)
    if ((unsigned char)*q < 0x20 || (unsigned char)*q > 0x7e) {
      egress_reply(c->client, 400, "Bad Request",
                   "a byte outside printable ASCII in the request line");
      free(buf);
      return;
    }
  if (sscanf(buf, "%15s %2047s %15s", method, target, version) != 3 ||
      strncmp(version, "HTTP/1.", 7) != 0) {
    egress_reply(c->client, 400, "Bad Request", "malformed request line");
    free(buf);
    return;
  }
  const char *headers = line_end + 2;
  bool is_connect = strcmp(method, "CONNECT") == 0;
  char *host = NULL, display[2100], msg[1200];
  int port = 0;
  eph_error_t err = {0};
  snprintf(display, sizeof display, "%s", target);

  if (is_connect) {
    /* host:port or [v6]:port; the port is required. */
    char *colon = strrchr(target, ':');
    char *endp = NULL;
    long p = colon ? strtol(colon + 1, &endp, 10) : 0;
    if (!colon || colon == target || !endp || *endp || p < 1 || p > 65535) {
      refuse(e, c->client, method, display, 400, "Bad Request", "CONNECT needs host:port");
      goto out;
    }
    *colon = '\0';
    char *h = target;
    size_t hl = strlen(h);
    if (h[0] == '[' && hl > 2 && h[hl - 1] == ']') {
      h[hl - 1] = '\0';
      h++;
    }
    host = eph_xstrdup(h);
    for (char *s = host; *s; s++)
      *s = (char)(*s >= 'A' && *s <= 'Z' ? *s + 32 : *s);
    port = (int)p;
  } else if (strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0) {
    if (strncasecmp(target, "http://", 7) != 0) {
      refuse(e, c->client, method, display, 400, "Bad Request",
             "only absolute http:// URLs (use CONNECT for https)");
      goto out;
    }
    char cl[64] = "", te[64] = "";
    if ((egress_header_value(headers, "content-length", cl, sizeof cl) &&
         strtoll(cl, NULL, 10) != 0) ||
        egress_header_value(headers, "transfer-encoding", te, sizeof te)) {
      refuse(e, c->client, method, display, 400, "Bad Request", "GET/HEAD with a body");
      goto out;
    }
    if (eph_net_url_host(target, &host, &port, &err) < 0) {
      refuse(e, c->client, method, display, 400, "Bad Request", err.message);
      goto out;
    }
    const char *why = host_header_refusal(headers, host, port, msg, sizeof msg);
    if (why) {
      refuse(e, c->client, method, display, 403, "Forbidden", why);
      goto out;
    }
  } else {
    refuse(e, c->client, method, display, 405, "Method Not Allowed",
           "only CONNECT, GET and HEAD go through the proxy");
    goto out;
  }

  const char *why = eph_net_host_refusal(e->opt.policy, host);
  if (why) {
    snprintf(msg, sizeof msg, "host '%s' refused: %s", host, why);
    refuse(e, c->client, method, display, 403, "Forbidden", msg);
    goto out;
  }
  if ((why = eph_net_port_refusal(e->opt.policy, port))) {
    snprintf(msg, sizeof msg, "port %d of '%s' refused: %s", port, host, why);
    refuse(e, c->client, method, display, 403, "Forbidden", msg);
    goto out;
  }
  /* The host-address check lists the interfaces of this thread's namespace: it must be
   * the host's, not the proxy's own (which holds only the sandbox's link). */
  if (!in_host_netns(e)) {
    refuse(e, c->client, method, display, 500, "Internal Server Error",
           "the proxy's connection is not in the host's network namespace: refused");
    goto out;
  }
  /* Announced and charged before the name is resolved: resolving is already egress. */
  if (e->opt.announce(e->opt.opaque, method, display, NULL, &err) < 0) {
    count(e, false);
    egress_reply(c->client, 403, "Forbidden", err.message);
    goto out;
  }
  struct sockaddr_storage ss;
  char addr[INET6_ADDRSTRLEN];
  int r = eph_net_resolve_checked(e->opt.policy, host, port, &ss, addr, &err);
  if (r < 0) {
    if (r == -EPH_E_DENIED)
      refuse(e, c->client, method, display, 403, "Forbidden", err.message);
    else
      refuse(e, c->client, method, display, 502, "Bad Gateway", err.message);
    goto out;
  }
  size_t have = 0;
  if (is_connect) {
    /* The tunnel carries TLS to the name it was checked against, nothing else: the first
     * record must be a ClientHello whose server name is the CONNECT host (a tunnel to an
     * allowed CDN front must not ask it for evil.example). Read before any connection to
     * the upstream is made; the TLS itself is never terminated. */
    static const char ok[] = "HTTP/1.1 200 Connection established\r\n\r\n";
    egress_send_all(c->client, ok, sizeof ok - 1);
    rec = eph_xmalloc(TLS_HEADER_BYTES + TLS_RECORD_MAX);
    have = got - (size_t)head; /* the client did not wait for our 200 */
    memcpy(rec, buf + head, have);
    have = egress_read_tls_record(c->client, rec, have, e->opt.idle_ms, end_ms);
    if (have == 0) {
      refuse(e, c->client, method, display, 0, NULL,
             "the client sent no TLS ClientHello through the tunnel");
      goto out;
    }
    size_t reclen = have;
    if (have >= TLS_HEADER_BYTES && rec[0] == 22) {
      size_t want = TLS_HEADER_BYTES + ((size_t)rec[3] << 8 | rec[4]);
      reclen = want < have ? want : have;
    }
    char sni[256];
    const char *bad = client_hello_sni(rec, reclen, sni, sizeof sni);
    if (!bad && !sni[0] && !egress_is_ip_literal(host))
      bad = "the TLS ClientHello names no server (no SNI) for a CONNECT to a name";
    if (!bad && sni[0] && !egress_same_name(sni, host)) {
      snprintf(msg, sizeof msg, "TLS server name '%s' is not the CONNECT host '%s'", sni, host);
      bad = msg;
    }
    if (bad) {
      if (rec[0] == 22)
        egress_tls_alert(c->client, 112 /* unrecognized_name */);
      else
        egress_reply(c->client, 403, "Forbidden", bad);
      refuse(e, c->client, method, display, 0, NULL, bad);
      goto out;
    }
  }
  int64_t left = end_ms - eph_now_ms();
  int up = egress_connect(&ss, left < CONNECT_TIMEOUT_MS ? left : CONNECT_TIMEOUT_MS, &err);
  if (up < 0) {
    snprintf(msg, sizeof msg, "%s (%s): %s", host, addr, err.message);
    /* After a CONNECT's 200 the client speaks TLS: no HTTP answer, just the close. */
    refuse(e, c->client, method, display, is_connect ? 0 : 502, "Bad Gateway", msg);
    goto out;
  }
  pthread_mutex_lock(&e->lock);
  c->upstream = up;
  bool stop = e->stopping;
  pthread_mutex_unlock(&e->lock);
  count(e, true);
  if (!stop) {
    if (is_connect) {
      /* the checked ClientHello (and what followed) */
      if (egress_send_until(up, (const char *)rec, have, e->opt.idle_ms, end_ms))
        relay(e, c->client, up, true, end_ms);
    } else {
      cleanup_free char *req = rewrite_request(method, target, host, port, headers);
      /* Nothing more from the client goes upstream: a second request on this connection
       * would skip the checks and the charge. */
      if (egress_send_until(up, req, strlen(req), e->opt.idle_ms, end_ms))
        relay(e, c->client, up, false, end_ms);
    }
  }
out:
  free(rec);
  free(host);
  free(buf);
}

static void *
conn_main(void *arg)
{
  conn_t *c = arg;
  eph_egress_t *e = c->e;
  serve(c);
  pthread_mutex_lock(&e->lock);
  if (c->prev)
    c->prev->next = c->next;
  else
    e->conns = c->next;
  if (c->next)
    c->next->prev = c->prev;
  close(c->client);
  if (c->upstream >= 0)
    close(c->upstream);
  free(c);
  e->active--;
  pthread_cond_broadcast(&e->cond);
  pthread_mutex_unlock(&e->lock);
  return NULL; /* e is not touched after the unlock: stop() may free it now */
}

static void *
accept_main(void *arg)
{
  eph_egress_t *e = arg;
  for (;;) {
    struct pollfd pf[2] = {{.fd = e->listen_fd, .events = POLLIN},
                           {.fd = e->wake[0], .events = POLLIN}};
    int pr = poll(pf, 2, -1);
    if (pr < 0 && errno == EINTR)
      continue;
    if (pr < 0 || pf[1].revents)
      return NULL;
    int fd = accept4(e->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
      continue; /* EAGAIN (a connection gone before we took it), EINTR, ECONNABORTED */
    /* Fixed buffers, not autotuned: this socket is in the sandbox's network namespace, so
     * its limits are that namespace's tcp_wmem and tcp_rmem (which the sandbox's root may
     * raise), and its memory is the daemon's, never the sandbox's. Autotuned, a client
     * reading fast and then not at all left 4 MiB queued on each (9 MiB with tcp_wmem
     * raised): 55 MiB from one 64 MiB sandbox's 32 connections. The peer is local: a few
     * hundred KiB carry it at full speed. */
    int bufsize = CLIENT_BUF_BYTES;
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bufsize, sizeof bufsize);
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bufsize, sizeof bufsize);
    pthread_mutex_lock(&e->lock);
    if (e->stopping || e->active >= e->opt.max_connections) {
      e->refused++;
      pthread_mutex_unlock(&e->lock);
      egress_reply(fd, 503, "Service Unavailable", "too many connections");
      close(fd);
      continue;
    }
    conn_t *c = eph_xcalloc(1, sizeof *c);
    c->e = e;
    c->client = fd;
    c->upstream = -1;
    c->next = e->conns;
    if (e->conns)
      e->conns->prev = c;
    e->conns = c;
    e->active++;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&c->thread, &attr, conn_main, c) != 0) {
      e->conns = c->next;
      if (c->next)
        c->next->prev = NULL;
      e->active--;
      close(fd);
      free(c);
    }
    pthread_attr_destroy(&attr);
    pthread_mutex_unlock(&e->lock);
  }
}

/* ------------------------------------------------------------------ start, stop */

static int
parse_pool(const char *pool, uint32_t *base, int *bits, eph_error_t *err)
{
  char a[64];
  const char *slash = strchr(pool, '/');
  struct in_addr in;
  char *end = NULL;
  long b = slash ? strtol(slash + 1, &end, 10) : -1;
  if (!slash || (size_t)(slash - pool) >= sizeof a || !end || *end || b < 8 || b > 30)
    return eph_error_set(err, EINVAL, "egress pool '%s': expected A.B.C.D/N with 8 <= N <= 30",
                         pool);
  memcpy(a, pool, (size_t)(slash - pool));
  a[slash - pool] = '\0';
  if (inet_pton(AF_INET, a, &in) != 1)
    return eph_error_set(err, EINVAL, "egress pool '%s': not an IPv4 address", pool);
  *bits = (int)b;
  *base = ntohl(in.s_addr) & (uint32_t)(0xffffffffULL << (32 - b));
  return 0;
}

/* An address some host interface already holds cannot be a sandbox's /30. */
static bool
address_is_local(uint32_t a)
{
  struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(a)};
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return true;
  bool local = bind(fd, (struct sockaddr *)&sin, sizeof sin) == 0 || errno != EADDRNOTAVAIL;
  close(fd);
  return local;
}

int
eph_egress_start(const eph_egress_options_t *opt, eph_egress_t **out, eph_error_t *err)
{
  uint32_t base = 0;
  int bits = 32, r;
  *out = NULL;
  if (!opt->policy || !opt->announce)
    return eph_error_set(err, EINVAL, "egress: policy and announce are required");
  if ((r = parse_pool(opt->pool, &base, &bits, err)) < 0)
    return r;
  uint32_t n = 1U << (32 - bits - 2); /* /30s in the pool */
  int lock = -1;
  uint32_t chosen = 0;
  for (uint32_t i = 0; i < n && lock < 0; i++) {
    uint32_t a = base + 4 * i + 1;
    if (address_is_local(a))
      continue;
    lock = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lock < 0)
      return eph_error_set(err, errno, "egress: socket: %s", strerror(errno));
    int one = 1;
    struct sockaddr_in sin = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)opt->port), .sin_addr.s_addr = htonl(a)};
    /* A bound, never listening socket in the host's netns is the allocation: another
     * process's proxy holding this /30 makes the bind fail with EADDRINUSE. */
    if (setsockopt(lock, SOL_IP, IP_FREEBIND, &one, sizeof one) < 0 ||
        bind(lock, (struct sockaddr *)&sin, sizeof sin) < 0) {
      int e = errno;
      close(lock);
      lock = -1;
      if (e != EADDRINUSE)
        return eph_error_set(err, e, "egress: binding %s: %s", opt->pool, strerror(e));
      continue;
    }
    chosen = a;
  }
  if (lock < 0)
    return eph_error_set(err, EADDRNOTAVAIL, "egress: pool %s has no free /30 left", opt->pool);

  eph_egress_t *e = eph_xcalloc(1, sizeof *e);
  e->opt = *opt;
  struct stat ns;
  if (stat("/proc/thread-self/ns/net", &ns) == 0) {
    e->host_netns_dev = ns.st_dev;
    e->host_netns_ino = ns.st_ino;
  } /* else every connection is refused by in_host_netns(): fail closed */
  e->addr = chosen;
  e->listen_fd = -1;
  e->lock_fd = lock;
  e->wake[0] = e->wake[1] = -1;
  struct in_addr in = {.s_addr = htonl(chosen)};
  char text[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &in, text, sizeof text);
  snprintf(e->url, sizeof e->url, "http://%s:%d", text, opt->port);
  pthread_mutex_init(&e->lock, NULL);
  pthread_cond_init(&e->cond, NULL);
  if (pipe2(e->wake, O_CLOEXEC) < 0) {
    r = eph_error_set(err, errno, "egress: pipe: %s", strerror(errno));
    close(e->lock_fd);
    pthread_mutex_destroy(&e->lock);
    pthread_cond_destroy(&e->cond);
    free(e);
    return r;
  }
  eph_debug("egress: proxy at %s, waiting for the sandbox's listener", e->url);
  *out = e;
  return 0;
}

static bool
sockopt_int(int fd, int name, int *value)
{
  socklen_t len = sizeof *value;
  return getsockopt(fd, SOL_SOCKET, name, value, &len) == 0 && len == sizeof *value;
}

static bool
netns_cookie(int fd, uint64_t *cookie)
{
  socklen_t len = sizeof *cookie;
  return getsockopt(fd, SOL_SOCKET, SO_NETNS_COOKIE, cookie, &len) == 0 && len == sizeof *cookie;
}

/* What eph_egress_attach accepts (see egress.h): the listener a backend made where only
 * its sandbox reaches it. */
static int
check_listener(const eph_egress_t *e, int fd, eph_error_t *err)
{
  int domain = -1, type = -1, proto = -1, listening = 0;
  if (!sockopt_int(fd, SO_DOMAIN, &domain) || domain != AF_INET ||
      !sockopt_int(fd, SO_TYPE, &type) || type != SOCK_STREAM ||
      !sockopt_int(fd, SO_PROTOCOL, &proto) || proto != IPPROTO_TCP)
    return eph_error_set(err, EPROTOTYPE,
                         "egress: the backend's proxy socket is not an IPv4 TCP socket: refused");
  if (!sockopt_int(fd, SO_ACCEPTCONN, &listening) || !listening)
    return eph_error_set(err, EINVAL,
                         "egress: the backend's proxy socket is not listening: refused");
  struct sockaddr_in sin;
  socklen_t len = sizeof sin;
  if (getsockname(fd, (struct sockaddr *)&sin, &len) < 0 || len != sizeof sin ||
      sin.sin_family != AF_INET || sin.sin_addr.s_addr != htonl(e->addr) ||
      ntohs(sin.sin_port) != e->opt.port)
    return eph_error_set(err, EADDRNOTAVAIL,
                         "egress: the backend's proxy socket is not bound to %s: refused",
                         e->url + strlen("http://"));
  /* Where it listens: a listener in the host's network namespace would take connections
   * from every process of the host, on the run's budget. The kernel's namespace cookie
   * (Linux 5.14) tells namespaces apart; a kernel that cannot tell is refused as well. The
   * lock socket was made in the host's namespace. */
  uint64_t cookie = 0, host = 0;
  errno = 0;
  if (!netns_cookie(fd, &cookie) || !netns_cookie(e->lock_fd, &host)) {
    int en = errno ? errno : EINVAL;
    return eph_error_set(err, en,
                         "egress: SO_NETNS_COOKIE: %s: the proxy socket's network namespace "
                         "cannot be told from the host's: refused",
                         strerror(en));
  }
  if (cookie == host)
    return eph_error_set(err, EPERM,
                         "egress: the backend's proxy socket listens in the host's network "
                         "namespace, where every host process could reach it: refused");
  return 0;
}

int
eph_egress_attach(eph_egress_t *e, int listen_fd, eph_error_t *err)
{
  if (e->listen_fd >= 0)
    return eph_error_set(err, EBUSY, "egress: the proxy already has its listening socket");
  int r = check_listener(e, listen_fd, err);
  if (r < 0)
    return r;
  /* Non-blocking: a connection reset between poll() and accept() must not park the accept
   * thread in accept() where stop's wake-up cannot reach it. (accept4 gives blocking
   * connection sockets.) */
  int fd = fcntl(listen_fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0)
    return eph_error_set(err, errno, "egress: dup of the proxy socket: %s", strerror(errno));
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
    r = eph_error_set(err, errno, "egress: the proxy socket: %s", strerror(errno));
    close(fd);
    return r;
  }
  e->listen_fd = fd;
  if (pthread_create(&e->acceptor, NULL, accept_main, e) != 0) {
    close(fd);
    e->listen_fd = -1;
    return eph_error_set(err, EAGAIN, "egress: cannot start the accept thread");
  }
  e->acceptor_running = true;
  eph_debug("egress: proxy listening on %s", e->url);
  return 0;
}

static int
spec_attach(void *ctx, int listen_fd, eph_error_t *err)
{
  return eph_egress_attach(ctx, listen_fd, err);
}

void
eph_egress_spec(eph_egress_t *e, eph_sandbox_spec_t *spec)
{
  spec->network = 1;
  spec->proxy_url = e->url;
  spec->proxy_netns_fd = -1;
  spec->proxy_attach = spec_attach;
  spec->proxy_ctx = e;
}

const char *
eph_egress_url(const eph_egress_t *e)
{
  return e->url;
}

void
eph_egress_counts(eph_egress_t *e, int64_t *allowed, int64_t *refused)
{
  pthread_mutex_lock(&e->lock);
  *allowed = e->allowed;
  *refused = e->refused;
  pthread_mutex_unlock(&e->lock);
}

void
eph_egress_stop(eph_egress_t *e)
{
  if (!e)
    return;
  if (e->acceptor_running) {
    ssize_t w = write(e->wake[1], "x", 1);
    (void)w;
    pthread_join(e->acceptor, NULL);
  }
  if (e->listen_fd >= 0)
    close(e->listen_fd);
  pthread_mutex_lock(&e->lock);
  e->stopping = true;
  /* Wake every connection thread out of its poll: shutdown, not close, so no fd number is
   * reused under a thread that still holds it. */
  for (conn_t *c = e->conns; c; c = c->next) {
    shutdown(c->client, SHUT_RDWR);
    if (c->upstream >= 0)
      shutdown(c->upstream, SHUT_RDWR);
  }
  while (e->active > 0)
    pthread_cond_wait(&e->cond, &e->lock);
  pthread_mutex_unlock(&e->lock);
  close(e->wake[0]);
  close(e->wake[1]);
  close(e->lock_fd);
  pthread_mutex_destroy(&e->lock);
  pthread_cond_destroy(&e->cond);
  free(e);
}
