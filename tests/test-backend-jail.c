/* backend-jail against real sandboxes, alone: the plugin .so is dlopen()ed with a fake core
 * (host services over libconfig) and tests/jail-init stands in for ephemeral-guest as PID 1.
 * What the whole stack does (ephemeral exec + the real guest) is tests/sandbox.test.
 * Needs root (cgroups, uid maps): skipped otherwise. Uses its own cgroup parent and run_dir
 * so it never touches the sandboxes of a real ephemeral on the same host. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <ephemeral/plugin.h>

#include "jail-fixture.h"
#include "mock-host.h"

/* Its own cgroup parent (and run_dir), named after the pid: the sweep judges the groups under
 * its parent by the records in its run_dir, so a parent shared with another process using
 * another run_dir (the shell tests, another checkout's run of this test) would have its
 * fresh, still empty groups reaped. */
static jf_paths_t jp;
static char *const cg_parent = jp.cg_parent;
#define MIB (1024ULL * 1024ULL)

static char *const run_dir = jp.run_dir;
static char *const init_path = jp.init;
static char *const plugin_path = jp.plugin;
static config_t cfg;

/* ------------------------------------------------------------ fake core */

/* The shared fake host (mock-host.h): the core's own config getters, its log mirrored as TAP
 * comments. Filled in main(). */
#define host fh_host

typedef fh_backend_t loaded_t;

static void
load(loaded_t *l)
{
  eph_error_t err = {0};
  if (fh_backend_load(l, plugin_path, config_lookup(&cfg, "backend-jail"), &err) < 0)
    fail_msg("%s", err.message);
}

/* ------------------------------------------------------------ helpers */

typedef struct box {
  eph_sandbox_t *sb;
  int fd;
  char run_id[64];
} box_t;

/* Every sandbox a test made and has not destroyed yet: a failed assertion longjmp()s out of
 * the test, and teardown_boxes() then destroys what it left (no sandbox, no leak on any
 * path). Copies, not pointers to the test's box_t: its stack frame is gone by then. */
static struct {
  loaded_t *l;
  eph_sandbox_t *sb;
  int fd;
} live_boxes[8];

static int
make_box(loaded_t *l, box_t *b, const eph_sandbox_limits_t *lim, int64_t deadline_ms,
         eph_error_t *err)
{
  static int seq;
  snprintf(b->run_id, sizeof b->run_id, "run_test%d_%d", (int)getpid(), seq++);
  eph_sandbox_spec_t spec = {
      .struct_size = sizeof spec, .run_id = b->run_id, .deadline_ms = deadline_ms};
  if (lim)
    spec.limits = *lim;
  int r = l->ops->create(l->state, &spec, &b->sb, &b->fd, err);
  if (r >= 0)
    for (size_t i = 0; i < sizeof live_boxes / sizeof live_boxes[0]; i++)
      if (!live_boxes[i].sb) {
        live_boxes[i].l = l;
        live_boxes[i].sb = b->sb;
        live_boxes[i].fd = b->fd;
        break;
      }
  return r;
}

static void
forget_box(const eph_sandbox_t *sb)
{
  for (size_t i = 0; i < sizeof live_boxes / sizeof live_boxes[0]; i++)
    if (live_boxes[i].sb == sb)
      live_boxes[i].sb = NULL;
}

/* Per-test teardown: destroys the sandboxes a failed test left behind. */
static int
teardown_boxes(void **ctx)
{
  (void)ctx;
  for (size_t i = 0; i < sizeof live_boxes / sizeof live_boxes[0]; i++)
    if (live_boxes[i].sb) {
      eph_error_t err = {0};
      if (live_boxes[i].l->ops->destroy(live_boxes[i].l->state, live_boxes[i].sb, NULL, &err) < 0)
        fprintf(stderr, "# teardown: destroy: %s\n", err.message);
      close(live_boxes[i].fd);
      live_boxes[i].sb = NULL;
    }
  return 0;
}

/* Runs cmd as uid inside (jail-fixture.h). */
static int
run(box_t *b, int uid, const char *cmd, char *out, size_t size)
{
  return jf_run(b->fd, uid, cmd, out, size);
}

static char *
cg_path(const char *ctl, const char *run_id, const char *file, char *buf, size_t size)
{
  snprintf(buf, size, "/sys/fs/cgroup/%s/%s/%s%s%s", ctl, cg_parent, run_id, file ? "/" : "",
           file ? file : "");
  return buf;
}

static long long
read_ll(const char *path)
{
  FILE *f = fopen(path, "r");
  long long v = -1;
  if (f) {
    if (fscanf(f, "%lld", &v) != 1)
      v = -1;
    fclose(f);
  }
  return v;
}

static int
count_records(void)
{
  char cmd[512];
  snprintf(cmd, sizeof cmd, "ls %s | grep -c slot-", run_dir);
  FILE *p = popen(cmd, "r");
  int n = -1;
  if (fscanf(p, "%d", &n) != 1)
    n = -1;
  pclose(p);
  return n;
}

static void
destroy_clean(loaded_t *l, box_t *b)
{
  eph_sandbox_report_t rep = {.struct_size = sizeof rep};
  eph_error_t err = {0};
  forget_box(b->sb);
  int r = l->ops->destroy(l->state, b->sb, &rep, &err);
  if (r < 0)
    fail_msg("destroy: %s", err.message);
  close(b->fd);
  assert_int_equal(rep.processes_left, 0);
  assert_int_equal(rep.files_left, 0);
  char path[512];
  assert_int_equal(access(cg_path("memory", b->run_id, NULL, path, sizeof path), F_OK), -1);
  assert_int_equal(access(cg_path("pids", b->run_id, NULL, path, sizeof path), F_OK), -1);
  assert_int_equal(access(cg_path("cpu", b->run_id, NULL, path, sizeof path), F_OK), -1);
}

/* SIGKILLs, from the host, every process of the sandbox but its PID 1, until its pids cgroup
 * lists no other: a fork bomb holding the pid limit cannot be stopped from inside (the
 * shell that would run pkill cannot fork). Bounded by 30 s; returns the processes killed
 * or -1 when some were still listed at the deadline. */
static int
kill_workload(const char *run_id)
{
  char path[512];
  cg_path("pids", run_id, "cgroup.procs", path, sizeof path);
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int killed = 0;
  for (;;) {
    FILE *f = fopen(path, "r");
    if (!f)
      return -1;
    int others = 0, pid;
    while (fscanf(f, "%d", &pid) == 1)
      if (!jf_is_sandbox_init(pid)) {
        others++;
        if (kill(pid, SIGKILL) == 0)
          killed++;
      }
    fclose(f);
    if (others == 0)
      return killed;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - t0.tv_sec > 30)
      return -1;
    sched_yield();
  }
}

static pid_t
first_pid(const char *run_id)
{
  char path[512];
  return (pid_t)read_ll(cg_path("pids", run_id, "cgroup.procs", path, sizeof path));
}

/* ------------------------------------------------------------ tests */

static void
test_identity_and_uid_map(void **ctx)
{
  loaded_t *l = *ctx;
  box_t b;
  eph_error_t err = {0};
  if (make_box(l, &b, NULL, 0, &err) < 0)
    fail_msg("create: %s", err.message);
  char out[8192];
  assert_int_equal(run(&b, 0, "id -u; id -g", out, sizeof out), 0);
  assert_string_equal(out, "0\n0\n");
  assert_int_equal(run(&b, 1000, "id -un; echo $$", out, sizeof out), 0);
  assert_true(strncmp(out, "worker\n", 7) == 0);

  /* The host sees PID 1 as an unprivileged slot uid, never 0. */
  pid_t init = first_pid(b.run_id);
  assert_true(init > 1);
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)init);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  unsigned uid = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "Uid:\t%u", &uid) == 1)
      break;
  fclose(f);
  assert_true(uid >= 100000);
  assert_int_equal((uid - 100000) % 65536, 0);
  assert_int_equal(count_records(), 1);
  destroy_clean(l, &b);
  assert_int_equal(count_records(), 0);
  assert_int_equal(kill(init, 0), -1);
}

static void
test_isolation(void **ctx)
{
  loaded_t *l = *ctx;
  box_t b;
  eph_error_t err = {0};
  if (make_box(l, &b, NULL, 0, &err) < 0)
    fail_msg("create: %s", err.message);
  char out[16384];
  /* Loopback only, and up. */
  assert_int_equal(
      run(&b, 1000, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '", out, sizeof out), 0);
  assert_string_equal(out, "lo\n");
  assert_int_equal(run(&b, 1000,
                       "cat /sys/class/net/lo/operstate 2>/dev/null || "
                       "grep -c . /proc/net/if_inet6",
                       out, sizeof out),
                   0);
  assert_string_equal(out, "1\n");
  /* No name resolution at all: no resolv.conf, hosts has localhost only. */
  assert_int_not_equal(run(&b, 1000, "test -e /etc/resolv.conf", out, sizeof out), 0);
  assert_int_equal(run(&b, 1000, "getent hosts example.com; echo rc=$?", out, sizeof out), 0);
  assert_string_equal(out, "rc=2\n");
  /* Read-only system, even for the sandbox's root. */
  assert_int_not_equal(run(&b, 0, "touch /usr/x", out, sizeof out), 0);
  assert_int_not_equal(run(&b, 0, "touch /etc/x", out, sizeof out), 0);
  assert_int_not_equal(run(&b, 0, "mkdir /newdir", out, sizeof out), 0);
  /* Host files are not there. */
  assert_int_equal(run(&b, 0,
                       "ls -A /root | wc -l; test -e /work || echo nowork; "
                       "test -e /etc/ephemeral || echo noconf; test -e /run || echo norun",
                       out, sizeof out),
                   0);
  assert_string_equal(out, "0\nnowork\nnoconf\nnorun\n");
  /* /usr is built from the usr_binds list: no /usr/local (nor /usr/local/etc, where a
   * default install puts ephemeral's configuration), no /usr/include. Host identifiers in
   * /proc are masked: an empty kernel command line, a boot id of the sandbox. */
  assert_int_equal(run(&b, 0,
                       "ls /usr | tr '\\n' ' '; test -e /usr/local || echo nolocal; "
                       "wc -c < /proc/cmdline; cat /proc/sys/kernel/random/boot_id; "
                       "ip -o link show lo | grep -o 'mtu [0-9]*'",
                       out, sizeof out),
                   0);
  char host_boot[64] = "";
  FILE *bf = fopen("/proc/sys/kernel/random/boot_id", "r");
  assert_non_null(bf);
  assert_non_null(fgets(host_boot, sizeof host_boot, bf));
  fclose(bf);
  assert_null(strstr(out, host_boot));
  if (strncmp(out, "bin lib lib64 libexec sbin share nolocal\n0\n", 43) != 0)
    fail_msg("/usr and /proc/cmdline inside: '%s'", out);
  assert_non_null(strstr(out, "mtu 1500"));
  /* Its own pid namespace: PID 1 is the init, few processes. */
  assert_int_equal(run(&b, 1000, "cat /proc/1/cmdline | tr '\\0' ' '; ls /proc | grep -c '^[0-9]'",
                       out, sizeof out),
                   0);
  assert_true(strncmp(out, "ephemeral-guest --fd 3", 22) == 0);
  assert_true(atoi(strchr(out, '\n') + 1) <= 5);
  /* Devices, symlinks, writable /tmp owned by the worker. */
  assert_int_equal(run(&b, 1000,
                       "echo x > /dev/null && head -c 4 /dev/urandom | wc -c && "
                       "readlink /bin && echo hi > /tmp/f && stat -c %U /tmp/f && hostname",
                       out, sizeof out),
                   0);
  assert_string_equal(out, "4\nusr/bin\nworker\nephemeral\n");
  destroy_clean(l, &b);
}

static void
test_limits_written_and_refused(void **ctx)
{
  loaded_t *l = *ctx;
  box_t b;
  eph_error_t err = {0};
  eph_sandbox_limits_t lim = {.memory_bytes = 200 * MIB,
                              .pids = 40,
                              .cpu_percent = 50,
                              .nofile = 77,
                              .scratch_bytes = 20 * MIB};
  if (make_box(l, &b, &lim, 0, &err) < 0)
    fail_msg("create: %s", err.message);
  char path[512], out[4096];
  assert_int_equal(read_ll(cg_path("memory", b.run_id, "memory.limit_in_bytes", path, sizeof path)),
                   200 * MIB);
  if (access(cg_path("memory", b.run_id, "memory.memsw.limit_in_bytes", path, sizeof path), F_OK) ==
      0)
    assert_int_equal(read_ll(path), 200 * MIB);
  /* TCP buffers are not part of memory.usage_in_bytes on v1: their own limit, an eighth
   * of the memory limit, written before the sandbox's first task joined. */
  assert_int_equal(
      read_ll(cg_path("memory", b.run_id, "memory.kmem.tcp.limit_in_bytes", path, sizeof path)),
      25 * MIB);
  assert_int_equal(read_ll(cg_path("pids", b.run_id, "pids.max", path, sizeof path)), 40);
  assert_int_equal(read_ll(cg_path("cpu", b.run_id, "cpu.cfs_quota_us", path, sizeof path)), 50000);
  assert_int_equal(
      run(&b, 1000, "ulimit -n; df -k /tmp | tail -1 | tr -s ' ' | cut -d' ' -f2", out, sizeof out),
      0);
  assert_string_equal(out, "77\n20480\n");
  destroy_clean(l, &b);

  /* Above the operator maxima (max_memory_mib = 1024 in this test's config): refused, and
   * nothing of it exists. */
  eph_sandbox_limits_t big = {.memory_bytes = 2048 * MIB};
  memset(&err, 0, sizeof err);
  assert_int_equal(make_box(l, &b, &big, 0, &err), -EINVAL);
  assert_non_null(strstr(err.message, "max_memory_mib"));
  eph_sandbox_limits_t pids = {.pids = 100000};
  assert_int_equal(make_box(l, &b, &pids, 0, &err), -EINVAL);
  assert_int_equal(access(cg_path("memory", b.run_id, NULL, path, sizeof path), F_OK), -1);
  assert_int_equal(count_records(), 0);
}

/* The text of a small file ("" when unreadable). */
static void
slurp(const char *path, char *buf, size_t size)
{
  buf[0] = '\0';
  FILE *f = fopen(path, "r");
  if (!f)
    return;
  size_t n = fread(buf, 1, size - 1, f);
  buf[n] = '\0';
  fclose(f);
}

/* On cgroup v1 the creating thread steps into the run's groups, clones the sandbox there and
 * steps back (cgroup.c jail_cg_enter_thread). Whatever path is taken: the sandbox's first
 * process is in its own groups, whose limits were written before; no thread of the host
 * process is left in them; the creating thread is back in its own groups; and the limits
 * hold inside (a process limit of 6 refuses the seventh process). */
static void
test_born_in_its_groups(void **ctx)
{
  loaded_t *l = *ctx;
  box_t b;
  eph_error_t err = {0};
  char before[2048], after[2048], path[512], text[4096], out[4096];
  slurp("/proc/thread-self/cgroup", before, sizeof before);
  eph_sandbox_limits_t lim = {.memory_bytes = 96 * MIB, .pids = 6, .scratch_bytes = 8 * MIB};
  if (make_box(l, &b, &lim, 0, &err) < 0)
    fail_msg("create: %s", err.message);
  slurp("/proc/thread-self/cgroup", after, sizeof after);
  assert_string_equal(before, after);

  static const char *const ctls[] = {"memory", "pids", "cpu"};
  for (size_t i = 0; i < 3; i++) {
    slurp(cg_path(ctls[i], b.run_id, "tasks", path, sizeof path), text, sizeof text);
    assert_true(text[0] != '\0'); /* the sandbox's init is there */
    for (char *save = NULL, *t = strtok_r(text, "\n", &save); t; t = strtok_r(NULL, "\n", &save)) {
      char task[64];
      snprintf(task, sizeof task, "/proc/self/task/%s", t);
      if (access(task, F_OK) == 0)
        fail_msg("host thread %s is in the sandbox's %s group", t, ctls[i]);
    }
  }
  assert_int_equal(read_ll(cg_path("memory", b.run_id, "memory.limit_in_bytes", path, sizeof path)),
                   96 * MIB);
  assert_int_equal(read_ll(cg_path("pids", b.run_id, "pids.max", path, sizeof path)), 6);
  /* init + the command's shell + 5 sleeps > 6: some sleeps are refused. */
  run(&b, 1000,
      "n=0; for i in 1 2 3 4 5; do sleep 2 2>/dev/null & done; "
      "for j in $(jobs -p); do n=$((n+1)); done; echo $n",
      out, sizeof out);
  assert_true(atoi(out) < 5);
  slurp(cg_path("pids", b.run_id, "pids.events", path, sizeof path), text, sizeof text);
  assert_non_null(strstr(text, "max "));
  assert_null(strstr(text, "max 0\n"));
  destroy_clean(l, &b);
}

static void
test_fork_bomb_oom_enospc(void **ctx)
{
  loaded_t *l = *ctx;
  box_t b;
  eph_error_t err = {0};
  eph_sandbox_limits_t lim = {.memory_bytes = 128 * MIB, .pids = 32, .scratch_bytes = 16 * MIB};
  if (make_box(l, &b, &lim, 0, &err) < 0)
    fail_msg("create: %s", err.message);
  char out[16384];
  /* Fork bomb: forks fail inside; the host keeps forking fine. */
  run(&b, 1000, "b() { b | b & }; b; sleep 1; echo done", out, sizeof out);
  /* Stopped from the host through its cgroup; then the sandbox runs commands again (its
   * init reaps the bomb's zombies before forking) and no worker process is left. */
  assert_true(kill_workload(b.run_id) >= 0);
  /* What the bomb wrote ("Cannot fork") before it died is still in the stream: drop it. */
  char junk[4096];
  for (struct pollfd pf = {.fd = b.fd, .events = POLLIN}; poll(&pf, 1, 0) > 0;)
    if (read(b.fd, junk, sizeof junk) <= 0)
      break;
  assert_int_equal(run(&b, 0, "pgrep -u worker; echo rc=$?", out, sizeof out), 0);
  assert_string_equal(out, "rc=1\n");
  eph_sandbox_report_t rep = {.struct_size = sizeof rep};
  assert_int_equal(l->ops->stats(l->state, b.sb, &rep, &err), 0);
  assert_true(rep.pids_refused > 0);
  assert_int_equal(system("true"), 0);
  /* Memory hog: tail buffers a line that never ends; killed by the OOM killer inside. */
  int st = run(&b, 1000, "head -c 400M /dev/zero | tail > /dev/null", out, sizeof out);
  assert_true(st != 0);
  assert_int_equal(l->ops->stats(l->state, b.sb, &rep, &err), 0);
  assert_true(rep.oom_kills > 0);
  assert_true(rep.memory_peak_bytes > 64 * MIB && rep.memory_peak_bytes <= 128 * MIB);
  /* The sandbox survived both. Full disk: ENOSPC, not an OOM kill. */
  uint64_t ooms = rep.oom_kills;
  assert_int_equal(run(&b, 1000,
                       "dd if=/dev/zero of=/tmp/fill bs=1M 2>&1 | "
                       "grep -c 'No space left'",
                       out, sizeof out),
                   0);
  assert_string_equal(out, "1\n");
  assert_int_equal(l->ops->stats(l->state, b.sb, &rep, &err), 0);
  assert_int_equal(rep.oom_kills, ooms);
  destroy_clean(l, &b);
}

static void
test_background_and_deadline(void **ctx)
{
  loaded_t *l = *ctx;
  box_t b;
  eph_error_t err = {0};
  if (make_box(l, &b, NULL, 0, &err) < 0)
    fail_msg("create: %s", err.message);
  char out[4096], path[512];
  assert_int_equal(
      run(&b, 1000, "setsid nohup sleep 1000 >/dev/null 2>&1 & echo ok", out, sizeof out), 0);
  /* Host pids of everything in the sandbox, then destroy: all gone. */
  FILE *f = fopen(cg_path("pids", b.run_id, "cgroup.procs", path, sizeof path), "r");
  assert_non_null(f);
  int pids[64], n = 0;
  while (n < 64 && fscanf(f, "%d", &pids[n]) == 1)
    n++;
  fclose(f);
  assert_true(n >= 2);
  destroy_clean(l, &b);
  for (int i = 0; i < n; i++)
    assert_int_equal(kill(pids[i], 0), -1);

  /* Deadline: the watchdog kills the whole sandbox; the stream ends well before sleep does. */
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int64_t now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
  if (make_box(l, &b, NULL, now + 700, &err) < 0)
    fail_msg("create: %s", err.message);
  assert_int_equal(run(&b, 1000, "sleep 30", out, sizeof out), -1);
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int64_t after = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
  assert_true(after - now < 5000);
  destroy_clean(l, &b);
}

/* A stray process for the tests below: PID 1 of a pid namespace of its own (as a sandbox's
 * processes are, so the jail's kill paths do not take it for a host process), in this
 * process's groups, pausing. *mid receives its parent, which exits 0 once the stray died of
 * SIGKILL. Neither outlives the test (PR_SET_PDEATHSIG) nor holds its output open. */
static pid_t
spawn_stray(pid_t *mid)
{
  int p[2];
  assert_int_equal(pipe(p), 0);
  *mid = fork();
  assert_true(*mid >= 0);
  if (*mid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int null = open("/dev/null", O_WRONLY);
    dup2(null, STDOUT_FILENO);
    dup2(null, STDERR_FILENO);
    close(p[0]);
    if (unshare(CLONE_NEWPID) < 0)
      _exit(2);
    pid_t g = fork(); /* PID 1 of a namespace of its own */
    if (g == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      close(p[1]);
      for (;;)
        pause();
    }
    if (g < 0 || write(p[1], &g, sizeof g) != (ssize_t)sizeof g)
      _exit(3);
    close(p[1]);
    int st = 0;
    waitpid(g, &st, 0);
    _exit(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL ? 0 : 4);
  }
  close(p[1]);
  pid_t g = -1;
  assert_int_equal(read(p[0], &g, sizeof g), (ssize_t)sizeof g);
  close(p[0]);
  return g;
}

/* A host process (one of this pid namespace) in this process's groups, pausing, for the
 * test that checks the jail never kills one but counts it. */
static pid_t
spawn_host_stray(void)
{
  pid_t h = fork();
  assert_true(h >= 0);
  if (h == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int null = open("/dev/null", O_WRONLY);
    dup2(null, STDOUT_FILENO);
    dup2(null, STDERR_FILENO);
    for (;;)
      pause();
  }
  return h;
}

/* Moves pid into the group directory dir (v1: of that one controller only). */
static void
move_to(const char *dir, pid_t pid)
{
  char file[600], text[32];
  snprintf(file, sizeof file, "%s/cgroup.procs", dir);
  snprintf(text, sizeof text, "%d", (int)pid);
  FILE *f = fopen(file, "w");
  assert_non_null(f);
  assert_true(fputs(text, f) >= 0);
  assert_int_equal(fclose(f), 0);
}

/* The length of the fake host's log so far, and what it logged since such a mark. */
static size_t
log_mark(void)
{
  return fh.log ? strlen(fh.log) : 0;
}

static const char *
log_since(size_t mark)
{
  const char *said = fh.log && strlen(fh.log) >= mark ? fh.log + mark : "";
  printf("# logged: %s%s", said, said[0] ? "" : "nothing\n");
  return said;
}

/* What the stray tests below made, undone by teardown_strays() on any path (a failed
 * assertion included): their processes killed and their groups, child groups included, and
 * the run's slot record removed, so a failure leaves nothing for the later tests. A stray is
 * killed first, then its parent waited for, which reaps it before it exits (a host stray is
 * its own parent): the groups are empty by then. */
static struct {
  pid_t stray[4], parent[4];
  char run_id[64];
} strays;

static void
note_stray(pid_t stray, pid_t parent)
{
  for (size_t i = 0; i < sizeof strays.stray / sizeof strays.stray[0]; i++)
    if (strays.parent[i] <= 0) {
      strays.stray[i] = stray;
      strays.parent[i] = parent;
      return;
    }
}

/* After the stray of parent was seen dead and its parent reaped. */
static void
forget_stray(pid_t parent)
{
  for (size_t i = 0; i < sizeof strays.stray / sizeof strays.stray[0]; i++)
    if (strays.parent[i] == parent)
      strays.stray[i] = strays.parent[i] = 0;
}

/* Removes the slot record naming run_id from run_dir, if one is left. */
static void
remove_record_of(const char *run_id)
{
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "grep -l -s -F '\"%s\"' %s/slot-* | xargs -r rm -f", run_id, run_dir);
  if (system(cmd) != 0)
    fprintf(stderr, "# teardown: %s failed\n", cmd);
}

static int
teardown_strays(void **ctx)
{
  teardown_boxes(ctx);
  for (size_t i = 0; i < sizeof strays.stray / sizeof strays.stray[0]; i++)
    if (strays.parent[i] > 0) {
      kill(strays.stray[i], SIGKILL);
      waitpid(strays.parent[i], NULL, 0);
      strays.stray[i] = strays.parent[i] = 0;
    }
  if (strays.run_id[0]) {
    char path[512], cmd[1200];
    for (const char *c = "memory\0pids\0cpu\0"; *c; c += strlen(c) + 1) {
      snprintf(cmd, sizeof cmd, "[ ! -d %s ] || find %s -depth -type d -exec rmdir {} +",
               cg_path(c, strays.run_id, NULL, path, sizeof path), path);
      if (system(cmd) != 0)
        fprintf(stderr, "# teardown: %s failed\n", cmd);
    }
    remove_record_of(strays.run_id);
    strays.run_id[0] = '\0';
  }
  return 0;
}

/* Asserts the stray spawn_stray() made died of SIGKILL (its parent exits 0 then). */
static void
assert_stray_killed(pid_t mid)
{
  int st = -1;
  assert_int_equal(waitpid(mid, &st, 0), mid);
  forget_stray(mid);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0); /* it died of SIGKILL */
}

/* The sandbox a stray test works on: its groups and record are teardown_strays()'s. */
static void
make_stray_box(loaded_t *l, box_t *b)
{
  eph_error_t err = {0};
  if (make_box(l, b, NULL, 0, &err) < 0)
    fail_msg("create: %s", err.message);
  snprintf(strays.run_id, sizeof strays.run_id, "%s", b->run_id);
}

/* spawn_stray(), its stray noted for teardown_strays(). */
static pid_t
noted_stray(pid_t *mid)
{
  pid_t g = spawn_stray(mid);
  note_stray(g, *mid);
  return g;
}

/* A process put into a sandbox's groups from outside it (here one of a pid namespace of its
 * own, as a sandbox's processes are) keeps the groups from being removed once init is gone:
 * destroy then SIGKILLs what the groups list and removes them, instead of taking the first,
 * failed, removal for the end. */
static void
test_destroy_kills_what_the_groups_hold(void **ctx)
{
  loaded_t *l = *ctx;
  box_t b;
  make_stray_box(l, &b);
  pid_t mid, g = noted_stray(&mid);
  char path[512];
  for (const char *c = "memory\0pids\0cpu\0"; *c; c += strlen(c) + 1)
    move_to(cg_path(c, b.run_id, NULL, path, sizeof path), g);
  destroy_clean(l, &b); /* no process or group left, the stray one included */
  assert_stray_killed(mid);
}

/* The same, for a stray in the run's memory group only (its pids group, which the kill
 * step read alone, is empty): destroy kills it and removes every group, and says so in its
 * warning. Before, it was neither killed nor its memory group removed. */
static void
test_destroy_kills_a_stray_beside_the_pids_group(void **ctx)
{
  loaded_t *l = *ctx;
  box_t b;
  make_stray_box(l, &b);
  pid_t mid, g = noted_stray(&mid);
  char path[512];
  move_to(cg_path("memory", b.run_id, NULL, path, sizeof path), g);
  size_t mark = log_mark();
  destroy_clean(l, &b);
  assert_stray_killed(mid);
  const char *said = log_since(mark);
  assert_non_null(strstr(said, b.run_id));
  assert_non_null(strstr(said, "killed 1 process(es)"));
  assert_non_null(strstr(said, "memory 1"));
}

/* A stray in a child group made under the run's pids group: destroy kills it and removes
 * the child group, then the run's. Before, the kill step never looked below the run's
 * groups, and destroy failed reporting 0 processes left. */
static void
test_destroy_kills_a_stray_in_a_child_group(void **ctx)
{
  loaded_t *l = *ctx;
  box_t b;
  make_stray_box(l, &b);
  pid_t mid, g = noted_stray(&mid);
  char path[512];
  assert_int_equal(mkdir(cg_path("pids", b.run_id, "stray", path, sizeof path), 0755), 0);
  move_to(path, g);
  size_t mark = log_mark();
  destroy_clean(l, &b); /* the run's pids group gone: its child group went first */
  assert_stray_killed(mid);
  const char *said = log_since(mark);
  assert_non_null(strstr(said, "killed 1 process(es)"));
  assert_non_null(strstr(said, "1 in child groups"));
}

/* What cannot be killed is counted. A host process (never killed: a creator's thread stands
 * in a run's groups while it clones) in a child group of the run's pids group: destroy fails,
 * and its report counts that process, the two pids groups and the slot record that stays
 * with them. Before, it reported 0 processes left. */
static void
test_destroy_counts_what_it_spares(void **ctx)
{
  loaded_t *l = *ctx;
  box_t b;
  eph_error_t err = {0};
  make_stray_box(l, &b);
  pid_t h = spawn_host_stray();
  note_stray(h, h);
  char path[512];
  assert_int_equal(mkdir(cg_path("pids", b.run_id, "stray", path, sizeof path), 0755), 0);
  move_to(path, h);
  eph_sandbox_report_t rep = {.struct_size = sizeof rep};
  forget_box(b.sb);
  int r = l->ops->destroy(l->state, b.sb, &rep, &err);
  close(b.fd);
  printf("# %s\n", err.message);
  assert_true(r < 0);
  assert_int_equal(rep.processes_left, 1);
  assert_int_equal(rep.files_left, 3);
  assert_non_null(strstr(err.message, "1 process(es) and 3 file(s) left"));
  assert_non_null(strstr(err.message, "1 host process(es) spared"));
  assert_int_equal(kill(h, 0), 0); /* spared */
  assert_int_equal(access(cg_path("memory", b.run_id, NULL, path, sizeof path), F_OK), -1);
  assert_int_equal(access(cg_path("cpu", b.run_id, NULL, path, sizeof path), F_OK), -1);
}

/* The walk of a run's groups is bounded (8 levels, 256 groups below each run's group), so a
 * tree only host root can make cannot stall destroy: one 10 levels deep under the pids group
 * is removed as far as the walk reaches, and destroy fails in a bounded time saying its walk
 * stopped, counting the groups that stay. */
static void
test_destroy_bounds_its_walk(void **ctx)
{
  loaded_t *l = *ctx;
  box_t b;
  eph_error_t err = {0};
  make_stray_box(l, &b);
  char path[512], level[256] = "";
  for (int i = 0; i < 10; i++) {
    snprintf(level + strlen(level), sizeof level - strlen(level), "%sd%d", i ? "/" : "", i + 1);
    assert_int_equal(mkdir(cg_path("pids", b.run_id, level, path, sizeof path), 0755), 0);
  }
  eph_sandbox_report_t rep = {.struct_size = sizeof rep};
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  forget_box(b.sb);
  int r = l->ops->destroy(l->state, b.sb, &rep, &err);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  close(b.fd);
  printf("# %s\n", err.message);
  assert_true(r < 0);
  assert_int_equal(rep.processes_left, 0);
  assert_true(rep.files_left >= 10); /* the pids group, d1..d9 unremovable, the record */
  assert_non_null(strstr(err.message, "past the walk's bounds"));
  assert_true(t1.tv_sec - t0.tv_sec < 10);
  assert_int_equal(access(cg_path("memory", b.run_id, NULL, path, sizeof path), F_OK), -1);
  assert_int_equal(
      access(cg_path("pids", b.run_id, "d1/d2/d3/d4/d5/d6/d7/d8/d9", path, sizeof path), F_OK), 0);
}

static void
test_sweep_after_kill9(void **ctx)
{
  loaded_t *l = *ctx;
  int p[2];
  assert_int_equal(pipe(p), 0);
  pid_t owner = fork();
  if (owner == 0) {
    /* A second "host process" with its own plugin instance, killed -9 while its sandbox
     * (with a background process) lives. */
    loaded_t l2;
    load(&l2);
    box_t b;
    eph_error_t err = {0};
    char out[256];
    if (make_box(&l2, &b, NULL, 0, &err) < 0 ||
        run(&b, 1000, "setsid sleep 1000 & echo ok", out, sizeof out) != 0)
      _exit(1);
    if (write(p[1], b.run_id, sizeof b.run_id) < 0)
      _exit(1);
    pause();
    _exit(0);
  }
  close(p[1]);
  char run_id[64] = "";
  assert_int_equal(read(p[0], run_id, sizeof run_id), (ssize_t)sizeof run_id);
  close(p[0]);
  char path[512];
  assert_int_equal(access(cg_path("pids", run_id, NULL, path, sizeof path), F_OK), 0);
  /* Other test programs may hold sandboxes of their own at the same time (make -j):
   * count relative to them, and judge the victim by its own cgroups. */
  assert_true(count_records() >= 1);
  kill(owner, SIGKILL);
  waitpid(owner, NULL, 0);

  eph_error_t err = {0};
  /* Any process's start-up sweep (another test, a daemon started meanwhile) may reap the
   * victim first, so this sweep may find 0: what must hold is that the victim is gone. */
  int reaped = l->ops->sweep(l->state, &err);
  assert_true(reaped >= 0);
  assert_int_equal(access(cg_path("memory", run_id, NULL, path, sizeof path), F_OK), -1);
  assert_int_equal(access(cg_path("pids", run_id, NULL, path, sizeof path), F_OK), -1);
  assert_int_equal(access(cg_path("cpu", run_id, NULL, path, sizeof path), F_OK), -1);
  /* A second sweep leaves the victim gone (other tests' orphans may be reaped by it). */
  assert_true(l->ops->sweep(l->state, &err) >= 0);
  assert_int_equal(access(cg_path("pids", run_id, NULL, path, sizeof path), F_OK), -1);
}

/* The start-up sweep of a dead owner's groups (none of its records left) kills what they
 * hold beside and below the pids group, the kill step's only list before: a stray in the
 * memory group only and one in a child group of the pids group. Both die, and the groups,
 * the child group included, are removed (before: neither was killed, and the groups stayed
 * through every later sweep, each waiting 2 s for them). */
static void
test_sweep_kills_strays_beside_and_below(void **ctx)
{
  loaded_t *l = *ctx;
  char path[512];
  snprintf(strays.run_id, sizeof strays.run_id, "run_test%d_sweep", (int)getpid());
  const char *run_id = strays.run_id;
  for (const char *c = "memory\0pids\0cpu\0"; *c; c += strlen(c) + 1)
    assert_int_equal(mkdir(cg_path(c, run_id, NULL, path, sizeof path), 0755), 0);
  assert_int_equal(mkdir(cg_path("pids", run_id, "stray", path, sizeof path), 0755), 0);
  pid_t mid1, g1 = spawn_stray(&mid1);
  note_stray(g1, mid1);
  pid_t mid2, g2 = spawn_stray(&mid2);
  note_stray(g2, mid2);
  move_to(cg_path("memory", run_id, NULL, path, sizeof path), g1);
  move_to(cg_path("pids", run_id, "stray", path, sizeof path), g2);
  size_t mark = log_mark();
  eph_error_t err = {0};
  assert_true(l->ops->sweep(l->state, &err) >= 1);
  const char *said = log_since(mark);
  for (const char *c = "memory\0pids\0cpu\0"; *c; c += strlen(c) + 1)
    assert_int_equal(access(cg_path(c, run_id, NULL, path, sizeof path), F_OK), -1);
  assert_stray_killed(mid1);
  assert_stray_killed(mid2);
  assert_non_null(strstr(said, run_id));
  assert_non_null(strstr(said, "killed 2 process(es)"));
}

/* usr_binds entries that would expose host configuration are refused at init, naming
 * the entry; nothing is created. */
static void
test_usr_binds_refused(void **ctx)
{
  (void)ctx;
  static const char *const bad[] = {
      "local",    "local/etc",           "etc", "../etc", "lib/../../etc",
      "/usr/bin", "local/etc/ephemeral", NULL};
  for (size_t i = 0; bad[i]; i++) {
    config_t c;
    config_init(&c);
    char text[2048];
    snprintf(text, sizeof text,
             "backend-jail: { guest = \"%s\"; run_dir = \"%s\"; "
             "cgroup_parent = \"%s\"; usr_binds = [\"bin\", \"%s\"]; };",
             init_path, run_dir, cg_parent, bad[i]);
    assert_int_equal(config_read_string(&c, text), CONFIG_TRUE);
    loaded_t l;
    l.dl = dlopen(plugin_path, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(l.dl);
    l.p = dlsym(l.dl, EPH_PLUGIN_SYMBOL);
    eph_error_t err = {0};
    int r = l.p->init(&host, config_lookup(&c, "backend-jail"), &l.state, &err);
    if (r >= 0)
      fail_msg("usr_binds entry '%s' was accepted", bad[i]);
    assert_int_equal(r, -EPH_E_CONFIG);
    assert_non_null(strstr(err.message, "usr_binds"));
    assert_non_null(strstr(err.message, bad[i]));
    dlclose(l.dl);
    config_destroy(&c);
  }
}

/* The sandbox's first process is cloned without a copy of the host's memory (CLONE_VM, see
 * jail.c): making one leaves the host's pages as they were. A copying clone write-protects
 * every private page of the host until its next write, so rewriting a 64 MiB buffer after
 * a create then faults once per page (16,384 minor faults, on every create: in a daemon,
 * each of its threads' working sets); without a copy it does not fault. Counted for this
 * thread alone (RUSAGE_THREAD), in 4 KiB pages (no transparent huge pages). */
static void
test_host_memory_untouched(void **ctx)
{
#if !defined(__x86_64__)
  (void)ctx;
  skip(); /* clone_vm.c has the clone for x86-64 only: elsewhere the copy is expected */
#else
  loaded_t *l = *ctx;
  const size_t bytes = 64 * MIB, page = (size_t)sysconf(_SC_PAGESIZE);
  char *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  assert_true(buf != MAP_FAILED);
  assert_int_equal(madvise(buf, bytes, MADV_NOHUGEPAGE), 0);
  memset(buf, 1, bytes);
  box_t b;
  eph_error_t err = {0};
  if (make_box(l, &b, NULL, 0, &err) < 0)
    fail_msg("create: %s", err.message);
  struct rusage before, after;
  assert_int_equal(getrusage(RUSAGE_THREAD, &before), 0);
  for (size_t off = 0; off < bytes; off += page)
    buf[off] = 2;
  assert_int_equal(getrusage(RUSAGE_THREAD, &after), 0);
  long faults = after.ru_minflt - before.ru_minflt;
  printf("# rewriting %zu pages after a create: %ld minor faults\n", bytes / page, faults);
  char out[256];
  assert_int_equal(run(&b, 1000, "echo alive", out, sizeof out), 0);
  assert_string_equal(out, "alive\n");
  destroy_clean(l, &b);
  munmap(buf, bytes);
  assert_true(faults < (long)(bytes / page / 16));
#endif
}

/* A set-up step that fails in the child is reported by name and errno, and leaves nothing:
 * no slot record, no cgroup, no process (the guest "binary" here is a file that cannot be
 * executed, so the last step, the exec, fails). */
static void
test_failed_step_named(void **ctx)
{
  (void)ctx;
  char bad_guest[] = "/tmp/eph-test-guest-XXXXXX";
  int fd = mkstemp(bad_guest);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, "not a program\n", 14), 14);
  close(fd);
  assert_int_equal(chmod(bad_guest, 0644), 0);
  config_t c;
  config_init(&c);
  char text[2048];
  snprintf(text, sizeof text,
           "backend-jail: { guest = \"%s\"; run_dir = \"%s\"; cgroup_parent = \"%s\"; };",
           bad_guest, run_dir, cg_parent);
  assert_int_equal(config_read_string(&c, text), CONFIG_TRUE);
  loaded_t l2;
  eph_error_t err = {0};
  if (fh_backend_load(&l2, plugin_path, config_lookup(&c, "backend-jail"), &err) < 0)
    fail_msg("%s", err.message);
  int records = count_records();
  box_t b;
  int r = make_box(&l2, &b, NULL, 0, &err);
  unlink(bad_guest);
  if (r >= 0) {
    destroy_clean(&l2, &b);
    fail_msg("a sandbox whose guest cannot be executed was made");
  }
  printf("# %s\n", err.message);
  assert_non_null(strstr(err.message, "exec ephemeral-guest"));
  assert_non_null(strstr(err.message, strerror(EACCES)));
  assert_int_equal(count_records(), records);
  char path[512];
  assert_int_equal(access(cg_path("pids", b.run_id, NULL, path, sizeof path), F_OK), -1);
  assert_int_equal(access(cg_path("memory", b.run_id, NULL, path, sizeof path), F_OK), -1);
  fh_backend_unload(&l2);
  config_destroy(&c);
}

static int
setup(void **ctx)
{
  static loaded_t l;
  load(&l);
  *ctx = &l;
  return 0;
}

int
main(void)
{
  if (!jf_paths_init(&jp, "test"))
    return 0;

  char text[4096];
  snprintf(text, sizeof text,
           "backend-jail: { max_memory_mib = 1024; guest = \"%s\"; run_dir = \"%s\"; "
           "cgroup_parent = \"%s\"; };",
           init_path, run_dir, cg_parent);
  fh_reset(0, "/tmp", "/tmp");
  fh_log_to_stderr = true;
  config_init(&cfg);
  if (config_read_string(&cfg, text) != CONFIG_TRUE) {
    fprintf(stderr, "config: %s\n", config_error_text(&cfg));
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_identity_and_uid_map, teardown_boxes),
      cmocka_unit_test_teardown(test_isolation, teardown_boxes),
      cmocka_unit_test_teardown(test_limits_written_and_refused, teardown_boxes),
      cmocka_unit_test_teardown(test_born_in_its_groups, teardown_boxes),
      cmocka_unit_test_teardown(test_fork_bomb_oom_enospc, teardown_boxes),
      cmocka_unit_test_teardown(test_background_and_deadline, teardown_boxes),
      cmocka_unit_test_teardown(test_destroy_kills_what_the_groups_hold, teardown_strays),
      cmocka_unit_test_teardown(test_destroy_kills_a_stray_beside_the_pids_group, teardown_strays),
      cmocka_unit_test_teardown(test_destroy_kills_a_stray_in_a_child_group, teardown_strays),
      cmocka_unit_test_teardown(test_destroy_counts_what_it_spares, teardown_strays),
      cmocka_unit_test_teardown(test_destroy_bounds_its_walk, teardown_strays),
      cmocka_unit_test_teardown(test_sweep_after_kill9, teardown_boxes),
      cmocka_unit_test_teardown(test_sweep_kills_strays_beside_and_below, teardown_strays),
      cmocka_unit_test(test_usr_binds_refused),
      cmocka_unit_test_teardown(test_host_memory_untouched, teardown_boxes),
      cmocka_unit_test_teardown(test_failed_step_named, teardown_boxes),
  };
  int r = cmocka_run_group_tests_name("backend-jail", tests, setup, jf_unload);
  config_destroy(&cfg);
  fh_free();
  jf_paths_remove(&jp);
  return r;
}
