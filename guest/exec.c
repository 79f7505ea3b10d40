/* ephemeral-guest's commands: running the host's command as the worker (exec), capturing
 * and streaming its output one chunk per stream at a time, feeding its stdin, noticing a
 * full scratch or an OOM kill, reporting its exit; and the processes of the sandbox:
 * reaping every orphan, killing everything and the shutdown. The poll() loop in guest.c
 * calls these when a request, a pipe or SIGCHLD is ready. */
#include <config.h>

#include "guest.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_ENV 256
#define MAX_ARGV 4096

static const char *const enospc_words[] = {"No space left on device", "ENOSPC"};

/* ---------------------------------------------------------------- processes */

/* --vm: the whole kernel is the sandbox's, so its OOM kill counter (/proc/vmstat
 * oom_kill) says whether the memory limit ended a command. 0 when unreadable. */
static uint64_t
oom_kills(void)
{
  FILE *f = fopen("/proc/vmstat", "re");
  char line[128];
  unsigned long long n = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "oom_kill %llu", &n) == 1)
      break;
  if (f)
    fclose(f);
  return n;
}

static void
job_free(job_t *j)
{
  if (!j)
    return;
  if (j->out_fd >= 0)
    close(j->out_fd);
  if (j->err_fd >= 0)
    close(j->err_fd);
  if (j->in_fd >= 0)
    close(j->in_fd);
  free(j->stdin_buf);
  free(j);
}

/* Reaps every exited child: the running command's main process and any orphan the kernel
 * handed to us (PID 1 or subreaper). */
void
guest_reap(guest_t *g)
{
  int st;
  pid_t pid;
  while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
    if (g->job && !g->job->reaped && pid == g->job->pid) {
      g->job->reaped = true;
      g->job->status = st;
    }
  }
}

/* Kills every process but ourselves, then reaps until none is left (bounded: 5 s).
 * As PID 1 of a pid namespace kill(-1) reaches exactly the sandbox. Outside one (a test
 * without a pid namespace) we are a subreaper and kill our descendants generation by
 * generation through /proc/self/task/<pid>/children: never kill(-1), which would reach
 * the host. */
void
guest_kill_job(job_t *j)
{
  if (!j || j->reaped)
    return; /* reaped: its pid may be another process's by now */
  kill(-j->pid, SIGKILL);
  kill(j->pid, SIGKILL);
}

void
guest_kill_everything(guest_t *g)
{
  guest_kill_job(g->job);
  int64_t end = guest_now_ms() + 5000;
  char path[64];
  snprintf(path, sizeof path, "/proc/self/task/%d/children", (int)getpid());
  for (;;) {
    bool any = false;
    /* kill(-1) cannot say when everything is gone: in a microVM it also "signals" the
     * kernel threads and so always succeeds. Orphans are re-parented to us (PID 1 or
     * subreaper), so our children list is the truth in both cases. */
    if (g->pid1)
      kill(-1, SIGKILL);
    FILE *f = fopen(path, "re");
    if (f) {
      int child;
      while (fscanf(f, "%d", &child) == 1) {
        kill(child, SIGKILL);
        any = true;
      }
      fclose(f);
    }
    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
      any = true;
      if (g->job && !g->job->reaped && pid == g->job->pid) {
        g->job->reaped = true;
        g->job->status = st;
      }
    }
    if (!any || guest_now_ms() > end)
      break;
    usleep(2000);
  }
}

int
guest_rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
  (void)st;
  (void)flag;
  (void)ftw;
  remove(path);
  return 0;
}

void
guest_shutdown_and_exit(guest_t *g, int code)
{
  guest_kill_everything(g);
  /* No worker process is left, so nothing can race the removal (FTW_PHYS: symlinks are
   * removed, never followed). */
  if (g->rundir[0])
    nftw(g->rundir, guest_rm_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
  if (g->vm) {
    sync();
    reboot(RB_POWER_OFF);
  }
  _exit(code);
}

/* ---------------------------------------------------------------- exec */

static void
scan_enospc(job_t *j, const unsigned char *data, size_t n)
{
  if (j->enospc_seen)
    return;
  for (size_t w = 0; w < 2 && !j->enospc_seen; w++)
    if (memmem(data, n, enospc_words[w], strlen(enospc_words[w])))
      j->enospc_seen = true;
  /* Words split across two chunks: search the seam. */
  char seam[2 * ENOSPC_CARRY];
  size_t take = n < ENOSPC_CARRY ? n : ENOSPC_CARRY;
  memcpy(seam, j->carry, j->carry_len);
  memcpy(seam + j->carry_len, data, take);
  for (size_t w = 0; w < 2 && !j->enospc_seen; w++)
    if (memmem(seam, j->carry_len + take, enospc_words[w], strlen(enospc_words[w])))
      j->enospc_seen = true;
  size_t keep = ENOSPC_CARRY - 1;
  if (n >= keep) {
    memcpy(j->carry, data + n - keep, keep);
    j->carry_len = keep;
  } else {
    size_t total = j->carry_len + n;
    char tmp[2 * ENOSPC_CARRY];
    memcpy(tmp, j->carry, j->carry_len);
    memcpy(tmp + j->carry_len, data, n);
    size_t from = total > keep ? total - keep : 0;
    memcpy(j->carry, tmp + from, total - from);
    j->carry_len = total - from;
  }
}

/* Reads one chunk of a command's stream and forwards it. Returns false at end of stream
 * or when nothing is available (the fd is non-blocking). */
bool
guest_forward_chunk(guest_t *g, int stream)
{
  job_t *j = g->job;
  int *fd = stream == 1 ? &j->out_fd : &j->err_fd;
  ssize_t n = read(*fd, g->chunk, sizeof g->chunk);
  if (n < 0 && (errno == EINTR || errno == EAGAIN))
    return false;
  if (n <= 0) {
    close(*fd);
    *fd = -1;
    return false;
  }
  j->bytes[stream] += (uint64_t)n;
  if (stream == 2)
    scan_enospc(j, g->chunk, (size_t)n);
  json_object *o = guest_new_msg("output", j->id, true);
  json_object_object_add(o, "stream", json_object_new_int(stream));
  if (eph_proto_add_b64(o, "data", g->chunk, (size_t)n) < 0) {
    json_object_put(o);
    guest_log("out of memory forwarding output");
    guest_shutdown_and_exit(g, 1);
  }
  guest_send_frame(g, o);
  return true;
}

static bool
scratch_full(const guest_t *g)
{
  struct statvfs sv;
  return statvfs(g->scratch, &sv) == 0 && sv.f_bavail == 0 && sv.f_blocks > 0;
}

/* The page a worker writes its failed set-up step into: shared with the guest whether the
 * worker was vfork'd (shared memory anyway) or forked (guest_worker_spawn forks when other
 * processes are in the sandbox), one for the guest's life (one command runs at a time).
 * NULL if it cannot be mapped; the command is then refused. */
#define GUEST_FAILED_BYTES 256
static char *
guest_shared_failed(void)
{
  static char *page;
  if (!page) {
    void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    page = p == MAP_FAILED ? NULL : p;
  }
  return page;
}

/* Called when the main process was reaped: takes what its pipes still hold (everything it
 * wrote before exiting is already there), closes them even if a background process keeps
 * them open, and reports the end. */
void
guest_finish_job(guest_t *g)
{
  job_t *j = g->job;
  char msg[320];
  if (j->setup_failed[0]) {
    /* The worker never ran the command: the reply is the error it would have been. */
    json_object *e = guest_new_msg("error", j->id, true);
    json_object_object_add(e, "errno", json_object_new_int(EPERM));
    snprintf(msg, sizeof msg, "exec: worker set-up failed at %s", j->setup_failed);
    json_object_object_add(e, "message", json_object_new_string(msg));
    g->job = NULL;
    job_free(j);
    guest_send_frame(g, e);
    return;
  }
  for (int s = 1; s <= 2; s++) {
    int *fd = s == 1 ? &j->out_fd : &j->err_fd;
    while (*fd >= 0 && guest_forward_chunk(g, s))
      ;
    if (*fd >= 0) {
      close(*fd);
      *fd = -1;
    }
  }
  json_object *o = guest_new_msg("exit", j->id, true);
  const char *reason = "exited";
  int st = j->status;
  if (WIFSIGNALED(st)) {
    json_object_object_add(o, "signal", json_object_new_int(WTERMSIG(st)));
  } else {
    json_object_object_add(o, "exit_code", json_object_new_int(WEXITSTATUS(st)));
  }
  bool failed = WIFSIGNALED(st) || WEXITSTATUS(st) != 0;
  if (j->killed)
    reason = "killed";
  else if (j->timed_out)
    reason = "timeout";
  else if (failed && (j->enospc_seen || scratch_full(g)))
    reason = "disk_full";
  else if (g->vm && failed && oom_kills() > j->oom_kills_before)
    reason = "oom";
  json_object_object_add(o, "reason", json_object_new_string(reason));
  json_object_object_add(o, "duration_ms", json_object_new_int64(guest_now_ms() - j->start_ms));
  json_object_object_add(o, "stdout_bytes", json_object_new_int64((int64_t)j->bytes[1]));
  json_object_object_add(o, "stderr_bytes", json_object_new_int64((int64_t)j->bytes[2]));
  json_object_object_add(o, "stdout_dropped", json_object_new_int64(0));
  json_object_object_add(o, "stderr_dropped", json_object_new_int64(0));
  g->job = NULL;
  job_free(j);
  guest_send_frame(g, o);
}

static void
strv_free(char **v)
{
  if (!v)
    return;
  for (char **p = v; *p; p++)
    free(*p);
  free(v);
}

/* A NULL-terminated heap copy of a JSON array of strings (at most max), or NULL + why. */
static char **
strv_from_json(json_object *arr, size_t max, const char **why)
{
  if (!json_object_is_type(arr, json_type_array)) {
    *why = "must be an array of strings";
    return NULL;
  }
  size_t n = json_object_array_length(arr);
  if (n > max) {
    *why = "too many entries";
    return NULL;
  }
  char **v = calloc(n + 1, sizeof *v);
  if (!v) {
    *why = "out of memory";
    return NULL;
  }
  for (size_t i = 0; i < n; i++) {
    json_object *e = json_object_array_get_idx(arr, i);
    if (!json_object_is_type(e, json_type_string) ||
        strlen(json_object_get_string(e)) != (size_t)json_object_get_string_len(e)) {
      *why = "entries must be strings without NUL bytes";
      strv_free(v);
      return NULL;
    }
    v[i] = strdup(json_object_get_string(e));
  }
  return v;
}

/* The worker's environment: the fixed base, then the request's K=V entries (a request
 * entry replaces a base entry with the same key). */
static char **
build_env(guest_t *g, json_object *req, const char **why)
{
  char **extra = NULL;
  json_object *envj;
  if (json_object_object_get_ex(req, "env", &envj) && !json_object_is_type(envj, json_type_null)) {
    extra = strv_from_json(envj, MAX_ENV, why);
    if (!extra)
      return NULL;
    for (char **p = extra; *p; p++) {
      char *eq = strchr(*p, '=');
      if (!eq || eq == *p) {
        *why = "entries must look like KEY=VALUE";
        strv_free(extra);
        return NULL;
      }
    }
  }
  char *base[8];
  size_t nb = 0;
  if (asprintf(&base[nb++], "HOME=%s", g->scratch) < 0)
    base[nb - 1] = NULL;
  base[nb++] = strdup("PATH=/usr/local/bin:/usr/bin:/bin");
  base[nb++] = strdup("USER=worker");
  base[nb++] = strdup("LOGNAME=worker");
  base[nb++] = strdup("SHELL=/bin/sh");
  base[nb++] = strdup("LANG=C.UTF-8");
  size_t ne = 0;
  while (extra && extra[ne])
    ne++;
  char **env = calloc(nb + ne + 1, sizeof *env);
  size_t n = 0;
  for (size_t i = 0; i < nb; i++) {
    size_t klen = strchr(base[i], '=') - base[i] + 1;
    bool overridden = false;
    for (size_t k = 0; k < ne; k++)
      if (strncmp(extra[k], base[i], klen) == 0)
        overridden = true;
    if (overridden)
      free(base[i]);
    else
      env[n++] = base[i];
  }
  for (size_t k = 0; k < ne; k++)
    env[n++] = extra[k];
  free(extra); /* the strings moved into env */
  return env;
}

static void
close_pair(int p[2])
{
  for (int i = 0; i < 2; i++)
    if (p[i] >= 0) {
      close(p[i]);
      p[i] = -1;
    }
}

void
guest_op_exec(guest_t *g, json_object *req, int64_t id)
{
  if (g->job) {
    guest_send_error(g, req, EBUSY, "exec: a command is already running", false);
    return;
  }
  const char *command = eph_json_get_string(req, "command");
  json_object *argvj = NULL;
  bool has_argv = json_object_object_get_ex(req, "argv", &argvj);
  const char *why = NULL;
  char **argv = NULL, **envp = NULL;
  void *stdin_data = NULL;
  size_t stdin_len = 0;
  int outp[2] = {-1, -1}, errp[2] = {-1, -1}, inp[2] = {-1, -1};
  char msg[512];

  if ((command != NULL) == has_argv) {
    guest_send_error(g, req, EINVAL,
                     "exec: exactly one of 'command' (string) or 'argv' is required", false);
    return;
  }
  if (command) {
    argv = calloc(4, sizeof *argv);
    argv[0] = strdup("/bin/sh");
    argv[1] = strdup("-c");
    argv[2] = strdup(command);
  } else if (!(argv = strv_from_json(argvj, MAX_ARGV, &why)) || !argv[0]) {
    snprintf(msg, sizeof msg, "exec: 'argv' %s", why ? why : "must not be empty");
    guest_send_error(g, req, EINVAL, msg, false);
    goto out;
  }
  if (!(envp = build_env(g, req, &why))) {
    snprintf(msg, sizeof msg, "exec: 'env' %s", why);
    guest_send_error(g, req, EINVAL, msg, false);
    goto out;
  }
  const char *cwd = eph_json_get_string(req, "cwd");
  if (!cwd)
    cwd = g->scratch;
  if (cwd[0] != '/') {
    guest_send_error(g, req, EINVAL, "exec: 'cwd' must be an absolute path", false);
    goto out;
  }
  int r = eph_proto_get_b64(req, "stdin", EPH_PROTO_MAX_DATA_BYTES, &stdin_data, &stdin_len);
  if (r < 0) {
    guest_send_error(g, req, -r, "exec: 'stdin' must be base64 of at most 524288 bytes", false);
    goto out;
  }
  int64_t timeout_ms = 0, nofile = (int64_t)g->nofile;
  if (eph_proto_int(req, "timeout_ms", &timeout_ms) &&
      (timeout_ms < 0 || timeout_ms > 7 * 24 * 3600 * 1000LL)) {
    guest_send_error(g, req, EINVAL, "exec: 'timeout_ms' outside 0..604800000", false);
    goto out;
  }
  if (timeout_ms == 0)
    timeout_ms = g->default_timeout_ms;
  if (eph_proto_int(req, "nofile", &nofile) && nofile <= 0) {
    guest_send_error(g, req, EINVAL, "exec: 'nofile' must be positive", false);
    goto out;
  }
  if ((rlim_t)nofile > g->nofile) /* the host may lower the guest's ceiling, never raise it */
    nofile = (int64_t)g->nofile;

  /* A command given no stdin reads /dev/null (end of file at once, as from a pipe whose
   * writer closed): one pipe less per command. */
  bool stdin_pipe = stdin_len > 0 || g->devnull < 0;
  if (pipe2(outp, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0 ||
      (stdin_pipe && pipe2(inp, O_CLOEXEC) < 0)) {
    snprintf(msg, sizeof msg, "exec: pipe: %s", strerror(errno));
    guest_send_error(g, req, errno, msg, false);
    goto out;
  }
  /* Bigger pipes, fewer and larger output frames; failure only costs speed. */
  (void)fcntl(outp[1], F_SETPIPE_SZ, (int)EPH_PROTO_OUTPUT_CHUNK_BYTES);
  (void)fcntl(errp[1], F_SETPIPE_SZ, (int)EPH_PROTO_OUTPUT_CHUNK_BYTES);
  guest_worker_spec_t spec = {
      .uid = g->uid,
      .gid = g->gid,
      .cwd = cwd,
      .argv = argv,
      .envp = envp,
      .stdin_fd = stdin_pipe ? inp[0] : g->devnull,
      .stdout_fd = outp[1],
      .stderr_fd = errp[1],
      .nofile = (rlim_t)nofile,
      .filter = &g->filter,
      .guest_session = g->session,
      .guest_batch = g->batch,
  };
  char *failed = guest_shared_failed();
  if (!failed) {
    snprintf(msg, sizeof msg, "exec: mmap: %s", strerror(errno));
    guest_send_error(g, req, errno, msg, false);
    goto out;
  }
  failed[0] = '\0';
  spec.failed = failed;
  spec.failed_size = GUEST_FAILED_BYTES;
  int64_t start = guest_now_ms();
  pid_t pid = guest_worker_spawn(&spec);
  if (pid < 0) {
    int e = errno;
    if (e == EAGAIN) {
      /* The process limit refused the command itself: an end, not a broken sandbox. */
      json_object *o = guest_new_msg("exit", id, true);
      json_object_object_add(o, "exit_code", json_object_new_int(126));
      json_object_object_add(o, "reason", json_object_new_string("pids_exhausted"));
      json_object_object_add(o, "duration_ms", json_object_new_int64(0));
      guest_send_frame(g, o);
    } else {
      snprintf(msg, sizeof msg, "exec: fork: %s", strerror(e));
      guest_send_error(g, req, e, msg, false);
    }
    goto out;
  }
  close(outp[1]);
  close(errp[1]);
  outp[1] = errp[1] = -1;
  if (inp[0] >= 0)
    close(inp[0]);
  inp[0] = -1;
  /* A set-up that failed ended the worker (126) before it ran anything: the reply is then
   * the error, sent when the worker is reaped (guest_finish_job). */
  job_t *j = calloc(1, sizeof *j);
  j->id = id;
  j->pid = pid;
  j->out_fd = outp[0];
  j->err_fd = errp[0];
  j->in_fd = inp[1];
  j->setup_failed = failed;
  outp[0] = errp[0] = inp[1] = -1;
  fcntl(j->out_fd, F_SETFL, O_NONBLOCK);
  fcntl(j->err_fd, F_SETFL, O_NONBLOCK);
  j->stdin_buf = stdin_data;
  j->stdin_len = stdin_len;
  stdin_data = NULL;
  if (j->in_fd >= 0 && j->stdin_len == 0) {
    close(j->in_fd);
    j->in_fd = -1;
  } else if (j->in_fd >= 0) {
    fcntl(j->in_fd, F_SETFL, O_NONBLOCK);
  }
  j->start_ms = start;
  if (g->vm)
    j->oom_kills_before = oom_kills();
  j->deadline_ms = start + timeout_ms;
  g->job = j;
out:
  close_pair(outp);
  close_pair(errp);
  close_pair(inp);
  strv_free(argv);
  strv_free(envp);
  free(stdin_data);
}

void
guest_feed_stdin(job_t *j)
{
  ssize_t w = write(j->in_fd, j->stdin_buf + j->stdin_off, j->stdin_len - j->stdin_off);
  if (w < 0 && (errno == EAGAIN || errno == EINTR))
    return;
  if (w > 0)
    j->stdin_off += (size_t)w;
  if (w <= 0 || j->stdin_off == j->stdin_len) { /* EPIPE: the command does not read it */
    close(j->in_fd);
    j->in_fd = -1;
  }
}

/* ---------------------------------------------------------------- dispatch */
