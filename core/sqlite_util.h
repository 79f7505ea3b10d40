/* SQLite helpers shared by the core's store and the ledger-sqlite plugin. Header-only
 * (static inline): plugins do not link the core. */
#ifndef EPH_SQLITE_UTIL_H
#define EPH_SQLITE_UTIL_H

#include <stdio.h>
#include <string.h>
#include <time.h>

#include <sqlite3.h>

/* PRAGMA journal_mode = WAL, retried: when two processes open a new file at once, SQLite
 * answers SQLITE_BUSY here without calling the busy handler (it would deadlock on the lock
 * upgrade), so the wait is ours. Returns the mode the file ended in, or NULL. The string
 * is copied into buf. */
static inline const char *
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

/* PRAGMA quick_check: catches a damaged page (bytes overwritten, a torn copy) at open
 * instead of as wrong answers later (a corrupted API-key page read as "no such key").
 * O(pages) without the index cross-checks of integrity_check, so it is cheap enough for
 * every start. Returns 0 when the file is sound; otherwise -1 with SQLite's first
 * complaint in buf. */
static inline int
eph_sqlite_quick_check(sqlite3 *db, char *buf, size_t size)
{
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(db, "PRAGMA quick_check(1)", -1, &st, NULL);
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

#endif
