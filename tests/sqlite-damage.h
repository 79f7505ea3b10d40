/* Damage done to an SQLite file on purpose, for the tests of what the store and
 * ledger-sqlite do with a damaged file (tests/test-store.c, tests/test-ledger.c). */
#ifndef EPH_TESTS_SQLITE_DAMAGE_H
#define EPH_TESTS_SQLITE_DAMAGE_H

#include <stdbool.h>

/* Overwrites the root page of table in the SQLite file at path (4096-byte pages) with
 * junk, its number read through a connection of this function's own. With checkpoint,
 * that connection first moves the WAL into the file (PRAGMA wal_checkpoint(TRUNCATE)): a
 * page whose newer copy is in the WAL is not damage the next checkpoint would keep. Fails
 * the test when a step fails. */
void damage_root_page(const char *path, const char *table, bool checkpoint);

#endif
