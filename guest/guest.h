/* Internal interface of ephemeral-guest between its event loop (guest.c), the commands
 * (exec.c), the worker start-up (worker.c) and the file operations (files.c). Not installed. */
#ifndef EPH_GUEST_H
#define EPH_GUEST_H

#include <ftw.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#include <json-c/json.h>
#include <linux/filter.h>
#include <seccomp.h>

#include "protocol.h"

/* What the forked child needs to become the worker and exec the command. Everything is
 * prepared by the parent before the spawn so the child only makes system calls. */
typedef struct guest_worker_spec {
  uid_t uid;
  gid_t gid;
  const char *cwd;   /* absolute; chdir()ed as the worker */
  char *const *argv; /* argv[0] is looked up in PATH of envp when it has no '/' */
  char *const *envp;
  int stdin_fd, stdout_fd, stderr_fd;
  /* A failed set-up's "step: error", written by the child into the caller's memory (they
   * share it until the child's execve: CLONE_VM), as posix_spawn reports its errno; left
   * empty when the command was exec'd. */
  char *failed;
  size_t failed_size;
  rlim_t nofile;                     /* RLIMIT_NOFILE soft and hard */
  const struct guest_filter *filter; /* installed last, after no_new_privs (or inherited) */
  /* The guest leads a session of its own, without a controlling terminal: the worker
   * takes a process group of its own in it (setpgid) instead of a session (setsid, which
   * also makes a scheduler autogroup per command). */
  bool guest_session;
  bool guest_batch; /* the guest runs SCHED_BATCH: the worker goes back to SCHED_OTHER */
} guest_worker_spec_t;

/* The worker's seccomp filter: the rules of guest/filter.c, compiled to BPF by libseccomp
 * when the guest is built (guest/gen-filter), loaded at start-up (guest_seccomp_compile),
 * never again per command. */
typedef struct guest_filter {
  struct sock_fprog prog; /* exactly what libseccomp's seccomp_load() would install */
  /* Installed on the guest itself (the jail: guest_seccomp_install at start-up), so every
   * worker inherits it at fork and has it from its first instruction on. False in a
   * microVM, whose guest needs reboot() and clock_settime(): there each worker installs
   * prog itself, last, after no_new_privs. */
  bool on_guest;
} guest_filter_t;

/* Builds the seccomp filter every worker command runs under (see guest/filter.c for the
 * list). Returns NULL with why filled on failure. Release with seccomp_release(). */
scmp_filter_ctx guest_seccomp_build(char *why, size_t why_size);
/* guest_seccomp_build() compiled to BPF by libseccomp (seccomp_export_bpf) into out->prog
 * (heap), out->on_guest false. 0, or -errno with why filled. In guest/filter.c: what
 * guest/gen-filter runs at build time and a cross-compiled guest at start-up. */
int guest_seccomp_generate(guest_filter_t *out, char *why, size_t why_size);
/* The filter the guest installs into out->prog (heap; the guest keeps it for its
 * lifetime), out->on_guest false: the program generated when the guest was built
 * (guest/guest-filter.h), or guest_seccomp_generate()'s where none was. 0, or -errno with
 * why filled. */
int guest_seccomp_compile(guest_filter_t *out, char *why, size_t why_size);
/* What seccomp_load() does with a filter of default attributes: PR_SET_NO_NEW_PRIVS, then
 * seccomp(SECCOMP_SET_MODE_FILTER, 0, prog) (prctl(PR_SET_SECCOMP) on a kernel without
 * seccomp(2)). For the calling thread and whatever it forks later. 0 or -errno. */
int guest_seccomp_install(const struct sock_fprog *prog);

/* Empties the capability bounding set of the calling process (dropping only what is still
 * in it) and clears the ambient set. The guest's own effective and permitted sets are
 * untouched: the set only bounds what an execve() could grant. 0 or -errno. */
int guest_drop_bounding_set(void);

/* Signals the guest ignores (SIG_IGN survives execve, so every worker puts these back to
 * SIG_DFL). The guest resets every other disposition it inherited at start-up and sets no
 * handler (it reads signals from a signalfd), so these are all a worker must reset. */
extern const int guest_ignored_signals[];
extern const size_t guest_n_ignored_signals;

/* Resource limits the guest sets on itself at start-up, soft = hard, so every worker
 * inherits them and cannot raise them (see worker.c): RLIMIT_CORE 0, RLIMIT_SIGPENDING and
 * RLIMIT_MSGQUEUE small. 0 or -errno with *which naming the limit. */
int guest_set_inherited_limits(const char **which);

/* In the forked child: new session, fds, rlimits, oom_score_adj, every capability dropped,
 * uid/gid switched, no_new_privs, seccomp, exec. Never returns: on any failure it writes
 * "step: strerror" to spec->failed and _exit(126)s, so a half-dropped child never runs
 * code. */
__attribute__((noreturn)) void guest_worker_exec(const guest_worker_spec_t *spec);
/* Starts a child that runs guest_worker_exec(spec) (clone with CLONE_VM | CLONE_VFORK: the
 * caller resumes once the child has exec'd or exited; spec must stay valid until then, as
 * it does on the caller's stack). The child's pid, or -1 with errno (EAGAIN: pids limit). */
pid_t guest_worker_spawn(const guest_worker_spec_t *spec);

/* File operations of the protocol (write_file, read_file, list_dir), confined beneath the
 * scratch directory and done with the worker's filesystem identity. Each returns a reply
 * object (owned by the caller) of type "ok"/"data"/"entries", or NULL with *err_no and why
 * filled for an "error" reply. */
typedef struct guest_fs {
  int scratch_fd;      /* O_PATH|O_DIRECTORY of scratch */
  const char *scratch; /* its absolute path */
  uid_t uid;
  gid_t gid;
} guest_fs_t;

json_object *guest_fs_write(const guest_fs_t *fs, json_object *req, int *err_no, char *why,
                            size_t why_size);
json_object *guest_fs_read(const guest_fs_t *fs, json_object *req, int *err_no, char *why,
                           size_t why_size);
json_object *guest_fs_list(const guest_fs_t *fs, json_object *req, int *err_no, char *why,
                           size_t why_size);

/* ---------------------------------------------------------------- the event loop's state
 * Shared by the protocol loop and start-up (guest.c) and the commands (exec.c). */

#define ENOSPC_CARRY 32

typedef struct job {
  int64_t id;
  pid_t pid; /* the command's main process, leader of its own group (it may leave it) */
  bool reaped;
  int status;
  int out_fd, err_fd, in_fd; /* guest ends; -1 once closed */
  /* The step at which the worker's set-up failed ("" when it exec'd the command), written
   * by the worker into memory the guest shares with it (guest_shared_failed: a MAP_SHARED
   * page, so a forked worker's write reaches the guest as a vfork'd one's does), read and
   * reported (as an error reply) when the worker is reaped. */
  char *setup_failed;
  unsigned char *stdin_buf;
  size_t stdin_len, stdin_off;
  int64_t start_ms, deadline_ms;
  uint64_t bytes[3]; /* per stream, index 1 and 2 */
  bool timed_out, killed, enospc_seen;
  uint64_t oom_kills_before; /* --vm: the kernel's oom_kill count when the command started */
  char carry[ENOSPC_CARRY];
  size_t carry_len;
} job_t;

typedef struct guest {
  int ctl;
  eph_frame_reader_t rd;
  int sigfd;
  bool pid1, vm;
  bool session; /* leader of a session without a terminal (setsid at start-up) */
  bool batch;   /* SCHED_BATCH (see main) */
  uid_t uid;
  gid_t gid;
  char rundir[PATH_MAX];
  char scratch[PATH_MAX + 16];
  const char *tmp; /* where run directories are made (--tmp) */
  guest_fs_t fs;
  uint32_t default_timeout_ms;
  rlim_t nofile;
  guest_filter_t filter;
  int devnull; /* /dev/null, read-only: the stdin of a command given none (-1: a pipe) */
  job_t *job;
  unsigned char chunk[EPH_PROTO_OUTPUT_CHUNK_BYTES];
} guest_t;

/* A line "ephemeral-guest: ..." on stderr (the console or the jail's log). */
void guest_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* CLOCK_MONOTONIC in milliseconds. */
int64_t guest_now_ms(void);
/* Sends a frame and frees obj. The host going away (EPIPE or any write error) ends the
 * sandbox; a reply over the frame limit is dropped with a log line. */
void guest_send_frame(guest_t *g, json_object *obj);
/* A new message {"type": type} with "id" when with_id; owned by the caller. */
json_object *guest_new_msg(const char *type, int64_t id, bool with_id);
/* Sends an "error" reply to req (its id, if any) with errno, message and, if fatal, "fatal". */
void guest_send_error(guest_t *g, json_object *req, int err_no, const char *message, bool fatal);

/* The commands (exec.c). */
/* Starts the command of an "exec" request as the worker; replies "error" when it cannot. */
void guest_op_exec(guest_t *g, json_object *req, int64_t id);
/* Writes what the pipe takes of the running command's pending stdin. */
void guest_feed_stdin(job_t *j);
/* Reads one chunk of the running command's stream (1 stdout, 2 stderr) and sends it. Returns
 * false at end of stream or when nothing is available (the fd is non-blocking). */
bool guest_forward_chunk(guest_t *g, int stream);
/* Called when the command's main process was reaped: forwards what its pipes still hold,
 * closes them and sends the "exit". */
void guest_finish_job(guest_t *g);
/* Reaps every exited child (orphans included), noting the command's status. */
void guest_reap(guest_t *g);
/* Kills every process of the sandbox but the guest itself, then reaps them (bounded); never
 * kill(-1) outside a pid namespace (see exec.c). */
void guest_kill_everything(guest_t *g);
/* Kills the running command j (NULL or reaped: nothing): its process group, and its main
 * process by pid, which may have left that group (workers share the guest's session, so
 * setpgid() can move one into another worker's group: red team 7's command outlived its
 * timeout so, and the host gave up on the guest). Its pid is still its own until reaped. */
void guest_kill_job(job_t *j);
/* nftw() callback removing one entry (the run directory's tree, depth first). */
int guest_rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw);
/* Kills everything, removes the run directory and exits (with --vm: powers off). */
__attribute__((noreturn)) void guest_shutdown_and_exit(guest_t *g, int code);

#endif
