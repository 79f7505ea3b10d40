/* Statement helpers for the core's modules that keep their own tables in the store's file
 * (admin.c: keys, audit, usage; webhook_queue.c: endpoints and deliveries), reached through
 * eph_store_with_db(). One place for binding optional values and reading a row into JSON,
 * which those modules each did for themselves. SQLite only: the store's other backends do
 * not come through here. */
#ifndef EPH_SQLROW_H
#define EPH_SQLROW_H

#include <stdint.h>

#include <json-c/json.h>
#include "support/sqlite_api.h"

/* Binds text v to parameter i, or SQL NULL when v is NULL (copied: SQLITE_TRANSIENT). */
void eph_sqlrow_bind_text(sqlite3_stmt *st, int i, const char *v);

/* Prepares sql and binds its parameters ?1, ?2, ... from the arguments, one letter of
 * `types` each: 't' a const char * (NULL: SQL NULL), 'i' an int64_t, 'n' an int64_t bound
 * as SQL NULL when it is not positive (an optional code or count). Returns the statement
 * (finalize it), or NULL on an SQLite error (sqlite3_errmsg(db) says which). */
sqlite3_stmt *eph_sqlrow_prepare(sqlite3 *db, const char *sql, const char *types, ...);

/* One statement that returns no row: prepared, bound as eph_sqlrow_prepare, stepped to
 * SQLITE_DONE and finalized. *changes (when not NULL) gets sqlite3_changes(db). Returns 0,
 * or -1 on an SQLite error (the caller words it with sqlite3_errmsg(db)). */
int eph_sqlrow_exec(sqlite3 *db, int *changes, const char *sql, const char *types, ...);

/* A query's rows appended to the array rows, each as eph_sqlrow_object(names, n): prepared
 * and bound as eph_sqlrow_prepare, stepped to the end and finalized. Returns 0, or -1 on
 * an SQLite error (the caller words it with sqlite3_errmsg(db)). */
int eph_sqlrow_select(sqlite3 *db, json_object *rows, const char *const *names, int n,
                      const char *sql, const char *types, ...);

/* Column i of the current row as JSON: NULL for SQL NULL, an int64 for an integer, else
 * its text as a string. New reference (or NULL). */
json_object *eph_sqlrow_column(sqlite3_stmt *st, int i);

/* The current row as an object: names[k] = column k, k < n (SQL NULL as JSON null). */
json_object *eph_sqlrow_object(sqlite3_stmt *st, const char *const *names, int n);

#endif
