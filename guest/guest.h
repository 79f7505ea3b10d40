/* Internal interface of ephemeral-guest between its event loop (guest.c), the worker
 * start-up (worker.c) and the file operations (files.c). Not installed. */
#ifndef EPH_GUEST_H
#define EPH_GUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/resource.h>
#include <sys/types.h>

#include <json-c/json.h>
#include <seccomp.h>

/* What the forked child needs to become the worker and exec the command. Everything is
 * prepared by the parent before fork() so the child only makes system calls. */
typedef struct guest_worker_spec {
  uid_t uid;
  gid_t gid;
  const char *cwd;   /* absolute; chdir()ed as the worker */
  char *const *argv; /* argv[0] is looked up in PATH of envp when it has no '/' */
  char *const *envp;
  int stdin_fd, stdout_fd, stderr_fd;
  int status_fd;          /* CLOEXEC pipe: a failure "step: error" is written here */
  rlim_t nofile;          /* RLIMIT_NOFILE soft and hard */
  scmp_filter_ctx filter; /* loaded last, after no_new_privs */
} guest_worker_spec_t;

/* Builds the seccomp filter every worker command runs under (see worker.c for the list).
 * Returns NULL with why filled on failure. Release with seccomp_release(). */
scmp_filter_ctx guest_seccomp_build(char *why, size_t why_size);

/* In the forked child: new session, fds, rlimits, oom_score_adj, every capability dropped,
 * uid/gid switched, no_new_privs, seccomp, exec. Never returns: on any failure it writes
 * "step: strerror" to status_fd and _exit(126)s, so a half-dropped child never runs code. */
__attribute__((noreturn)) void guest_worker_exec(const guest_worker_spec_t *spec);

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

#endif
