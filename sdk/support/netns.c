/* See netns.h. */
#include "config.h"

#include "netns.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <netlink/route/addr.h>
#include <netlink/route/link.h>

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

typedef struct job {
  int ns_fd;
  int (*fn)(void *arg, eph_error_t *err);
  void *arg;
  eph_error_t err;
  int r;
} job_t;

static void *
job_main(void *p)
{
  job_t *j = p;
  /* Only this thread changes netns; it ends right after, so nothing else runs in it. */
  if (setns(j->ns_fd, CLONE_NEWNET) < 0)
    j->r = eph_error_set(&j->err, errno, "setns into a network namespace: %s", strerror(errno));
  else
    j->r = j->fn(j->arg, &j->err);
  return NULL;
}

int
eph_netns_run(int ns_fd, int (*fn)(void *arg, eph_error_t *err), void *arg, eph_error_t *err)
{
  job_t j = {.ns_fd = ns_fd, .fn = fn, .arg = arg, .r = -EIO};
  pthread_t t;
  int e = pthread_create(&t, NULL, job_main, &j);
  if (e)
    return eph_error_set(err, e, "thread for a network namespace: %s", strerror(e));
  pthread_join(t, NULL);
  if (j.r < 0 && err)
    *err = j.err;
  return j.r;
}

int
eph_sysctl_write(const char *path, const char *value, bool optional, eph_error_t *err)
{
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    if (optional && errno == ENOENT)
      return 0;
    return eph_error_set(err, errno, "open %s: %s", path, strerror(errno));
  }
  ssize_t n = write(fd, value, strlen(value));
  int e = errno;
  close(fd);
  if (n != (ssize_t)strlen(value))
    return eph_error_set(err, e, "write %s: %s", path, strerror(e));
  return 0;
}

int
eph_ipv6_disable(const char *const *ifs, eph_error_t *err)
{
  for (size_t i = 0; ifs[i]; i++) {
    char path[96];
    snprintf(path, sizeof path, "/proc/sys/net/ipv6/conf/%s/disable_ipv6", ifs[i]);
    /* Absent when the kernel has no IPv6: nothing to disable. */
    int r = eph_sysctl_write(path, "1", true, err);
    if (r < 0)
      return r;
  }
  return 0;
}

int
eph_nl_error(eph_error_t *err, int nlerr, const char *what, const char *ifname)
{
  return eph_error_set(err, nlerr == -NLE_EXIST ? EEXIST : EIO, "%s %s: %s", what, ifname,
                       nl_geterror(nlerr));
}

int
eph_nl_route_connect(struct nl_sock **out, const char *ifname, eph_error_t *err)
{
  struct nl_sock *sk = nl_socket_alloc();
  if (!sk)
    return eph_error_set(err, ENOMEM, "netlink socket: out of memory");
  int r = nl_connect(sk, NETLINK_ROUTE);
  if (r < 0) {
    nl_socket_free(sk);
    return eph_nl_error(err, r, "netlink connect in the netns of", ifname);
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
