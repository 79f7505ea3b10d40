/* libnl-3 and libnl-route-3, bound on first use (lazylib.h): the functions netns.c calls to
 * put the egress proxy's address on a sandbox's interface, so a plugin that links it (the
 * jail) does not load libnl at every start, only when a run grants web (an `ephemeral exec`
 * never does). The jail's loopback is brought up without libnl (plugins/backend-jail/plan.c).
 *
 * Include this instead of <netlink/route/...> in a file calling libnl through the tables;
 * eph_nl_load() comes first (eph_nl_route_adopt calls it). A plugin linking libnl itself
 * (backend-qemu) may mix direct calls and these: dlopen() returns the copy already mapped. */
#ifndef EPH_SUPPORT_NL_API_H
#define EPH_SUPPORT_NL_API_H

#include <netlink/netlink.h>
#include <netlink/route/addr.h>
#include <netlink/route/link.h>

#include <ephemeral/plugin.h>

#include "lazylib.h"

#define EPH_NL_FUNCTIONS(X)                                                                        \
  X(nl_addr_build)                                                                                 \
  X(nl_addr_put)                                                                                   \
  X(nl_addr_set_prefixlen)                                                                         \
  X(nl_geterror)                                                                                   \
  X(nl_socket_alloc)                                                                               \
  X(nl_socket_free)                                                                                \
  X(nl_socket_set_fd)

#define EPH_NLROUTE_FUNCTIONS(X)                                                                   \
  X(rtnl_addr_add)                                                                                 \
  X(rtnl_addr_alloc)                                                                               \
  X(rtnl_addr_put)                                                                                 \
  X(rtnl_addr_set_family)                                                                          \
  X(rtnl_addr_set_ifindex)                                                                         \
  X(rtnl_addr_set_local)                                                                           \
  X(rtnl_link_alloc)                                                                               \
  X(rtnl_link_change)                                                                              \
  X(rtnl_link_put)                                                                                 \
  X(rtnl_link_set_flags)                                                                           \
  X(rtnl_link_set_ifindex)

EPH_LAZYLIB_API(eph_nl_api_t, EPH_NL_FUNCTIONS);
EPH_LAZYLIB_API(eph_nlroute_api_t, EPH_NLROUTE_FUNCTIONS);

/* Filled by the first successful eph_nl_load(); read-only afterwards. */
extern eph_nl_api_t eph_nl_api;
extern eph_nlroute_api_t eph_nlroute_api;

/* 0 once libnl-3 and libnl-route-3 (EPH_SONAME_NL, EPH_SONAME_NLROUTE) are loaded and bound;
 * else -ELIBACC, err names why. */
int eph_nl_load(eph_error_t *err);
/* Whether eph_nl_load() has succeeded (the tables may be used). */
bool eph_nl_loaded(void);

#ifndef EPH_NL_API_IMPLEMENTATION
#define nl_addr_build (eph_nl_api.nl_addr_build)
#define nl_addr_put (eph_nl_api.nl_addr_put)
#define nl_addr_set_prefixlen (eph_nl_api.nl_addr_set_prefixlen)
#define nl_geterror (eph_nl_api.nl_geterror)
#define nl_socket_alloc (eph_nl_api.nl_socket_alloc)
#define nl_socket_free (eph_nl_api.nl_socket_free)
#define nl_socket_set_fd (eph_nl_api.nl_socket_set_fd)
#define rtnl_addr_add (eph_nlroute_api.rtnl_addr_add)
#define rtnl_addr_alloc (eph_nlroute_api.rtnl_addr_alloc)
#define rtnl_addr_put (eph_nlroute_api.rtnl_addr_put)
#define rtnl_addr_set_family (eph_nlroute_api.rtnl_addr_set_family)
#define rtnl_addr_set_ifindex (eph_nlroute_api.rtnl_addr_set_ifindex)
#define rtnl_addr_set_local (eph_nlroute_api.rtnl_addr_set_local)
#define rtnl_link_alloc (eph_nlroute_api.rtnl_link_alloc)
#define rtnl_link_change (eph_nlroute_api.rtnl_link_change)
#define rtnl_link_put (eph_nlroute_api.rtnl_link_put)
#define rtnl_link_set_flags (eph_nlroute_api.rtnl_link_set_flags)
#define rtnl_link_set_ifindex (eph_nlroute_api.rtnl_link_set_ifindex)
#endif

#endif
