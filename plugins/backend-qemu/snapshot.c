/* backend-qemu: the snapshot store (<state_dir>/qemu/snapshots): a ready guest saved once
 * per identity and restored by later sandboxes. */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <sys/file.h>

#include "qemu.h"
#include "support/cleanup.h"

/* ------------------------------------------------------------ snapshots */

/* FNV-1a: names a snapshot after everything that shapes the saved machine. */
static uint64_t
fnv1a(const char *s)
{
  uint64_t h = 1469598103934665603ULL;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 1099511628211ULL;
  return h;
}

void
snapshot_path(const qemu_t *q, const launch_t *l, char *out, size_t size)
{
  char path[PATH_MAX], sha[1024] = "", key[8192];
  snprintf(path, sizeof path, "%s/image.sha256", q->cfg.image_dir);
  read_small(path, sha, sizeof sha);
  struct stat st = {0};
  stat(q->qemu_path, &st);
  /* "vport": the control stream's device layout; a snapshot of another layout cannot be
   * restored into this QEMU command line. */
  snprintf(key, sizeof key, "vport|%s|%s|%" PRIu64 "|%u|%" PRIu64 "|%u|%s|%" PRId64 "|%s|%lld|%lld|%d",
           sha, l->accel, l->memory_mib, l->vcpus, l->tmp_mib, l->pids, q->cfg.append,
           q->tsc_khz / 1000,
           q->qemu_path, (long long)st.st_size, (long long)st.st_mtime, q->cfg.console_log);
  snprintf(out, size, "%s/%016" PRIx64 ".vmstate", q->snap_dir, fnv1a(key));
}

/* Boots a guest to its hello and saves it (QMP stop, getfd, migrate fd:) to `path`.
 * Serialised by an flock on path.lock, so concurrent creates build it once. */
int
ensure_snapshot(const qemu_t *q, const launch_t *base, const char *path, int64_t deadline_ms,
                eph_error_t *err)
{
  if (access(path, R_OK) == 0)
    return 0;
  char lock[PATH_MAX + 8];
  snprintf(lock, sizeof lock, "%s.lock", path);
  cleanup_close int lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lfd < 0 || flock(lfd, LOCK_EX) < 0)
    return eph_error_set(err, errno, "%s: %s", lock, strerror(errno));
  if (access(path, R_OK) == 0)
    return 0;
  int64_t t0 = eph_now_ms();
  char id[64], name[96], dir[PATH_MAX];
  snprintf(id, sizeof id, "snapshot-%d-%" PRId64, (int)getpid(), t0);
  snprintf(name, sizeof name, "ephemeral-%s", id);
  int log_fd = -1;
  int r = make_run_dir(q, id, dir, sizeof dir, &log_fd, err);
  if (r < 0)
    return r;
  launch_t l = *base;
  l.name = name;
  l.incoming_fd = -1;
  l.tap_fd = -1;
  l.log_fd = log_fd;
  /* The save itself may outlast the run's deadline by SNAPSHOT_SAVE_MS; never more. */
  l.deadline_ms = deadline_ms + SNAPSHOT_SAVE_MS;
  vmproc_t vm = {.keeper = -1, .qemu = -1, .lifeline = -1, .slot = -1};
  int gfd = -1;
  qmp_t qmp = {.fd = -1};
  char tmp[PATH_MAX + 8];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int out = -1;
  r = boot_and_hello(q, dir, &l, &vm, &gfd, &qmp, deadline_ms, err);
  if (r == 0 && (r = write_pid_record(dir, q, vm.qemu, err)) == 0) {
    out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (out < 0)
      r = eph_error_set(err, errno, "%s: %s", tmp, strerror(errno));
  }
  uint64_t bytes = 0;
  json_object *a = NULL;
  if (r == 0) {
    int64_t dl = eph_now_ms() + SNAPSHOT_SAVE_MS;
    json_object *fdname = json_object_new_object();
    json_object_object_add(fdname, "fdname", json_object_new_string("vmstate"));
    a = json_object_new_object();
    json_object_object_add(a, "uri", json_object_new_string("fd:vmstate"));
    if ((r = qmp_exec(&qmp, "stop", NULL, -1, dl, NULL, err)) == 0 &&
        (r = qmp_exec(&qmp, "getfd", fdname, out, dl, NULL, err)) == 0 &&
        (r = qmp_exec(&qmp, "migrate", a, -1, dl, NULL, err)) == 0)
      r = qmp_wait_migration(&qmp, dl, &bytes, err);
    json_object_put(fdname);
    json_object_put(a);
  }
  if (out >= 0 && r == 0 && fsync(out) < 0)
    r = eph_error_set(err, errno, "%s: fsync: %s", tmp, strerror(errno));
  if (out >= 0)
    close(out);
  if (vm.keeper > 0) {
    qmp_close(&qmp);
    close(gfd);
    vm_stop(q, &vm, NULL);
  }
  close(log_fd);
  rm_tree(dir);
  if (r == 0 && chmod(tmp, 0644) == 0 && rename(tmp, path) == 0) {
    q->host->log(EPH_LOG_INFO, "snapshot %s saved in %" PRId64 " ms (%" PRIu64 " bytes)", path,
                 eph_now_ms() - t0, bytes);
    return 0;
  }
  unlink(tmp);
  return r < 0 ? eph_error_wrap(err, "saving the ready guest") : eph_error_set(err, errno,
                                                                               "%s: %s", path,
                                                                               strerror(errno));
}
