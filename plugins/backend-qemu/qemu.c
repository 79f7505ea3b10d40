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
 *      of its NIC, made in a network namespace of its own with the proxy's listener (tap.c),
 *      inherited as well (no snapshot then:
 *      one saved without a NIC cannot be restored with one);
 *   4. holding CAP_SETUID and CAP_SETGID (ids.c; root or the packaged unit's user), a slot
 *      (slot-<k> record in <state_dir>/qemu/slots): QEMU runs as uid/gid uid_base + k,
 *      which no other microVM shares; fork the keeper (keeper_main, a small process of
 *      ours that owns QEMU: it kills QEMU at the run's deadline or the moment we die, even
 *      by SIGKILL); the keeper forks QEMU: new session, a user namespace of its own whose
 *      maps the keeper writes (the slot's ids onto themselves only), a mount namespace in
 *      it where QEMU's path is a copy QEMU's uid cannot read (so QEMU is non-dumpable),
 *      fds placed, supplementary groups dropped, setresgid/setresuid to the slot's ids,
 *      every capability dropped, PR_SET_PDEATHSIG(SIGKILL) towards the keeper,
 *      no_new_privs, RLIMIT_CORE 0, exec with an empty environment and
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

#include <netlink/netlink.h>

#include "guest/protocol.h"
#include "qemu.h"

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
    {"snapshot_max_bytes", EPH_CFG_INT, "1073741824", "bytes",
     "Most disk space the saved snapshots may take (~200 MB each): after a save, the least "
     "recently used ones are removed until they fit, never one a sandbox is starting from. "
     "`ephemeral snapshots list|prune` shows and trims them by hand."},
    {"tsc_khz", EPH_CFG_INT, "0", "kHz",
     "The host's TSC rate a cold-booting TCG guest is told (its own calibration against the "
     "emulated timer fails now and then on a busy host); 0 = measured once (~20 ms) at the "
     "first cold boot. Never part of a snapshot's identity."},
    {"uid_base", EPH_CFG_INT, "68000000", NULL,
     "When ephemeral holds CAP_SETUID and CAP_SETGID (root, or the packaged unit's user), the "
     "QEMU of the microVM in slot k runs as uid and gid uid_base + k, ids owning nothing: two "
     "microVMs never share one, so neither can read the other's /proc files, ptrace it or "
     "signal it, nor reach our files. The range must not meet a host user or the jail's "
     "(backend-jail uid_base + slots*65536; the defaults end at 67208864)."},
    {"slots", EPH_CFG_INT, "1024", NULL,
     "How many microVMs (and their ids) may exist at once; slot records live in "
     "<state_dir>/qemu/slots."},
    {"append", EPH_CFG_STRING, "\"\"", NULL,
     "Extra kernel command line. eph_init=PATH replaces the guest (tests use a bogus one)."},
    {"pool", EPH_CFG_INT, "1", NULL,
     "Restored microVMs kept loaded and paused for the next runs (ephemerald: a run then "
     "skips QEMU's start and the snapshot's load). Each has its own slot, keeper and "
     "directory, serves one run only and is killed with it; all are killed when the process "
     "ends. Filled from the second restore of a process on, for the limits last asked; "
     "each holds ~200 MB. A CLI command (one sandbox) never starts one. 0 = none.",
     EPH_CFG_RANGE(0, 16)},
    {"console_log", EPH_CFG_BOOL, "false", NULL,
     "Keep the guest kernel's console in the sandbox's qemu.log (debugging; slower boots)."},
    {0},
};

struct eph_sandbox {
  char run_id[96];
  char dir[PATH_MAX];
  vmproc_t vm;
  qmp_t qmp;
  int64_t created_ms, deadline_ms; /* deadline_ms: the run's (0 = none) */
  bool restored;
  char qemu_name[128]; /* QEMU's -name: ephemeral-<run_id>, or the pooled one it was */
  struct nl_sock *nl;  /* a netlink socket of the NIC's namespace when it has one, else NULL */
  char tap[IFNAMSIZ];  /* the NIC's tap in that namespace ("" without one) */
};

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
      (r = h->cfg_int(c, "snapshot_max_bytes", 1073741824, &k->snapshot_max_bytes, err)) < 0 ||
      (r = h->cfg_int(c, "tsc_khz", 0, &k->tsc_khz, err)) < 0 ||
      (r = h->cfg_int(c, "uid_base", 68000000, &k->uid_base, err)) < 0 ||
      (r = h->cfg_int(c, "slots", 1024, &k->slots, err)) < 0 ||
      (r = h->cfg_string(c, "append", "", &k->append, err)) < 0 ||
      (r = h->cfg_bool(c, "console_log", 0, &k->console_log, err)) < 0 ||
      (r = h->cfg_int(c, "pool", 1, &k->pool, err)) < 0)
    return r;
  if (strcmp(k->accel, "auto") && strcmp(k->accel, "kvm") && strcmp(k->accel, "tcg"))
    return eph_error_set(err, EPH_E_CONFIG,
                         "backend-qemu: key 'accel': \"%s\" is none of kvm, tcg, auto", k->accel);
  if (k->min_memory_mib < 128 || k->memory_mib < k->min_memory_mib ||
      k->max_memory_mib < k->memory_mib)
    return eph_error_set(err, EPH_E_CONFIG,
                         "backend-qemu: keys 'min_memory_mib' <= "
                         "'memory_mib' <= 'max_memory_mib' (and min >= 128) do not hold");
  if (k->max_vcpus < 1 || k->max_vcpus > 64)
    return eph_error_set(err, EPH_E_CONFIG, "backend-qemu: key 'max_vcpus': 1..64");
  if (k->scratch_mib < 1 || k->max_scratch_mib < k->scratch_mib)
    return eph_error_set(err, EPH_E_CONFIG, "backend-qemu: key 'scratch_mib': 1..max_scratch_mib");
  if (k->slots < 1 || k->slots > 65536)
    return eph_error_set(err, EPH_E_CONFIG, "backend-qemu: key 'slots': 1..65536");
  if (k->uid_base < 1000 || k->uid_base + k->slots > 0xfffffffe)
    return eph_error_set(err, EPH_E_CONFIG,
                         "backend-qemu: key 'uid_base': 1000 .. "
                         "4294967294 - slots (a microVM must never run as root or a system id)");
  if (k->snapshot_max_bytes < 0)
    return eph_error_set(err, EPH_E_CONFIG, "backend-qemu: key 'snapshot_max_bytes': >= 0");
  if (k->tsc_khz < 0 || k->tsc_khz > 100000000)
    return eph_error_set(err, EPH_E_CONFIG, "backend-qemu: key 'tsc_khz': 0..100000000");
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
  pool_fini(q);
  pthread_mutex_destroy(&q->pool_lock);
  pthread_cond_destroy(&q->pool_cond);
  pthread_mutex_destroy(&q->lock);
  free(q->cfg.image_dir);
  free(q->base);
  free(q->run_base);
  free(q->snap_dir);
  free(q->slot_dir);
  free(q);
}

static int
qemu_init(const eph_host_t *host, const config_setting_t *config, void **state, eph_error_t *err)
{
  qemu_t *q = calloc(1, sizeof *q);
  if (!q)
    return eph_error_set(err, ENOMEM, "backend-qemu: out of memory");
  q->host = host;
  q->owner_start = start_time(getpid());
  pthread_mutex_init(&q->lock, NULL);
  pthread_mutex_init(&q->pool_lock, NULL);
  pthread_cond_init(&q->pool_cond, NULL);
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
   * the plugin must not fail on a host that only uses the jail, nor cost it time: nothing
   * is measured here (the TSC rate only at the first cold boot, qemu_tsc_khz). */
  q->tsc_khz = -1;
  *state = q;
  return 0;
fail:
  qemu_fini(q);
  return r;
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
  nl_socket_free(s->nl);
  free(s);
}

/* ------------------------------------------------------------ create / destroy */

/* CPU time (user + system, all threads) pid used so far, in ms; -1 if unknown. Under load
 * it tells the work a phase took apart from the waiting. */
static int64_t
cpu_ms(pid_t pid)
{
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  if (!read_small(path, buf, sizeof buf))
    return -1;
  char *p = strrchr(buf, ')');
  unsigned long long ut, st;
  /* after ")": state(3) ... utime(14) stime(15) */
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
    return -1;
  long hz = sysconf(_SC_CLK_TCK);
  return hz > 0 ? (int64_t)((ut + st) * 1000ULL / (unsigned long long)hz) : -1;
}

/* A run granting web: a virtio-net NIC whose host side is a tap in a namespace of its own
 * with the proxy's listener (tap.c), and the guest's address on the kernel command line. On
 * success l->tap_fd is the tap (the caller closes its copy once QEMU has it), s->tap its
 * name and s->nl a netlink socket of its namespace, kept to check at destroy that the tap
 * went with QEMU. */
static int
add_network(const eph_sandbox_spec_t *spec, eph_sandbox_t *s, launch_t *l, eph_error_t *err)
{
  if (!spec->network)
    return 0;
  uint32_t proxy;
  int fd = qemu_tap_open(spec, &proxy, s->tap, &s->nl, err);
  if (fd < 0)
    return eph_error_wrap(err, "the microVM's NIC");
  unsigned char m[3];
  if (getrandom(m, sizeof m, 0) != (ssize_t)sizeof m) {
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

/* Makes the pooled microVM pv the sandbox s (pv is consumed): its directory becomes the
 * run's, its keeper learns the run's deadline. On failure pv's QEMU is ended. */
static int
adopt_pooled(qemu_t *q, eph_sandbox_t *s, pool_vm_t *pv, int64_t deadline_ms, int *gfd,
             eph_error_t *err)
{
  int r = 0;
  snprintf(s->dir, sizeof s->dir, "%s/%s", q->run_base, s->run_id);
  if (strspn(s->run_id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") !=
          strlen(s->run_id) ||
      !s->run_id[0])
    r = eph_error_set(err, EINVAL, "run id '%s': only [A-Za-z0-9_-] allowed", s->run_id);
  else if (rename(pv->dir, s->dir) < 0)
    r = eph_error_set(err, errno, "%s -> %s: %s", pv->dir, s->dir, strerror(errno));
  else if (deadline_ms > 0)
    r = vm_set_deadline(&pv->vm, deadline_ms, err);
  if (r < 0 && strcmp(pv->dir, s->dir) != 0 && access(s->dir, F_OK) == 0)
    snprintf(pv->dir, sizeof pv->dir, "%s", s->dir); /* renamed: removed from there */
  if (r < 0) {
    qmp_close(&pv->qmp);
    close(pv->guest_fd);
    vm_stop(q, &pv->vm, NULL);
    rm_tree(pv->dir);
    free(pv);
    s->dir[0] = '\0';
    return r;
  }
  s->vm = pv->vm;
  s->qmp = pv->qmp;
  s->restored = true;
  snprintf(s->qemu_name, sizeof s->qemu_name, "%s", pv->name);
  *gfd = pv->guest_fd;
  free(pv);
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
  uint64_t mem =
      spec->limits.memory_bytes ? spec->limits.memory_bytes / MIB : (uint64_t)k->memory_mib;
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
  s->created_ms = t0;
  s->deadline_ms = spec->deadline_ms;
  snprintf(s->run_id, sizeof s->run_id, "%s", spec->run_id ? spec->run_id : "");

  char name[128];
  snprintf(name, sizeof name, "ephemeral-%s", s->run_id);
  launch_t l = {.name = name,
                .memory_mib = mem,
                .vcpus = vcpus,
                .tmp_mib = tmp,
                .pids = (unsigned)pids,
                .deadline_ms = spec->deadline_ms,
                .incoming_fd = -1,
                .log_fd = -1,
                .tap_fd = -1};
  pthread_mutex_lock(&q->lock);
  if (!q->exec_checked && qemu_ids_mode(q) == QEMU_IDS_OWN && qemu_exec_copy(q) == 0)
    snprintf(q->exec_copy, sizeof q->exec_copy, "%s/bin/qemu", q->base);
  q->exec_checked = true;
  pthread_mutex_unlock(&q->lock);
  /* The image first, opened once for every QEMU this create starts (the KVM test boot, the
   * snapshot's cold boot, the run's): one that cannot boot is one error, before a test boot
   * whose failure would say nothing about KVM and before the snapshot. */
  qemu_image_t img;
  if ((r = qemu_image_open(q, &img, err)) < 0) {
    sandbox_free(s);
    return r;
  }
  l.image = &img;
  l.accel = resolve_accel(q, &l);
  if ((r = add_network(spec, s, &l, err)) < 0) {
    qemu_image_close(&img);
    sandbox_free(s);
    return r;
  }

  int log_fd = -1, gfd = -1, qfd = -1, snap_fd = -1;
  snprintf(s->qemu_name, sizeof s->qemu_name, "%s", name);
  /* A pooled microVM (pool.c) for these limits: already started, loaded and paused. */
  pool_vm_t *pv = k->snapshot && l.tap_fd < 0 ? pool_take(q, &l) : NULL;
  if (pv && (r = adopt_pooled(q, s, pv, spec->deadline_ms, &gfd, err)) < 0) {
    qemu_image_close(&img);
    sandbox_free(s);
    return r;
  }
  int64_t t_launch = eph_now_ms();
  if (pv) {
    qemu_image_close(&img);
    goto loaded;
  }
  if ((r = make_run_dir(q, s->run_id, s->dir, sizeof s->dir, &log_fd, err)) < 0) {
    if (l.tap_fd >= 0)
      close(l.tap_fd);
    qemu_image_close(&img);
    sandbox_free(s);
    return r;
  }
  l.log_fd = log_fd;
  /* A snapshot was saved without a NIC and cannot be restored with one: web runs boot. */
  if (k->snapshot && l.tap_fd < 0) {
    eph_error_t serr = {0};
    if ((snap_fd = snapshot_open(q, &l, deadline, &serr)) < 0) {
      snap_fd = -1;
      if (eph_now_ms() >= deadline) {
        r = eph_error_set(err, ETIMEDOUT,
                          "the guest sent no hello before the run deadline "
                          "(while saving its snapshot): %s",
                          serr.message);
        goto fail;
      }
      q->host->log(EPH_LOG_WARN, "snapshot unavailable, cold boot: %s", serr.message);
    }
    l.incoming_fd = snap_fd;
  }
  if (l.incoming_fd < 0 && strcmp(l.accel, "tcg") == 0)
    l.tsc_khz = qemu_tsc_khz(q);
  t_launch = eph_now_ms();
  r = launch_qemu(q, &l, &s->vm, &gfd, &qfd, err);
  qemu_image_close(&img); /* QEMU has its own */
  if (snap_fd >= 0)
    close(snap_fd); /* QEMU shares it (and its flock) until loaded */
  if (l.tap_fd >= 0)
    close(l.tap_fd); /* QEMU holds the tap now; it goes when QEMU does */
  close(log_fd);
  log_fd = -1;
  if (r < 0)
    goto fail;
  s->restored = l.incoming_fd >= 0;
  if ((r = write_pid_record(s->dir, q, s->vm.qemu, s->qemu_name, err)) < 0)
    goto fail;
  int64_t qdl = deadline < eph_now_ms() + QMP_TIMEOUT_MS ? deadline : eph_now_ms() + QMP_TIMEOUT_MS;
  if ((r = qmp_open(&s->qmp, qfd, qdl, err)) < 0) {
    qfd = -1;
    goto fail;
  }
  qfd = -1;
loaded:;
  int64_t t_qmp = eph_now_ms(), t_loaded = t_qmp;
  if (s->restored) {
    static const char *const loading[] = {"inmigrate", "restore-vm", NULL};
    char st[32];
    snprintf(st, sizeof st, "paused"); /* a pooled one: loaded and stopped (pool.c) */
    if ((r = send_reseed(gfd, err)) < 0 ||
        (!pv && (r = qmp_wait_status(&s->qmp, loading, deadline, st, sizeof st, err)) < 0))
      goto fail;
    t_loaded = eph_now_ms();
    if (strcmp(st, "running") != 0 &&
        (r = qmp_exec(&s->qmp, "cont", NULL, -1, deadline, NULL, err)) < 0)
      goto fail;
    /* Where a restore's time goes (bench/qemu-bench reads this line; the guest's answer
     * to the reseed, its new hello, is the core's "ready"). */
    int64_t now = eph_now_ms();
    q->host->log(EPH_LOG_DEBUG,
                 "%s: restore phases: prepare %" PRId64 " ms, QEMU start %" PRId64
                 " ms, incoming migration %" PRId64 " ms, resume %" PRId64 " ms, "
                 "create %" PRId64 " ms (QEMU used %" PRId64 " ms of CPU so far)%s",
                 s->run_id, t_launch - t0, t_qmp - t_launch, t_loaded - t_qmp, now - t_loaded,
                 now - t0, cpu_ms(s->vm.qemu), pv ? ", from the pool" : "");
  }
  q->host->log(EPH_LOG_DEBUG,
               "%s: QEMU %d (uid %lld) started (%s, %s, %" PRIu64 " MiB, %u vCPU) "
               "in %" PRId64 " ms",
               s->run_id, (int)s->vm.qemu,
               s->vm.slot >= 0 ? (long long)(q->cfg.uid_base + s->vm.slot) : (long long)getuid(),
               l.accel,
               pv            ? "restored ahead, from the pool"
               : s->restored ? "restored"
                             : "cold boot",
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
  qemu_image_close(&img);
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
  snprintf(name, sizeof name, "%s", s->qemu_name);
  int rm = rm_tree(s->dir);
  rep->processes_left = uid_left + count_named(name, false);
  rep->files_left = count_files(s->dir);
  /* The tap is not persistent: QEMU's exit closed its last fd and removed it. */
  bool tap_left = qemu_tap_exists(s->nl, s->tap);
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
    return errno == ENOENT ? 0 : eph_error_set(err, errno, "%s: %s", q->run_base, strerror(errno));
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
    char qname[128] = "";
    if (read_small(path, buf, sizeof buf))
      sscanf(buf, "%d %d %llu %127s", &qpid, &owner, &ostart, qname);
    if (owner > 0 && start_time(owner) == ostart && ostart != 0)
      continue; /* its owner lives: not ours to touch */
    if (owner == 0) {
      /* No record yet: a create in progress, unless the directory is old. */
      struct stat st;
      if (stat(dir, &st) == 0 && time(NULL) - st.st_mtime < 60)
        continue;
    }
    char name[300];
    /* QEMU's name from the record (a pooled one keeps its pool name), else the run's. */
    if (strncmp(qname, "ephemeral-", 10) == 0)
      snprintf(name, sizeof name, "%s", qname);
    else
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

static int
qemu_cache_list(void *state, eph_cache_each_fn each, void *ctx, eph_error_t *err)
{
  return snapshot_list(state, each, ctx, err);
}

static int
qemu_cache_prune(void *state, int64_t max_bytes, eph_cache_each_fn each, void *ctx,
                 eph_error_t *err)
{
  return snapshot_gc(state, max_bytes, NULL, false, each, ctx, err);
}

static const eph_backend_ops_t qemu_ops = {
    .struct_size = sizeof(eph_backend_ops_t),
    .source = "MicroVM",
    .noun = "microVM",
    .create = qemu_create,
    .stats = qemu_stats,
    .destroy = qemu_destroy,
    .sweep = qemu_sweep,
    .cache_list = qemu_cache_list,
    .cache_prune = qemu_cache_prune,
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
