/* libpq bound on first use; see pq_api.h for the why. */
#include "config.h"

#include <string.h>

#define EPH_PQ_API_IMPLEMENTATION 1
#include "pq_api.h"
#include "support/lazylib.h"

eph_pq_api_t eph_pq_api;

#define EPH_PQ_NAME(f) #f,
static const char *const names[] = {EPH_PQ_FUNCTIONS(EPH_PQ_NAME)};
#define EPH_PQ_COUNT(f) +1
enum { N_FUNCTIONS = 0 EPH_PQ_FUNCTIONS(EPH_PQ_COUNT) };
static void *slots[N_FUNCTIONS];

static void
bind_table(void *const *s)
{
  size_t i = 0;
#define EPH_PQ_BIND(f) memcpy(&eph_pq_api.f, &s[i++], sizeof(void *));
  EPH_PQ_FUNCTIONS(EPH_PQ_BIND)
}

/* The soname of Debian's libpq5 (what -lpq resolves to at link time). */
static eph_lazylib_t lib = EPH_LAZYLIB_INIT("libpq.so.5", names, slots, N_FUNCTIONS, bind_table);

int
eph_pq_load(eph_error_t *err)
{
  return eph_lazylib_load(&lib, err);
}
