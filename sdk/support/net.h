/* Outbound HTTP for the host-side tools (web_fetch, web_search, the connection broker and
 * the sandbox egress proxy): which hosts and addresses may be reached, and a libcurl fetch
 * that connects only to an address it resolved and checked itself.
 *
 * Why resolve ourselves: a name the policy allows may resolve to 127.0.0.1, to a private
 * network or to the cloud metadata address 169.254.169.254 (SSRF). Every address a name
 * resolves to is checked; the connection is pinned to the checked address with
 * CURLOPT_RESOLVE and CURLOPT_OPENSOCKETFUNCTION re-checks the very sockaddr curl is about
 * to connect to, which closes the DNS rebinding window (no second resolution). Redirects
 * are followed here, hop by hop, each hop re-checked; libcurl's own following is off.
 * Environment proxies are ignored (CURLOPT_PROXY "").
 *
 * Part of the support library (sdk/support/libephsupport_net.la): the core (egress proxy,
 * webhooks), tool-web and tool-connection each link their own copy (symbols hidden by
 * -fvisibility=hidden). Each user reads its own policy block with eph_net_policy_load(). */
#ifndef EPH_SUPPORT_NET_H
#define EPH_SUPPORT_NET_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <curl/curl.h>
#include <ephemeral/plugin.h>

/* Where outbound requests may go. Domain lists hold lowercase names without trailing dot;
 * "example.com" matches example.com and any name ending in ".example.com" (whole labels
 * only: "badexample.com" does not match). deny wins over allow; an empty allow list
 * allows every name not denied. */
typedef struct eph_net_policy {
  char **allow;
  size_t n_allow;
  char **deny;
  size_t n_deny;
  int allow_private;  /* RFC 1918, CGNAT 100.64/10, IPv6 ULA fc00::/7 and site-local */
  int allow_loopback; /* 127/8 and ::1 */
  /* TCP ports a checked URL (web_fetch, every redirect hop) or proxy connection may use.
   * n_ports == 0 allows none (deny by default); eph_net_policy_load() fills 80 and 443
   * unless the block says otherwise. Not consulted for operator-configured endpoints
   * (requests with check_domains == 0). */
  int *ports;
  size_t n_ports;
  /* 0 (the default): an address held by any interface of the host (getifaddrs(), read
   * afresh at every resolution, IPv4 and IPv6) is refused whatever allow_private says, so
   * a wildcard-bound host service (sshd, a database, the API itself) is not reachable
   * through its public or private address. Loopback addresses stay governed by
   * allow_loopback alone. Set only for an operator-configured endpoint that lives on the
   * host itself (tool-web's search_url with search_allow_private_addresses). */
  int allow_host_addresses;
} eph_net_policy_t;

/* Reads `allow_domains`, `deny_domains` (lists of strings), `allow_private_addresses`,
 * `allow_loopback` (bools) and `allowed_ports` (list of ints 1..65535, default [80, 443],
 * not empty) from a plugin's config block (NULL block: defaults). Domain entries are
 * lowercased and a leading "*." or "." and a trailing "." are dropped. Returns 0 or
 * -EPH_E_CONFIG naming file:line. Free with eph_net_policy_free(). */
int eph_net_policy_load(eph_net_policy_t *p, const eph_host_t *host, const config_setting_t *block,
                        eph_error_t *err);
void eph_net_policy_free(eph_net_policy_t *p);

/* NULL when the host name passes the domain lists, else a static reason. host may carry
 * IPv6 brackets; matching is case-insensitive. */
const char *eph_net_host_refusal(const eph_net_policy_t *p, const char *host);

/* NULL when the TCP port is on the policy's port list, else a static reason. */
const char *eph_net_port_refusal(const eph_net_policy_t *p, int port);

/* NULL when the address is not held by an interface of the host (see
 * allow_host_addresses), else a static reason. Lists the interfaces with getifaddrs() in
 * the calling thread's network namespace on every call; when they cannot be listed the
 * answer is a refusal (fail closed). IPv4-mapped, IPv4-compatible, NAT64 and 6to4 IPv6
 * forms are judged by the IPv4 they carry. */
const char *eph_net_host_address_refusal(const eph_net_policy_t *p, const struct sockaddr *sa);

/* NULL when the address may be connected to, else a static reason ("loopback address",
 * "private address", "link-local address", ...). IPv4-mapped, IPv4-compatible, NAT64
 * (64:ff9b::/96) and 6to4 (2002::/16) IPv6 forms are judged by the IPv4 they carry.
 * Always refused, whatever the policy: unspecified, link-local (169.254/16 with the cloud
 * metadata address, fe80::/10), multicast, broadcast and reserved ranges. */
const char *eph_net_addr_refusal(const eph_net_policy_t *p, const struct sockaddr *sa);

/* getaddrinfo(host, port) and checks every address (eph_net_addr_refusal and
 * eph_net_host_address_refusal; the port is not checked here). On success copies the first address
 * to *out (and its text to addr_text, INET6_ADDRSTRLEN bytes). Errors: -EPH_E_DENIED when
 * any address is refused (message names the address and reason), -EHOSTUNREACH when the
 * name does not resolve. */
int eph_net_resolve_checked(const eph_net_policy_t *p, const char *host, int port,
                            struct sockaddr_storage *out, char *addr_text, eph_error_t *err);

/* One request; all pointers borrowed for the call. */
typedef struct eph_net_request {
  const char *url;                  /* absolute http:// or https:// URL */
  const char *method;               /* "GET", "HEAD", ...; upper case */
  const struct curl_slist *headers; /* extra request headers, or NULL */
  const void *body;                 /* request body, or NULL */
  size_t body_bytes;
  size_t max_response_bytes; /* body bytes kept; the transfer stops there (truncated) */
  int64_t timeout_ms;        /* whole request including redirects */
  int max_redirects;         /* 0: a 3xx is returned as it is */
  int check_domains;         /* apply the policy's domain and port lists to every hop */
  /* Called after a hop's URL and domain checks and before any of its I/O (name
   * resolution included): to charge and emit. A negative return aborts the request with
   * that error. hop 0 is the first request. */
  int (*before_request)(void *opaque, const char *method, const char *url, int hop,
                        eph_error_t *err);
  void *opaque;
} eph_net_request_t;

/* What came back. Strings owned by the response; eph_net_response_clear() frees them. */
typedef struct eph_net_response {
  long status;
  char *content_type;   /* or NULL */
  char *final_url;      /* URL of the last hop */
  char *location;       /* Location of an unfollowed 3xx, or NULL */
  json_object *headers; /* {"lower-case-name": "value", ...} of the last hop */
  char *body;           /* NUL-terminated for convenience; body_bytes excludes the NUL */
  size_t body_bytes;
  int truncated; /* the body passed max_response_bytes */
  int redirects; /* how many were followed */
  char addr[64]; /* the address of the last hop's connection */
} eph_net_response_t;

/* Performs the request under policy p. Errors (nothing in *resp to use): -EPH_E_DENIED (a
 * host or address refused; message says which), -EINVAL (not an http(s) URL, credentials
 * in the URL), -EPH_E_UPSTREAM (transfer failed, too many redirects), -ETIMEDOUT, or what
 * before_request returned. An HTTP error status is a success with resp->status set. */
int eph_net_fetch(const eph_net_policy_t *p, const eph_net_request_t *req, eph_net_response_t *resp,
                  eph_error_t *err);
void eph_net_response_clear(eph_net_response_t *r);

/* What a fetch of a tool call may take: timeout_ms, cut to what is left before the call's
 * deadline_ms (CLOCK_MONOTONIC ms, as eph_now_ms; <= 0: no deadline). The left_ms of
 * eph_net_fetch_within. */
int64_t eph_net_time_left(int64_t timeout_ms, int64_t deadline_ms);

/* eph_net_fetch() within what is left of a caller's deadline: left_ms > 0 becomes the
 * request's timeout_ms; left_ms <= 0 is -ETIMEDOUT ("the run deadline has passed") without
 * any I/O. */
int eph_net_fetch_within(const eph_net_policy_t *p, eph_net_request_t *req, int64_t left_ms,
                         eph_net_response_t *resp, eph_error_t *err);

/* Host and port of an http(s) URL (host without IPv6 brackets, lower case, as libcurl
 * decodes it: UTF-8 text without controls or spaces, else refused). Returns 0 and a heap
 * *host owned by the caller, or -EINVAL. */
int eph_net_url_host(const char *url, char **host, int *port, eph_error_t *err);

#endif
