/* libcurl bound on first use; see curl_api.h for the why. */
#include "config.h"

#include <string.h>

#define EPH_CURL_API_IMPLEMENTATION 1
#include "curl_api.h"
#include "lazylib.h"

eph_curl_api_t eph_curl_api;

#define EPH_CURL_NAME(f) #f,
static const char *const names[] = {EPH_CURL_FUNCTIONS(EPH_CURL_NAME)};
#define EPH_CURL_COUNT(f) +1
enum { N_FUNCTIONS = 0 EPH_CURL_FUNCTIONS(EPH_CURL_COUNT) };
static void *slots[N_FUNCTIONS];

static void
bind_table(void *const *s)
{
  size_t i = 0;
#define EPH_CURL_BIND(f) memcpy(&eph_curl_api.f, &s[i++], sizeof(void *));
  EPH_CURL_FUNCTIONS(EPH_CURL_BIND)
}

/* The soname of Debian's libcurl4 / libcurl3-gnutls runtime packages (the ABI of
 * curl 7.16 onwards); what -lcurl resolves to at link time. */
static eph_lazylib_t lib = EPH_LAZYLIB_INIT("libcurl.so.4", names, slots, N_FUNCTIONS, bind_table);

int
eph_curl_load(eph_error_t *err)
{
  return eph_lazylib_load(&lib, err);
}
