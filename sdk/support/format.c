/* See format.h. */
#include "format.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

void
eph_format_iso8601(int64_t us, char *buf, size_t size)
{
  time_t s = (time_t)(us / 1000000);
  struct tm tm;
  gmtime_r(&s, &tm);
  char base[32];
  strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(buf, size, "%s.%03dZ", base, (int)((us / 1000) % 1000));
}

/* micros rounded as eph_format_dollars shows them: to tens of micros, half away from zero. */
static int64_t
shown_micros(int64_t micros)
{
  uint64_t m = micros < 0 ? (uint64_t)(-(micros + 1)) + 1 : (uint64_t)micros;
  uint64_t r = (m + 5) / 10 * 10;
  if (r > (uint64_t)INT64_MAX) /* only INT64_MIN and INT64_MAX come near: clamp */
    r = (uint64_t)INT64_MAX / 10 * 10;
  return micros < 0 ? -(int64_t)r : (int64_t)r;
}

char *
eph_format_dollars(int64_t micros, char *buf, size_t size)
{
  uint64_t m = micros < 0 ? (uint64_t)(-(micros + 1)) + 1 : (uint64_t)micros;
  /* 5 decimals = tens of micros, rounded half up, as the product page prints $0.00353. */
  uint64_t tens = (m + 5) / 10;
  const char *sign = micros < 0 && tens ? "-" : ""; /* -4 micros is $0.00, not -$0.00 */
  snprintf(buf, size, "%s$%llu.%05llu", sign, (unsigned long long)(tens / 100000),
           (unsigned long long)(tens % 100000));
  /* Trailing zeros go, down to cents: $0.04, $0.0032, $0.00353 as on the product page. */
  char *dot = strchr(buf, '.');
  if (dot) {
    char *end = buf + strlen(buf);
    while (end > dot + 3 && end[-1] == '0')
      *--end = '\0';
  }
  return buf;
}

char *
eph_format_settled(int64_t billed, int64_t released, char *buf, size_t size)
{
  char b[32], r[32];
  int64_t reserved;
  if (billed < 0 || released < 0 || __builtin_add_overflow(billed, released, &reserved)) {
    eph_format_dollars(billed, b, sizeof b);
    eph_format_dollars(released, r, sizeof r);
  } else {
    int64_t shown_billed = shown_micros(billed);
    eph_format_dollars(shown_billed, b, sizeof b);
    eph_format_dollars(shown_micros(reserved) - shown_billed, r, sizeof r);
  }
  snprintf(buf, size, "%s billed, %s released", b, r);
  return buf;
}

void
eph_dollars_split(const int64_t *parts, int64_t *shown, size_t n)
{
  int64_t sum = 0, floors = 0;
  bool plain = false;
  for (size_t i = 0; i < n && !plain; i++)
    plain = parts[i] < 0 || __builtin_add_overflow(sum, parts[i], &sum);
  if (plain) {
    for (size_t i = 0; i < n; i++)
      shown[i] = shown_micros(parts[i]);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    shown[i] = parts[i] / 10 * 10;
    floors += shown[i];
  }
  /* At most one ten per part with a remainder is left over (each remainder is below 10). */
  for (int64_t left = (shown_micros(sum) - floors) / 10; left > 0; left--) {
    size_t best = n;
    for (size_t i = 0; i < n; i++)
      if (shown[i] < parts[i] && (best == n || parts[i] % 10 > parts[best] % 10))
        best = i;
    if (best == n)
      break;
    shown[best] += 10;
  }
}
