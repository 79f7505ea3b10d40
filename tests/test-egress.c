/* The egress proxy's one boundary with the backends (core/egress.c eph_egress_attach, and
 * the support helpers both backends build the listener with, sdk/support/netns.c): the proxy
 * accepts only on a listening IPv4 TCP socket bound to its own address and port, made in a
 * network namespace that is not the host's; everything else a backend (or a child speaking
 * for it) could hand over is refused, and the proxy then listens nowhere. The accepted path
 * is the jail's, for real: a child in a user and network namespace of its own sends a
 * netlink and a TCP socket, the parent puts P/32 on the child's lo and listens there without
 * entering the namespace, and the child's connection reaches the proxy.
 *
 * egress.c is included for its struct (the host-namespace check is reached by making the
 * proxy's idea of "the host's namespace" the child's: no real listener can hold P:PORT in the
 * host's namespace while the proxy's lock socket is bound there). */
#include "../core/egress.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <linux/netlink.h>
#include <netlink/netlink.h>

#include "support/netns.h"

static int announced;
static char last_refusal[512];

static int
announce(void *opaque, const char *method, const char *target, const char *refusal,
         eph_error_t *err)
{
  (void)opaque, (void)method, (void)target;
  announced++;
  snprintf(last_refusal, sizeof last_refusal, "%s", refusal ? refusal : "");
  /* Nothing leaves the machine: an allowed connection is refused at its charge. */
  return refusal ? 0 : eph_error_set(err, EPH_E_DENIED, "the test refuses every charge");
}

static int ports[] = {80, 443};
static eph_net_policy_t policy = {.ports = ports, .n_ports = 2};

static eph_egress_t *
start(void)
{
  eph_egress_options_t o = {.pool = "10.213.201.0/27",
                            .port = 3128,
                            .max_connections = 4,
                            .max_bytes = 1 << 20,
                            .max_connection_ms = 10000,
                            .idle_ms = 10000,
                            .policy = &policy,
                            .announce = announce};
  eph_egress_t *e = NULL;
  eph_error_t err = {0};
  int r = eph_egress_start(&o, &e, &err);
  if (r < 0)
    fail_msg("eph_egress_start: %s", err.message);
  return e;
}

static int
open_fds(void)
{
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  for (struct dirent *de; d && (de = readdir(d));)
    n += de->d_name[0] != '.';
  if (d)
    closedir(d);
  return n - 1; /* the directory's own fd */
}

static int
attach(eph_egress_t *e, int fd, const char *expect)
{
  eph_error_t err = {0};
  int r = eph_egress_attach(e, fd, &err);
  if (expect && !strstr(err.message, expect))
    fail_msg("attach: '%s' does not say '%s'", err.message, expect);
  return r;
}

static int
tcp_socket(int domain, const char *addr, int port, bool freebind, bool listening)
{
  int fd = socket(domain, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  int one = 1;
  if (freebind)
    assert_int_equal(setsockopt(fd, SOL_IP, IP_FREEBIND, &one, sizeof one), 0);
  if (domain == AF_INET) {
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, addr, &sin.sin_addr);
    assert_int_equal(bind(fd, (struct sockaddr *)&sin, sizeof sin), 0);
  } else {
    struct sockaddr_in6 sin6 = {.sin6_family = AF_INET6, .sin6_addr = in6addr_loopback};
    assert_int_equal(bind(fd, (struct sockaddr *)&sin6, sizeof sin6), 0);
  }
  if (listening)
    assert_int_equal(listen(fd, 4), 0);
  return fd;
}

/* Everything but the one right socket is refused, and the proxy then listens nowhere. */
static void
test_attach_refuses_other_sockets(void **st)
{
  (void)st;
  eph_egress_t *e = start();
  char p[INET_ADDRSTRLEN];
  struct in_addr in = {.s_addr = htonl(e->addr)};
  inet_ntop(AF_INET, &in, p, sizeof p);

  int u = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sun = {.sun_family = AF_UNIX};
  snprintf(sun.sun_path + 1, sizeof sun.sun_path - 1, "eph-test-egress-%d", (int)getpid());
  assert_int_equal(bind(u, (struct sockaddr *)&sun, sizeof sun), 0);
  assert_int_equal(listen(u, 1), 0);
  assert_int_equal(attach(e, u, "not an IPv4 TCP socket"), -EPROTOTYPE);
  close(u);
  int udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  assert_int_equal(attach(e, udp, "not an IPv4 TCP socket"), -EPROTOTYPE);
  close(udp);
  int v6 = tcp_socket(AF_INET6, NULL, 0, false, true);
  assert_int_equal(attach(e, v6, "not an IPv4 TCP socket"), -EPROTOTYPE);
  close(v6);
  int bound = tcp_socket(AF_INET, "127.0.0.1", 0, false, false);
  assert_int_equal(attach(e, bound, "not listening"), -EINVAL);
  close(bound);
  /* Listening, but elsewhere: any host address, the proxy's address on another port. */
  int lo = tcp_socket(AF_INET, "127.0.0.1", 0, false, true);
  assert_int_equal(attach(e, lo, "not bound to"), -EADDRNOTAVAIL);
  close(lo);
  int other = tcp_socket(AF_INET, p, 3129, true, true);
  assert_int_equal(attach(e, other, "not bound to"), -EADDRNOTAVAIL);
  close(other);
  assert_int_equal(attach(e, -1, NULL), -EPROTOTYPE);
  assert_int_equal(e->listen_fd, -1);
  assert_false(e->acceptor_running);
  eph_egress_stop(e);
}

/* ------------------------------------------------------------ a namespace of its own */

typedef struct child {
  pid_t pid;
  int sock; /* ours of the socketpair */
} child_t;

/* The child: in a new user and network namespace, sends a bound NETLINK_ROUTE socket and an
 * unbound TCP socket (what the jail's child sends), then on 'c' connects to P:PORT, sends
 * `request` and reports the first line of the answer. */
static void
child_main(int sock, uint32_t addr, const char *request)
{
  int fds[2] = {socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE),
                socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  struct sockaddr_nl local = {.nl_family = AF_NETLINK};
  if (fds[0] < 0 || fds[1] < 0 || bind(fds[0], (struct sockaddr *)&local, sizeof local) < 0 ||
      eph_fds_send(sock, "n", 1, fds, 2) < 0)
    _exit(2);
  close(fds[0]);
  close(fds[1]);
  char c;
  if (read(sock, &c, 1) != 1 || c != 'c')
    _exit(0);
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sin = {
      .sin_family = AF_INET, .sin_port = htons(3128), .sin_addr.s_addr = htonl(addr)};
  char answer[256] = "connect failed";
  if (connect(s, (struct sockaddr *)&sin, sizeof sin) == 0 &&
      write(s, request, strlen(request)) == (ssize_t)strlen(request)) {
    ssize_t n = read(s, answer, sizeof answer - 1);
    answer[n > 0 ? n : 0] = '\0';
    char *eol = strstr(answer, "\r\n");
    if (eol)
      *eol = '\0';
  }
  if (write(sock, answer, strlen(answer) + 1) < 0)
    _exit(3);
  _exit(0);
}

static bool
spawn(child_t *c, uint32_t addr, const char *request)
{
  int sp[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
  long pid = syscall(SYS_clone, (unsigned long)(CLONE_NEWUSER | CLONE_NEWNET | SIGCHLD), NULL, NULL,
                     NULL, NULL);
  if (pid == 0) {
    close(sp[0]);
    child_main(sp[1], addr, request);
  }
  close(sp[1]);
  if (pid < 0) {
    close(sp[0]);
    return false;
  }
  c->pid = (pid_t)pid;
  c->sock = sp[0];
  return true;
}

static void
reap(child_t *c)
{
  close(c->sock);
  int status = 0;
  assert_int_equal(waitpid(c->pid, &status, 0), c->pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* The child's sockets, made into the proxy's listener on its lo (as backend-jail does):
 * returns the TCP fd, listening at P:PORT in the child's namespace; *nl_out its netlink
 * socket. */
static int
listener_of(child_t *c, const char *url, struct nl_sock **nl_out)
{
  char tag = 0;
  int fds[EPH_FDS_MAX];
  size_t n = 0;
  eph_error_t err = {0};
  int r = eph_fds_recv(c->sock, eph_now_ms() + 10000, &tag, 1, fds, 2, &n, &err);
  if (r != 1 || n != 2)
    fail_msg("the child's sockets: %s", err.message);
  struct nl_sock *sk = NULL;
  if (eph_nl_route_adopt(&sk, fds[0], &err) < 0 ||
      eph_proxy_listen(sk, fds[1], 1, "lo", 32, url, &err) < 0)
    fail_msg("the listener on the child's lo: %s", err.message);
  *nl_out = sk;
  return fds[1];
}

/* A listener in the namespace the proxy calls the host's is refused, by namespace. */
static void
test_attach_refuses_the_hosts_namespace(void **st)
{
  (void)st;
  eph_egress_t *e = start();
  child_t c;
  if (!spawn(&c, e->addr, "")) {
    eph_egress_stop(e);
    skip();
  }
  struct nl_sock *sk = NULL;
  int fd = listener_of(&c, e->url, &sk);
  /* The proxy's record of the host's namespace becomes a socket of the child's. */
  int real = e->lock_fd;
  e->lock_fd = dup(fd);
  assert_int_equal(attach(e, fd, "listens in the host's network namespace"), -EPERM);
  assert_int_equal(e->listen_fd, -1);
  close(e->lock_fd);
  e->lock_fd = real;
  /* The same listener, now that the host's namespace is the real one again, is taken. */
  assert_int_equal(attach(e, fd, NULL), 0);
  close(fd);
  nl_socket_free(sk);
  reap(&c);
  eph_egress_stop(e);
}

/* The accepted path end to end: the child's connection to P:PORT on its own lo reaches the
 * proxy, which answers it (405 for a method it does not carry) and announces the refusal;
 * a second listener is refused. */
static void
test_listener_in_a_namespace_of_its_own(void **st)
{
  (void)st;
  int before = open_fds();
  eph_egress_t *e = start();
  child_t c;
  if (!spawn(&c, e->addr, "DELETE http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n")) {
    eph_egress_stop(e);
    skip();
  }
  struct nl_sock *sk = NULL;
  int fd = listener_of(&c, e->url, &sk);
  announced = 0;
  assert_int_equal(attach(e, fd, NULL), 0);
  assert_int_equal(attach(e, fd, "already has its listening socket"), -EBUSY);
  close(fd); /* the proxy keeps its own copy */
  nl_socket_free(sk);
  assert_int_equal(write(c.sock, "c", 1), 1);
  char answer[256] = "";
  ssize_t n = read(c.sock, answer, sizeof answer - 1);
  answer[n > 0 ? n : 0] = '\0';
  assert_string_equal(answer, "HTTP/1.1 405 Method Not Allowed");
  reap(&c);
  eph_egress_stop(e); /* joins the connection thread: its announce has run */
  assert_int_equal(announced, 1);
  assert_non_null(strstr(last_refusal, "only CONNECT, GET and HEAD"));
  assert_int_equal(open_fds(), before); /* nothing of the proxy or the namespace is left */
}

/* ------------------------------------------------------------ the fd-passing helpers */

static void
test_fds_recv_refuses_what_it_did_not_ask_for(void **st)
{
  (void)st;
  int sp[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
  int before = open_fds();
  int three[3] = {dup(0), dup(0), dup(0)};
  assert_int_equal(eph_fds_send(sp[1], "x", 1, three, 3), 0);
  for (int i = 0; i < 3; i++)
    close(three[i]);
  char tag;
  int fds[EPH_FDS_MAX];
  size_t n = 7;
  eph_error_t err = {0};
  assert_int_equal(eph_fds_recv(sp[0], eph_now_ms() + 5000, &tag, 1, fds, 2, &n, &err), -EPROTO);
  assert_int_equal(n, 0);
  assert_int_equal(open_fds(), before); /* all three closed */
  /* Too many fds to send at all; nothing in time; the peer gone. */
  int five[5] = {0, 0, 0, 0, 0};
  assert_int_equal(eph_fds_send(sp[1], "x", 1, five, 5), -EINVAL);
  assert_int_equal(eph_fds_recv(sp[0], eph_now_ms() + 20, &tag, 1, fds, 2, &n, &err), -ETIMEDOUT);
  close(sp[1]);
  assert_int_equal(eph_fds_recv(sp[0], eph_now_ms() + 5000, &tag, 1, fds, 2, &n, &err),
                   -ECONNRESET);
  close(sp[0]);
  /* A socket that is not NETLINK_ROUTE is never adopted (and is closed), one that is not
   * IPv4 TCP never becomes the listener. */
  struct nl_sock *sk = (struct nl_sock *)1;
  int udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  assert_int_equal(eph_nl_route_adopt(&sk, udp, &err), -EPROTOTYPE);
  assert_null(sk);
  assert_int_equal(fcntl(udp, F_GETFD), -1);
  int nl = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  struct sockaddr_nl local = {.nl_family = AF_NETLINK};
  assert_int_equal(bind(nl, (struct sockaddr *)&local, sizeof local), 0);
  assert_int_equal(eph_nl_route_adopt(&sk, nl, &err), 0);
  udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  assert_int_equal(eph_proxy_listen(sk, udp, 1, "lo", 32, "http://10.213.201.1:3128", &err),
                   -EPROTOTYPE);
  close(udp);
  nl_socket_free(sk);
}

int
main(void)
{
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_attach_refuses_other_sockets),
      cmocka_unit_test(test_attach_refuses_the_hosts_namespace),
      cmocka_unit_test(test_listener_in_a_namespace_of_its_own),
      cmocka_unit_test(test_fds_recv_refuses_what_it_did_not_ask_for),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
