/* libnl-3 and libnl-route-3 bound on first use; see nl_api.h for the why. */
#include "config.h"

#include <stdatomic.h>
#include <string.h>

#define EPH_NL_API_IMPLEMENTATION 1
#include "nl_api.h"

EPH_LAZYLIB_DEFINE(eph_nl_api, nl_load, EPH_SONAME_NL, EPH_NL_FUNCTIONS)
EPH_LAZYLIB_DEFINE(eph_nlroute_api, nlroute_load, EPH_SONAME_NLROUTE, EPH_NLROUTE_FUNCTIONS)

static atomic_bool loaded;

int
eph_nl_load(eph_error_t *err)
{
  /* libnl-route-3 needs libnl-3: loaded in that order. */
  int r = nl_load(err);
  if (r == 0)
    r = nlroute_load(err);
  if (r == 0)
    atomic_store(&loaded, true);
  return r;
}

bool
eph_nl_loaded(void)
{
  return atomic_load(&loaded);
}
