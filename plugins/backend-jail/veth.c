/* backend-jail: the one network path a sandbox gets when its run grants `web`
 * (spec->network == 1): a veth pair between the sandbox's netns and the proxy's netns.
 *
 * The proxy's netns (spec->proxy_netns_fd) is a network namespace the core made for the
 * proxy's listening socket alone: nothing else listens there and it has no other
 * interface, so the sandbox can reach exactly one socket, P:PORT, and nothing of the host
 * (no wildcard-bound host service, no host address, no forwarding). This replaces
 * filtering rules on a host-netns interface: netfilter would need a library outside the
 * project's set, and tc ingress filtering is not in every kernel.
 *
 * proxy_url is "http://P:PORT" with P the first host of a /30 (P = x.x.x.4k+1, chosen by
 * the core's proxy); the sandbox's end gets P+1. Everything is built with libnl-3's route
 * API, after the uid maps are written and before the child is told to go:
 *   1. in the sandbox's netns: IPv6 disabled (all, default, lo), so the veth end inherits
 *      it and no link-local address ever appears; no resolv.conf exists (setup.c)
 *   2. in the proxy's netns: IPv6 disabled; the veth pair, "ephv<slot>" there and "eth0"
 *      in the sandbox's netns (IFLA_NET_NS_PID), so neither end is ever in the host's
 *      netns; P/30 on it, up
 *   3. in the sandbox's netns: P+1/32 on eth0, up, one route: P/32 dev eth0. No default
 *      route: every other destination is "Network is unreachable".
 * Any failure deletes the pair (which takes its sandbox end with it) and fails the create:
 * a sandbox never starts with half of these rules.
 *
 * Each step runs on a short-lived thread that setns()es into the namespace: a netlink
 * socket and /proc/sys/net belong to the netns of the thread that opens them. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <netlink/netlink.h>
#include <netlink/route/addr.h>
#include <netlink/route/link.h>
#include <netlink/route/link/veth.h>
#include <netlink/route/route.h>

#include "jail.h"
#include "support/netns.h"

#define INNER_IF "eth0"

/* Parsing, namespace threads, sysctl and the address/link calls are the support
 * library's (sdk/support/netns.h), shared with backend-qemu's tap.c. */

static int
host_route(struct nl_sock *sk, int ifindex, uint32_t dst, eph_error_t *err)
{
  struct rtnl_route *rt = rtnl_route_alloc();
  struct rtnl_nexthop *nh = rtnl_route_nh_alloc();
  uint32_t be = htonl(dst);
  struct nl_addr *d = nl_addr_build(AF_INET, &be, 4);
  int r = -NLE_NOMEM;
  if (rt && nh && d) {
    nl_addr_set_prefixlen(d, 32);
    rtnl_route_set_family(rt, AF_INET);
    rtnl_route_set_table(rt, RT_TABLE_MAIN);
    rtnl_route_set_protocol(rt, RTPROT_STATIC);
    rtnl_route_set_scope(rt, RT_SCOPE_LINK);
    rtnl_route_set_type(rt, RTN_UNICAST);
    if ((r = rtnl_route_set_dst(rt, d)) == 0) {
      rtnl_route_nh_set_ifindex(nh, ifindex);
      rtnl_route_add_nexthop(rt, nh); /* owned by rt from here */
      nh = NULL;
      r = rtnl_route_add(sk, rt, NLM_F_CREATE | NLM_F_EXCL);
    }
  }
  if (nh)
    rtnl_route_nh_free(nh);
  nl_addr_put(d);
  rtnl_route_put(rt);
  return r < 0 ? eph_nl_error(err, r, "add the proxy route on", INNER_IF) : 0;
}

/* ------------------------------------------------------------ inside a netns */

enum {
  STAGE_SANDBOX_NO_V6 = 1,
  STAGE_PROXY_SIDE = 2,
  STAGE_SANDBOX_ROUTE = 3,
  STAGE_REMOVE = 4,
  STAGE_EXISTS = 5
};

typedef struct inner {
  int ns_fd;
  int stage;
  uint32_t proxy;
  pid_t pid;           /* the sandbox's init, for the veth peer */
  const char *host_if; /* the pair's end in the proxy's netns */
} inner_t;

static int
disable_ipv6(eph_error_t *err)
{
  static const char *const conf[] = {"all", "default", "lo", NULL};
  return eph_ipv6_disable(conf, err);
}

static int
inner_configure(void *arg, eph_error_t *err)
{
  inner_t *in = arg;
  if (in->stage == STAGE_SANDBOX_NO_V6)
    return disable_ipv6(err);
  if (in->stage == STAGE_EXISTS)
    return if_nametoindex(in->host_if) != 0;
  const char *ifname = in->stage == STAGE_SANDBOX_ROUTE ? INNER_IF : in->host_if;
  struct nl_sock *sk = NULL;
  int r = eph_nl_route_connect(&sk, ifname, err), idx = 0;
  if (r < 0)
    return r;
  if (in->stage == STAGE_REMOVE) {
    struct rtnl_link *l = rtnl_link_alloc();
    if (l) {
      rtnl_link_set_name(l, in->host_if);
      (void)rtnl_link_delete(sk, l); /* gone already when the sandbox's netns died first */
      rtnl_link_put(l);
    }
    r = 0;
    goto out;
  }
  if (in->stage == STAGE_PROXY_SIDE) {
    if ((r = disable_ipv6(err)) < 0)
      goto out;
    /* libnl's veth helper creates the pair here with its peer in the netns of `pid`. */
    if ((r = rtnl_link_veth_add(sk, in->host_if, INNER_IF, in->pid)) < 0) {
      r = eph_nl_error(err, r, "create the veth pair", in->host_if);
      goto out;
    }
  }
  idx = (int)if_nametoindex(ifname);
  if (idx <= 0) {
    r = eph_error_set(err, ENODEV, "the veth end %s is missing", ifname);
    goto out;
  }
  if (in->stage == STAGE_PROXY_SIDE) {
    if ((r = eph_nl_addr_add(sk, idx, in->proxy, 30, ifname, err)) == 0)
      r = eph_nl_link_up(sk, idx, ifname, err);
  } else if ((r = eph_nl_addr_add(sk, idx, in->proxy + 1, 32, ifname, err)) == 0 &&
             (r = eph_nl_link_up(sk, idx, ifname, err)) == 0) {
    r = host_route(sk, idx, in->proxy, err);
  }
out:
  nl_socket_free(sk);
  return r;
}

static int
in_netns(inner_t *in, eph_error_t *err)
{
  return eph_netns_run(in->ns_fd, inner_configure, in, err);
}

/* ------------------------------------------------------------ the pair */

void
jail_veth_remove(int proxy_ns_fd, const char *host_if)
{
  if (proxy_ns_fd < 0 || !host_if || !*host_if)
    return;
  inner_t in = {.ns_fd = proxy_ns_fd, .stage = STAGE_REMOVE, .host_if = host_if};
  (void)in_netns(&in, NULL);
}

bool
jail_veth_exists(int proxy_ns_fd, const char *host_if)
{
  if (proxy_ns_fd < 0 || !host_if || !*host_if)
    return false;
  inner_t in = {.ns_fd = proxy_ns_fd, .stage = STAGE_EXISTS, .host_if = host_if};
  return in_netns(&in, NULL) > 0;
}

int
jail_veth_setup(int slot, pid_t pid, const char *proxy_url, int proxy_ns_fd, char *host_if,
                eph_error_t *err)
{
  uint32_t proxy;
  uint16_t port;
  int r = eph_proxy_url_parse(proxy_url, &proxy, &port, err);
  if (r < 0)
    return r;
  host_if[0] = '\0';
  char name[IFNAMSIZ], path[64];
  snprintf(name, sizeof name, "ephv%d", slot);
  snprintf(path, sizeof path, "/proc/%d/ns/net", (int)pid);
  cleanup_close int ns_fd = open(path, O_RDONLY | O_CLOEXEC);
  if (ns_fd < 0)
    return eph_error_set(err, errno, "open %s: %s", path, strerror(errno));
  inner_t in = {
      .ns_fd = ns_fd, .stage = STAGE_SANDBOX_NO_V6, .proxy = proxy, .pid = pid, .host_if = name};
  if ((r = in_netns(&in, err)) < 0)
    return r;
  in.ns_fd = proxy_ns_fd;
  in.stage = STAGE_PROXY_SIDE;
  r = in_netns(&in, err);
  if (r == 0) {
    in.ns_fd = ns_fd;
    in.stage = STAGE_SANDBOX_ROUTE;
    r = in_netns(&in, err);
  }
  if (r < 0) {
    jail_veth_remove(proxy_ns_fd, name);
    return r;
  }
  snprintf(host_if, IFNAMSIZ, "%s", name);
  return 0;
}
