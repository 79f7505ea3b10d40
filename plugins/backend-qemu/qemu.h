/* backend-qemu internals shared by its files. Nothing here is exported: the plugin's only
 * public symbol is eph_plugin.
 *   qemu.c      the plugin: configuration, create/destroy/stats/sweep
 *   launch.c    starting QEMU: argv, the keeper, the accelerator, run directories
 *   ids.c       a microVM's own ids: who may give them, slots, QEMU's user and mount
 *               namespace, the copy of QEMU its uid cannot read
 *   snapshot.c  the snapshot store: identity, save, restore checks, garbage collection
 *   proc.c      small file and /proc helpers
 *   pool.c      restored microVMs kept loaded and paused for the next runs (key `pool`)
 *   qmp.c       the QMP client;  tap.c  the NIC of runs granting web */
#ifndef EPH_BACKEND_QEMU_H
#define EPH_BACKEND_QEMU_H

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <ephemeral/plugin.h>

#define MIB (1024ULL * 1024ULL)
#define QMP_TIMEOUT_MS 10000
#define SNAPSHOT_SAVE_MS 60000

typedef struct qemu_cfg {
  const char *qemu, *accel, *append;
  char *image_dir;
  int64_t kvm_probe_ms, memory_mib, min_memory_mib, max_memory_mib, max_vcpus;
  int64_t scratch_mib, max_scratch_mib, pids, max_pids, uid_base, slots;
  int64_t snapshot_max_bytes; /* the snapshot store's size limit (snapshot_gc) */
  int64_t tsc_khz;            /* configured host TSC rate for TCG guests, 0 = measure */
  int64_t pool; /* restored microVMs kept loaded and paused for the next runs (pool.c) */
  int snapshot, console_log;
} qemu_cfg_t;

typedef struct pool_vm pool_vm_t;

/* How microVMs get their ids (qemu_ids_mode, decided at the first create). */
typedef enum {
  QEMU_IDS_UNKNOWN = 0,
  QEMU_IDS_OWN,     /* CAP_SETUID + CAP_SETGID: a slot's uid/gid, non-dumpable (ids.c) */
  QEMU_IDS_SHARED,  /* neither capability, not root: QEMU runs as we do (logged once) */
  QEMU_IDS_REFUSED, /* one of the two, or root without them: no microVM starts */
} qemu_ids_t;

typedef struct qemu {
  const eph_host_t *host;
  qemu_cfg_t cfg;
  char *base;     /* <state_dir>/qemu */
  char *run_base; /* <state_dir>/qemu/run */
  char *snap_dir; /* <state_dir>/qemu/snapshots */
  char *slot_dir; /* <state_dir>/qemu/slots: slot-<k> records */
  char qemu_path[PATH_MAX];
  qemu_ids_t ids;                 /* how QEMU gets its ids (qemu_ids_mode, under lock) */
  bool exec_checked;              /* qemu_exec_copy ran (under lock) */
  char exec_copy[PATH_MAX];       /* a copy of QEMU only we may read (qemu_exec_copy), or "" */
  unsigned long long owner_start; /* our start time, in the slot records */
  int64_t tsc_khz;      /* host TSC rate for a cold-booting TCG guest (qemu_tsc_khz), -1 unknown */
  pthread_mutex_t lock; /* accel verdict, ids, exec copy, tsc_khz */
  char accel[8];        /* resolved: "kvm" or "tcg"; "" until the first create */
  bool kvm_noted;       /* said once that QEMU's uid cannot open /dev/kvm (under lock) */
  /* pool.c, all under pool_lock: the loaded microVMs, the limits they are made for, the
   * filler thread (started at the second restore of this process) and its stop flag. */
  pthread_mutex_t pool_lock;
  pthread_cond_t pool_cond;
  pool_vm_t **pool_vms;
  int pool_n;
  unsigned pool_seq, pool_restores;
  bool pool_started, pool_stop, pool_want_set;
  pthread_t pool_thread;
  struct launch_key {
    char accel[8];
    uint64_t memory_mib, tmp_mib;
    unsigned vcpus, pids;
  } pool_want;
} qemu_t;

/* One running QEMU: the keeper (our child, a small process that owns QEMU, enforces the
 * deadline and our lifetime; see keeper_main) and QEMU (the keeper's child). */
typedef struct vmproc {
  pid_t keeper, qemu;
  int lifeline; /* our end of the keeper's socketpair: closing it stops QEMU */
  int slot;     /* the slot held (QEMU runs as uid_base + slot), -1 none */
} vmproc_t;

/* The guest image's kernel and initramfs, opened and checked by qemu_image_open: QEMU reads
 * these descriptors (as /proc/self/fd/N), so what was checked is what it boots. */
typedef struct qemu_image {
  int kernel_fd, initrd_fd;
} qemu_image_t;

/* What one QEMU start needs. */
typedef struct launch {
  const char *name;  /* -name: "ephemeral-<run_id>" marks the process for sweep */
  const char *accel; /* "kvm" | "tcg" */
  uint64_t memory_mib;
  unsigned vcpus;
  uint64_t tmp_mib;
  unsigned pids;
  int incoming_fd;     /* snapshot to restore (positioned at its migration stream), or -1 */
  int64_t tsc_khz;     /* a cold boot under TCG: the host's TSC rate for the guest, 0 none */
  int64_t deadline_ms; /* the keeper kills QEMU then (CLOCK_MONOTONIC ms; 0 = never) */
  bool paused;         /* -S: a pooled restore stays paused after loading until `cont` */
  int log_fd;          /* QEMU's stdout/stderr (and the console when console_log) */
  int tap_fd;          /* the NIC's tap (tap.c), or -1: no NIC */
  char net[64];        /* with a tap: "eph_net=GUEST/32,PROXY" for the guest's eth0 */
  char mac[18];        /* with a tap: the NIC's MAC, locally administered */
  /* The image, opened and checked by the caller (borrowed), or NULL: launch_qemu opens it. */
  const qemu_image_t *image;
} launch_t;

/* A QMP connection over a connected stream socket (one end of a socketpair whose other end
 * QEMU got as `-chardev socket,fd=N -mon mode=control`). Zero-initialise, then qmp_open. */
typedef struct qmp {
  int fd;
  char buf[65536];
  size_t len;
} qmp_t;

/* Reads the greeting and negotiates capabilities before deadline_ms (CLOCK_MONOTONIC ms).
 * Takes ownership of fd (closed by qmp_close, also on failure). */
int qmp_open(qmp_t *q, int fd, int64_t deadline_ms, eph_error_t *err);
void qmp_close(qmp_t *q);

/* Runs one command. args (borrowed, may be NULL) is the "arguments" object. pass_fd >= 0 is
 * sent with the command as SCM_RIGHTS (for getfd). On success *ret (optional) receives the
 * "return" value (owned by the caller, json_object_put). A QMP "error" reply is -EIO with
 * its class and description in err. Events arriving meanwhile are dropped. */
int qmp_exec(qmp_t *q, const char *cmd, json_object *args, int pass_fd, int64_t deadline_ms,
             json_object **ret, eph_error_t *err);

/* Polls query-status until the VM's run state is none of `while_in` (NULL-terminated list,
 * e.g. {"inmigrate", NULL}); *state_out (optional, >= 32 bytes) gets the final state. */
int qmp_wait_status(qmp_t *q, const char *const *while_in, int64_t deadline_ms, char *state_out,
                    size_t state_size, eph_error_t *err);

/* Polls query-migrate until the outgoing migration completed (0) or failed (-EIO). */
int qmp_wait_migration(qmp_t *q, int64_t deadline_ms, uint64_t *bytes, eph_error_t *err);

/* tap.c: the microVM's NIC when a run grants web. */

struct nl_sock;

/* Creates a non-persistent tap (IFF_TAP | IFF_NO_PI) in a network namespace of its own (made
 * by a short-lived helper, see tap.c), gives it the proxy's address P/30 (from
 * spec->proxy_url), brings it up and hands the proxy's listener at P:PORT in that namespace to
 * spec->proxy_attach. Returns the tap's fd (O_CLOEXEC, owned by the caller: closing the last
 * copy removes the tap), *proxy = P in host order, name (>= IFNAMSIZ bytes) = the tap's name
 * and *nl a netlink socket of that namespace (nl_socket_free) for qemu_tap_exists. On failure
 * nothing is left and a negative errno is returned with err set. */
int qemu_tap_open(const eph_sandbox_spec_t *spec, uint32_t *proxy, char *name, struct nl_sock **nl,
                  eph_error_t *err);

/* True when an interface `name` exists in the namespace of nl (from qemu_tap_open). */
bool qemu_tap_exists(struct nl_sock *nl, const char *name);

/* proc.c: small file and /proc helpers. */

/* Writes text to path atomically (path.tmp, then rename), mode 0600. */
int write_file(const char *path, const char *text, eph_error_t *err);
/* Reads at most size - 1 bytes of path into buf, NUL-terminated; NULL if unreadable. */
char *read_small(const char *path, char *buf, size_t size);
/* The start time of pid (clock ticks since boot, /proc/PID/stat field 22), 0 if gone. */
unsigned long long start_time(pid_t pid);
bool alive(pid_t pid);
bool cmdline_has(pid_t pid, const char *arg);
int count_named(const char *name, bool kill_them);
int rm_tree(const char *dir);
int count_files(const char *dir);
void find_in_path(const char *prog, char *out, size_t size);
int uid_processes(uid_t uid, bool kill_them);
void log_tail(const char *dir, char *out, size_t size);

/* launch.c: starting and ending QEMU. */

/* The keeper: a small root process between us and QEMU (a forked copy of us, so only
 * async-signal-safe calls). It starts QEMU as its child, tells us QEMU's pid, then waits
 * for the first of: our end of the lifeline closing (destroy, or our death: the kernel
 * closes it whichever thread or process of ours dies) -> kill QEMU, reap, exit 0; QEMU
 * ending by itself -> reap, exit 1; the run's deadline -> kill QEMU, reap, exit 3. So the
 * deadline holds and QEMU goes within milliseconds even when we are SIGKILLed; and should
 * the keeper itself be killed, QEMU's PR_SET_PDEATHSIG takes QEMU along. */
enum { KEEPER_STOPPED = 0, KEEPER_QEMU_ENDED = 1, KEEPER_DEADLINE = 3, KEEPER_FAILED = 126 };

/* The host TSC rate in kHz a cold-booting TCG guest is told (tsc_early_khz): the key
 * tsc_khz, else measured once (~20 ms) at the first cold boot of this process, never at
 * init and never for a restore (the restored kernel calibrated long ago). 0 = unknown. */
int64_t qemu_tsc_khz(qemu_t *q);
/* The argument vector of one QEMU start; strings live in store (16 x 512 bytes). */
void build_argv(const qemu_t *q, const launch_t *l, char **argv, size_t max, char store[][512]);
/* Opens the guest image (vmlinuz, initrd.cpio in image_dir) for QEMU: each file without
 * blocking (a FIFO fails at once), checked to be a regular, non-empty file QEMU's uid may
 * read, the kernel a bzImage, ELF or multiboot image whose sizes fit in the file, the
 * initramfs a cpio archive (ending in its trailer) or compressed. 0 with both fds in *img
 * (qemu_image_close), or negative with err naming the file, what is wrong and how to build
 * the image (one line). */
int qemu_image_open(const qemu_t *q, qemu_image_t *img, eph_error_t *err);
void qemu_image_close(qemu_image_t *img);
int launch_qemu(const qemu_t *q, const launch_t *l, vmproc_t *vm, int *guest_fd, int *qmp_fd,
                eph_error_t *err);
int vm_stop(const qemu_t *q, vmproc_t *vm, int *left);
int boot_and_hello(const qemu_t *q, const char *dir, const launch_t *l, vmproc_t *vm, int *guest_fd,
                   qmp_t *qmp, int64_t deadline_ms, eph_error_t *err);
const char *resolve_accel(qemu_t *q, const launch_t *base);
int make_run_dir(const qemu_t *q, const char *run_id, char *dir, size_t size, int *log_fd,
                 eph_error_t *err);
/* Writes <dir>/pid: "QEMU_PID OWNER_PID OWNER_START QEMU_NAME" (the sweep kills QEMU, found
 * by its -name QEMU_NAME, once the owner is gone). */
int write_pid_record(const char *dir, const qemu_t *q, pid_t qemu_pid, const char *qemu_name,
                     eph_error_t *err);
/* Tells the keeper of vm the run's deadline (CLOCK_MONOTONIC ms, > 0): a pooled QEMU was
 * started before its run existed, so without one. */
int vm_set_deadline(const vmproc_t *vm, int64_t deadline_ms, eph_error_t *err);

/* ids.c: a microVM's own ids. */

/* How microVMs get their ids, from our effective capabilities (not from being root): decided
 * at the first call (the caller holds q->lock) and logged then unless QEMU_IDS_OWN. */
qemu_ids_t qemu_ids_mode(qemu_t *q);
/* Makes <state_dir>/qemu/bin/qemu, a copy of QEMU (0711, ours) that QEMU's uid may execute
 * but not read: exec'ing it makes QEMU non-dumpable. 0, or -1 (logged: QEMU stays dumpable). */
int qemu_exec_copy(const qemu_t *q);
/* A free slot for the microVM `name` (its record created O_EXCL in q->slot_dir), or a
 * negative errno with err set (EAGAIN: all in use). release_slot removes the record. */
int claim_slot(const qemu_t *q, const char *name, eph_error_t *err);
void release_slot(const qemu_t *q, int slot);
/* Async-signal-safe (the keeper and QEMU's child are forked copies of a threaded process);
 * each returns 0 or an errno and names the failed step in *what.
 * In QEMU's child: a new user namespace; 'u' on `sync`, then waits for the keeper's 'm';
 * a mount namespace of that user namespace's, slave of ours; exec_src (may be NULL) bound
 * over qemu_path. */
int ids_enter_namespaces(int sync, const char *exec_src, const char *qemu_path, const char **what);
/* In the keeper: the child's uid_map "ID ID 1" and gid_map "ID ID 1" (plus extra_gid onto
 * itself unless (gid_t)-1: the /dev/kvm group), needing our CAP_SETUID/CAP_SETGID. */
int ids_write_maps(pid_t child, uid_t id, gid_t extra_gid, const char **what);
/* No capability left, none ambient: what QEMU keeps through exec. */
int ids_drop_caps(void);
/* Writes "backend-qemu: WHAT failed: errno E" to fd (QEMU's log). */
void ids_log_errno(int fd, const char *what, int e);

/* pool.c: restored microVMs started ahead of their runs (key `pool`, default 1; 0 = none).
 * Each one is a QEMU restored from the snapshot under its own keeper and slot exactly like
 * a run's, left paused (-S) after loading; a create whose limits match takes one (it is
 * that run's alone: destroy kills it, it never returns to the pool) and the filler thread
 * starts a replacement. The filler starts at the second restore of a process (a CLI that
 * makes one sandbox never pays for a pool) and fills to `pool` for the limits last asked. */
struct pool_vm {
  struct launch_key key;
  char identity[65]; /* of the snapshot it was restored from: a take wants today's */
  vmproc_t vm;
  int guest_fd;
  qmp_t qmp;          /* greeted, the VM loaded and paused */
  char dir[PATH_MAX]; /* <run_base>/pool-<pid>-<n>, renamed to the run's at take */
  char name[64];      /* QEMU's -name: ephemeral-pool-<pid>-<n> */
};
/* A loaded microVM for the limits of l, removed from the pool (the caller owns it: it
 * becomes one run's sandbox), or NULL. Counts the restore and (re)starts the filler. */
pool_vm_t *pool_take(qemu_t *q, const launch_t *l);
/* Stops the filler and ends every pooled microVM (fini). */
void pool_fini(qemu_t *q);

/* snapshot.c: the snapshot store. */

/* The snapshot for the machine `l` describes, opened for a restore: validated against the
 * identity of its inputs (a file recording another identity is refused with a log line,
 * removed and rebuilt), built first when missing (one cold boot + save, serialised by a
 * lock so concurrent creates build it once; the store is then garbage-collected to
 * snapshot_max_bytes). Returns a read-only fd positioned at the migration stream, holding a
 * shared flock (in use: never pruned) and owned by the caller; negative errno with err set
 * when there is none (the caller cold-boots). */
int snapshot_open(qemu_t *q, const launch_t *l, int64_t deadline_ms, eph_error_t *err);
/* The identity (SHA-256, 64 hex + NUL) of the snapshot for the machine l describes: what
 * snapshot_open would look for now. 0, or negative errno. */
int snapshot_identity(const qemu_t *q, const launch_t *l, char hex[65]);
/* Lists the store (cache_list of eph_backend_ops_t): each() once per snapshot, least
 * recently used first. Returns the count, or negative errno. */
int snapshot_list(const qemu_t *q, eph_cache_each_fn each, void *ctx, eph_error_t *err);
/* Removes snapshots, least recently used first, until the store holds at most max_bytes
 * (< 0: snapshot_max_bytes); never one in use (a restore holds its flock) nor `keep` (a
 * file name, may be NULL). build_locked: the caller holds build.lock (else a save a crash
 * interrupted is only removed when no build runs). each (may be NULL) sees every removed one.
 * Returns how many were removed, or negative errno. */
int snapshot_gc(const qemu_t *q, int64_t max_bytes, const char *keep, bool build_locked,
                eph_cache_each_fn each, void *ctx, eph_error_t *err);

#endif
