/* What the two ledgers (plugins/ledger-sqlite, plugins/ledger-postgres) share: the checks of
 * their arguments, the decisions taken on the rows read inside the transaction, and the
 * wording of every error those give, so both ledgers refuse the same bad input with the same
 * code and message (sdk/support/README.md). Storage stays in each plugin. Every function that
 * returns int returns 0 when the operation may go on, else a negative errno (EPH_E_* for the
 * ledger's documented outcomes) after filling err. */
#ifndef EPH_SUPPORT_LEDGER_COMMON_H
#define EPH_SUPPORT_LEDGER_COMMON_H

#include <stdint.h>

#include <ephemeral/plugin.h>

#define EPH_LEDGER_MAX_NAME_BYTES 128 /* run_id, ledger-postgres' node_name, an org as read */
#define EPH_LEDGER_MAX_MEMO_BYTES 256 /* longer memos are cut at a UTF-8 boundary */

/* One reservation row as read back. */
typedef struct eph_ledger_reservation {
  char org[EPH_LEDGER_MAX_NAME_BYTES + 1];
  eph_ledger_totals_t t;
} eph_ledger_reservation_t;

/* CLOCK_REALTIME in microseconds: an entry's t_us. */
int64_t eph_ledger_wall_us(void);

/* "model", "web", "compute"; NULL for a value outside eph_cost_t. */
const char *eph_ledger_cost_name(eph_cost_t c);

/* A name (`what`: "run_id", "node_name"): not empty, at most EPH_LEDGER_MAX_NAME_BYTES,
 * valid UTF-8, no control character (eph_control_len). -EINVAL "<what>: ..." otherwise.
 * An organisation's name is not one of these: it follows the narrower rule every other
 * path checks (eph_org_name_check, org_name.h; see the operation checks below). */
int eph_ledger_check_name(const char *what, const char *s, eph_error_t *err);

/* The memo as stored: at most EPH_LEDGER_MAX_MEMO_BYTES, cut at a character boundary, each
 * byte that does not start a valid UTF-8 sequence and each control character replaced by
 * '?' (a tab or newline by a space): a memo is a note; it must never make a charge fail. */
void eph_ledger_memo_clean(const char *memo, char out[EPH_LEDGER_MAX_MEMO_BYTES + 1]);

/* The arguments of each operation, checked before any transaction. The organisation of
 * credit, balance and reserve by eph_org_name_check (org_name.h: its rule and its error), so
 * a ledger refuses a name the store and the admin API refuse. check_charge sets *cat to the
 * category's name. */
int eph_ledger_check_credit(const char *org, int64_t micros, eph_error_t *err);
int eph_ledger_check_balance(const char *org, eph_error_t *err);
int eph_ledger_check_reserve(const char *org, const char *run_id, int64_t micros, eph_error_t *err);
int eph_ledger_check_charge(const char *run_id, eph_cost_t category, int64_t micros,
                            const char **cat, eph_error_t *err);

/* The decisions, on what the transaction read. credit: -EOVERFLOW when the organisation's
 * credited or balance would pass INT64_MAX. reserve: -EPH_E_INSUFFICIENT when the organisation
 * is unknown (found == 0) or its balance is short. charge: -ENOENT no reservation (found ==
 * 0), -EALREADY settled, -EPH_E_BUDGET past the reservation's cap. */
int eph_ledger_credit_fits(const char *org, int64_t credited, int64_t balance, int64_t micros,
                           eph_error_t *err);
int eph_ledger_reserve_fits(const char *org, int found, int64_t balance, int64_t micros,
                            eph_error_t *err);
int eph_ledger_charge_fits(const char *run_id, const char *cat, int64_t micros, int found,
                           const eph_ledger_totals_t *t, eph_error_t *err);

/* -EEXIST "reserve: run <run_id> already has a reservation". */
int eph_ledger_err_reserved(const char *run_id, eph_error_t *err);
/* -ENOENT "<op>: run <run_id> has no reservation". */
int eph_ledger_err_no_reservation(const char *op, const char *run_id, eph_error_t *err);

/* A ledger's own reading and writing, for the steps written once here. Both run inside
 * the caller's open transaction on ctx. reservation_get: 1 found (and locked against
 * concurrent writers where the store needs it), 0 absent, negative errno. entry_add: appends
 * one journal entry (category and memo may be NULL), 0 or negative errno. */
typedef struct eph_ledger_store {
  int (*reservation_get)(void *ctx, const char *run_id, eph_ledger_reservation_t *out,
                         eph_error_t *err);
  int (*entry_add)(void *ctx, const char *org, const char *run_id, const char *kind,
                   const char *category, int64_t micros, const char *memo, eph_error_t *err);
} eph_ledger_store_t;

/* Settles run_id inside the caller's transaction: appends the settle entry releasing
 * reserved - billed unless it is settled already, and fills *totals (may be NULL) as they
 * stand after it. Returns 1 settled now, 0 already settled, -ENOENT "settle: run <run_id>
 * has no reservation", or the store's error. */
int eph_ledger_settle_in(const eph_ledger_store_t *store, void *ctx, const char *run_id,
                         eph_ledger_totals_t *totals, eph_error_t *err);

/* The fini, operations table and descriptor of a ledger plugin, written once for both (at
 * file scope, last): the plugin names its functions alike (ledger_init, ledger_close of its
 * state, ledger_credit, ledger_balance, ledger_reserve, ledger_charge, ledger_settle,
 * ledger_totals, ledger_settle_open, ledger_probe, ledger_identity,
 * ledger_open_reservations) and its key table ledger_keys. */
#define EPH_LEDGER_PLUGIN(NAME, DESCRIPTION)                                                       \
  static void ledger_fini(void *state)                                                             \
  {                                                                                                \
    ledger_close(state);                                                                           \
  }                                                                                                \
  static const eph_ledger_ops_t ledger_ops = {                                                     \
      .struct_size = sizeof(eph_ledger_ops_t),                                                     \
      .credit = ledger_credit,                                                                     \
      .balance = ledger_balance,                                                                   \
      .reserve = ledger_reserve,                                                                   \
      .charge = ledger_charge,                                                                     \
      .settle = ledger_settle,                                                                     \
      .totals = ledger_totals,                                                                     \
      .settle_open = ledger_settle_open,                                                           \
      .probe = ledger_probe,                                                                       \
      .identity = ledger_identity,                                                                 \
      .open_reservations = ledger_open_reservations,                                               \
  };                                                                                               \
  EPH_PLUGIN_EXPORT = {                                                                            \
      .abi_major = EPH_ABI_MAJOR,                                                                  \
      .abi_minor = EPH_ABI_MINOR,                                                                  \
      .struct_size = sizeof(eph_plugin_t),                                                         \
      .name = (NAME),                                                                              \
      .kind = EPH_KIND_LEDGER,                                                                     \
      .version = "0.1.0",                                                                          \
      .description = (DESCRIPTION),                                                                \
      .config_keys = ledger_keys,                                                                  \
      .init = ledger_init,                                                                         \
      .fini = ledger_fini,                                                                         \
      .ops = &ledger_ops,                                                                          \
  }

#endif
