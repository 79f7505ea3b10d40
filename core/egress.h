/* The sandbox egress proxy: the only way out of a sandbox whose run grants `web`.
 *
 * One proxy per run, at proxy_url "http://P:PORT". Its listening socket is made by the
 * backend in a network namespace the sandbox reaches and the host's processes do not (the
 * jail: P on the sandbox's own lo; the microVM: P on the tap of a namespace of its own) and
 * handed over with eph_sandbox_spec_t.proxy_attach (eph_egress_attach checks it): the
 * proxy is the only thing a sandbox can reach, and the daemon needs no capability to set
 * it up. Everything else the proxy does (resolving, connecting upstream) happens in the
 * host's network namespace. It speaks two forms:
 *   CONNECT host:port HTTP/1.1            a TCP tunnel (HTTPS); the TLS inside is never
 *                                         decrypted, only its ClientHello's SNI is read
 *   GET|HEAD http://host[:port]/path ...  plain HTTP, rewritten to origin form with the
 *                                         hop-by-hop and Proxy-* headers removed
 * Every connection is checked against the core's `egress` policy with the same checker
 * web_fetch uses (sdk/support/net.c): the port against allowed_ports (default 80 and 443),
 * the host against the domain lists, then the proxy resolves the
 * name itself and checks every address (private, loopback, link-local, metadata, and every
 * address held by a host interface, listed afresh in the host's network namespace) and
 * connects to the address it checked, so a forged address gets nowhere. A plain-HTTP
 * request's Host header, if any, must name the checked host and port. A CONNECT tunnel
 * carries TLS only: its first record must be a ClientHello whose server name (SNI) is the
 * CONNECT host (no SNI is accepted only for an IP literal); the TLS is never terminated.
 * Each connection is announced to the run (event + charge) before any name
 * is resolved; a refused charge refuses the connection. Every refusal is announced with
 * its reason (an `egress` event): nothing is refused silently.
 *
 * Threads: one accept thread; one thread per connection, at most max_connections at once
 * (more are answered 503 and closed). Each connection has a byte cap (both directions
 * together) and a wall-clock cap, and an idle timeout. */
#ifndef EPH_EGRESS_H
#define EPH_EGRESS_H

#include <stdbool.h>
#include <stdint.h>

#include <ephemeral/plugin.h>

#include "support/net.h"
#include "conf.h"

typedef struct eph_egress eph_egress_t;

/* Called on the connection's thread: once when the policy allowed the connection (before
 * its name is resolved), and once for a refusal (policy, address, Host header, TLS server
 * name, upstream failure), so a connection may be announced as allowed and then refused.
 * method: "CONNECT", "GET" or "HEAD"; target: "host:port" for CONNECT, the absolute URL
 * otherwise. refusal: NULL when the policy allowed the host, else
 * why not (then the return value is ignored; the callback only reports). For an allowed
 * one the callback charges: a negative return refuses the connection (403 with err's
 * message). May be called from several threads at once. */
typedef int (*eph_egress_announce_fn)(void *opaque, const char *method, const char *target,
                                      const char *refusal, eph_error_t *err);

typedef struct eph_egress_options {
  /* Private IPv4 pool the per-sandbox /30s come from, "A.B.C.D/N" (N <= 30). The proxy
   * takes the first .1 of a /30 no other proxy (of any process) is bound to and that no
   * host interface already holds. */
  const char *pool;
  int port;                       /* TCP port of the proxy on that address */
  int max_connections;            /* open at once */
  int64_t max_bytes;              /* per connection, both directions together */
  int64_t max_connection_ms;      /* per connection, wall clock */
  int64_t idle_ms;                /* per connection, no byte either way */
  int64_t price_micros;           /* charged per allowed connection (category web) */
  const eph_net_policy_t *policy; /* borrowed, must outlive the proxy */
  eph_egress_announce_fn announce;
  void *opaque;
} eph_egress_options_t;

/* Refuses a configuration upgraded from when the sandbox proxy read the web plugin's
 * block: a plugin block whose allow_domains or deny_domains is not empty, or whose
 * allowed_ports lacks 80 or 443, while the core's `egress` group does not set that key
 * (sandboxes would silently reach more than the file says). Called at daemon start and by
 * `config check` (eph_ctx_check_selected) and by eph_egress_load_config(). Errors:
 * -EPH_E_CONFIG naming the file:line and the key to set. */
int eph_egress_check_config(const eph_config_t *config, eph_error_t *err);

/* Reads the core's `egress` group: pool, port, max_connections, max_bytes,
 * max_connection_ms, idle_ms and price_micros_per_request (default 1000) into opt
 * (defaults for missing keys), and the address policy of the same group (allow_domains,
 * deny_domains, allow_private_addresses, allow_loopback, allowed_ports; see
 * sdk/support/net.h) into *policy (free with eph_net_policy_free). The `egress` group is
 * the one place that says where sandboxes may go; no plugin's block is read. Errors:
 * -EPH_E_CONFIG naming file:line. */
int eph_egress_load_config(const eph_config_t *config, const eph_host_t *host,
                           eph_egress_options_t *opt, eph_net_policy_t *policy, eph_error_t *err);

/* Must be called in the host's network namespace: connection threads check the
 * destination against the interfaces of the namespace eph_egress_start() ran in (and
 * refuse everything if they find themselves elsewhere). Takes a free /30 of the pool (its
 * first address P is the proxy's) and listens nowhere yet: the backend makes the listening
 * socket (eph_egress_spec, eph_egress_attach). *out owned by the caller, released by
 * eph_egress_stop(). Errors: -EADDRNOTAVAIL when the pool is exhausted, -EINVAL for a bad
 * pool, or the socket error. */
int eph_egress_start(const eph_egress_options_t *opt, eph_egress_t **out, eph_error_t *err);

/* "http://10.213.0.1:3128": the spec's proxy_url. Borrowed, valid until stop. */
const char *eph_egress_url(const eph_egress_t *e);

/* Points a sandbox spec at the proxy: network = 1, proxy_url, proxy_attach and proxy_ctx
 * (which call eph_egress_attach on e), proxy_netns_fd = -1. */
void eph_egress_spec(eph_egress_t *e, eph_sandbox_spec_t *spec);

/* Takes the listening socket a backend made for its sandbox (borrowed; a CLOEXEC,
 * non-blocking dup is kept) and starts accepting on it. Refused unless it is an IPv4 TCP
 * socket (SO_DOMAIN, SO_TYPE, SO_PROTOCOL), listening (SO_ACCEPTCONN), bound to exactly the
 * proxy's address and port, and in another network namespace than the host's
 * (SO_NETNS_COOKIE: a listener there would take connections from every host process, on
 * the run's budget; a kernel that cannot tell is refused too). Once per proxy, never
 * concurrently with eph_egress_stop. Errors: -EBUSY (already attached), -EPROTOTYPE,
 * -EINVAL, -EADDRNOTAVAIL, -EPERM naming what is wrong, -EAGAIN (no thread). */
int eph_egress_attach(eph_egress_t *e, int listen_fd, eph_error_t *err);

/* Connections accepted, refused (policy, charge, errors) so far. */
void eph_egress_counts(eph_egress_t *e, int64_t *allowed, int64_t *refused);

/* Closes the listener, ends every open connection, joins every thread and frees e. NULL is
 * a no-op. */
void eph_egress_stop(eph_egress_t *e);

#endif
