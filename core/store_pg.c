#include "config.h"
#include "store_int.h"
#include <errno.h>
int
eph_store_pg_open(const char *conninfo, const eph_store_options_t *opt, eph_store_t **out,
                  eph_error_t *err)
{
  (void)conninfo; (void)opt; (void)out;
  return eph_error_set(err, ENOTSUP, "todo");
}
