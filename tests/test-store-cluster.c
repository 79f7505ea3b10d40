/* The store's cluster operations (cancel requests, leases, the shared queue: -ENOTSUP on
 * SQLite), hostile values, the admin tables and the PostgreSQL target's hiding of a
 * password; the rest of its contract is tests/test-store.c's (which runs these too). */
#include "config.h"

#include "store-fixture.h"

/* Cancel requests (a cluster's way to reach the node executing a run): only for a run that
 * exists, idempotent, listed while the run is queued or running, gone once it ended. SQLite
 * has no cluster: -ENOTSUP. */
void
test_cancel_requests(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  cleanup_json json_object *req = request("c");
  if (!f->pg) {
    assert_int_equal(eph_store_cancel_request(f->store, "run_x", &err), -ENOTSUP);
    return;
  }
  assert_int_equal(
      eph_store_run_insert(f->store, "run_live", "acme", "running", 1, req, false, &err), 0);
  assert_int_equal(
      eph_store_run_insert(f->store, "run_other", "acme", "running", 2, req, false, &err), 0);
  assert_int_equal(eph_store_cancel_request(f->store, "run_nope", &err), -ENOENT);
  assert_int_equal(eph_store_cancel_request(f->store, "run_live", &err), 0);
  assert_int_equal(eph_store_cancel_request(f->store, "run_live", &err), 0);
  cleanup_json json_object *pending = NULL, *after = NULL;
  assert_int_equal(eph_store_cancels_pending(f->store, &pending, &err), 0);
  assert_int_equal(json_object_array_length(pending), 1);
  assert_string_equal(json_object_get_string(json_object_array_get_idx(pending, 0)), "run_live");
  assert_int_equal(eph_store_run_update(f->store, "run_live", "cancelled", NULL, NULL, &err), 0);
  assert_int_equal(eph_store_cancels_pending(f->store, &after, &err), 0);
  assert_int_equal(json_object_array_length(after), 0);
}

#ifdef HAVE_LIBPQ
typedef struct taker_arg {
  eph_store_t *store;
  pthread_barrier_t *barrier;
  int result;
  json_object *taken;
} taker_arg_t;

static void *
taker(void *p)
{
  taker_arg_t *a = p;
  eph_error_t err = {0};
  pthread_barrier_wait(a->barrier);
  a->result = eph_store_leases_take_expired(a->store, &a->taken, &err);
  return NULL;
}
#endif

/* Leases: a run inserted by a node carries it; renewal by another node does nothing; once
 * expired, several nodes taking over at once: exactly one gets the run. Without a node or
 * on SQLite: -ENOTSUP. */
void
test_leases(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  cleanup_json json_object *none = NULL, *ids = json_tokener_parse("[\"run_l\"]");
  assert_int_equal(eph_store_leases_take_expired(f->store, &none, &err), -ENOTSUP);
  if (!f->pg)
    return;
#ifdef HAVE_LIBPQ
  enum { TAKERS = 6 };
  eph_store_t *nodes[TAKERS];
  for (int i = 0; i < TAKERS; i++) {
    char name[16];
    snprintf(name, sizeof name, "n%d", i);
    eph_store_options_t o = {.node_name = name, .lease_seconds = 2};
    if (eph_store_open(f->path, &o, &nodes[i], &err) < 0)
      fail_msg("%s", err.message);
  }
  cleanup_json json_object *req = request("l");
  assert_int_equal(eph_store_run_insert(nodes[0], "run_l", "acme", "running", 1, req, false, &err),
                   0);
  PGresult *res = pg_query(f,
                           "SELECT node, lease_expires_us > (extract(epoch FROM now())"
                           " * 1000000)::bigint FROM runs WHERE id = 'run_l'",
                           NULL, NULL, true);
  assert_string_equal(PQgetvalue(res, 0, 0), "n0");
  assert_string_equal(PQgetvalue(res, 0, 1), "t");
  PQclear(res);
  /* Not expired: nobody takes it. */
  cleanup_json json_object *early = NULL;
  assert_int_equal(eph_store_leases_take_expired(nodes[1], &early, &err), 0);
  assert_int_equal(json_object_array_length(early), 0);
  /* Expired (the node stopped renewing): a renewal by another node does not revive it. */
  assert_int_equal(sql_exec(f, "UPDATE runs SET lease_expires_us = 1 WHERE id = 'run_l'"), 0);
  assert_int_equal(eph_store_leases_renew(nodes[2], ids, &err), 0);
  pthread_t th[TAKERS];
  taker_arg_t args[TAKERS];
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, TAKERS);
  for (int i = 0; i < TAKERS; i++) {
    args[i] = (taker_arg_t){.store = nodes[i], .barrier = &barrier};
    assert_int_equal(pthread_create(&th[i], NULL, taker, &args[i]), 0);
  }
  int winners = 0, winner = -1;
  for (int i = 0; i < TAKERS; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(args[i].result, 0);
    size_t n = json_object_array_length(args[i].taken);
    if (n == 1) {
      winners++;
      winner = i;
      assert_string_equal(json_object_get_string(json_object_array_get_idx(args[i].taken, 0)),
                          "run_l");
    } else {
      assert_int_equal(n, 0);
    }
    json_object_put(args[i].taken);
  }
  pthread_barrier_destroy(&barrier);
  assert_int_equal(winners, 1);
  /* The taker now holds a fresh lease; the old node's renewal no longer applies. */
  char want[16];
  snprintf(want, sizeof want, "n%d", winner);
  res = pg_query(f, "SELECT node FROM runs WHERE id = 'run_l'", NULL, NULL, true);
  assert_string_equal(PQgetvalue(res, 0, 0), want);
  PQclear(res);
  /* The old node (stalled past its lease, then resumed) writes nothing any more: neither
   * an event nor its row (-ESTALE naming the holder); the taker writes both. */
  int old = winner == 0 ? 1 : 0; /* n0 inserted it, but any loser is "not the holder" */
  assert_int_equal(
      eph_store_event_append(nodes[old], "run_l", 7, 1, "Failed", "ended", "late", NULL, &err),
      -ESTALE);
  assert_non_null(strstr(err.message, want));
  assert_int_equal(eph_store_run_update(nodes[old], "run_l", "succeeded", NULL, NULL, &err),
                   -ESTALE);
  res = pg_query(f,
                 "SELECT status, (SELECT count(*) FROM events WHERE run_id = 'run_l') FROM runs"
                 " WHERE id = 'run_l'",
                 NULL, NULL, true);
  assert_string_equal(PQgetvalue(res, 0, 0), "running");
  assert_string_equal(PQgetvalue(res, 0, 1), "0");
  PQclear(res);
  /* The holder writes; so does a store without a node name (the CLI: no leases, no fence);
   * an unknown run is still -ENOENT. */
  assert_int_equal(
      eph_store_event_append(nodes[winner], "run_l", 7, 1, "Failed", "ended", "x", NULL, &err), 0);
  assert_int_equal(eph_store_run_update(f->store, "run_l", NULL, NULL, NULL, &err), 0);
  assert_int_equal(eph_store_run_update(nodes[old], "run_none", "failed", NULL, NULL, &err),
                   -ENOENT);
  /* Once ended, an expired lease is nobody's business. */
  assert_int_equal(eph_store_run_update(nodes[winner], "run_l", "failed", NULL, NULL, &err), 0);
  assert_int_equal(sql_exec(f, "UPDATE runs SET lease_expires_us = 1 WHERE id = 'run_l'"), 0);
  cleanup_json json_object *after = NULL;
  assert_int_equal(eph_store_leases_take_expired(nodes[1], &after, &err), 0);
  assert_int_equal(json_object_array_length(after), 0);
  /* An ended run's record completed by another node (cluster_orphans.c): it takes the row,
   * once; the previous holder is fenced from then on. A running run is not taken so. */
  assert_int_equal(eph_store_run_take_ended(nodes[old], "run_l", &err), 1);
  assert_int_equal(eph_store_run_take_ended(nodes[old], "run_l", &err), 0);
  assert_int_equal(eph_store_run_update(nodes[winner], "run_l", "failed", NULL, NULL, &err),
                   -ESTALE);
  assert_int_equal(eph_store_run_insert(nodes[0], "run_l2", "acme", "running", 1, req, false, &err),
                   0);
  assert_int_equal(eph_store_run_take_ended(nodes[1], "run_l2", &err), 0);
  assert_int_equal(eph_store_run_take_ended(f->store, "run_l2", &err), -ENOTSUP);
  for (int i = 0; i < TAKERS; i++)
    eph_store_close(nodes[i]);
#endif
}

#ifdef HAVE_LIBPQ
typedef struct queue_arg {
  eph_store_t *store;
  pthread_barrier_t *barrier;
  const char *run_id; /* push this one, or claim when NULL */
  int max_queued;
  int result;
  json_object *claimed;
} queue_arg_t;

static void *
queue_worker(void *p)
{
  queue_arg_t *a = p;
  eph_error_t err = {0};
  pthread_barrier_wait(a->barrier);
  a->result = a->run_id ? eph_store_queue_push(a->store, a->run_id, 7, false, a->max_queued, &err)
                        : eph_store_queue_claim(a->store, &a->claimed, &err);
  return NULL;
}

/* Runs all threads of args at once (a barrier); joins them. */
static void
queue_race(queue_arg_t *args, int n)
{
  pthread_t th[16];
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, (unsigned)n);
  for (int i = 0; i < n; i++) {
    args[i].barrier = &barrier;
    assert_int_equal(pthread_create(&th[i], NULL, queue_worker, &args[i]), 0);
  }
  for (int i = 0; i < n; i++)
    pthread_join(th[i], NULL);
  pthread_barrier_destroy(&barrier);
}

static int64_t
queue_len(eph_store_t *s)
{
  eph_error_t err = {0};
  int64_t n = -1;
  assert_int_equal(eph_store_queue_length(s, &n, &err), 0);
  return n;
}
#endif

/* The shared queue (docs/cluster.md): the bound holds when nodes push at once; nodes
 * claiming at once never get the same run; a claim carries the admitting node's
 * reservation and the stored request; a queued run belongs to no node, so a dead node's
 * queued runs are not taken over (host_lost) but stay claimable; a local_only run (zero data
 * retention) is claimed only by its admitting node and ends with it. SQLite: -ENOTSUP. */
void
test_queue(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  if (!f->pg) {
    json_object *none = NULL;
    assert_int_equal(eph_store_queue_push(f->store, "run_q", 1, false, 10, &err), -ENOTSUP);
    assert_int_equal(eph_store_queue_claim(f->store, &none, &err), -ENOTSUP);
    assert_null(none);
    return;
  }
#ifdef HAVE_LIBPQ
  enum { NODES = 3, RUNS = 8 };
  eph_store_t *nodes[NODES];
  for (int i = 0; i < NODES; i++) {
    char name[16];
    snprintf(name, sizeof name, "q%d", i);
    eph_store_options_t o = {.node_name = name, .lease_seconds = 5};
    if (eph_store_open(f->path, &o, &nodes[i], &err) < 0)
      fail_msg("%s", err.message);
  }
  cleanup_json json_object *req = request("queued prompt");
  char ids[RUNS][16];
  for (int i = 0; i < RUNS; i++) {
    snprintf(ids[i], sizeof ids[i], "run_q%d", i);
    assert_int_equal(
        eph_store_run_insert(nodes[0], ids[i], "acme", "queued", 100 + i, req, i == RUNS - 1, &err),
        0);
  }
  assert_int_equal(eph_store_queue_push(nodes[0], "run_none", 7, false, 10, &err), -ENOENT);
  /* Six nodes' admissions at once against a bound of 4: exactly 4 are queued. */
  queue_arg_t push[6];
  for (int i = 0; i < 6; i++)
    push[i] = (queue_arg_t){.store = nodes[i % NODES], .run_id = ids[i], .max_queued = 4};
  queue_race(push, 6);
  int queued = 0, full = 0;
  for (int i = 0; i < 6; i++) {
    if (push[i].result == 0)
      queued++;
    else if (push[i].result == -EAGAIN)
      full++;
  }
  assert_int_equal(queued, 4);
  assert_int_equal(full, 2);
  assert_int_equal(queue_len(nodes[1]), 4);
  /* A queued run belongs to no node: its lease is gone, so no takeover can end it. */
  PGresult *res = pg_query(f,
                           "SELECT count(*) FROM runs r JOIN run_queue q ON q.run_id = r.id"
                           " WHERE r.node IS NULL AND r.lease_expires_us IS NULL",
                           NULL, NULL, true);
  assert_string_equal(PQgetvalue(res, 0, 0), "4");
  PQclear(res);
  /* Its admitting node q0 dies (its leases expire): its queued runs are not taken over. */
  assert_int_equal(sql_exec(f, "UPDATE runs SET lease_expires_us = 1 WHERE node = 'q0'"), 0);
  cleanup_json json_object *taken = NULL;
  assert_int_equal(eph_store_leases_take_expired(nodes[2], &taken, &err), 0);
  assert_int_equal(json_object_array_length(taken), RUNS - 4);
  for (size_t i = 0; i < json_object_array_length(taken); i++)
    for (int j = 0; j < 6; j++)
      if (push[j].result == 0)
        assert_string_not_equal(json_object_get_string(json_object_array_get_idx(taken, i)),
                                ids[j]);
  /* Six claims at once from three nodes: four distinct runs, none twice. */
  queue_arg_t claim[6];
  for (int i = 0; i < 6; i++)
    claim[i] = (queue_arg_t){.store = nodes[i % NODES]};
  queue_race(claim, 6);
  int got = 0;
  const char *seen[6] = {0};
  for (int i = 0; i < 6; i++) {
    assert_int_equal(claim[i].result, 0);
    if (!claim[i].claimed)
      continue;
    const char *id = json_object_get_string(json_object_object_get(claim[i].claimed, "id"));
    for (int j = 0; j < got; j++)
      assert_string_not_equal(seen[j], id);
    seen[got++] = id;
    assert_int_equal(
        json_object_get_int64(json_object_object_get(claim[i].claimed, "reserved_micros")), 7);
    assert_string_equal(json_object_get_string(json_object_object_get(
                            json_object_object_get(claim[i].claimed, "request"), "prompt")),
                        "queued prompt");
    /* The claimer holds the run now, with a lease. */
    char name[16];
    snprintf(name, sizeof name, "q%d", i % NODES);
    res = pg_query(f, "SELECT node, lease_expires_us IS NOT NULL FROM runs WHERE id = $1", id, NULL,
                   true);
    assert_string_equal(PQgetvalue(res, 0, 0), name);
    assert_string_equal(PQgetvalue(res, 0, 1), "t");
    PQclear(res);
  }
  assert_int_equal(got, 4);
  assert_int_equal(queue_len(nodes[0]), 0);
  for (int i = 0; i < 6; i++)
    json_object_put(claim[i].claimed);
  /* Cancelling a queued run takes it out: once. */
  const char *left = push[0].result == 0 ? NULL : ids[0];
  for (int i = 0; i < 6 && !left; i++)
    if (push[i].result != 0)
      left = ids[i];
  assert_int_equal(eph_store_queue_push(nodes[1], left, 7, false, 4, &err), 0);
  assert_int_equal(eph_store_queue_remove(nodes[2], left, &err), 1);
  assert_int_equal(eph_store_queue_remove(nodes[2], left, &err), 0);
  assert_int_equal(queue_len(nodes[0]), 0);
  /* local_only (zero data retention): node q0's, invisible to the others' claims. */
  const char *zdr = ids[RUNS - 1];
  assert_int_equal(eph_store_queue_push(nodes[0], zdr, 9, true, 4, &err), 0);
  json_object *none = NULL;
  assert_int_equal(eph_store_queue_claim(nodes[1], &none, &err), 0);
  assert_null(none);
  cleanup_json json_object *mine = NULL;
  assert_int_equal(eph_store_queue_claim(nodes[0], &mine, &err), 0);
  assert_non_null(mine);
  assert_string_equal(json_object_get_string(json_object_object_get(mine, "id")), zdr);
  assert_true(json_object_get_boolean(json_object_object_get(mine, "zdr")));
  /* ... and when q0 dies with one still queued, the takeover ends it and it leaves the
   * queue (and its count). */
  assert_int_equal(
      eph_store_run_insert(nodes[0], "run_qz2", "acme", "queued", 300, req, true, &err), 0);
  assert_int_equal(eph_store_queue_push(nodes[0], "run_qz2", 9, true, 4, &err), 0);
  assert_int_equal(queue_len(nodes[0]), 1);
  assert_int_equal(sql_exec(f, "UPDATE runs SET lease_expires_us = 1 WHERE id = 'run_qz2'"), 0);
  cleanup_json json_object *lost = NULL;
  assert_int_equal(eph_store_leases_take_expired(nodes[1], &lost, &err), 0);
  assert_int_equal(json_object_array_length(lost), 1);
  assert_int_equal(queue_len(nodes[0]), 0);
  for (int i = 0; i < NODES; i++)
    eph_store_close(nodes[i]);
#endif
}

/* Attack: values made of SQL (quotes, statement separators, comments, a NUL-free
 * backslash soup) go through every text parameter a client can influence: a run id, an
 * idempotency key, a key name, event text and JSON. Each is stored and read back verbatim
 * and the tables are all still there: nothing was ever spliced into SQL. */
void
test_hostile_values(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  static const char *const evil[] = {
      "x'); DROP TABLE runs; --",      "'' OR 1=1 --",
      "\\'; SELECT pg_sleep(10); --",  "$1 $$ $tag$ ; COMMIT; DROP TABLE api_keys",
      "run_\"quoted\" /* comment */ ",
  };
  for (size_t i = 0; i < sizeof evil / sizeof evil[0]; i++) {
    cleanup_json json_object *req = request(evil[i]);
    assert_int_equal(
        eph_store_run_insert(f->store, evil[i], "acme", "queued", (int64_t)i + 1, req, false, &err),
        0);
    cleanup_json json_object *data = json_object_new_object();
    json_object_object_add(data, evil[i], json_object_new_string(evil[i]));
    assert_int_equal(
        eph_store_event_append(f->store, evil[i], 0, 1, "Shell", "tool_call", evil[i], data, &err),
        0);
    char h[65];
    sha(evil[i], h);
    char *existing = NULL;
    assert_int_equal(eph_store_idem_claim(f->store, "acme", evil[i], h, evil[i], &existing, &err),
                     0);
    assert_int_equal(
        eph_store_idem_claim(f->store, "acme", evil[i], h, "run_other", &existing, &err), 1);
    assert_string_equal(existing, evil[i]);
    free(existing);
    cleanup_free char *key = NULL;
    assert_int_equal(eph_store_key_create(f->store, "acme", evil[i], &key, NULL, &err), 0);
    assert_int_equal(eph_store_key_revoke(f->store, evil[i], "acme", &err), 0);
    assert_int_equal(eph_store_key_verify(f->store, key, NULL, NULL, &err), -EACCES);

    cleanup_json json_object *run = NULL, *events = NULL;
    assert_int_equal(eph_store_run_get(f->store, evil[i], "acme", &run, &err), 0);
    assert_string_equal(json_object_get_string(json_object_object_get(run, "id")), evil[i]);
    assert_string_equal(json_object_get_string(json_object_object_get(
                            json_object_object_get(run, "request"), "prompt")),
                        evil[i]);
    assert_int_equal(eph_store_events_since(f->store, evil[i], -1, 0, &events, &err), 0);
    json_object *e = json_object_array_get_idx(events, 0);
    assert_string_equal(json_object_get_string(json_object_object_get(e, "text")), evil[i]);
    assert_string_equal(
        json_object_get_string(json_object_object_get(json_object_object_get(e, "data"), evil[i])),
        evil[i]);
  }
  /* Every table is still there and holds exactly what was put in. */
  cleanup_json json_object *runs = NULL;
  char *next = NULL;
  assert_int_equal(eph_store_run_list(f->store, "acme", 0, NULL, &runs, &next, &err), 0);
  assert_int_equal(json_object_array_length(runs), 5);
  assert_null(next);
  cleanup_json json_object *keys = NULL;
  assert_int_equal(eph_store_key_list(f->store, "acme", &keys, &err), 0);
  assert_int_equal(json_object_array_length(keys), 5);
  assert_int_equal(eph_store_probe(f->store, &err), 0);
}

/* Which strings name a PostgreSQL database; the password of one never appears in the
 * store's name for messages. */
static int64_t
jget(json_object *o, const char *k)
{
  json_object *v = NULL;
  if (!json_object_object_get_ex(o, k, &v))
    fail_msg("no field %s in %s", k, json_object_to_json_string(o));
  return json_object_get_int64(v);
}

/* Admin keys, the audit trail and usage (core/admin.c) keep one contract on both stores,
 * and a second store on the same database (another node of a cluster, or another process
 * on one host) reads what the first wrote at once: the mark, its revocation, the trail. */
void
test_admin_keys_audit_usage(void **st)
{
  fixture_t *f = *st;
  eph_error_t err = {0};
  cleanup_free char *key = NULL, *id = NULL, *plain = NULL, *plain_id = NULL, *org = NULL;
  assert_int_equal(eph_store_key_create(f->store, "ops", "root", &key, &id, &err), 0);
  assert_int_equal(eph_store_key_create(f->store, "cust", "app", &plain, &plain_id, &err), 0);
  if (eph_admin_key_mark(f->store, id, &err) < 0)
    fail_msg("marking an admin key: %s", err.message);
  assert_int_equal(eph_admin_key_mark(f->store, "key_00000000deadbeef", &err), -ENOENT);
  eph_store_t *other = NULL;
  if (eph_store_open(f->path, NULL, &other, &err) < 0)
    fail_msg("%s", err.message);
  bool admin = false;
  assert_int_equal(eph_admin_key_is_admin(other, id, &admin, &err), 0);
  assert_true(admin);
  assert_int_equal(eph_admin_key_is_admin(other, plain_id, &admin, &err), 0);
  assert_false(admin);
  assert_int_equal(eph_admin_key_org(other, id, &org, &err), 0);
  assert_string_equal(org, "ops");

  /* The trail: written through both, read newest first through either. */
  assert_int_equal(eph_admin_audit_add(f->store, id, "ops", "keys.create", "cust", NULL,
                                       "{\"name\":\"x\"}", "127.0.0.1", 201, 30, &err),
                   0);
  assert_int_equal(eph_admin_audit_add(other, plain_id, "cust", "audit.list", NULL, NULL, NULL,
                                       "::1", 403, 30, &err),
                   0);
  cleanup_json json_object *trail = NULL;
  assert_int_equal(eph_admin_audit_list(f->store, 10, &trail, &err), 0);
  assert_int_equal(json_object_array_length(trail), 2);
  json_object *newest = json_object_array_get_idx(trail, 0),
              *oldest = json_object_array_get_idx(trail, 1);
  assert_string_equal(json_object_get_string(json_object_object_get(newest, "actor_key_id")),
                      plain_id);
  assert_int_equal(jget(newest, "status"), 403);
  assert_null(json_object_object_get(newest, "target_org"));
  assert_string_equal(json_object_get_string(json_object_object_get(oldest, "detail")),
                      "{\"name\":\"x\"}");
  assert_string_equal(json_object_get_string(json_object_object_get(oldest, "action")),
                      "keys.create");
  assert_true(jget(newest, "id") > jget(oldest, "id"));
  assert_true(jget(oldest, "at_us") > 0);

  /* Usage: the runs' stored usage, summed. */
  cleanup_json json_object *req = json_tokener_parse("{\"prompt\":\"p\"}");
  cleanup_json json_object *usage = json_tokener_parse(
      "{\"model_micros\":5,\"web_micros\":1,\"compute_micros\":2,\"billed_micros\":8}");
  assert_int_equal(
      eph_store_run_insert(f->store, "run_u1", "cust", "queued", 1000, req, false, &err), 0);
  assert_int_equal(eph_store_run_update(f->store, "run_u1", "succeeded", NULL, usage, &err), 0);
  assert_int_equal(
      eph_store_run_insert(f->store, "run_u2", "cust", "queued", 1001, req, false, &err), 0);
  cleanup_json json_object *u = NULL;
  assert_int_equal(eph_admin_usage(other, "cust", 0, 2000, &u, &err), 0);
  assert_int_equal(jget(u, "runs"), 2);
  assert_int_equal(jget(u, "billed_micros"), 8);
  assert_int_equal(jget(u, "compute_micros"), 2);

  /* Revoked through one, the key is no admin key through the other. */
  assert_int_equal(eph_store_key_revoke(other, id, "ops", &err), 0);
  assert_int_equal(eph_admin_key_is_admin(f->store, id, &admin, &err), 0);
  assert_false(admin);
  free(org);
  org = NULL;
  assert_int_equal(eph_admin_key_org(f->store, id, &org, &err), -ENOENT);
  eph_store_close(other);
}

void
test_target_kind_and_password_hidden(void **st)
{
  fixture_t *f = *st;
  assert_true(eph_store_target_is_pg("postgresql://db.example/eph"));
  assert_true(eph_store_target_is_pg("postgres://u:p@db/eph"));
  assert_true(eph_store_target_is_pg("host=db dbname=eph"));
  assert_false(eph_store_target_is_pg("/var/lib/ephemeral/ephemeral.sqlite"));
  assert_false(eph_store_target_is_pg("./state/a=b/ephemeral.sqlite"));
  assert_false(eph_store_target_is_pg("postgresql.sqlite"));
  assert_int_equal(eph_store_kind(f->store), f->pg ? EPH_STORE_POSTGRES : EPH_STORE_SQLITE);
  if (!f->pg)
    return;
  char with_pw[1200];
  snprintf(with_pw, sizeof with_pw, "%s&password=Sekr1tPassw0rd", f->path);
  eph_store_t *s = NULL;
  eph_error_t err = {0};
  assert_int_equal(eph_store_open(with_pw, NULL, &s, &err), 0); /* trust auth: ignored */
  assert_null(strstr(eph_store_path(s), "Sekr1t"));
  assert_non_null(strstr(eph_store_path(s), "ephemeral_test"));
  eph_store_close(s);
  /* A refused connection's message names the target, not the password. */
  char bad[1200];
  snprintf(bad, sizeof bad, "postgresql://nobody:Sekr1tPassw0rd@/no_such_db?host=%s",
           getenv("PGHOST") ? getenv("PGHOST") : "/nonexistent");
  err = (eph_error_t){0};
  assert_true(eph_store_open(bad, NULL, &s, &err) < 0);
  assert_null(strstr(err.message, "Sekr1t"));
  assert_non_null(strstr(err.message, "no_such_db"));
}
