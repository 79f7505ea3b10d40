/* libcrypto bound on first use; see crypto_api.h for the why. */
#include "config.h"

#include <string.h>

#define EPH_CRYPTO_API_IMPLEMENTATION 1
#include "crypto_api.h"

EPH_LAZYLIB_DEFINE(eph_crypto_api, eph_crypto_load, EPH_SONAME_CRYPTO, EPH_CRYPTO_FUNCTIONS)
