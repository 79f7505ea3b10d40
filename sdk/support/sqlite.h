/* SQLite helpers shared by the core's store and the ledger-sqlite plugin: one way to open
 * a database file, one mapping of SQLite's result codes to errno values, so the two agree
 * on what a caller sees (sdk/support/README.md). */
#ifndef EPH_SUPPORT_SQLITE_H
#define EPH_SUPPORT_SQLITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ephemeral/plugin.h>

#include "sqlite_api.h" /* libsqlite3 bound on first use: eph_sqlite_open() loads it */

/* The errno value of an (extended) SQLite result code:
 *   SQLITE_BUSY, SQLITE_LOCKED                      EBUSY  (another writer; retry later)
 *   SQLITE_FULL                                     ENOSPC
 *   SQLITE_CONSTRAINT_PRIMARYKEY, _UNIQUE           EEXIST (the row is there already)
 *   any other SQLITE_CONSTRAINT (CHECK, trigger)    EINVAL (a rule of the schema refused it)
 *   anything else (I/O, corruption, misuse)         EIO
 * Positive; eph_error_set() takes it as the code. */
int eph_sqlite_errno(int rc);

/* How to open a file. */
typedef struct eph_sqlite_open_options {
  const char *what;         /* for messages: "store", "ledger" */
  int busy_timeout_ms;      /* wait for another process's lock (0: not at all) */
  const char *synchronous;  /* "FULL" or "NORMAL" (NULL: "NORMAL") */
  bool owner_only;          /* chmod 0600 the file (SQLite gives -wal and -shm its mode) */
  const char *damaged_hint; /* appended to the "damaged" refusal: what the operator does */
  /* What PRAGMA quick_check covers at open. quick_check reads every page (about 1.2 s for a
   * 600 MB file here), and a CLI command opens the file each time: a store or ledger that
   * grew with history would make `runs show` cost seconds. So a file larger than
   * EPH_SQLITE_CHECK_WHOLE_MAX_BYTES has only the schema and these tables (NULL-terminated;
   * those whose damage would silently give wrong answers: keys, organisations, balances)
   * checked at open; damage elsewhere is reported by SQLite when the page is read
   * (SQLITE_CORRUPT: EIO) and by `ephemeral doctor`, which sets check_whole. NULL, or
   * check_whole, or a smaller file: the whole file. */
  const char *const *check_tables;
  bool check_whole;
  /* No checkpoint when the connection closes (SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE): only for
   * a file whose commits are fsync()ed themselves (synchronous FULL), where the close-time
   * checkpoint adds two fsyncs per process and no durability. The WAL is checkpointed by
   * the next writer once it grows past SQLite's auto-checkpoint size, or by the close of
   * a connection opened without this option. */
  bool no_checkpoint_on_close;
} eph_sqlite_open_options_t;

/* Opens (creating) path for one connection guarded by the caller's own mutex
 * (SQLITE_OPEN_NOMUTEX), with extended result codes, the busy timeout, journal_mode=WAL
 * (checked: the mode it ended in must be "wal"), foreign_keys=ON, the synchronous level,
 * and PRAGMA quick_check: a damaged file is refused here, naming it ("<path>: the <what>
 * file is damaged (PRAGMA quick_check: ...)"), instead of giving wrong answers later.
 * *db is the caller's (sqlite3_close) on success; NULL on failure. Returns 0 or a negative
 * errno value with err naming the path and the step. */
int eph_sqlite_open(const char *path, const eph_sqlite_open_options_t *opt, sqlite3 **db,
                    eph_error_t *err);

/* Prepares n statements (SQLITE_PREPARE_PERSISTENT: they live as long as the connection)
 * into st[0..n). On failure the ones prepared are finalized and st zeroed; returns the
 * negative errno of eph_sqlite_errno() with err "<path>: <sql>: <SQLite's message>". */
int eph_sqlite_prepare_all(sqlite3 *db, const char *path, const char *const *sql, size_t n,
                           sqlite3_stmt **st, eph_error_t *err);

/* Brings the schema to version n under the write lock (BEGIN IMMEDIATE, so two processes
 * starting together cannot both migrate): migrations[i] takes PRAGMA user_version from i
 * to i + 1; those the file has are skipped; all or nothing. A file newer than n is refused
 * (-EPH_E_CONFIG "<path>: schema version V is newer than this <owner>'s (n)"), never
 * touched. Returns 0 or a negative errno with err naming the path and step. */
int eph_sqlite_migrate(sqlite3 *db, const char *path, const char *const *migrations, int n,
                       const char *owner, eph_error_t *err);

/* Finalizes st[0..n) (NULL entries are fine) and zeroes them. */
void eph_sqlite_finalize_all(sqlite3_stmt **st, size_t n);

/* sqlite3_exec() of statements that return no rows. Returns 0 or the negative errno of
 * eph_sqlite_errno() with err "<path>: <what>: <SQLite's message>". */
int eph_sqlite_exec(sqlite3 *db, const char *path, const char *sql, const char *what,
                    eph_error_t *err);

/* PRAGMA journal_mode = WAL, retried: when two processes open a new file at once, SQLite
 * answers SQLITE_BUSY here without calling the busy handler (it would deadlock on the lock
 * upgrade), so the wait is ours. Returns the mode the file ended in, or NULL. The string
 * is copied into buf. */
const char *eph_sqlite_switch_to_wal(sqlite3 *db, int timeout_ms, char *buf, size_t size);

/* The size up to which eph_sqlite_open checks the whole file: about 1 ms here (quick_check
 * costs ~2 ms of CPU per MiB read cold: 2.6 ms for a 1.4 MB store). It was 64 MiB, ~0.13 s
 * at every CLI command: a `run` paid ~2 ms per MiB of history, a few percent of its CPU
 * after a day of runs and more every day after (tests/faults-large-store.test). */
#define EPH_SQLITE_CHECK_WHOLE_MAX_BYTES ((int64_t)512 << 10)

/* PRAGMA quick_check: catches a damaged page (bytes overwritten, a torn copy) at open
 * instead of as wrong answers later (a corrupted API-key page read as "no such key").
 * O(pages) without the index cross-checks of integrity_check, so it is cheap enough for
 * every start. Returns 0 when the file is sound; otherwise -1 with SQLite's first
 * complaint in buf. */
int eph_sqlite_quick_check(sqlite3 *db, char *buf, size_t size);

/* PRAGMA quick_check(T) of the schema table and each existing table of tables[] (and their
 * indexes) only: the bounded check eph_sqlite_open makes of a large file. Same returns. */
int eph_sqlite_quick_check_tables(sqlite3 *db, const char *const *tables, char *buf, size_t size);

#endif
