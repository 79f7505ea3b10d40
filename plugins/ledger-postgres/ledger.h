/*
 * ledger-postgres internals, shared by its three files (not an interface of the plugin):
 *   ledger.c  the model (top comment), configuration, the operations and the descriptor
 *   conn.c    the connection pool, session set-up, error mapping and the transaction loop
 *   schema.c  the schema, the prepared statements and the migration
 */
#ifndef LEDGER_POSTGRES_LEDGER_H
#define LEDGER_POSTGRES_LEDGER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include <ephemeral/plugin.h>

#include "support/ledger_common.h"

#define PLUGIN "ledger-postgres"

/* The prepared statements, named "l<index>" on every connection (schema.c). */
enum {
  ST_ORG_ENSURE,
  ST_ORG_GET,
  ST_ORG_LOCK,
  ST_RES_GET,
  ST_RES_LOCK,
  ST_ENTRY_ADD,
  ST_OPEN_LIST,
  ST_RES_ORG,
  ST_PROBE,
  ST_OPEN_BEFORE,
  ST_COUNT
};

typedef struct pg_statement {
  const char *sql;
  int params;
} pg_statement_t;

extern const pg_statement_t statements[ST_COUNT];

typedef struct conn {
  PGconn *pg;
  bool ready; /* connected, session set up and statements prepared */
  bool busy;
} conn_t;

typedef struct ledger {
  const eph_host_t *host;
  char *conninfo; /* the `database` value: may hold a password, never logged */
  char *display;  /* the same without its password, for messages */
  /* Where conninfo came from, for messages: "key 'database'" or "the core's `database`". */
  const char *db_source;
  char identity[EPH_LEDGER_IDENTITY_BYTES]; /* ledger.identity, read at init (schema.c) */
  char node[EPH_LEDGER_MAX_NAME_BYTES + 1];
  int64_t connect_timeout_s, statement_timeout_ms, max_attempts;
  bool require_tls;
  pthread_mutex_t lock; /* guards conns[].busy */
  pthread_cond_t freed;
  size_t n_conns;
  conn_t *conns;
} ledger_t;

/* One operation's transaction on one pooled connection. */
typedef struct tx {
  ledger_t *l;
  conn_t *c;
  char sqlstate[6]; /* of the last failed statement; "" when none or no server answer */
  bool retry;       /* serialization failure or deadlock: run the transaction again */
  bool lost;        /* the connection broke */
  bool commit_sent;
} tx_t;

/* An operation's body, run inside the transaction: >= 0 commits, < 0 rolls back. */
typedef int (*tx_body_fn)(tx_t *tx, void *arg, eph_error_t *err);

/* Advisory lock classes: one lock per organisation (credit, reserve) or per run (charge,
 * settle); the second key is a 32-bit FNV-1a hash of the name (a collision only serialises
 * two unrelated operations). */
#define LOCK_ORG 0x65706f /* "epo" */
#define LOCK_RUN 0x657072 /* "epr" */

/* ---- conn.c */

/* Records a failed statement (res may be NULL: libpq's own failure) in tx and err; returns
 * the negative errno (the mapping is documented at its definition). */
int pg_fail(tx_t *tx, const PGresult *res, const char *what, eph_error_t *err);
/* With require_tls: -EPH_E_CONFIG unless every host is local or sslmode is verify-full. */
int check_transport(const char *conninfo, const char *source, eph_error_t *err);
/* The conninfo for messages, without its password; malloc()ed, NULL when unparsable. */
char *display_name(const char *conninfo);
/* Makes tx->c usable (connect or reset, session set-up, statements unless connect_only). */
int conn_connect(tx_t *tx, bool connect_only, eph_error_t *err);
/* Takes a free connection of the pool, waiting for one; checkin() gives it back. */
conn_t *checkout(ledger_t *l);
void checkin(ledger_t *l, conn_t *c);
/* Prepared statement `which` with text parameters (NULL = SQL NULL): the result (caller
 * PQclear()s) or NULL after filling err. */
PGresult *q(tx_t *tx, int which, const char *const *params, const char *what, eph_error_t *err);
/* One statement (or several, results ignored but the last) by PQexec. */
int exec_simple(tx_t *tx, const char *sql, eph_error_t *err);
/* Several statements, every result read; the first failure is the error. */
int exec_multi(tx_t *tx, const char *sql, const char *what, eph_error_t *err);
int64_t col_i64(const PGresult *res, int row, int col);
/* body in one SERIALIZABLE transaction with retries, after the advisory lock on lock_name
 * of lock_class (none when NULL); lock_org_too: a run's organisation too. */
int run_tx_locked(ledger_t *l, int lock_class, const char *lock_name, bool lock_org_too,
                  tx_body_fn body, void *arg, eph_error_t *err);
int run_tx(ledger_t *l, int lock_class, const char *lock_name, tx_body_fn body, void *arg,
           eph_error_t *err);

/* ---- schema.c */

/* Creates or checks the schema (-EPH_E_CONFIG when it is newer than this plugin's) and
 * reads the ledger's identity into l->identity. */
int migrate(ledger_t *l, eph_error_t *err);

#endif
