/* backend-jail: the one network path a sandbox gets when its run grants `web`
 * (spec->network == 1): the egress proxy's listening socket at P:PORT on the sandbox's own
 * loopback, accepted on by the core's proxy in the daemon.
 *
 * The sandbox's network namespace holds lo and nothing else: no veth, no route off the
 * namespace, so besides its own loopback the sandbox reaches exactly one socket, the
 * proxy's, whose connections to the world are the daemon's (made in the host's netns, each
 * one checked by the egress policy). Nothing of the host is reachable: no host address, no
 * wildcard-bound host service, no forwarding. Every other destination is "Network is
 * unreachable" (no route at all).
 *
 * Built without any capability in the daemon's own namespaces (no setns(), which needs
 * CAP_SYS_ADMIN there; see sdk/support/netns.h for why this works):
 *   0. the cloned child, before anything else, makes a NETLINK_ROUTE socket and an unbound
 *      TCP socket in its (the sandbox's) netns and sends both over the go socket
 *      (jail_net_child_sockets); it has run nothing of the guest yet, and closes its copies;
 *   1. the parent, after the uid maps and before "go" (jail_net_setup): P/32 on lo, lo up,
 *      the TCP socket bound to P:PORT and listening, handed to the core with
 *      spec->proxy_attach (which checks it: listening, bound to P:PORT, not in the host's
 *      netns); then closes its copies: the core holds the only one;
 *   2. the child, at step 8, turns IPv6 off (all, default, lo) through its own /proc.
 * proxy_url is "http://P:PORT" (P = x.x.x.4k+1, chosen by the core's proxy). No resolv.conf
 * exists (setup.c). Any failure fails the create: a sandbox never starts with half of this.
 * The listener keeps the sandbox's netns alive until the core's proxy stops (after destroy):
 * nothing is left on the host to remove. */
#include "config.h"

#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <linux/netlink.h>

#include "jail.h"
#include "support/netns.h"

#define LO_IFINDEX 1 /* lo registers first in every new network namespace (net/core/dev.c) */

int
jail_net_child_sockets(int go_fd, const char **step)
{
  int fds[2] = {-1, -1}, r = 0;
  struct sockaddr_nl local = {.nl_family = AF_NETLINK};
  *step = "netlink socket for the proxy's listener";
  fds[0] = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (fds[0] < 0 || bind(fds[0], (struct sockaddr *)&local, sizeof local) < 0)
    r = -errno;
  if (r == 0) {
    *step = "TCP socket for the proxy's listener";
    fds[1] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, IPPROTO_TCP);
    r = fds[1] < 0 ? -errno : 0;
  }
  if (r == 0) {
    *step = "sending the proxy's sockets to the parent";
    r = eph_fds_send(go_fd, "n", 1, fds, 2);
  }
  for (int i = 0; i < 2; i++)
    if (fds[i] >= 0)
      close(fds[i]);
  return r;
}

int
jail_net_setup(const eph_sandbox_spec_t *spec, int go_fd, int64_t deadline_ms, eph_error_t *err)
{
  char tag;
  int fds[EPH_FDS_MAX];
  size_t n = 0;
  int r = eph_fds_recv(go_fd, deadline_ms, &tag, 1, fds, 2, &n, err);
  if (r > 0 && (n != 2 || tag != 'n')) {
    for (size_t i = 0; i < n; i++)
      close(fds[i]);
    r = eph_error_set(err, EPROTO, "the child sent %zu sockets, not its netlink and TCP socket", n);
  }
  if (r < 0)
    return eph_error_wrap(err, "the proxy's sockets from the sandbox");
  struct nl_sock *sk = NULL;
  r = eph_nl_route_adopt(&sk, fds[0], err); /* owns fds[0] from here */
  if (r == 0)
    r = eph_proxy_listen(sk, fds[1], LO_IFINDEX, "lo", 32, spec->proxy_url, err);
  if (r == 0)
    r = spec->proxy_attach(spec->proxy_ctx, fds[1], err);
  eph_nl_sock_free(sk);
  close(fds[1]);
  return r;
}
