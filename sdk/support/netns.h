/* Network namespace and netlink (libnl-3 route) helpers shared by backend-jail's veth.c
 * and backend-qemu's tap.c: both give a sandbox one link into the egress proxy's network
 * namespace, P/30 on the proxy's side (sdk/support/README.md). */
#ifndef EPH_SUPPORT_NETNS_H
#define EPH_SUPPORT_NETNS_H

#include <stdbool.h>
#include <stdint.h>

#include <ephemeral/plugin.h>
#include <netlink/netlink.h>

/* Parses the spec's proxy_url "http://A.B.C.D:PORT": *proxy_addr (host byte order) must be
 * the first host of a /30 (x.x.x.4k+1), since the sandbox's end takes the next one.
 * port may be NULL. Returns 0 or -EINVAL naming the URL. */
int eph_proxy_url_parse(const char *url, uint32_t *proxy_addr, uint16_t *port, eph_error_t *err);

/* Runs fn(arg, err) on a short-lived thread that setns()es into the network namespace
 * ns_fd first: a netlink socket, a tun device and /proc/sys/net belong to the netns of the
 * thread that opens them, and only that thread ever changes netns. Returns what fn
 * returned (err filled by fn, may be NULL), or a negative errno when the thread could not
 * be made or could not enter the namespace. */
int eph_netns_run(int ns_fd, int (*fn)(void *arg, eph_error_t *err), void *arg, eph_error_t *err);

/* Writes value to a /proc/sys file; optional: a missing file is not an error. */
int eph_sysctl_write(const char *path, const char *value, bool optional, eph_error_t *err);

/* disable_ipv6 = 1 for each interface name of ifs (NULL-terminated; "all", "default",
 * "lo", ...) in the calling thread's netns, so no link-local address ever appears. A
 * kernel without IPv6 (no /proc/sys/net/ipv6) has nothing to disable. */
int eph_ipv6_disable(const char *const *ifs, eph_error_t *err);

/* A NETLINK_ROUTE socket of the calling thread's netns into *sk (nl_socket_free). ifname
 * names what it is for, in the message. */
int eph_nl_route_connect(struct nl_sock **sk, const char *ifname, eph_error_t *err);

/* addr/prefix (IPv4, host byte order) on the interface. */
int eph_nl_addr_add(struct nl_sock *sk, int ifindex, uint32_t addr, int prefix, const char *ifname,
                    eph_error_t *err);

/* IFF_UP on the interface. */
int eph_nl_link_up(struct nl_sock *sk, int ifindex, const char *ifname, eph_error_t *err);

/* err from a libnl error code (negative NLE_*): "<what> <ifname>: <libnl's message>",
 * EEXIST for NLE_EXIST, EIO otherwise. Returns the negative code. */
int eph_nl_error(eph_error_t *err, int nlerr, const char *what, const char *ifname);

#endif
