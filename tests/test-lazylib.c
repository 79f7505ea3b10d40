/* sdk/support/lazylib: a library bound on first use fails closed. A missing library or
 * symbol is an error naming it, on every call (never a half-bound table, never a crash);
 * a present one binds every name once. And the users in this binary (curl_api.h,
 * sqlite_api.h, crypto_api.h: the test links none of those libraries) bind theirs on
 * demand, by the soname configure found, and answer real calls. */
#include <config.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "support/base64.h"
#include "support/curl_api.h"
#include "support/sqlite_api.h"
#include "support/lazylib.h"

static void
test_missing_library(void **st)
{
  (void)st;
  static const char *const names[] = {"nothing"};
  static void *slots[1];
  static eph_lazylib_t lib = EPH_LAZYLIB_INIT("libeph-no-such-library.so.9", names, slots, 1, NULL);
  for (int i = 0; i < 2; i++) {
    eph_error_t err = {0};
    assert_int_equal(eph_lazylib_load(&lib, &err), -ELIBACC);
    assert_non_null(strstr(err.message, "libeph-no-such-library.so.9"));
  }
  assert_null(slots[0]);
}

static int binds;
static void
count_bind(void *const *s)
{
  (void)s;
  binds++;
}

static void
test_missing_symbol(void **st)
{
  (void)st;
  static const char *const names[] = {"strlen", "eph_no_such_symbol_in_libc"};
  static void *slots[2];
  static eph_lazylib_t lib = EPH_LAZYLIB_INIT("libc.so.6", names, slots, 2, count_bind);
  binds = 0;
  for (int i = 0; i < 2; i++) {
    eph_error_t err = {0};
    assert_int_equal(eph_lazylib_load(&lib, &err), -ELIBACC);
    assert_non_null(strstr(err.message, "eph_no_such_symbol_in_libc"));
  }
  assert_int_equal(binds, 0); /* a partly resolved table is never bound */
}

static void
test_binds_once(void **st)
{
  (void)st;
  static const char *const names[] = {"strlen", "strcmp"};
  static void *slots[2];
  static eph_lazylib_t lib = EPH_LAZYLIB_INIT("libc.so.6", names, slots, 2, count_bind);
  binds = 0;
  eph_error_t err = {0};
  assert_int_equal(eph_lazylib_load(&lib, &err), 0);
  assert_int_equal(eph_lazylib_load(&lib, &err), 0);
  assert_int_equal(binds, 1);
  size_t (*len)(const char *);
  memcpy(&len, &slots[0], sizeof len);
  assert_int_equal(len("four"), 4);
}

/* Runs before test_curl_on_demand: libcurl's own dependencies map libcrypto. */
static void
test_sqlite_and_crypto_on_demand(void **st)
{
  (void)st;
  /* Not mapped until first use: nothing in this binary's DT_NEEDED pulls them. */
  assert_null(dlopen(EPH_SONAME_SQLITE, RTLD_NOW | RTLD_NOLOAD));
  assert_null(dlopen(EPH_SONAME_CRYPTO, RTLD_NOW | RTLD_NOLOAD));
  eph_error_t err = {0};
  assert_int_equal(eph_sqlite_load(&err), 0);
  void *h = dlopen(EPH_SONAME_SQLITE, RTLD_NOW | RTLD_NOLOAD);
  assert_non_null(h);
  dlclose(h);
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open_v2(":memory:", &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
  sqlite3_stmt *q = NULL;
  assert_int_equal(sqlite3_prepare_v2(db, "SELECT 6 * 7", -1, &q, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(q), SQLITE_ROW);
  assert_int_equal(sqlite3_column_int(q, 0), 42);
  sqlite3_finalize(q);
  sqlite3_close(db);
  /* base64 loads libcrypto itself on its first use. */
  char *b = eph_base64_encode("hi", 2);
  assert_non_null(b);
  assert_string_equal(b, "aGk=");
  free(b);
  h = dlopen(EPH_SONAME_CRYPTO, RTLD_NOW | RTLD_NOLOAD);
  assert_non_null(h);
  dlclose(h);
}

static void
test_curl_on_demand(void **st)
{
  (void)st;
  eph_error_t err = {0};
  assert_int_equal(eph_curl_load(&err), 0);
  CURLU *u = curl_url();
  assert_non_null(u);
  assert_int_equal(curl_url_set(u, CURLUPART_URL, "http://Example.org:8080/a?b=c", 0), CURLUE_OK);
  char *host = NULL, *query = NULL;
  assert_int_equal(curl_url_get(u, CURLUPART_HOST, &host, 0), CURLUE_OK);
  assert_int_equal(curl_url_get(u, CURLUPART_QUERY, &query, 0), CURLUE_OK);
  assert_string_equal(host, "Example.org");
  assert_string_equal(query, "b=c");
  curl_free(host);
  curl_free(query);
  curl_url_cleanup(u);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_missing_library), cmocka_unit_test(test_missing_symbol),
      cmocka_unit_test(test_binds_once),      cmocka_unit_test(test_sqlite_and_crypto_on_demand),
      cmocka_unit_test(test_curl_on_demand),
  };
  return cmocka_run_group_tests_name("lazylib", tests, NULL, NULL);
}
