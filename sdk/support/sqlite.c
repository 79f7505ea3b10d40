/* See sqlite.h. */
#include "sqlite.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

int
eph_sqlite_errno(int rc)
{
  switch (rc & 0xff) {
  case SQLITE_BUSY:
  case SQLITE_LOCKED:
    return EBUSY;
  case SQLITE_FULL:
    return ENOSPC;
  case SQLITE_CONSTRAINT:
    return rc == SQLITE_CONSTRAINT_PRIMARYKEY || rc == SQLITE_CONSTRAINT_UNIQUE ? EEXIST : EINVAL;
  default:
    return EIO;
  }
}

int
eph_sqlite_exec(sqlite3 *db, const char *path, const char *sql, const char *what, eph_error_t *err)
{
  char *msg = NULL;
  int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
  if (rc == SQLITE_OK)
    return 0;
  int r = eph_error_set(err, eph_sqlite_errno(sqlite3_extended_errcode(db)), "%s: %s: %s", path,
                        what, msg ? msg : sqlite3_errstr(rc));
  sqlite3_free(msg);
  return r;
}

int
eph_sqlite_prepare_all(sqlite3 *db, const char *path, const char *const *sql, size_t n,
                       sqlite3_stmt **st, eph_error_t *err)
{
  for (size_t i = 0; i < n; i++) {
    int rc = sqlite3_prepare_v3(db, sql[i], -1, SQLITE_PREPARE_PERSISTENT, &st[i], NULL);
    if (rc != SQLITE_OK) {
      int r = eph_error_set(err, eph_sqlite_errno(sqlite3_extended_errcode(db)), "%s: %s: %s", path,
                            sql[i], sqlite3_errmsg(db));
      eph_sqlite_finalize_all(st, n);
      return r;
    }
  }
  return 0;
}

int
eph_sqlite_migrate(sqlite3 *db, const char *path, const char *const *migrations, int n,
                   const char *owner, eph_error_t *err)
{
  int r = eph_sqlite_exec(db, path, "BEGIN IMMEDIATE", "starting the schema migration", err);
  if (r < 0)
    return r;
  int version = -1;
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW)
    version = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  if (version < 0)
    r = eph_error_set(err, eph_sqlite_errno(sqlite3_extended_errcode(db)),
                      "%s: reading the schema version: %s", path, sqlite3_errmsg(db));
  else if (version > n)
    r = eph_error_set(err, EPH_E_CONFIG,
                      "%s: schema version %d is newer than this %s's (%d); refusing to "
                      "touch it",
                      path, version, owner, n);
  for (int v = version; r >= 0 && v < n; v++) {
    char what[64], pragma[48];
    snprintf(what, sizeof what, "migrating the schema to version %d", v + 1);
    snprintf(pragma, sizeof pragma, "PRAGMA user_version = %d", v + 1);
    r = eph_sqlite_exec(db, path, migrations[v], what, err);
    if (r >= 0)
      r = eph_sqlite_exec(db, path, pragma, what, err);
  }
  if (r < 0) {
    eph_sqlite_exec(db, path, "ROLLBACK", "rolling back the migration", NULL);
    return r;
  }
  return eph_sqlite_exec(db, path, "COMMIT", "committing the schema", err);
}

void
eph_sqlite_finalize_all(sqlite3_stmt **st, size_t n)
{
  for (size_t i = 0; i < n; i++) {
    sqlite3_finalize(st[i]);
    st[i] = NULL;
  }
}

const char *
eph_sqlite_switch_to_wal(sqlite3 *db, int timeout_ms, char *buf, size_t size)
{
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db, "PRAGMA journal_mode = WAL", -1, &st, NULL) != SQLITE_OK)
    return NULL;
  const char *mode = NULL;
  for (int waited = 0;; waited += 10) {
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      snprintf(buf, size, "%s", (const char *)sqlite3_column_text(st, 0));
      mode = buf;
      break;
    }
    if ((rc & 0xff) != SQLITE_BUSY && (rc & 0xff) != SQLITE_LOCKED)
      break;
    if (waited >= timeout_ms)
      break;
    sqlite3_reset(st);
    struct timespec ts = {0, 10 * 1000000};
    nanosleep(&ts, NULL);
  }
  sqlite3_finalize(st);
  return mode;
}

/* Runs one PRAGMA quick_check statement; 0 when it answers "ok". */
static int
quick_check_sql(sqlite3 *db, const char *sql, char *buf, size_t size)
{
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
  if (rc != SQLITE_OK) {
    snprintf(buf, size, "%s", sqlite3_errmsg(db));
    return -1;
  }
  rc = sqlite3_step(st);
  int r = 0;
  if (rc == SQLITE_ROW) {
    const char *t = (const char *)sqlite3_column_text(st, 0);
    if (!t || strcmp(t, "ok") != 0) {
      snprintf(buf, size, "%s", t ? t : "(no answer)");
      r = -1;
    }
  } else {
    snprintf(buf, size, "%s", sqlite3_errmsg(db));
    r = -1;
  }
  sqlite3_finalize(st);
  return r;
}

int
eph_sqlite_quick_check(sqlite3 *db, char *buf, size_t size)
{
  return quick_check_sql(db, "PRAGMA quick_check(1)", buf, size);
}

int
eph_sqlite_quick_check_tables(sqlite3 *db, const char *const *tables, char *buf, size_t size)
{
  if (quick_check_sql(db, "PRAGMA quick_check(sqlite_schema)", buf, size) < 0)
    return -1;
  for (; tables && *tables; tables++) {
    /* A table an older schema does not have yet is skipped (quick_check would fail with
     * "no such table"). */
    sqlite3_stmt *st = NULL;
    int exists =
        sqlite3_prepare_v2(db, "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?1", -1,
                           &st, NULL) == SQLITE_OK &&
        sqlite3_bind_text(st, 1, *tables, -1, SQLITE_STATIC) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW;
    sqlite3_finalize(st);
    if (!exists)
      continue;
    /* The names are the caller's constants (identifiers), never input. */
    char sql[128];
    snprintf(sql, sizeof sql, "PRAGMA quick_check(\"%s\")", *tables);
    if (quick_check_sql(db, sql, buf, size) < 0)
      return -1;
  }
  return 0;
}

int
eph_sqlite_open(const char *path, const eph_sqlite_open_options_t *opt, sqlite3 **out,
                eph_error_t *err)
{
  const char *what = opt->what ? opt->what : "database";
  int busy_ms = opt->busy_timeout_ms;
  const char *sync = opt->synchronous ? opt->synchronous : "NORMAL";
  sqlite3 *db = NULL;
  *out = NULL;
  /* The one way in to SQLite: every other call needs the handle made here (sqlite_api.h). */
  int r = eph_sqlite_load(err);
  if (r < 0)
    return eph_error_wrap(err, "%s: opening the %s", path, what);
  /* NOMUTEX: the caller's own mutex serialises every use of the connection. */
  int rc = sqlite3_open_v2(path, &db,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
  if (rc != SQLITE_OK) {
    r = eph_error_set(err, EIO, "%s: opening the %s: %s", path, what,
                      db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
    goto fail;
  }
  if (opt->owner_only && chmod(path, 0600) < 0) {
    r = eph_error_set(err, errno, "%s: chmod 0600: %s", path, strerror(errno));
    goto fail;
  }
  sqlite3_extended_result_codes(db, 1);
  sqlite3_busy_timeout(db, busy_ms);
  if (opt->no_checkpoint_on_close)
    sqlite3_db_config(db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, (int *)NULL);
  /* journal_mode returns the mode it ended in: check it really is WAL. */
  char mode_buf[32];
  const char *mode = eph_sqlite_switch_to_wal(db, busy_ms, mode_buf, sizeof mode_buf);
  if (!mode || strcasecmp(mode, "wal") != 0) {
    r = eph_error_set(err, EIO, "%s: cannot switch to WAL mode (got %s): %s", path,
                      mode ? mode : "nothing", sqlite3_errmsg(db));
    goto fail;
  }
  /* SQLite gives a new -wal and -shm the file's mode, but they outlive a connection (the
   * -shm always, the -wal without a checkpoint at close): ones a laxer umask made before
   * stay as they were (a ledger's -shm was still 0644 after its file was made 0600). */
  static const char *const sides[] = {"-wal", "-shm"};
  for (size_t i = 0; opt->owner_only && i < 2; i++) {
    char side[PATH_MAX];
    if (snprintf(side, sizeof side, "%s%s", path, sides[i]) < (int)sizeof side &&
        chmod(side, 0600) < 0 && errno != ENOENT) {
      r = eph_error_set(err, errno, "%s: chmod 0600: %s", side, strerror(errno));
      goto fail;
    }
  }
  char pragmas[96];
  snprintf(pragmas, sizeof pragmas, "PRAGMA foreign_keys = ON; PRAGMA synchronous = %s;",
           strcasecmp(sync, "FULL") == 0 ? "FULL" : "NORMAL");
  if ((r = eph_sqlite_exec(db, path, pragmas, "setting pragmas", err)) < 0)
    goto fail;
  /* A damaged file is refused at open, naming it: serving from it gives wrong answers
   * (a damaged API-key page reads as "no such key", a damaged ledger as wrong balances). */
  char why[256];
  struct stat st;
  bool whole = opt->check_whole || !opt->check_tables || stat(path, &st) < 0 ||
               (int64_t)st.st_size <= EPH_SQLITE_CHECK_WHOLE_MAX_BYTES;
  if ((whole ? eph_sqlite_quick_check(db, why, sizeof why)
             : eph_sqlite_quick_check_tables(db, opt->check_tables, why, sizeof why)) < 0) {
    r = eph_error_set(err, EIO, "%s: the %s file is damaged (PRAGMA quick_check: %s)%s%s", path,
                      what, why, opt->damaged_hint ? "; " : "",
                      opt->damaged_hint ? opt->damaged_hint : "");
    goto fail;
  }
  *out = db;
  return 0;
fail:
  sqlite3_close(db);
  return r;
}
