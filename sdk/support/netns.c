/* See netns.h. */
#include "config.h"

#include "netns.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <linux/netlink.h>

/* libnl through tables bound on first use (eph_nl_route_adopt loads them). */
#include "nl_api.h"

int
eph_proxy_url_parse(const char *url, uint32_t *proxy_addr, uint16_t *port, eph_error_t *err)
{
  char addr[INET_ADDRSTRLEN];
  unsigned p = 0;
  int used = 0;
  struct in_addr in;
  if (!url || sscanf(url, "http://%15[0-9.]:%5u%n", addr, &p, &used) != 2 || url[used] || p < 1 ||
      p > 65535 || inet_pton(AF_INET, addr, &in) != 1)
    return eph_error_set(err, EINVAL, "proxy_url '%s': expected http://A.B.C.D:PORT",
                         url ? url : "(null)");
  *proxy_addr = ntohl(in.s_addr);
  if (port)
    *port = (uint16_t)p;
  if ((*proxy_addr & 3) != 1)
    return eph_error_set(err, EINVAL,
                         "proxy_url '%s': the address must be the first host of "
                         "a /30 (x.x.x.4k+1): the sandbox's end takes the next one",
                         url);
  return 0;
}

/* ------------------------------------------------------------ fds over a Unix socket */

int
eph_fds_send(int sock, const void *data, size_t bytes, const int *fds, size_t n)
{
  if (bytes == 0 || bytes > 256 || n > EPH_FDS_MAX)
    return -EINVAL;
  union {
    char buf[CMSG_SPACE(sizeof(int) * EPH_FDS_MAX)];
    struct cmsghdr align;
  } u;
  memset(&u, 0, sizeof u);
  struct iovec iov = {.iov_base = (void *)data, .iov_len = bytes};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
  if (n > 0) {
    m.msg_control = u.buf;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * n);
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * n);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
  }
  ssize_t w;
  do
    w = sendmsg(sock, &m, MSG_NOSIGNAL);
  while (w < 0 && errno == EINTR);
  if (w < 0)
    return -errno;
  return (size_t)w == bytes ? 0 : -EIO;
}

int
eph_fds_recv(int sock, int64_t deadline_ms, void *data, size_t bytes, int *fds, size_t max,
             size_t *n, eph_error_t *err)
{
  *n = 0;
  for (;;) {
    int64_t left = deadline_ms - eph_now_ms();
    if (left <= 0)
      return eph_error_set(err, ETIMEDOUT, "no message with the sockets in time");
    struct pollfd pf = {.fd = sock, .events = POLLIN};
    int pr = poll(&pf, 1, left > 60000 ? 60000 : (int)left);
    if (pr < 0 && errno != EINTR)
      return eph_error_set(err, errno, "poll: %s", strerror(errno));
    if (pr > 0)
      break;
  }
  union {
    char buf[CMSG_SPACE(sizeof(int) * EPH_FDS_MAX)];
    struct cmsghdr align;
  } u;
  struct iovec iov = {.iov_base = data, .iov_len = bytes};
  struct msghdr m = {
      .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
  ssize_t got;
  do
    got = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
  while (got < 0 && errno == EINTR);
  if (got < 0)
    return eph_error_set(err, errno, "recvmsg: %s", strerror(errno));
  /* Every fd that came, whatever else is wrong: none may stay open unseen. */
  int came[EPH_FDS_MAX];
  size_t k = 0;
  bool odd = (m.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) != 0;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
      odd = true;
      continue;
    }
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (k < EPH_FDS_MAX)
        came[k++] = fd;
      else
        close(fd);
    }
  }
  if (odd || k > max) {
    for (size_t i = 0; i < k; i++)
      close(came[i]);
    return eph_error_set(err, EPROTO, "a malformed message (truncated, or %zu fds for %zu)", k,
                         max);
  }
  if (got == 0)
    return eph_error_set(err, ECONNRESET, "the peer closed without sending the sockets");
  memcpy(fds, came, k * sizeof(int));
  *n = k;
  return (int)got;
}

/* ------------------------------------------------------------ netlink */

int
eph_nl_error(eph_error_t *err, int nlerr, const char *what, const char *ifname)
{
  eph_error_t ignored = {0};
  if (!eph_nl_loaded() && eph_nl_load(&ignored) < 0)
    return eph_error_set(err, nlerr == -NLE_EXIST ? EEXIST : EIO, "%s %s: netlink error %d", what,
                         ifname, nlerr);
  return eph_error_set(err, nlerr == -NLE_EXIST ? EEXIST : EIO, "%s %s: %s", what, ifname,
                       nl_geterror(nlerr));
}

void
eph_nl_sock_free(struct nl_sock *sk)
{
  if (sk)
    nl_socket_free(sk);
}

static bool
sock_is(int fd, int domain, int type, int protocol)
{
  int v[3] = {-1, -1, -1};
  const int names[3] = {SO_DOMAIN, SO_TYPE, SO_PROTOCOL};
  for (int i = 0; i < 3; i++) {
    socklen_t len = sizeof v[i];
    if (getsockopt(fd, SOL_SOCKET, names[i], &v[i], &len) < 0 || len != sizeof v[i])
      return false;
  }
  return v[0] == domain && v[1] == type && v[2] == protocol;
}

int
eph_nl_route_adopt(struct nl_sock **out, int fd, eph_error_t *err)
{
  *out = NULL;
  if (!sock_is(fd, AF_NETLINK, SOCK_RAW, NETLINK_ROUTE)) {
    close(fd);
    return eph_error_set(err, EPROTOTYPE, "the namespace's netlink socket is not NETLINK_ROUTE");
  }
  int lr = eph_nl_load(err);
  if (lr < 0) {
    close(fd);
    return lr;
  }
  struct nl_sock *sk = nl_socket_alloc();
  if (!sk) {
    close(fd);
    return eph_error_set(err, ENOMEM, "netlink socket: out of memory");
  }
  /* libnl takes the port id from getsockname (the maker bound it). */
  int r = nl_socket_set_fd(sk, NETLINK_ROUTE, fd);
  if (r < 0) {
    close(fd);
    nl_socket_free(sk);
    return eph_nl_error(err, r, "adopting the netlink socket of", "the namespace");
  }
  *out = sk;
  return 0;
}

int
eph_nl_addr_add(struct nl_sock *sk, int ifindex, uint32_t addr, int prefix, const char *ifname,
                eph_error_t *err)
{
  struct rtnl_addr *ad = rtnl_addr_alloc();
  uint32_t be = htonl(addr);
  struct nl_addr *local = nl_addr_build(AF_INET, &be, 4);
  int r = -NLE_NOMEM;
  if (ad && local) {
    nl_addr_set_prefixlen(local, prefix);
    rtnl_addr_set_ifindex(ad, ifindex);
    rtnl_addr_set_family(ad, AF_INET);
    if ((r = rtnl_addr_set_local(ad, local)) == 0)
      r = rtnl_addr_add(sk, ad, 0);
  }
  nl_addr_put(local);
  rtnl_addr_put(ad);
  return r < 0 ? eph_nl_error(err, r, "add address on", ifname) : 0;
}

int
eph_nl_link_up(struct nl_sock *sk, int ifindex, const char *ifname, eph_error_t *err)
{
  struct rtnl_link *orig = rtnl_link_alloc(), *change = rtnl_link_alloc();
  int r = -NLE_NOMEM;
  if (orig && change) {
    rtnl_link_set_ifindex(orig, ifindex);
    rtnl_link_set_flags(change, IFF_UP);
    r = rtnl_link_change(sk, orig, change, 0);
  }
  rtnl_link_put(orig);
  rtnl_link_put(change);
  return r < 0 ? eph_nl_error(err, r, "bring up", ifname) : 0;
}

int
eph_proxy_listen(struct nl_sock *sk, int tcp_fd, int ifindex, const char *ifname, int prefix,
                 const char *proxy_url, eph_error_t *err)
{
  uint32_t proxy;
  uint16_t port;
  int r = eph_proxy_url_parse(proxy_url, &proxy, &port, err);
  if (r < 0)
    return r;
  if (!sock_is(tcp_fd, AF_INET, SOCK_STREAM, IPPROTO_TCP))
    return eph_error_set(err, EPROTOTYPE, "the namespace's socket for the proxy is not IPv4 TCP");
  if ((r = eph_nl_addr_add(sk, ifindex, proxy, prefix, ifname, err)) < 0 ||
      (r = eph_nl_link_up(sk, ifindex, ifname, err)) < 0)
    return r;
  struct sockaddr_in sin = {
      .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(proxy)};
  if (bind(tcp_fd, (struct sockaddr *)&sin, sizeof sin) < 0 || listen(tcp_fd, 64) < 0)
    return eph_error_set(err, errno, "the proxy's listener at %s on %s: %s", proxy_url + 7, ifname,
                         strerror(errno));
  return 0;
}

/* ------------------------------------------------------------ sysctls */

static bool
append(char *buf, size_t size, size_t *len, const char *s)
{
  size_t n = strlen(s);
  if (*len + n >= size)
    return false;
  memcpy(buf + *len, s, n + 1);
  *len += n;
  return true;
}

int
eph_ipv6_off(const char *proc, const char *const *names, const char **failed)
{
  for (size_t i = 0; names[i]; i++) {
    char path[256];
    size_t len = 0;
    *failed = names[i];
    path[0] = '\0';
    if (!append(path, sizeof path, &len, proc) ||
        !append(path, sizeof path, &len, "/sys/net/ipv6/conf/") ||
        !append(path, sizeof path, &len, names[i]) ||
        !append(path, sizeof path, &len, "/disable_ipv6"))
      return -ENAMETOOLONG;
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT)
      continue; /* no IPv6 in this kernel: nothing to disable */
    if (fd < 0)
      return -errno;
    ssize_t w = write(fd, "1", 1);
    int e = errno;
    close(fd);
    if (w != 1)
      return w < 0 ? -e : -EIO;
  }
  *failed = NULL;
  return 0;
}
