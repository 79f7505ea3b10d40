/* backend-qemu: the pool (key `pool`). A restore spends most of its time before the guest
 * runs: QEMU's start (exec, libraries, machine set-up) and the incoming migration (the
 * ~120 MB stream copied into guest RAM). A pooled microVM has done both ahead of its run
 * and waits paused (-S); taking it leaves the run only the reseed, `cont` and the hello.
 *
 * What stays as for any run: each pooled QEMU has its own slot (uid/gid), keeper, run
 * directory (pool-<pid>-<n>, owned by us in its pid record: the sweep reaps it after our
 * death and the keeper kills QEMU the moment we die), the snapshot was validated by
 * snapshot_open, and the guest has never seen a run. What is new: a pooled microVM is
 * started before its run exists, so the run's deadline reaches the keeper at take
 * (vm_set_deadline) and its directory is renamed to the run's. A taken microVM is one run's
 * only: destroy kills it like any other and nothing returns to the pool. */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "guest/protocol.h"
#include "qemu.h"

static struct launch_key
key_of(const launch_t *l)
{
  struct launch_key k = {
      .memory_mib = l->memory_mib, .tmp_mib = l->tmp_mib, .vcpus = l->vcpus, .pids = l->pids};
  snprintf(k.accel, sizeof k.accel, "%s", l->accel);
  return k;
}

static bool
key_eq(const struct launch_key *a, const struct launch_key *b)
{
  return a->memory_mib == b->memory_mib && a->tmp_mib == b->tmp_mib && a->vcpus == b->vcpus &&
         a->pids == b->pids && strcmp(a->accel, b->accel) == 0;
}

static void
pool_vm_end(qemu_t *q, pool_vm_t *v)
{
  qmp_close(&v->qmp);
  if (v->guest_fd >= 0)
    close(v->guest_fd);
  vm_stop(q, &v->vm, NULL);
  if (v->dir[0])
    rm_tree(v->dir);
  free(v);
}

/* Runs the loaded guest once through a ping (its answer read and dropped), then stops it
 * again: under TCG every code path a restored guest takes is translated afresh, and a run's
 * reseed and hello take the same paths (the interrupt, virtio-serial both ways, the agent's
 * frame loop) — translated here, ahead of the run. The guest has seen no run and learns
 * nothing: its identity (entropy, clock, scratch) still comes from the run's reseed. */
static int
pool_warm(pool_vm_t *v, int64_t deadline_ms, eph_error_t *err)
{
  int r = qmp_exec(&v->qmp, "cont", NULL, -1, deadline_ms, NULL, err);
  if (r < 0)
    return r;
  json_object *ping = json_object_new_object();
  json_object_object_add(ping, "type", json_object_new_string("ping"));
  json_object_object_add(ping, "id", json_object_new_int(1));
  r = eph_proto_write_frame(v->guest_fd, ping);
  json_object_put(ping);
  if (r < 0)
    return eph_error_set(err, -r, "pool: ping: %s", strerror(-r));
  eph_frame_reader_t rd = {0};
  json_object *o = NULL;
  while (!o && eph_now_ms() < deadline_ms) {
    struct pollfd p = {.fd = v->guest_fd, .events = POLLIN};
    if (poll(&p, 1, 100) > 0 && (r = eph_frame_reader_feed(&rd, v->guest_fd, &o)) < 0)
      break;
  }
  eph_frame_reader_clear(&rd);
  const char *type = o ? eph_json_get_string(o, "type") : NULL;
  r = type && strcmp(type, "pong") == 0
          ? 0
          : eph_error_set(err, EPH_E_PROTOCOL, "pool: the guest answered the ping with '%s'",
                          type ? type : "nothing");
  json_object_put(o);
  return r < 0 ? r : qmp_exec(&v->qmp, "stop", NULL, -1, deadline_ms, NULL, err);
}

/* Starts one pooled microVM for key k: restored from the snapshot, loaded, warmed (pool_warm)
 * and paused. */
static pool_vm_t *
pool_start(qemu_t *q, const struct launch_key *k, unsigned seq, eph_error_t *err)
{
  pool_vm_t *v = calloc(1, sizeof *v);
  if (!v) {
    eph_error_set(err, ENOMEM, "out of memory");
    return NULL;
  }
  v->key = *k;
  v->guest_fd = -1;
  v->qmp.fd = -1;
  v->vm = (vmproc_t){.keeper = -1, .qemu = -1, .lifeline = -1, .slot = -1};
  char id[48];
  snprintf(id, sizeof id, "pool-%d-%u", (int)getpid(), seq);
  snprintf(v->name, sizeof v->name, "ephemeral-%s", id);
  int64_t deadline = eph_now_ms() + SNAPSHOT_SAVE_MS;
  launch_t l = {.name = v->name,
                .accel = v->key.accel,
                .memory_mib = k->memory_mib,
                .vcpus = k->vcpus,
                .tmp_mib = k->tmp_mib,
                .pids = k->pids,
                .incoming_fd = -1,
                .log_fd = -1,
                .tap_fd = -1};
  int log_fd = -1, qfd = -1;
  if (make_run_dir(q, id, v->dir, sizeof v->dir, &log_fd, err) < 0) {
    v->dir[0] = '\0';
    pool_vm_end(q, v);
    return NULL;
  }
  l.log_fd = log_fd;
  /* Before the open: should the image or QEMU change in between, the entry carries the
   * older identity and a take refuses it (never the other way round). */
  int snap_fd = snapshot_identity(q, &l, v->identity);
  if (snap_fd < 0)
    eph_error_set(err, -snap_fd, "pool: the snapshot's identity cannot be computed");
  else
    snap_fd = snapshot_open(q, &l, deadline, err);
  int r = snap_fd;
  if (snap_fd >= 0) {
    l.incoming_fd = snap_fd;
    l.paused = true;
    r = launch_qemu(q, &l, &v->vm, &v->guest_fd, &qfd, err);
    close(snap_fd); /* QEMU shares it (and its flock) until loaded */
  }
  close(log_fd);
  static const char *const loading[] = {"inmigrate", "restore-vm", "prelaunch", NULL};
  char st[32] = "";
  if (r >= 0 && (r = write_pid_record(v->dir, q, v->vm.qemu, v->name, err)) < 0)
    close(qfd);
  if (r >= 0 && (r = qmp_open(&v->qmp, qfd, eph_now_ms() + QMP_TIMEOUT_MS, err)) >= 0)
    r = qmp_wait_status(&v->qmp, loading, deadline, st, sizeof st, err);
  if (r >= 0 && strcmp(st, "paused") != 0)
    r = eph_error_set(err, EPROTO, "a pooled microVM is '%s' after loading, not paused", st);
  if (r >= 0)
    r = pool_warm(v, deadline, err);
  if (r < 0) {
    pool_vm_end(q, v);
    return NULL;
  }
  return v;
}

static void *
pool_main(void *arg)
{
  qemu_t *q = arg;
  pthread_mutex_lock(&q->pool_lock);
  for (;;) {
    while (!q->pool_stop && (!q->pool_want_set || q->pool_n >= q->cfg.pool))
      pthread_cond_wait(&q->pool_cond, &q->pool_lock);
    if (q->pool_stop)
      break;
    struct launch_key want = q->pool_want;
    unsigned seq = q->pool_seq++;
    pthread_mutex_unlock(&q->pool_lock);
    eph_error_t err = {0};
    int64_t t0 = eph_now_ms();
    pool_vm_t *v = pool_start(q, &want, seq, &err);
    if (v)
      q->host->log(EPH_LOG_DEBUG, "pool: %s (QEMU %d) loaded and paused in %" PRId64 " ms", v->name,
                   (int)v->vm.qemu, eph_now_ms() - t0);
    pthread_mutex_lock(&q->pool_lock);
    if (!v) {
      /* Not again until the next restore asks: a failing start must not loop. */
      q->host->log(EPH_LOG_WARN, "pool: a microVM could not be started ahead: %s", err.message);
      q->pool_want_set = false;
      continue;
    }
    if (q->pool_stop || !key_eq(&v->key, &q->pool_want) || q->pool_n >= q->cfg.pool) {
      pthread_mutex_unlock(&q->pool_lock);
      pool_vm_end(q, v);
      pthread_mutex_lock(&q->pool_lock);
      continue;
    }
    q->pool_vms[q->pool_n++] = v;
  }
  pthread_mutex_unlock(&q->pool_lock);
  return NULL;
}

pool_vm_t *
pool_take(qemu_t *q, const launch_t *l)
{
  if (q->cfg.pool <= 0)
    return NULL;
  struct launch_key k = key_of(l);
  pool_vm_t *v = NULL, *stale[64];
  int nstale = 0;
  /* A pooled microVM restored from another snapshot than the one this run would get (the
   * image, kernel or QEMU changed since) is ended, never handed out. */
  char identity[65];
  if (snapshot_identity(q, l, identity) < 0)
    identity[0] = '\0';
  pthread_mutex_lock(&q->pool_lock);
  if (!q->pool_vms && !(q->pool_vms = calloc((size_t)q->cfg.pool, sizeof *q->pool_vms))) {
    pthread_mutex_unlock(&q->pool_lock);
    return NULL;
  }
  for (int i = 0; i < q->pool_n && !v;) {
    pool_vm_t *c = q->pool_vms[i];
    bool stale_one = strcmp(c->identity, identity) != 0;
    if (!stale_one && !key_eq(&c->key, &k)) {
      i++;
      continue;
    }
    q->pool_vms[i] = q->pool_vms[--q->pool_n];
    if (stale_one && nstale < 64)
      stale[nstale++] = c;
    else if (!stale_one)
      v = c;
  }
  /* The pool follows the limits last asked: loaded microVMs for others are ended. */
  if (!key_eq(&q->pool_want, &k))
    while (q->pool_n > 0 && nstale < 64)
      stale[nstale++] = q->pool_vms[--q->pool_n];
  q->pool_want = k;
  q->pool_want_set = true;
  q->pool_restores++;
  if (!q->pool_started && !q->pool_stop && q->pool_restores >= 2)
    q->pool_started = pthread_create(&q->pool_thread, NULL, pool_main, q) == 0;
  pthread_cond_broadcast(&q->pool_cond);
  pthread_mutex_unlock(&q->pool_lock);
  for (int i = 0; i < nstale; i++)
    pool_vm_end(q, stale[i]);
  return v;
}

void
pool_fini(qemu_t *q)
{
  pthread_mutex_lock(&q->pool_lock);
  q->pool_stop = true;
  pthread_cond_broadcast(&q->pool_cond);
  bool started = q->pool_started;
  pthread_mutex_unlock(&q->pool_lock);
  if (started)
    pthread_join(q->pool_thread, NULL);
  for (int i = 0; i < q->pool_n; i++)
    pool_vm_end(q, q->pool_vms[i]);
  q->pool_n = 0;
  free(q->pool_vms);
  q->pool_vms = NULL;
}
