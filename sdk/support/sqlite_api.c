/* SQLite bound on first use; see sqlite_api.h for the why. */
#include "config.h"

#include <string.h>

#define EPH_SQLITE_API_IMPLEMENTATION 1
#include "sqlite_api.h"

EPH_LAZYLIB_DEFINE(eph_sqlite_api, eph_sqlite_load, EPH_SONAME_SQLITE, EPH_SQLITE_FUNCTIONS)
