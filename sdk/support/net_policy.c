/* Outbound address policy: which hosts, ports and addresses a plugin may reach, and a
 * resolution that checks every address; see net.h for the why. The fetch: net.c. */
#include "config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "net.h"

#include "curl_api.h"

#include "cleanup.h"
#include "text.h"

/* ---------------------------------------------------------------- policy */

static void
free_list(char **v, size_t n)
{
  for (size_t i = 0; i < n; i++)
    free(v[i]);
  free(v);
}

static char *
normalise_domain(const char *s)
{
  while (*s == '*' || *s == '.')
    s++;
  char *d = strdup(s);
  if (!d)
    return NULL;
  size_t n = strlen(d);
  while (n > 0 && d[n - 1] == '.')
    d[--n] = 0;
  for (char *c = d; *c; c++)
    *c = (char)tolower((unsigned char)*c);
  return d;
}

static int
load_list(const config_setting_t *block, const char *key, char ***out, size_t *n, eph_error_t *err)
{
  *out = NULL;
  *n = 0;
  if (!block)
    return 0;
  config_setting_t *l = config_setting_get_member(block, key);
  if (!l)
    return 0;
  if (!config_setting_is_aggregate(l))
    return eph_error_set(err, EPH_E_CONFIG, "%s:%d: key '%s': expected a list of strings",
                         config_setting_source_file(l) ? config_setting_source_file(l) : "?",
                         config_setting_source_line(l), key);
  int count = config_setting_length(l);
  char **v = calloc((size_t)count + 1, sizeof *v);
  if (!v)
    return eph_error_set(err, ENOMEM, "out of memory");
  for (int i = 0; i < count; i++) {
    const char *s = config_setting_get_string_elem(l, i);
    if (!s || !*s) {
      free_list(v, (size_t)i);
      return eph_error_set(err, EPH_E_CONFIG, "%s:%d: key '%s': element %d is not a name",
                           config_setting_source_file(l) ? config_setting_source_file(l) : "?",
                           config_setting_source_line(l), key, i);
    }
    if (!(v[i] = normalise_domain(s))) {
      free_list(v, (size_t)i);
      return eph_error_set(err, ENOMEM, "out of memory");
    }
  }
  *out = v;
  *n = (size_t)count;
  return 0;
}

/* `allowed_ports`: a non-empty list of TCP ports; missing: 80 and 443 (plain and TLS web). */
static int
load_ports(const config_setting_t *block, int **out, size_t *n, eph_error_t *err)
{
  config_setting_t *l = block ? config_setting_get_member(block, "allowed_ports") : NULL;
  int count = l ? config_setting_length(l) : 2;
  const char *file = l && config_setting_source_file(l) ? config_setting_source_file(l) : "?";
  if (l && (!config_setting_is_aggregate(l) || count < 1))
    return eph_error_set(err, EPH_E_CONFIG,
                         "%s:%d: key 'allowed_ports': expected a non-empty list of ports "
                         "(e.g. [80, 443])",
                         file, config_setting_source_line(l));
  int *v = calloc((size_t)count, sizeof *v);
  if (!v)
    return eph_error_set(err, ENOMEM, "out of memory");
  for (int i = 0; i < count; i++) {
    config_setting_t *e = l ? config_setting_get_elem(l, (unsigned)i) : NULL;
    long long port = e ? (config_setting_type(e) == CONFIG_TYPE_INT ||
                                  config_setting_type(e) == CONFIG_TYPE_INT64
                              ? config_setting_get_int64(e)
                              : -1)
                       : (i ? 443 : 80);
    if (port < 1 || port > 65535) {
      free(v);
      return eph_error_set(err, EPH_E_CONFIG,
                           "%s:%d: key 'allowed_ports': element %d is not a port 1..65535", file,
                           config_setting_source_line(l), i);
    }
    v[i] = (int)port;
  }
  *out = v;
  *n = (size_t)count;
  return 0;
}

int
eph_net_policy_load(eph_net_policy_t *p, const eph_host_t *host, const config_setting_t *block,
                    eph_error_t *err)
{
  memset(p, 0, sizeof *p);
  int r;
  if ((r = load_list(block, "allow_domains", &p->allow, &p->n_allow, err)) < 0)
    return r;
  if ((r = load_ports(block, &p->ports, &p->n_ports, err)) < 0)
    goto fail;
  if ((r = load_list(block, "deny_domains", &p->deny, &p->n_deny, err)) < 0)
    goto fail;
  if ((r = host->cfg_bool(block, "allow_private_addresses", 0, &p->allow_private, err)) < 0)
    goto fail;
  if ((r = host->cfg_bool(block, "allow_loopback", 0, &p->allow_loopback, err)) < 0)
    goto fail;
  return 0;
fail:
  eph_net_policy_free(p);
  return r;
}

void
eph_net_policy_free(eph_net_policy_t *p)
{
  free_list(p->allow, p->n_allow);
  free_list(p->deny, p->n_deny);
  free(p->ports);
  memset(p, 0, sizeof *p);
}

/* "a.example.com" matches "example.com" on a label boundary. */
static bool
domain_matches(const char *host, const char *pattern)
{
  size_t h = strlen(host), n = strlen(pattern);
  if (n == 0 || h < n)
    return false;
  if (strcasecmp(host + h - n, pattern) != 0)
    return false;
  return h == n || host[h - n - 1] == '.';
}

const char *
eph_net_host_refusal(const eph_net_policy_t *p, const char *host)
{
  char buf[256];
  size_t n = strlen(host);
  if (n >= sizeof buf || n == 0)
    return "host name is empty or too long";
  if (host[0] == '[' && host[n - 1] == ']') {
    memcpy(buf, host + 1, n - 2);
    buf[n - 2] = 0;
  } else
    memcpy(buf, host, n + 1);
  n = strlen(buf);
  while (n > 0 && buf[n - 1] == '.')
    buf[--n] = 0;
  for (size_t i = 0; i < p->n_deny; i++)
    if (domain_matches(buf, p->deny[i]))
      return "domain is on the deny list";
  if (p->n_allow == 0)
    return NULL;
  for (size_t i = 0; i < p->n_allow; i++)
    if (domain_matches(buf, p->allow[i]))
      return NULL;
  return "domain is not on the allow list";
}

const char *
eph_net_port_refusal(const eph_net_policy_t *p, int port)
{
  for (size_t i = 0; i < p->n_ports; i++)
    if (p->ports[i] == port)
      return NULL;
  return "port is not on the allowed_ports list";
}

/* ---------------------------------------------------------------- addresses */

static const char *
v4_refusal(const eph_net_policy_t *p, uint32_t a /* host order */)
{
#define IN_NET(net, bits)                                                                          \
  ((bits) == 0 || (a >> (32 - (bits))) == ((uint32_t)(net) >> (32 - (bits))))
  if (IN_NET(0x7f000000, 8))
    return p->allow_loopback ? NULL : "loopback address";
  if (IN_NET(0x00000000, 8))
    return "unspecified address (0.0.0.0/8)";
  if (IN_NET(0xa9fe0000, 16))
    return "link-local address (169.254/16, cloud metadata)";
  if (IN_NET(0xe0000000, 4))
    return "multicast address";
  if (IN_NET(0xf0000000, 4))
    return "reserved or broadcast address";
  if (IN_NET(0x0a000000, 8) || IN_NET(0xac100000, 12) || IN_NET(0xc0a80000, 16))
    return p->allow_private ? NULL : "private address (RFC 1918)";
  if (IN_NET(0x64400000, 10))
    return p->allow_private ? NULL : "shared address space (CGNAT 100.64/10)";
  if (IN_NET(0xc0000000, 24))
    return "IETF protocol assignment address (192.0.0/24)";
  if (IN_NET(0xc6120000, 15))
    return "benchmarking address (198.18/15)";
  if (IN_NET(0xc0000200, 24) || IN_NET(0xc6336400, 24) || IN_NET(0xcb007100, 24))
    return "documentation address";
#undef IN_NET
  return NULL;
}

/* The forms with an IPv4 address in their last 32 bits: IPv4-mapped ::ffff:0:0/96,
 * IPv4-compatible ::/96, IPv4-translated ::ffff:0:0:0/96 (RFC 2765's SIIT: a translator
 * turns it into the IPv4) and NAT64's well-known 64:ff9b::/96. */
static bool
v6_embeds_v4_at_96(const struct in6_addr *a6)
{
  static const uint8_t nat64[12] = {0x00, 0x64, 0xff, 0x9b};
  static const uint8_t translated[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0};
  return IN6_IS_ADDR_V4MAPPED(a6) || IN6_IS_ADDR_V4COMPAT(a6) ||
         memcmp(a6->s6_addr, nat64, 12) == 0 || memcmp(a6->s6_addr, translated, 12) == 0;
}

static const char *
v6_refusal(const eph_net_policy_t *p, const struct in6_addr *a6)
{
  const uint8_t *b = a6->s6_addr;
  static const uint8_t zero[16];
  static const uint8_t nat64_local[6] = {0x00, 0x64, 0xff, 0x9b, 0x00, 0x01};
  if (memcmp(b, zero, 16) == 0)
    return "unspecified address (::)";
  if (memcmp(b, zero, 15) == 0 && b[15] == 1)
    return p->allow_loopback ? NULL : "loopback address (::1)";
  /* Forms that carry an IPv4 address: judge the IPv4. */
  if (v6_embeds_v4_at_96(a6)) {
    uint32_t v4 = (uint32_t)b[12] << 24 | (uint32_t)b[13] << 16 | (uint32_t)b[14] << 8 | b[15];
    return v4_refusal(p, v4);
  }
  if (b[0] == 0x20 && b[1] == 0x02) { /* 6to4 2002:V4ADDR::/48 */
    uint32_t v4 = (uint32_t)b[2] << 24 | (uint32_t)b[3] << 16 | (uint32_t)b[4] << 8 | b[5];
    return v4_refusal(p, v4);
  }
  /* RFC 8215's local-use translation prefix: a NAT64 of the operator's network, which puts
   * the IPv4 at an offset of its choosing (RFC 6052: /48 to /96), so which IPv4 address a
   * destination here leads to (a private one, the metadata service) cannot be told. */
  if (memcmp(b, nat64_local, sizeof nat64_local) == 0)
    return "local-use IPv4/IPv6 translation address (64:ff9b:1::/48): its IPv4 cannot be told";
  if (b[0] == 0xff)
    return "multicast address (ff00::/8)";
  if (b[0] == 0xfe && (b[1] & 0xc0) == 0x80)
    return "link-local address (fe80::/10)";
  if (b[0] == 0xfe && (b[1] & 0xc0) == 0xc0)
    return p->allow_private ? NULL : "site-local address (fec0::/10)";
  if ((b[0] & 0xfe) == 0xfc)
    return p->allow_private ? NULL : "unique local address (fc00::/7)";
  if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x0d && b[3] == 0xb8)
    return "documentation address (2001:db8::/32)";
  if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0 && b[3] == 0)
    return "Teredo address (2001::/32)";
  if (b[0] == 0x01 && b[1] == 0 && memcmp(b + 2, zero, 6) == 0)
    return "discard-only address (100::/64)";
  if (b[0] == 0 && memcmp(b, zero, 10) == 0)
    return "reserved address (::/8)";
  return NULL;
}

const char *
eph_net_addr_refusal(const eph_net_policy_t *p, const struct sockaddr *sa)
{
  if (sa->sa_family == AF_INET)
    return v4_refusal(p, ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr));
  if (sa->sa_family == AF_INET6)
    return v6_refusal(p, &((const struct sockaddr_in6 *)sa)->sin6_addr);
  return "not an internet address";
}

/* The IPv4 address an AF_INET address carries, or an IPv6 form that leads to one (the
 * forms v6_refusal judges by their IPv4: v6_embeds_v4_at_96's, 6to4 2002::/16), in network
 * order; or false. */
static bool
carried_v4(const struct sockaddr *sa, uint32_t *v4)
{
  if (sa->sa_family == AF_INET) {
    *v4 = ((const struct sockaddr_in *)sa)->sin_addr.s_addr;
    return true;
  }
  if (sa->sa_family != AF_INET6)
    return false;
  const struct in6_addr *a6 = &((const struct sockaddr_in6 *)sa)->sin6_addr;
  if (v6_embeds_v4_at_96(a6)) {
    memcpy(v4, a6->s6_addr + 12, 4);
    return true;
  }
  if (a6->s6_addr[0] == 0x20 && a6->s6_addr[1] == 0x02) {
    memcpy(v4, a6->s6_addr + 2, 4);
    return true;
  }
  return false;
}

static bool
is_loopback(const struct sockaddr *sa)
{
  uint32_t v4;
  if (carried_v4(sa, &v4))
    return (ntohl(v4) >> 24) == 127;
  return sa->sa_family == AF_INET6 &&
         IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr);
}

/* Whether sa is one of the addresses in the getifaddrs() list. */
static bool
held_by_interface(const struct ifaddrs *list, const struct sockaddr *sa)
{
  uint32_t v4, if4;
  bool is4 = carried_v4(sa, &v4);
  for (const struct ifaddrs *i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr)
      continue;
    if (is4) {
      if (i->ifa_addr->sa_family == AF_INET && carried_v4(i->ifa_addr, &if4) && if4 == v4)
        return true;
    } else if (sa->sa_family == AF_INET6 && i->ifa_addr->sa_family == AF_INET6 &&
               memcmp(&((const struct sockaddr_in6 *)i->ifa_addr)->sin6_addr,
                      &((const struct sockaddr_in6 *)sa)->sin6_addr, 16) == 0) {
      return true;
    }
  }
  return false;
}

static const char *
host_address_refusal(const eph_net_policy_t *p, const struct ifaddrs *list, bool listed,
                     const struct sockaddr *sa)
{
  /* Loopback is allow_loopback's business (tests run their servers there); everything
   * else a host interface holds is the host itself, whatever allow_private says. */
  if (p->allow_host_addresses || is_loopback(sa))
    return NULL;
  if (!listed)
    return "the host's own addresses cannot be listed (getifaddrs failed): refused";
  return held_by_interface(list, sa) ? "address of this host's own interfaces" : NULL;
}

const char *
eph_net_host_address_refusal(const eph_net_policy_t *p, const struct sockaddr *sa)
{
  struct ifaddrs *list = NULL;
  bool listed = p->allow_host_addresses || getifaddrs(&list) == 0;
  const char *why = host_address_refusal(p, list, listed, sa);
  if (list)
    freeifaddrs(list);
  return why;
}

static void
addr_text(const struct sockaddr *sa, char *out, size_t size)
{
  const void *a = sa->sa_family == AF_INET6
                      ? (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr
                      : (const void *)&((const struct sockaddr_in *)sa)->sin_addr;
  if (!inet_ntop(sa->sa_family, a, out, (socklen_t)size))
    snprintf(out, size, "?");
}

int
eph_net_resolve_checked(const eph_net_policy_t *p, const char *host, int port,
                        struct sockaddr_storage *out, char *text, eph_error_t *err)
{
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
  char portbuf[16];
  snprintf(portbuf, sizeof portbuf, "%d", port);
  int rc = getaddrinfo(host, portbuf, &hints, &res);
  if (rc != 0)
    return eph_error_set(err, EHOSTUNREACH, "could not resolve host '%s': %s", host,
                         gai_strerror(rc));
  int r = -EHOSTUNREACH;
  bool have = false;
  /* The host's interfaces, listed now: after the resolution, right before the connect, so
   * an address added since the last request is seen. */
  struct ifaddrs *local = NULL;
  bool listed = p->allow_host_addresses || getifaddrs(&local) == 0;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    char t[INET6_ADDRSTRLEN];
    if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6)
      continue;
    addr_text(ai->ai_addr, t, sizeof t);
    const char *why = eph_net_addr_refusal(p, ai->ai_addr);
    if (!why)
      why = host_address_refusal(p, local, listed, ai->ai_addr);
    if (why) {
      r = eph_error_set(err, EPH_E_DENIED, "host '%s' resolves to %s: %s", host, t, why);
      freeaddrinfo(res);
      if (local)
        freeifaddrs(local);
      return r;
    }
    if (!have) {
      memset(out, 0, sizeof *out);
      memcpy(out, ai->ai_addr, ai->ai_addrlen);
      snprintf(text, INET6_ADDRSTRLEN, "%s", t);
      have = true;
    }
  }
  freeaddrinfo(res);
  if (local)
    freeifaddrs(local);
  if (!have)
    return eph_error_set(err, EHOSTUNREACH, "host '%s' has no internet address", host);
  return 0;
}
