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

/* "$0.00035 billed, $0.03965 released": a settlement as the timeline's last line says it.
 * Each figure rounded on its own could add up to a cent's fraction more than the budget
 * ($0.00035 + $0.03966 for 345 + 39655 micros of $0.04), so billed is shown rounded and
 * released as the rest: the reservation (billed + released) as shown less billed as shown.
 * 64 bytes are always enough; returns buf. */
char *eph_format_settled(int64_t billed, int64_t released, char *buf, size_t size);

/* The amounts to show for n parts of a total (the cost line's model, web and compute of
 * what was billed) so that, printed by eph_format_dollars, they add up to their sum as it
 * prints: each rounded down to the display's precision (tens of micros), then the tens left
 * over one each to the parts with the largest remainders, the earlier on a tie (largest
 * remainder rounding: a part is off by less than one displayed unit, a zero part stays zero).
 * Writes shown[0..n), multiples of 10 micros. A negative part, or parts whose sum overflows,
 * gets each part rounded on its own, as eph_format_dollars would. */
void eph_dollars_split(const int64_t *parts, int64_t *shown, size_t n);

/* ISO 8601 UTC with milliseconds, "2026-01-31T12:00:00.123Z", of a wall-clock time in
 * microseconds since the epoch. 32 bytes are always enough. */
void eph_format_iso8601(int64_t us, char *buf, size_t size);

#endif
