/* backend-jail: the cloned child's set-up of the new root, in plain order.
 *
 * jail_plan_build() (plan.c) runs once at init: it decides every mount, symlink and file of
 * the new root and builds the netlink "lo up" message. jail_child_main() is what the child
 * runs after clone(): a clone of a possibly multi-threaded host, either sharing its memory
 * while the cloning thread sleeps (CLONE_VM | CLONE_VFORK, jail.c) or a copy of it, so it
 * only does system calls on memory prepared before the clone (no malloc, no stdio, no
 * locks) and writes nothing but its own stack: its state lives in its copy of the
 * arguments (`local`), never in globals. Each step names itself so a failure reads
 * "mount proc on /proc: Operation not permitted".
 *
 * The steps, as bubblewrap orders them:
 *   0. a run granting web: make a netlink and a TCP socket in this netns and send them to
 *      the parent, which puts the proxy's listener on our lo with them (net.c)
 *   1. wait for the parent: uid/gid maps written (its cgroups are joined meanwhile, see 9)
 *   2. unshare(CLONE_NEWTIME) with offsets: the guest's children see clocks that start at
 *      zero (new_clocks), written while our uid is still the host's
 *   3. become root of the user namespace (setresgid/setgroups/setresuid): from here the
 *      host sees the sandbox's uids as the unprivileged slot range, never host root
 *   4. PR_SET_PDEATHSIG(SIGKILL) again (set first thing, before step 0; the uid change
 *      cleared it), then check the parent is still there
 *   5. make every mount private: nothing propagates back to the host
 *   6. one read-only overlay of /usr and one of /etc in a small tmpfs at the root's mount
 *      point (mount_groups); mount the root tmpfs over it; build /usr (the usr_binds list,
 *      bound from the /usr overlay), /bin.., /etc, /dev from the plan
 *   7. /proc (this pid namespace's, host identifiers masked: mask_proc; per-user limits of
 *      inotify and fanotify: user_limits), /dev/pts (new instance, max= ptys), /dev/shm
 *      and /tmp tmpfs (size = scratch limit: a full disk is ENOSPC, not an OOM kill)
 *   8. loopback up (netlink), hostname; a run granting web: IPv6 off
 *   9. wait until we are in our cgroups (normally born there; a daemon that cannot step its
 *      thread into them moves us, and on cgroup v1 that move waits ~25 ms for an RCU grace
 *      period: steps 2-8 run meanwhile), then unshare(CLONE_NEWCGROUP): the
 *      cgroup namespace is rooted at the sandbox's own group; pivot_root into the new root,
 *      detach the old root, remount / read-only
 *  10. RLIMIT_NOFILE, no_new_privs, close every other fd
 *  11. exec ephemeral-guest --fd 3 --nofile N as PID 1 (from an fd opened on the host)
 * Capabilities are dropped and seccomp applied by the guest (to itself at start-up, which
 * every worker command inherits; see guest/worker.c and guest/filter.c).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "jail.h"
#include "support/netns.h"

#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef OPEN_TREE_CLOEXEC
#define OPEN_TREE_CLOEXEC O_CLOEXEC
#endif
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#endif

/* ------------------------------------------------------------ the child (after clone) */

/* Async-signal-safe string building into a fixed buffer. */
static void
cat(char *dst, size_t size, const char *s)
{
  size_t n = strlen(dst);
  while (*s && n + 1 < size)
    dst[n++] = *s++;
  dst[n] = '\0';
}

static void
cat_u64(char *dst, size_t size, uint64_t v)
{
  char tmp[24];
  int i = (int)sizeof tmp - 1;
  tmp[i] = '\0';
  do {
    tmp[--i] = (char)('0' + v % 10);
    v /= 10;
  } while (v && i > 0);
  cat(dst, size, tmp + i);
}

/* Reports the failed step and its errno to the parent, then exits. */
__attribute__((noreturn)) static void
die(const jail_child_args_t *a, const char *step, const char *path)
{
  jail_child_error_t e;
  memset(&e, 0, sizeof e);
  e.errnum = errno ? errno : EIO;
  cat(e.step, sizeof e.step, step);
  if (path) {
    cat(e.step, sizeof e.step, " ");
    cat(e.step, sizeof e.step, path);
  }
  ssize_t n = write(a->err_fd, &e, sizeof e);
  (void)n;
  _exit(127);
}

/* newroot + target, into buf. */
static const char *
in_root(char *buf, size_t size, const jail_plan_t *p, const char *target)
{
  buf[0] = '\0';
  cat(buf, size, p->newroot);
  cat(buf, size, target);
  return buf;
}

/* Step 6's first half: the groups' overlays (jail.h) in a small tmpfs on the root's mount
 * point, which the root tmpfs then covers: reachable only through groups_fd until the old
 * root is detached, and then not at all. A group whose overlay cannot be mounted (its
 * directory has mounts below it on this host) is not an error: its entries are then made
 * one by one, as an overlay or a bind each (do_op). */
static void
mount_groups(jail_child_args_t *a)
{
  const jail_plan_t *p = a->plan;
  char path[4096];
  if (!p->n_groups || mount("tmpfs", p->newroot, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                            "mode=0700,size=16k,nr_inodes=16") < 0)
    return;
  if (mkdir(in_root(path, sizeof path, p, JAIL_OVERLAY_EMPTY), 0755) < 0)
    return;
  for (size_t g = 0; g < p->n_groups; g++) {
    char name[16] = "/";
    cat(name, sizeof name, p->groups[g].name);
    in_root(path, sizeof path, p, name);
    a->group_up[g] =
        mkdir(path, 0755) == 0 &&
        mount("overlay", path, "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV, p->groups[g].opts) == 0;
  }
  a->groups_fd = open(p->newroot, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (a->groups_fd < 0)
    for (size_t g = 0; g < p->n_groups; g++)
      a->group_up[g] = false;
}

/* Makes dst, the mount point of a bind: a directory or an empty file. */
static void
bind_target(const jail_child_args_t *a, const jail_op_t *o, const char *dst)
{
  if (o->is_dir) {
    if (mkdir(dst, 0755) < 0 && errno != EEXIST)
      die(a, "mkdir bind target", o->target);
  } else {
    int fd = open(dst, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
      die(a, "create bind target", o->target);
    close(fd);
  }
}

/* Read-only overlay of the host directory (data: its options) on dst. */
static void
overlay_on(const jail_child_args_t *a, const jail_op_t *o, const char *dst)
{
  if (mkdir(dst, 0755) < 0 && errno != EEXIST)
    die(a, "mkdir overlay target", o->target);
  if (mount("overlay", dst, "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV, o->data) < 0)
    die(a, "overlay mount", o->target);
}

/* Bind of host path source on dst, remounted read-only (devices: noexec) and nosuid. */
static void
bind_host(const jail_child_args_t *a, const jail_op_t *o, const char *source, const char *dst,
          bool device)
{
  bind_target(a, o, dst);
  if (mount(source, dst, NULL, MS_BIND | MS_REC, NULL) < 0)
    die(a, "bind mount", o->target);
  unsigned long fl = MS_BIND | MS_REMOUNT | MS_NOSUID | o->keep;
  fl |= device ? MS_NOEXEC : MS_RDONLY | MS_NODEV;
  if (mount(NULL, dst, NULL, fl, NULL) < 0)
    die(a, "remount read-only", o->target);
}

/* The entry o->source of its group's overlay on dst: a clone of that part of the overlay's
 * mount (read-only, nosuid, nodev, as the overlay was mounted) moved into the new root. */
static void
bind_from_group(const jail_child_args_t *a, const jail_op_t *o, const char *dst)
{
  char rel[4096] = "";
  cat(rel, sizeof rel, a->plan->groups[o->group].name);
  cat(rel, sizeof rel, "/");
  cat(rel, sizeof rel, o->source);
  int t = (int)syscall(SYS_open_tree, a->groups_fd, rel, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  if (t < 0)
    die(a, "open_tree (the shared overlay)", o->target);
  bind_target(a, o, dst);
  if (syscall(SYS_move_mount, t, "", AT_FDCWD, dst, MOVE_MOUNT_F_EMPTY_PATH) < 0)
    die(a, "move_mount (the shared overlay)", o->target);
  close(t);
}

static void
do_op(const jail_child_args_t *a, const jail_op_t *o)
{
  char dst[4096];
  in_root(dst, sizeof dst, a->plan, o->target);
  switch (o->kind) {
  case JAIL_OP_DIR:
    if (mkdir(dst, 0755) < 0 && errno != EEXIST)
      die(a, "mkdir", o->target);
    return;
  case JAIL_OP_SYMLINK:
    if (symlink(o->source, dst) < 0)
      die(a, "symlink", o->target);
    return;
  case JAIL_OP_FILE: {
    int fd = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
      die(a, "create", o->target);
    if (write(fd, o->data, o->bytes) != (ssize_t)o->bytes)
      die(a, "write", o->target);
    close(fd);
    return;
  }
  case JAIL_OP_OVERLAY_RO:
    overlay_on(a, o, dst);
    return;
  case JAIL_OP_BIND_RO:
  case JAIL_OP_BIND_DEV:
    bind_host(a, o, o->source, dst, o->kind == JAIL_OP_BIND_DEV);
    return;
  case JAIL_OP_GROUP_BIND:
    if (a->group_up[o->group])
      bind_from_group(a, o, dst);
    else if (o->data)
      overlay_on(a, o, dst);
    else
      bind_host(a, o, o->target, dst, false);
    return;
  }
}

static void
mount_tmpfs(const jail_child_args_t *a, const char *target, const char *mode, uint64_t bytes,
            unsigned long flags)
{
  char dst[4096], opts[128] = "";
  in_root(dst, sizeof dst, a->plan, target);
  cat(opts, sizeof opts, "mode=");
  cat(opts, sizeof opts, mode);
  cat(opts, sizeof opts, ",size=");
  cat_u64(opts, sizeof opts, bytes);
  /* Inodes are capped too (one per 4 KiB of size): a flood of empty files then ends in
   * ENOSPC inside the sandbox, not in an OOM kill of kernel memory charged to it. */
  cat(opts, sizeof opts, ",nr_inodes=");
  cat_u64(opts, sizeof opts, bytes / 4096 > 1024 ? bytes / 4096 : 1024);
  if (mount("tmpfs", dst, "tmpfs", flags, opts) < 0)
    die(a, "mount tmpfs on", target);
}

/* Host identifiers and host-wide figures in the sandbox's own /proc, each covered by a
 * read-only bind of a file written here (in the root tmpfs, unlinked once bound: the mount
 * keeps the inode). The worker has neither the capability nor the system call (seccomp
 * refuses umount2) to uncover them.
 *   /proc/cmdline                        the host kernel's command line: empty
 *   /proc/sys/kernel/random/boot_id      names the host boot: a UUID of this sandbox
 *   /proc/loadavg                        the host's load (other tenants' activity): zeros
 *   /proc/meminfo                        the host's RAM: this sandbox's memory limit
 * What stays visible is listed in the security notes (uptime, /proc/stat, cpuinfo, ...). */
static void
mask_proc(const jail_child_args_t *a)
{
  char meminfo[512] = "", boot_id[64] = "", kb[24] = "";
  cat_u64(kb, sizeof kb, a->memory_bytes / 1024);
  static const char *const keys[] = {"MemTotal",   "MemFree",   "MemAvailable", "Buffers", "Cached",
                                     "SwapCached", "SwapTotal", "SwapFree",     NULL};
  for (size_t i = 0; keys[i]; i++) {
    cat(meminfo, sizeof meminfo, keys[i]);
    cat(meminfo, sizeof meminfo, ":");
    for (size_t pad = strlen(keys[i]); pad < 15; pad++)
      cat(meminfo, sizeof meminfo, " ");
    cat(meminfo, sizeof meminfo, i < 3 ? kb : "0");
    cat(meminfo, sizeof meminfo, " kB\n");
  }
  cat(boot_id, sizeof boot_id, a->boot_id);
  cat(boot_id, sizeof boot_id, "\n");
  const struct {
    const char *name, *target, *text;
  } masks[] = {
      {"cmdline", "/proc/cmdline", ""},
      {"boot_id", "/proc/sys/kernel/random/boot_id", boot_id},
      {"loadavg", "/proc/loadavg", "0.00 0.00 0.00 1/1 1\n"},
      {"meminfo", "/proc/meminfo", meminfo},
  };
  char dir[4096], src[4096], dst[4096];
  in_root(dir, sizeof dir, a->plan, "/.proc-masks");
  if (mkdir(dir, 0700) < 0)
    die(a, "mkdir", "/.proc-masks");
  for (size_t i = 0; i < sizeof masks / sizeof masks[0]; i++) {
    src[0] = '\0';
    cat(src, sizeof src, dir);
    cat(src, sizeof src, "/");
    cat(src, sizeof src, masks[i].name);
    int fd = open(src, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
    size_t len = strlen(masks[i].text);
    if (fd < 0 || write(fd, masks[i].text, len) != (ssize_t)len)
      die(a, "write the mask of", masks[i].target);
    close(fd);
    in_root(dst, sizeof dst, a->plan, masks[i].target);
    if (mount(src, dst, NULL, MS_BIND, NULL) < 0)
      die(a, "mask (bind over)", masks[i].target);
    if (mount(NULL, dst, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
              NULL) < 0)
      die(a, "mask (remount read-only)", masks[i].target);
    if (unlink(src) < 0)
      die(a, "unlink the mask of", masks[i].target);
  }
  if (rmdir(dir) < 0)
    die(a, "rmdir", "/.proc-masks");
}

/* Per-user-namespace limits of kernel objects the kernel counts per user, not per cgroup.
 * They are charged at every level of the user-namespace tree, and at the host's level under
 * the uid that created the namespace: the daemon's. Without a limit of its own, one sandbox
 * takes the daemon's uid's whole host quota (fs.inotify.max_user_instances, 128 by default):
 * every other sandbox, and the daemon itself, then gets EMFILE from inotify_init. Written as
 * root of the sandbox's namespace (these files are the namespace's own); a file the kernel
 * lacks (no fanotify) is skipped. */
static void
user_limits(const jail_child_args_t *a)
{
  static const struct {
    const char *file;
    unsigned value;
  } limits[] = {
      {"/proc/sys/user/max_inotify_instances", JAIL_MAX_INOTIFY_INSTANCES},
      {"/proc/sys/user/max_inotify_watches", JAIL_MAX_INOTIFY_WATCHES},
      {"/proc/sys/user/max_fanotify_groups", JAIL_MAX_FANOTIFY_GROUPS},
      {"/proc/sys/user/max_fanotify_marks", JAIL_MAX_FANOTIFY_MARKS},
  };
  char path[4096], text[24];
  for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
    in_root(path, sizeof path, a->plan, limits[i].file);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT)
      continue;
    text[0] = '\0';
    cat_u64(text, sizeof text, limits[i].value);
    size_t len = strlen(text);
    if (fd < 0 || write(fd, text, len) != (ssize_t)len)
      die(a, "write", limits[i].file);
    close(fd);
  }
}

/* A time namespace whose boot and monotonic clocks start near zero: /proc/uptime, the boot
 * time in /proc/stat, process start times and CLOCK_MONOTONIC/CLOCK_BOOTTIME then tell the
 * sandbox's age, not the host's. unshare(CLONE_NEWTIME) applies to our children only (the
 * guest stays on the host's clocks, every command it forks gets the new ones), and the
 * offsets can be written until the first child enters. Whole seconds, so both clocks stay
 * positive. */
static void
new_clocks(const jail_child_args_t *a)
{
  struct timespec mono, boot;
  if (unshare(CLONE_NEWTIME) < 0)
    die(a, "unshare(CLONE_NEWTIME)", NULL);
  if (clock_gettime(CLOCK_MONOTONIC, &mono) < 0 || clock_gettime(CLOCK_BOOTTIME, &boot) < 0)
    die(a, "clock_gettime", NULL);
  char text[128] = "monotonic -";
  cat_u64(text, sizeof text, (uint64_t)mono.tv_sec);
  cat(text, sizeof text, " 0\nboottime -");
  cat_u64(text, sizeof text, (uint64_t)boot.tv_sec);
  cat(text, sizeof text, " 0\n");
  /* Written before the uid change (step 3), as the host's uid: our /proc/self files are
   * our euid's while our mm is dumpable and root's when it is not, so a root host writes
   * them either way, and one that is not root clones a copy of its (dumpable) mm
   * (spawn.c). After the change they were root's: it clears the flag, and setting the flag
   * again for this write was undone by any other child's uid change in between, all of
   * them sharing the host's mm under CLONE_VM (EACCES here, about once in 200 creates
   * made six at a time). */
  int fd = open("/proc/self/timens_offsets", O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    die(a, "open", "/proc/self/timens_offsets");
  if (write(fd, text, strlen(text)) != (ssize_t)strlen(text))
    die(a, "write", "/proc/self/timens_offsets");
  close(fd);
}

/* A run granting web: no IPv6 in the sandbox's netns (the proxy's listener is IPv4 only),
 * written through our own /proc (the host's may be read-only). */
static void
ipv6_off(const jail_child_args_t *a)
{
  static const char *const names[] = {"all", "default", "lo", NULL};
  char proc[4096];
  const char *failed = NULL;
  int r = eph_ipv6_off(in_root(proc, sizeof proc, a->plan, "/proc"), names, &failed);
  if (r < 0) {
    errno = -r;
    die(a, "disable IPv6 (net.ipv6.conf.*.disable_ipv6) of", failed);
  }
}

/* `ip link set lo up` with the message prepared at init. */
static void
loopback_up(const jail_child_args_t *a)
{
  int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (fd < 0)
    die(a, "netlink socket", NULL);
  struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
  if (sendto(fd, a->plan->lo_msg, a->plan->lo_msg_bytes, 0, (struct sockaddr *)&kernel,
             sizeof kernel) < 0)
    die(a, "netlink send (lo up)", NULL);
  union {
    struct nlmsghdr h;
    char buf[1024];
  } ack;
  ssize_t n = recv(fd, &ack, sizeof ack, 0);
  if (n < (ssize_t)(NLMSG_HDRLEN + sizeof(struct nlmsgerr)))
    die(a, "netlink ack (lo up)", NULL);
  if (ack.h.nlmsg_type == NLMSG_ERROR) {
    const struct nlmsgerr *e = NLMSG_DATA(&ack.h);
    if (e->error != 0) {
      errno = -e->error;
      die(a, "bring lo up", NULL);
    }
  }
  close(fd);
}

/* Whether the host process has died (its pidfd is readable). */
static bool
host_gone(int host_pidfd)
{
  struct pollfd pf = {.fd = host_pidfd, .events = POLLIN};
  return host_pidfd >= 0 && poll(&pf, 1, 0) > 0 && (pf.revents & POLLIN);
}

void
jail_child_main(const jail_child_args_t *args)
{
  const jail_plan_t *p = args->plan;
  char go;
  char path[4096];

  /* Die with the host thread that created us from the start, not from step 4 on: until
   * then we wait for the host's bytes on the go socket, and its hang-up can be held back by
   * any other copy of the host's end (jail.h, host_pidfd). The uid change of step 3 clears
   * it; step 4 sets it again. Checked once set: the host may have died since the clone. */
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0 || host_gone(args->host_pidfd))
    _exit(127);

  /* 0. Fixed fd numbers: guest stream 3, error pipe 4 and guest binary 5 (both CLOEXEC).
   * Everything is first moved above them so no dup3() overwrites another. */
  for (int i = 0; i < 3; i++)
    if (args->close_fds[i] >= 0)
      close(args->close_fds[i]);
  jail_child_args_t local = *args;
  jail_child_args_t *a = &local;
  local.groups_fd = -1;
  memset(local.group_up, 0, sizeof local.group_up);
  int hi_guest = fcntl(args->guest_fd, F_DUPFD_CLOEXEC, 10);
  int hi_err = fcntl(args->err_fd, F_DUPFD_CLOEXEC, 10);
  int hi_exe = fcntl(args->exe_fd, F_DUPFD_CLOEXEC, 10);
  int hi_go = fcntl(args->go_fd, F_DUPFD_CLOEXEC, 10);
  int hi_host = args->host_pidfd >= 0 ? fcntl(args->host_pidfd, F_DUPFD_CLOEXEC, 10) : -1;
  if (hi_err < 0)
    _exit(127);
  local.err_fd = hi_err;
  if (hi_guest < 0 || hi_exe < 0 || hi_go < 0 || (args->host_pidfd >= 0 && hi_host < 0))
    die(a, "dup fds", NULL);
  local.go_fd = hi_go;
  local.host_pidfd = hi_host;
  if (dup3(hi_err, 4, O_CLOEXEC) < 0)
    die(a, "dup3 error pipe", NULL);
  local.err_fd = 4;
  if (dup3(hi_exe, 5, O_CLOEXEC) < 0 || dup2(hi_guest, JAIL_GUEST_FD) < 0)
    die(a, "dup3 guest fds", NULL);
  local.exe_fd = 5;
  local.guest_fd = JAIL_GUEST_FD;
  /* Cloned with CLONE_VM: the host's helper thread waits for this to read our pid. */
  if (a->announce && send(a->go_fd, "s", 1, MSG_NOSIGNAL) != 1)
    die(a, "announcing the child to the parent", NULL);
  /* 0. A run granting web: the sockets of the proxy's listener to the parent (net.c). */
  const char *step = NULL;
  int nr = a->network ? jail_net_child_sockets(a->go_fd, &step) : 0;
  if (nr < 0) {
    errno = -nr;
    die(a, step, NULL);
  }

  /* 1. The parent writes our uid/gid maps, then says go. */
  errno = 0;
  if (read(a->go_fd, &go, 1) != 1)
    die(a, "waiting for the parent (uid/gid maps)", NULL);

  /* 2. Clocks of our own, before the uid change (new_clocks says why). (The cgroup
   * namespace comes at 9, once we are in our groups.) */
  new_clocks(a);

  /* 3. Become uid/gid 0 of the user namespace: until now our kernel uid was the host's.
   * Raw system calls: glibc's wrappers broadcast the change to every thread of the
   * process (setxid), and the host's other threads do not exist in this clone: they would
   * wait forever. */
  if (syscall(SYS_setresgid, 0, 0, 0) < 0)
    die(a, "setresgid(0) in the user namespace", NULL);
  if (syscall(SYS_setgroups, 0, NULL) < 0)
    die(a, "setgroups()", NULL);
  if (syscall(SYS_setresuid, 0, 0, 0) < 0)
    die(a, "setresuid(0) in the user namespace", NULL);

  /* 4. Die with the host thread that created us, again: the uid change cleared it. Then
   * check the host did not die meanwhile (its pidfd; the go socket's writer stays open
   * until create() returns, so a hang-up means the creating thread died too). */
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
    die(a, "prctl(PR_SET_PDEATHSIG)", NULL);
  struct pollfd pf = {.fd = a->go_fd, .events = POLLIN};
  if ((poll(&pf, 1, 0) > 0 && (pf.revents & (POLLHUP | POLLERR))) || host_gone(a->host_pidfd)) {
    errno = ESRCH;
    die(a, "the parent died during set-up", NULL);
  }

  /* 5. Nothing we mount propagates to the host. */
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
    die(a, "make / private (MS_REC|MS_PRIVATE)", NULL);

  /* 6. The shared overlays below the root, the root: a small tmpfs, then the plan (/usr,
   * symlinks, /etc, /dev nodes). */
  mount_groups(a);
  if (mount("tmpfs", p->newroot, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m") < 0)
    die(a, "mount the root tmpfs on", p->newroot);
  for (size_t i = 0; i < p->n_ops; i++)
    do_op(a, &p->ops[i]);

  /* 7. Kernel filesystems of our own namespaces and the size-capped tmpfs mounts. */
  if (mount("proc", in_root(path, sizeof path, p, "/proc"), "proc",
            MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
    die(a, "mount proc on", "/proc");
  mask_proc(a);
  user_limits(a);
  /* Every devpts instance but the host's draws from one host-wide pool (kernel.pty.max minus
   * kernel.pty.reserve, 3072 by default): without max= one sandbox takes it all and every
   * other sandbox and container gets ENOSPC from /dev/ptmx. */
  if (mount("devpts", in_root(path, sizeof path, p, "/dev/pts"), "devpts", MS_NOSUID | MS_NOEXEC,
            "newinstance,ptmxmode=0666,mode=0620,gid=5,max=" JAIL_STR(JAIL_MAX_PTYS)) < 0)
    die(a, "mount devpts on", "/dev/pts");
  mount_tmpfs(a, "/dev/shm", "1777", p->shm_bytes, MS_NOSUID | MS_NODEV | MS_NOEXEC);
  mount_tmpfs(a, "/tmp", "1777", a->scratch_bytes, MS_NOSUID | MS_NODEV);

  /* 8. Network: loopback up. When the run grants web, the parent has already put the
   * proxy's address and listener on lo (net.c), before "go"; IPv6 goes. */
  loopback_up(a);
  if (a->network)
    ipv6_off(a);
  if (sethostname(p->hostname, strlen(p->hostname)) < 0)
    die(a, "sethostname", p->hostname);

  /* 9. Switch roots: pivot_root(".", ".") stacks the old root under the new one, and the
   * detach then removes every host mount from this namespace. */
  /* 9. The parent says 'c' once we are in our cgroups; nothing of the guest runs before.
   * Then a cgroup namespace rooted at the sandbox's own group. */
  errno = 0;
  if (read(a->go_fd, &go, 1) != 1)
    die(a, "waiting for the parent (cgroups)", NULL);
  if (unshare(CLONE_NEWCGROUP) < 0)
    die(a, "unshare(CLONE_NEWCGROUP)", NULL);
  if (chdir(p->newroot) < 0)
    die(a, "chdir", p->newroot);
  if (syscall(SYS_pivot_root, ".", ".") < 0)
    die(a, "pivot_root", p->newroot);
  if (umount2(".", MNT_DETACH) < 0)
    die(a, "detach the old root", NULL);
  if (chdir("/") < 0)
    die(a, "chdir /", NULL);
  if (mount(NULL, "/", NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0)
    die(a, "remount / read-only", NULL);

  /* 10. Limits and privileges the guest and every worker command inherit. Every host fd
   * but 3 (guest stream), 4 (error pipe) and 5 (guest binary), both CLOEXEC, is closed. */
  if (syscall(SYS_close_range, 6U, ~0U, 0U) < 0)
    die(a, "close_range", NULL);
  struct rlimit rl = {a->nofile, a->nofile};
  if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
    die(a, "setrlimit(RLIMIT_NOFILE)", NULL);
  struct rlimit core = {0, 0};
  if (setrlimit(RLIMIT_CORE, &core) < 0)
    die(a, "setrlimit(RLIMIT_CORE)", NULL);
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
    die(a, "prctl(PR_SET_NO_NEW_PRIVS)", NULL);
  int devnull = open("/dev/null", O_RDWR);
  if (devnull < 0)
    die(a, "open /dev/null", NULL);
  for (int fd = 0; fd < 3; fd++)
    if (dup2(devnull, fd) < 0)
      die(a, "dup2 /dev/null", NULL);
  if (devnull > 2)
    close(devnull);

  /* 11. PID 1 of the sandbox. */
  char nofile[24] = "";
  cat_u64(nofile, sizeof nofile, a->nofile);
  char *const argv[] = {"ephemeral-guest", "--fd", "3", "--nofile", nofile, NULL};
  static char *const envp[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                               "HOME=/root", "LANG=C.UTF-8", NULL};
  syscall(SYS_execveat, a->exe_fd, "", argv, envp, AT_EMPTY_PATH);
  die(a, "exec ephemeral-guest", NULL);
}
