/* See org_name.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "org_name.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static int
org_char(unsigned char c)
{
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-';
}

int
eph_name_check(const char *what, const char *name, eph_error_t *err)
{
  if (!name || !*name)
    return eph_error_set(err, EINVAL, "%s: empty", what);
  /* Bounded: a name far too long is refused without reading all of it. */
  size_t n = strnlen(name, EPH_ORG_NAME_MAX_BYTES + 1);
  if (n > EPH_ORG_NAME_MAX_BYTES)
    return eph_error_set(err, EINVAL, "%s: longer than %d bytes", what, EPH_ORG_NAME_MAX_BYTES);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)name[i];
    if (org_char(c))
      continue;
    /* The byte is shown as itself only when it is printable ASCII. */
    char shown[8];
    if (c >= ' ' && c < 0x7f && c != '\'')
      snprintf(shown, sizeof shown, "'%c'", c);
    else
      snprintf(shown, sizeof shown, "0x%02x", c);
    return eph_error_set(err, EINVAL, "%s: byte %zu (%s) is not a letter, a digit, '_', '.' or '-'",
                         what, i, shown);
  }
  return 0;
}

int
eph_org_name_check(const char *org, eph_error_t *err)
{
  return eph_name_check("organisation", org, err);
}
