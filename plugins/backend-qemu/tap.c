/* backend-qemu: the microVM's one network path when its run grants `web` (spec->network ==
 * 1): a tap device in the proxy's network namespace, handed to QEMU as an open fd.
 *
 * The proxy's netns (spec->proxy_netns_fd) is a namespace the core made for the proxy's
 * listening socket alone (see core/egress.h): no other interface, no other listener, no
 * route anywhere. The tap lives only there, so the guest's virtio-net frames reach exactly
 * one socket, P:PORT, and nothing of the host: no host address, no wildcard-bound host
 * service, no forwarding. The same guarantee as backend-jail's veth.c, with a tap instead of
 * the veth pair because the guest's end is QEMU's virtio-net device, not a host netns.
 *
 * proxy_url is "http://P:PORT" with P the first host of a /30 (P = x.x.x.4k+1). Built with
 * /dev/net/tun and libnl-3's route API on a short-lived thread that setns()es into the
 * proxy's netns (a tun device and a netlink socket belong to the netns of the thread that
 * opens them):
 *   1. IPv6 disabled in the proxy's netns (all, default), so the tap never gets a
 *      link-local address;
 *   2. the tap "ephq<N>" (IFF_TAP | IFF_NO_PI, not persistent: it disappears when its last
 *      fd closes, that is when QEMU exits);
 *   3. P/30 on it, up.
 * The guest side (P+1/32 on eth0, one route to P/32, IPv6 off, no resolver) is configured
 * by ephemeral-guest from `eph_net=` on the kernel command line (guest/guest.c).
 * Any failure closes the fd (which removes the tap) and fails the create. */
#include <config.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <netlink/netlink.h>
#include <netlink/route/addr.h>
#include <netlink/route/link.h>

#include "qemu.h"

int
qemu_tap_parse_url(const char *url, uint32_t *proxy, eph_error_t *err)
{
  char addr[INET_ADDRSTRLEN];
  unsigned p = 0;
  int used = 0;
  struct in_addr in;
  if (!url || sscanf(url, "http://%15[0-9.]:%5u%n", addr, &p, &used) != 2 || url[used] ||
      p < 1 || p > 65535 || inet_pton(AF_INET, addr, &in) != 1)
    return eph_error_set(err, EINVAL, "backend-qemu: proxy_url '%s': expected "
                         "http://A.B.C.D:PORT", url ? url : "(null)");
  *proxy = ntohl(in.s_addr);
  if ((*proxy & 3) != 1)
    return eph_error_set(err, EINVAL, "backend-qemu: proxy_url '%s': the address must be the "
                         "first host of a /30 (x.x.x.4k+1): the guest takes the next one", url);
  return 0;
}

typedef struct tap_job {
  int ns_fd;
  enum { TAP_CREATE, TAP_EXISTS } what;
  uint32_t proxy;
  char name[IFNAMSIZ]; /* in: for TAP_EXISTS; out: for TAP_CREATE */
  int fd;              /* out: the tap's fd (TAP_CREATE) */
  eph_error_t err;
  int r;
} tap_job_t;

static int
nl_fail(eph_error_t *err, int nlerr, const char *what, const char *ifname)
{
  return eph_error_set(err, EIO, "backend-qemu: %s %s: %s", what, ifname, nl_geterror(nlerr));
}

static int
no_ipv6(eph_error_t *err)
{
  /* /proc/sys/net/ipv6 is absent when the kernel has no IPv6: nothing to disable. */
  static const char *const paths[] = {"/proc/sys/net/ipv6/conf/all/disable_ipv6",
                                      "/proc/sys/net/ipv6/conf/default/disable_ipv6", NULL};
  for (size_t i = 0; paths[i]; i++) {
    int fd = open(paths[i], O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT)
        continue;
      return eph_error_set(err, errno, "backend-qemu: open %s: %s", paths[i], strerror(errno));
    }
    ssize_t n = write(fd, "1", 1);
    int e = errno;
    close(fd);
    if (n != 1)
      return eph_error_set(err, e, "backend-qemu: write %s: %s", paths[i], strerror(e));
  }
  return 0;
}

/* P/30 on the tap, then up. */
static int
configure(struct nl_sock *sk, int ifindex, uint32_t proxy, const char *name, eph_error_t *err)
{
  struct rtnl_addr *ad = rtnl_addr_alloc();
  uint32_t be = htonl(proxy);
  struct nl_addr *local = nl_addr_build(AF_INET, &be, 4);
  int r = -NLE_NOMEM;
  if (ad && local) {
    nl_addr_set_prefixlen(local, 30);
    rtnl_addr_set_ifindex(ad, ifindex);
    rtnl_addr_set_family(ad, AF_INET);
    if ((r = rtnl_addr_set_local(ad, local)) == 0)
      r = rtnl_addr_add(sk, ad, 0);
  }
  nl_addr_put(local);
  rtnl_addr_put(ad);
  if (r < 0)
    return nl_fail(err, r, "add the proxy's address on", name);
  struct rtnl_link *orig = rtnl_link_alloc(), *change = rtnl_link_alloc();
  r = -NLE_NOMEM;
  if (orig && change) {
    rtnl_link_set_ifindex(orig, ifindex);
    rtnl_link_set_flags(change, IFF_UP);
    r = rtnl_link_change(sk, orig, change, 0);
  }
  rtnl_link_put(orig);
  rtnl_link_put(change);
  return r < 0 ? nl_fail(err, r, "bring up", name) : 0;
}

static int
create_tap(tap_job_t *j)
{
  eph_error_t *err = &j->err;
  int r = no_ipv6(err);
  if (r < 0)
    return r;
  int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
  if (fd < 0)
    return eph_error_set(err, errno, "backend-qemu: /dev/net/tun: %s (module tun loaded?)",
                         strerror(errno));
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
  snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "ephq%%d"); /* the kernel picks N */
  if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
    r = eph_error_set(err, errno, "backend-qemu: TUNSETIFF on /dev/net/tun: %s",
                      strerror(errno));
    close(fd);
    return r;
  }
  snprintf(j->name, sizeof j->name, "%s", ifr.ifr_name);
  struct nl_sock *sk = nl_socket_alloc();
  if (!sk) {
    close(fd);
    return eph_error_set(err, ENOMEM, "backend-qemu: netlink socket: out of memory");
  }
  int idx = (int)if_nametoindex(j->name);
  if ((r = nl_connect(sk, NETLINK_ROUTE)) < 0)
    r = nl_fail(err, r, "netlink connect in the netns of", j->name);
  else if (idx <= 0)
    r = eph_error_set(err, ENODEV, "backend-qemu: the tap %s is missing", j->name);
  else
    r = configure(sk, idx, j->proxy, j->name, err);
  nl_socket_free(sk);
  if (r < 0) {
    close(fd); /* not persistent: this removes the tap */
    return r;
  }
  j->fd = fd;
  return 0;
}

static void *
tap_main(void *arg)
{
  tap_job_t *j = arg;
  /* Only this thread changes netns; it ends right after, so nothing else runs in it. */
  if (setns(j->ns_fd, CLONE_NEWNET) < 0)
    j->r = eph_error_set(&j->err, errno, "backend-qemu: setns into the proxy's network "
                         "namespace: %s", strerror(errno));
  else if (j->what == TAP_EXISTS)
    j->r = if_nametoindex(j->name) != 0;
  else
    j->r = create_tap(j);
  return NULL;
}

static int
in_proxy_netns(tap_job_t *j, eph_error_t *err)
{
  pthread_t t;
  j->r = -EIO;
  j->fd = -1;
  int e = pthread_create(&t, NULL, tap_main, j);
  if (e)
    return eph_error_set(err, e, "backend-qemu: thread for a network namespace: %s",
                         strerror(e));
  pthread_join(t, NULL);
  if (j->r < 0 && err)
    *err = j->err;
  return j->r;
}

int
qemu_tap_open(int proxy_ns_fd, const char *proxy_url, uint32_t *proxy, char *name,
              eph_error_t *err)
{
  if (proxy_ns_fd < 0)
    return eph_error_set(err, EINVAL, "backend-qemu: network=1 without the proxy's network "
                         "namespace (proxy_netns_fd is -1)");
  int r = qemu_tap_parse_url(proxy_url, proxy, err);
  if (r < 0)
    return r;
  tap_job_t j = {.ns_fd = proxy_ns_fd, .what = TAP_CREATE, .proxy = *proxy};
  if ((r = in_proxy_netns(&j, err)) < 0)
    return r;
  snprintf(name, IFNAMSIZ, "%s", j.name);
  return j.fd;
}

bool
qemu_tap_exists(int proxy_ns_fd, const char *name)
{
  if (proxy_ns_fd < 0 || !name || !*name)
    return false;
  tap_job_t j = {.ns_fd = proxy_ns_fd, .what = TAP_EXISTS};
  snprintf(j.name, sizeof j.name, "%s", name);
  return in_proxy_netns(&j, NULL) > 0;
}
