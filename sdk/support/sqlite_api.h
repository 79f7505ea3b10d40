/* SQLite, bound on first use (lazylib.h): the functions the core's store, its admin and
 * webhook tables and sdk/support/sqlite.c call, so the `ephemeral` CLI does not map and
 * relocate libsqlite3 (1,600 symbol relocations) at every start; `ephemeral exec` never
 * opens a store. eph_sqlite_open() (sqlite.h) calls eph_sqlite_load() before
 * sqlite3_open_v2(), and every other call needs the handle it returns.
 *
 * Include this (or sqlite.h, which does) instead of <sqlite3.h>: the calls keep their
 * names (macros below) and their types (taken from sqlite3.h). A plugin or program that
 * links libsqlite3 itself (ledger-sqlite, the tests) may mix direct calls and these:
 * dlopen() returns the library already mapped, so both reach one copy. */
#ifndef EPH_SUPPORT_SQLITE_API_H
#define EPH_SUPPORT_SQLITE_API_H

#include <sqlite3.h>

#include <ephemeral/plugin.h>

#include "lazylib.h"

#define EPH_SQLITE_FUNCTIONS(X)                                                                    \
  X(sqlite3_bind_blob)                                                                             \
  X(sqlite3_bind_int)                                                                              \
  X(sqlite3_bind_int64)                                                                            \
  X(sqlite3_bind_null)                                                                             \
  X(sqlite3_bind_text)                                                                             \
  X(sqlite3_busy_timeout)                                                                          \
  X(sqlite3_changes)                                                                               \
  X(sqlite3_clear_bindings)                                                                        \
  X(sqlite3_close)                                                                                 \
  X(sqlite3_column_blob)                                                                           \
  X(sqlite3_column_bytes)                                                                          \
  X(sqlite3_column_int)                                                                            \
  X(sqlite3_column_int64)                                                                          \
  X(sqlite3_column_text)                                                                           \
  X(sqlite3_column_type)                                                                           \
  X(sqlite3_db_config)                                                                             \
  X(sqlite3_errmsg)                                                                                \
  X(sqlite3_errstr)                                                                                \
  X(sqlite3_exec)                                                                                  \
  X(sqlite3_extended_errcode)                                                                      \
  X(sqlite3_extended_result_codes)                                                                 \
  X(sqlite3_finalize)                                                                              \
  X(sqlite3_free)                                                                                  \
  X(sqlite3_get_autocommit)                                                                        \
  X(sqlite3_open_v2)                                                                               \
  X(sqlite3_prepare_v2)                                                                            \
  X(sqlite3_prepare_v3)                                                                            \
  X(sqlite3_reset)                                                                                 \
  X(sqlite3_step)

EPH_LAZYLIB_API(eph_sqlite_api_t, EPH_SQLITE_FUNCTIONS);

/* Filled by the first successful eph_sqlite_load(); read-only afterwards. */
extern eph_sqlite_api_t eph_sqlite_api;

/* 0 once libsqlite3 (EPH_SONAME_SQLITE, e.g. libsqlite3.so.0) is loaded and bound; else
 * -ELIBACC, err names why. */
int eph_sqlite_load(eph_error_t *err);

#ifndef EPH_SQLITE_API_IMPLEMENTATION
#define sqlite3_bind_blob (eph_sqlite_api.sqlite3_bind_blob)
#define sqlite3_bind_int (eph_sqlite_api.sqlite3_bind_int)
#define sqlite3_bind_int64 (eph_sqlite_api.sqlite3_bind_int64)
#define sqlite3_bind_null (eph_sqlite_api.sqlite3_bind_null)
#define sqlite3_bind_text (eph_sqlite_api.sqlite3_bind_text)
#define sqlite3_busy_timeout (eph_sqlite_api.sqlite3_busy_timeout)
#define sqlite3_changes (eph_sqlite_api.sqlite3_changes)
#define sqlite3_clear_bindings (eph_sqlite_api.sqlite3_clear_bindings)
#define sqlite3_close (eph_sqlite_api.sqlite3_close)
#define sqlite3_column_blob (eph_sqlite_api.sqlite3_column_blob)
#define sqlite3_column_bytes (eph_sqlite_api.sqlite3_column_bytes)
#define sqlite3_column_int (eph_sqlite_api.sqlite3_column_int)
#define sqlite3_column_int64 (eph_sqlite_api.sqlite3_column_int64)
#define sqlite3_column_text (eph_sqlite_api.sqlite3_column_text)
#define sqlite3_column_type (eph_sqlite_api.sqlite3_column_type)
#define sqlite3_db_config (eph_sqlite_api.sqlite3_db_config)
#define sqlite3_errmsg (eph_sqlite_api.sqlite3_errmsg)
#define sqlite3_errstr (eph_sqlite_api.sqlite3_errstr)
#define sqlite3_exec (eph_sqlite_api.sqlite3_exec)
#define sqlite3_extended_errcode (eph_sqlite_api.sqlite3_extended_errcode)
#define sqlite3_extended_result_codes (eph_sqlite_api.sqlite3_extended_result_codes)
#define sqlite3_finalize (eph_sqlite_api.sqlite3_finalize)
#define sqlite3_free (eph_sqlite_api.sqlite3_free)
#define sqlite3_get_autocommit (eph_sqlite_api.sqlite3_get_autocommit)
#define sqlite3_open_v2 (eph_sqlite_api.sqlite3_open_v2)
#define sqlite3_prepare_v2 (eph_sqlite_api.sqlite3_prepare_v2)
#define sqlite3_prepare_v3 (eph_sqlite_api.sqlite3_prepare_v3)
#define sqlite3_reset (eph_sqlite_api.sqlite3_reset)
#define sqlite3_step (eph_sqlite_api.sqlite3_step)
#endif

#endif
