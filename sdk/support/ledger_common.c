/* See ledger_common.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "ledger_common.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

#include "org_name.h"
#include "text.h"

int64_t
eph_ledger_wall_us(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

const char *
eph_ledger_cost_name(eph_cost_t c)
{
  switch (c) {
  case EPH_COST_MODEL:
    return "model";
  case EPH_COST_WEB:
    return "web";
  case EPH_COST_COMPUTE:
    return "compute";
  }
  return NULL;
}

int
eph_ledger_check_name(const char *what, const char *s, eph_error_t *err)
{
  if (!s || !*s)
    return eph_error_set(err, EINVAL, "%s: empty", what);
  size_t n = strlen(s);
  if (n > EPH_LEDGER_MAX_NAME_BYTES)
    return eph_error_set(err, EINVAL, "%s: longer than %d bytes", what, EPH_LEDGER_MAX_NAME_BYTES);
  /* PostgreSQL refuses invalid UTF-8 in text and SQLite stores it: refused here for both. */
  if (!eph_utf8_is_text((const unsigned char *)s, n))
    return eph_error_set(err, EINVAL, "%s: not valid UTF-8", what);
  /* A name is shown in statements, logs and terminals: a control character there could
   * rewrite what an operator reads (an escape sequence) or split a log line. */
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    if (eph_control_len(p))
      return eph_error_set(err, EINVAL, "%s: contains a control character (byte %zu)", what,
                           (size_t)(p - (const unsigned char *)s));
  return 0;
}

/* Length of the valid UTF-8 sequence at p (1..4), or 0 when none starts there. */
static size_t
utf8_seq(const unsigned char *p)
{
  size_t n = p[0] < 0x80 ? 1 : p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc0 ? 2 : 0;
  for (size_t i = 1; i < n; i++)
    if (!p[i]) /* the string ends inside the sequence */
      return 0;
  return n && eph_utf8_is_text(p, n) ? n : 0;
}

void
eph_ledger_memo_clean(const char *memo, char out[EPH_LEDGER_MAX_MEMO_BYTES + 1])
{
  size_t o = 0;
  const unsigned char *p = (const unsigned char *)memo;
  while (*p) {
    size_t n = utf8_seq(p), c = eph_control_len(p);
    /* Controls (a command's tab or newline included) become a space or '?', as an invalid
     * byte does: the memo is shown in statements and on terminals. */
    const unsigned char *from = p;
    size_t take = n, put = n;
    if (c || !n) {
      from = (const unsigned char *)(c && (*p == '\t' || *p == '\n') ? " " : "?");
      take = c ? c : 1;
      put = 1;
    }
    if (o + put > EPH_LEDGER_MAX_MEMO_BYTES)
      break;
    memcpy(out + o, from, put);
    o += put;
    p += take;
  }
  out[o] = '\0';
}

int
eph_ledger_check_credit(const char *org, int64_t micros, eph_error_t *err)
{
  int r = eph_org_name_check(org, err);
  if (r < 0)
    return r;
  if (micros <= 0)
    return eph_error_set(err, EINVAL, "credit: micros must be positive (got %" PRId64 ")", micros);
  return 0;
}

int
eph_ledger_check_balance(const char *org, eph_error_t *err)
{
  return eph_org_name_check(org, err);
}

int
eph_ledger_check_reserve(const char *org, const char *run_id, int64_t micros, eph_error_t *err)
{
  int r = eph_org_name_check(org, err);
  if (r < 0 || (r = eph_ledger_check_name("run_id", run_id, err)) < 0)
    return r;
  if (micros <= 0)
    return eph_error_set(err, EINVAL, "reserve: micros must be positive (got %" PRId64 ")", micros);
  return 0;
}

int
eph_ledger_check_charge(const char *run_id, eph_cost_t category, int64_t micros, const char **cat,
                        eph_error_t *err)
{
  int r = eph_ledger_check_name("run_id", run_id, err);
  if (r < 0)
    return r;
  if (!(*cat = eph_ledger_cost_name(category)))
    return eph_error_set(err, EINVAL, "charge: unknown cost category %d", (int)category);
  if (micros < 0)
    return eph_error_set(err, EINVAL, "charge: micros must not be negative (got %" PRId64 ")",
                         micros);
  return 0;
}

int
eph_ledger_credit_fits(const char *org, int64_t credited, int64_t balance, int64_t micros,
                       eph_error_t *err)
{
  if (credited > INT64_MAX - micros || balance > INT64_MAX - micros)
    return eph_error_set(err, EOVERFLOW, "credit: organisation '%s' would pass %" PRId64 " micros",
                         org, INT64_MAX);
  return 0;
}

int
eph_ledger_reserve_fits(const char *org, int found, int64_t balance, int64_t micros,
                        eph_error_t *err)
{
  if (!found)
    return eph_error_set(err, EPH_E_INSUFFICIENT, "reserve: organisation '%s' has no credit", org);
  if (balance < micros)
    return eph_error_set(err, EPH_E_INSUFFICIENT,
                         "reserve: organisation '%s' has %" PRId64 " micros available, the "
                         "run asks for %" PRId64,
                         org, balance, micros);
  return 0;
}

int
eph_ledger_charge_fits(const char *run_id, const char *cat, int64_t micros, int found,
                       const eph_ledger_totals_t *t, eph_error_t *err)
{
  if (!found)
    return eph_ledger_err_no_reservation("charge", run_id, err);
  if (t->settled)
    return eph_error_set(err, EALREADY, "charge: run %s is already settled", run_id);
  /* Written as a subtraction so it cannot overflow: both sides are within [0, reserved]. */
  if (micros > t->reserved_micros - t->billed_micros)
    return eph_error_set(err, EPH_E_BUDGET,
                         "charge: %" PRId64 " micros of %s would pass the reservation of run "
                         "%s (%" PRId64 " of %" PRId64 " micros billed)",
                         micros, cat, run_id, t->billed_micros, t->reserved_micros);
  return 0;
}

int
eph_ledger_err_reserved(const char *run_id, eph_error_t *err)
{
  return eph_error_set(err, EEXIST, "reserve: run %s already has a reservation", run_id);
}

int
eph_ledger_err_no_reservation(const char *op, const char *run_id, eph_error_t *err)
{
  return eph_error_set(err, ENOENT, "%s: run %s has no reservation", op, run_id);
}

int
eph_ledger_settle_in(const eph_ledger_store_t *store, void *ctx, const char *run_id,
                     eph_ledger_totals_t *totals, eph_error_t *err)
{
  eph_ledger_reservation_t res;
  int r = store->reservation_get(ctx, run_id, &res, err);
  if (r < 0)
    return r;
  if (r == 0)
    return eph_ledger_err_no_reservation("settle", run_id, err);
  if (!res.t.settled) {
    int64_t released = res.t.reserved_micros - res.t.billed_micros;
    if ((r = store->entry_add(ctx, res.org, run_id, "settle", NULL, released, NULL, err)) < 0)
      return r;
    res.t.released_micros = released;
    res.t.settled = 1;
    r = 1;
  }
  if (totals)
    *totals = res.t;
  return r;
}
