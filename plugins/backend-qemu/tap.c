/* backend-qemu: the microVM's one network path when its run grants web (spec->network ==
 * 1): a tap device in a network namespace of its own, handed to QEMU as an open fd, and the
 * egress proxy's listener at P:PORT in that same namespace.
 *
 * The namespace holds the tap, the proxy's listening socket (accepted on by the core's proxy
 * in the daemon) and a lo that stays down: no other interface, no other listener, no route
 * anywhere. The guest's virtio-net frames reach exactly one socket, P:PORT, and nothing of
 * the host: no host address, no wildcard-bound host service, no forwarding. The same
 * guarantee as backend-jail's net.c, with a tap because the guest's end is QEMU's virtio-net
 * device, not a netns of its own.
 *
 * Built without any capability in the daemon's own namespaces (sdk/support/netns.h says why
 * this works):
 *   1. a helper, cloned into a new user and network namespace (no uid/gid map: none is
 *      needed, capabilities in a user namespace do not depend on it, and without one
 *      nothing in it can change ids or drop groups), only does system calls: IPv6 off (all,
 *      default) through /proc/sys/net, which shows the caller's namespace, so the tap never
 *      gets a link-local address; /dev/net/tun opened (a tun fd creates its device in the
 *      namespace it was opened in); a bound NETLINK_ROUTE socket and an unbound TCP socket;
 *      the three sent back (SCM_RIGHTS), then it exits. The fds keep the namespace alive;
 *   2. the daemon, creator of that user namespace and so holding CAP_NET_ADMIN over it:
 *      TUNSETIFF "ephq%d" (IFF_TAP | IFF_NO_PI, not persistent: the tap disappears when its
 *      last fd closes, that is when QEMU exits), P/30 on it, up (libnl-3 route on the
 *      helper's netlink socket), the TCP socket bound to P:PORT, listening, and handed to
 *      spec->proxy_attach (the core checks it).
 * proxy_url is "http://P:PORT" with P the first host of a /30 (P = x.x.x.4k+1). The guest
 * side (P+1/32 on eth0, one route to P/32, IPv6 off, no resolver) is configured by
 * ephemeral-guest from `eph_net=` on the kernel command line (guest/guest.c). Any failure
 * closes every fd (which removes the tap and the namespace) and fails the create. */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/netlink.h>
#include <netlink/netlink.h>
#include <netlink/route/link.h>

#include "qemu.h"
#include "support/netns.h"

/* How long the helper may take to send its fds (it does a few system calls). */
#define HELPER_TIMEOUT_MS 10000

enum { FD_TUN, FD_NL, FD_TCP, N_FDS };

/* What the helper failed at, by index: it cannot format a string (see helper_main). */
static const char *const helper_steps[] = {"disable IPv6 (net.ipv6.conf.*.disable_ipv6)",
                                           "open /dev/net/tun (module tun loaded?)",
                                           "netlink socket", "TCP socket", "send the fds"};

typedef struct helper_report {
  int errnum; /* 0: the fds came with it */
  int step;   /* index into helper_steps */
} helper_report_t;

/* The cloned helper: a fork of a possibly multi-threaded process, so system calls only (no
 * allocation, no lock, no stdio). */
__attribute__((noreturn)) static void
helper_main(int sock)
{
  static const char *const v6[] = {"all", "default", NULL};
  helper_report_t rep = {0, 0};
  int fds[N_FDS] = {-1, -1, -1};
  const char *failed = NULL;
  struct sockaddr_nl local = {.nl_family = AF_NETLINK};
  int r = eph_ipv6_off("/proc", v6, &failed);
  if (r < 0)
    goto fail;
  rep.step = 1;
  if ((fds[FD_TUN] = open("/dev/net/tun", O_RDWR | O_CLOEXEC)) < 0)
    goto fail_errno;
  rep.step = 2;
  fds[FD_NL] = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (fds[FD_NL] < 0 || bind(fds[FD_NL], (struct sockaddr *)&local, sizeof local) < 0)
    goto fail_errno;
  rep.step = 3;
  if ((fds[FD_TCP] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, IPPROTO_TCP)) < 0)
    goto fail_errno;
  rep.step = 4;
  if ((r = eph_fds_send(sock, &rep, sizeof rep, fds, N_FDS)) < 0)
    goto fail;
  _exit(0);
fail_errno:
  r = -errno;
fail:
  rep.errnum = -r;
  (void)eph_fds_send(sock, &rep, sizeof rep, NULL, 0);
  _exit(1);
}

/* Steps 1 of the file comment: the helper's three fds into fds[]. */
static int
helper_fds(int fds[N_FDS], eph_error_t *err)
{
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0)
    return eph_error_set(err, errno, "backend-qemu: socketpair: %s", strerror(errno));
  /* fork semantics (no CLONE_VM), born in its namespaces. */
  long pid = syscall(SYS_clone, (unsigned long)(CLONE_NEWUSER | CLONE_NEWNET | SIGCHLD), NULL, NULL,
                     NULL, NULL);
  if (pid == 0) {
    close(sp[0]);
    helper_main(sp[1]);
  }
  int e = errno;
  close(sp[1]);
  if (pid < 0) {
    close(sp[0]);
    return eph_error_set(
        err, e, "backend-qemu: clone(new user and network namespace) for the NIC: %s", strerror(e));
  }
  helper_report_t rep = {EIO, 0};
  size_t n = 0;
  int r =
      eph_fds_recv(sp[0], eph_now_ms() + HELPER_TIMEOUT_MS, &rep, sizeof rep, fds, N_FDS, &n, err);
  close(sp[0]);
  if (r < 0)
    kill((pid_t)pid, SIGKILL); /* it hung or broke the protocol */
  while (waitpid((pid_t)pid, NULL, 0) < 0 && errno == EINTR)
    ;
  if (r < 0)
    return eph_error_wrap(err, "backend-qemu: the NIC's namespace helper");
  if (r != (int)sizeof rep || rep.errnum != 0 || n != N_FDS) {
    for (size_t i = 0; i < n; i++)
      close(fds[i]);
    int step = rep.step >= 0 && rep.step < (int)(sizeof helper_steps / sizeof *helper_steps)
                   ? rep.step
                   : 4;
    int code = rep.errnum > 0 ? rep.errnum : EPROTO;
    return eph_error_set(err, code, "backend-qemu: the NIC's namespace helper: %s: %s",
                         helper_steps[step], strerror(code));
  }
  return 0;
}

static int
link_index(struct nl_sock *sk, const char *name, eph_error_t *err)
{
  struct rtnl_link *l = NULL;
  int r = rtnl_link_get_kernel(sk, 0, name, &l);
  if (r < 0)
    return eph_nl_error(err, r, "backend-qemu: looking up the tap", name);
  int idx = rtnl_link_get_ifindex(l);
  rtnl_link_put(l);
  return idx > 0 ? idx : eph_error_set(err, ENODEV, "backend-qemu: the tap %s is missing", name);
}

int
qemu_tap_open(const eph_sandbox_spec_t *spec, uint32_t *proxy, char *name, struct nl_sock **nl,
              eph_error_t *err)
{
  *nl = NULL;
  name[0] = '\0';
  if (spec->struct_size < offsetof(eph_sandbox_spec_t, proxy_ctx) + sizeof(void *) ||
      !spec->proxy_attach)
    return eph_error_set(err, ENOTSUP,
                         "backend-qemu: network=1 without proxy_attach (a core before ABI "
                         "1.2): refused");
  int r = eph_proxy_url_parse(spec->proxy_url, proxy, NULL, err);
  if (r < 0)
    return r;
  int fds[N_FDS];
  if ((r = helper_fds(fds, err)) < 0)
    return r;
  struct nl_sock *sk = NULL;
  r = eph_nl_route_adopt(&sk, fds[FD_NL], err); /* owns fds[FD_NL] from here */
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
  snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "ephq%%d"); /* the kernel picks N */
  if (r == 0 && ioctl(fds[FD_TUN], TUNSETIFF, &ifr) < 0)
    r = eph_error_set(err, errno, "backend-qemu: TUNSETIFF on /dev/net/tun: %s", strerror(errno));
  int idx = r == 0 ? link_index(sk, ifr.ifr_name, err) : r;
  if (idx < 0)
    r = idx;
  if (r == 0)
    r = eph_proxy_listen(sk, fds[FD_TCP], idx, ifr.ifr_name, 30, spec->proxy_url, err);
  if (r == 0)
    r = spec->proxy_attach(spec->proxy_ctx, fds[FD_TCP], err);
  close(fds[FD_TCP]); /* the core holds its own copy */
  if (r < 0) {
    nl_socket_free(sk);
    close(fds[FD_TUN]); /* not persistent: this removes the tap, and the namespace goes */
    return r;
  }
  snprintf(name, IFNAMSIZ, "%s", ifr.ifr_name);
  *nl = sk;
  return fds[FD_TUN];
}

bool
qemu_tap_exists(struct nl_sock *nl, const char *name)
{
  if (!nl || !name || !*name)
    return false;
  struct rtnl_link *l = NULL;
  if (rtnl_link_get_kernel(nl, 0, name, &l) < 0)
    return false;
  rtnl_link_put(l);
  return true;
}
