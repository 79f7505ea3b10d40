/* backend-jail: the set-up plan, decided once at init (jail_plan_build): every mount,
 * symlink and file of the new root, which the cloned child then carries out with system
 * calls only (setup.c). /usr holds only the `usr_binds` entries; the host's /bin, /lib.. are
 * usrmerge symlinks on Debian 12, so they are recreated as symlinks; a real directory is
 * bound read-only. The netlink "lo up" message is built here too. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "jail.h"

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

/* The mount holding path (statx STATX_MNT_ID), 0 when unknown. */
static uint64_t
mount_id(const char *path)
{
  struct statx sx;
  if (statx(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, STATX_MNT_ID, &sx) < 0 ||
      !(sx.stx_mask & STATX_MNT_ID))
    return 0;
  return sx.stx_mnt_id;
}

/* The group (one overlay of base, see jail.h) path can be bound from: path is a directory
 * or file under base on base's own mount (an overlay does not reach into a mount below its
 * lower layer). -1: none. */
static int
group_of(jail_plan_t *p, const char *path)
{
  static const char *const bases[] = {"/usr", "/etc"};
  for (size_t b = 0; b < sizeof bases / sizeof bases[0]; b++) {
    size_t n = strlen(bases[b]);
    if (strncmp(path, bases[b], n) != 0 || path[n] != '/' || !path[n + 1])
      continue;
    uint64_t base_mnt = mount_id(bases[b]);
    if (!base_mnt || mount_id(path) != base_mnt)
      return -1;
    for (size_t g = 0; g < p->n_groups; g++)
      if (!strcmp(p->groups[g].name, bases[b] + 1))
        return (int)g;
    if (p->n_groups == JAIL_MAX_GROUPS)
      return -1;
    jail_group_t *g = &p->groups[p->n_groups];
    snprintf(g->name, sizeof g->name, "%s", bases[b] + 1);
    snprintf(g->opts, sizeof g->opts, "lowerdir=%s:%s" JAIL_OVERLAY_EMPTY, bases[b], p->newroot);
    return (int)p->n_groups++;
  }
  return -1;
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
  char opts[8300] = "";
  bool overlay = S_ISDIR(st.st_mode) && !strpbrk(path, ":,\\");
  if (overlay)
    snprintf(opts, sizeof opts, "lowerdir=%s:%s" JAIL_OVERLAY_EMPTY, path, p->newroot);
  /* Entries of /usr and /etc come from one overlay of each, mounted once per sandbox: its
   * files too get inodes of the sandbox's own, and tearing the sandbox down frees two
   * overlays, not one per entry (each waits for an RCU grace period). The overlay of its
   * own (or the bind) stays the fallback if the shared one cannot be mounted. */
  int g = group_of(p, path);
  if (g >= 0) {
    if (add_op(p, JAIL_OP_GROUP_BIND, path + strlen(p->groups[g].name) + 2, path,
               overlay ? opts : NULL, err) < 0)
      return -err->code;
    jail_op_t *o = &p->ops[p->n_ops - 1];
    o->group = g;
    o->is_dir = S_ISDIR(st.st_mode);
    o->keep = o->is_dir ? 0 : locked_flags(path);
    return 0;
  }
  if (overlay)
    return add_op(p, JAIL_OP_OVERLAY_RO, path, path, opts, err);
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

/* The message `ip link set lo up mtu 1500 gso_max_size 4096` sends: RTM_NEWLINK for
 * ifindex 1 (lo is ifindex 1 in every new network namespace: net/core/dev.c registers the
 * loopback first) with IFF_UP in flags and change, then IFLA_MTU and IFLA_GSO_MAX_SIZE, the
 * bytes libnl's rtnl_link_build_change_request builds (it has no setter for the GSO limit:
 * that attribute was appended to its message), made here with the kernel's own netlink
 * macros: libnl is then not loaded by every start (only a run granting web needs it, for
 * the proxy's address: sdk/support/nl_api.h). tests/sandbox.test checks lo's flags, MTU and
 * GSO limit in a sandbox. */
static int
put_u32_attr(unsigned char *buf, size_t size, size_t *len, unsigned short type, uint32_t v)
{
  size_t at = NLMSG_ALIGN(*len), n = RTA_LENGTH(sizeof v);
  if (at + RTA_ALIGN(n) > size)
    return -1;
  struct rtattr *a = (struct rtattr *)(buf + at);
  a->rta_type = type;
  a->rta_len = (unsigned short)n;
  memcpy(RTA_DATA(a), &v, sizeof v);
  *len = at + RTA_ALIGN(n);
  return 0;
}

static int
build_lo_up(jail_plan_t *p, eph_error_t *err)
{
  memset(p->lo_msg, 0, sizeof p->lo_msg);
  struct nlmsghdr *h = (struct nlmsghdr *)p->lo_msg;
  size_t len = NLMSG_LENGTH(sizeof(struct ifinfomsg));
  h->nlmsg_type = RTM_NEWLINK;
  h->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
  h->nlmsg_seq = 1;
  h->nlmsg_pid = 0;
  struct ifinfomsg *ifi = NLMSG_DATA(h);
  ifi->ifi_family = AF_UNSPEC;
  ifi->ifi_index = 1;
  ifi->ifi_flags = IFF_UP;
  ifi->ifi_change = IFF_UP;
  if (put_u32_attr(p->lo_msg, sizeof p->lo_msg, &len, IFLA_MTU, JAIL_LO_MTU) < 0 ||
      put_u32_attr(p->lo_msg, sizeof p->lo_msg, &len, IFLA_GSO_MAX_SIZE, JAIL_LO_GSO_MAX_BYTES) < 0)
    return eph_error_set(err, E2BIG, "loopback netlink request too large");
  h->nlmsg_len = (uint32_t)len;
  p->lo_msg_bytes = len;
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
