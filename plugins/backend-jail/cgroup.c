/* backend-jail: one cgroup per sandbox, named after its run id, under an `ephemeral` parent.
 *
 * cgroup v1 (this project's reference machine): the memory, pids and cpu controllers each
 * have their own hierarchy under <root>/<controller>; the run gets
 * <root>/memory/ephemeral/<run_id>, <root>/pids/ephemeral/<run_id>,
 * <root>/cpu/ephemeral/<run_id>. cgroup v2 (unified, detected by <root>/cgroup.controllers):
 * one group <root>/ephemeral/<run_id> with the three controllers enabled on the parent.
 *
 * Files written (kernel Documentation/admin-guide/cgroup-v1/{memory,pids}.rst, cgroup-v2.rst):
 *   v1: memory.limit_in_bytes, memory.memsw.limit_in_bytes (= memory: swap cannot hide
 *       memory), memory.kmem.limit_in_bytes (= memory, where the kernel still honours it),
 *       memory.kmem.tcp.limit_in_bytes (memory / JAIL_TCP_SHARE_DIVISOR), pids.max,
 *       cpu.cfs_period_us / cpu.cfs_quota_us
 *   v2: memory.max, memory.swap.max = 0, pids.max, cpu.max "quota period"
 *
 * Socket buffers. v1 does not charge TCP buffers to memory.usage_in_bytes: without
 * memory.kmem.tcp.limit_in_bytes a sandbox can pin any amount of kernel TCP memory on its
 * own loopback (it counts against the host-wide tcp_mem only, and past that every TCP socket
 * of the host fails). The tcp limit is written before any task joins the group (sockets
 * created earlier are never accounted: the kernel turns tcp accounting on when the limit is
 * first set) and read back; a v1 hierarchy without the file is refused at init. v2 charges
 * socket memory to memory.max unless the kernel was booted with cgroup.memory=nosocket,
 * which init refuses.
 * Counters read: v1 memory.oom_control "oom_kill N", memory.max_usage_in_bytes;
 *   v2 memory.events "oom_kill N", memory.peak; both pids.events "max N".
 * Killing, counting and removing (jail_cg_kill_all, jail_cg_count, jail_cg_remove's slow
 * path) cover every controller's run group and its descendants, within bounds: see
 * "a run's subtrees" below.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "jail.h"

#define CPU_PERIOD_US 100000

static const char *const v1_controllers[JAIL_CG_N] = {"memory", "pids", "cpu"};

static void
sleep_ms(int ms)
{
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Writes a short string to dirfd/name; returns 0 or -errno. */
static int
write_at(int dirfd, const char *name, const char *text)
{
  cleanup_close int fd = openat(dirfd, name, O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  size_t len = strlen(text);
  ssize_t n = write(fd, text, len);
  if (n < 0)
    return -errno;
  return (size_t)n == len ? 0 : -EIO;
}

/* Reads dirfd/name into buf (NUL-terminated); returns bytes or -errno. */
static ssize_t
read_at(int dirfd, const char *name, char *buf, size_t size)
{
  cleanup_close int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  size_t off = 0;
  while (off + 1 < size) {
    ssize_t n = read(fd, buf + off, size - 1 - off);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (n == 0)
      break;
    off += (size_t)n;
  }
  buf[off] = '\0';
  return (ssize_t)off;
}

static bool
exists_at(int dirfd, const char *name)
{
  return faccessat(dirfd, name, F_OK, 0) == 0;
}

/* True when /proc/cmdline holds cgroup.memory=...nosocket...: the kernel then charges no
 * socket memory to any v2 group (mm/memcontrol.c, cgroup_memory_nosocket). */
static bool
v2_sockets_uncharged(void)
{
  char buf[4096];
  cleanup_close int fd = open("/proc/cmdline", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return false;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  if (n <= 0)
    return false;
  buf[n] = '\0';
  for (char *save = NULL, *tok = strtok_r(buf, " \n", &save); tok;
       tok = strtok_r(NULL, " \n", &save)) {
    if (strncmp(tok, "cgroup.memory=", 14) != 0)
      continue;
    for (char *s2 = NULL, *opt = strtok_r(tok + 14, ",", &s2); opt; opt = strtok_r(NULL, ",", &s2))
      if (!strcmp(opt, "nosocket"))
        return true;
  }
  return false;
}

/* True when the mount at each of dirs[0..n) (v1 hierarchies) has root "/" in
 * /proc/self/mountinfo (field 4, relative to our cgroup namespace's root): then a path from
 * /proc/thread-self/cgroup appended to dir names the thread's own group. A hierarchy
 * mounted from elsewhere (a host's whole tree bind-mounted into a container with its own
 * cgroup namespace) would make that path name another group, and a "no-op" move there a real
 * one. One pass over the file for all of them (it is generated anew at every open). */
static bool
mount_roots_are_ns_root(const char *const *dirs, int n)
{
  char real[JAIL_CG_N][4096];
  bool found[JAIL_CG_N] = {false}, ok[JAIL_CG_N] = {false};
  if (n > JAIL_CG_N)
    return false;
  for (int i = 0; i < n; i++)
    if (!realpath(dirs[i], real[i]))
      return false;
  FILE *f = fopen("/proc/self/mountinfo", "re");
  if (!f)
    return false;
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, f) > 0) {
    /* "36 25 0:31 / /sys/fs/cgroup/memory rw,... - cgroup cgroup rw,memory" */
    char *save = NULL, *tok = strtok_r(line, " ", &save);
    char *fields[5] = {0};
    for (int i = 0; tok && i < 5; i++, tok = strtok_r(NULL, " ", &save))
      fields[i] = tok;
    for (int i = 0; fields[4] && i < n; i++) {
      if (strcmp(fields[4], real[i]) != 0)
        continue;
      found[i] = true;
      ok[i] = strcmp(fields[3], "/") == 0; /* the last mount on the point is the one seen */
    }
  }
  free(line);
  fclose(f);
  bool all = true;
  for (int i = 0; i < n; i++)
    all = all && found[i] && ok[i];
  return all;
}

int
jail_cg_init(jail_cgroups_t *cg, const char *root, const char *parent, eph_error_t *err)
{
  memset(cg, 0, sizeof *cg);
  for (int i = 0; i < JAIL_CG_N; i++)
    cg->parent_fd[i] = -1;
  cg->root = strdup(root);
  if (!cg->root)
    return eph_error_set(err, ENOMEM, "cgroup root %s: out of memory", root);

  char path[4096];
  snprintf(path, sizeof path, "%s/cgroup.controllers", root);
  cg->v2 = access(path, F_OK) == 0;
  cg->n_dirs = cg->v2 ? 1 : JAIL_CG_N;

  if (cg->v2) {
    char ctl[512];
    if (v2_sockets_uncharged())
      return eph_error_set(err, ENOTSUP,
                           "cgroup v2: the kernel was booted with "
                           "cgroup.memory=nosocket, so a sandbox's socket buffers would "
                           "escape memory.max; refusing to start");
    cleanup_close int rootfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (rootfd < 0)
      return eph_error_set(err, errno, "cgroup v2 root %s: %s", root, strerror(errno));
    if (read_at(rootfd, "cgroup.controllers", ctl, sizeof ctl) < 0)
      return eph_error_set(err, errno, "%s/cgroup.controllers: %s", root, strerror(errno));
    for (const char *c = "memory\0pids\0cpu\0"; *c; c += strlen(c) + 1)
      if (!strstr(ctl, c))
        return eph_error_set(err, ENOTSUP, "cgroup v2 root %s: controller '%s' not available", root,
                             c);
    /* The root's subtree_control may already hold them; writing is idempotent. */
    int r = write_at(rootfd, "cgroup.subtree_control", "+memory +pids +cpu");
    if (r < 0)
      return eph_error_set(err, -r, "%s/cgroup.subtree_control: %s", root, strerror(-r));
    snprintf(path, sizeof path, "%s/%s", root, parent);
    if (mkdir(path, 0755) < 0 && errno != EEXIST)
      return eph_error_set(err, errno, "mkdir %s: %s", path, strerror(errno));
    cg->parent_fd[0] = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (cg->parent_fd[0] < 0)
      return eph_error_set(err, errno, "open %s: %s", path, strerror(errno));
    cg->parent_path[0] = strdup(path);
    r = write_at(cg->parent_fd[0], "cgroup.subtree_control", "+memory +pids +cpu");
    if (r < 0) {
      jail_cg_fini(cg);
      return eph_error_set(err, -r, "%s/cgroup.subtree_control: %s", path, strerror(-r));
    }
    cg->swap_max = exists_at(cg->parent_fd[0], "memory.swap.max");
    cg->has_kill = exists_at(cg->parent_fd[0], "cgroup.kill");
    return 0;
  }

  for (int i = 0; i < JAIL_CG_N; i++) {
    snprintf(path, sizeof path, "%s/%s", root, v1_controllers[i]);
    if (access(path, F_OK) < 0) {
      int e = errno;
      jail_cg_fini(cg);
      return eph_error_set(err, e,
                           "cgroup v1 controller %s: %s (neither %s/cgroup.controllers "
                           "nor a v1 hierarchy found)",
                           path, strerror(e), root);
    }
    snprintf(path, sizeof path, "%s/%s/%s", root, v1_controllers[i], parent);
    if (mkdir(path, 0755) < 0 && errno != EEXIST) {
      int e = errno;
      jail_cg_fini(cg);
      return eph_error_set(err, e, "mkdir %s: %s", path, strerror(e));
    }
    cg->parent_fd[i] = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (cg->parent_fd[i] < 0) {
      int e = errno;
      jail_cg_fini(cg);
      return eph_error_set(err, e, "open %s: %s", path, strerror(e));
    }
    cg->parent_path[i] = strdup(path);
  }
  char dirs[JAIL_CG_N][4096];
  const char *dirp[JAIL_CG_N];
  for (int i = 0; i < JAIL_CG_N; i++) {
    snprintf(dirs[i], sizeof dirs[i], "%s/%s", root, v1_controllers[i]);
    dirp[i] = dirs[i];
  }
  cg->thread_paths_ok = mount_roots_are_ns_root(dirp, JAIL_CG_N);
  cg->memsw = exists_at(cg->parent_fd[JAIL_CG_MEMORY], "memory.memsw.limit_in_bytes");
  cg->kmem = exists_at(cg->parent_fd[JAIL_CG_MEMORY], "memory.kmem.limit_in_bytes");
  if (!exists_at(cg->parent_fd[JAIL_CG_MEMORY], "memory.kmem.tcp.limit_in_bytes")) {
    jail_cg_fini(cg);
    return eph_error_set(err, ENOTSUP,
                         "cgroup v1 %s/memory: no memory.kmem.tcp.limit_in_bytes "
                         "(kernel without CONFIG_MEMCG_KMEM?): a sandbox's TCP buffers would "
                         "escape its memory limit; refusing to start",
                         root);
  }
  return 0;
}

void
jail_cg_fini(jail_cgroups_t *cg)
{
  for (int i = 0; i < JAIL_CG_N; i++) {
    if (cg->parent_fd[i] >= 0)
      close(cg->parent_fd[i]);
    cg->parent_fd[i] = -1;
    free(cg->parent_path[i]);
    cg->parent_path[i] = NULL;
  }
  free(cg->root);
  cg->root = NULL;
}

/* fd of the run's group in controller slot i (v2: i is always 0). */
static int
open_group(jail_cgroups_t *cg, int i, const char *name)
{
  return openat(cg->parent_fd[i], name, O_PATH | O_DIRECTORY | O_CLOEXEC);
}

static int
set_limit(int fd, const char *dir, const char *file, const char *value, eph_error_t *err)
{
  int r = write_at(fd, file, value);
  if (r < 0)
    return eph_error_set(err, -r, "write %s to %s/%s: %s", value, dir, file, strerror(-r));
  return 0;
}

/* cgroup v1 memory.limit_in_bytes, memsw and kmem of the group open as `mem`. A limit below
 * the group's usage fails (EBUSY once reclaim gives up) with the usage named. */
static int
write_memory_v1(const jail_cgroups_t *cg, int mem, const char *where, const jail_limits_t *lim,
                eph_error_t *err)
{
  char v[64], used[64] = "";
  snprintf(v, sizeof v, "%" PRIu64, lim->memory_bytes);
  int r = write_at(mem, "memory.limit_in_bytes", v);
  if (r == -EBUSY && read_at(mem, "memory.usage_in_bytes", used, sizeof used) >= 0)
    return eph_error_set(err, EBUSY,
                         "memory limit %s bytes is below what the sandbox already uses "
                         "(%s/memory.usage_in_bytes %" PRIu64
                         "; at its birth that is mostly the page tables it copied from "
                         "this process): raise the backend-jail memory limit",
                         v, where, (uint64_t)strtoull(used, NULL, 10));
  if (r < 0)
    return eph_error_set(err, -r, "write %s to %s/memory.limit_in_bytes: %s", v, where,
                         strerror(-r));
  /* memsw must be >= the memory limit, so it is written second; equal means no swap. */
  if (cg->memsw && set_limit(mem, where, "memory.memsw.limit_in_bytes", v, err) < 0)
    return -err->code;
  /* Kernel memory is charged to memory.usage_in_bytes too; its own limit is a sub-limit
   * that newer kernels (5.16+) accept and ignore, so a refusal is not fatal. */
  if (cg->kmem)
    (void)write_at(mem, "memory.kmem.limit_in_bytes", v);
  return 0;
}

static int
write_limits(jail_cgroups_t *cg, const char *name, const jail_limits_t *lim, bool memory_later,
             eph_error_t *err)
{
  char v[64], where[4200];
  if (cg->v2) {
    cleanup_close int fd = open_group(cg, 0, name);
    snprintf(where, sizeof where, "%s/%s", cg->parent_path[0], name);
    if (fd < 0)
      return eph_error_set(err, errno, "open %s: %s", where, strerror(errno));
    snprintf(v, sizeof v, "%" PRIu64, lim->memory_bytes);
    if (set_limit(fd, where, "memory.max", v, err) < 0)
      return -err->code;
    if (cg->swap_max && set_limit(fd, where, "memory.swap.max", "0", err) < 0)
      return -err->code;
    snprintf(v, sizeof v, "%" PRIu32, lim->pids);
    if (set_limit(fd, where, "pids.max", v, err) < 0)
      return -err->code;
    snprintf(v, sizeof v, "%" PRIu64 " %d", (uint64_t)lim->cpu_percent * CPU_PERIOD_US / 100,
             CPU_PERIOD_US);
    return set_limit(fd, where, "cpu.max", v, err);
  }

  cleanup_close int mem = open_group(cg, JAIL_CG_MEMORY, name);
  snprintf(where, sizeof where, "%s/%s", cg->parent_path[JAIL_CG_MEMORY], name);
  if (mem < 0)
    return eph_error_set(err, errno, "open %s: %s", where, strerror(errno));
  if (!memory_later && write_memory_v1(cg, mem, where, lim, err) < 0)
    return -err->code;
  /* TCP buffers are not: they get their own limit, before any task joins (see the top). */
  uint64_t tcp = lim->memory_bytes / JAIL_TCP_SHARE_DIVISOR / 4096 * 4096;
  snprintf(v, sizeof v, "%" PRIu64, tcp);
  if (set_limit(mem, where, "memory.kmem.tcp.limit_in_bytes", v, err) < 0)
    return -err->code;
  char back[64] = "";
  if (read_at(mem, "memory.kmem.tcp.limit_in_bytes", back, sizeof back) < 0 ||
      strtoull(back, NULL, 10) != tcp)
    return eph_error_set(err, EIO,
                         "%s/memory.kmem.tcp.limit_in_bytes: wrote %s, read back "
                         "'%.20s': the sandbox's TCP buffers would not be limited",
                         where, v, back);

  cleanup_close int pids = open_group(cg, JAIL_CG_PIDS, name);
  snprintf(where, sizeof where, "%s/%s", cg->parent_path[JAIL_CG_PIDS], name);
  if (pids < 0)
    return eph_error_set(err, errno, "open %s: %s", where, strerror(errno));
  snprintf(v, sizeof v, "%" PRIu32, lim->pids);
  if (set_limit(pids, where, "pids.max", v, err) < 0)
    return -err->code;

  cleanup_close int cpu = open_group(cg, JAIL_CG_CPU, name);
  snprintf(where, sizeof where, "%s/%s", cg->parent_path[JAIL_CG_CPU], name);
  if (cpu < 0)
    return eph_error_set(err, errno, "open %s: %s", where, strerror(errno));
  snprintf(v, sizeof v, "%d", CPU_PERIOD_US);
  if (set_limit(cpu, where, "cpu.cfs_period_us", v, err) < 0)
    return -err->code;
  snprintf(v, sizeof v, "%" PRIu64, (uint64_t)lim->cpu_percent * CPU_PERIOD_US / 100);
  return set_limit(cpu, where, "cpu.cfs_quota_us", v, err);
}

int
jail_cg_create(jail_cgroups_t *cg, const char *name, const jail_limits_t *lim, bool memory_later,
               eph_error_t *err)
{
  for (int i = 0; i < cg->n_dirs; i++) {
    if (mkdirat(cg->parent_fd[i], name, 0755) < 0) {
      int e = errno;
      jail_cg_remove(cg, name, 0);
      return eph_error_set(err, e, "mkdir %s/%s: %s", cg->parent_path[i], name, strerror(e));
    }
  }
  if (write_limits(cg, name, lim, memory_later && !cg->v2, err) < 0) {
    jail_cg_remove(cg, name, 0);
    return -err->code;
  }
  return 0;
}

int
jail_cg_limit_memory(jail_cgroups_t *cg, const char *name, const jail_limits_t *lim,
                     eph_error_t *err)
{
  char where[4200];
  if (cg->v2)
    return 0;
  cleanup_close int mem = open_group(cg, JAIL_CG_MEMORY, name);
  snprintf(where, sizeof where, "%s/%s", cg->parent_path[JAIL_CG_MEMORY], name);
  if (mem < 0)
    return eph_error_set(err, errno, "open %s: %s", where, strerror(errno));
  return write_memory_v1(cg, mem, where, lim, err);
}

int
jail_cg_attach(jail_cgroups_t *cg, const char *name, pid_t pid, eph_error_t *err)
{
  char v[32], file[300];
  snprintf(v, sizeof v, "%d", (int)pid);
  for (int i = 0; i < cg->n_dirs; i++) {
    snprintf(file, sizeof file, "%s/cgroup.procs", name);
    int r = write_at(cg->parent_fd[i], file, v);
    if (r < 0)
      return eph_error_set(err, -r, "attach pid %d to %s/%s: %s", (int)pid, cg->parent_path[i],
                           file, strerror(-r));
  }
  return 0;
}

/* The calling thread's group in v1 controller `ctl`, from /proc/thread-self/cgroup
 * ("ID:memory:/user.slice"; a hierarchy may carry several controllers, "cpu,cpuacct"), as
 * an O_PATH fd of <root>/<ctl><path>; -1 with errno when not found. */
static int
thread_group_fd(const jail_cgroups_t *cg, const char *ctl)
{
  char buf[4096];
  cleanup_close int fd = open("/proc/thread-self/cgroup", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  if (n <= 0)
    return errno = n == 0 ? ENOENT : errno, -1;
  buf[n] = '\0';
  size_t clen = strlen(ctl);
  for (char *save = NULL, *line = strtok_r(buf, "\n", &save); line;
       line = strtok_r(NULL, "\n", &save)) {
    char *list = strchr(line, ':'), *path = list ? strchr(list + 1, ':') : NULL;
    if (!path)
      continue;
    *path++ = '\0';
    list++;
    for (const char *c = list; c && *c; c = strchr(c, ',') ? strchr(c, ',') + 1 : NULL)
      if (strncmp(c, ctl, clen) == 0 && (c[clen] == ',' || c[clen] == '\0')) {
        char dir[4200];
        if (path[0] != '/' || strstr(path, "/..")) /* outside our cgroup namespace's view */
          return errno = ENOENT, -1;
        snprintf(dir, sizeof dir, "%s/%s%s", cg->root, ctl, path);
        return open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
      }
  }
  return errno = ENOENT, -1;
}

static void
home_close(jail_cg_home_t *home)
{
  for (int i = 0; i < JAIL_CG_N; i++) {
    if (home->fd[i] >= 0)
      close(home->fd[i]);
    home->fd[i] = -1;
  }
}

int
jail_cg_enter_thread(jail_cgroups_t *cg, const char *name, jail_cg_home_t *home, eph_error_t *err)
{
  char file[300];
  for (int i = 0; i < JAIL_CG_N; i++)
    home->fd[i] = -1;
  if (cg->v2)
    return eph_error_set(err, ENOTSUP, "cgroup v2: the child is born in its group instead");
  if (!cg->thread_paths_ok)
    return eph_error_set(err, ENOTSUP,
                         "cgroup v1 under %s: a hierarchy is not mounted at its root as our "
                         "cgroup namespace sees it, so the thread's own groups cannot be named",
                         cg->root);
  /* Where the thread is, and whether it may come back there (the move is a no-op). */
  for (int i = 0; i < cg->n_dirs; i++) {
    home->fd[i] = thread_group_fd(cg, v1_controllers[i]);
    int r = home->fd[i] < 0 ? -errno : write_at(home->fd[i], "tasks", "0");
    if (r < 0) {
      home_close(home);
      return eph_error_set(err, -r, "cgroup v1 %s: the thread's own group: %s", v1_controllers[i],
                           strerror(-r));
    }
  }
  snprintf(file, sizeof file, "%s/tasks", name);
  for (int i = 0; i < cg->n_dirs; i++) {
    int r = write_at(cg->parent_fd[i], file, "0");
    if (r < 0) {
      eph_error_t ignored = {0};
      eph_error_set(err, -r, "move the thread to %s/%s: %s", cg->parent_path[i], file,
                    strerror(-r));
      jail_cg_leave_thread(cg, home, &ignored);
      return -err->code;
    }
  }
  return 0;
}

int
jail_cg_leave_thread(jail_cgroups_t *cg, jail_cg_home_t *home, eph_error_t *err)
{
  int rc = 0;
  for (int i = 0; i < cg->n_dirs; i++) {
    if (home->fd[i] < 0)
      continue;
    int r = write_at(home->fd[i], "tasks", "0");
    if (r < 0) {
      /* Never left in a sandbox's group (its limits, its kill): the hierarchy's root. */
      char dir[4200];
      snprintf(dir, sizeof dir, "%s/%s", cg->root, v1_controllers[i]);
      cleanup_close int rootfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
      int r2 = rootfd < 0 ? -errno : write_at(rootfd, "tasks", "0");
      if (rc == 0)
        rc = eph_error_set(err, -r, "moving the thread back to its cgroup v1 %s group: %s%s",
                           v1_controllers[i], strerror(-r),
                           r2 < 0 ? " (and to the root group)" : " (moved to the root group)");
    }
  }
  home_close(home);
  return rc;
}

int
jail_cg_clone_fd(jail_cgroups_t *cg, const char *name)
{
  if (!cg->v2)
    return -1;
  return openat(cg->parent_fd[0], name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

/* True when pid lives in this process's pid namespace: a host process, never a sandbox's
 * (each sandbox is cloned with CLONE_NEWPID, so every process of it is in a namespace of its
 * own from birth). A run's group lists one while a creator's thread stands in it
 * (jail_cg_enter_thread), possibly another process's; false when pid is gone or unreadable. */
static bool
host_process(pid_t pid)
{
  char path[64];
  struct stat self, other;
  snprintf(path, sizeof path, "/proc/%d/ns/pid", (int)pid);
  return stat("/proc/self/ns/pid", &self) == 0 && stat(path, &other) == 0 &&
         self.st_ino == other.st_ino && self.st_dev == other.st_dev;
}

/* The parent pid of pid from /proc/<pid>/stat, or -1. */
static pid_t
parent_of(pid_t pid)
{
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0)
    return -1;
  buf[n] = '\0';
  /* The command name may hold spaces and parentheses: fields resume after the last ')'. */
  char *p = strrchr(buf, ')');
  int ppid = -1;
  char state;
  if (!p || sscanf(p + 1, " %c %d", &state, &ppid) != 2)
    return -1;
  return (pid_t)ppid;
}

bool
jail_cg_has_live_parent(jail_cgroups_t *cg, const char *name)
{
  int i = cg->v2 ? 0 : JAIL_CG_PIDS;
  char file[300];
  snprintf(file, sizeof file, "%s/cgroup.procs", name);
  int fd = openat(cg->parent_fd[i], file, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return false;
  FILE *f = fdopen(fd, "r");
  if (!f) {
    close(fd);
    return false;
  }
  pid_t pids[4096];
  size_t n = 0;
  int pid;
  while (n < sizeof pids / sizeof pids[0] && fscanf(f, "%d", &pid) == 1)
    pids[n++] = (pid_t)pid;
  fclose(f);
  for (size_t k = 0; k < n; k++) {
    /* A host process in the group is a creator stepping in (its sandbox is being born), so
     * the group is no dead owner's. Its parent may be pid 1 (a daemon under systemd), which
     * the test below skips, and its child would count as "inside". */
    if (host_process(pids[k]))
      return true;
    pid_t pp = parent_of(pids[k]);
    if (pp <= 1)
      continue;
    bool inside = false;
    for (size_t m = 0; m < n && !inside; m++)
      inside = pids[m] == pp;
    /* The sandbox's init hangs off the host process that created it; once that process
     * dies the init is killed (PDEATHSIG) or reparented to 1. A parent outside the group
     * that is alive means the owner is alive. */
    if (!inside && kill(pp, 0) == 0)
      return true;
  }
  return false;
}

/* ------------------------------------------------------------ a run's subtrees */

/* The kill step, the count of what is left and the removal do not stop at the run's groups
 * themselves: each controller's run group is walked with its descendants, depth first, so
 * a process put (by host root: the sandbox cannot) in a child group, or in one controller's
 * group only, is killed and counted too, and child groups are removed bottom-up before the
 * run's. The walk is bounded, so a tree deep or wide enough cannot stall the daemon: groups
 * past a bound are not visited, the groups above them stay (the kernel removes no group
 * that has children), they count as left, and the walk says it stopped (`truncated`). */
#define WALK_MAX_DEPTH 8    /* levels of groups below a run's group */
#define WALK_MAX_GROUPS 256 /* directory entries below a run's group, per controller and walk */
#define WALK_MAX_PIDS 65536 /* distinct processes remembered per walk; more count as new */

/* Where a process was listed: bit i for controller slot i, and these. */
#define SEEN_CHILD (1u << JAIL_CG_N)      /* in a group below the run's */
#define SEEN_HOST (1u << (JAIL_CG_N + 1)) /* a host process: never killed (host_process) */

typedef struct seen_pid {
  pid_t pid;
  unsigned where;
} seen_pid_t;

/* Distinct processes listed by a walk, sorted by pid: a v1 sandbox's process is listed once
 * per controller. */
typedef struct pidset {
  seen_pid_t *v;
  size_t n, cap;
  int overflow; /* listings past WALK_MAX_PIDS (or unrecorded for want of memory) */
} pidset_t;

static void
pidset_add(pidset_t *s, pid_t pid, unsigned where)
{
  size_t lo = 0, hi = s->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (s->v[mid].pid == pid) {
      s->v[mid].where |= where;
      return;
    }
    if (s->v[mid].pid < pid)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 64;
    seen_pid_t *v = s->n < WALK_MAX_PIDS ? realloc(s->v, cap * sizeof *v) : NULL;
    if (!v) {
      s->overflow++;
      return;
    }
    s->v = v;
    s->cap = cap;
  }
  memmove(s->v + lo + 1, s->v + lo, (s->n - lo) * sizeof *s->v);
  s->v[lo] = (seen_pid_t){pid, where};
  s->n++;
}

static void
pidset_free(pidset_t *s)
{
  free(s->v);
  *s = (pidset_t){0};
}

/* Adds what s holds to t; host: whether host processes are counted (in procs too). */
static void
tally_add(jail_cg_tally_t *t, const pidset_t *s, bool host)
{
  for (size_t k = 0; k < s->n; k++) {
    unsigned w = s->v[k].where;
    if ((w & SEEN_HOST) && !host)
      continue;
    t->procs++;
    for (int i = 0; i < JAIL_CG_N; i++)
      t->in_ctl[i] += (w >> i) & 1;
    t->in_children += (w & SEEN_CHILD) != 0;
    t->host += (w & SEEN_HOST) != 0;
  }
  t->procs += s->overflow;
  t->truncated = t->truncated || s->overflow > 0;
}

/* One walk of the run's groups, controller by controller. */
typedef struct walk {
  int ctl;         /* the controller slot being walked */
  bool kill;       /* SIGKILL every process listed but host ones */
  bool remove;     /* rmdir the descendants, bottom-up */
  pidset_t *seen;  /* what cgroup.procs lists; NULL: none is read */
  int entries;     /* directory entries below the run's group (this controller) */
  int groups;      /* descendant groups found (all controllers) */
  int groups_left; /* of them still there (all of them unless remove), unvisited ones too */
  bool truncated;  /* a bound stopped it */
} walk_t;

/* Reads the cgroup.procs of the group open as dirfd. */
static void
walk_procs(int dirfd, bool child, walk_t *w)
{
  int fd = openat(dirfd, "cgroup.procs", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return; /* gone; or v2's threaded groups, whose processes their domain lists */
  FILE *f = fdopen(fd, "r");
  if (!f) {
    close(fd);
    return;
  }
  int pid;
  while (fscanf(f, "%d", &pid) == 1) {
    /* Never a host process: a thread of this one, or of another process sharing the
     * cgroup parent, stands in the group while it clones a sandbox (jail_cg_enter_thread),
     * and one that could not step out must not kill its owner. */
    bool host = pid <= 1 || pid == getpid() || host_process(pid);
    if (w->kill && !host)
      kill(pid, SIGKILL);
    pidset_add(w->seen, pid, (1u << w->ctl) | (child ? SEEN_CHILD : 0) | (host ? SEEN_HOST : 0));
  }
  fclose(f);
}

/* Walks the group open as fd (O_RDONLY directory; closed here), depth levels below the
 * run's group: its own list, then each child group's subtree, each child removed after it. */
static void
walk_group(int fd, int depth, walk_t *w)
{
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return;
  }
  int dfd = dirfd(d);
  if (w->seen)
    walk_procs(dfd, depth > 0, w);
  struct dirent *de;
  while ((de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
      continue;
    struct stat st;
    if (de->d_type != DT_DIR &&
        (de->d_type != DT_UNKNOWN || fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
         !S_ISDIR(st.st_mode)))
      continue;
    w->groups++;
    if (++w->entries > WALK_MAX_GROUPS || depth >= WALK_MAX_DEPTH) {
      w->truncated = true;
      w->groups_left++; /* and whatever is below it, unvisited */
      if (w->entries > WALK_MAX_GROUPS)
        break;
      continue;
    }
    int c = openat(dfd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (c < 0) {
      if (errno != ENOENT)
        w->groups_left++;
      continue;
    }
    walk_group(c, depth + 1, w);
    if (!w->remove || (unlinkat(dfd, de->d_name, AT_REMOVEDIR) < 0 && errno != ENOENT))
      w->groups_left++;
  }
  closedir(d);
}

/* Walks controller slot i's run group `name` and its descendants; false when it is absent. */
static bool
walk_run(jail_cgroups_t *cg, int i, const char *name, walk_t *w)
{
  int fd = openat(cg->parent_fd[i], name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return false;
  w->ctl = i;
  w->entries = 0;
  walk_group(fd, 0, w);
  return true;
}

/* One walk of every controller's run group: what they and their descendants list. */
static void
walk_all(jail_cgroups_t *cg, const char *name, bool kill_them, pidset_t *seen, walk_t *out)
{
  *out = (walk_t){.kill = kill_them, .seen = seen};
  for (int i = 0; i < cg->n_dirs; i++)
    (void)walk_run(cg, i, name, out);
}

int
jail_cg_kill_all(jail_cgroups_t *cg, const char *name, int timeout_ms, jail_cg_tally_t *killed,
                 jail_cg_tally_t *left)
{
  pidset_t all = {0}; /* every process listed during the call */
  jail_cg_tally_t now = {0};
  int groups = 0;
  bool truncated = false;
  if (cg->v2 && cg->has_kill) {
    /* cgroup.kill kills the whole subtree at once (and what forks meanwhile); it says not
     * what it killed, and it would kill a host process put there too, which is never
     * killed here: the groups are listed first, and it is written only when they hold
     * none. The walks below kill what comes in later (or everything, process by process). */
    walk_t w;
    walk_all(cg, name, false, &all, &w);
    groups = w.groups;
    truncated = w.truncated;
    bool host = false;
    for (size_t k = 0; k < all.n; k++)
      host = host || (all.v[k].where & SEEN_HOST);
    if (!host) {
      char file[300];
      snprintf(file, sizeof file, "%s/cgroup.kill", name);
      (void)write_at(cg->parent_fd[0], file, "1");
    }
  }
  int64_t end = eph_now_ms() + timeout_ms;
  for (;;) {
    pidset_t seen = {0};
    walk_t w;
    walk_all(cg, name, true, &seen, &w);
    for (size_t k = 0; k < seen.n; k++)
      pidset_add(&all, seen.v[k].pid, seen.v[k].where);
    all.overflow = all.overflow > seen.overflow ? all.overflow : seen.overflow;
    now = (jail_cg_tally_t){.groups = w.groups, .truncated = w.truncated};
    tally_add(&now, &seen, true);
    groups = groups > w.groups ? groups : w.groups;
    truncated = truncated || w.truncated;
    pidset_free(&seen);
    /* Done when nothing is listed but host processes, which are never killed here: waiting
     * would not make them go. */
    if (now.procs == now.host || eph_now_ms() >= end)
      break;
    sleep_ms(1);
  }
  if (killed) {
    *killed = (jail_cg_tally_t){.groups = groups, .truncated = truncated};
    tally_add(killed, &all, false);
  }
  if (left)
    *left = now;
  pidset_free(&all);
  return now.procs;
}

int
jail_cg_count(jail_cgroups_t *cg, const char *name, jail_cg_tally_t *out)
{
  pidset_t seen = {0};
  walk_t w;
  walk_all(cg, name, false, &seen, &w);
  jail_cg_tally_t t = {.groups = w.groups, .truncated = w.truncated};
  tally_add(&t, &seen, true);
  pidset_free(&seen);
  if (out)
    *out = t;
  return t.procs;
}

int
jail_cg_remove(jail_cgroups_t *cg, const char *name, int timeout_ms)
{
  int64_t end = eph_now_ms() + timeout_ms;
  int left;
  for (;;) {
    left = 0;
    for (int i = 0; i < cg->n_dirs; i++) {
      /* The first rmdir is all a clean run's group needs: nothing is read. */
      if (unlinkat(cg->parent_fd[i], name, AT_REMOVEDIR) == 0 || errno == ENOENT)
        continue;
      /* Refused (EBUSY): a process or a child group holds it. Child groups go first,
       * bottom-up (no cgroup.procs read: a group holding a process refuses its rmdir). */
      walk_t w = {.remove = true};
      if (!walk_run(cg, i, name, &w) && errno == ENOENT)
        continue;
      if (unlinkat(cg->parent_fd[i], name, AT_REMOVEDIR) == 0 || errno == ENOENT)
        continue;
      left += 1 + w.groups_left;
    }
    if (left == 0 || eph_now_ms() >= end)
      return left;
    sleep_ms(1);
  }
}

int
jail_cg_tally_text(const jail_cgroups_t *cg, const jail_cg_tally_t *t, char *buf, size_t size)
{
  int n = snprintf(buf, size, "%d process(es)", t->procs);
  size_t off = n < 0 ? 0 : (size_t)n;
#define TALLY_PUT(...)                                                                             \
  do {                                                                                             \
    if (off < size) {                                                                              \
      int k_ = snprintf(buf + off, size - off, __VA_ARGS__);                                       \
      off += k_ < 0 ? 0 : (size_t)k_;                                                              \
    }                                                                                              \
  } while (0)
  if (t->procs && !cg->v2)
    TALLY_PUT(" (memory %d, pids %d, cpu %d%s", t->in_ctl[JAIL_CG_MEMORY], t->in_ctl[JAIL_CG_PIDS],
              t->in_ctl[JAIL_CG_CPU], t->in_children ? "; " : ")");
  if (t->procs && t->in_children)
    TALLY_PUT("%s%d in child groups)", cg->v2 ? " (" : "", t->in_children);
  if (t->host)
    TALLY_PUT(", %d host process(es) spared", t->host);
  if (t->groups)
    TALLY_PUT("; the run's groups had %d child group(s)", t->groups);
  if (t->truncated)
    TALLY_PUT(", more past the walk's bounds (%d levels, %d groups)", WALK_MAX_DEPTH,
              WALK_MAX_GROUPS);
#undef TALLY_PUT
  return (int)(off < size ? off : size ? size - 1 : 0);
}

static bool
valid_name(const char *n)
{
  return n[0] != '.' && strlen(n) < 200;
}

int
jail_cg_list(jail_cgroups_t *cg, void (*fn)(void *opaque, const char *name), void *opaque)
{
  /* v1: every controller is scanned; the callback dedups by reaping (a reaped name is gone
   * from the later controllers when fn removes it everywhere). */
  int n = 0;
  for (int i = 0; i < cg->n_dirs; i++) {
    int fd = openat(cg->parent_fd[i], ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
      continue;
    DIR *d = fdopendir(fd);
    if (!d) {
      close(fd);
      continue;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
      if (de->d_type != DT_DIR || !valid_name(de->d_name))
        continue;
      struct stat st;
      if (fstatat(cg->parent_fd[i], de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        continue; /* already reaped through another controller */
      fn(opaque, de->d_name);
      n++;
    }
    closedir(d);
  }
  return n;
}
