/* Time and money as people read them: one formatter each for the whole tree
 * (sdk/support/README.md). */
#ifndef EPH_SUPPORT_FORMAT_H
#define EPH_SUPPORT_FORMAT_H

#include <stddef.h>
#include <stdint.h>

/* "$0.00353": micros as dollars with up to 5 decimals (rounded half up), trailing zeros
 * dropped down to cents, as the product page prints them. Writes into buf (32 bytes are
 * always enough) and returns buf. */
char *eph_format_dollars(int64_t micros, char *buf, size_t size);

/* ISO 8601 UTC with milliseconds, "2026-01-31T12:00:00.123Z", of a wall-clock time in
 * microseconds since the epoch. 32 bytes are always enough. */
void eph_format_iso8601(int64_t us, char *buf, size_t size);

#endif
