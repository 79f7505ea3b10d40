/* backend-qemu: a microVM's own ids. Whether this process may give QEMU a uid of its own
 * (its capabilities decide, not being root: the packaged unit runs as its own user with
 * CAP_SETUID and CAP_SETGID only), the slot records that hand out those uids, the copy of
 * QEMU that QEMU's uid may not read (which makes it non-dumpable), and the user and mount
 * namespace QEMU starts in (set up by QEMU's child and its keeper: async-signal-safe).
 *
 * Why a user namespace: the unreadable copy must show at QEMU's own path (QEMU finds its
 * modules, accel-tcg-x86_64.so among them, and firmware relative to /proc/self/exe), which
 * takes a mount namespace, which takes CAP_SYS_ADMIN: in the user namespace its child makes
 * it holds that over its own mounts only. Its uid_map and gid_map map the microVM's uid and
 * gid (and the /dev/kvm group under KVM) onto themselves and nothing else, written by the
 * keeper with its CAP_SETUID/CAP_SETGID: QEMU's ids are the same kernel ids inside and out,
 * and it keeps no capability (dropped before exec; no ambient set survives a new user
 * namespace). */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/capability.h>

#include "qemu.h"

/* ------------------------------------------------------------ who may give ids */

/* The effective capability set, from capget (version 3: 64 capabilities). */
static bool
cap_effective(int cap)
{
  struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
  memset(data, 0, sizeof data);
  if (syscall(SYS_capget, &hdr, data) < 0)
    return false;
  return (data[cap / 32].effective >> (cap % 32)) & 1u;
}

/* Decides once (under q->lock, at the first create) how microVMs get their ids, logs the
 * verdict when it is anything but their own, and returns it. */
qemu_ids_t
qemu_ids_mode(qemu_t *q)
{
  if (q->ids != QEMU_IDS_UNKNOWN)
    return q->ids;
  bool su = cap_effective(CAP_SETUID), sg = cap_effective(CAP_SETGID);
  if (su && sg)
    q->ids = QEMU_IDS_OWN;
  else if (su || sg || geteuid() == 0 || getuid() == 0)
    /* Half the pair, or root without it: QEMU can get no ids of its own, and as root it
     * would run with root's. Refused: an operator who granted one meant separation. */
    q->ids = QEMU_IDS_REFUSED;
  else
    q->ids = QEMU_IDS_SHARED;
  if (q->ids == QEMU_IDS_SHARED)
    q->host->log(EPH_LOG_WARN,
                 "this process (uid %u) holds neither CAP_SETUID nor CAP_SETGID: "
                 "every microVM's QEMU runs as uid %u, dumpable, with this process's access "
                 "(run as root or with both capabilities for a uid per microVM)",
                 (unsigned)geteuid(), (unsigned)geteuid());
  else if (q->ids == QEMU_IDS_REFUSED)
    q->host->log(EPH_LOG_ERROR,
                 "this process (uid %u) holds %s: no microVM starts (it could "
                 "not get a uid of its own); grant both CAP_SETUID and CAP_SETGID",
                 (unsigned)geteuid(),
                 su   ? "CAP_SETUID but not CAP_SETGID"
                 : sg ? "CAP_SETGID but not CAP_SETUID"
                      : "root's uid without CAP_SETUID and CAP_SETGID");
  return q->ids;
}

/* ------------------------------------------------------------ the unreadable copy */

/* QEMU 7.2 never makes itself non-dumpable, and its own -runas cannot be combined with
 * -sandbox elevateprivileges=deny. The kernel marks a process non-dumpable when it execs a
 * binary its user cannot read (would_dump(), fs.suid_dumpable = 0): so QEMU runs from a
 * copy only we may read (0711, ours, <state_dir>/qemu/bin/, kept in step with the
 * original's size and mtime), bind-mounted over the original's path in QEMU's own mount
 * namespace (so QEMU still finds its modules and firmware relative to that path).
 * Non-dumpable, QEMU's /proc/PID files belong to root: nobody but root may ptrace it, read
 * its memory, environ or fds, and it never dumps core. Made at the first create (a host
 * using only the jail never pays for it). Returns 0, or -1 (logged; QEMU then runs
 * dumpable, still under its own uid). */
int
qemu_exec_copy(const qemu_t *q)
{
  char dir[PATH_MAX], path[PATH_MAX + 16], tmp[PATH_MAX + 32];
  snprintf(dir, sizeof dir, "%s/bin", q->base);
  snprintf(path, sizeof path, "%s/qemu", dir);
  struct stat src, dst;
  if (stat(q->qemu_path, &src) < 0)
    return -1; /* reported by launch_qemu() */
  int e = 0;
  if (mkdir(dir, 0711) < 0 && errno != EEXIST) {
    e = errno;
    goto fail;
  }
  if (stat(path, &dst) < 0 || dst.st_size != src.st_size ||
      dst.st_mtim.tv_sec != src.st_mtim.tv_sec || (dst.st_mode & 07777) != 0711 ||
      dst.st_uid != geteuid()) {
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    int in = open(q->qemu_path, O_RDONLY | O_CLOEXEC);
    int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0700);
    bool ok = in >= 0 && out >= 0;
    e = ok ? 0 : errno;
    char buf[65536];
    ssize_t n;
    while (ok && (n = read(in, buf, sizeof buf)) != 0) {
      if (n < 0 || write(out, buf, (size_t)n) != n) {
        e = n < 0 ? errno : EIO;
        ok = false;
      }
    }
    struct timespec times[2] = {src.st_atim, src.st_mtim};
    if (ok && (fchmod(out, 0711) < 0 || futimens(out, times) < 0 || fsync(out) < 0)) {
      e = errno;
      ok = false;
    }
    if (in >= 0)
      close(in);
    if (out >= 0 && close(out) < 0 && ok) {
      e = errno;
      ok = false;
    }
    if (ok && rename(tmp, path) < 0) {
      e = errno;
      ok = false;
    }
    if (!ok) {
      unlink(tmp);
      goto fail;
    }
  }
  return 0;
fail:
  q->host->log(EPH_LOG_WARN,
               "backend-qemu: %s: %s; QEMU runs from %s and stays dumpable "
               "(its own uid still keeps other microVMs out)",
               path, strerror(e ? e : EIO), q->qemu_path);
  return -1;
}

/* ------------------------------------------------------------ slots */

/* Claims a free slot k for the microVM `name`: its QEMU will run as uid_base + k. The slot
 * is held by <state_dir>/qemu/slots/slot-<k>, created O_EXCL, holding "NAME OWNER_PID
 * OWNER_START" so the sweep of a later start frees the slots of a dead owner. A slot whose
 * uid still runs a process (left by a crash) is skipped, never shared. */
int
claim_slot(const qemu_t *q, const char *name, eph_error_t *err)
{
  uint32_t h = 2166136261u; /* FNV-1a: spreads concurrent runs over the slots */
  for (const char *c = name; *c; c++)
    h = (h ^ (unsigned char)*c) * 16777619u;
  char text[256];
  snprintf(text, sizeof text, "%s %d %llu\n", name, (int)getpid(), q->owner_start);
  for (int64_t i = 0; i < q->cfg.slots; i++) {
    int slot = (int)((h + (uint64_t)i) % (uint64_t)q->cfg.slots);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/slot-%d", q->slot_dir, slot);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST)
      continue;
    if (fd < 0)
      return eph_error_set(err, errno, "slot record %s: %s", path, strerror(errno));
    ssize_t n = write(fd, text, strlen(text));
    int e = errno;
    close(fd);
    if (n != (ssize_t)strlen(text)) {
      unlink(path);
      return eph_error_set(err, n < 0 ? e : EIO, "slot record %s: %s", path,
                           strerror(n < 0 ? e : EIO));
    }
    uid_t uid = (uid_t)(q->cfg.uid_base + slot);
    if (uid_processes(uid, false) > 0) {
      q->host->log(EPH_LOG_WARN, "slot %d: uid %u still runs a process; slot skipped", slot,
                   (unsigned)uid);
      unlink(path);
      continue;
    }
    return slot;
  }
  return eph_error_set(err, EAGAIN, "all %" PRId64 " microVM slots are in use (key 'slots')",
                       q->cfg.slots);
}

void
release_slot(const qemu_t *q, int slot)
{
  if (slot < 0)
    return;
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/slot-%d", q->slot_dir, slot);
  unlink(path);
}

/* ------------------------------------------------------------ QEMU's namespaces */

/* Async-signal-safe from here on: called in the keeper and in QEMU's child, forked copies
 * of a threaded process. */

/* Appends the decimal form of v to buf at *n (no snprintf: not async-signal-safe). */
static void
put_uint(char *buf, size_t size, size_t *n, unsigned long v)
{
  char d[24];
  size_t k = 0;
  do
    d[k++] = (char)('0' + v % 10);
  while ((v /= 10) && k < sizeof d);
  while (k && *n + 1 < size)
    buf[(*n)++] = d[--k];
  buf[*n] = '\0';
}

static void
put_str(char *buf, size_t size, size_t *n, const char *s)
{
  while (*s && *n + 1 < size)
    buf[(*n)++] = *s++;
  buf[*n] = '\0';
}

void
ids_log_errno(int fd, const char *what, int e)
{
  char msg[256];
  size_t n = 0;
  put_str(msg, sizeof msg, &n, "backend-qemu: ");
  put_str(msg, sizeof msg, &n, what);
  put_str(msg, sizeof msg, &n, " failed: errno ");
  put_uint(msg, sizeof msg, &n, (unsigned long)e);
  put_str(msg, sizeof msg, &n, e == EPERM ? " (EPERM)\n" : e == EINVAL ? " (EINVAL)\n" : "\n");
  (void)!write(fd, msg, n);
}

/* Writes /proc/PID/FILE. Returns 0 or an errno. */
static int
write_proc_map(pid_t pid, const char *file, const char *text, size_t len)
{
  char path[64];
  size_t n = 0;
  put_str(path, sizeof path, &n, "/proc/");
  put_uint(path, sizeof path, &n, (unsigned long)pid);
  put_str(path, sizeof path, &n, "/");
  put_str(path, sizeof path, &n, file);
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return errno;
  ssize_t w = write(fd, text, len);
  int e = w == (ssize_t)len ? 0 : w < 0 ? errno : EIO;
  if (close(fd) < 0 && !e)
    e = errno;
  return e;
}

int
ids_write_maps(pid_t child, uid_t id, gid_t extra_gid, const char **what)
{
  char map[96];
  size_t n = 0;
  put_uint(map, sizeof map, &n, id);
  put_str(map, sizeof map, &n, " ");
  put_uint(map, sizeof map, &n, id);
  put_str(map, sizeof map, &n, " 1\n");
  size_t uid_len = n;
  int e = write_proc_map(child, "uid_map", map, uid_len);
  if (e) {
    *what = "writing the microVM's uid_map";
    return e;
  }
  if (extra_gid != (gid_t)-1 && extra_gid != id) {
    put_uint(map, sizeof map, &n, extra_gid);
    put_str(map, sizeof map, &n, " ");
    put_uint(map, sizeof map, &n, extra_gid);
    put_str(map, sizeof map, &n, " 1\n");
  }
  if ((e = write_proc_map(child, "gid_map", map, n)))
    *what = "writing the microVM's gid_map";
  return e;
}

int
ids_enter_namespaces(int sync, const char *exec_src, const char *qemu_path, const char **what)
{
  char c = 'u';
  errno = 0;
  if (unshare(CLONE_NEWUSER) < 0) {
    *what = "unshare(CLONE_NEWUSER) for the microVM's own ids";
    return errno;
  }
  /* The keeper writes our maps now; 'm' back when it has. */
  if (write(sync, &c, 1) != 1 || read(sync, &c, 1) != 1 || c != 'm') {
    *what = "waiting for the keeper to map the microVM's ids";
    return errno ? errno : EPROTO;
  }
  /* A mount namespace of the new user namespace's: mounts here never reach ours (it is
   * made a slave of ours by the kernel, and again below). */
  if (unshare(CLONE_NEWNS) < 0) {
    *what = "unshare(CLONE_NEWNS) in the microVM's user namespace";
    return errno;
  }
  if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0) {
    *what = "making QEMU's mounts a slave of ours";
    return errno;
  }
  if (exec_src && mount(exec_src, qemu_path, NULL, MS_BIND, NULL) < 0) {
    *what = "binding the unreadable QEMU copy over QEMU's path";
    return errno;
  }
  /* QEMU opens no path of its own there (its images, sockets and log are passed fds), but
   * they are writable by every uid: a QEMU a guest escaped into could fill the host's tmpfs
   * or leave files for another tenant's QEMU. An empty read-only tmpfs over each, in this
   * mount namespace only. A directory the host lacks is skipped. */
  static const char *const world_writable[] = {"/tmp", "/var/tmp", "/dev/shm"};
  for (size_t i = 0; i < sizeof world_writable / sizeof *world_writable; i++)
    if (mount("tmpfs", world_writable[i], "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "mode=0555,size=4k,nr_inodes=1") < 0 &&
        errno != ENOENT) {
      *what = "masking a world-writable directory (/tmp, /var/tmp, /dev/shm) from QEMU";
      return errno;
    }
  return 0;
}

int
ids_drop_caps(void)
{
  struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct none[_LINUX_CAPABILITY_U32S_3];
  memset(none, 0, sizeof none);
  /* The bounding set too, where we may (CAP_SETPCAP: root, or in QEMU's user namespace, whose
   * set starts full): nothing QEMU execs could gain one back. EINVAL: past the last one. */
  for (int cap = 0; cap < 64; cap++)
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno == EINVAL)
      break;
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
    return errno;
  return syscall(SYS_capset, &hdr, none) < 0 ? errno : 0;
}
