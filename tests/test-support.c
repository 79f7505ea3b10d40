/* The support library (sdk/support) that the core and the plugins share: one copy of each
 * helper, and each copy at least as strict as the strictest of those it replaced.
 *   - base64: the core's request files and the guest's frames used to accept a
 *     non-canonical text ("QR==", pad bits set) that tool-file refused; now all refuse it
 *   - SQLite: the store and the ledger map result codes to the same errno values (the
 *     ledger answered EINVAL for a UNIQUE conflict the store called EEXIST)
 *   - strict JSON: the core's request parser and the guest's frame reader were two copies
 *     (util.c, protocol.h); one parser now (json_strict.c), each caller's rules kept
 *   - UTF-8 text checks, dollars and ISO 8601 as before */
#include <config.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../guest/protocol.h"
#include "support/base64.h"
#include "support/format.h"
#include "support/json_strict.h"
#include "support/sqlite.h"
#include "support/text.h"
#include "util.h"

static int
decodes(const char *text)
{
  unsigned char *out = NULL;
  size_t n = 0;
  int r = eph_base64_decode(text, strlen(text), &out, &n);
  free(out);
  return r;
}

static void
test_base64_strict_and_canonical(void **st)
{
  (void)st;
  unsigned char *out = NULL;
  size_t n = 0;
  assert_int_equal(eph_base64_decode("QUJD", 4, &out, &n), 0);
  assert_int_equal(n, 3);
  assert_memory_equal(out, "ABC", 3);
  free(out);
  assert_int_equal(decodes(""), 0);
  assert_int_equal(decodes("QQ=="), 0);
  assert_int_equal(decodes("QUI="), 0);
  /* Not canonical: the unused bits under the padding are set ("QR==" and "QUJ=" would
   * otherwise decode to the same bytes as "QQ==" and "QUI="). */
  assert_int_equal(decodes("QR=="), -EINVAL);
  assert_int_equal(decodes("QUJ="), -EINVAL);
  /* Blanks, line breaks, the URL-safe alphabet, misplaced padding, a bad length. */
  assert_int_equal(decodes("QU JD"), -EINVAL);
  assert_int_equal(decodes("QUJD\n"), -EINVAL);
  assert_int_equal(decodes("-_-_"), -EINVAL);
  assert_int_equal(decodes("Q=JD"), -EINVAL);
  assert_int_equal(decodes("QQ=A"), -EINVAL);
  assert_int_equal(decodes("QUJ"), -EINVAL);
  char small[2];
  assert_int_equal(eph_base64_decode_into("QUJD", 4, small, sizeof small), -ENOBUFS);
  char *enc = eph_base64_encode("ABCD", 4);
  assert_string_equal(enc, "QUJDRA==");
  free(enc);
}

/* The guest protocol decodes with the same codec: a frame's non-canonical data is refused
 * as "not base64" (it decoded before). */
static void
test_guest_protocol_uses_the_codec(void **st)
{
  (void)st;
  json_object *o = json_tokener_parse("{\"data\": \"QR==\"}");
  void *out = NULL;
  size_t n = 0;
  assert_int_equal(eph_proto_get_b64(o, "data", 16, &out, &n), -EINVAL);
  json_object_put(o);
  o = json_tokener_parse("{\"data\": \"QQ==\"}");
  assert_int_equal(eph_proto_get_b64(o, "data", 16, &out, &n), 0);
  assert_int_equal(n, 1);
  free(out);
  assert_int_equal(eph_proto_get_b64(o, "data", 0, &out, &n), -EFBIG);
  json_object_put(o);
}

/* One strict parser for the core (eph_json_parse_strict: request files and bodies, any
 * value, UTF-8 checked, faults located by line and column) and the guest protocol
 * (eph_proto_parse_body: a frame, an object): the same texts accepted and refused by both,
 * among them the frame fuzzer's finds (tests/fuzz/corpus/frame: a comment, a NUL after the
 * object). */
static void
test_strict_json_one_parser(void **st)
{
  (void)st;
  static const struct {
    const char *text;
    size_t len;     /* 0: strlen */
    int ok;         /* 1 accepted, 0 refused */
    bool trailing;  /* refused for what follows a whole value */
    bool truncated; /* refused as ending inside the value */
    size_t offset;  /* of the fault */
  } cases[] = {
      {"{}", 0, 1, false, false, 0},
      {" {\"a\":1} \t\r\n", 0, 1, false, false, 0},
      {"{\"type\":\"hello\"}\0\0", 18, 0, true, false, 16}, /* crash-nul-after-object */
      {"{\"type\":\"exec\"}//x", 0, 0, true, false, 15},    /* crash-trailing-comment */
      {"{}/*x*/", 0, 0, true, false, 2},
      {"{} \0", 4, 0, true, false, 3},
      {"{}{}", 0, 0, true, false, 2},
      {"{} x", 0, 0, true, false, 3},
      {"{\"a\":1,}", 0, 0, false, false, 7},  /* trailing comma */
      {"{\"a\":'x'}", 0, 0, false, false, 5}, /* a single-quoted value */
      {"{/*c*/}", 0, 0, false, false, 1},     /* a comment inside */
      {"{\"a\":", 0, 0, false, true, 5},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *t = cases[i].text;
    size_t len = cases[i].len ? cases[i].len : strlen(t);
    json_object *v = NULL;
    eph_json_fault_t f;
    int r = eph_json_parse_one(t, len, 0, &v, &f);
    if (r != (cases[i].ok ? 0 : -EBADMSG) || (!cases[i].ok && f.offset != cases[i].offset))
      print_message("case %zu: %d at %zu (%s)\n", i, r, f.offset, f.desc);
    assert_int_equal(r, cases[i].ok ? 0 : -EBADMSG);
    assert_true((v != NULL) == cases[i].ok);
    json_object_put(v);
    if (!cases[i].ok) {
      assert_int_equal(f.trailing, cases[i].trailing);
      assert_int_equal(f.truncated, cases[i].truncated);
      assert_int_equal(f.offset, cases[i].offset);
    }
    /* Both callers agree with it. */
    char why[128] = "";
    assert_int_equal(eph_proto_parse_body(t, len, &v, why, sizeof why), cases[i].ok ? 1 : -EPROTO);
    json_object_put(v);
    if (!cases[i].ok)
      assert_non_null(strstr(why, cases[i].trailing    ? "not exactly one JSON object"
                                  : cases[i].truncated ? "not JSON: truncated"
                                                       : "not JSON: "));
    eph_error_t err = {0};
    v = eph_json_parse_strict(t, len, &err);
    assert_true((v != NULL) == cases[i].ok);
    json_object_put(v);
    if (!cases[i].ok)
      assert_non_null(strstr(err.message, cases[i].trailing
                                              ? "malformed JSON: trailing data at line 1"
                                              : "malformed JSON at line 1"));
  }
  /* What differs stays as it was: the core also wants UTF-8 and takes any value; a frame
   * is an object, its strings not checked here (the guest's fields are, where used). */
  json_object *v = NULL;
  char why[128];
  eph_error_t err = {0};
  assert_null(eph_json_parse_strict("\"\xff\"", 3, &err));
  assert_non_null(strstr(err.message, "column 2: invalid utf-8"));
  assert_int_equal(eph_proto_parse_body("{\"a\":\"\xff\"}", 9, &v, why, sizeof why), 1);
  json_object_put(v);
  v = eph_json_parse_strict("[1]", 3, &err);
  assert_non_null(v);
  json_object_put(v);
  assert_int_equal(eph_proto_parse_body("[1]", 3, &v, why, sizeof why), -EPROTO);
  assert_non_null(strstr(why, "not exactly one JSON object"));
  /* A trailing fault is located where the data starts, past the blanks: line 2 here. */
  err = (eph_error_t){0};
  assert_null(eph_json_parse_strict("{}\n x", 5, &err));
  assert_string_equal(err.message, "malformed JSON: trailing data at line 2, column 2");
}

static void
test_sqlite_errno_agrees(void **st)
{
  (void)st;
  char dir[] = "/tmp/eph-support-test.XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[64];
  snprintf(path, sizeof path, "%s/t.sqlite", dir);
  eph_sqlite_open_options_t so = {.what = "test", .busy_timeout_ms = 100, .owner_only = true};
  sqlite3 *db = NULL;
  eph_error_t err = {0};
  assert_int_equal(eph_sqlite_open(path, &so, &db, &err), 0);
  assert_int_equal(access(path, F_OK), 0);
  assert_int_equal(eph_sqlite_exec(db, path,
                                   "CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER CHECK (v > 0));"
                                   "INSERT INTO t VALUES ('a', 1);",
                                   "schema", &err),
                   0);
  /* A duplicate key: EEXIST for both users (the ledger said EINVAL). */
  assert_int_equal(eph_sqlite_exec(db, path, "INSERT INTO t VALUES ('a', 2);", "dup", &err),
                   -EEXIST);
  assert_non_null(strstr(err.message, "dup"));
  /* A CHECK: EINVAL (a rule of the schema). */
  assert_int_equal(eph_sqlite_exec(db, path, "INSERT INTO t VALUES ('b', 0);", "check", &err),
                   -EINVAL);
  assert_int_equal(eph_sqlite_errno(SQLITE_BUSY), EBUSY);
  assert_int_equal(eph_sqlite_errno(SQLITE_FULL), ENOSPC);
  assert_int_equal(eph_sqlite_errno(SQLITE_IOERR_WRITE), EIO);
  sqlite3_stmt *sts[2] = {NULL, NULL};
  const char *const bad[] = {"SELECT 1", "SELECT nothing FROM nowhere"};
  assert_true(eph_sqlite_prepare_all(db, path, bad, 2, sts, &err) < 0);
  assert_null(sts[0]);
  assert_non_null(strstr(err.message, "nowhere"));
  sqlite3_close(db);
  /* A file that is not a database is refused at open, naming it. */
  char side[80];
  snprintf(side, sizeof side, "%s-wal", path);
  unlink(side);
  snprintf(side, sizeof side, "%s-shm", path);
  unlink(side);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  for (int i = 0; i < 64; i++)
    fputs("this is not an SQLite database but a text file ", f);
  fclose(f);
  assert_true(eph_sqlite_open(path, &so, &db, &err) < 0);
  assert_null(db);
  assert_non_null(strstr(err.message, path));
  unlink(path);
  unlink(side);
  rmdir(dir);
}

static void
test_text_and_format(void **st)
{
  (void)st;
  assert_true(eph_utf8_is_text((const unsigned char *)"h\xc3\xa9", 3));
  assert_false(eph_utf8_is_text((const unsigned char *)"\xc0\xaf", 2)); /* overlong */
  assert_false(eph_utf8_is_text((const unsigned char *)"a\0b", 3));
  assert_int_equal(eph_utf8_clip("h\xc3\xa9", 2), 1);
  char buf[32];
  assert_string_equal(eph_format_dollars(3530, buf, sizeof buf), "$0.00353");
  assert_string_equal(eph_format_dollars(40000, buf, sizeof buf), "$0.04");
  /* Below half a display unit either way is $0.00, without a sign (was -$0.00). */
  assert_string_equal(eph_format_dollars(-4, buf, sizeof buf), "$0.00");
  assert_string_equal(eph_format_dollars(-5, buf, sizeof buf), "-$0.00001");
  /* Shown figures add up: 345 + 39655 of $0.04 is not $0.00035 + $0.03966. */
  char line[64];
  assert_string_equal(eph_format_settled(345, 39655, line, sizeof line),
                      "$0.00035 billed, $0.03965 released");
  assert_string_equal(eph_format_settled(3530, 36470, line, sizeof line),
                      "$0.00353 billed, $0.03647 released");
  assert_string_equal(eph_format_settled(0, 40000, line, sizeof line),
                      "$0.00 billed, $0.04 released");
  int64_t parts[3] = {332, 0, 13}, shown[3];
  eph_dollars_split(parts, shown, 3); /* 345 billed shows $0.00035: the parts add up to it */
  assert_int_equal(shown[0], 330);
  assert_int_equal(shown[1], 0);
  assert_int_equal(shown[2], 20);
  int64_t page[3] = {330, 0, 3200}; /* the product page's $0.00033 · $0.00 · $0.0032 */
  eph_dollars_split(page, shown, 3);
  assert_true(shown[0] == 330 && shown[1] == 0 && shown[2] == 3200);
  int64_t tie[2] = {335, 5}; /* 340: one ten left over, the earlier part on a tie */
  eph_dollars_split(tie, shown, 2);
  assert_true(shown[0] == 340 && shown[1] == 0);
  int64_t neg[2] = {-15, 25}; /* not parts of a total: each rounded on its own */
  eph_dollars_split(neg, shown, 2);
  assert_true(shown[0] == -20 && shown[1] == 30);
  eph_format_iso8601(1764560000123456LL, buf, sizeof buf);
  assert_string_equal(buf, "2025-12-01T03:33:20.123Z");
  json_object *o = json_tokener_parse("{\"a\": \"x\", \"b\": 1}");
  assert_string_equal(eph_json_get_string(o, "a"), "x");
  assert_null(eph_json_get_string(o, "b"));
  assert_null(eph_json_get_string(o, "c"));
  json_object_put(o);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_base64_strict_and_canonical),
      cmocka_unit_test(test_guest_protocol_uses_the_codec),
      cmocka_unit_test(test_strict_json_one_parser),
      cmocka_unit_test(test_sqlite_errno_agrees),
      cmocka_unit_test(test_text_and_format),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
