/* backend-jail internals: shared between jail.c (the plugin: config, lifecycle, watchdog,
 * sweep), cgroup.c (cgroup v1/v2 limits and counters) and setup.c (the sandbox set-up run
 * by the cloned child, in plain order). Nothing here is exported: the plugin's only public
 * symbol is `eph_plugin`. */
#ifndef EPH_JAIL_H
#define EPH_JAIL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

#include <ephemeral/plugin.h>

#include "support/cleanup.h"

/* ------------------------------------------------------------ cgroups (cgroup.c) */

enum { JAIL_CG_MEMORY = 0, JAIL_CG_PIDS = 1, JAIL_CG_CPU = 2, JAIL_CG_N = 3 };

/* The cgroup layout detected once at init. v1: one hierarchy per controller
 * (<root>/memory/<parent>, <root>/pids/<parent>, <root>/cpu/<parent>); v2: one
 * (<root>/<parent>), then n_dirs == 1. parent_fd[] are O_PATH|O_DIRECTORY fds of the
 * `ephemeral` parents so a create only does mkdirat/openat relative to them. */
typedef struct jail_cgroups {
  bool v2;
  bool memsw;                   /* v1 memory.memsw.* present (swap accounting) */
  bool kmem;                    /* v1 memory.kmem.limit_in_bytes present */
  bool swap_max;                /* v2 memory.swap.max present */
  bool has_kill;                /* v2 cgroup.kill present */
  int n_dirs;                   /* 3 (v1) or 1 (v2) */
  char *parent_path[JAIL_CG_N]; /* owned */
  int parent_fd[JAIL_CG_N];
  char *root; /* the hierarchies' mount point ("/sys/fs/cgroup"); owned */
  /* v1: every controller's mount shows its hierarchy from our cgroup namespace's root, so
   * /proc/thread-self/cgroup's paths name directories under it (jail_cg_enter_thread) */
  bool thread_paths_ok;
} jail_cgroups_t;

/* cgroup v1: the groups a thread was in before jail_cg_enter_thread moved it, one O_PATH
 * directory fd per controller (-1: unused). */
typedef struct jail_cg_home {
  int fd[JAIL_CG_N];
} jail_cg_home_t;

/* Limits after defaults and operator maxima were applied. */
typedef struct jail_limits {
  uint64_t memory_bytes;
  uint32_t pids;
  uint32_t cpu_percent;
  uint32_t nofile;
  uint64_t scratch_bytes;
} jail_limits_t;

/* v1: the TCP buffer limit (memory.kmem.tcp.limit_in_bytes) of a sandbox whose memory
 * limit is memory_bytes is memory_bytes / JAIL_TCP_SHARE_DIVISOR. On v1 socket buffers are
 * a separate counter, not part of memory.usage_in_bytes, so an eighth of the memory limit
 * is given to them on top. The kernel still lets each socket queue one packet past the
 * limit (forced charges); setup.c keeps those packets small (loopback MTU and GSO size),
 * so their sum stays below what the sockets themselves cost in the memory limit. On v2
 * sockets are charged to memory.max itself and this is unused. */
#define JAIL_TCP_SHARE_DIVISOR 8

/* Pseudo-terminals one sandbox may hold (its devpts instance's max=): the pool is host-wide.
 * A shell, an editor and a few script(1) sessions fit; 16 sandboxes' worth is 256 of 3072. */
#define JAIL_MAX_PTYS 16

/* inotify/fanotify objects one sandbox may hold (its user namespace's /proc/sys/user limits):
 * they are counted against the daemon's uid host-wide (fs.inotify.max_user_instances = 128,
 * max_user_watches, fanotify's 128 groups), not against the sandbox's memory. */
#define JAIL_MAX_INOTIFY_INSTANCES 16
#define JAIL_MAX_INOTIFY_WATCHES 8192
#define JAIL_MAX_FANOTIFY_GROUPS 4
#define JAIL_MAX_FANOTIFY_MARKS 1024
/* The empty directory of the new root that is every read-only overlay's second lower
 * layer (setup.c add_host_path). */
#define JAIL_OVERLAY_EMPTY "/.empty"
#define JAIL_STR_(x) #x
#define JAIL_STR(x) JAIL_STR_(x)

typedef struct jail_counters {
  uint64_t memory_peak_bytes;
  uint64_t oom_kills;
  uint64_t pids_refused;
} jail_counters_t;

/* Detects v1/v2 under root ("/sys/fs/cgroup"), creates the `parent` group in each
 * controller used (memory, pids, cpu) and enables controllers for v2. 0 or negative+err. */
int jail_cg_init(jail_cgroups_t *cg, const char *root, const char *parent, eph_error_t *err);
void jail_cg_fini(jail_cgroups_t *cg);
/* Creates the run's group(s) and writes the limits. On failure removes what it made.
 * memory_later (cgroup v1 only): the memory limit is left unlimited for
 * jail_cg_limit_memory to write once the child is born, because a thread of this process
 * stepping into the group (jail_cg_enter_thread) has the clone's kernel memory (the child's
 * copy of this process's page tables) charged there: under a limit too small for it, the
 * group's OOM killer would pick the only task it holds, this process. */
int jail_cg_create(jail_cgroups_t *cg, const char *name, const jail_limits_t *lim,
                   bool memory_later, eph_error_t *err);
/* cgroup v1: writes the memory limits jail_cg_create(memory_later) left out, before the
 * child runs anything. 0, or negative + err (a limit below the group's usage is refused:
 * EBUSY, with the usage named). A no-op on v2. */
int jail_cg_limit_memory(jail_cgroups_t *cg, const char *name, const jail_limits_t *lim,
                         eph_error_t *err);
/* cgroup v2: an fd of the run's group for clone3's CLONE_INTO_CGROUP (the child starts in
 * it: no migration, which on a busy host waits for the cgroup_threadgroup_rwsem writer's RCU
 * grace period); the caller closes it. -1 on v1 (one group per controller, and v1 groups
 * cannot be a clone target) or on error. */
int jail_cg_clone_fd(jail_cgroups_t *cg, const char *name);
/* cgroup v1: moves the calling thread, and only it, into the run's groups by writing "0"
 * to each group's `tasks` (the kernel migrates `current` without taking the global
 * cgroup_threadgroup_rwsem for writing, so without the RCU grace period a cgroup.procs
 * write waits for: ~0.2 ms instead of 5-25 ms here, and no cgroup_mutex held meanwhile).
 * A process the thread then clone()s is born in the run's groups, with their limits
 * already written but the memory limit (jail_cg_create's memory_later). First checks that the
 * thread may move back (a no-op move into each of its own groups, which a daemon without write
 * access to them fails): home receives those groups. Returns 0 (the caller then must call
 * jail_cg_leave_thread from the same thread), or negative + err with the thread where it was (home
 * closed): the caller falls back to jail_cg_attach. */
int jail_cg_enter_thread(jail_cgroups_t *cg, const char *name, jail_cg_home_t *home,
                         eph_error_t *err);
/* Moves the calling thread back to home's groups and closes home. 0, or negative + err
 * when a move failed (the thread is then moved to the hierarchy's root group, so it never
 * stays in a sandbox's group; the caller fails the create). */
int jail_cg_leave_thread(jail_cgroups_t *cg, jail_cg_home_t *home, eph_error_t *err);
/* Moves pid into the run's group(s). */
int jail_cg_attach(jail_cgroups_t *cg, const char *name, pid_t pid, eph_error_t *err);
/* Reads the counters (missing files read as 0). */
int jail_cg_counters(jail_cgroups_t *cg, const char *name, jail_counters_t *out, eph_error_t *err);
/* The counter files of one run's group(s), opened once (jail_cg_counters_open) and re-read
 * from offset 0 before and after every command (cgroup files regenerate their text at
 * offset 0): three preads instead of five opens, six reads and five closes per command.
 * An fd is -1 where its file is missing (it then reads as 0). */
typedef struct jail_counter_fds {
  int oom, peak, pids;
} jail_counter_fds_t;
#define JAIL_COUNTER_FDS_NONE ((jail_counter_fds_t){-1, -1, -1})
/* 0, or negative + err when the group is gone; fds is then all -1. */
int jail_cg_counters_open(jail_cgroups_t *cg, const char *name, jail_counter_fds_t *fds,
                          eph_error_t *err);
void jail_cg_counters_read(const jail_cgroups_t *cg, const jail_counter_fds_t *fds,
                           jail_counters_t *out);
void jail_cg_counters_close(jail_counter_fds_t *fds);
/* What a walk of a run's groups found: every controller's run group and its descendants
 * (child groups, depth first, within the walk's bounds: cgroup.c WALK_MAX_*). */
typedef struct jail_cg_tally {
  int procs;             /* distinct processes (a v1 sandbox's process is in 3 groups) */
  int in_ctl[JAIL_CG_N]; /* of them listed in each controller's subtree (v2: [0]) */
  int in_children;       /* of them listed in a group below the run's */
  int host;              /* of them host processes, which are never killed */
  int groups;            /* groups found below the run's (all controllers) */
  bool truncated;        /* a bound stopped the walk: more may be there */
} jail_cg_tally_t;
/* SIGKILLs every process listed in the run's group(s) and their descendants but host
 * processes (those in our pid namespace: a creator's thread stepping in, see
 * jail_cg_enter_thread) until none but host processes is left or timeout_ms passed; on v2
 * first writes the run group's cgroup.kill where there is one (the whole subtree). Returns
 * how many processes are still listed (0 = empty, or the group does not exist); killed
 * (may be NULL) receives what was SIGKILLed, left (may be NULL) what is still listed. */
int jail_cg_kill_all(jail_cgroups_t *cg, const char *name, int timeout_ms, jail_cg_tally_t *killed,
                     jail_cg_tally_t *left);
/* True when a process of the group has a live parent outside it (other than pid 1), or is
 * itself a host process (a creator stepping in): the host process that owns the sandbox is
 * alive, whatever its slot record says. Reads the run's pids group alone (v2: its group):
 * every process of a sandbox is there, never only in another controller's group or in a
 * child group (it can make and join neither), so one found only there was put there from
 * outside, and is killed by the sweep rather than taken for a live owner's witness. */
bool jail_cg_has_live_parent(jail_cgroups_t *cg, const char *name);
/* Number of distinct processes listed in the run's group(s) and their descendants; 0 when
 * absent. out (may be NULL) receives the tally. */
int jail_cg_count(jail_cgroups_t *cg, const char *name, jail_cg_tally_t *out);
/* rmdir()s the run's group(s), retrying EBUSY for up to timeout_ms; a group refused is
 * walked and its child groups removed bottom-up first (a clean run's groups, which have
 * none, are only rmdir()ed). Returns how many group directories still exist afterwards,
 * child groups included. */
int jail_cg_remove(jail_cgroups_t *cg, const char *name, int timeout_ms);
/* "N process(es) (memory a, pids b, cpu c; k in child groups), h host process(es) spared;
 * the run's groups had g child group(s)" (the parts that apply) in buf; its length. */
int jail_cg_tally_text(const jail_cgroups_t *cg, const jail_cg_tally_t *t, char *buf, size_t size);
/* Calls fn for every run group found under the parent(s) (deduplicated by name). */
int jail_cg_list(jail_cgroups_t *cg, void (*fn)(void *opaque, const char *name), void *opaque);

/* ------------------------------------------------------------ egress (net.c) */

/* The child's step 0 of a run granting web: makes a NETLINK_ROUTE socket (bound) and an
 * unbound TCP socket in its netns and sends both on go_fd (eph_fds_send, tag 'n'). System
 * calls only. Returns 0, or -errno with *step naming what failed. */
int jail_net_child_sockets(int go_fd, const char **step);
/* The parent's side (see net.c for every rule), after the uid maps and before "go": receives
 * the child's sockets on go_fd (until deadline_ms), puts P/32 on the sandbox's lo, binds the
 * TCP socket to P:PORT of spec->proxy_url, listens and hands it to spec->proxy_attach. On
 * failure nothing of it is left with the parent (the sandbox's netns goes with the child). */
int jail_net_setup(const eph_sandbox_spec_t *spec, int go_fd, int64_t deadline_ms,
                   eph_error_t *err);

/* ------------------------------------------------------------ set-up plan (setup.c) */

/* One step of building the new root, precomputed at init so the cloned child only does
 * system calls (it is a fork of a possibly multi-threaded process: no malloc, no stdio). */
typedef enum jail_op_kind {
  JAIL_OP_DIR = 1,        /* mkdir target */
  JAIL_OP_SYMLINK = 2,    /* symlink(source -> target) */
  JAIL_OP_BIND_RO = 3,    /* bind mount host source on target (dir or file), read-only */
  JAIL_OP_BIND_DEV = 4,   /* bind a host device node on target (file), nosuid, noexec */
  JAIL_OP_FILE = 5,       /* write data to target, mode 0644 */
  JAIL_OP_OVERLAY_RO = 6, /* read-only overlay of host directory source on target (data: its
                           * mount options): the sandbox gets inodes of its own */
  /* The entry source (relative) of group `group`'s overlay bound on target (dir or file), as
   * its overlay made it: read-only, nosuid, nodev. When that overlay could not be mounted:
   * an overlay of its own (data: its options) for a directory, a read-only bind of the host
   * file target otherwise. */
  JAIL_OP_GROUP_BIND = 7,
} jail_op_kind_t;

/* One read-only overlay of a host directory (/usr, /etc) per sandbox, from which that
 * directory's entries are bound (JAIL_OP_GROUP_BIND): their inodes are the sandbox's own,
 * as with one overlay per entry, but the sandbox's teardown frees one overlay per group, and
 * each freed overlay waits for an RCU grace period. It is mounted in a small tmpfs on the
 * new root's mount point before the root itself is mounted over it (setup.c mount_groups),
 * so it is never reachable in the sandbox: it leaves with the host's mounts at pivot_root. */
#define JAIL_MAX_GROUPS 2
typedef struct jail_group {
  char name[8];   /* the host directory without its '/' ("usr"), its place in the tmpfs */
  char opts[160]; /* overlay options: lowerdir=/usr:<newroot>/.empty */
} jail_group_t;

typedef struct jail_op {
  jail_op_kind_t kind;
  bool is_dir;        /* for binds: the source is a directory */
  unsigned long keep; /* for binds: MS_* flags of the source mount that must be kept */
  int group;          /* JAIL_OP_GROUP_BIND: index into plan->groups */
  char *source;       /* host path or symlink text; owned */
  char *target;       /* path inside the new root, absolute ("/usr"); owned */
  char *data;         /* JAIL_OP_FILE content; owned */
  size_t bytes;
} jail_op_t;

typedef struct jail_plan {
  jail_op_t *ops;
  size_t n_ops;
  char *newroot; /* where the root tmpfs is mounted in the child's mount ns */
  char *hostname;
  jail_group_t groups[JAIL_MAX_GROUPS];
  size_t n_groups;
  uint32_t shm_bytes;
  unsigned char lo_msg[256]; /* RTM_NEWLINK "lo up", built once (plan.c) */
  size_t lo_msg_bytes;
} jail_plan_t;

/* The default of the `usr_binds` key: the /usr entries a guest image needs (programs,
 * libraries, helper executables, architecture-independent data such as zoneinfo, terminfo
 * and the CA certificates /etc/ssl points into). Never /usr/local: a default `make install`
 * puts ephemeral's own configuration in /usr/local/etc. */
#define JAIL_USR_BINDS_DEFAULT "bin", "sbin", "lib", "lib64", "libexec", "share"

/* Checks one `usr_binds` entry: a relative path under /usr without "." or ".." parts,
 * neither "local" nor "etc" nor anything under "local/etc" or "etc" (configuration). 0 or
 * negative + err naming the entry. */
int jail_usr_bind_check(const char *entry, eph_error_t *err);

/* Builds the plan: an empty /usr holding read-only binds of the `usr_binds` entries
 * (NULL-terminated, each checked with jail_usr_bind_check; a missing host path is skipped),
 * /bin.. (symlinks recreated), /etc basics, /dev nodes; `etc_binds` extra /etc entries
 * (NULL-terminated). 0 or negative + err. */
int jail_plan_build(jail_plan_t *plan, const char *hostname, uint64_t shm_bytes,
                    const char *const *usr_binds, const char *const *etc_binds, eph_error_t *err);
void jail_plan_free(jail_plan_t *plan);

/* What the child needs beyond the plan; all of it set before clone(). */
typedef struct jail_child_args {
  const jail_plan_t *plan;
  int go_fd;    /* socket: the parent sends one byte once maps and cgroups are set */
  int err_fd;   /* write end, CLOEXEC: a jail_child_error_t on failure, EOF on exec */
  int guest_fd; /* the sandbox end of the socketpair: becomes fd JAIL_GUEST_FD */
  int exe_fd;   /* O_PATH fd of the ephemeral-guest binary */
  /* pidfd of the host process (-1: none): readable once it died. The child's fd table is
   * a copy of the host's, so are those of every child cloned meanwhile: another sandbox's
   * child still in its set-up holds the host's end of this child's go socket, and a hang-up
   * on it does not tell the host's death (two children each holding the other's wait for
   * their 'g' forever after a kill -9). */
  int host_pidfd;
  uint64_t scratch_bytes;
  uint64_t memory_bytes; /* shown as MemTotal in the sandbox's /proc/meminfo */
  char boot_id[40];      /* this sandbox's /proc/sys/kernel/random/boot_id (a UUID) */
  uint32_t nofile;
  int network;      /* the run grants web: step 0 sends the proxy's sockets (net.c) */
  int close_fds[3]; /* the parent's ends, inherited by clone: closed first */
  /* Cloned with CLONE_VM (jail_clone3_vm): the child's first act is one byte 's' on go_fd,
   * telling the host's helper thread the child exists (its pid and pidfd are written), since
   * the cloning thread sleeps until the child's exec. */
  int announce;
  /* The child's own state, written in its copy of these arguments only (never in the
   * host's: with CLONE_VM the host's memory is the child's). */
  int groups_fd;                  /* O_PATH of the tmpfs holding the groups' overlays */
  bool group_up[JAIL_MAX_GROUPS]; /* that group's overlay is mounted */
} jail_child_args_t;

#define JAIL_GUEST_FD 3

typedef struct jail_child_error {
  int errnum;
  char step[200];
} jail_child_error_t;

/* The child's whole life: runs the set-up steps in order and execs the guest as PID 1.
 * Never returns; reports the failed step on err_fd and _exit()s. */
__attribute__((noreturn)) void jail_child_main(const jail_child_args_t *a);

/* ------------------------------------------------------------ clone_vm.c */

struct clone_args;
/* clone3(ca) with fn(arg) run in the child on the stack ca->stack/stack_size (16-byte
 * aligned top), exiting with fn's result if it returns: for CLONE_VM | CLONE_VFORK, the
 * way posix_spawn clones. Returns the child's pid in the parent, or -1 with errno (ENOSYS
 * where jail_clone3_vm_supported is false: an architecture without the few instructions
 * it takes, see clone_vm.c). */
long jail_clone3_vm(struct clone_args *ca, int (*fn)(void *), void *arg);
extern const bool jail_clone3_vm_supported;

/* ------------------------------------------------------------ plugin state (jail.c) */

struct eph_sandbox {
  struct eph_sandbox *next, *prev; /* the watchdog's list, under jail_t.lock */
  char run_id[128];
  int slot;
  pid_t pid;
  int pidfd;
  int64_t created_ms;
  int64_t deadline_ms;
  bool deadline_hit;
  jail_counter_fds_t counters; /* opened by the first stats(), closed by destroy() */
};

typedef struct jail {
  const eph_host_t *host;
  jail_cgroups_t cg;
  jail_plan_t plan;
  jail_limits_t def, max;
  uint64_t uid_base;
  uint32_t slots;
  char *run_dir;
  int run_dir_fd;
  char *guest_path;
  int exe_fd;
  pid_t owner_pid;
  uint64_t owner_start;
  int dumpable;    /* PR_GET_DUMPABLE at init: restored once no CLONE_VM child is left */
  int vm_children; /* CLONE_VM children maybe still on this process's mm; under lock */

  pthread_mutex_t lock;
  pthread_cond_t cond;
  pthread_t watchdog;
  /* watchdog_running: the thread is in its loop; watchdog_joinable: a thread was started
   * and not yet joined (it may have ended: it does when no sandbox is left). */
  bool watchdog_running, watchdog_joinable, stopping;
  struct eph_sandbox *live;
} jail_t;

/* The watchdog (watchdog.c): jail_watch adds a created sandbox to the live list (starting
 * the thread if none runs; 0 or negative + err), jail_unwatch removes it (the thread ends
 * when the list is empty). */
int jail_watch(jail_t *j, struct eph_sandbox *sb, eph_error_t *err);
void jail_unwatch(jail_t *j, struct eph_sandbox *sb);

/* ------------------------------------------------------------ slot records, sweep (slots.c) */

/* Field 22 of /proc/<pid>/stat: start time in clock ticks since boot; with the pid it names
 * one process for good (pids are reused). 0 when the process does not exist. */
uint64_t jail_proc_start_time(pid_t pid);
/* Claims a free slot for run_id: writes the record "slot-<n>" (run id, owner pid and start
 * time) in run_dir with O_EXCL, so two processes never take the same slot. Returns the slot
 * or a negative errno (-EAGAIN when all are in use). */
int jail_slot_claim(jail_t *j, const char *run_id, eph_error_t *err);
/* Removes the record of slot: 0 (also when it was not there), or -errno. From then on the
 * slot's file may be another create's: what is left is this answer, not a look at it. */
int jail_slot_release(jail_t *j, int slot);
/* The backend's sweep: reaps the cgroups of sandboxes whose owner died and drops their
 * records. Returns how many runs were reaped, or a negative errno. */
int jail_sweep(void *state, eph_error_t *err);
/* True when id is a run id this backend accepts (it names cgroups and records). */
bool jail_valid_run_id(const char *id);

/* ------------------------------------------------------------ spawn.c */

/* Host ids per slot: a sandbox's uids and gids 0..65535 map to uid_base + slot * this. */
#define JAIL_IDS_PER_SLOT 65536ULL

/* What the host does between the clone and the child's exec: the same steps whichever
 * thread does them (the cloning thread after a copying clone; a helper thread while the
 * cloning thread sleeps in a CLONE_VM | CLONE_VFORK clone). */
typedef struct jail_parent_side {
  jail_t *j;
  const eph_sandbox_spec_t *spec;
  eph_sandbox_t *sb; /* pid: set before parent_side runs; pidfd: written by the clone */
  const jail_limits_t *lim;
  int go_fd, err_fd; /* the host's ends: go[1], errp[0] */
  int64_t limit_ms;  /* set-up deadline (CLOCK_MONOTONIC ms, eph_now_ms) */
  /* Both written by the cloning thread after the CLONE_VM helper started (it must start
   * before that thread steps into the run's groups) and read by the helper once the child's
   * 's' came: ordered by the kernel (the writes, the clone, the child's send, the helper's
   * recv), which the language and ThreadSanitizer do not see; atomics state the order. */
  _Atomic bool born_in_group;
  _Atomic bool limit_memory; /* write the v1 memory limit first (the cloning thread is out) */
  int *child_ends[3];        /* the child's ends in this process, closed once it has its own */
  /* CLONE_VM only: */
  int wake_fd;        /* eventfd: the cloning thread's clone returned */
  volatile pid_t tid; /* CLONE_PARENT_SETTID: the child's pid, before it runs */
  int r;              /* the helper's result, and its error */
  eph_error_t err;
} jail_parent_side_t;

/* The failed step the child wrote on the error pipe, if any (the pipe is readable: a
 * record, or EOF once the child exec'd or died): negative with err naming it, or 0. */
int jail_child_error(int err_fd, const char *run_id, eph_error_t *err);
/* Closes the child's ends still open in this process (ps->child_ends), setting them -1. */
void jail_close_child_ends(jail_parent_side_t *ps);
/* Maps the child's ids, gives it its network and cgroups and lets it through steps 1 and 9
 * (setup.c). 0, or negative with ps->err. */
int jail_parent_side(jail_parent_side_t *ps);

/* A clone without a copy of this process (CLONE_VM | CLONE_VFORK; spawn.c says why). */
typedef struct jail_vm_clone {
  struct jail_parent_side *ps;
  pthread_t helper;
  int wake_fd;
} jail_vm_clone_t;
/* Starts the helper thread that does ps's host side while the clone sleeps: true, or false
 * (nothing started) where CLONE_VM is not available or the thread cannot start. Called
 * before the cloning thread steps into the run's cgroups (a thread is born in its
 * creator's). */
bool jail_vm_clone_begin(jail_vm_clone_t *vc, jail_parent_side_t *ps);
/* Clones the child with CLONE_VM | CLONE_VFORK running jail_child_main(args) (args->announce
 * set), returning after its exec or exit; then wakes and joins the helper. The child's
 * pid, or -1 with errno; ps->r and ps->err carry the helper's result. */
long jail_vm_clone_run(jail_vm_clone_t *vc, struct clone_args *ca, jail_child_args_t *args);
/* After a jail_vm_clone_run that returned a pid: its child is off this process's mm (the
 * error pipe's EOF: its exec's close-on-exec, or its exit, came after the mm's switch or
 * release; or it was reaped). The last such puts the host's dumpable flag back. */
void jail_vm_release(jail_t *j);

#endif
