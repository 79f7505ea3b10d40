/* backend-qemu: the snapshot store, <state_dir>/qemu/snapshots (0700).
 *
 * A snapshot is a ready guest (booted to its hello, then `stop`ped and migrated to a file)
 * that later sandboxes restore with `-incoming fd:N` instead of booting. It is named and
 * checked by its identity: the SHA-256 of everything that shapes the saved machine and
 * nothing else (identity_of):
 *   - the guest image: image.sha256 as build-image.sh wrote it, and the identity (device,
 *     inode, size, mtime) of vmlinuz and initrd.cpio, so a replaced file changes it even
 *     when image.sha256 was left behind;
 *   - QEMU: its path and the identity of its binary (an upgrade replaces the file);
 *   - the machine: QEMU's whole command line as build_argv makes it for a cold boot without
 *     a NIC (accelerator, CPU model, RAM, vCPUs, devices, kernel command line: limits,
 *     console, `append`), minus what differs per start: the run's name and the measured
 *     TSC rate. The rate only steers a cold boot's clock calibration; with it in the name a
 *     1 MHz jitter of the measurement cold-booted and saved another ~200 MB.
 *
 * File layout: a 4096-byte text header, then QEMU's migration stream:
 *   "ephemeral-snapshot 1\nidentity <64 hex>\ndetail <one line>\n<the inputs>\n" + NULs.
 * The name is <first 32 hex of the identity>.vmstate. A restore reads the header and refuses
 * (logs, removes, rebuilds) a file whose recorded identity is not the one asked for, or that
 * is not a regular file owned by us and writable by nobody else. Written as NAME.tmp, fsynced,
 * renamed, directory fsynced: a crash never leaves a half snapshot under its name.
 *
 * In use: a restore holds a shared flock on its open file description, which QEMU shares
 * (the same fd, inherited) until it has loaded the stream; snapshot_gc skips a file it cannot
 * lock exclusively. Builds are serialised by an flock on <dir>/build.lock. Each restore sets
 * the file's mtime: the garbage collection removes the least recently used first, until the
 * store holds at most snapshot_max_bytes, never the snapshot just saved.
 */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "qemu.h"
#include "support/cleanup.h"

#define HEADER_BYTES 4096
#define MAGIC "ephemeral-snapshot 1\n"
#define NAME_HEX 32

/* The identity of a file: its path, device, inode, size and mtime (ns); of the file open
 * on fd when fd >= 0 (the image QEMU is given). */
static void
file_identity(const char *label, const char *path, int fd, char *out, size_t size)
{
  struct stat st;
  if (fd >= 0 ? fstat(fd, &st) < 0 : stat(path, &st) < 0)
    snprintf(out, size, "%s %s missing\n", label, path);
  else
    snprintf(out, size, "%s %s dev=%llu ino=%llu size=%lld mtime=%lld.%09ld\n", label, path,
             (unsigned long long)st.st_dev, (unsigned long long)st.st_ino, (long long)st.st_size,
             (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
}

/* The identity of the machine `l` describes: hex (65 bytes) = SHA-256 of the inputs text
 * (written to inputs, NUL-terminated), detail = one line for `snapshots list`. */
static int
identity_of(const qemu_t *q, const launch_t *l, char hex[65], char *inputs, size_t isize,
            char *detail, size_t dsize)
{
  char path[PATH_MAX], sha[1024] = "", line[PATH_MAX + 160];
  snprintf(path, sizeof path, "%s/image.sha256", q->cfg.image_dir);
  if (!read_small(path, sha, sizeof sha))
    snprintf(sha, sizeof sha, "missing");
  sha[strcspn(sha, "\n")] = '\0';
  size_t n = (size_t)snprintf(inputs, isize, "image %s\n", sha);
  snprintf(path, sizeof path, "%s/vmlinuz", q->cfg.image_dir);
  file_identity("kernel", path, l->image ? l->image->kernel_fd : -1, line, sizeof line);
  n += (size_t)snprintf(inputs + n, n < isize ? isize - n : 0, "%s", line);
  snprintf(path, sizeof path, "%s/initrd.cpio", q->cfg.image_dir);
  file_identity("initrd", path, l->image ? l->image->initrd_fd : -1, line, sizeof line);
  n += (size_t)snprintf(inputs + n, n < isize ? isize - n : 0, "%s", line);
  file_identity("qemu", q->qemu_path, -1, line, sizeof line);
  n += (size_t)snprintf(inputs + n, n < isize ? isize - n : 0, "%s", line);
  /* The command line of the cold boot that saves it, with a fixed name and no TSC rate. */
  launch_t m = *l;
  m.name = "ephemeral-snapshot";
  m.incoming_fd = -1;
  m.tap_fd = -1;
  m.tsc_khz = 0;
  m.paused = false;
  char *argv[64], store[16][512];
  build_argv(q, &m, argv, 64, store);
  n += (size_t)snprintf(inputs + n, n < isize ? isize - n : 0, "argv");
  for (char **a = argv + 1; *a; a++)
    n += (size_t)snprintf(inputs + n, n < isize ? isize - n : 0, " %s", *a);
  n += (size_t)snprintf(inputs + n, n < isize ? isize - n : 0, "\n");
  if (n >= isize)
    return -ENAMETOOLONG;
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  if (!EVP_Digest(inputs, n, md, &mdlen, EVP_sha256(), NULL) || mdlen != 32)
    return -EIO;
  for (unsigned i = 0; i < 32; i++)
    snprintf(hex + 2 * i, 3, "%02x", md[i]);
  snprintf(detail, dsize, "image %.12s %s %" PRIu64 " MiB %u vCPU tmp %" PRIu64 " MiB pids %u%s%s",
           sha, l->accel, l->memory_mib, l->vcpus, l->tmp_mib, l->pids,
           q->cfg.append[0] ? " append " : "", q->cfg.append);
  return 0;
}

/* Reads the header of an open snapshot: *identity (65 bytes) and detail. 0, or -EBADMSG
 * (no header: a file of an older version, or not a snapshot). */
static int
read_header(int fd, char identity[65], char *detail, size_t dsize)
{
  char h[HEADER_BYTES + 1];
  ssize_t n = pread(fd, h, HEADER_BYTES, 0);
  identity[0] = '\0';
  if (detail)
    detail[0] = '\0';
  if (n != HEADER_BYTES || memcmp(h, MAGIC, strlen(MAGIC)) != 0)
    return -EBADMSG;
  h[HEADER_BYTES] = '\0';
  const char *id = strstr(h, "\nidentity ");
  if (!id || sscanf(id, "\nidentity %64[0-9a-f]", identity) != 1 || strlen(identity) != 64)
    return -EBADMSG;
  const char *d = strstr(h, "\ndetail ");
  if (d && detail)
    snprintf(detail, dsize, "%.*s", (int)strcspn(d + 8, "\n"), d + 8);
  return 0;
}

/* Opens `path` for a restore when it is a snapshot of `identity`: a regular file owned by us
 * and writable by nobody else, with a matching header. Returns the fd (positioned at the
 * migration stream, shared flock held), -ENOENT when there is none, -EBADMSG when it was
 * refused (why in err). */
static int
open_valid(const char *path, const char *identity, eph_error_t *err)
{
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return errno == ENOENT ? -ENOENT : eph_error_set(err, EBADMSG, "%s: %s", path, strerror(errno));
  struct stat st;
  char have[65];
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022)) {
    close(fd);
    return eph_error_set(err, EBADMSG, "%s: not a regular file of ours writable only by us", path);
  }
  if (read_header(fd, have, NULL, 0) < 0 || strcmp(have, identity) != 0) {
    close(fd);
    return eph_error_set(err, EBADMSG, "%s: recorded identity %s is not %s", path,
                         have[0] ? have : "(none)", identity);
  }
  /* In use until QEMU (sharing this open file description) has read it; the mtime marks
   * the use for the garbage collection. */
  if (flock(fd, LOCK_SH) < 0 || lseek(fd, HEADER_BYTES, SEEK_SET) != HEADER_BYTES) {
    int e = errno;
    close(fd);
    return eph_error_set(err, e, "%s: %s", path, strerror(e));
  }
  futimens(fd, NULL);
  return fd;
}

/* Boots a guest to its hello and saves it (QMP stop, getfd, migrate fd:) to `path`, whose
 * header records identity, detail and inputs. The caller holds the build lock. */
static int
save_snapshot(qemu_t *q, const launch_t *base, const char *path, const char *identity,
              const char *detail, const char *inputs, int64_t deadline_ms, eph_error_t *err)
{
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
  l.paused = false;
  l.log_fd = log_fd;
  if (strcmp(l.accel, "tcg") == 0)
    l.tsc_khz = qemu_tsc_khz(q);
  /* The save itself may outlast the run's deadline by SNAPSHOT_SAVE_MS; never more. */
  l.deadline_ms = deadline_ms + SNAPSHOT_SAVE_MS;
  vmproc_t vm = {.keeper = -1, .qemu = -1, .lifeline = -1, .slot = -1};
  int gfd = -1;
  qmp_t qmp = {.fd = -1};
  char tmp[PATH_MAX + 8];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int out = -1;
  r = boot_and_hello(q, dir, &l, &vm, &gfd, &qmp, deadline_ms, err);
  if (r == 0 && (r = write_pid_record(dir, q, vm.qemu, l.name, err)) == 0) {
    out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    char h[HEADER_BYTES] = {0};
    snprintf(h, sizeof h, MAGIC "identity %s\ndetail %s\n%s", identity, detail, inputs);
    if (out < 0 || write(out, h, sizeof h) != (ssize_t)sizeof h)
      r = eph_error_set(err, errno ? errno : EIO, "%s: %s", tmp, strerror(errno ? errno : EIO));
  }
  uint64_t bytes = 0;
  if (r == 0) {
    int64_t dl = eph_now_ms() + SNAPSHOT_SAVE_MS;
    cleanup_json json_object *fdname = json_object_new_object();
    json_object_object_add(fdname, "fdname", json_object_new_string("vmstate"));
    cleanup_json json_object *a = json_object_new_object();
    json_object_object_add(a, "uri", json_object_new_string("fd:vmstate"));
    /* QEMU writes the stream at the file offset: after the header. */
    if ((r = qmp_exec(&qmp, "stop", NULL, -1, dl, NULL, err)) == 0 &&
        (r = qmp_exec(&qmp, "getfd", fdname, out, dl, NULL, err)) == 0 &&
        (r = qmp_exec(&qmp, "migrate", a, -1, dl, NULL, err)) == 0)
      r = qmp_wait_migration(&qmp, dl, &bytes, err);
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
  if (r == 0 && rename(tmp, path) == 0) {
    cleanup_close int dfd = open(q->snap_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0)
      fsync(dfd); /* the rename itself survives a crash */
    q->host->log(EPH_LOG_INFO, "snapshot %s saved in %" PRId64 " ms (%" PRIu64 " bytes)", path,
                 eph_now_ms() - t0, bytes);
    return 0;
  }
  int e = errno;
  unlink(tmp);
  return r < 0 ? eph_error_wrap(err, "saving the ready guest")
               : eph_error_set(err, e, "%s: %s", path, strerror(e));
}

int
snapshot_identity(const qemu_t *q, const launch_t *l, char hex[65])
{
  char detail[512];
  cleanup_free char *inputs = malloc(HEADER_BYTES);
  if (!inputs)
    return -ENOMEM;
  return identity_of(q, l, hex, inputs, HEADER_BYTES - 700, detail, sizeof detail) < 0 ? -EIO : 0;
}

int
snapshot_open(qemu_t *q, const launch_t *l, int64_t deadline_ms, eph_error_t *err)
{
  char identity[65], detail[512];
  cleanup_free char *inputs = malloc(HEADER_BYTES);
  if (!inputs)
    return eph_error_set(err, ENOMEM, "out of memory");
  /* The header holds magic, identity and detail before the inputs. */
  if (identity_of(q, l, identity, inputs, HEADER_BYTES - 700, detail, sizeof detail) < 0)
    return eph_error_set(err, EIO, "the snapshot's identity cannot be computed");
  char path[PATH_MAX], name[NAME_HEX + 16];
  snprintf(name, sizeof name, "%.*s.vmstate", NAME_HEX, identity);
  snprintf(path, sizeof path, "%s/%s", q->snap_dir, name);
  eph_error_t why = {0};
  int fd = open_valid(path, identity, &why);
  if (fd >= 0)
    return fd;
  char lock[PATH_MAX];
  snprintf(lock, sizeof lock, "%s/build.lock", q->snap_dir);
  cleanup_close int lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (lfd < 0 || flock(lfd, LOCK_EX) < 0)
    return eph_error_set(err, errno, "%s: %s", lock, strerror(errno));
  /* Someone may have built (or removed) it while we waited. */
  why = (eph_error_t){0};
  if ((fd = open_valid(path, identity, &why)) >= 0)
    return fd;
  if (fd == -EBADMSG) {
    q->host->log(EPH_LOG_WARN, "snapshot refused, rebuilding it: %s", why.message);
    if (unlink(path) < 0 && errno != ENOENT)
      return eph_error_set(err, errno, "%s: %s", path, strerror(errno));
  }
  int r = save_snapshot(q, l, path, identity, detail, inputs, deadline_ms, err);
  if (r < 0)
    return r;
  eph_error_t gerr = {0};
  if (snapshot_gc(q, -1, name, true, NULL, NULL, &gerr) < 0)
    q->host->log(EPH_LOG_WARN, "snapshot garbage collection: %s", gerr.message);
  why = (eph_error_t){0};
  fd = open_valid(path, identity, &why);
  return fd >= 0 ? fd : eph_error_set(err, -fd, "%s", why.message[0] ? why.message : path);
}

/* ------------------------------------------------------------ listing and pruning */

typedef struct snap_entry {
  char name[256];
  uint64_t bytes;
  int64_t used_s;
  bool in_use;
} snap_entry_t;

static int
by_use(const void *a, const void *b)
{
  const snap_entry_t *x = a, *y = b;
  if (x->used_s != y->used_s)
    return x->used_s < y->used_s ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* Whether a restore holds the file (shared flock): probed with a non-blocking exclusive
 * lock, released at once. */
static bool
held(int dfd, const char *name)
{
  int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0)
    return false;
  bool busy = flock(fd, LOCK_EX | LOCK_NB) < 0 && errno == EWOULDBLOCK;
  close(fd);
  return busy;
}

/* Every *.vmstate of the store, least recently used first (*out owned by the caller). */
static int
scan(const qemu_t *q, int dfd, snap_entry_t **out, size_t *count, eph_error_t *err)
{
  *out = NULL;
  *count = 0;
  int dd = dup(dfd);
  DIR *d = dd >= 0 ? fdopendir(dd) : NULL;
  if (!d) {
    int e = errno;
    if (dd >= 0)
      close(dd);
    return eph_error_set(err, e, "%s: %s", q->snap_dir, strerror(e));
  }
  rewinddir(d); /* a dup shares the offset of dfd, which another listing may have moved */
  size_t n = 0, cap = 0;
  snap_entry_t *v = NULL;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t len = strlen(e->d_name);
    struct stat st;
    if (len < 9 || strcmp(e->d_name + len - 8, ".vmstate") != 0 ||
        fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode) ||
        len >= sizeof v->name)
      continue;
    if (n == cap) {
      snap_entry_t *nv = realloc(v, (cap = cap ? cap * 2 : 16) * sizeof *v);
      if (!nv) {
        free(v);
        closedir(d);
        return eph_error_set(err, ENOMEM, "out of memory");
      }
      v = nv;
    }
    snprintf(v[n].name, sizeof v[n].name, "%s", e->d_name);
    v[n].bytes = (uint64_t)st.st_blocks * 512;
    v[n].used_s = st.st_mtim.tv_sec;
    v[n].in_use = held(dfd, e->d_name);
    n++;
  }
  closedir(d);
  if (n)
    qsort(v, n, sizeof *v, by_use);
  *out = v;
  *count = n;
  return 0;
}

static void
report(int dfd, const snap_entry_t *s, eph_cache_each_fn each, void *ctx)
{
  char identity[65] = "", detail[512] = "";
  int fd = openat(dfd, s->name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd >= 0) {
    read_header(fd, identity, detail, sizeof detail);
    close(fd);
  }
  eph_cache_entry_t e = {.struct_size = sizeof e,
                         .name = s->name,
                         .size_bytes = s->bytes,
                         .used_unix_s = s->used_s,
                         .identity = identity,
                         .detail = detail,
                         .in_use = s->in_use};
  each(ctx, &e);
}

/* Opens the store into *dfd and scans it (see scan()); a store not made yet is empty, with
 * *dfd left -1. */
static int
open_scan(const qemu_t *q, int *dfd, snap_entry_t **out, size_t *count, eph_error_t *err)
{
  *dfd = open(q->snap_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (*dfd < 0)
    return errno == ENOENT ? 0 : eph_error_set(err, errno, "%s: %s", q->snap_dir, strerror(errno));
  return scan(q, *dfd, out, count, err);
}

int
snapshot_list(const qemu_t *q, eph_cache_each_fn each, void *ctx, eph_error_t *err)
{
  cleanup_close int dfd = -1;
  cleanup_free snap_entry_t *v = NULL;
  size_t n = 0;
  int r = open_scan(q, &dfd, &v, &n, err);
  if (r < 0 || dfd < 0)
    return r;
  for (size_t i = 0; i < n; i++)
    report(dfd, &v[i], each, ctx);
  return (int)n;
}

int
snapshot_gc(const qemu_t *q, int64_t max_bytes, const char *keep, bool build_locked,
            eph_cache_each_fn each, void *ctx, eph_error_t *err)
{
  if (max_bytes < 0)
    max_bytes = q->cfg.snapshot_max_bytes;
  cleanup_close int dfd = -1;
  cleanup_free snap_entry_t *v = NULL;
  size_t n = 0;
  int r = open_scan(q, &dfd, &v, &n, err);
  if (r < 0 || dfd < 0)
    return r;
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++)
    total += v[i].bytes;
  int removed = 0;
  for (size_t i = 0; i < n && total > (uint64_t)max_bytes; i++) {
    if ((keep && strcmp(v[i].name, keep) == 0))
      continue;
    /* Locked exclusively while it goes: a restore cannot be starting from it meanwhile. */
    int fd = openat(dfd, v[i].name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
      continue;
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
      close(fd);
      continue; /* in use */
    }
    if (each) {
      v[i].in_use = false;
      report(dfd, &v[i], each, ctx);
    }
    int u = unlinkat(dfd, v[i].name, 0);
    close(fd);
    if (u == 0) {
      total -= v[i].bytes;
      removed++;
      q->host->log(EPH_LOG_INFO,
                   "snapshot %s/%s removed (%" PRIu64 " bytes; the store "
                   "keeps at most %" PRId64 ")",
                   q->snap_dir, v[i].name, v[i].bytes, max_bytes);
    }
  }
  /* Per-snapshot lock files of older versions (builds now share build.lock), and a save a
   * crash interrupted (NAME.vmstate.tmp) when no build runs. */
  cleanup_close int lfd = -1;
  if (!build_locked) {
    lfd = openat(dfd, "build.lock", O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    build_locked = lfd >= 0 && flock(lfd, LOCK_EX | LOCK_NB) == 0;
  }
  int dd = dup(dfd);
  DIR *d = dd >= 0 ? fdopendir(dd) : NULL;
  if (d)
    rewinddir(d); /* scan() read the shared offset to the end */
  else if (dd >= 0)
    close(dd);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    size_t len = strlen(e->d_name);
    if ((len > 13 && strcmp(e->d_name + len - 13, ".vmstate.lock") == 0) ||
        (build_locked && len > 12 && strcmp(e->d_name + len - 12, ".vmstate.tmp") == 0))
      unlinkat(dfd, e->d_name, 0);
  }
  if (d)
    closedir(d);
  return removed;
}
