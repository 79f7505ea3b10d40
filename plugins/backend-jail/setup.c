/* backend-jail: the new root and the cloned child's set-up, in plain order.
 *
 * jail_plan_build() runs once at init: it decides every mount, symlink and file of the new
 * root (/usr holds only the `usr_binds` entries; the host's /bin, /lib.. are usrmerge
 * symlinks on Debian 12, so they are recreated as symlinks; a real directory is bound
 * read-only) and builds the netlink "lo up" message with
 * libnl's rtnl_link API. jail_child_main() is what the child runs after clone(); it is a
 * fork of a possibly multi-threaded host, so it only does system calls on memory prepared
 * before the clone (no malloc, no stdio, no locks). Each step names itself so a failure
 * reads "mount proc on /proc: Operation not permitted".
 *
 * The steps, as bubblewrap orders them:
 *   0. a run granting web: make a netlink and a TCP socket in this netns and send them to
 *      the parent, which puts the proxy's listener on our lo with them (net.c)
 *   1. wait for the parent: uid/gid maps written (its cgroups are joined meanwhile, see 9)
 *   2. become root of the user namespace (setresgid/setgroups/setresuid): from here the
 *      host sees the sandbox's uids as the unprivileged slot range, never host root
 *   3. PR_SET_PDEATHSIG(SIGKILL), then check the parent is still there
 *   4. unshare(CLONE_NEWTIME) with offsets: the guest's children see clocks that start at
 *      zero (new_clocks)
 *   5. make every mount private: nothing propagates back to the host
 *   6. mount the root tmpfs; build /usr (the usr_binds list), /bin.., /etc, /dev from the
 *      plan
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
 * every worker command inherits; see guest/worker.c).
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

#include <netlink/netlink.h>
#include <netlink/route/link.h>

#include "jail.h"
#include "support/netns.h"

/* ------------------------------------------------------------ the plan (at init) */

static int
add_op(jail_plan_t *p, jail_op_kind_t kind, const char *source, const char *target,
       const char *data, eph_error_t *err)
{
  jail_op_t *ops = realloc(p->ops, (p->n_ops + 1) * sizeof *ops);
  if (!ops)
    return eph_error_set(err, ENOMEM, "set-up plan: out of memory");
  p->ops = ops;
  jail_op_t *o = &ops[p->n_ops];
  memset(o, 0, sizeof *o);
  o->kind = kind;
  o->source = source ? strdup(source) : NULL;
  o->target = strdup(target);
  if (data) {
    o->data = strdup(data);
    o->bytes = strlen(data);
  }
  if ((source && !o->source) || !o->target || (data && !o->data)) {
    free(o->source);
    free(o->target);
    free(o->data);
    return eph_error_set(err, ENOMEM, "set-up plan: out of memory");
  }
  p->n_ops++;
  return 0;
}

/* Mount flags of the host mount holding path that a user namespace may not clear
 * (they are locked on mounts inherited from a more privileged namespace). */
static unsigned long
locked_flags(const char *path)
{
  struct statvfs sv;
  unsigned long f = 0;
  if (statvfs(path, &sv) < 0)
    return 0;
  if (sv.f_flag & ST_NOSUID)
    f |= MS_NOSUID;
  if (sv.f_flag & ST_NODEV)
    f |= MS_NODEV;
  if (sv.f_flag & ST_NOEXEC)
    f |= MS_NOEXEC;
  if (sv.f_flag & ST_NOATIME)
    f |= MS_NOATIME;
  if (sv.f_flag & ST_NODIRATIME)
    f |= MS_NODIRATIME;
  if (sv.f_flag & ST_RELATIME)
    f |= MS_RELATIME;
  return f;
}

/* Adds host `path` to the new root at the same place: a symlink is recreated with the same
 * text, a directory or file is bound read-only; a missing path is skipped. */
static int
add_host_path(jail_plan_t *p, const char *path, eph_error_t *err)
{
  struct stat st;
  if (lstat(path, &st) < 0)
    return 0;
  if (S_ISLNK(st.st_mode)) {
    char text[4096];
    ssize_t n = readlink(path, text, sizeof text - 1);
    if (n < 0)
      return eph_error_set(err, errno, "readlink %s: %s", path, strerror(errno));
    text[n] = '\0';
    return add_op(p, JAIL_OP_SYMLINK, text, path, NULL, err);
  }
  if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
    return 0;
  /* A directory is an overlay, not a bind: a bind shares the host's inodes, and an inotify
   * watch on them (IN_OPEN on /usr/bin) reports every program the host and every other
   * sandbox runs, as it runs. An overlay's inodes are its own: only the sandbox's own
   * accesses reach its watches. Read-only overlays need two lower layers; the second is an
   * empty directory of the new root. A path the option syntax cannot carry is bound. */
  if (S_ISDIR(st.st_mode) && !strpbrk(path, ":,\\")) {
    char opts[8300];
    snprintf(opts, sizeof opts, "lowerdir=%s:%s" JAIL_OVERLAY_EMPTY, path, p->newroot);
    return add_op(p, JAIL_OP_OVERLAY_RO, path, path, opts, err);
  }
  if (add_op(p, JAIL_OP_BIND_RO, path, path, NULL, err) < 0)
    return -err->code;
  p->ops[p->n_ops - 1].is_dir = S_ISDIR(st.st_mode);
  p->ops[p->n_ops - 1].keep = locked_flags(path);
  return 0;
}

/* Small loopback packets. A TCP socket may always queue one packet past its cgroup's TCP
 * limit (the kernel forces the charge so a connection never stalls for good: sndbuf
 * moderation, the first skb of an empty receive queue), and on lo a packet is a 64 KiB GSO
 * super-packet by default: thousands of connections on the sandbox's own loopback then pin
 * hundreds of MiB of host TCP memory past memory.kmem.tcp.limit_in_bytes. With an
 * Ethernet-sized MTU and GSO limit the forced part is a few KiB per socket, less than the
 * socket itself costs in the memory limit, so the memory limit bounds it. */
#define JAIL_LO_MTU 1500
#define JAIL_LO_GSO_MAX_BYTES 4096

/* The message `ip link set lo up` sends, built with libnl's route API. lo is ifindex 1 in
 * every new network namespace (net/core/dev.c: loopback registers first). */
static int
build_lo_up(jail_plan_t *p, eph_error_t *err)
{
  struct rtnl_link *orig = rtnl_link_alloc(), *change = rtnl_link_alloc();
  struct nl_msg *msg = NULL;
  int r = -1;
  if (orig && change) {
    rtnl_link_set_ifindex(orig, 1);
    rtnl_link_set_flags(change, IFF_UP);
    rtnl_link_set_mtu(change, JAIL_LO_MTU);
    r = rtnl_link_build_change_request(orig, change, 0, &msg);
    /* libnl has no setter for the GSO limit: the attribute is appended to its message. */
    if (r >= 0 && msg)
      r = nla_put_u32(msg, IFLA_GSO_MAX_SIZE, JAIL_LO_GSO_MAX_BYTES);
  }
  if (r < 0 || !msg) {
    rtnl_link_put(orig);
    rtnl_link_put(change);
    return eph_error_set(err, ENOMEM, "building the loopback netlink request: %s", nl_geterror(r));
  }
  struct nlmsghdr *h = nlmsg_hdr(msg);
  h->nlmsg_flags |= NLM_F_REQUEST | NLM_F_ACK;
  h->nlmsg_seq = 1;
  h->nlmsg_pid = 0;
  if (h->nlmsg_len > sizeof p->lo_msg)
    r = -1;
  else
    memcpy(p->lo_msg, h, h->nlmsg_len);
  p->lo_msg_bytes = h->nlmsg_len;
  nlmsg_free(msg);
  rtnl_link_put(orig);
  rtnl_link_put(change);
  if (r < 0)
    return eph_error_set(err, E2BIG, "loopback netlink request too large");
  return 0;
}

static const char etc_passwd[] = "root:x:0:0:root:/root:/bin/sh\n"
                                 "worker:x:1000:1000:worker:/tmp:/bin/sh\n"
                                 "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
static const char etc_group[] = "root:x:0:\ntty:x:5:\nworker:x:1000:\nnogroup:x:65534:\n";
/* Files only: with no resolv.conf and no dns source there is no name resolution at all. */
static const char etc_nsswitch[] = "passwd: files\ngroup: files\nshadow: files\n"
                                   "hosts: files\nnetworks: files\nprotocols: files\n"
                                   "services: files\nethers: files\nrpc: files\n";
static const char etc_hosts[] = "127.0.0.1\tlocalhost\n::1\tlocalhost\n";

int
jail_usr_bind_check(const char *entry, eph_error_t *err)
{
  size_t n = entry ? strlen(entry) : 0;
  bool bad =
      n == 0 || n > 200 || entry[0] == '/' || entry[n - 1] == '/' || strstr(entry, "//") != NULL;
  /* No "." or ".." component anywhere: the bind stays under /usr. */
  for (const char *c = entry; !bad && c && *c; c = strchr(c, '/') ? strchr(c, '/') + 1 : NULL) {
    size_t len = strcspn(c, "/");
    bad = (len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.');
  }
  if (bad)
    return eph_error_set(err, EPH_E_CONFIG,
                         "usr_binds: '%s' is not a relative path under /usr "
                         "(no leading or trailing '/', no '.' or '..')",
                         entry ? entry : "");
  /* Configuration lives in /usr/local/etc (a default `make install` of ephemeral puts its
   * own there) and, on some systems, /usr/etc: never bound, nor any parent of them. */
  static const char *const forbidden[] = {"local/etc", "etc", NULL};
  for (size_t i = 0; forbidden[i]; i++) {
    size_t fl = strlen(forbidden[i]);
    bool under = strncmp(entry, forbidden[i], fl) == 0 && (entry[fl] == '\0' || entry[fl] == '/');
    bool parent = strncmp(forbidden[i], entry, n) == 0 && forbidden[i][n] == '/';
    if (under || parent)
      return eph_error_set(err, EPH_E_CONFIG,
                           "usr_binds: '%s' would expose /usr/%s (host "
                           "configuration): refused",
                           entry, forbidden[i]);
  }
  return 0;
}

/* /usr/<entry> with each missing parent directory made first ("local/bin" needs /usr/local). */
static int
add_usr_entry(jail_plan_t *p, const char *entry, eph_error_t *err)
{
  char path[4096];
  snprintf(path, sizeof path, "/usr/%s", entry);
  for (char *s = path + 5; (s = strchr(s, '/')); s++) {
    *s = '\0';
    int r = add_op(p, JAIL_OP_DIR, NULL, path, NULL, err);
    *s = '/';
    if (r < 0)
      return r;
  }
  return add_host_path(p, path, err);
}

int
jail_plan_build(jail_plan_t *p, const char *hostname, uint64_t shm_bytes,
                const char *const *usr_binds, const char *const *etc_binds, eph_error_t *err)
{
  memset(p, 0, sizeof *p);
  /* The child's private copy of the host /tmp is covered by the root tmpfs; the host's own
   * /tmp is untouched (the mount happens in the child's mount namespace only). */
  p->newroot = strdup("/tmp");
  p->hostname = strdup(hostname);
  p->shm_bytes = (uint32_t)shm_bytes;
  if (!p->newroot || !p->hostname)
    goto oom;

  /* The empty second lower layer of every read-only overlay (add_host_path). */
  if (add_op(p, JAIL_OP_DIR, NULL, JAIL_OVERLAY_EMPTY, NULL, err) < 0)
    goto fail;
  /* /usr is built from the explicit list, never bound whole: the host's /usr/local (and
   * the /usr/local/etc of a default install), /usr/include, /usr/src stay out. */
  if (add_op(p, JAIL_OP_DIR, NULL, "/usr", NULL, err) < 0)
    goto fail;
  for (size_t i = 0; usr_binds && usr_binds[i]; i++)
    if (jail_usr_bind_check(usr_binds[i], err) < 0 || add_usr_entry(p, usr_binds[i], err) < 0)
      goto fail;
  static const char *const top[] = {"/bin", "/sbin", "/lib", "/lib64", NULL};
  for (size_t i = 0; top[i]; i++)
    if (add_host_path(p, top[i], err) < 0)
      goto fail;

  if (add_op(p, JAIL_OP_DIR, NULL, "/etc", NULL, err) < 0 ||
      add_op(p, JAIL_OP_FILE, NULL, "/etc/passwd", etc_passwd, err) < 0 ||
      add_op(p, JAIL_OP_FILE, NULL, "/etc/group", etc_group, err) < 0 ||
      add_op(p, JAIL_OP_FILE, NULL, "/etc/nsswitch.conf", etc_nsswitch, err) < 0 ||
      add_op(p, JAIL_OP_FILE, NULL, "/etc/hosts", etc_hosts, err) < 0)
    goto fail;
  char hn[300];
  snprintf(hn, sizeof hn, "%s\n", hostname);
  if (add_op(p, JAIL_OP_FILE, NULL, "/etc/hostname", hn, err) < 0)
    goto fail;
  for (size_t i = 0; etc_binds && etc_binds[i]; i++) {
    char path[4096];
    if (strchr(etc_binds[i], '/') || !strcmp(etc_binds[i], "..") || !strcmp(etc_binds[i], ".") ||
        !strcmp(etc_binds[i], "resolv.conf") || !strcmp(etc_binds[i], "hosts")) {
      eph_error_set(err, EPH_E_CONFIG,
                    "etc_binds: '%s' is not allowed (a plain /etc entry "
                    "other than resolv.conf and hosts)",
                    etc_binds[i]);
      goto fail;
    }
    snprintf(path, sizeof path, "/etc/%s", etc_binds[i]);
    if (add_host_path(p, path, err) < 0)
      goto fail;
  }

  if (add_op(p, JAIL_OP_DIR, NULL, "/dev", NULL, err) < 0)
    goto fail;
  static const char *const devs[] = {"null", "zero", "full", "random", "urandom", "tty", NULL};
  for (size_t i = 0; devs[i]; i++) {
    char path[64];
    snprintf(path, sizeof path, "/dev/%s", devs[i]);
    if (add_op(p, JAIL_OP_BIND_DEV, path, path, NULL, err) < 0)
      goto fail;
    p->ops[p->n_ops - 1].keep = locked_flags(path);
  }
  if (add_op(p, JAIL_OP_SYMLINK, "/proc/self/fd", "/dev/fd", NULL, err) < 0 ||
      add_op(p, JAIL_OP_SYMLINK, "/proc/self/fd/0", "/dev/stdin", NULL, err) < 0 ||
      add_op(p, JAIL_OP_SYMLINK, "/proc/self/fd/1", "/dev/stdout", NULL, err) < 0 ||
      add_op(p, JAIL_OP_SYMLINK, "/proc/self/fd/2", "/dev/stderr", NULL, err) < 0 ||
      add_op(p, JAIL_OP_SYMLINK, "pts/ptmx", "/dev/ptmx", NULL, err) < 0 ||
      add_op(p, JAIL_OP_DIR, NULL, "/dev/pts", NULL, err) < 0 ||
      add_op(p, JAIL_OP_DIR, NULL, "/dev/shm", NULL, err) < 0 ||
      add_op(p, JAIL_OP_DIR, NULL, "/proc", NULL, err) < 0 ||
      add_op(p, JAIL_OP_DIR, NULL, "/tmp", NULL, err) < 0 ||
      add_op(p, JAIL_OP_DIR, NULL, "/root", NULL, err) < 0)
    goto fail;
  if (build_lo_up(p, err) < 0)
    goto fail;
  return 0;
oom:
  eph_error_set(err, ENOMEM, "set-up plan: out of memory");
fail:
  jail_plan_free(p);
  return -err->code;
}

void
jail_plan_free(jail_plan_t *p)
{
  for (size_t i = 0; i < p->n_ops; i++) {
    free(p->ops[i].source);
    free(p->ops[i].target);
    free(p->ops[i].data);
  }
  free(p->ops);
  free(p->newroot);
  free(p->hostname);
  memset(p, 0, sizeof *p);
}

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
    if (mkdir(dst, 0755) < 0 && errno != EEXIST)
      die(a, "mkdir overlay target", o->target);
    if (mount("overlay", dst, "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV, o->data) < 0)
      die(a, "overlay mount", o->target);
    return;
  case JAIL_OP_BIND_RO:
  case JAIL_OP_BIND_DEV: {
    if (o->is_dir) {
      if (mkdir(dst, 0755) < 0 && errno != EEXIST)
        die(a, "mkdir bind target", o->target);
    } else {
      int fd = open(dst, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0)
        die(a, "create bind target", o->target);
      close(fd);
    }
    if (mount(o->source, dst, NULL, MS_BIND | MS_REC, NULL) < 0)
      die(a, "bind mount", o->target);
    unsigned long fl = MS_BIND | MS_REMOUNT | MS_NOSUID | o->keep;
    fl |= o->kind == JAIL_OP_BIND_DEV ? MS_NOEXEC : MS_RDONLY | MS_NODEV;
    if (mount(NULL, dst, NULL, fl, NULL) < 0)
      die(a, "remount read-only", o->target);
    return;
  }
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
  /* The uid change of step 2 made us non-dumpable, which hands our /proc/self files to
   * the host's root: dumpable for this one write (exec decides it afresh anyway). */
  if (prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) < 0)
    die(a, "prctl(PR_SET_DUMPABLE)", NULL);
  int fd = open("/proc/self/timens_offsets", O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    die(a, "open", "/proc/self/timens_offsets");
  if (write(fd, text, strlen(text)) != (ssize_t)strlen(text))
    die(a, "write", "/proc/self/timens_offsets");
  close(fd);
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
    die(a, "prctl(PR_SET_DUMPABLE)", NULL);
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

void
jail_child_main(const jail_child_args_t *args)
{
  const jail_plan_t *p = args->plan;
  char go;
  char path[4096];

  /* 0. Fixed fd numbers: guest stream 3, error pipe 4 and guest binary 5 (both CLOEXEC).
   * Everything is first moved above them so no dup3() overwrites another. */
  for (int i = 0; i < 3; i++)
    if (args->close_fds[i] >= 0)
      close(args->close_fds[i]);
  jail_child_args_t local = *args;
  const jail_child_args_t *a = &local;
  int hi_guest = fcntl(args->guest_fd, F_DUPFD_CLOEXEC, 10);
  int hi_err = fcntl(args->err_fd, F_DUPFD_CLOEXEC, 10);
  int hi_exe = fcntl(args->exe_fd, F_DUPFD_CLOEXEC, 10);
  int hi_go = fcntl(args->go_fd, F_DUPFD_CLOEXEC, 10);
  if (hi_err < 0)
    _exit(127);
  local.err_fd = hi_err;
  if (hi_guest < 0 || hi_exe < 0 || hi_go < 0)
    die(a, "dup fds", NULL);
  local.go_fd = hi_go;
  if (dup3(hi_err, 4, O_CLOEXEC) < 0)
    die(a, "dup3 error pipe", NULL);
  local.err_fd = 4;
  if (dup3(hi_exe, 5, O_CLOEXEC) < 0 || dup2(hi_guest, JAIL_GUEST_FD) < 0)
    die(a, "dup3 guest fds", NULL);
  local.exe_fd = 5;
  local.guest_fd = JAIL_GUEST_FD;
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

  /* 2. Become uid/gid 0 of the user namespace: until now our kernel uid was the host's.
   * Raw system calls: glibc's wrappers broadcast the change to every thread of the
   * process (setxid), and the host's other threads do not exist in this clone: they would
   * wait forever. */
  if (syscall(SYS_setresgid, 0, 0, 0) < 0)
    die(a, "setresgid(0) in the user namespace", NULL);
  if (syscall(SYS_setgroups, 0, NULL) < 0)
    die(a, "setgroups()", NULL);
  if (syscall(SYS_setresuid, 0, 0, 0) < 0)
    die(a, "setresuid(0) in the user namespace", NULL);

  /* 3. Die with the host thread that created us. Set after the uid change, which clears it;
   * the go pipe's writer stays open until create() returns, so a hang-up means it died. */
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
    die(a, "prctl(PR_SET_PDEATHSIG)", NULL);
  struct pollfd pf = {.fd = a->go_fd, .events = POLLIN};
  if (poll(&pf, 1, 0) > 0 && (pf.revents & (POLLHUP | POLLERR))) {
    errno = ESRCH;
    die(a, "the parent died during set-up", NULL);
  }

  /* 4. Clocks of our own. (The cgroup namespace comes at 9, once we are in our groups.) */
  new_clocks(a);

  /* 5. Nothing we mount propagates to the host. */
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
    die(a, "make / private (MS_REC|MS_PRIVATE)", NULL);

  /* 6. The root: a small tmpfs, then the plan (/usr, symlinks, /etc, /dev nodes). */
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
