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
#include "support/netns.h"

int
qemu_tap_parse_url(const char *url, uint32_t *proxy, eph_error_t *err)
{
  return eph_proxy_url_parse(url, proxy, NULL, err);
}

typedef struct tap_job {
  int ns_fd;
  enum { TAP_CREATE, TAP_EXISTS } what;
  uint32_t proxy;
  char name[IFNAMSIZ]; /* in: for TAP_EXISTS; out: for TAP_CREATE */
  int fd;              /* out: the tap's fd (TAP_CREATE) */
} tap_job_t;

/* P/30 on the tap, then up. */
static int
configure(struct nl_sock *sk, int ifindex, uint32_t proxy, const char *name, eph_error_t *err)
{
  int r = eph_nl_addr_add(sk, ifindex, proxy, 30, name, err);
  return r < 0 ? r : eph_nl_link_up(sk, ifindex, name, err);
}

static int
create_tap(tap_job_t *j, eph_error_t *err)
{
  static const char *const conf[] = {"all", "default", NULL};
  int r = eph_ipv6_disable(conf, err);
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
    r = eph_error_set(err, errno, "backend-qemu: TUNSETIFF on /dev/net/tun: %s", strerror(errno));
    close(fd);
    return r;
  }
  snprintf(j->name, sizeof j->name, "%s", ifr.ifr_name);
  struct nl_sock *sk = NULL;
  int idx = (int)if_nametoindex(j->name);
  if (idx <= 0)
    r = eph_error_set(err, ENODEV, "backend-qemu: the tap %s is missing", j->name);
  else if ((r = eph_nl_route_connect(&sk, j->name, err)) == 0)
    r = configure(sk, idx, j->proxy, j->name, err);
  nl_socket_free(sk);
  if (r < 0) {
    close(fd); /* not persistent: this removes the tap */
    return r;
  }
  j->fd = fd;
  return 0;
}

static int
tap_main(void *arg, eph_error_t *err)
{
  tap_job_t *j = arg;
  if (j->what == TAP_EXISTS)
    return if_nametoindex(j->name) != 0;
  return create_tap(j, err);
}

static int
in_proxy_netns(tap_job_t *j, eph_error_t *err)
{
  j->fd = -1;
  return eph_netns_run(j->ns_fd, tap_main, j, err);
}

int
qemu_tap_open(int proxy_ns_fd, const char *proxy_url, uint32_t *proxy, char *name, eph_error_t *err)
{
  if (proxy_ns_fd < 0)
    return eph_error_set(err, EINVAL,
                         "backend-qemu: network=1 without the proxy's network "
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
