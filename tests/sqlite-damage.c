/* See sqlite-damage.h. */
#include <config.h>

#include "sqlite-damage.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include <sqlite3.h>

void
damage_root_page(const char *path, const char *table, bool checkpoint)
{
  sqlite3 *db = NULL;
  assert_int_equal(
      sqlite3_open_v2(path, &db, checkpoint ? SQLITE_OPEN_READWRITE : SQLITE_OPEN_READONLY, NULL),
      SQLITE_OK);
  if (checkpoint)
    assert_int_equal(sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL),
                     SQLITE_OK);
  sqlite3_stmt *s = NULL;
  assert_int_equal(
      sqlite3_prepare_v2(db, "SELECT rootpage FROM sqlite_master WHERE name = ?1", -1, &s, NULL),
      SQLITE_OK);
  sqlite3_bind_text(s, 1, table, -1, SQLITE_STATIC);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  int page = sqlite3_column_int(s, 0);
  sqlite3_finalize(s);
  sqlite3_close(db);
  assert_true(page > 1);
  FILE *fp = fopen(path, "r+b");
  assert_non_null(fp);
  char junk[4096];
  memset(junk, 'y', sizeof junk);
  assert_int_equal(fseek(fp, (long)(page - 1) * 4096, SEEK_SET), 0);
  assert_int_equal(fwrite(junk, 1, sizeof junk, fp), sizeof junk);
  assert_int_equal(fclose(fp), 0);
}
