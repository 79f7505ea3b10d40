/* libcurl bound on first use; see curl_api.h for the why. */
#include "config.h"

#include <string.h>

#define EPH_CURL_API_IMPLEMENTATION 1
#include "curl_api.h"

EPH_LAZYLIB_DEFINE(eph_curl_api, eph_curl_load, EPH_SONAME_CURL, EPH_CURL_FUNCTIONS)
