/* libpq bound on first use; see pq_api.h for the why. */
#include "config.h"

#include <string.h>

#define EPH_PQ_API_IMPLEMENTATION 1
#include "pq_api.h"

EPH_LAZYLIB_DEFINE(eph_pq_api, eph_pq_load, EPH_SONAME_PQ, EPH_PQ_FUNCTIONS)
