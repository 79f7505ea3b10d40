/* The run's money and its locks (core/meter.c), white-box: a run built by hand around a fake
 * ledger plugin, so each race is driven directly rather than through a sandbox.
 *
 *   - a ledger charge (disk I/O, fsync) runs without the run's lock: readers of the run
 *     (HTTP threads) never wait on the disk;
 *   - an all-or-nothing charge (a plugin's host->charge, an egress connection) is checked
 *     and written in one step: it never bills a part of what it was asked;
 *   - the sandbox pointer a budget cut cancels is read under the run's lock, so a sandbox
 *     being destroyed is never touched (ASan sees the use after free otherwise);
 *   - that cancel (eph_guest_kill, under the run's lock) never waits for another thread's
 *     frame to a guest that stopped reading: the kill follows that frame. */
#include <config.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <linux/sockios.h>

#include "../guest/protocol.h"
#include "guest_client.h"
#include "run_int.h"
#include "util.h"

/* ------------------------------------------------------------------ the fake ledger */

static enum { LEDGER_BLOCK, LEDGER_CAP } ledger_mode;
static sem_t entered, release;
static pthread_mutex_t ledger_mu = PTHREAD_MUTEX_INITIALIZER;
static int64_t ledger_reserved, ledger_billed;

static struct timespec
in_seconds(int s)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += s;
  return ts;
}

static int
fake_charge(void *state, const char *run_id, eph_cost_t category, int64_t micros, const char *memo,
            eph_error_t *err)
{
  (void)state, (void)run_id, (void)category, (void)memo;
  if (ledger_mode == LEDGER_BLOCK) {
    /* Stands for a slow fsync: holds the charge until the test lets it go. */
    sem_post(&entered);
    struct timespec ts = in_seconds(10);
    while (sem_timedwait(&release, &ts) < 0 && errno == EINTR)
      ;
  } else {
    sched_yield(); /* widens the window a racy caller leaves between check and charge */
  }
  /* The real ledger's rule: a charge that would pass the reservation is refused whole. */
  pthread_mutex_lock(&ledger_mu);
  int r = 0;
  if (ledger_billed + micros > ledger_reserved)
    r = eph_error_set(err, EPH_E_BUDGET, "over the reservation");
  else
    ledger_billed += micros;
  pthread_mutex_unlock(&ledger_mu);
  return r;
}

static const eph_ledger_ops_t fake_ops = {.struct_size = sizeof fake_ops, .charge = fake_charge};
static const eph_plugin_t fake_desc = {
    .name = "fake-ledger", .kind = EPH_KIND_LEDGER, .ops = &fake_ops};
static const eph_plugin_slot_t fake_slot = {.desc = &fake_desc};

static eph_run_t *
bare_run(int64_t reserved)
{
  eph_run_t *run = eph_xcalloc(1, sizeof *run);
  pthread_mutex_init(&run->lock, NULL);
  pthread_mutex_init(&run->emit_lock, NULL);
  pthread_mutex_init(&run->money_lock, NULL);
  pthread_cond_init(&run->cond, NULL);
  snprintf(run->id, sizeof run->id, "run_test");
  run->ledger = &fake_slot;
  run->reserved = reserved;
  ledger_reserved = reserved;
  ledger_billed = 0;
  return run;
}

static void
bare_free(eph_run_t *run)
{
  pthread_mutex_destroy(&run->lock);
  pthread_mutex_destroy(&run->emit_lock);
  pthread_mutex_destroy(&run->money_lock);
  pthread_cond_destroy(&run->cond);
  free(run);
}

/* ------------------------------------------------------------------ no disk I/O under lock */

static void *
charge_100(void *arg)
{
  eph_meter_charge(arg, EPH_COST_COMPUTE, 100, "compute");
  return NULL;
}

static void
test_ledger_write_outside_run_lock(void **state)
{
  (void)state;
  ledger_mode = LEDGER_BLOCK;
  sem_init(&entered, 0, 0);
  sem_init(&release, 0, 0);
  eph_run_t *run = bare_run(1000);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, charge_100, run), 0);
  struct timespec ts = in_seconds(10);
  assert_int_equal(sem_timedwait(&entered, &ts), 0);
  /* The charge is inside the ledger: a reader (GET /v1/runs/{id}) gets the run at once. */
  ts = in_seconds(2);
  int r = pthread_mutex_timedlock(&run->lock, &ts);
  if (r == 0)
    pthread_mutex_unlock(&run->lock);
  sem_post(&release);
  pthread_join(t, NULL);
  assert_int_equal(r, 0);
  assert_int_equal(run->billed, 100);
  assert_int_equal(ledger_billed, 100);
  bare_free(run);
  sem_destroy(&entered);
  sem_destroy(&release);
}

/* ------------------------------------------------------------------ all or nothing */

#define EXACT_THREADS 4
#define EXACT_CALLS 3000

static atomic_llong exact_sum, capped_sum, partial;

static void *
exact_worker(void *arg)
{
  eph_run_t *run = arg;
  unsigned seed = (unsigned)(uintptr_t)&seed;
  for (int i = 0; i < EXACT_CALLS; i++) {
    int64_t want = 1 + rand_r(&seed) % 97;
    eph_error_t err = {0};
    if (eph_meter_charge_exact(run, EPH_COST_WEB, want, "exact", &err) == 0)
      atomic_fetch_add(&exact_sum, want);
  }
  return NULL;
}

static void *
capped_worker(void *arg)
{
  eph_run_t *run = arg;
  for (int i = 0; i < EXACT_THREADS * EXACT_CALLS; i++) {
    int64_t got = eph_meter_charge(run, EPH_COST_COMPUTE, 13, "compute");
    atomic_fetch_add(&capped_sum, got);
    if (got > 0 && got < 13)
      atomic_fetch_add(&partial, 1);
  }
  return NULL;
}

static void
test_exact_charge_all_or_nothing(void **state)
{
  (void)state;
  ledger_mode = LEDGER_CAP;
  atomic_store(&exact_sum, 0);
  atomic_store(&capped_sum, 0);
  atomic_store(&partial, 0);
  /* Enough for about half of what is asked: the budget runs out in the middle. */
  eph_run_t *run = bare_run(EXACT_THREADS * EXACT_CALLS * 49 / 2);
  pthread_t t[EXACT_THREADS + 1];
  for (int i = 0; i < EXACT_THREADS; i++)
    assert_int_equal(pthread_create(&t[i], NULL, exact_worker, run), 0);
  assert_int_equal(pthread_create(&t[EXACT_THREADS], NULL, capped_worker, run), 0);
  for (int i = 0; i <= EXACT_THREADS; i++)
    pthread_join(t[i], NULL);
  /* Every successful exact charge was billed whole: the ledger holds exactly what the
   * callers were told was charged, and the run's own count agrees with it. */
  if (ledger_billed != atomic_load(&exact_sum) + atomic_load(&capped_sum))
    fail_msg("ledger billed %lld, callers were told %lld exact + %lld capped",
             (long long)ledger_billed, (long long)atomic_load(&exact_sum),
             (long long)atomic_load(&capped_sum));
  assert_int_equal(run->billed, ledger_billed);
  assert_int_equal(run->web_micros, atomic_load(&exact_sum));
  assert_true(run->billed <= run->reserved);
  assert_true(atomic_load(&run->budget_exhausted));
  bare_free(run);
}

/* ------------------------------------------------------------------ the sandbox pointer */

#define SBX_ROUNDS 200000

static atomic_bool sbx_done;

static void *
budget_cut_worker(void *arg)
{
  eph_run_t *run = arg;
  /* Nothing left: every call is a budget cut, which cancels the run's sandbox if any. */
  while (!atomic_load(&sbx_done))
    eph_meter_charge(run, EPH_COST_COMPUTE, 1, "compute");
  return NULL;
}

static void
test_budget_cut_never_touches_a_destroyed_sandbox(void **state)
{
  (void)state;
  ledger_mode = LEDGER_CAP;
  eph_run_t *run = bare_run(0);
  atomic_store(&sbx_done, false);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, budget_cut_worker, run), 0);
  /* What eph_run_execute does with a sandbox: published under the lock, unpublished under
   * the lock, then destroyed (freed). A stand-in block, zeroed (no guest to kill), larger
   * than the core's sandbox handle. */
  for (int i = 0; i < SBX_ROUNDS; i++) {
    void *sbx = eph_xcalloc(1, 256);
    pthread_mutex_lock(&run->lock);
    run->sbx = sbx;
    pthread_mutex_unlock(&run->lock);
    sched_yield();
    pthread_mutex_lock(&run->lock);
    run->sbx = NULL;
    pthread_mutex_unlock(&run->lock);
    free(sbx);
  }
  atomic_store(&sbx_done, true);
  pthread_join(t, NULL);
  assert_true(atomic_load(&run->budget_exhausted));
  assert_int_equal(run->billed, 0);
  bare_free(run);
}

/* ------------------------------------------------------------------ a kill never waits */

/* The guest's first frame, as ephemeral-guest sends it (kernel: a name for the fixture). */
static void
send_hello(int fd, const char *kernel)
{
  json_object *hello = json_object_new_object();
  json_object_object_add(hello, "type", json_object_new_string("hello"));
  json_object_object_add(hello, "version", json_object_new_int(1));
  json_object_object_add(hello, "kernel", json_object_new_string(kernel));
  json_object_object_add(hello, "scratch", json_object_new_string("/s"));
  json_object_object_add(hello, "uid", json_object_new_int(1000));
  json_object_object_add(hello, "gid", json_object_new_int(1000));
  json_object_object_add(hello, "pid1", json_object_new_boolean(1));
  json_object_object_add(hello, "max_frame_bytes", json_object_new_int(1048576));
  eph_proto_write_frame(fd, hello);
  json_object_put(hello);
}

/* The next frame the host sent on fd (blocking), or NULL once the stream ended or broke. */
static json_object *
next_frame(eph_frame_reader_t *rd, int fd)
{
  for (;;) {
    json_object *msg = NULL;
    int r = eph_frame_reader_feed(rd, fd, &msg);
    if (r < 0)
      return NULL;
    if (r > 0)
      return msg;
  }
}

static sem_t guest_drain, kill_returned;
static atomic_int kills_seen, kill_all_seen, frames_before_kill;

/* A guest that says hello, then stops reading its socket until the test lets it drain:
 * then it reads every frame, noting the kill (and how many frames came before it), and
 * closes the stream once it has one. */
static void *
stalled_guest(void *arg)
{
  int fd = (int)(intptr_t)arg;
  send_hello(fd, "stalled");
  struct timespec ts = in_seconds(20);
  while (sem_timedwait(&guest_drain, &ts) < 0 && errno == EINTR)
    ;
  eph_frame_reader_t rd = {0};
  int frames = 0;
  for (json_object *msg; (msg = next_frame(&rd, fd));) {
    const char *type = eph_json_get_string(msg, "type");
    if (type && strcmp(type, "kill") == 0) {
      json_object *all = NULL;
      atomic_fetch_add(&kills_seen, 1);
      if (json_object_object_get_ex(msg, "all", &all) && json_object_get_boolean(all))
        atomic_fetch_add(&kill_all_seen, 1);
      atomic_store(&frames_before_kill, frames);
      json_object_put(msg);
      break;
    }
    frames++;
    json_object_put(msg);
  }
  eph_frame_reader_clear(&rd);
  close(fd);
  return NULL;
}

static void *
big_write(void *arg)
{
  /* One frame of the largest payload: more than the socket can hold, so the writer stays
   * inside the write, holding the connection's write lock, while the guest does not read. */
  char *data = eph_xcalloc(1, EPH_PROTO_MAX_DATA_BYTES);
  eph_error_t err = {0};
  (void)eph_guest_write(arg, "big", data, EPH_PROTO_MAX_DATA_BYTES, &err);
  free(data);
  return NULL;
}

static void *
kill_thread(void *arg)
{
  eph_guest_kill(arg, true);
  sem_post(&kill_returned);
  return NULL;
}

static void
test_kill_never_waits_for_a_stalled_frame(void **state)
{
  (void)state;
  sem_init(&guest_drain, 0, 0);
  sem_init(&kill_returned, 0, 0);
  atomic_store(&kills_seen, 0);
  atomic_store(&kill_all_seen, 0);
  atomic_store(&frames_before_kill, -1);
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  int small = 16384;
  assert_int_equal(setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
  pthread_t guest, writer, killer;
  assert_int_equal(pthread_create(&guest, NULL, stalled_guest, (void *)(intptr_t)sv[1]), 0);
  eph_guest_t *g = NULL;
  eph_error_t err = {0};
  if (eph_guest_open(sv[0], eph_now_ms() + 10000, &g, &err) < 0)
    fail_msg("open: %s", err.message);
  assert_int_equal(pthread_create(&writer, NULL, big_write, g), 0);
  /* The writer is inside its frame once bytes wait in the socket (bounded poll). */
  int queued = 0;
  for (int64_t until = eph_now_ms() + 10000; queued <= 0 && eph_now_ms() < until;) {
    if (ioctl(sv[0], SIOCOUTQ, &queued) < 0)
      fail_msg("SIOCOUTQ: %s", strerror(errno));
    if (queued <= 0)
      sched_yield();
  }
  assert_true(queued > 0);
  /* A cancel now (the run's lock held in the core) returns at once, the frame still stuck. */
  assert_int_equal(pthread_create(&killer, NULL, kill_thread, g), 0);
  struct timespec ts = in_seconds(3);
  int waited = sem_timedwait(&kill_returned, &ts);
  sem_post(&guest_drain); /* let everything finish, whatever the outcome */
  if (waited < 0)
    sem_wait(&kill_returned);
  pthread_join(killer, NULL);
  pthread_join(writer, NULL);
  pthread_join(guest, NULL);
  eph_guest_close(g);
  assert_int_equal(waited, 0);
  /* The kill was not lost: it reached the guest, after the frame that was being written. */
  assert_int_equal(atomic_load(&kills_seen), 1);
  assert_int_equal(atomic_load(&kill_all_seen), 1);
  assert_int_equal(atomic_load(&frames_before_kill), 1);
  sem_destroy(&guest_drain);
  sem_destroy(&kill_returned);
}

/* ------------------------------------------------------------------ a silent command */

/* A guest whose command prints one chunk and then never ends (red team 7: a command that
 * left its process group outlived its timeout): it reads the exec, answers one output
 * frame of that id, and stays silent until the client closes the stream. */
static void *
silent_guest(void *arg)
{
  int fd = (int)(intptr_t)arg;
  send_hello(fd, "silent");
  eph_frame_reader_t rd = {0};
  for (json_object *msg; (msg = next_frame(&rd, fd));) {
    const char *type = eph_json_get_string(msg, "type");
    int64_t id = 0;
    if (type && strcmp(type, "exec") == 0 && eph_proto_int(msg, "id", &id)) {
      json_object *o = json_object_new_object();
      json_object_object_add(o, "type", json_object_new_string("output"));
      json_object_object_add(o, "id", json_object_new_int64(id));
      json_object_object_add(o, "stream", json_object_new_int(1));
      json_object_object_add(o, "data", json_object_new_string("aGk="));
      eph_proto_write_frame(fd, o);
      json_object_put(o);
    }
    json_object_put(msg);
  }
  eph_frame_reader_clear(&rd);
  return NULL;
}

static void
test_exec_gives_up_on_a_silent_guest(void **state)
{
  (void)state;
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  pthread_t guest;
  assert_int_equal(pthread_create(&guest, NULL, silent_guest, (void *)(intptr_t)sv[1]), 0);
  eph_guest_t *g = NULL;
  eph_error_t err = {0};
  if (eph_guest_open(sv[0], eph_now_ms() + 10000, &g, &err) < 0)
    fail_msg("open: %s", err.message);
  eph_exec_request_t req = {.struct_size = sizeof req,
                            .command = "sleep 1000",
                            .timeout_ms = 1,
                            .output_cap_bytes = 4096};
  eph_exec_result_t res = {0};
  /* The client gives up at the timeout plus its grace: an error, the connection marked
   * unusable, and the output frame it had already released not released twice (json-c
   * aborted on its reference count; ASan: heap-use-after-free). */
  int r = eph_guest_exec(g, &req, &res, &err);
  assert_true(r < 0);
  assert_true(eph_guest_broken(g));
  assert_non_null(strstr(err.message, "no answer in time"));
  eph_guest_close(g);
  pthread_join(guest, NULL);
  close(sv[1]);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ledger_write_outside_run_lock),
      cmocka_unit_test(test_exact_charge_all_or_nothing),
      cmocka_unit_test(test_budget_cut_never_touches_a_destroyed_sandbox),
      cmocka_unit_test(test_kill_never_waits_for_a_stalled_frame),
      cmocka_unit_test(test_exec_gives_up_on_a_silent_guest),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
