/* core/live.c: the coalescer behind `output` and `model_delta` events. */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "live.h"
#include "util.h"

typedef struct got {
  int n;
  int stream[4096];
  size_t bytes[4096];
  uint64_t dropped;
  char text[2 * 1024 * 1024];
  size_t len;
} got_t;

static void
collect(void *opaque, int stream, const char *text, size_t bytes, uint64_t dropped_bytes)
{
  got_t *g = opaque;
  assert_true(g->n < 4096);
  g->stream[g->n] = stream;
  g->bytes[g->n] = bytes;
  g->n++;
  if (stream == 0) {
    assert_null(text);
    g->dropped += dropped_bytes;
    return;
  }
  assert_true(bytes > 0 && bytes <= EPH_LIVE_CHUNK_BYTES * 3);
  assert_int_equal(strlen(text), bytes); /* NUL-terminated, no NUL inside */
  memcpy(g->text + g->len, text, bytes);
  g->len += bytes;
  g->text[g->len] = '\0';
}

/* A character cut between two chunks comes out whole, never as U+FFFD. */
static void
test_utf8_cut_by_a_chunk_boundary(void **state)
{
  (void)state;
  got_t *g = calloc(1, sizeof *g);
  eph_live_t l = {0};
  eph_live_begin(&l, 0);
  eph_live_add(&l, 1, "a\xc3", 2, collect, g);
  eph_live_add(&l, 1,
               "\xa9"
               "b",
               2, collect, g);
  eph_live_end(&l, collect, g);
  assert_string_equal(g->text, "a\xc3\xa9"
                               "b");
  free(g);
}

/* Invalid bytes, a NUL, a surrogate and a sequence cut by the command's end: U+FFFD. */
static void
test_invalid_bytes_become_replacement(void **state)
{
  (void)state;
  got_t *g = calloc(1, sizeof *g);
  eph_live_t l = {0};
  eph_live_begin(&l, 0);
  eph_live_add(&l, 2,
               "x\xff"
               "y\0z\xed\xa0\x80"
               "w\xe2\x82",
               11, collect, g);
  eph_live_end(&l, collect, g);
  assert_string_equal(g->text, "x\xef\xbf\xbdy\xef\xbf\xbdz\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbdw"
                               "\xef\xbf\xbd\xef\xbf\xbd");
  for (int i = 0; i < g->n; i++)
    assert_int_equal(g->stream[i], 2);
  free(g);
}

/* Many small chunks within 100 ms make few events of at most 4 KiB, nothing lost. */
static void
test_small_chunks_are_coalesced(void **state)
{
  (void)state;
  got_t *g = calloc(1, sizeof *g);
  eph_live_t l = {0};
  eph_live_begin(&l, 1 << 20);
  int64_t t0 = eph_now_ms();
  for (int i = 0; i < 20000; i++)
    eph_live_add(&l, 1, "x", 1, collect, g);
  eph_live_end(&l, collect, g);
  assert_int_equal(g->len, 20000);
  for (int i = 0; i < g->n; i++)
    assert_true(g->bytes[i] <= EPH_LIVE_CHUNK_BYTES);
  /* one event per 4 KiB, plus one per 100 ms that passed, plus the first and the rest */
  int64_t ms = eph_now_ms() - t0;
  assert_true(g->n <= 20000 / EPH_LIVE_CHUNK_BYTES + 2 + ms / EPH_LIVE_INTERVAL_MS + 1);
  assert_true(g->n < 100);
  free(g);
}

/* Order across streams is kept: a change of stream emits what is pending first. */
static void
test_streams_keep_their_order(void **state)
{
  (void)state;
  got_t *g = calloc(1, sizeof *g);
  eph_live_t l = {0};
  eph_live_begin(&l, 0);
  eph_live_add(&l, 1, "a", 1, collect, g);
  eph_live_add(&l, 1, "b", 1, collect, g);
  eph_live_add(&l, 2, "c", 1, collect, g);
  eph_live_add(&l, 1, "d", 1, collect, g);
  eph_live_end(&l, collect, g);
  assert_string_equal(g->text, "abcd");
  int want[] = {1, 1, 2, 1};
  for (int i = 0, k = 0; i < g->n; i++) { /* "a", "b" may be one event or two */
    while (k < 4 && want[k] != g->stream[i])
      k++;
    assert_true(k < 4);
  }
  assert_int_equal(g->stream[g->n - 1], 1);
  free(g);
}

/* The per-command cap and the per-run cap: the head is shown, then one marker counts the
 * rest; a stream number other than 1 or 2 is ignored. */
static void
test_caps_and_marker(void **state)
{
  (void)state;
  got_t *g = calloc(1, sizeof *g);
  eph_live_t l = {0};
  static char block[64 * 1024];
  memset(block, 'y', sizeof block);
  eph_live_begin(&l, 100);
  eph_live_add(&l, 1, block, 250, collect, g);
  eph_live_add(&l, 3, block, 250, collect, g);
  eph_live_end(&l, collect, g);
  assert_int_equal(g->len, 100);
  assert_int_equal(g->dropped, 150);
  assert_int_equal(g->stream[g->n - 1], 0);

  /* Commands of 64 KiB each: the run shows 1 MiB in all, then only markers. */
  got_t *h = calloc(1, sizeof *h);
  uint64_t dropped = 0;
  for (int c = 0; c < 20; c++) {
    eph_live_begin(&l, sizeof block);
    eph_live_add(&l, 1, block, sizeof block, collect, h);
    eph_live_end(&l, collect, h);
  }
  dropped = h->dropped;
  assert_int_equal(h->len + 100, EPH_LIVE_RUN_CAP_BYTES);
  assert_int_equal(h->len + dropped, 20 * sizeof block);
  /* no output after end: a late chunk is ignored */
  int n = h->n;
  eph_live_add(&l, 1, "late", 4, collect, h);
  assert_int_equal(h->n, n);
  free(g);
  free(h);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_utf8_cut_by_a_chunk_boundary),
      cmocka_unit_test(test_invalid_bytes_become_replacement),
      cmocka_unit_test(test_small_chunks_are_coalesced),
      cmocka_unit_test(test_streams_keep_their_order),
      cmocka_unit_test(test_caps_and_marker),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
