/* Statement helpers for the core's own tables (see sqlrow.h). */
#include "config.h"

#include "sqlrow.h"

#include <stdarg.h>

void
eph_sqlrow_bind_text(sqlite3_stmt *st, int i, const char *v)
{
  if (v)
    sqlite3_bind_text(st, i, v, -1, SQLITE_TRANSIENT);
  else
    sqlite3_bind_null(st, i);
}

static sqlite3_stmt *
prepare_va(sqlite3 *db, const char *sql, const char *types, va_list ap)
{
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
    sqlite3_finalize(st);
    return NULL;
  }
  for (int i = 0; types[i]; i++) {
    int64_t v;
    switch (types[i]) {
    case 't':
      eph_sqlrow_bind_text(st, i + 1, va_arg(ap, const char *));
      break;
    case 'i':
      sqlite3_bind_int64(st, i + 1, va_arg(ap, int64_t));
      break;
    case 'n':
      if ((v = va_arg(ap, int64_t)) > 0)
        sqlite3_bind_int64(st, i + 1, v);
      else
        sqlite3_bind_null(st, i + 1);
      break;
    default: /* a caller's typo: refuse the statement rather than bind garbage */
      sqlite3_finalize(st);
      return NULL;
    }
  }
  return st;
}

sqlite3_stmt *
eph_sqlrow_prepare(sqlite3 *db, const char *sql, const char *types, ...)
{
  va_list ap;
  va_start(ap, types);
  sqlite3_stmt *st = prepare_va(db, sql, types, ap);
  va_end(ap);
  return st;
}

/* Runs the statement sql, prepared and bound from ap: with rows, each row it returns is
 * appended as an object of names; without, it must return none. *changes (when not NULL)
 * gets sqlite3_changes(db). 0, or -1 (sqlite3_errmsg(db) says why: a statement's error
 * stays the connection's after finalize). */
static int
run_va(sqlite3 *db, json_object *rows, const char *const *names, int n, int *changes,
       const char *sql, const char *types, va_list ap)
{
  sqlite3_stmt *st = prepare_va(db, sql, types, ap);
  if (!st)
    return -1;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW && rows)
    json_object_array_add(rows, eph_sqlrow_object(st, names, n));
  if (changes)
    *changes = sqlite3_changes(db);
  sqlite3_finalize(st);
  return rc == SQLITE_DONE ? 0 : -1;
}

int
eph_sqlrow_exec(sqlite3 *db, int *changes, const char *sql, const char *types, ...)
{
  va_list ap;
  va_start(ap, types);
  int r = run_va(db, NULL, NULL, 0, changes, sql, types, ap);
  va_end(ap);
  return r;
}

int
eph_sqlrow_select(sqlite3 *db, json_object *rows, const char *const *names, int n, const char *sql,
                  const char *types, ...)
{
  va_list ap;
  va_start(ap, types);
  int r = run_va(db, rows, names, n, NULL, sql, types, ap);
  va_end(ap);
  return r;
}

json_object *
eph_sqlrow_column(sqlite3_stmt *st, int i)
{
  switch (sqlite3_column_type(st, i)) {
  case SQLITE_NULL:
    return NULL;
  case SQLITE_INTEGER:
    return json_object_new_int64(sqlite3_column_int64(st, i));
  default:
    return json_object_new_string((const char *)sqlite3_column_text(st, i));
  }
}

json_object *
eph_sqlrow_object(sqlite3_stmt *st, const char *const *names, int n)
{
  json_object *o = json_object_new_object();
  for (int k = 0; k < n; k++)
    json_object_object_add(o, names[k], eph_sqlrow_column(st, k));
  return o;
}
