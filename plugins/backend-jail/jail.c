/* backend-jail: a sandbox made of Linux namespaces (user, pid, mount, net, ipc, uts, cgroup),
 * a fresh tmpfs root, cgroup limits, and ephemeral-guest as its PID 1.
 *
 * User namespace choice. The host runs as root, yet a sandbox's root must not be host root.
 * Each live sandbox holds a slot k (0 <= k < slots) and its user namespace maps inside uids
 * and gids 0..65535 to host uid_base + k*65536 .. +65535: the sandbox's root is host uid
 * uid_base + k*65536 and its worker (1000) host uid uid_base + k*65536 + 1000. Two sandboxes
 * never share a host uid, and no sandbox uid owns anything on the host. The default
 * uid_base 100000 is the start of the usual /etc/subuid range (shadow's SUB_UID_MIN).
 * A slot is claimed by creating <run_dir>/slot-<k> with O_EXCL: the same file records the
 * run id and the owner process (pid + start time) so a later start can sweep what a
 * killed owner left behind.
 *
 * Lifecycle of one sandbox (create):
 *   limits checked against the operator maxima -> slot record -> cgroup(s) with limits ->
 *   socketpair + sync pipes -> clone3(new user/pid/mount/net/ipc/uts ns, pidfd; without a
 *   copy of this process where clone_vm.c can: CLONE_VM | CLONE_VFORK, see "clone without a
 *   copy" below), the child born in its cgroup(s) (v2: CLONE_INTO_CGROUP; v1: cloned by this
 *   thread while it stands in the run's groups, see jail_cg_enter_thread; else moved after
 *   the clone) -> parent writes uid_map/gid_map -> "go" ->
 *   the child runs setup.c's steps and execs ephemeral-guest -> the parent sees the error
 *   pipe close (exec) -> the deadline is armed with the watchdog thread.
 * destroy: SIGKILL the pid namespace's init (the kernel then kills the whole namespace),
 *   reap, read the counters, rmdir the cgroups (when one stays: SIGKILL whatever the groups
 *   and their child groups list, remove the child groups, retry), remove the slot record,
 *   then count what is left. The root, /tmp and /dev/shm are tmpfs mounts of the sandbox's
 *   own mount namespace: they are freed with it, nothing of them is ever on the host's disk.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/sched.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jail.h"
#include "support/netns.h"

#define MIB (1024ULL * 1024ULL)
#define SETUP_TIMEOUT_MS 10000

/* ------------------------------------------------------------ configuration */

static const eph_config_key_t jail_keys[] = {
    {"memory_mib", EPH_CFG_INT, "512", "MiB",
     "Default memory limit of a sandbox (cgroup memory limit; swap accounted, so swap cannot "
     "hide it). Must be above scratch_mib: /tmp pages are charged to it.",
     EPH_CFG_RANGE(16, 1048576)},
    {"max_memory_mib", EPH_CFG_INT, "4096", "MiB",
     "Largest memory limit a request may ask for; a larger one is refused.",
     EPH_CFG_RANGE(16, 1048576)},
    {"pids", EPH_CFG_INT, "256", NULL,
     "Default process and thread limit of a sandbox (cgroup pids.max), the guest included.",
     EPH_CFG_RANGE(2, 4194304)},
    {"max_pids", EPH_CFG_INT, "4096", NULL, "Largest process limit a request may ask for.",
     EPH_CFG_RANGE(2, 4194304)},
    {"cpu_percent", EPH_CFG_INT, "100", "percent", "Default CPU quota (CFS quota; 100 = one core).",
     EPH_CFG_RANGE(1, 100000)},
    {"max_cpu_percent", EPH_CFG_INT, "200", "percent", "Largest CPU quota a request may ask for.",
     EPH_CFG_RANGE(1, 100000)},
    {"nofile", EPH_CFG_INT, "1024", NULL,
     "Default open files per process (RLIMIT_NOFILE given to the guest and its commands).",
     EPH_CFG_RANGE(16, 1048576)},
    {"max_nofile", EPH_CFG_INT, "65536", NULL, "Largest RLIMIT_NOFILE a request may ask for.",
     EPH_CFG_RANGE(16, 1048576)},
    {"scratch_mib", EPH_CFG_INT, "256", "MiB",
     "Default size of the writable /tmp tmpfs that holds scratch: when full, writes fail "
     "with ENOSPC.",
     EPH_CFG_RANGE(1, 1048576)},
    {"max_scratch_mib", EPH_CFG_INT, "2048", "MiB", "Largest /tmp size a request may ask for.",
     EPH_CFG_RANGE(1, 1048576)},
    {"shm_mib", EPH_CFG_INT, "16", "MiB", "Size of the /dev/shm tmpfs.", EPH_CFG_RANGE(1, 65536)},
    {"uid_base", EPH_CFG_INT, "100000", NULL,
     "Host uid/gid of slot 0's root; slot k maps inside ids 0..65535 to "
     "uid_base + k*65536. At least 65536 so no sandbox id is a host user.",
     EPH_CFG_RANGE(65536, 4294967295)},
    {"slots", EPH_CFG_INT, "1024", NULL,
     "How many sandboxes may exist at once on the host (each holds one id range).",
     EPH_CFG_RANGE(1, 65536)},
    {"cgroup_root", EPH_CFG_STRING, "\"/sys/fs/cgroup\"", NULL,
     "Where the cgroup hierarchies are mounted; v2 is detected by cgroup.controllers there, "
     "else v1 controllers memory, pids and cpu are expected beneath."},
    {"cgroup_parent", EPH_CFG_STRING, "\"ephemeral\"", NULL,
     "Name of the parent group holding one group per sandbox (named after the run id)."},
    {"run_dir", EPH_CFG_STRING, "\"/run/ephemeral/jail\"", NULL,
     "Host directory of the slot records (owner pid, run id) used by the start-up sweep."},
    {"hostname", EPH_CFG_STRING, "\"ephemeral\"", NULL, "Host name inside the sandbox."},
    {"etc_binds", EPH_CFG_LIST, "[\"alternatives\", \"ld.so.cache\", \"ssl\", \"localtime\"]", NULL,
     "Host /etc entries bound read-only (symlinks recreated) besides the generated passwd, "
     "group, hostname, hosts and nsswitch.conf. resolv.conf and hosts are refused."},
    {"usr_binds", EPH_CFG_LIST, "[\"bin\", \"sbin\", \"lib\", \"lib64\", \"libexec\", \"share\"]",
     NULL,
     "The host /usr entries bound read-only into the sandbox's otherwise empty /usr (paths "
     "relative to /usr; a missing one is skipped). /usr is never bound whole: \"local\", "
     "\"etc\" and anything holding /usr/local/etc (where a default install puts ephemeral's "
     "configuration) are refused; \"local/bin\" may be added."},
    {"guest", EPH_CFG_STRING, "\"\"", NULL,
     "Path of the guest binary; empty = <libexec_dir>/ephemeral-guest."},
    {0},
};

static int
cfg_limit(const jail_t *j, const config_setting_t *c, const char *key, int64_t def, int64_t *out,
          eph_error_t *err)
{
  /* The range is the key row's (jail_keys): the host checks it, with file:line. */
  return j->host->cfg_int(c, key, def, out, err) < 0 ? -err->code : 0;
}

/* Reads every key; checks each default against its maximum. */
static int
read_config(jail_t *j, const config_setting_t *c, const char **cg_root, const char **cg_parent,
            const char **run_dir, const char **hostname, const char **guest, int64_t *shm_mib,
            eph_error_t *err)
{
  int64_t v[10], base, slots;
  static const struct {
    const char *key, *max_key;
    int64_t def, max_def;
  } lim[5] = {
      {"memory_mib", "max_memory_mib", 512, 4096},
      {"pids", "max_pids", 256, 4096},
      {"cpu_percent", "max_cpu_percent", 100, 200},
      {"nofile", "max_nofile", 1024, 65536}, /* at least 16 (its row): the guest's own floor */
      {"scratch_mib", "max_scratch_mib", 256, 2048},
  };
  for (int i = 0; i < 5; i++) {
    if (cfg_limit(j, c, lim[i].key, lim[i].def, &v[2 * i], err) < 0 ||
        cfg_limit(j, c, lim[i].max_key, lim[i].max_def, &v[2 * i + 1], err) < 0)
      return -err->code;
    if (v[2 * i] > v[2 * i + 1])
      return eph_error_set(err, EPH_E_CONFIG,
                           "backend-jail: key '%s' (%" PRId64 ") is above "
                           "'%s' (%" PRId64 ")",
                           lim[i].key, v[2 * i], lim[i].max_key, v[2 * i + 1]);
  }
  if (v[8] >= v[0])
    return eph_error_set(err, EPH_E_CONFIG,
                         "backend-jail: key 'scratch_mib' (%" PRId64 ") "
                         "must be below 'memory_mib' (%" PRId64 "): /tmp pages count as "
                         "memory, a full /tmp must be ENOSPC and not an OOM kill",
                         v[8], v[0]);
  j->def = (jail_limits_t){(uint64_t)v[0] * MIB, (uint32_t)v[2], (uint32_t)v[4], (uint32_t)v[6],
                           (uint64_t)v[8] * MIB};
  j->max = (jail_limits_t){(uint64_t)v[1] * MIB, (uint32_t)v[3], (uint32_t)v[5], (uint32_t)v[7],
                           (uint64_t)v[9] * MIB};
  if (cfg_limit(j, c, "shm_mib", 16, shm_mib, err) < 0 ||
      cfg_limit(j, c, "uid_base", 100000, &base, err) < 0 ||
      cfg_limit(j, c, "slots", 1024, &slots, err) < 0)
    return -err->code;
  if ((uint64_t)base + (uint64_t)slots * JAIL_IDS_PER_SLOT > UINT32_MAX - 1ULL)
    return eph_error_set(err, EPH_E_CONFIG,
                         "backend-jail: uid_base + slots*65536 passes the "
                         "largest uid (4294967294)");
  j->uid_base = (uint64_t)base;
  j->slots = (uint32_t)slots;
  if (j->host->cfg_string(c, "cgroup_root", "/sys/fs/cgroup", cg_root, err) < 0 ||
      j->host->cfg_string(c, "cgroup_parent", "ephemeral", cg_parent, err) < 0 ||
      j->host->cfg_string(c, "run_dir", "/run/ephemeral/jail", run_dir, err) < 0 ||
      j->host->cfg_string(c, "hostname", "ephemeral", hostname, err) < 0 ||
      j->host->cfg_string(c, "guest", "", guest, err) < 0)
    return -err->code;
  if (!**cg_parent || strchr(*cg_parent, '/') || **run_dir != '/' || !**hostname ||
      strlen(*hostname) > 64)
    return eph_error_set(err, EPH_E_CONFIG,
                         "backend-jail: cgroup_parent must be a plain "
                         "name, run_dir an absolute path, hostname 1-64 characters");
  return 0;
}

/* A list key (etc_binds, usr_binds) as a NULL-terminated array of borrowed strings, or
 * `defaults` when the key is absent. *allocated tells the caller to free() the array. */
static int
read_list(const config_setting_t *c, const char *key, const char **defaults, const char ***out,
          bool *allocated, eph_error_t *err)
{
  const config_setting_t *l = c ? config_setting_get_member(c, key) : NULL;
  *allocated = false;
  if (!l) {
    *out = defaults;
    return 0;
  }
  if (!config_setting_is_aggregate(l))
    return eph_error_set(err, EPH_E_CONFIG, "%s:%d: key '%s': expected a list of strings",
                         config_setting_source_file(l) ? config_setting_source_file(l) : "?",
                         config_setting_source_line(l), key);
  int n = config_setting_length(l);
  const char **a = calloc((size_t)n + 1, sizeof *a);
  if (!a)
    return eph_error_set(err, ENOMEM, "etc_binds: out of memory");
  for (int i = 0; i < n; i++) {
    a[i] = config_setting_get_string_elem(l, i);
    if (!a[i]) {
      free(a);
      return eph_error_set(err, EPH_E_CONFIG, "%s:%d: key '%s': element %d is not a string",
                           config_setting_source_file(l) ? config_setting_source_file(l) : "?",
                           config_setting_source_line(l), key, i);
    }
  }
  *out = a;
  *allocated = true;
  return 0;
}

static int
open_guest(jail_t *j, eph_error_t *err)
{
  if (j->exe_fd >= 0)
    return 0;
  j->exe_fd = open(j->guest_path, O_PATH | O_CLOEXEC);
  if (j->exe_fd < 0)
    return eph_error_set(err, errno, "guest binary %s: %s", j->guest_path, strerror(errno));
  return 0;
}

static void jail_fini(void *state);

static int
jail_init(const eph_host_t *host, const config_setting_t *config, void **state, eph_error_t *err)
{
  jail_t *j = calloc(1, sizeof *j);
  if (!j)
    return eph_error_set(err, ENOMEM, "backend-jail: out of memory");
  j->host = host;
  j->run_dir_fd = j->exe_fd = -1;
  for (int i = 0; i < JAIL_CG_N; i++)
    j->cg.parent_fd[i] = -1;
  pthread_mutex_init(&j->lock, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* deadlines are CLOCK_MONOTONIC ms */
  pthread_cond_init(&j->cond, &ca);
  pthread_condattr_destroy(&ca);

  const char *cg_root, *cg_parent, *run_dir, *hostname, *guest;
  static const char *etc_default[] = {"alternatives", "ld.so.cache", "ssl", "localtime", NULL};
  static const char *usr_default[] = {JAIL_USR_BINDS_DEFAULT, NULL};
  const char **etc_binds = NULL, **usr_binds = NULL;
  bool etc_alloc = false, usr_alloc = false;
  int64_t shm_mib;
  int r = read_config(j, config, &cg_root, &cg_parent, &run_dir, &hostname, &guest, &shm_mib, err);
  if (r < 0 || (r = read_list(config, "etc_binds", etc_default, &etc_binds, &etc_alloc, err)) < 0)
    goto fail;
  if ((r = read_list(config, "usr_binds", usr_default, &usr_binds, &usr_alloc, err)) < 0) {
    if (etc_alloc)
      free(etc_binds);
    goto fail;
  }
  r = jail_plan_build(&j->plan, hostname, (uint64_t)shm_mib * MIB, usr_binds, etc_binds, err);
  if (etc_alloc)
    free(etc_binds);
  if (usr_alloc)
    free(usr_binds);
  if (r < 0)
    goto fail;
  if ((r = jail_cg_init(&j->cg, cg_root, cg_parent, err)) < 0)
    goto fail;

  /* The slot records: created once here, then only openat()ed per sandbox. */
  char path[4096];
  snprintf(path, sizeof path, "%s", run_dir);
  for (char *s = path + 1; *s; s++) {
    if (*s != '/')
      continue;
    *s = '\0';
    (void)mkdir(path, 0755);
    *s = '/';
  }
  if (mkdir(run_dir, 0700) < 0 && errno != EEXIST) {
    r = eph_error_set(err, errno, "mkdir %s: %s", run_dir, strerror(errno));
    goto fail;
  }
  j->run_dir = strdup(run_dir);
  j->run_dir_fd = open(run_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (!j->run_dir || j->run_dir_fd < 0) {
    r = eph_error_set(err, errno ? errno : ENOMEM, "open %s: %s", run_dir, strerror(errno));
    goto fail;
  }

  if (*guest)
    j->guest_path = strdup(guest);
  else if (asprintf(&j->guest_path, "%s/ephemeral-guest",
                    host->libexec_dir ? host->libexec_dir : ".") < 0)
    j->guest_path = NULL;
  if (!j->guest_path) {
    r = eph_error_set(err, ENOMEM, "backend-jail: out of memory");
    goto fail;
  }
  eph_error_t gerr = {0};
  if (open_guest(j, &gerr) < 0) /* not fatal: the guest may be built after the plugin */
    host->log(EPH_LOG_WARN, "%s (sandboxes cannot start until it exists)", gerr.message);

  j->owner_pid = getpid();
  j->owner_start = jail_proc_start_time(j->owner_pid);
  j->dumpable = prctl(PR_GET_DUMPABLE, 0, 0, 0, 0);
  host->log(EPH_LOG_DEBUG, "cgroup %s, uid_base %" PRIu64 ", %u slots, run_dir %s",
            j->cg.v2 ? "v2" : "v1", j->uid_base, j->slots, j->run_dir);
  *state = j;
  return 0;
fail:
  jail_fini(j);
  return r;
}

static void
jail_fini(void *state)
{
  jail_t *j = state;
  if (!j)
    return;
  if (j->watchdog_joinable) {
    pthread_mutex_lock(&j->lock);
    j->stopping = true;
    pthread_cond_signal(&j->cond);
    pthread_mutex_unlock(&j->lock);
    pthread_join(j->watchdog, NULL);
  }
  pthread_mutex_destroy(&j->lock);
  pthread_cond_destroy(&j->cond);
  jail_cg_fini(&j->cg);
  jail_plan_free(&j->plan);
  if (j->run_dir_fd >= 0)
    close(j->run_dir_fd);
  if (j->exe_fd >= 0)
    close(j->exe_fd);
  free(j->run_dir);
  free(j->guest_path);
  free(j);
}

/* ------------------------------------------------------------ create */

static int
check_limits(const jail_t *j, const eph_sandbox_limits_t *in, jail_limits_t *out, eph_error_t *err)
{
  *out = j->def;
  /* unit: what one of the key's units is in the field's (the _mib keys hold MiB, the
   * fields bytes), so the message quotes the key as the operator wrote it. */
#define TAKE(field, key, unit)                                                                     \
  if (in->field) {                                                                                 \
    if ((uint64_t)in->field > (uint64_t)j->max.field)                                              \
      return eph_error_set(err, EINVAL,                                                            \
                           "limits." #field " %" PRIu64 " is above the operator "                  \
                           "maximum (backend-jail key '" key "' = %" PRIu64 ")",                   \
                           (uint64_t)in->field, (uint64_t)(j->max.field / (unit)));                \
    out->field = in->field;                                                                        \
  }
  TAKE(memory_bytes, "max_memory_mib", MIB)
  TAKE(pids, "max_pids", 1)
  TAKE(cpu_percent, "max_cpu_percent", 1)
  TAKE(nofile, "max_nofile", 1)
  TAKE(scratch_bytes, "max_scratch_mib", MIB)
#undef TAKE
  if (out->pids < 2 || out->nofile < 16)
    return eph_error_set(err, EINVAL,
                         "limits.pids %u / limits.nofile %u: the guest needs at "
                         "least 2 processes and 16 files",
                         out->pids, out->nofile);
  /* A request that lowers memory without naming scratch gets half its memory as scratch
   * rather than a refusal; one that names both must keep scratch below memory. */
  if (!in->scratch_bytes && out->scratch_bytes >= out->memory_bytes)
    out->scratch_bytes = out->memory_bytes / 2;
  if (out->scratch_bytes >= out->memory_bytes)
    return eph_error_set(err, EINVAL,
                         "limits.scratch_bytes %" PRIu64 " must be below "
                         "limits.memory_bytes %" PRIu64 " (tmpfs pages count as memory)",
                         out->scratch_bytes, out->memory_bytes);
  return 0;
}

bool
jail_valid_run_id(const char *id)
{
  size_t n = id ? strlen(id) : 0;
  if (n == 0 || n > 100 || id[0] == '.')
    return false;
  for (size_t i = 0; i < n; i++)
    if (!((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= 'A' && id[i] <= 'Z') ||
          (id[i] >= '0' && id[i] <= '9') || id[i] == '_' || id[i] == '-'))
      return false;
  return true;
}

/* spec->network == 1 grants one socket, the proxy's at spec->proxy_url: checked here,
 * before anything is made; its listener is put on the sandbox's lo by jail_net_setup()
 * between the uid maps and "go" (net.c). */
static int
jail_network_grant(const eph_sandbox_spec_t *spec, eph_error_t *err)
{
  uint32_t proxy;
  uint16_t port;
  if (!spec->network)
    return 0;
  if (spec->struct_size < offsetof(eph_sandbox_spec_t, proxy_ctx) + sizeof(void *) ||
      !spec->proxy_attach)
    return eph_error_set(err, EINVAL,
                         "network grant without proxy_attach (a core before ABI 1.2): "
                         "refused, the sandbox would have no proxy to reach");
  return eph_proxy_url_parse(spec->proxy_url, &proxy, &port, err);
}

/* A random version-4 UUID, the form of /proc/sys/kernel/random/boot_id: the sandbox's own,
 * so nothing inside can tell two sandboxes of one host boot apart from two hosts. */
static int
new_boot_id(char *out, size_t size, eph_error_t *err)
{
  unsigned char b[16];
  if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b)
    return eph_error_set(err, errno ? errno : EIO, "getrandom (boot_id): %s", strerror(errno));
  b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
  b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
  snprintf(out, size, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
           b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
           b[15]);
  return 0;
}

static void
reap_child(pid_t pid, int pidfd)
{
  if (pidfd >= 0)
    syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0);
  siginfo_t si;
  if (pidfd >= 0)
    waitid(P_PIDFD, (id_t)pidfd, &si, WEXITED);
  else if (pid > 0)
    waitpid(pid, NULL, 0);
}

static int
jail_create(void *state, const eph_sandbox_spec_t *spec, eph_sandbox_t **out, int *guest_fd,
            eph_error_t *err)
{
  jail_t *j = state;
  int64_t start = eph_now_ms();
  jail_limits_t lim;

  if (!spec || spec->struct_size < offsetof(eph_sandbox_spec_t, proxy_url))
    return eph_error_set(err, EINVAL, "sandbox spec missing or too small");
  if (!jail_valid_run_id(spec->run_id))
    return eph_error_set(err, EINVAL, "run_id '%s': expected 1-100 of [A-Za-z0-9_-]",
                         spec->run_id ? spec->run_id : "(null)");
  if (spec->deadline_ms > 0 && spec->deadline_ms <= start)
    return eph_error_set(err, ETIMEDOUT, "sandbox %s: deadline already passed", spec->run_id);
  if (check_limits(j, &spec->limits, &lim, err) < 0 || jail_network_grant(spec, err) < 0 ||
      open_guest(j, err) < 0)
    return -err->code;

  struct eph_sandbox *sb = calloc(1, sizeof *sb);
  if (!sb)
    return eph_error_set(err, ENOMEM, "sandbox %s: out of memory", spec->run_id);
  snprintf(sb->run_id, sizeof sb->run_id, "%s", spec->run_id);
  sb->pidfd = -1;
  sb->counters = JAIL_COUNTER_FDS_NONE;
  sb->created_ms = start;
  sb->deadline_ms = spec->deadline_ms;

  int socks[2] = {-1, -1}, go[2] = {-1, -1}, errp[2] = {-1, -1};
  bool vm_held = false; /* a CLONE_VM child maybe still on our mm (jail_vm_release) */
  /* The child's way to tell the host died (jail.h): opened per create, so a process that
   * forked after init watches itself. Without it (ENOSYS) the go socket's hang-up only. */
  cleanup_close int host_pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
  bool cg_made = false;
  int r;
  sb->slot = jail_slot_claim(j, sb->run_id, err);
  if (sb->slot < 0) {
    free(sb);
    return -err->code;
  }
  if ((r = jail_cg_create(&j->cg, sb->run_id, &lim, true, err)) < 0)
    goto fail;
  cg_made = true;
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, socks) < 0 ||
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, go) < 0 || pipe2(errp, O_CLOEXEC) < 0) {
    r = eph_error_set(err, errno, "sandbox %s: socketpair/pipe: %s", sb->run_id, strerror(errno));
    goto fail;
  }

  jail_child_args_t args = {
      .plan = &j->plan,
      .go_fd = go[0],
      .err_fd = errp[1],
      .guest_fd = socks[1],
      .exe_fd = j->exe_fd,
      .host_pidfd = host_pidfd,
      .scratch_bytes = lim.scratch_bytes,
      .memory_bytes = lim.memory_bytes,
      .nofile = lim.nofile,
      .network = spec->network,
      .close_fds = {go[1], errp[0], socks[0]},
  };
  if ((r = new_boot_id(args.boot_id, sizeof args.boot_id, err)) < 0)
    goto fail;
  struct clone_args ca;
  memset(&ca, 0, sizeof ca);
  ca.flags = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC |
             CLONE_NEWUTS | CLONE_PIDFD;
  ca.pidfd = (uint64_t)(uintptr_t)&sb->pidfd;
  ca.exit_signal = SIGCHLD;
  /* cgroup v2: born in its group (CLONE_INTO_CGROUP), no migration afterwards. */
  int cgfd = jail_cg_clone_fd(&j->cg, sb->run_id);
  if (cgfd >= 0) {
    ca.flags |= CLONE_INTO_CGROUP;
    ca.cgroup = (uint64_t)cgfd;
  }
  int64_t limit = start + SETUP_TIMEOUT_MS;
  if (spec->deadline_ms > 0 && spec->deadline_ms < limit)
    limit = spec->deadline_ms;
  jail_parent_side_t ps = {
      .j = j,
      .spec = spec,
      .sb = sb,
      .lim = &lim,
      .go_fd = go[1],
      .err_fd = errp[0],
      .limit_ms = limit,
      .child_ends = {&go[0], &errp[1], &socks[1]},
  };
  /* The helper thread of a CLONE_VM clone starts first: a thread is born in its creator's
   * cgroups, and this one must not be in the run's (below). */
  jail_vm_clone_t vc;
  bool use_vm = jail_vm_clone_begin(&vc, &ps);
  /* cgroup v1: this thread steps into the run's groups, clones (the child is born there)
   * and steps back; see jail_cg_enter_thread. Where it may not (a daemon that cannot move
   * itself back), the classic move of the child below. */
  jail_cg_home_t home;
  eph_error_t enter_err = {0};
  bool entered = cgfd < 0 && jail_cg_enter_thread(&j->cg, sb->run_id, &home, &enter_err) == 0;
  if (cgfd < 0 && !entered && !j->cg.v2)
    j->host->log(EPH_LOG_DEBUG, "sandbox %s: %s; moving the child instead", sb->run_id,
                 enter_err.message);
  ps.born_in_group = cgfd >= 0 || entered;
  /* The memory limit binds the child alone once this thread is out of the groups: at once
   * if it never went in, else after its clone (for CLONE_VM, after the child's exec). */
  ps.limit_memory = !entered;
  long pid = -1;
  int clone_errno = 0;
  if (use_vm) {
    args.announce = 1;
    pid = jail_vm_clone_run(&vc, &ca, &args);
    clone_errno = errno;
    vm_held = pid > 0;
    args.announce = 0;
    if (pid < 0 && (clone_errno == EINVAL || clone_errno == ENOSYS || clone_errno == EPERM ||
                    clone_errno == E2BIG)) {
      /* A kernel or a seccomp policy refusing this clone: the copying clone below. */
      j->host->log(EPH_LOG_DEBUG, "sandbox %s: clone3(CLONE_VM): %s; cloning a copy instead",
                   sb->run_id, strerror(clone_errno));
      use_vm = false;
      sb->pidfd = -1;
    }
  }
  if (!use_vm) {
    pid = syscall(SYS_clone3, &ca, sizeof ca);
    if (pid < 0 && cgfd >= 0 && (errno == EINVAL || errno == E2BIG || errno == EOPNOTSUPP)) {
      /* A kernel before 5.7, or a group it refuses: the classic move below. */
      ca.flags &= ~(uint64_t)CLONE_INTO_CGROUP;
      ca.cgroup = 0;
      close(cgfd);
      cgfd = -1;
      ps.born_in_group = entered;
      pid = syscall(SYS_clone3, &ca, sizeof ca);
    }
    if (pid == 0)
      jail_child_main(&args); /* never returns */
    clone_errno = errno;
  }
  if (cgfd >= 0)
    close(cgfd);
  if (pid > 0)
    sb->pid = (pid_t)pid;
  if (entered && (r = jail_cg_leave_thread(&j->cg, &home, err)) < 0) {
    eph_error_wrap(err, "sandbox %s", sb->run_id);
    goto fail;
  }
  if (pid < 0) {
    r = eph_error_set(err, clone_errno,
                      "sandbox %s: clone3(new user, pid, mount, net, ipc, uts "
                      "namespaces): %s",
                      sb->run_id, strerror(clone_errno));
    goto fail;
  }
  if (use_vm) {
    /* The helper did the host's side while this thread slept in the clone; the child has
     * exec'd or died since. A child that failed a step said why on the error pipe: that,
     * rather than what the helper then failed to do with it. */
    if (ps.r < 0) {
      r = jail_child_error(errp[0], sb->run_id, err) < 0 ? -err->code : (*err = ps.err, ps.r);
      goto fail;
    }
  } else {
    jail_close_child_ends(&ps);
    /* This thread is out of the run's groups: their memory limit binds the child alone. */
    ps.limit_memory = true;
    if ((r = jail_parent_side(&ps)) < 0) {
      *err = ps.err;
      goto fail;
    }
  }
  jail_close_child_ends(&ps); /* CLONE_VM: those the helper did not close (no 's' came) */
  /* CLONE_VM from inside the run's groups: out of them now, their memory limit binds the
   * child alone (the guest has started and has run no command). */
  if (use_vm && entered && (r = jail_cg_limit_memory(&j->cg, sb->run_id, &lim, err)) < 0) {
    eph_error_wrap(err, "sandbox %s", sb->run_id);
    goto fail;
  }

  /* The error pipe closes on exec (CLOEXEC) or carries the failed step. */
  struct pollfd pf = {.fd = errp[0], .events = POLLIN};
  int pr;
  do {
    int64_t wait = limit - eph_now_ms();
    pr = poll(&pf, 1, wait > 0 ? (int)wait : 0);
  } while (pr < 0 && errno == EINTR);
  if (pr == 0) {
    r = eph_error_set(err, ETIMEDOUT, "sandbox %s: set-up did not finish in time", sb->run_id);
    goto fail;
  }
  if ((r = jail_child_error(errp[0], sb->run_id, err)) < 0)
    goto fail;
  if (vm_held) { /* the pipe's EOF: past its exec's switch of mm */
    jail_vm_release(j);
    vm_held = false;
  }
  siginfo_t si;
  memset(&si, 0, sizeof si);
  if (waitid(P_PIDFD, (id_t)sb->pidfd, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid) {
    r = eph_error_set(err, ECHILD, "sandbox %s: the child died during set-up (status %d)",
                      sb->run_id, si.si_status);
    goto fail;
  }
  close(go[1]);
  close(errp[0]);
  /* The counter files the core reads around every command, opened while the guest boots
   * (stats() opens them itself if this failed). */
  eph_error_t cerr = {0};
  (void)jail_cg_counters_open(&j->cg, sb->run_id, &sb->counters, &cerr);
  if ((r = jail_watch(j, sb, err)) < 0) {
    go[1] = errp[0] = -1;
    goto fail;
  }
  *guest_fd = socks[0];
  *out = sb;
  return 0;

fail:
  jail_cg_counters_close(&sb->counters);
  if (sb->pid > 0)
    reap_child(sb->pid, sb->pidfd);
  if (vm_held)
    jail_vm_release(j);
  if (cg_made) {
    jail_cg_kill_all(&j->cg, sb->run_id, 1000, NULL, NULL);
    jail_cg_remove(&j->cg, sb->run_id, 1000);
  }
  jail_slot_release(j, sb->slot);
  for (int i = 0; i < 2; i++) {
    if (socks[i] >= 0)
      close(socks[i]);
    if (go[i] >= 0)
      close(go[i]);
    if (errp[i] >= 0)
      close(errp[i]);
  }
  if (sb->pidfd >= 0)
    close(sb->pidfd);
  free(sb);
  return r;
}

/* ------------------------------------------------------------ stats, destroy */

static int
jail_stats(void *state, eph_sandbox_t *sb, eph_sandbox_report_t *out, eph_error_t *err)
{
  jail_t *j = state;
  jail_counters_t c;
  /* The core reads them before and after every command: the files stay open. */
  if (sb->counters.oom < 0 && sb->counters.peak < 0 && sb->counters.pids < 0 &&
      jail_cg_counters_open(&j->cg, sb->run_id, &sb->counters, err) < 0)
    return -err->code;
  jail_cg_counters_read(&j->cg, &sb->counters, &c);
  uint32_t size = out->struct_size ? out->struct_size : sizeof *out;
  eph_sandbox_report_t rep = {.struct_size = size};
  rep.lifetime_ms = eph_now_ms() - sb->created_ms;
  rep.memory_peak_bytes = c.memory_peak_bytes;
  rep.oom_kills = c.oom_kills;
  rep.pids_refused = c.pids_refused;
  /* processes_left is destroy()'s: counting here read three cgroup.procs per command. */
  memcpy(out, &rep, size < sizeof rep ? size : sizeof rep);
  return 0;
}

static int
jail_destroy(void *state, eph_sandbox_t *sb, eph_sandbox_report_t *report, eph_error_t *err)
{
  jail_t *j = state;
  if (!sb)
    return 0;
  jail_unwatch(j, sb);

  /* 1. Kill init of the pid namespace: the kernel kills the rest, and init's exit completes
   * only after every process of its namespace is gone (the pidfd turns readable then). */
  syscall(SYS_pidfd_send_signal, sb->pidfd, SIGKILL, NULL, 0);
  struct pollfd pf = {.fd = sb->pidfd, .events = POLLIN};
  bool init_gone = poll(&pf, 1, 5000) > 0;
  siginfo_t si;
  memset(&si, 0, sizeof si);
  if (init_gone)
    init_gone = waitid(P_PIDFD, (id_t)sb->pidfd, &si, WEXITED | WNOHANG) == 0 && si.si_pid;

  /* 2. Counters, before the groups go. */
  jail_counters_t c = {0};
  eph_error_t cerr = {0};
  if (sb->counters.oom >= 0 || sb->counters.peak >= 0 || sb->counters.pids >= 0)
    jail_cg_counters_read(&j->cg, &sb->counters, &c);
  else
    (void)jail_cg_counters(&j->cg, sb->run_id, &c, &cerr);
  jail_cg_counters_close(&sb->counters); /* before the rmdir: an open file keeps nothing */

  /* 3. Remove the groups. With init reaped, one attempt normally removes them all, and the
   * kernel refuses to remove a group that still holds a task or a child group (EBUSY, v1 and
   * v2): a removed group proves nothing of the sandbox is left in it, without reading
   * cgroup.procs. Only when one stays (init not reaped, or something put in a group, or a
   * child group made, from outside) is every process the groups and their descendants list
   * SIGKILLed and the removal retried, child groups first; what still stands is then counted
   * (step 5). */
  jail_cg_tally_t killed = {0}, listed = {0};
  int groups_left = init_gone ? jail_cg_remove(&j->cg, sb->run_id, 0) : -1;
  if (groups_left != 0) {
    int still = jail_cg_kill_all(&j->cg, sb->run_id, 2000, &killed, &listed);
    /* Host processes are never killed: when only they are left, waiting would not help. */
    groups_left = jail_cg_remove(&j->cg, sb->run_id,
                                 still == listed.host && (still || !killed.procs) ? 0 : 1000);
  }
  /* 4. The slot record: it stays while a group does (the sweep finds the run by it). Whether
   * it went is the unlink's answer: the slot's file may already be another create's record.
   * (A run granting web left nothing on the host: its proxy's listener lives in the
   * sandbox's netns, held by the core's proxy.) */
  bool record_left = groups_left != 0 || jail_slot_release(j, sb->slot) < 0;

  /* 5. Check, then report: what is left is counted in every group that stays, child groups
   * included. */
  jail_cg_tally_t left = {0};
  eph_sandbox_report_t rep = {.struct_size = sizeof rep};
  rep.processes_left =
      (groups_left ? jail_cg_count(&j->cg, sb->run_id, &left) : 0) + (init_gone ? 0 : 1);
  rep.files_left = groups_left + (record_left ? 1 : 0);
  rep.lifetime_ms = eph_now_ms() - sb->created_ms;
  rep.memory_peak_bytes = c.memory_peak_bytes;
  rep.oom_kills = c.oom_kills;
  rep.pids_refused = c.pids_refused;
  if (report) {
    uint32_t size = report->struct_size ? report->struct_size : sizeof rep;
    memcpy(report, &rep, size < sizeof rep ? size : sizeof rep);
    report->struct_size = size < sizeof rep ? size : sizeof rep;
  }
  int r = 0;
  char ktext[400], ltext[400];
  jail_cg_tally_text(&j->cg, &left, ltext, sizeof ltext);
  if (rep.processes_left || rep.files_left) {
    killed.groups = 0; /* the child groups still there are said once, with what is left */
    killed.truncated = false;
  }
  jail_cg_tally_text(&j->cg, &killed, ktext, sizeof ktext);
  if (rep.processes_left || rep.files_left)
    r = eph_error_set(err, EBUSY,
                      "sandbox %s: %d process(es) and %d file(s) left after destroy (%s%s; "
                      "killed %s; still listed %s)",
                      sb->run_id, rep.processes_left, rep.files_left,
                      init_gone ? "its init reaped" : "its init not reaped",
                      groups_left > 0 ? ", groups not removed" : "", ktext, ltext);
  else if (killed.procs || killed.groups)
    /* Nothing is left, but the groups held what the sandbox could not have put there. */
    j->host->log(EPH_LOG_WARN,
                 "sandbox %s: its groups held more than the sandbox at destroy: killed %s; "
                 "every group removed",
                 sb->run_id, ktext);
  close(sb->pidfd);
  free(sb);
  return r;
}

/* ------------------------------------------------------------ descriptor */

static const eph_backend_ops_t jail_ops = {
    .struct_size = sizeof(eph_backend_ops_t),
    .source = "Sandbox",
    .noun = "sandbox",
    .create = jail_create,
    .stats = jail_stats,
    .destroy = jail_destroy,
    .sweep = jail_sweep,
    /* SIGKILL of PID 1 ends every process of the sandbox; the guest's run directory is in
     * the sandbox's /tmp tmpfs, gone with its mount namespace. */
    .destroy_ends_guest = 1,
};

EPH_PLUGIN_EXPORT = {
    .abi_major = EPH_ABI_MAJOR,
    .abi_minor = EPH_ABI_MINOR,
    .struct_size = sizeof(eph_plugin_t),
    .name = "backend-jail",
    .kind = EPH_KIND_BACKEND,
    .version = "0.1.0",
    .description = "Sandbox of Linux namespaces (user, pid, mount, net, ipc, uts, cgroup) with "
                   "a tmpfs root, cgroup limits and ephemeral-guest as PID 1",
    .config_keys = jail_keys,
    .init = jail_init,
    .fini = jail_fini,
    .ops = &jail_ops,
};
