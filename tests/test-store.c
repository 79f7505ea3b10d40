/* Tests of core/store.c on a real SQLite file in a fresh temporary directory, or, when
 * EPH_TEST_DATABASE names a PostgreSQL database (tests/store-pg.test runs this program under
 * tests/with-pg), on that database, emptied before each test: the same contract for both
 * implementations. Where a test claims something is NOT stored (a key, a ZDR payload) it
 * first shows that the same search finds what IS stored, so the search itself is proven to
 * work. Tests of the SQLite file itself (damage, mode) are skipped on PostgreSQL. The cluster
 * operations, hostile values and the admin tables are in tests/test-store-cluster.c, the
 * fixture in tests/store-fixture.c. */
#include "config.h"

#include "sqlite-damage.h"
#include "store-fixture.h"

/* ---------------------------------------------------------------- API keys */

static void
test_keys(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  cleanup_free char *key = NULL, *id = NULL, *key2 = NULL;
  assert_int_equal(eph_store_key_create(f->store, "acme", "ci-deploy-key", &key, &id, &err), 0);
  assert_int_equal(strlen(key), 4 + 48);
  assert_memory_equal(key, "eph_", 4);
  assert_int_equal(strspn(key + 4, "0123456789abcdef"), 48);
  assert_memory_equal(id, "key_", 4);
  assert_int_equal(eph_store_key_create(f->store, "acme", "ci-deploy-key", &key2, NULL, &err),
                   -EEXIST);
  assert_int_equal(eph_store_key_create(f->store, "other", "ci-deploy-key", &key2, NULL, &err), 0);
  assert_string_not_equal(key, key2);

  cleanup_free char *org = NULL, *kid = NULL;
  assert_int_equal(eph_store_key_verify(f->store, key, &org, &kid, &err), 0);
  assert_string_equal(org, "acme");
  assert_string_equal(kid, id);
  /* One changed digit, a truncated key, garbage: the same refusal. */
  char bad[64];
  snprintf(bad, sizeof bad, "%s", key);
  bad[10] = bad[10] == 'a' ? 'b' : 'a';
  assert_int_equal(eph_store_key_verify(f->store, bad, NULL, NULL, &err), -EACCES);
  bad[20] = '\0';
  assert_int_equal(eph_store_key_verify(f->store, bad, NULL, NULL, &err), -EACCES);
  assert_int_equal(eph_store_key_verify(f->store, "Bearer x", NULL, NULL, &err), -EACCES);

  /* Only the hash is on disk: the name (stored in clear) is found by the same search, the
   * key and its random part are not; the hash is. */
  assert_true(stored_contains(f, "ci-deploy-key"));
  assert_false(stored_contains(f, key));
  assert_false(stored_contains(f, key + 4));
  assert_false(stored_contains(f, key + 20));
  char hex[65], stored_hex[65];
  sha(key, hex);
  stored_key_hash(f, id, stored_hex);
  assert_string_equal(stored_hex, hex);

  /* List: never the key. */
  cleanup_json json_object *list = NULL;
  assert_int_equal(eph_store_key_list(f->store, "acme", &list, &err), 0);
  assert_int_equal(json_object_array_length(list), 1);
  const char *text = json_object_to_json_string(list);
  assert_null(strstr(text, key + 4));
  assert_non_null(strstr(text, id));

  /* Revoke: another organisation cannot; by name works; then the key is refused. */
  assert_int_equal(eph_store_key_revoke(f->store, id, "other", &err), -ENOENT);
  assert_int_equal(eph_store_key_verify(f->store, key, NULL, NULL, &err), 0);
  assert_int_equal(eph_store_key_revoke(f->store, "ci-deploy-key", "acme", &err), 0);
  assert_int_equal(eph_store_key_verify(f->store, key, NULL, NULL, &err), -EACCES);
  assert_int_equal(eph_store_key_revoke(f->store, id, "acme", &err), -ENOENT);
  assert_int_equal(eph_store_key_verify(f->store, key2, NULL, NULL, &err), 0);
  json_object_put(list);
  list = NULL;
  assert_int_equal(eph_store_key_list(f->store, "acme", &list, &err), 0);
  json_object *k0 = json_object_array_get_idx(list, 0);
  assert_true(json_object_get_int64(json_object_object_get(k0, "revoked_at_us")) > 0);

  /* Members need an existing organisation. */
  assert_int_equal(eph_store_member_add(f->store, "acme", "alice@example.org", "owner", &err), 0);
  assert_int_equal(eph_store_member_add(f->store, "ghost", "bob", "member", &err), -ENOENT);
  assert_int_equal(eph_store_member_add(f->store, "acme", "bob", "emperor", &err), -EINVAL);
}

/* ---------------------------------------------------------------- runs */

static void
test_runs_and_cursor(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  /* 7 runs of acme, two pairs sharing a timestamp (the cursor must tie-break on id), and
   * one of another organisation. */
  static const int64_t created[] = {1000, 2000, 2000, 3000, 4000, 4000, 5000};
  for (int i = 0; i < 7; i++) {
    char id[40];
    snprintf(id, sizeof id, "run_%032d", i);
    cleanup_json json_object *req = request("hello");
    assert_int_equal(
        eph_store_run_insert(f->store, id, "acme", "queued", created[i], req, false, &err), 0);
  }
  cleanup_json json_object *req = request("x");
  assert_int_equal(
      eph_store_run_insert(f->store, "run_other", "other", "queued", 9999, req, false, &err), 0);
  assert_int_equal(
      eph_store_run_insert(f->store, "run_other", "other", "queued", 1, req, false, &err), -EEXIST);

  cleanup_json json_object *usage = json_tokener_parse("{\"model_calls\":3,\"tokens\":5214}");
  cleanup_json json_object *output = json_object_new_string("2 3 5 7 11");
  assert_int_equal(eph_store_run_update(f->store, "run_00000000000000000000000000000003",
                                        "succeeded", output, usage, &err),
                   0);
  assert_int_equal(eph_store_run_update(f->store, "run_nope", "failed", NULL, NULL, &err), -ENOENT);
  cleanup_json json_object *run = NULL;
  assert_int_equal(
      eph_store_run_get(f->store, "run_00000000000000000000000000000003", "acme", &run, &err), 0);
  assert_string_equal(json_object_get_string(json_object_object_get(run, "status")), "succeeded");
  assert_string_equal(json_object_get_string(json_object_object_get(run, "output")), "2 3 5 7 11");
  assert_int_equal(
      json_object_get_int(json_object_object_get(json_object_object_get(run, "usage"), "tokens")),
      5214);
  assert_string_equal(json_object_get_string(
                          json_object_object_get(json_object_object_get(run, "request"), "prompt")),
                      "hello");
  assert_int_equal(json_object_get_int64(json_object_object_get(run, "created_at_us")), 3000);
  /* Status-only update keeps output and usage. */
  assert_int_equal(eph_store_run_update(f->store, "run_00000000000000000000000000000003",
                                        "archived", NULL, NULL, &err),
                   0);
  json_object_put(run);
  run = NULL;
  assert_int_equal(
      eph_store_run_get(f->store, "run_00000000000000000000000000000003", NULL, &run, &err), 0);
  assert_string_equal(json_object_get_string(json_object_object_get(run, "output")), "2 3 5 7 11");
  /* Another organisation's run does not exist for the caller. */
  json_object *none = NULL;
  assert_int_equal(eph_store_run_get(f->store, "run_other", "acme", &none, &err), -ENOENT);

  /* Pages of 3: expected order is created desc, id desc. */
  static const int expect[] = {6, 5, 4, 3, 2, 1, 0};
  int seen = 0, pages = 0;
  cleanup_free char *cursor = NULL;
  do {
    json_object *page = NULL;
    char *next = NULL;
    assert_int_equal(eph_store_run_list(f->store, "acme", 3, cursor, &page, &next, &err), 0);
    pages++;
    for (size_t i = 0; i < json_object_array_length(page); i++) {
      char id[40];
      snprintf(id, sizeof id, "run_%032d", expect[seen++]);
      json_object *r = json_object_array_get_idx(page, i);
      assert_string_equal(json_object_get_string(json_object_object_get(r, "id")), id);
      assert_null(json_object_object_get(r, "request")); /* lists carry no content */
    }
    json_object_put(page);
    free(cursor);
    cursor = next;
  } while (cursor);
  assert_int_equal(seen, 7);
  assert_int_equal(pages, 3);

  json_object *page = NULL;
  char *next = NULL;
  assert_int_equal(eph_store_run_list(f->store, "acme", 3, "zz", &page, &next, &err), -EINVAL);
  assert_int_equal(eph_store_run_list(f->store, "acme", 3, "3132", &page, &next, &err), -EINVAL);
  assert_int_equal(eph_store_run_list(f->store, "acme", 5000, NULL, &page, &next, &err), -EINVAL);
  assert_int_equal(eph_store_run_list(f->store, "nobody", 0, NULL, &page, &next, &err), 0);
  assert_int_equal(json_object_array_length(page), 0);
  assert_null(next);
  json_object_put(page);
}

static void
test_events_since(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  cleanup_json json_object *req = request("p");
  assert_int_equal(eph_store_run_insert(f->store, "run_ev", "acme", "running", 1, req, false, &err),
                   0);
  for (int i = 0; i < 10; i++) {
    cleanup_json json_object *data = json_object_new_object();
    json_object_object_add(data, "i", json_object_new_int(i));
    char text[32];
    snprintf(text, sizeof text, "event %d", i);
    assert_int_equal(eph_store_event_append(f->store, "run_ev", i, 100 * i, "Shell", "tool_call",
                                            text, data, &err),
                     0);
  }
  assert_int_equal(
      eph_store_event_append(f->store, "run_ev", 3, 0, "Shell", "x", "dup", NULL, &err), -EEXIST);
  assert_int_equal(
      eph_store_event_append(f->store, "run_missing", 0, 0, "Shell", "x", "t", NULL, &err),
      -ENOENT);
  cleanup_json json_object *all = NULL, *tail = NULL, *two = NULL;
  assert_int_equal(eph_store_events_since(f->store, "run_ev", -1, 0, &all, &err), 0);
  assert_int_equal(json_object_array_length(all), 10);
  assert_int_equal(eph_store_events_since(f->store, "run_ev", 6, 0, &tail, &err), 0);
  assert_int_equal(json_object_array_length(tail), 3);
  json_object *e = json_object_array_get_idx(tail, 0);
  assert_int_equal(json_object_get_int(json_object_object_get(e, "seq")), 7);
  assert_int_equal(json_object_get_int(json_object_object_get(e, "t_ms")), 700);
  assert_string_equal(json_object_get_string(json_object_object_get(e, "text")), "event 7");
  assert_int_equal(
      json_object_get_int(json_object_object_get(json_object_object_get(e, "data"), "i")), 7);
  assert_int_equal(eph_store_events_since(f->store, "run_ev", 2, 2, &two, &err), 0);
  assert_int_equal(json_object_array_length(two), 2);
  assert_int_equal(
      json_object_get_int(json_object_object_get(json_object_array_get_idx(two, 1), "seq")), 4);
}

/* A batch of events (core/evqueue.c's commit): one transaction, all of it or none; on
 * PostgreSQL, which stores (and announces) each event as it comes, no batch at all. */
static void
test_events_batch(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  cleanup_json json_object *req = request("p");
  assert_int_equal(eph_store_run_insert(f->store, "run_b", "acme", "running", 1, req, false, &err),
                   0);
  eph_store_event_t evs[3] = {
      {.seq = 1,
       .t_ms = 10,
       .source = "Shell",
       .kind = "tool_call",
       .text = "$ true",
       .data_json = "{\"n\":1}"},
      {.seq = 2, .t_ms = 20, .source = "Shell", .kind = "tool_result", .text = NULL},
      {.seq = 3, .t_ms = 30, .source = "Shell", .kind = "tool_call", .text = "$ false"},
  };
  if (f->pg) {
    assert_false(eph_store_groups_events(f->store));
    assert_int_equal(eph_store_events_append(f->store, "run_b", evs, 3, &err), -ENOTSUP);
    return;
  }
  assert_true(eph_store_groups_events(f->store));
  assert_int_equal(eph_store_events_append(f->store, "run_b", evs, 3, &err), 0);
  /* Seq 4 is new, 2 is stored already: the whole batch is refused, 4 is not stored. */
  eph_store_event_t dup[2] = {
      {.seq = 4, .t_ms = 40, .source = "Shell", .kind = "tool_result", .text = "ok"},
      {.seq = 2, .t_ms = 50, .source = "Shell", .kind = "tool_result", .text = "again"},
  };
  assert_int_equal(eph_store_events_append(f->store, "run_b", dup, 2, &err), -EEXIST);
  assert_int_equal(eph_store_events_append(f->store, "run_nobody", evs, 1, &err), -ENOENT);
  eph_store_event_t bad = {.seq = 5, .source = "", .kind = "x"};
  assert_int_equal(eph_store_events_append(f->store, "run_b", &bad, 1, &err), -EINVAL);
  cleanup_json json_object *all = NULL;
  assert_int_equal(eph_store_events_since(f->store, "run_b", -1, 0, &all, &err), 0);
  assert_int_equal(json_object_array_length(all), 3);
  json_object *e1 = json_object_array_get_idx(all, 0), *e2 = json_object_array_get_idx(all, 1);
  assert_int_equal(
      json_object_get_int(json_object_object_get(json_object_object_get(e1, "data"), "n")), 1);
  assert_string_equal(json_object_get_string(json_object_object_get(e2, "text")), "");
  assert_false(json_object_object_get_ex(e2, "data", NULL));
}

/* ---------------------------------------------------------------- idempotency */

static void
test_idempotency_same_and_different_body(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  char h1[65], h2[65];
  sha("{\"prompt\":\"a\"}", h1);
  sha("{\"prompt\":\"b\"}", h2);
  assert_string_not_equal(h1, h2);
  cleanup_free char *existing = NULL;
  assert_int_equal(eph_store_idem_claim(f->store, "acme", "k-1", h1, "run_first", &existing, &err),
                   0);
  assert_null(existing);
  assert_int_equal(eph_store_idem_claim(f->store, "acme", "k-1", h1, "run_second", &existing, &err),
                   1);
  assert_string_equal(existing, "run_first");
  err = (eph_error_t){0};
  char *unused = NULL;
  assert_int_equal(eph_store_idem_claim(f->store, "acme", "k-1", h2, "run_third", &unused, &err),
                   -EBUSY);
  assert_null(unused);
  assert_non_null(strstr(err.message, "different request body"));
  /* Keys are per organisation. */
  assert_int_equal(eph_store_idem_claim(f->store, "other", "k-1", h2, "run_o", &unused, &err), 0);
  assert_int_equal(eph_store_idem_claim(f->store, "acme", "k-1", "XYZ", "run_x", &unused, &err),
                   -EINVAL);
  assert_null(unused);
}

#define CLAIMERS 50

typedef struct claim_arg {
  eph_store_t *store;
  const char *hash;
  int index;
  int result;
  char *existing;
  pthread_barrier_t *barrier;
} claim_arg_t;

static void *
claimer(void *p)
{
  claim_arg_t *a = p;
  char run[32];
  snprintf(run, sizeof run, "run_claim_%02d", a->index);
  eph_error_t err = {0};
  pthread_barrier_wait(a->barrier);
  a->result = eph_store_idem_claim(a->store, "acme", "same-key", a->hash, run, &a->existing, &err);
  return NULL;
}

/* CLAIMERS threads claiming one key at once, thread i on stores[i] as run_claim_<i>: one
 * winner, every other claim answers with the winner's run. */
static void
race_claims(eph_store_t *const *stores, const char *hash)
{
  pthread_t th[CLAIMERS];
  claim_arg_t args[CLAIMERS];
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, CLAIMERS);
  for (int i = 0; i < CLAIMERS; i++) {
    args[i] = (claim_arg_t){.store = stores[i], .hash = hash, .index = i, .barrier = &barrier};
    assert_int_equal(pthread_create(&th[i], NULL, claimer, &args[i]), 0);
  }
  for (int i = 0; i < CLAIMERS; i++)
    pthread_join(th[i], NULL);
  pthread_barrier_destroy(&barrier);
  int winners = 0, winner = -1;
  for (int i = 0; i < CLAIMERS; i++) {
    assert_true(args[i].result == 0 || args[i].result == 1);
    if (args[i].result == 0) {
      winners++;
      winner = i;
    }
  }
  assert_int_equal(winners, 1);
  char won[32];
  snprintf(won, sizeof won, "run_claim_%02d", winner);
  for (int i = 0; i < CLAIMERS; i++) {
    if (i != winner)
      assert_string_equal(args[i].existing, won);
    free(args[i].existing);
  }
}

static void
test_idempotency_concurrent_claims(void **st)
{
  fixture_t *f = *st;
  char h[65];
  sha("{\"prompt\":\"race\"}", h);
  eph_store_t *stores[CLAIMERS];
  for (int i = 0; i < CLAIMERS; i++)
    stores[i] = f->store;
  race_claims(stores, h);
}

/* A second store on the same file (another process's view) sees the claim: the claim is
 * in the file, not in memory. */
static void
test_idempotency_across_connections(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  char h[65];
  sha("body", h);
  eph_store_t *second = NULL;
  assert_int_equal(eph_store_open(f->path, NULL, &second, &err), 0);
  cleanup_free char *existing = NULL;
  assert_int_equal(eph_store_idem_claim(f->store, "acme", "k", h, "run_a", &existing, &err), 0);
  assert_int_equal(eph_store_idem_claim(second, "acme", "k", h, "run_b", &existing, &err), 1);
  assert_string_equal(existing, "run_a");
  eph_store_close(second);
  eph_store_options_t bad = {.idempotency_hours = 1};
  assert_int_equal(eph_store_open(f->path, &bad, &second, &err), -EINVAL);
}

/* ---------------------------------------------------------------- retention */

static void
test_purge(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  int64_t now = eph_wall_us(), day = 86400LL * 1000000;
  cleanup_json json_object *req = request("p");
  assert_int_equal(eph_store_run_insert(f->store, "run_old", "acme", "succeeded", now - 31 * day,
                                        req, false, &err),
                   0);
  assert_int_equal(eph_store_run_insert(f->store, "run_new", "acme", "succeeded", now - 29 * day,
                                        req, false, &err),
                   0);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(
        eph_store_event_append(f->store, "run_old", i, i, "Shell", "k", "t", NULL, &err), 0);
    assert_int_equal(
        eph_store_event_append(f->store, "run_new", i, i, "Shell", "k", "t", NULL, &err), 0);
  }
  char h[65];
  sha("x", h);
  char *existing = NULL;
  assert_int_equal(eph_store_idem_claim(f->store, "acme", "k", h, "run_new", &existing, &err), 0);

  assert_int_equal(eph_store_purge(f->store, 30, &err), 1);
  json_object *gone = NULL;
  assert_int_equal(eph_store_run_get(f->store, "run_old", NULL, &gone, &err), -ENOENT);
  cleanup_json json_object *kept = NULL, *ev_old = NULL, *ev_new = NULL;
  assert_int_equal(eph_store_run_get(f->store, "run_new", NULL, &kept, &err), 0);
  assert_int_equal(eph_store_events_since(f->store, "run_old", -1, 0, &ev_old, &err), 0);
  assert_int_equal(json_object_array_length(ev_old), 0);
  assert_int_equal(eph_store_events_since(f->store, "run_new", -1, 0, &ev_new, &err), 0);
  assert_int_equal(json_object_array_length(ev_new), 3);
  /* The day-old idempotency key is still remembered. */
  assert_int_equal(eph_store_idem_claim(f->store, "acme", "k", h, "run_z", &existing, &err), 1);
  free(existing);
  assert_int_equal(eph_store_purge(f->store, 30, &err), 0);
  assert_int_equal(eph_store_purge(f->store, 0, &err), -EINVAL);

  /* An idempotency key older than the window is purged and may be claimed afresh: age it
   * through SQL (the API has no clock to turn). */
  /* 25 hours in micros, one literal: PostgreSQL multiplies int4 literals as int4. */
  assert_int_equal(sql_exec(f, "UPDATE idempotency SET created_at_us = created_at_us - "
                               "90000000000"),
                   0);
  assert_int_equal(eph_store_idem_claim(f->store, "acme", "k", h, "run_fresh", &existing, &err), 0);
}

/* ---------------------------------------------------------------- zero data retention */

static void
test_zdr_payloads_not_stored(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  cleanup_json json_object *open_req = request("VISIBLE_PROMPT_MARKER");
  cleanup_json json_object *zdr_req = request("SECRET_PROMPT_MARKER");
  assert_int_equal(
      eph_store_run_insert(f->store, "run_open", "acme", "running", 1, open_req, false, &err), 0);
  assert_int_equal(
      eph_store_run_insert(f->store, "run_zdr", "acme", "running", 2, zdr_req, true, &err), 0);
  cleanup_json json_object *d1 = json_tokener_parse("{\"stdout\":\"VISIBLE_DATA_MARKER\"}");
  cleanup_json json_object *d2 = json_tokener_parse("{\"stdout\":\"SECRET_DATA_MARKER\"}");
  assert_int_equal(eph_store_event_append(f->store, "run_open", 0, 5, "Shell", "tool_result",
                                          "ran a command", d1, &err),
                   0);
  assert_int_equal(eph_store_event_append(f->store, "run_zdr", 0, 5, "Shell", "tool_result",
                                          "ran a command", d2, &err),
                   0);
  cleanup_json json_object *o1 = json_object_new_string("VISIBLE_OUTPUT_MARKER");
  cleanup_json json_object *o2 = json_object_new_string("SECRET_OUTPUT_MARKER");
  cleanup_json json_object *usage = json_tokener_parse("{\"tokens\":5214}");
  assert_int_equal(eph_store_run_update(f->store, "run_open", "succeeded", o1, usage, &err), 0);
  assert_int_equal(eph_store_run_update(f->store, "run_zdr", "succeeded", o2, usage, &err), 0);

  assert_true(stored_contains(f, "VISIBLE_PROMPT_MARKER"));
  assert_true(stored_contains(f, "VISIBLE_DATA_MARKER"));
  assert_true(stored_contains(f, "VISIBLE_OUTPUT_MARKER"));
  assert_false(stored_contains(f, "SECRET_PROMPT_MARKER"));
  assert_false(stored_contains(f, "SECRET_DATA_MARKER"));
  assert_false(stored_contains(f, "SECRET_OUTPUT_MARKER"));

  /* What ZDR keeps: the permission table, budget, usage, the event skeleton. */
  cleanup_json json_object *run = NULL, *events = NULL;
  assert_int_equal(eph_store_run_get(f->store, "run_zdr", "acme", &run, &err), 0);
  json_object *req = json_object_object_get(run, "request");
  assert_null(json_object_object_get(req, "prompt"));
  assert_int_equal(json_object_get_int(json_object_object_get(req, "max_cost_micros")), 40000);
  assert_true(json_object_get_boolean(json_object_object_get(req, "shell")));
  assert_null(json_object_object_get(run, "output"));
  assert_int_equal(
      json_object_get_int(json_object_object_get(json_object_object_get(run, "usage"), "tokens")),
      5214);
  assert_true(json_object_get_boolean(json_object_object_get(run, "zero_data_retention")));
  assert_int_equal(eph_store_events_since(f->store, "run_zdr", -1, 0, &events, &err), 0);
  assert_int_equal(json_object_array_length(events), 1);
  json_object *e = json_object_array_get_idx(events, 0);
  assert_null(json_object_object_get(e, "data"));
  assert_string_equal(json_object_get_string(json_object_object_get(e, "kind")), "tool_result");

  /* The schema refuses a payload for a ZDR run even from a writer that bypasses the API. */
  assert_int_equal(sql_exec(f, "INSERT INTO events(run_id, seq, t_ms, source, kind, text, data)"
                               " VALUES ('run_zdr', 1, 0, 's', 'k', 't', '{}')"),
                   -1);
  /* ... while the same insert for an ordinary run passes: the refusal is the trigger's. */
  assert_int_equal(sql_exec(f, "INSERT INTO events(run_id, seq, t_ms, source, kind, text, data)"
                               " VALUES ('run_open', 1, 0, 's', 'k', 't', '{}')"),
                   0);
}

static void
test_schema_version(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
#ifdef HAVE_LIBPQ
  if (f->pg) {
    PGresult *res = pg_query(f, "SELECT version FROM eph_schema", NULL, NULL, true);
    assert_int_equal(PQntuples(res), 1);
    int v = atoi(PQgetvalue(res, 0, 0));
    PQclear(res);
    assert_true(v >= 1);
    eph_store_close(f->store);
    f->store = NULL;
    assert_int_equal(eph_store_open(f->path, NULL, &f->store, &err), 0);
    eph_store_close(f->store);
    f->store = NULL;
    char sql[64];
    snprintf(sql, sizeof sql, "UPDATE eph_schema SET version = %d", v + 1);
    assert_int_equal(sql_exec(f, sql), 0);
    assert_int_equal(eph_store_open(f->path, NULL, &f->store, &err), -EPH_E_CONFIG);
    assert_non_null(strstr(err.message, "newer"));
    assert_null(f->store);
    return;
  }
#endif
  eph_store_close(f->store);
  f->store = NULL;
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open(f->path, &db), SQLITE_OK);
  sqlite3_stmt *s = NULL;
  assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &s, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  int v = sqlite3_column_int(s, 0);
  sqlite3_finalize(s);
  assert_true(v >= 1);
  struct stat sb;
  assert_int_equal(stat(f->path, &sb), 0);
  assert_int_equal(sb.st_mode & 0777, 0600);
  /* Reopening an up-to-date file migrates nothing and works. */
  assert_int_equal(eph_store_open(f->path, NULL, &f->store, &err), 0);
  eph_store_close(f->store);
  f->store = NULL;
  /* A file from a newer version is refused, untouched. */
  char sql[64];
  snprintf(sql, sizeof sql, "PRAGMA user_version = %d", v + 1);
  assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(db);
  assert_int_equal(eph_store_open(f->path, NULL, &f->store, &err), -EPH_E_CONFIG);
  assert_non_null(strstr(err.message, "newer"));
  assert_null(f->store);
}

/* A damaged API-key page: the store refuses to open naming the file (before: it opened,
 * and key checks failed as if the key did not exist: every request 401, nothing logged).
 * A sound store answers the write probe and reports no fault. */
static void
test_damaged_file_refused(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  char *key = NULL;
  assert_int_equal(eph_store_key_create(f->store, "acme", "ci", &key, NULL, &err), 0);
  free(key);
  assert_int_equal(eph_store_probe(f->store, &err), 0);
  assert_false(eph_store_fault(f->store, NULL, 0));
  eph_store_close(f->store);
  f->store = NULL;
  damage_root_page(f->path, "api_keys", false);
  err = (eph_error_t){0};
  assert_int_equal(eph_store_open(f->path, NULL, &f->store, &err), -EIO);
  assert_null(f->store);
  assert_non_null(strstr(err.message, f->path));
  assert_non_null(strstr(err.message, "damaged"));
}

/* A page damaged while the store is open (found by a key check, not at open): the check
 * fails with -EIO, not the -EACCES of an unknown key, and the fault stays reported (health
 * says degraded) even after writes elsewhere in the file succeed. */
static void
test_damage_found_while_open_is_sticky(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  char *key = NULL;
  assert_int_equal(eph_store_key_create(f->store, "acme", "ci", &key, NULL, &err), 0);
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open_v2(f->path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  /* A write from this connection makes the store's connection drop its page cache; the
   * checkpoint moves every page into the main file, where the damage goes. */
  assert_int_equal(sqlite3_exec(db,
                                "INSERT INTO probe(id, t_us) VALUES (1, 1)"
                                " ON CONFLICT(id) DO UPDATE SET t_us = t_us + 1;"
                                "PRAGMA wal_checkpoint(TRUNCATE);",
                                NULL, NULL, NULL),
                   SQLITE_OK);
  sqlite3_close(db);
  damage_root_page(f->path, "api_keys", false);
  assert_false(eph_store_fault(f->store, NULL, 0));
  err = (eph_error_t){0};
  assert_int_equal(eph_store_key_verify(f->store, key, NULL, NULL, &err), -EIO);
  free(key);
  char why[512];
  assert_true(eph_store_fault(f->store, why, sizeof why));
  assert_non_null(strstr(why, f->path));
  eph_store_probe(f->store, &err); /* a write elsewhere proves nothing about that page */
  assert_true(eph_store_fault(f->store, NULL, 0));
}

/* Separate connections (as separate nodes would have) claiming one key at once: one
 * winner, every other claim answers with its run. */
static void
test_idempotency_concurrent_claims_separate_connections(void **st)
{
  fixture_t *f = *st;
  char h[65];
  sha("{\"prompt\":\"nodes\"}", h);
  eph_store_t *stores[CLAIMERS];
  for (int i = 0; i < CLAIMERS; i++) {
    eph_error_t err = {0};
    if (eph_store_open(f->path, NULL, &stores[i], &err) < 0)
      fail_msg("%s", err.message);
  }
  race_claims(stores, h);
  for (int i = 0; i < CLAIMERS; i++)
    eph_store_close(stores[i]);
}

typedef struct opener_arg {
  const char *path;
  pthread_barrier_t *barrier;
  int result;
  char message[sizeof((eph_error_t *)0)->message];
} opener_arg_t;

static void *
opener(void *p)
{
  opener_arg_t *a = p;
  eph_store_t *s = NULL;
  eph_error_t err = {0};
  pthread_barrier_wait(a->barrier);
  a->result = eph_store_open(a->path, NULL, &s, &err);
  snprintf(a->message, sizeof a->message, "%s", err.message);
  eph_store_close(s);
  return NULL;
}

/* Several nodes starting at once on an empty database: every one opens, the schema is
 * created once (on PostgreSQL: serialised by the advisory lock; without it the concurrent
 * CREATE TABLEs fail). */
static void
test_concurrent_first_open(void **st)
{
  fixture_t *f = *st;
  eph_store_close(f->store);
  f->store = NULL;
  if (f->pg)
    assert_int_equal(sql_exec(f, "DROP SCHEMA public CASCADE; CREATE SCHEMA public"), 0);
  else
    assert_int_equal(unlink(f->path), 0);
  enum { OPENERS = 6 };
  pthread_t th[OPENERS];
  opener_arg_t args[OPENERS];
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, OPENERS);
  for (int i = 0; i < OPENERS; i++) {
    args[i] = (opener_arg_t){.path = f->path, .barrier = &barrier};
    assert_int_equal(pthread_create(&th[i], NULL, opener, &args[i]), 0);
  }
  for (int i = 0; i < OPENERS; i++)
    pthread_join(th[i], NULL);
  pthread_barrier_destroy(&barrier);
  for (int i = 0; i < OPENERS; i++)
    if (args[i].result != 0)
      fail_msg("opener %d: %d %s", i, args[i].result, args[i].message);
  eph_error_t err = {0};
  assert_int_equal(eph_store_open(f->path, NULL, &f->store, &err), 0);
  cleanup_free char *key = NULL;
  assert_int_equal(eph_store_key_create(f->store, "acme", "after", &key, NULL, &err), 0);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_keys, setup, teardown),
      cmocka_unit_test_setup_teardown(test_runs_and_cursor, setup, teardown),
      cmocka_unit_test_setup_teardown(test_events_since, setup, teardown),
      cmocka_unit_test_setup_teardown(test_events_batch, setup, teardown),
      cmocka_unit_test_setup_teardown(test_idempotency_same_and_different_body, setup, teardown),
      cmocka_unit_test_setup_teardown(test_idempotency_concurrent_claims, setup, teardown),
      cmocka_unit_test_setup_teardown(test_idempotency_across_connections, setup, teardown),
      cmocka_unit_test_setup_teardown(test_purge, setup, teardown),
      cmocka_unit_test_setup_teardown(test_zdr_payloads_not_stored, setup, teardown),
      cmocka_unit_test_setup_teardown(test_schema_version, setup, teardown),
      cmocka_unit_test_setup_teardown(test_idempotency_concurrent_claims_separate_connections,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_concurrent_first_open, setup, teardown),
      cmocka_unit_test_setup_teardown(test_target_kind_and_password_hidden, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cancel_requests, setup, teardown),
      cmocka_unit_test_setup_teardown(test_leases, setup, teardown),
      cmocka_unit_test_setup_teardown(test_queue, setup, teardown),
      cmocka_unit_test_setup_teardown(test_hostile_values, setup, teardown),
      cmocka_unit_test_setup_teardown(test_admin_keys_audit_usage, setup, teardown),
      /* Properties of the SQLite file itself: last, left out on PostgreSQL. */
      cmocka_unit_test_setup_teardown(test_damaged_file_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_damage_found_while_open_is_sticky, setup, teardown),
  };
  const size_t sqlite_only = 2, all = sizeof tests / sizeof tests[0];
  const char *db = getenv("EPH_TEST_DATABASE");
  if (db && *db)
    return _cmocka_run_group_tests("store (PostgreSQL)", tests, all - sqlite_only, NULL, NULL);
  return _cmocka_run_group_tests("store (SQLite)", tests, all, NULL, NULL);
}
