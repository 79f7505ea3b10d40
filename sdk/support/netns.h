/* The sandbox's end of the egress proxy, shared by backend-jail and backend-qemu: both put
 * the proxy's listening socket (eph_sandbox_spec_t.proxy_attach) at P:PORT in a network
 * namespace the daemon made through a child process and never enters (sdk/support/README.md).
 *
 * Why without setns(): entering a network namespace needs CAP_SYS_ADMIN in the caller's own
 * user namespace, and a daemon holding that is what a reviewer refuses. Instead a process in
 * the namespace (the jail's sandbox child before it runs anything of the guest, backend-qemu's
 * helper) makes the sockets there (a socket belongs to the namespace of the process that made
 * it) and passes them over a Unix socket (SCM_RIGHTS). The namespace is owned by a user
 * namespace that child made with the daemon's effective uid, and the creator's uid holds every
 * capability in such a user namespace (user_namespaces(7)): the daemon configures the
 * namespace's links through the netlink socket (CAP_NET_ADMIN over that user namespace, which
 * the kernel checks for both the socket's opener and the sender) with no capability in its
 * own. */
#ifndef EPH_SUPPORT_NETNS_H
#define EPH_SUPPORT_NETNS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ephemeral/plugin.h>
#include <netlink/netlink.h>

/* Parses the spec's proxy_url "http://A.B.C.D:PORT": *proxy_addr (host byte order) must be
 * the first host of a /30 (x.x.x.4k+1), since a microVM's end takes the next one.
 * port may be NULL. Returns 0 or -EINVAL naming the URL. */
int eph_proxy_url_parse(const char *url, uint32_t *proxy_addr, uint16_t *port, eph_error_t *err);

/* Up to EPH_FDS_MAX file descriptors in one message. */
#define EPH_FDS_MAX 4

/* Sends bytes (1..256) of data with n (0..EPH_FDS_MAX) fds as one SCM_RIGHTS message on the
 * Unix socket sock. System calls only (no allocation, no lock): safe in a child cloned from a
 * multi-threaded process. Returns 0 or -errno. */
int eph_fds_send(int sock, const void *data, size_t bytes, const int *fds, size_t n);

/* Receives one message of eph_fds_send: up to bytes of data, and its fds (made CLOEXEC) into
 * fds[0..*n). Waits until deadline_ms (eph_now_ms() clock). A message carrying more than max
 * fds, or truncated, is refused with every fd it carried closed. Returns the data bytes
 * received (> 0), or negative with err: -ECONNRESET when the peer closed first (it died),
 * -ETIMEDOUT, or the socket error. */
int eph_fds_recv(int sock, int64_t deadline_ms, void *data, size_t bytes, int *fds, size_t max,
                 size_t *n, eph_error_t *err);

/* Adopts fd, a NETLINK_ROUTE socket made (and bound) in another network namespace, into *sk:
 * its requests act on that namespace. *sk owns fd from here (eph_nl_sock_free closes it), on
 * failure fd is closed. Refused unless fd is an AF_NETLINK NETLINK_ROUTE socket. libnl is
 * bound here, on first use (nl_api.h): -ELIBACC naming it when it cannot be loaded. */
int eph_nl_route_adopt(struct nl_sock **sk, int fd, eph_error_t *err);

/* Frees an adopted socket (closing its fd); sk may be NULL. */
void eph_nl_sock_free(struct nl_sock *sk);

/* The proxy's listener in the namespace of sk and tcp_fd (both made there): P/prefix (P from
 * proxy_url) on the interface ifindex, the interface up, tcp_fd (an unbound IPv4 TCP
 * socket) bound to P:PORT and listening. ifname names the interface in messages. 0, or
 * negative with err (the caller closes tcp_fd; the namespace is the caller's to drop). */
int eph_proxy_listen(struct nl_sock *sk, int tcp_fd, int ifindex, const char *ifname, int prefix,
                     const char *proxy_url, eph_error_t *err);

/* addr/prefix (IPv4, host byte order) on the interface. */
int eph_nl_addr_add(struct nl_sock *sk, int ifindex, uint32_t addr, int prefix, const char *ifname,
                    eph_error_t *err);

/* IFF_UP on the interface. */
int eph_nl_link_up(struct nl_sock *sk, int ifindex, const char *ifname, eph_error_t *err);

/* err from a libnl error code (negative NLE_*): "<what> <ifname>: <libnl's message>",
 * EEXIST for NLE_EXIST, EIO otherwise. Returns the negative code. */
int eph_nl_error(eph_error_t *err, int nlerr, const char *what, const char *ifname);

/* Writes "1" to /proc/sys/net/ipv6/conf/<name>/disable_ipv6 under proc (the mount point of a
 * proc of the caller's network namespace, "/proc" or a sandbox's), for each name of names
 * (NULL-terminated: "all", "default", "lo"): no link-local address ever appears. A kernel
 * without IPv6 has nothing to disable. System calls only (for a cloned child). Returns 0,
 * or -errno with *failed the name. */
int eph_ipv6_off(const char *proc, const char *const *names, const char **failed);

#endif
