/* backend-qemu: every sandbox is a QEMU microVM (`-M microvm`, virtio-mmio only) booting the
 * guest image of guest/image/build-image.sh, whose PID 1 is ephemeral-guest.
 *
 * The order of one create():
 *   1. pick the accelerator (auto: KVM only after a bounded test boot succeeded; verdict
 *      cached in <state_dir>/qemu/accel), the limits, the snapshot for those limits;
 *   2. a 0700 run directory <state_dir>/qemu/run/<run_id> with the pid record the sweep
 *      reads (qemu pid, owner pid and its start time) and QEMU's log;
 *   3. socketpairs for the guest's virtio console and for QMP, the kernel, initramfs and
 *      snapshot opened here and inherited (QEMU reads /proc/self/fd/N, so the unprivileged
 *      QEMU never needs a path into the state directory); for a run granting web, the tap
 *      of its NIC, made in the proxy's netns (tap.c), inherited as well (no snapshot then:
 *      one saved without a NIC cannot be restored with one);
 *   4. a slot (slot-<k> record in <state_dir>/qemu/slots): QEMU runs as uid/gid
 *      uid_base + k, which no other microVM shares; fork the keeper (keeper_main, a
 *      small root process that owns QEMU: it kills QEMU at the run's deadline or the
 *      moment we die, even by SIGKILL); the keeper forks QEMU: new session, fds placed,
 *      a private mount namespace where QEMU's path is a root-only-readable copy (so QEMU
 *      is non-dumpable), supplementary groups dropped, setresgid/setresuid to the slot's
 *      ids, PR_SET_PDEATHSIG(SIGKILL) towards the keeper, no_new_privs, RLIMIT_CORE 0, exec
 *      with an empty environment and
 *      -sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny;
 *   5. QMP handshake; after a restore: the reseed frame (fresh entropy, wall clock, new
 *      scratch; the guest answers with a new hello) is queued, then `cont`.
 * destroy() closes the keeper's lifeline (the keeper kills and reaps QEMU), reaps the
 * keeper, frees the slot, removes the run directory and checks that nothing is left.
 */
#include <config.h>

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <arpa/inet.h>
#include <inttypes.h>
#include <net/if.h>
#include <limits.h>
#include <stddef.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <poll.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include "guest/protocol.h"
#include "qemu.h"

#define MIB (1024ULL * 1024ULL)
#define QMP_TIMEOUT_MS 10000
#define SNAPSHOT_SAVE_MS 60000
/* Inherited fds of the QEMU child, in this order. */
enum { FD_GUEST = 3, FD_QMP, FD_KERNEL, FD_INITRD, FD_INCOMING, FD_TAP, FD_FIRST_FREE };

#include "support/cleanup.h"

/* ------------------------------------------------------------ configuration */

static const eph_config_key_t qemu_keys[] = {
  {"qemu", EPH_CFG_STRING, "\"qemu-system-x86_64\"", NULL,
   "The QEMU system emulator (searched in PATH unless absolute)."},
  {"image_dir", EPH_CFG_STRING, "\"\"", NULL,
   "Directory of the guest image (vmlinuz, initrd.cpio, image.sha256) written by "
   "`make guest-image`; empty = <state_dir>/guest-image."},
  {"accel", EPH_CFG_STRING, "\"auto\"", NULL,
   "\"kvm\", \"tcg\" or \"auto\": auto uses KVM only after a bounded test boot under KVM "
   "reached the guest's hello (verdict cached in <state_dir>/qemu/accel), else TCG."},
  {"kvm_probe_ms", EPH_CFG_INT, "5000", "ms",
   "How long the auto test boot under KVM may take before KVM is judged unusable."},
  {"memory_mib", EPH_CFG_INT, "512", "MiB",
   "Default guest RAM (-m). The read-only root lives in it (about 60 MiB), so does /tmp."},
  {"min_memory_mib", EPH_CFG_INT, "256", "MiB",
   "Smallest guest RAM: a smaller request is raised to it (the root must fit)."},
  {"max_memory_mib", EPH_CFG_INT, "4096", "MiB",
   "Largest guest RAM a request may ask for; a larger one is refused."},
  {"max_vcpus", EPH_CFG_INT, "2", NULL,
   "Most vCPUs (-smp); a request gets ceil(cpu_percent / 100) of them, at least one."},
  {"scratch_mib", EPH_CFG_INT, "128", "MiB",
   "Default size of the guest's /tmp tmpfs (holds scratch; full = ENOSPC). Passed on "
   "the kernel command line as eph_tmp_mib."},
  {"max_scratch_mib", EPH_CFG_INT, "2048", "MiB", "Largest /tmp a request may ask for."},
  {"pids", EPH_CFG_INT, "256", NULL,
   "Default process limit of the worker (RLIMIT_NPROC of uid 1000 in the guest, set by /init "
   "from eph_pids on the kernel command line)."},
  {"max_pids", EPH_CFG_INT, "4096", NULL, "Largest process limit a request may ask for."},
  {"snapshot", EPH_CFG_BOOL, "true", NULL,
   "Start sandboxes from a saved ready guest (one cold boot per image and limits, saved "
   "under <state_dir>/qemu/snapshots) instead of booting each; false = always cold boot."},
  {"uid_base", EPH_CFG_INT, "68000000", NULL,
   "When ephemeral runs as root, the QEMU of the microVM in slot k runs as uid and gid "
   "uid_base + k, ids owning nothing: two microVMs never share one, so neither can read "
   "the other's /proc files, ptrace it or signal it. The range must not meet a host user "
   "or the jail's (backend-jail uid_base + slots*65536; the defaults end at 67208864)."},
  {"slots", EPH_CFG_INT, "1024", NULL,
   "How many microVMs (and their ids) may exist at once; slot records live in "
   "<state_dir>/qemu/slots."},
  {"append", EPH_CFG_STRING, "\"\"", NULL,
   "Extra kernel command line. eph_init=PATH replaces the guest (tests use a bogus one)."},
  {"console_log", EPH_CFG_BOOL, "false", NULL,
   "Keep the guest kernel's console in the sandbox's qemu.log (debugging; slower boots)."},
  {0},
};

typedef struct qemu_cfg {
  const char *qemu, *accel, *append;
  char *image_dir;
  int64_t kvm_probe_ms, memory_mib, min_memory_mib, max_memory_mib, max_vcpus;
  int64_t scratch_mib, max_scratch_mib, pids, max_pids, uid_base, slots;
  int snapshot, console_log;
} qemu_cfg_t;

typedef struct qemu {
  const eph_host_t *host;
  qemu_cfg_t cfg;
  char *base;     /* <state_dir>/qemu */
  char *run_base; /* <state_dir>/qemu/run */
  char *snap_dir; /* <state_dir>/qemu/snapshots */
  char *slot_dir; /* <state_dir>/qemu/slots: slot-<k> records */
  char qemu_path[PATH_MAX];
  bool exec_checked;        /* qemu_exec_copy ran (under lock) */
  char exec_copy[PATH_MAX]; /* a root-only-readable copy of QEMU (qemu_exec_copy), or "" */
  unsigned long long owner_start; /* our start time, in the slot records */
  int64_t tsc_khz; /* host TSC rate, handed to the TCG guest (its calibration is flaky) */
  pthread_mutex_t lock; /* accel verdict, exec copy */
  char accel[8];        /* resolved: "kvm" or "tcg"; "" until the first create */
} qemu_t;

/* One running QEMU: the keeper (our child, a small root process that owns QEMU, enforces
 * the deadline and our lifetime; see keeper_main) and QEMU (the keeper's child). */
typedef struct vmproc {
  pid_t keeper, qemu;
  int lifeline; /* our end of the keeper's socketpair: closing it stops QEMU */
  int slot;     /* the slot held (QEMU runs as uid_base + slot), -1 none */
} vmproc_t;

struct eph_sandbox {
  char run_id[96];
  char dir[PATH_MAX];
  vmproc_t vm;
  qmp_t qmp;
  int64_t created_ms, deadline_ms; /* deadline_ms: the run's (0 = none) */
  bool restored;
  int proxy_ns_fd;     /* a dup of spec->proxy_netns_fd when the microVM has a NIC, else -1 */
  char tap[IFNAMSIZ];  /* the NIC's tap in that netns ("" without one) */
};

/* What one QEMU start needs. */
typedef struct launch {
  const char *name;       /* -name: "ephemeral-<run_id>" marks the process for sweep */
  const char *accel;      /* "kvm" | "tcg" */
  uint64_t memory_mib;
  unsigned vcpus;
  uint64_t tmp_mib;
  unsigned pids;
  int incoming_fd;        /* snapshot to restore, or -1 */
  int64_t deadline_ms;    /* the keeper kills QEMU then (CLOCK_MONOTONIC ms; 0 = never) */
  int log_fd;             /* QEMU's stdout/stderr (and the console when console_log) */
  int tap_fd;             /* the NIC's tap (tap.c), or -1: no NIC */
  char net[64];           /* with a tap: "eph_net=GUEST/32,PROXY" for the guest's eth0 */
  char mac[18];           /* with a tap: the NIC's MAC, locally administered */
} launch_t;

/* ------------------------------------------------------------ small helpers */

static int
write_file(const char *path, const char *text, eph_error_t *err)
{
  char tmp[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    return eph_error_set(err, errno, "%s: %s", tmp, strerror(errno));
  size_t len = strlen(text);
  bool ok = write(fd, text, len) == (ssize_t)len;
  ok &= close(fd) == 0;
  if (!ok || rename(tmp, path) < 0) {
    int e = errno ? errno : EIO;
    unlink(tmp);
    return eph_error_set(err, e, "%s: %s", path, strerror(e));
  }
  return 0;
}

static char *
read_small(const char *path, char *buf, size_t size)
{
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return NULL;
  ssize_t n = read(fd, buf, size - 1);
  close(fd);
  if (n < 0)
    return NULL;
  buf[n] = '\0';
  return buf;
}

/* The start time of pid (clock ticks since boot, /proc/PID/stat field 22), 0 if gone. */
static unsigned long long
start_time(pid_t pid)
{
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  if (!read_small(path, buf, sizeof buf))
    return 0;
  char *p = strrchr(buf, ')');
  unsigned long long t = 0;
  /* after ")": state(3) ppid(4) ... starttime(22) */
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d "
                          "%*d %*d %*d %llu", &t) != 1)
    return 0;
  return t;
}

static bool
alive(pid_t pid)
{
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  if (!read_small(path, buf, sizeof buf))
    return false;
  char *p = strrchr(buf, ')');
  return p && p[2] != 'Z' && p[2] != 'X';
}

/* True when /proc/PID/cmdline holds the argument `arg` exactly. */
static bool
cmdline_has(pid_t pid, const char *arg)
{
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return false;
  char buf[8192];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0)
    return false;
  buf[n] = '\0';
  for (char *s = buf; s < buf + n; s += strlen(s) + 1)
    if (strcmp(s, arg) == 0)
      return true;
  return false;
}

/* Processes whose command line carries `-name <name>` (name = "ephemeral-<run_id>"). With
 * kill_them they get SIGKILL. */
static int
count_named(const char *name, bool kill_them)
{
  DIR *d = opendir("/proc");
  if (!d)
    return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (*end || pid <= 1 || !cmdline_has((pid_t)pid, name) || !alive((pid_t)pid))
      continue;
    n++;
    if (kill_them)
      kill((pid_t)pid, SIGKILL);
  }
  closedir(d);
  return n;
}

static int
rm_tree(const char *dir)
{
  DIR *d = opendir(dir);
  if (!d)
    return errno == ENOENT ? 0 : -errno;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
      continue;
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (unlinkat(dirfd(d), e->d_name, 0) < 0 && errno == EISDIR)
      rm_tree(p);
  }
  closedir(d);
  return rmdir(dir) < 0 && errno != ENOENT ? -errno : 0;
}

static int
count_files(const char *dir)
{
  DIR *d = opendir(dir);
  if (!d)
    return errno == ENOENT ? 0 : 1;
  int n = 1; /* the directory itself */
  struct dirent *e;
  while ((e = readdir(d)))
    n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  closedir(d);
  return n;
}

/* The host's TSC rate in kHz, measured against CLOCK_MONOTONIC_RAW over ~20 ms. Under TCG
 * the guest's TSC is the host's, and the guest kernel's own calibration against the
 * emulated PIT fails now and then on a busy host (the boot then hangs). */
static int64_t
measure_tsc_khz(void)
{
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC_RAW, &a);
  uint64_t t0 = __rdtsc();
  struct timespec pause = {0, 20 * 1000000L};
  nanosleep(&pause, NULL);
  uint64_t t1 = __rdtsc();
  clock_gettime(CLOCK_MONOTONIC_RAW, &b);
  int64_t ns = (b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec);
  return ns > 0 ? (int64_t)((t1 - t0) * 1000000ULL / (uint64_t)ns) : 0;
}

static void
find_in_path(const char *prog, char *out, size_t size)
{
  snprintf(out, size, "%s", prog);
  if (strchr(prog, '/'))
    return;
  const char *path = getenv("PATH");
  char dirs[4096];
  snprintf(dirs, sizeof dirs, "%s", path && *path ? path : "/usr/local/bin:/usr/bin:/bin");
  for (char *save, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
    char c[PATH_MAX];
    snprintf(c, sizeof c, "%s/%s", d, prog);
    if (access(c, X_OK) == 0) {
      snprintf(out, size, "%s", c);
      return;
    }
  }
}

/* QEMU 7.2 never makes itself non-dumpable, and its own -runas cannot be combined with
 * -sandbox elevateprivileges=deny. The kernel marks a process non-dumpable when it execs a
 * binary its user cannot read (would_dump(), fs.suid_dumpable = 0): so QEMU runs from a
 * copy only root may read (0711, <state_dir>/qemu/bin/, kept in step with the original's
 * size and mtime), bind-mounted over the original's path in QEMU's own mount namespace (so
 * QEMU still finds its modules and firmware relative to that path). Non-dumpable, QEMU's
 * /proc/PID files belong to root: nobody but root may ptrace it, read its memory, environ
 * or fds, and it never dumps core. Made at the first create (a host using only the jail
 * never pays for it). Returns 0, or -1 (logged; QEMU then runs dumpable, still under its
 * own uid). */
static int
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
      dst.st_uid != 0) {
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
  q->host->log(EPH_LOG_WARN, "backend-qemu: %s: %s; QEMU runs from %s and stays dumpable "
               "(its own uid still keeps other microVMs out)", path, strerror(e ? e : EIO),
               q->qemu_path);
  return -1;
}

/* ------------------------------------------------------------ init / fini */

static int
read_config(qemu_t *q, const config_setting_t *c, eph_error_t *err)
{
  const eph_host_t *h = q->host;
  qemu_cfg_t *k = &q->cfg;
  const char *image_dir;
  int r;
  if ((r = h->cfg_string(c, "qemu", "qemu-system-x86_64", &k->qemu, err)) < 0 ||
      (r = h->cfg_string(c, "image_dir", "", &image_dir, err)) < 0 ||
      (r = h->cfg_string(c, "accel", "auto", &k->accel, err)) < 0 ||
      (r = h->cfg_int(c, "kvm_probe_ms", 5000, &k->kvm_probe_ms, err)) < 0 ||
      (r = h->cfg_int(c, "memory_mib", 512, &k->memory_mib, err)) < 0 ||
      (r = h->cfg_int(c, "min_memory_mib", 256, &k->min_memory_mib, err)) < 0 ||
      (r = h->cfg_int(c, "max_memory_mib", 4096, &k->max_memory_mib, err)) < 0 ||
      (r = h->cfg_int(c, "max_vcpus", 2, &k->max_vcpus, err)) < 0 ||
      (r = h->cfg_int(c, "scratch_mib", 128, &k->scratch_mib, err)) < 0 ||
      (r = h->cfg_int(c, "max_scratch_mib", 2048, &k->max_scratch_mib, err)) < 0 ||
      (r = h->cfg_int(c, "pids", 256, &k->pids, err)) < 0 ||
      (r = h->cfg_int(c, "max_pids", 4096, &k->max_pids, err)) < 0 ||
      (r = h->cfg_bool(c, "snapshot", 1, &k->snapshot, err)) < 0 ||
      (r = h->cfg_int(c, "uid_base", 68000000, &k->uid_base, err)) < 0 ||
      (r = h->cfg_int(c, "slots", 1024, &k->slots, err)) < 0 ||
      (r = h->cfg_string(c, "append", "", &k->append, err)) < 0 ||
      (r = h->cfg_bool(c, "console_log", 0, &k->console_log, err)) < 0)
    return r;
  if (strcmp(k->accel, "auto") && strcmp(k->accel, "kvm") && strcmp(k->accel, "tcg"))
    return eph_error_set(err, EPH_E_CONFIG,
                         "backend-qemu: key 'accel': \"%s\" is none of kvm, tcg, auto",
                         k->accel);
  if (k->min_memory_mib < 128 || k->memory_mib < k->min_memory_mib ||
      k->max_memory_mib < k->memory_mib)
    return eph_error_set(err, EPH_E_CONFIG, "backend-qemu: keys 'min_memory_mib' <= "
                         "'memory_mib' <= 'max_memory_mib' (and min >= 128) do not hold");
  if (k->max_vcpus < 1 || k->max_vcpus > 64)
    return eph_error_set(err, EPH_E_CONFIG, "backend-qemu: key 'max_vcpus': 1..64");
  if (k->scratch_mib < 1 || k->max_scratch_mib < k->scratch_mib)
    return eph_error_set(err, EPH_E_CONFIG,
                         "backend-qemu: key 'scratch_mib': 1..max_scratch_mib");
  if (k->slots < 1 || k->slots > 65536)
    return eph_error_set(err, EPH_E_CONFIG, "backend-qemu: key 'slots': 1..65536");
  if (k->uid_base < 1000 || k->uid_base + k->slots > 0xfffffffe)
    return eph_error_set(err, EPH_E_CONFIG, "backend-qemu: key 'uid_base': 1000 .. "
                         "4294967294 - slots (a microVM must never run as root or a system id)");
  if (k->kvm_probe_ms < 100)
    return eph_error_set(err, EPH_E_CONFIG, "backend-qemu: key 'kvm_probe_ms': >= 100");
  if (*image_dir)
    k->image_dir = strdup(image_dir);
  else if (asprintf(&k->image_dir, "%s/guest-image", h->state_dir) < 0)
    k->image_dir = NULL;
  return k->image_dir ? 0 : eph_error_set(err, ENOMEM, "backend-qemu: out of memory");
}

static void
qemu_fini(void *state)
{
  qemu_t *q = state;
  if (!q)
    return;
  pthread_mutex_destroy(&q->lock);
  free(q->cfg.image_dir);
  free(q->base);
  free(q->run_base);
  free(q->snap_dir);
  free(q->slot_dir);
  free(q);
}

static int
qemu_init(const eph_host_t *host, const config_setting_t *config, void **state,
          eph_error_t *err)
{
  qemu_t *q = calloc(1, sizeof *q);
  if (!q)
    return eph_error_set(err, ENOMEM, "backend-qemu: out of memory");
  q->host = host;
  q->owner_start = start_time(getpid());
  pthread_mutex_init(&q->lock, NULL);
  int r = read_config(q, config, err);
  if (r < 0)
    goto fail;
  if (asprintf(&q->base, "%s/qemu", host->state_dir) < 0 ||
      asprintf(&q->run_base, "%s/qemu/run", host->state_dir) < 0 ||
      asprintf(&q->snap_dir, "%s/qemu/snapshots", host->state_dir) < 0 ||
      asprintf(&q->slot_dir, "%s/qemu/slots", host->state_dir) < 0) {
    r = eph_error_set(err, ENOMEM, "backend-qemu: out of memory");
    goto fail;
  }
  const char *dirs[] = {q->base, q->run_base, q->snap_dir, q->slot_dir};
  for (size_t i = 0; i < 4; i++)
    if (mkdir(dirs[i], 0700) < 0 && errno != EEXIST) {
      r = eph_error_set(err, errno, "backend-qemu: %s: %s", dirs[i], strerror(errno));
      goto fail;
    }
  find_in_path(q->cfg.qemu, q->qemu_path, sizeof q->qemu_path);
  /* A missing QEMU or image is reported by create(), where a run can show it; loading
   * the plugin must not fail on a host that only uses the jail. */
  q->tsc_khz = measure_tsc_khz();
  *state = q;
  return 0;
fail:
  qemu_fini(q);
  return r;
}

/* ------------------------------------------------------------ launching QEMU */

/* Builds the argument vector of one QEMU start. Strings live in `store`. */
static void
build_argv(const qemu_t *q, const launch_t *l, char **argv, size_t max, char store[][512])
{
  size_t n = 0, s = 0;
#define ARG(x) (argv[n++] = (char *)(x))
#define ARGF(...) (snprintf(store[s], 512, __VA_ARGS__), argv[n++] = store[s++])
  ARG(q->qemu_path);
  ARG("-M");
  ARG("microvm");
  ARG("-accel");
  ARG(l->accel);
  ARG("-cpu");
  ARG(strcmp(l->accel, "kvm") == 0 ? "host" : "max");
  ARG("-m");
  ARGF("%" PRIu64, l->memory_mib);
  ARG("-smp");
  ARGF("%u", l->vcpus);
  ARG("-nodefaults");
  ARG("-no-user-config");
  ARG("-nographic");
  ARG("-no-reboot"); /* a guest power-off or panic ends QEMU */
  ARG("-name");
  ARG(l->name);
  ARG("-sandbox");
  ARG("on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny");
  ARG("-kernel");
  ARGF("/proc/self/fd/%d", FD_KERNEL);
  ARG("-initrd");
  ARGF("/proc/self/fd/%d", FD_INITRD);
  /* tsc_early_khz + tsc=reliable: see measure_tsc_khz. panic=-1: reboot at once, which
   * -no-reboot turns into QEMU's exit. */
  char tsc[64] = "";
  if (strcmp(l->accel, "tcg") == 0 && q->tsc_khz > 0)
    snprintf(tsc, sizeof tsc, "tsc_early_khz=%" PRId64 " tsc=reliable ", q->tsc_khz);
  ARG("-append");
  ARGF("%s%s panic=-1 no_timer_check i8042.noaux i8042.nokbd eph_tmp_mib=%" PRIu64
       " eph_pids=%u %s%s%s", q->cfg.console_log ? "console=ttyS0 " : "quiet ", tsc, l->tmp_mib,
       l->pids, l->tap_fd >= 0 ? l->net : "", l->tap_fd >= 0 ? " " : "", q->cfg.append);
  if (q->cfg.console_log) {
    ARG("-serial");
    ARG("stdio");
  }
  /* The guest's control stream: a virtio serial port (/dev/vport0p1 inside) on our
   * socketpair. Not a virtconsole: QEMU silently drops console bytes the host socket cannot
   * take at once (virtio-console.c flush_buf, "XXX ... silently dropping console data on
   * EAGAIN"), which broke every frame past ~1 MB of output. A plain port is flow-controlled
   * both ways: QEMU throttles the port until the socket drains. Port 0 stays reserved for a
   * console, so this one is nr 1. */
  ARG("-device");
  ARG("virtio-serial-device,max_ports=2");
  ARG("-chardev");
  ARGF("socket,id=guest,fd=%d", FD_GUEST);
  ARG("-device");
  ARG("virtserialport,chardev=guest,nr=1,name=org.ephemeral.guest");
  ARG("-chardev");
  ARGF("socket,id=qmp,fd=%d", FD_QMP);
  ARG("-mon");
  ARG("chardev=qmp,mode=control");
  if (l->tap_fd >= 0) {
    /* The NIC's only peer is the tap in the proxy's netns (tap.c). */
    ARG("-netdev");
    ARGF("tap,id=n0,fd=%d", FD_TAP);
    ARG("-device");
    ARGF("virtio-net-device,netdev=n0,mac=%s", l->mac);
  }
  if (l->incoming_fd >= 0) {
    ARG("-incoming");
    ARGF("fd:%d", FD_INCOMING);
  }
  argv[n] = NULL;
  (void)max;
#undef ARG
#undef ARGF
}

/* ------------------------------------------------------------ slots */

/* Processes whose real or effective uid is `uid`; with kill_them they get SIGKILL. */
static int
uid_processes(uid_t uid, bool kill_them)
{
  DIR *d = opendir("/proc");
  if (!d)
    return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (*end || pid <= 1)
      continue;
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%ld/status", pid);
    if (!read_small(path, buf, sizeof buf))
      continue;
    const char *u = strstr(buf, "\nUid:");
    unsigned long ru, eu;
    if (!u || sscanf(u + 5, "%lu %lu", &ru, &eu) != 2 || (ru != uid && eu != uid) ||
        !alive((pid_t)pid))
      continue;
    n++;
    if (kill_them)
      kill((pid_t)pid, SIGKILL);
  }
  closedir(d);
  return n;
}

/* Claims a free slot k for the microVM `name`: its QEMU will run as uid_base + k. The slot
 * is held by <state_dir>/qemu/slots/slot-<k>, created O_EXCL, holding "NAME OWNER_PID
 * OWNER_START" so the sweep of a later start frees the slots of a dead owner. A slot whose
 * uid still runs a process (left by a crash) is skipped, never shared. */
static int
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

static void
release_slot(const qemu_t *q, int slot)
{
  if (slot < 0)
    return;
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/slot-%d", q->slot_dir, slot);
  unlink(path);
}

/* ------------------------------------------------------------ the keeper */

/* In QEMU's process, before exec: only async-signal-safe calls. */
static void __attribute__((noreturn))
child_exec(const qemu_t *q, char **argv, const int *src, int nsrc, int log_fd, int slot,
           gid_t extra_gid, const char *exec_src, pid_t keeper)
{
  static char *const no_env[] = {NULL};
  setsid();
  /* Every source first above the target range, then onto its target. */
  int moved[8];
  for (int i = 0; i < nsrc; i++)
    moved[i] = src[i] >= 0 ? fcntl(src[i], F_DUPFD, 64) : -1;
  int log_moved = fcntl(log_fd, F_DUPFD, 64);
  /* QEMU's own mount namespace, where its binary's path shows the root-only-readable copy
   * (qemu_exec_copy): exec'd as the VM's uid, QEMU starts non-dumpable, and finds its
   * modules and firmware where it always does. Fails closed. */
  if (exec_src && (unshare(CLONE_NEWNS) < 0 ||
                   mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0 ||
                   mount(exec_src, argv[0], NULL, MS_BIND, NULL) < 0)) {
    /* strerror is not async-signal-safe: the errno in digits */
    int e = errno;
    char msg[] = "backend-qemu: binding the unreadable QEMU copy failed: errno 000\n";
    msg[sizeof msg - 5] = (char)('0' + e / 100 % 10);
    msg[sizeof msg - 4] = (char)('0' + e / 10 % 10);
    msg[sizeof msg - 3] = (char)('0' + e % 10);
    (void)!write(log_fd, msg, sizeof msg - 1);
    _exit(126);
  }
  int null = open("/dev/null", O_RDONLY);
  if (null < 0 || dup2(null, 0) < 0 || dup2(log_moved, 1) < 0 || dup2(log_moved, 2) < 0)
    _exit(126);
  for (int i = 0; i < nsrc; i++)
    if (moved[i] >= 0 && dup2(moved[i], FD_GUEST + i) < 0)
      _exit(126);
  /* close_range(2) is Linux 5.9+; fall back to a loop */
  if (syscall(SYS_close_range, FD_FIRST_FREE, ~0U, 0) < 0)
    for (int fd = FD_FIRST_FREE; fd < 4096; fd++)
      close(fd);
  struct rlimit nocore = {0, 0};
  setrlimit(RLIMIT_CORE, &nocore); /* guest RAM never lands in a core file */
  if (slot >= 0) {
    uid_t id = (uid_t)(q->cfg.uid_base + slot);
    if (setgroups(extra_gid != (gid_t)-1 ? 1 : 0, &extra_gid) < 0 ||
        setresgid(id, id, id) < 0 || setresuid(id, id, id) < 0) {
      static const char msg[] = "backend-qemu: dropping privileges failed\n";
      (void)!write(2, msg, sizeof msg - 1);
      _exit(126);
    }
  }
  /* After the id change (which clears it): QEMU dies with its keeper, whatever kills it. */
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0 || getppid() != keeper)
    _exit(126);
  prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  /* No variable of ours (API keys, credential_env secrets) reaches QEMU: an empty
   * environment. */
  execve(argv[0], argv, no_env);
  static const char msg[] = "backend-qemu: exec of QEMU failed\n";
  (void)!write(2, msg, sizeof msg - 1);
  _exit(127);
}

/* The keeper: a small root process between us and QEMU (a forked copy of us, so only
 * async-signal-safe calls). It starts QEMU as its child, tells us QEMU's pid, then waits
 * for the first of: our end of the lifeline closing (destroy, or our death: the kernel
 * closes it whichever thread or process of ours dies) -> kill QEMU, reap, exit 0; QEMU
 * ending by itself -> reap, exit 1; the run's deadline -> kill QEMU, reap, exit 3. So the
 * deadline holds and QEMU goes within milliseconds even when we are SIGKILLed; and should
 * the keeper itself be killed, QEMU's PR_SET_PDEATHSIG takes QEMU along. */
enum { KEEPER_STOPPED = 0, KEEPER_QEMU_ENDED = 1, KEEPER_DEADLINE = 3, KEEPER_FAILED = 126 };

static void __attribute__((noreturn))
keeper_main(const qemu_t *q, char **argv, const int *src, int nsrc, int log_fd, int slot,
            gid_t extra_gid, const char *exec_src, int lifeline, int64_t deadline_ms)
{
  prctl(PR_SET_NAME, "eph-vm-keeper", 0, 0, 0);
  pid_t self = getpid();
  pid_t qemu = fork();
  if (qemu == 0)
    child_exec(q, argv, src, nsrc, log_fd, slot, extra_gid, exec_src, self);
  int32_t msg = qemu;
  (void)!write(lifeline, &msg, sizeof msg);
  if (qemu < 0)
    _exit(KEEPER_FAILED);
  /* Nothing of ours stays open here but the lifeline (not the guest stream, not another
   * sandbox's lifeline). */
  if (lifeline != 3 && dup2(lifeline, 3) < 0) {
    kill(qemu, SIGKILL);
    _exit(KEEPER_FAILED);
  }
  if (syscall(SYS_close_range, 4, ~0U, 0) < 0)
    for (int fd = 4; fd < 4096; fd++)
      close(fd);
  int null = open("/dev/null", O_RDWR);
  for (int fd = 0; null >= 0 && fd < 3; fd++)
    dup2(null, fd); /* not our stdout: a caller reading it to its end must not wait on us */
  if (null > 3)
    close(null);
  int pidfd = (int)syscall(SYS_pidfd_open, qemu, 0);
  int code = KEEPER_QEMU_ENDED;
  for (;;) {
    int64_t left = deadline_ms > 0 ? deadline_ms - eph_now_ms() : -1;
    if (deadline_ms > 0 && left <= 0) {
      code = KEEPER_DEADLINE;
      break;
    }
    /* Without pidfds (Linux < 5.3) QEMU's end is polled for every 100 ms. */
    int wait = left < 0 ? -1 : left > INT32_MAX ? INT32_MAX : (int)left;
    if (pidfd < 0 && (wait < 0 || wait > 100))
      wait = 100;
    struct pollfd p[2] = {{.fd = 3, .events = POLLIN}, {.fd = pidfd, .events = POLLIN}};
    int n = poll(p, pidfd >= 0 ? 2 : 1, wait);
    if (n < 0 && errno != EINTR)
      break;
    if (n > 0 && p[0].revents) {
      char c;
      if (read(3, &c, 1) <= 0) {
        code = KEEPER_STOPPED;
        break;
      }
    }
    int st;
    if ((n > 0 && pidfd >= 0 && p[1].revents) ||
        (pidfd < 0 && waitpid(qemu, &st, WNOHANG) == qemu)) {
      if (pidfd < 0)
        _exit(KEEPER_QEMU_ENDED);
      break;
    }
  }
  kill(qemu, SIGKILL);
  while (waitpid(qemu, NULL, 0) < 0 && errno == EINTR)
    ;
  _exit(code);
}

/* Starts QEMU under a keeper. On success *vm holds the keeper, QEMU's pid, the lifeline
 * and the slot; *guest_fd is the host end of the guest's stream and *qmp_fd of its monitor
 * (both owned by the caller). vm_stop() ends it all. */
static int
launch_qemu(const qemu_t *q, const launch_t *l, vmproc_t *vm, int *guest_fd, int *qmp_fd,
            eph_error_t *err)
{
  *vm = (vmproc_t){.keeper = -1, .qemu = -1, .lifeline = -1, .slot = -1};
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/vmlinuz", q->cfg.image_dir);
  cleanup_close int kfd = open(path, O_RDONLY | O_CLOEXEC);
  if (kfd < 0)
    return eph_error_set(err, errno, "guest image: %s: %s (build it with `make guest-image`)",
                         path, strerror(errno));
  snprintf(path, sizeof path, "%s/initrd.cpio", q->cfg.image_dir);
  cleanup_close int ifd = open(path, O_RDONLY | O_CLOEXEC);
  if (ifd < 0)
    return eph_error_set(err, errno, "guest image: %s: %s (build it with `make guest-image`)",
                         path, strerror(errno));
  if (access(q->qemu_path, X_OK) < 0)
    return eph_error_set(err, errno, "%s: %s (install the Debian package qemu-system-x86)",
                         q->qemu_path, strerror(errno));
  /* As root, every microVM gets its own uid/gid from a slot; unprivileged (tests without
   * root), QEMU keeps ours. */
  int slot = -1;
  if (geteuid() == 0 && (slot = claim_slot(q, l->name, err)) < 0)
    return slot;
  int gp[2] = {-1, -1}, mp[2] = {-1, -1}, lp[2] = {-1, -1};
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, gp) < 0 ||
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, mp) < 0 ||
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, lp) < 0) {
    int e = errno;
    for (int i = 0; i < 2; i++) {
      if (gp[i] >= 0) close(gp[i]);
      if (mp[i] >= 0) close(mp[i]);
      if (lp[i] >= 0) close(lp[i]);
    }
    release_slot(q, slot);
    return eph_error_set(err, e, "socketpair: %s", strerror(e));
  }
  char *argv[64];
  char store[16][512];
  build_argv(q, l, argv, 64, store);

  gid_t kvm_gid = (gid_t)-1;
  struct stat st;
  if (slot >= 0 && strcmp(l->accel, "kvm") == 0 && stat("/dev/kvm", &st) == 0)
    kvm_gid = st.st_gid; /* Debian's udev makes /dev/kvm root:kvm 0660 */
  int src[] = {gp[1], mp[1], kfd, ifd, l->incoming_fd, l->tap_fd};
  pid_t keeper = fork();
  if (keeper == 0) {
    close(lp[0]);
    keeper_main(q, argv, src, 6, l->log_fd, slot, kvm_gid,
                slot >= 0 && q->exec_copy[0] ? q->exec_copy : NULL, lp[1], l->deadline_ms);
  }
  int e = errno;
  close(gp[1]);
  close(mp[1]);
  close(lp[1]);
  int32_t qpid = -1;
  ssize_t n = -1;
  if (keeper > 0)
    while ((n = read(lp[0], &qpid, sizeof qpid)) < 0 && errno == EINTR)
      ;
  if (keeper < 0 || n != (ssize_t)sizeof qpid || qpid <= 0) {
    close(gp[0]);
    close(mp[0]);
    close(lp[0]);
    if (keeper > 0)
      while (waitpid(keeper, NULL, 0) < 0 && errno == EINTR)
        ;
    release_slot(q, slot);
    return keeper < 0 ? eph_error_set(err, e, "fork: %s", strerror(e))
                      : eph_error_set(err, EAGAIN, "the QEMU keeper could not start QEMU");
  }
  *vm = (vmproc_t){.keeper = keeper, .qemu = qpid, .lifeline = lp[0], .slot = slot};
  *guest_fd = gp[0];
  *qmp_fd = mp[0];
  return 0;
}

/* Ends a QEMU started by launch_qemu: closing the lifeline makes the keeper kill and reap
 * QEMU; we reap the keeper, then free the slot once no process runs as its uid. Returns the
 * keeper's verdict (KEEPER_*; KEEPER_DEADLINE when the run's deadline killed QEMU) and
 * *left the processes still running as the slot's uid (0 normally). */
static int
vm_stop(const qemu_t *q, vmproc_t *vm, int *left)
{
  int code = KEEPER_STOPPED;
  if (left)
    *left = 0;
  if (vm->lifeline >= 0)
    close(vm->lifeline);
  vm->lifeline = -1;
  if (vm->keeper > 0) {
    int st = 0;
    while (waitpid(vm->keeper, &st, 0) < 0 && errno == EINTR)
      ;
    code = WIFEXITED(st) ? WEXITSTATUS(st) : KEEPER_FAILED;
  }
  vm->keeper = vm->qemu = -1;
  if (vm->slot >= 0) {
    uid_t uid = (uid_t)(q->cfg.uid_base + vm->slot);
    int n = uid_processes(uid, true);
    if (left)
      *left = n;
    if (n == 0)
      release_slot(q, vm->slot); /* else the sweep frees it once they are gone */
  }
  vm->slot = -1;
  return code;
}

/* The last lines of QEMU's log, for an error message. */
static void
log_tail(const char *dir, char *out, size_t size)
{
  char path[PATH_MAX], buf[8192];
  snprintf(path, sizeof path, "%s/qemu.log", dir);
  out[0] = '\0';
  if (!read_small(path, buf, sizeof buf))
    return;
  size_t len = strlen(buf);
  while (len && buf[len - 1] == '\n')
    buf[--len] = '\0';
  const char *start = len > 300 ? buf + len - 300 : buf;
  snprintf(out, size, "%s", start);
  for (char *p = out; *p; p++)
    if (*p == '\n')
      *p = ' ';
}

/* ------------------------------------------------------------ the accelerator */

/* Boots the image once and reads the guest's hello before deadline_ms. */
static int
boot_and_hello(const qemu_t *q, const char *dir, const launch_t *l, vmproc_t *vm, int *guest_fd,
               qmp_t *qmp, int64_t deadline_ms, eph_error_t *err)
{
  int qfd;
  int r = launch_qemu(q, l, vm, guest_fd, &qfd, err);
  if (r < 0)
    return r;
  if ((r = qmp_open(qmp, qfd, deadline_ms, err)) < 0)
    goto fail;
  eph_frame_reader_t rd = {0};
  json_object *hello = NULL;
  while (!hello) {
    int64_t left = deadline_ms - eph_now_ms();
    if (left <= 0) {
      r = eph_error_set(err, ETIMEDOUT, "no guest hello in time");
      break;
    }
    struct pollfd p = {.fd = *guest_fd, .events = POLLIN};
    if (poll(&p, 1, (int)(left > 1000 ? 1000 : left)) <= 0)
      continue;
    r = eph_frame_reader_feed(&rd, *guest_fd, &hello);
    if (r < 0) {
      r = eph_error_set(err, EPH_E_PROTOCOL, "guest stream: %s",
                        rd.why[0] ? rd.why : strerror(-r));
      break;
    }
  }
  eph_frame_reader_clear(&rd);
  if (hello) {
    const char *type = eph_proto_str(hello, "type");
    r = type && strcmp(type, "hello") == 0
            ? 0
            : eph_error_set(err, EPH_E_PROTOCOL, "guest: first frame is '%s', not hello",
                            type ? type : "?");
    json_object_put(hello);
  }
  if (r == 0)
    return 0;
fail:;
  char tail[400];
  log_tail(dir, tail, sizeof tail);
  if (tail[0])
    eph_error_wrap(err, "QEMU log: %s", tail);
  qmp_close(qmp);
  close(*guest_fd);
  *guest_fd = -1;
  vm_stop(q, vm, NULL);
  return r;
}

static int make_run_dir(const qemu_t *q, const char *run_id, char *dir, size_t size,
                        int *log_fd, eph_error_t *err);
static int write_pid_record(const char *dir, const qemu_t *q, pid_t qemu_pid, eph_error_t *err);

/* The accelerator to use: the configured one, or for auto the cached verdict of a bounded
 * test boot under KVM. */
static const char *
resolve_accel(qemu_t *q, const launch_t *base)
{
  if (strcmp(q->cfg.accel, "auto") != 0)
    return q->cfg.accel;
  pthread_mutex_lock(&q->lock);
  if (q->accel[0])
    goto out;
  char path[PATH_MAX], buf[256], sha[128] = "";
  snprintf(path, sizeof path, "%s/image.sha256", q->cfg.image_dir);
  char shabuf[1024];
  if (read_small(path, shabuf, sizeof shabuf))
    snprintf(sha, sizeof sha, "%.64s", shabuf);
  snprintf(path, sizeof path, "%s/accel", q->base);
  char want[256];
  if (read_small(path, buf, sizeof buf) && sscanf(buf, "%7s %255s", q->accel, want) == 2 &&
      strcmp(want, sha[0] ? sha : "-") == 0 &&
      (!strcmp(q->accel, "kvm") || !strcmp(q->accel, "tcg")))
    goto out;
  snprintf(q->accel, sizeof q->accel, "tcg");
  int kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC);
  if (kvm >= 0) {
    close(kvm);
    eph_error_t err = {0};
    char dir[PATH_MAX];
    int log_fd = -1;
    char id[64];
    snprintf(id, sizeof id, "kvm-probe-%d", (int)getpid());
    if (make_run_dir(q, id, dir, sizeof dir, &log_fd, &err) == 0) {
      char name[96];
      snprintf(name, sizeof name, "ephemeral-%s", id);
      launch_t l = *base;
      l.name = name;
      l.accel = "kvm";
      l.incoming_fd = -1;
      l.tap_fd = -1;
      l.log_fd = log_fd;
      int64_t t0 = eph_now_ms();
      l.deadline_ms = t0 + q->cfg.kvm_probe_ms;
      vmproc_t vm;
      int gfd = -1;
      qmp_t qmp = {.fd = -1};
      if (boot_and_hello(q, dir, &l, &vm, &gfd, &qmp, l.deadline_ms, &err) == 0) {
        snprintf(q->accel, sizeof q->accel, "kvm");
        qmp_close(&qmp);
        close(gfd);
        vm_stop(q, &vm, NULL);
      }
      q->host->log(EPH_LOG_INFO, "KVM test boot %s after %" PRId64 " ms%s%s: using %s",
                   strcmp(q->accel, "kvm") ? "failed" : "succeeded", eph_now_ms() - t0,
                   err.message[0] ? ": " : "", err.message, q->accel);
      close(log_fd);
      rm_tree(dir);
    }
  }
  snprintf(buf, sizeof buf, "%s %s\n", q->accel, sha[0] ? sha : "-");
  eph_error_t werr = {0};
  if (write_file(path, buf, &werr) < 0)
    q->host->log(EPH_LOG_WARN, "%s", werr.message);
out:
  pthread_mutex_unlock(&q->lock);
  return q->accel;
}

/* ------------------------------------------------------------ run directories */

static int
make_run_dir(const qemu_t *q, const char *run_id, char *dir, size_t size, int *log_fd,
             eph_error_t *err)
{
  for (const char *p = run_id; *p; p++)
    if (!(*p == '_' || *p == '-' || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
          (*p >= 'A' && *p <= 'Z')))
      return eph_error_set(err, EINVAL, "run id '%s': only [A-Za-z0-9_-] allowed", run_id);
  snprintf(dir, size, "%s/%s", q->run_base, run_id);
  if (mkdir(dir, 0700) < 0)
    return eph_error_set(err, errno, "%s: %s", dir, strerror(errno));
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/qemu.log", dir);
  *log_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
  if (*log_fd < 0) {
    int e = errno;
    rm_tree(dir);
    return eph_error_set(err, e, "%s: %s", path, strerror(e));
  }
  return 0;
}

/* "QEMU_PID OWNER_PID OWNER_START": the sweep kills QEMU when the owner is gone. */
static int
write_pid_record(const char *dir, const qemu_t *q, pid_t qemu_pid, eph_error_t *err)
{
  char path[PATH_MAX + 8], text[128];
  snprintf(path, sizeof path, "%s/pid", dir);
  snprintf(text, sizeof text, "%d %d %llu\n", (int)qemu_pid, (int)getpid(), q->owner_start);
  return write_file(path, text, err);
}

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

static void
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
static int
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

/* The frame that gives a restored guest its own identity: fresh entropy for the kernel's
 * pool (every restored copy starts with the same CRNG state), the wall clock (frozen at
 * the save) and a new scratch directory; the guest answers with a new hello. */
static int
send_reseed(int guest_fd, eph_error_t *err)
{
  unsigned char seed[64];
  if (getrandom(seed, sizeof seed, 0) != (ssize_t)sizeof seed)
    return eph_error_set(err, errno, "getrandom: %s", strerror(errno));
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  json_object *o = json_object_new_object();
  json_object_object_add(o, "type", json_object_new_string("reseed"));
  json_object_object_add(o, "id", json_object_new_int(0));
  eph_proto_add_b64(o, "entropy", seed, sizeof seed);
  json_object_object_add(o, "realtime_ns",
                         json_object_new_int64((int64_t)now.tv_sec * 1000000000LL + now.tv_nsec));
  int r = eph_proto_write_frame(guest_fd, o);
  json_object_put(o);
  explicit_bzero(seed, sizeof seed);
  return r < 0 ? eph_error_set(err, -r, "sending the reseed frame: %s", strerror(-r)) : 0;
}

static void
sandbox_free(eph_sandbox_t *s)
{
  qmp_close(&s->qmp);
  if (s->proxy_ns_fd >= 0)
    close(s->proxy_ns_fd);
  free(s);
}

/* ------------------------------------------------------------ create / destroy */

/* A run granting web: a virtio-net NIC whose host side is a tap in the proxy's netns
 * (tap.c), and the guest's address on the kernel command line. On success l->tap_fd is the
 * tap (the caller closes its copy once QEMU has it), s->tap its name and s->proxy_ns_fd a
 * dup of the proxy's netns, kept to check at destroy that the tap went with QEMU. */
static int
add_network(const eph_sandbox_spec_t *spec, eph_sandbox_t *s, launch_t *l, eph_error_t *err)
{
  if (!spec->network)
    return 0;
  if (spec->struct_size < offsetof(eph_sandbox_spec_t, proxy_netns_fd) + sizeof(int))
    return eph_error_set(err, ENOTSUP, "backend-qemu: network=1 from a core without "
                         "proxy_netns_fd: refused");
  uint32_t proxy;
  int fd = qemu_tap_open(spec->proxy_netns_fd, spec->proxy_url, &proxy, s->tap, err);
  if (fd < 0)
    return eph_error_wrap(err, "the microVM's NIC");
  s->proxy_ns_fd = fcntl(spec->proxy_netns_fd, F_DUPFD_CLOEXEC, 0);
  unsigned char m[3];
  if (s->proxy_ns_fd < 0 || getrandom(m, sizeof m, 0) != (ssize_t)sizeof m) {
    int e = errno;
    close(fd);
    s->tap[0] = '\0';
    return eph_error_set(err, e, "backend-qemu: the microVM's NIC: %s", strerror(e));
  }
  struct in_addr p = {htonl(proxy)}, g = {htonl(proxy + 1)};
  char ps[INET_ADDRSTRLEN], gs[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &p, ps, sizeof ps);
  inet_ntop(AF_INET, &g, gs, sizeof gs);
  snprintf(l->net, sizeof l->net, "eph_net=%s/32,%s", gs, ps);
  /* 02: locally administered, unicast */
  snprintf(l->mac, sizeof l->mac, "02:eb:00:%02x:%02x:%02x", m[0], m[1], m[2]);
  l->tap_fd = fd;
  return 0;
}

static int
qemu_create(void *state, const eph_sandbox_spec_t *spec, eph_sandbox_t **out, int *guest_fd,
            eph_error_t *err)
{
  qemu_t *q = state;
  const qemu_cfg_t *k = &q->cfg;
  int64_t t0 = eph_now_ms();
  *out = NULL;
  *guest_fd = -1;
  int r;
  uint64_t mem = spec->limits.memory_bytes ? spec->limits.memory_bytes / MIB
                                           : (uint64_t)k->memory_mib;
  if (mem > (uint64_t)k->max_memory_mib)
    return eph_error_set(err, EINVAL, "memory %" PRIu64 " MiB is above max_memory_mib %" PRId64,
                         mem, k->max_memory_mib);
  if (mem < (uint64_t)k->min_memory_mib)
    mem = (uint64_t)k->min_memory_mib;
  uint64_t tmp = spec->limits.scratch_bytes ? (spec->limits.scratch_bytes + MIB - 1) / MIB
                                            : (uint64_t)k->scratch_mib;
  if (tmp > (uint64_t)k->max_scratch_mib)
    return eph_error_set(err, EINVAL, "scratch %" PRIu64 " MiB is above max_scratch_mib %" PRId64,
                         tmp, k->max_scratch_mib);
  uint64_t pids = spec->limits.pids ? spec->limits.pids : (uint64_t)k->pids;
  if (pids > (uint64_t)k->max_pids)
    return eph_error_set(err, EINVAL, "pids %" PRIu64 " is above max_pids %" PRId64, pids,
                         k->max_pids);
  unsigned vcpus = spec->limits.cpu_percent ? (spec->limits.cpu_percent + 99) / 100 : 1;
  if (vcpus > (unsigned)k->max_vcpus)
    vcpus = (unsigned)k->max_vcpus;
  /* Boots wait at most until the run's deadline (or 5 min without one). */
  int64_t deadline = spec->deadline_ms > 0 ? spec->deadline_ms : t0 + 300000;

  eph_sandbox_t *s = calloc(1, sizeof *s);
  if (!s)
    return eph_error_set(err, ENOMEM, "out of memory");
  s->qmp.fd = -1;
  s->vm = (vmproc_t){.keeper = -1, .qemu = -1, .lifeline = -1, .slot = -1};
  s->proxy_ns_fd = -1;
  s->created_ms = t0;
  s->deadline_ms = spec->deadline_ms;
  snprintf(s->run_id, sizeof s->run_id, "%s", spec->run_id ? spec->run_id : "");

  char name[128];
  snprintf(name, sizeof name, "ephemeral-%s", s->run_id);
  launch_t l = {.name = name, .memory_mib = mem, .vcpus = vcpus, .tmp_mib = tmp,
                .pids = (unsigned)pids, .deadline_ms = spec->deadline_ms,
                .incoming_fd = -1, .log_fd = -1, .tap_fd = -1};
  pthread_mutex_lock(&q->lock);
  if (!q->exec_checked && geteuid() == 0 && qemu_exec_copy(q) == 0)
    snprintf(q->exec_copy, sizeof q->exec_copy, "%s/bin/qemu", q->base);
  q->exec_checked = true;
  pthread_mutex_unlock(&q->lock);
  l.accel = "tcg";
  l.accel = resolve_accel(q, &l);
  if ((r = add_network(spec, s, &l, err)) < 0) {
    sandbox_free(s);
    return r;
  }

  int log_fd = -1, gfd = -1, qfd = -1, snap_fd = -1;
  if ((r = make_run_dir(q, s->run_id, s->dir, sizeof s->dir, &log_fd, err)) < 0) {
    if (l.tap_fd >= 0)
      close(l.tap_fd);
    sandbox_free(s);
    return r;
  }
  l.log_fd = log_fd;
  /* A snapshot was saved without a NIC and cannot be restored with one: web runs boot. */
  if (k->snapshot && l.tap_fd < 0) {
    char snap[PATH_MAX];
    snapshot_path(q, &l, snap, sizeof snap);
    eph_error_t serr = {0};
    if (ensure_snapshot(q, &l, snap, deadline, &serr) < 0) {
      if (eph_now_ms() >= deadline) {
        r = eph_error_set(err, ETIMEDOUT, "the guest sent no hello before the run deadline "
                          "(while saving its snapshot): %s", serr.message);
        goto fail;
      }
      q->host->log(EPH_LOG_WARN, "snapshot unavailable, cold boot: %s", serr.message);
    }
    else if ((snap_fd = open(snap, O_RDONLY | O_CLOEXEC)) < 0)
      q->host->log(EPH_LOG_WARN, "%s: %s; cold boot", snap, strerror(errno));
    l.incoming_fd = snap_fd;
  }
  r = launch_qemu(q, &l, &s->vm, &gfd, &qfd, err);
  if (snap_fd >= 0)
    close(snap_fd);
  if (l.tap_fd >= 0)
    close(l.tap_fd); /* QEMU holds the tap now; it goes when QEMU does */
  close(log_fd);
  log_fd = -1;
  if (r < 0)
    goto fail;
  s->restored = l.incoming_fd >= 0;
  if ((r = write_pid_record(s->dir, q, s->vm.qemu, err)) < 0)
    goto fail;
  int64_t qdl = deadline < eph_now_ms() + QMP_TIMEOUT_MS ? deadline : eph_now_ms() + QMP_TIMEOUT_MS;
  if ((r = qmp_open(&s->qmp, qfd, qdl, err)) < 0) {
    qfd = -1;
    goto fail;
  }
  qfd = -1;
  if (s->restored) {
    static const char *const loading[] = {"inmigrate", "restore-vm", NULL};
    char st[32];
    if ((r = send_reseed(gfd, err)) < 0 ||
        (r = qmp_wait_status(&s->qmp, loading, deadline, st, sizeof st, err)) < 0)
      goto fail;
    if (strcmp(st, "running") != 0 &&
        (r = qmp_exec(&s->qmp, "cont", NULL, -1, deadline, NULL, err)) < 0)
      goto fail;
  }
  q->host->log(EPH_LOG_DEBUG, "%s: QEMU %d (uid %lld) started (%s, %s, %" PRIu64 " MiB, %u vCPU) "
               "in %" PRId64 " ms", s->run_id, (int)s->vm.qemu,
               s->vm.slot >= 0 ? (long long)(q->cfg.uid_base + s->vm.slot) : (long long)getuid(),
               l.accel, s->restored ? "restored" : "cold boot",
               mem, vcpus, eph_now_ms() - t0);
  *out = s;
  *guest_fd = gfd;
  return 0;
fail:;
  char tail[400];
  log_tail(s->dir, tail, sizeof tail);
  if (tail[0])
    eph_error_wrap(err, "QEMU log: %s", tail);
  if (log_fd >= 0)
    close(log_fd);
  if (qfd >= 0)
    close(qfd);
  if (gfd >= 0)
    close(gfd);
  vm_stop(q, &s->vm, NULL);
  rm_tree(s->dir);
  sandbox_free(s);
  return r;
}

static int
qemu_stats(void *state, eph_sandbox_t *s, eph_sandbox_report_t *out, eph_error_t *err)
{
  (void)state;
  char path[64], buf[4096];
  snprintf(path, sizeof path, "/proc/%d/status", (int)s->vm.qemu);
  out->lifetime_ms = eph_now_ms() - s->created_ms;
  if (!read_small(path, buf, sizeof buf))
    return 0;
  const char *hwm = strstr(buf, "VmHWM:");
  unsigned long long kb;
  if (hwm && sscanf(hwm, "VmHWM: %llu", &kb) == 1)
    out->memory_peak_bytes = kb * 1024ULL;
  return 0;
}

static int
qemu_destroy(void *state, eph_sandbox_t *s, eph_sandbox_report_t *report, eph_error_t *err)
{
  qemu_t *q = state;
  if (!s)
    return 0;
  eph_sandbox_report_t local = {.struct_size = sizeof local};
  eph_sandbox_report_t *rep = report ? report : &local;
  qemu_stats(state, s, rep, NULL);
  /* QEMU is the keeper's child: when vm_stop has reaped the keeper, the keeper has reaped
   * QEMU, so no pid of ours can have been reused. */
  int uid_left = 0;
  /* Past the deadline the keeper kills QEMU, unless our own give-up at that same instant
   * closed the lifeline first: either way the deadline ended the microVM. */
  bool deadline_hit = vm_stop(q, &s->vm, &uid_left) == KEEPER_DEADLINE ||
                      (s->deadline_ms > 0 && eph_now_ms() >= s->deadline_ms);
  char name[128];
  snprintf(name, sizeof name, "ephemeral-%s", s->run_id);
  int rm = rm_tree(s->dir);
  rep->processes_left = uid_left + count_named(name, false);
  rep->files_left = count_files(s->dir);
  /* The tap is not persistent: QEMU's exit closed its last fd and removed it. */
  bool tap_left = qemu_tap_exists(s->proxy_ns_fd, s->tap);
  rep->files_left += tap_left;
  char dir[PATH_MAX], tap[IFNAMSIZ + 40] = "";
  snprintf(dir, sizeof dir, "%s", s->dir);
  if (tap_left)
    snprintf(tap, sizeof tap, " (the tap %s is still there)", s->tap);
  sandbox_free(s);
  if (rep->processes_left || rep->files_left)
    return eph_error_set(err, EBUSY, "%d QEMU process(es) and %d file(s) under %s left%s%s",
                         rep->processes_left, rep->files_left, dir,
                         rm < 0 ? " (removal failed)" : "", tap);
  if (deadline_hit)
    q->host->log(EPH_LOG_WARN, "%s: the microVM was killed at the run deadline", name);
  return 0;
}

/* Reaps what a dead owner left: run directories whose owner (pid + start time) is gone,
 * their QEMU (recognised by `-name ephemeral-<run_id>`), and orphaned QEMUs carrying such a
 * name whose directory is gone already. */
static int
qemu_sweep(void *state, eph_error_t *err)
{
  qemu_t *q = state;
  DIR *d = opendir(q->run_base);
  if (!d)
    return errno == ENOENT ? 0 : eph_error_set(err, errno, "%s: %s", q->run_base,
                                               strerror(errno));
  int reaped = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.')
      continue;
    char dir[PATH_MAX], path[PATH_MAX + 8], buf[256];
    snprintf(dir, sizeof dir, "%s/%s", q->run_base, e->d_name);
    snprintf(path, sizeof path, "%s/pid", dir);
    int qpid = 0, owner = 0;
    unsigned long long ostart = 0;
    if (read_small(path, buf, sizeof buf))
      sscanf(buf, "%d %d %llu", &qpid, &owner, &ostart);
    if (owner > 0 && start_time(owner) == ostart && ostart != 0)
      continue; /* its owner lives: not ours to touch */
    if (owner == 0) {
      /* No record yet: a create in progress, unless the directory is old. */
      struct stat st;
      if (stat(dir, &st) == 0 && time(NULL) - st.st_mtime < 60)
        continue;
    }
    char name[300];
    snprintf(name, sizeof name, "ephemeral-%s", e->d_name);
    if (qpid > 1 && cmdline_has(qpid, name))
      kill(qpid, SIGKILL);
    count_named(name, true);
    rm_tree(dir);
    reaped++;
  }
  closedir(d);
  /* Orphans (re-parented to init) named like ours whose directory is gone. */
  DIR *p = opendir("/proc");
  while (p && (e = readdir(p))) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (*end || pid <= 1)
      continue;
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    if (!read_small(path, buf, sizeof buf))
      continue;
    char *rp = strrchr(buf, ')');
    int ppid = 0;
    if (!rp || sscanf(rp + 2, "%*c %d", &ppid) != 1 || ppid != 1)
      continue;
    snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
    char cmd[8192];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      continue;
    ssize_t n = read(fd, cmd, sizeof cmd - 1);
    close(fd);
    if (n <= 0)
      continue;
    cmd[n] = '\0';
    for (char *a = cmd; a < cmd + n; a += strlen(a) + 1) {
      if (strcmp(a, "-name") != 0 || a + strlen(a) + 1 >= cmd + n)
        continue;
      const char *v = a + strlen(a) + 1;
      if (strncmp(v, "ephemeral-", 10) != 0)
        break;
      char dir[PATH_MAX];
      snprintf(dir, sizeof dir, "%s/%s", q->run_base, v + 10);
      if (access(dir, F_OK) != 0) {
        kill((pid_t)pid, SIGKILL);
        reaped++;
      }
      break;
    }
  }
  if (p)
    closedir(p);
  /* Slot records of dead owners: whatever still runs as the slot's uid is killed, then the
   * slot is free again. A record being written (no owner yet) is left alone for a minute. */
  DIR *sd = opendir(q->slot_dir);
  while (sd && (e = readdir(sd))) {
    int slot;
    char tail;
    if (sscanf(e->d_name, "slot-%d%c", &slot, &tail) != 1 || slot < 0 || slot >= q->cfg.slots)
      continue;
    char path[PATH_MAX], buf[512];
    snprintf(path, sizeof path, "%s/%s", q->slot_dir, e->d_name);
    int owner = 0;
    unsigned long long ostart = 0;
    if (read_small(path, buf, sizeof buf))
      sscanf(buf, "%*s %d %llu", &owner, &ostart);
    if (owner > 0 && ostart != 0 && start_time(owner) == ostart)
      continue;
    struct stat st;
    if (owner == 0 && stat(path, &st) == 0 && time(NULL) - st.st_mtime < 60)
      continue;
    if (uid_processes((uid_t)(q->cfg.uid_base + slot), true) == 0)
      unlink(path); /* else the next sweep, once they are gone */
    reaped++;
  }
  if (sd)
    closedir(sd);
  if (reaped)
    q->host->log(EPH_LOG_INFO, "sweep: reaped %d leaked microVM(s)", reaped);
  return reaped;
}

static const eph_backend_ops_t qemu_ops = {
  .struct_size = sizeof(eph_backend_ops_t),
  .source = "MicroVM",
  .noun = "microVM",
  .create = qemu_create,
  .stats = qemu_stats,
  .destroy = qemu_destroy,
  .sweep = qemu_sweep,
};

EPH_PLUGIN_EXPORT = {
  .abi_major = EPH_ABI_MAJOR,
  .abi_minor = EPH_ABI_MINOR,
  .struct_size = sizeof(eph_plugin_t),
  .name = "backend-qemu",
  .kind = EPH_KIND_BACKEND,
  .version = "0.1.0",
  .description = "QEMU microVM sandboxes (virtio-mmio, TCG or KVM, snapshot restore)",
  .config_keys = qemu_keys,
  .init = qemu_init,
  .fini = qemu_fini,
  .ops = &qemu_ops,
};
