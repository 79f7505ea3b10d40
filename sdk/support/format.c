/* See format.h. */
#include "format.h"

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

char *
eph_format_dollars(int64_t micros, char *buf, size_t size)
{
  const char *sign = micros < 0 ? "-" : "";
  uint64_t m = micros < 0 ? (uint64_t)(-(micros + 1)) + 1 : (uint64_t)micros;
  /* 5 decimals = tens of micros, rounded half up, as the product page prints $0.00353. */
  uint64_t tens = (m + 5) / 10;
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
