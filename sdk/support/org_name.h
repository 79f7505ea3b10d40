/* An organisation's name: the one rule, checked wherever a name comes in (the store, the
 * admin API, the CLI's --org, both ledgers through ledger_common.c), so no path can hold
 * money, keys or runs under a name another path refuses (sdk/support/README.md).
 *
 * The shape: 1 to EPH_ORG_NAME_MAX_BYTES (64) bytes, each an ASCII letter, digit, '_', '.'
 * or '-' (EPH_ORG_NAME_PATTERN). Why so narrow: a name is a segment of the API's paths
 * (/v1/admin/orgs/{org}/...: no '/', '%', '?' or space to encode), a value bound into SQL
 * of two engines and compared byte for byte (ASCII: no Unicode normalisation making two
 * spellings of one name, no invalid UTF-8 that PostgreSQL refuses and SQLite keeps), a
 * word of log lines and of what an operator's terminal shows (no control character, no
 * escape sequence, no blank splitting a field), and a command-line argument. */
#ifndef EPH_SUPPORT_ORG_NAME_H
#define EPH_SUPPORT_ORG_NAME_H

#include <ephemeral/plugin.h>

#define EPH_ORG_NAME_MAX_BYTES 64

#define EPH_ORG_NAME_STR_(x) #x
#define EPH_ORG_NAME_STR(x) EPH_ORG_NAME_STR_(x)
/* The rule as a regular expression (the API's messages; core/openapi.json says the same
 * with ^...$). */
#define EPH_ORG_NAME_PATTERN "[A-Za-z0-9_.-]{1," EPH_ORG_NAME_STR(EPH_ORG_NAME_MAX_BYTES) "}"

/* 0 when org follows the rule, else -EINVAL with err (may be NULL) saying why, never
 * echoing the name (it may hold anything): "organisation: empty" (NULL too),
 * "organisation: longer than 64 bytes", "organisation: byte N ('c' or 0xHH) is not a
 * letter, a digit, '_', '.' or '-'" (N counted from 0). */
int eph_org_name_check(const char *org, eph_error_t *err);

/* The same rule for another name that is a word of paths, SQL, logs and terminals (a
 * cluster node's node_name: core/cluster.c); what names it in the messages ("node_name:
 * byte 3 (0x1b) is not ..."). Same returns as eph_org_name_check. */
int eph_name_check(const char *what, const char *name, eph_error_t *err);

#endif
