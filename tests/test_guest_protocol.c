/* The guest protocol, end to end: the core's guest client against a real ephemeral-guest
 * process on a socketpair. Each guest runs as PID 1 of a fresh pid + mount namespace with
 * its own /proc and an 8 MiB tmpfs on /tmp (so the tests also see what the worker sees and
 * can fill the disk), and runs commands as the worker uid 1000. Needs root: skipped
 * otherwise. */
#include <config.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dlfcn.h>
#include <libconfig.h>

#include "conf.h"
#include "guest_client.h"
#include "protocol.h"
#include "util.h"

/* The ASan quarantine would keep up to 256 MiB of freed frames resident and hide whether
 * the client's memory stays flat; a small one keeps the RSS figure honest. */
const char *__asan_default_options(void);
const char *
__asan_default_options(void)
{
  return "quarantine_size_mb=4";
}

typedef struct guest_proc {
  pid_t pid; /* the helper that owns the namespaces; exits with the guest */
  int fd;    /* our end of the stream (moved into g once opened) */
  eph_guest_t *g;
} guest_proc_t;

static char guest_path[4096];

static int
setup_all(void **state)
{
  (void)state;
  const char *b = getenv("EPH_BUILDDIR");
  snprintf(guest_path, sizeof guest_path, "%s/guest/ephemeral-guest", b ? b : EPH_BUILDDIR);
  return 0;
}

/* Starts a guest in new pid and mount namespaces. Returns our end of the stream. */
static void
spawn_guest(guest_proc_t *gp)
{
  if (geteuid() != 0)
    skip();
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  /* Opened before the child mounts a fresh /tmp: the build tree may live under /tmp. */
  int gfd = open(guest_path, O_PATH | O_CLOEXEC);
  assert_true(gfd >= 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (unshare(CLONE_NEWPID | CLONE_NEWNS) < 0 ||
        mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
        mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=8m,mode=1777") < 0)
      _exit(90);
    pid_t child = fork();
    if (child == 0) {
      if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
        _exit(91);
      if (dup2(sv[1], 3) < 0)
        _exit(92);
      char *const argv[] = {"ephemeral-guest", "--fd", "3", NULL};
      syscall(SYS_execveat, gfd, "", argv, environ, AT_EMPTY_PATH);
      _exit(93);
    }
    close(sv[0]);
    close(sv[1]);
    int st = 0;
    while (waitpid(child, &st, 0) < 0)
      ;
    _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  }
  close(sv[1]);
  close(gfd);
  gp->pid = pid;
  gp->fd = sv[0];
  gp->g = NULL;
}

static void
start_guest(guest_proc_t *gp)
{
  spawn_guest(gp);
  eph_error_t err = {0};
  int r = eph_guest_open(gp->fd, eph_now_ms() + 10000, &gp->g, &err);
  if (r < 0)
    fail_msg("eph_guest_open: %s", err.message);
  gp->fd = -1;
}

/* Waits for the helper to exit (the guest ended); returns its exit status or -1 after
 * timeout_ms. */
static int
wait_exit(pid_t pid, int timeout_ms)
{
  for (int waited = 0; waited < timeout_ms; waited += 10) {
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid)
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

static void
stop_guest(guest_proc_t *gp)
{
  eph_error_t err = {0};
  int r = eph_guest_shutdown(gp->g, eph_now_ms() + 10000, &err);
  if (r < 0)
    fail_msg("shutdown: %s", err.message);
  eph_guest_close(gp->g);
  gp->g = NULL;
  assert_int_equal(wait_exit(gp->pid, 10000), 0);
}

static int
run(guest_proc_t *gp, const char *command, uint32_t timeout_ms, eph_exec_result_t *res)
{
  eph_exec_request_t req = {
      .struct_size = sizeof req, .command = command, .timeout_ms = timeout_ms};
  eph_error_t err = {0};
  memset(res, 0, sizeof *res);
  int r = eph_guest_exec(gp->g, &req, res, &err);
  if (r < 0)
    fail_msg("exec '%s': %s", command, err.message);
  return r;
}

/* ---------------------------------------------------------------- tests */

static void
test_hello_and_identity(void **state)
{
  (void)state;
  guest_proc_t gp;
  start_guest(&gp);
  struct utsname u;
  uname(&u);
  assert_string_equal(eph_guest_kernel(gp.g), u.release);
  assert_int_equal(eph_guest_version(gp.g), EPH_PROTO_VERSION);
  const char *scratch = eph_guest_scratch(gp.g);
  assert_int_equal(strlen(scratch), strlen("/tmp/ephemeral-run-XXXXXX/scratch"));
  assert_memory_equal(scratch, "/tmp/ephemeral-run-", 19);
  assert_string_equal(scratch + 25, "/scratch");

  eph_exec_result_t res;
  run(&gp, "id -u; id -g; id -G; pwd; echo \"$HOME $USER $LOGNAME $PATH\"", 0, &res);
  char want[1024];
  snprintf(want, sizeof want,
           "1000\n1000\n1000\n%s\n%s worker worker /usr/local/bin:/usr/bin:/bin\n", scratch,
           scratch);
  assert_string_equal(res.stdout_text, want);
  assert_int_equal(res.exit_code, 0);
  assert_int_equal(res.reason, EPH_END_EXITED);
  eph_exec_result_clear(&res);

  run(&gp, "echo out; echo err >&2; exit 3", 0, &res);
  assert_string_equal(res.stdout_text, "out\n");
  assert_string_equal(res.stderr_text, "err\n");
  assert_int_equal(res.exit_code, 3);
  assert_int_equal(res.signal, 0);
  eph_exec_result_clear(&res);

  run(&gp, "kill -TERM $$", 0, &res);
  assert_int_equal(res.signal, SIGTERM);
  assert_int_equal(res.reason, EPH_END_EXITED);
  eph_exec_result_clear(&res);

  /* argv form: no shell involved. */
  const char *argv[] = {"printf", "%s|", "a b", "$HOME", NULL};
  eph_exec_request_t req = {.struct_size = sizeof req, .argv = argv};
  eph_error_t err = {0};
  assert_int_equal(eph_guest_exec(gp.g, &req, &res, &err), 0);
  assert_string_equal(res.stdout_text, "a b|$HOME|");
  eph_exec_result_clear(&res);

  /* A missing program: 127 like a shell, and the connection stays usable. */
  const char *missing[] = {"/nonexistent/prog", NULL};
  req.argv = missing;
  assert_int_equal(eph_guest_exec(gp.g, &req, &res, &err), 0);
  assert_int_equal(res.exit_code, 127);
  eph_exec_result_clear(&res);
  stop_guest(&gp);
}

static void
test_worker_is_unprivileged(void **state)
{
  (void)state;
  guest_proc_t gp;
  start_guest(&gp);
  eph_exec_result_t res;
  run(&gp,
      "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status;"
      "cat /proc/self/oom_score_adj; ulimit -c; ulimit -n",
      0, &res);
  assert_string_equal(res.stdout_text, "CapInh:\t0000000000000000\n"
                                       "CapPrm:\t0000000000000000\n"
                                       "CapEff:\t0000000000000000\n"
                                       "CapBnd:\t0000000000000000\n"
                                       "CapAmb:\t0000000000000000\n"
                                       "NoNewPrivs:\t1\n"
                                       "Seccomp:\t2\n"
                                       "1000\n0\n1024\n");
  eph_exec_result_clear(&res);

  /* The seccomp filter answers EPERM where a missing capability might not be the reason. */
  run(&gp, "unshare -U true", 0, &res);
  assert_int_not_equal(res.exit_code, 0);
  assert_non_null(strstr(res.stderr_text, "Operation not permitted"));
  eph_exec_result_clear(&res);

  /* The guest (PID 1) is not dumpable: its fds and memory are closed to the worker. */
  run(&gp, "ls /proc/1/fd; cat /proc/1/environ", 0, &res);
  assert_int_not_equal(res.exit_code, 0);
  assert_non_null(strstr(res.stderr_text, "Permission denied"));
  assert_string_equal(res.stdout_text, "");
  eph_exec_result_clear(&res);

  /* The control stream is not among the worker's descriptors: only 0, 1, 2 (and the one
   * ls opens to list the directory). */
  run(&gp, "ls /proc/self/fd | sort -n | tr '\\n' ' '", 0, &res);
  assert_string_equal(res.stdout_text, "0 1 2 3 ");
  eph_exec_result_clear(&res);

  /* A set-up step that fails (chdir into a missing directory) is an error naming the step,
   * never a run of the command; the guest reads the step once it reaps the worker. The
   * connection stays usable. */
  eph_exec_request_t bad = {
      .struct_size = sizeof bad, .command = "echo ran", .cwd = "/nonexistent"};
  eph_error_t err = {0};
  memset(&res, 0, sizeof res);
  assert_true(eph_guest_exec(gp.g, &bad, &res, &err) < 0);
  assert_non_null(strstr(err.message, "worker set-up failed at chdir"));
  assert_null(strstr(err.message, "ran"));
  eph_exec_result_clear(&res);
  run(&gp, "echo after", 0, &res);
  assert_string_equal(res.stdout_text, "after\n");
  eph_exec_result_clear(&res);

  /* The same with another process in the sandbox (a background job left by a command): the
   * guest then forks the worker instead of vfork'ing it, and the failed step still reaches
   * it (shared memory, not the child's copy of the guest's). */
  run(&gp, "sleep 60 >/dev/null 2>&1 &", 0, &res);
  eph_exec_result_clear(&res);
  memset(&res, 0, sizeof res);
  err = (eph_error_t){0};
  assert_true(eph_guest_exec(gp.g, &bad, &res, &err) < 0);
  assert_non_null(strstr(err.message, "worker set-up failed at chdir"));
  eph_exec_result_clear(&res);
  run(&gp, "echo still", 0, &res);
  assert_string_equal(res.stdout_text, "still\n");
  eph_exec_result_clear(&res);
  stop_guest(&gp);
}

static void
test_stdin_binary(void **state)
{
  (void)state;
  guest_proc_t gp;
  start_guest(&gp);
  unsigned char in[70000];
  for (size_t i = 0; i < sizeof in; i++)
    in[i] = (unsigned char)(i * 7 + i / 256);
  eph_exec_request_t req = {.struct_size = sizeof req,
                            .command = "cat; printf END",
                            .stdin_data = in,
                            .stdin_bytes = sizeof in,
                            .output_cap_bytes = 1 << 20};
  eph_exec_result_t res;
  eph_error_t err = {0};
  assert_int_equal(eph_guest_exec(gp.g, &req, &res, &err), 0);
  assert_int_equal(res.stdout_bytes, sizeof in + 3);
  assert_memory_equal(res.stdout_text, in, sizeof in);
  assert_memory_equal(res.stdout_text + sizeof in, "END", 3);
  assert_int_equal(res.stdout_truncated, 0);
  eph_exec_result_clear(&res);

  /* Without stdin data the command reads end-of-file at once. */
  run(&gp, "wc -c", 2000, &res);
  assert_string_equal(res.stdout_text, "0\n");
  eph_exec_result_clear(&res);
  stop_guest(&gp);
}

static void
test_files_round_trip(void **state)
{
  (void)state;
  guest_proc_t gp;
  start_guest(&gp);
  eph_error_t err = {0};
  /* 1.5 MB crosses three write and read frames. */
  size_t n = 1500000;
  unsigned char *data = eph_xmalloc(n);
  assert_int_equal(eph_random_bytes(data, n), 0);
  assert_int_equal(eph_guest_write(gp.g, "dir/sub/blob.bin", data, n, &err), 0);

  void *back = NULL;
  size_t got = 0;
  int truncated = -1;
  assert_int_equal(eph_guest_read(gp.g, "dir/sub/blob.bin", n + 10, &back, &got, &truncated, &err),
                   0);
  assert_int_equal(got, n);
  assert_int_equal(truncated, 0);
  assert_memory_equal(back, data, n);
  free(back);

  assert_int_equal(eph_guest_read(gp.g, "dir/sub/blob.bin", 1000, &back, &got, &truncated, &err),
                   0);
  assert_int_equal(got, 1000);
  assert_int_equal(truncated, 1);
  assert_memory_equal(back, data, 1000);
  free(back);

  /* The worker sees the file as its own, with the same bytes. */
  eph_exec_result_t res;
  run(&gp, "stat -c '%u %g %s' dir/sub/blob.bin; md5sum < dir/sub/blob.bin | cut -c1-32", 0, &res);
  char want[128];
  snprintf(want, sizeof want, "1000 1000 %zu\n", n);
  assert_memory_equal(res.stdout_text, want, strlen(want));
  eph_exec_result_clear(&res);

  eph_dirent_t *ents = NULL;
  size_t count = 0;
  assert_int_equal(eph_guest_list(gp.g, "dir/sub", &ents, &count, &err), 0);
  assert_int_equal(count, 1);
  assert_string_equal(ents[0].name, "blob.bin");
  assert_int_equal(ents[0].type, 'f');
  assert_int_equal(ents[0].size_bytes, n);
  eph_dirents_free(ents, count);

  /* Confinement: "..", absolute paths elsewhere and symlinks out of scratch are refused
   * (and the connection stays usable). */
  run(&gp, "ln -s /etc/passwd evil; ln -s / root; mkfifo pipe", 0, &res);
  eph_exec_result_clear(&res);
  assert_int_equal(eph_guest_read(gp.g, "../../etc/passwd", 100, &back, &got, &truncated, &err),
                   -EACCES);
  assert_int_equal(eph_guest_read(gp.g, "/etc/passwd", 100, &back, &got, &truncated, &err),
                   -EACCES);
  assert_int_equal(eph_guest_read(gp.g, "evil", 100, &back, &got, &truncated, &err), -EACCES);
  assert_int_equal(eph_guest_read(gp.g, "root/etc/passwd", 100, &back, &got, &truncated, &err),
                   -EACCES);
  assert_int_equal(eph_guest_write(gp.g, "evil", "x", 1, &err), -EACCES);
  assert_int_equal(eph_guest_read(gp.g, "pipe", 100, &back, &got, &truncated, &err), -EINVAL);
  assert_int_equal(eph_guest_read(gp.g, "missing", 100, &back, &got, &truncated, &err), -ENOENT);
  assert_false(eph_guest_broken(gp.g));

  /* An empty file round-trips as zero bytes. */
  assert_int_equal(eph_guest_write(gp.g, "empty", "", 0, &err), 0);
  assert_int_equal(eph_guest_read(gp.g, "empty", 100, &back, &got, &truncated, &err), 0);
  assert_int_equal(got, 0);
  free(back);
  free(data);
  stop_guest(&gp);
}

static int64_t
field_kib(const char *key)
{
  FILE *f = fopen("/proc/self/status", "re");
  char line[256];
  int64_t v = -1;
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, key, strlen(key)) == 0)
      v = strtoll(line + strlen(key), NULL, 10);
  if (f)
    fclose(f);
  return v;
}

static size_t huge_streamed;

static void
count_output(void *opaque, int stream, const char *data, size_t bytes)
{
  (void)opaque;
  (void)data;
  if (stream == 1)
    huge_streamed += bytes;
}

static void
test_huge_output_capped(void **state)
{
  (void)state;
  guest_proc_t gp;
  start_guest(&gp);
  /* Reset the peak RSS so VmHWM measures this exec alone. */
  int fd = open("/proc/self/clear_refs", O_WRONLY);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, "5", 1), 1);
  close(fd);
  int64_t base = field_kib("VmHWM:");

  const size_t total = 200u * 1000 * 1000;
  eph_exec_request_t req = {
      .struct_size = sizeof req,
      .command = "head -c 100000 /dev/zero | tr '\\0' h; head -c 199800000 /dev/zero;"
                 " head -c 100000 /dev/zero | tr '\\0' t; echo oops >&2",
      .output_cap_bytes = 65536,
      .on_output = count_output};
  eph_exec_result_t res;
  eph_error_t err = {0};
  huge_streamed = 0;
  int64_t t0 = eph_now_ms();
  assert_int_equal(eph_guest_exec(gp.g, &req, &res, &err), 0);
  int64_t ms = eph_now_ms() - t0;
  int64_t peak = field_kib("VmHWM:");
  print_message("# 200 MB of output in %lld ms; client peak RSS grew %lld KiB\n", (long long)ms,
                (long long)(peak - base));
  assert_int_equal(huge_streamed, total);
  assert_int_equal(res.exit_code, 0);
  assert_int_equal(res.stdout_truncated, 1);
  assert_int_equal(res.stdout_dropped_bytes, total - 65536);
  char marker[64];
  snprintf(marker, sizeof marker, "\n[... %zu bytes dropped ...]\n", total - 65536);
  assert_int_equal(res.stdout_bytes, 65536 + strlen(marker));
  for (size_t i = 0; i < 32768; i++)
    assert_true(res.stdout_text[i] == 'h');
  assert_memory_equal(res.stdout_text + 32768, marker, strlen(marker));
  for (size_t i = 32768 + strlen(marker); i < res.stdout_bytes; i++)
    assert_true(res.stdout_text[i] == 't');
  assert_string_equal(res.stderr_text, "oops\n");
  assert_int_equal(res.stderr_truncated, 0);
  /* Flat memory: far below the 200 MB that went through. */
  assert_true(peak - base < 48 * 1024);
  eph_exec_result_clear(&res);
  stop_guest(&gp);
}

static void
test_timeout_kills_group(void **state)
{
  (void)state;
  guest_proc_t gp;
  start_guest(&gp);
  eph_exec_result_t res;
  int64_t t0 = eph_now_ms();
  run(&gp, "echo before; sleep 30 | sleep 31 & sleep 32", 500, &res);
  int64_t ms = eph_now_ms() - t0;
  assert_int_equal(res.reason, EPH_END_TIMEOUT);
  assert_int_equal(res.signal, SIGKILL);
  assert_string_equal(res.stdout_text, "before\n");
  assert_true(ms >= 500 && ms < 5000);
  assert_true(res.duration_ms >= 500);
  eph_exec_result_clear(&res);
  /* Every process of the command's group died with it. */
  run(&gp, "cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -c 'sleep 3[012]'", 0, &res);
  assert_string_equal(res.stdout_text, "0\n");
  eph_exec_result_clear(&res);
  stop_guest(&gp);
}

static bool
host_has_process(const char *needle)
{
  DIR *d = opendir("/proc");
  struct dirent *de;
  bool found = false;
  while (d && (de = readdir(d)) && !found) {
    if (de->d_name[0] < '0' || de->d_name[0] > '9')
      continue;
    char path[300], buf[512];
    snprintf(path, sizeof path, "/proc/%s/cmdline", de->d_name);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
      continue;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    for (ssize_t i = 0; i < n; i++)
      if (buf[i] == '\0')
        buf[i] = ' ';
    if (n > 0) {
      buf[n] = '\0';
      found = strstr(buf, needle) != NULL;
    }
  }
  if (d)
    closedir(d);
  return found;
}

static void
test_background_killed_at_shutdown(void **state)
{
  (void)state;
  guest_proc_t gp;
  start_guest(&gp);
  char needle[64];
  snprintf(needle, sizeof needle, "sleep 4321.%d", (int)getpid());
  char cmd[256];
  snprintf(cmd, sizeof cmd,
           "setsid %s >/dev/null 2>&1 </dev/null & nohup sh -c '%s' >/dev/null 2>&1 & echo started",
           needle, needle);
  eph_exec_result_t res;
  run(&gp, cmd, 0, &res);
  assert_string_equal(res.stdout_text, "started\n");
  eph_exec_result_clear(&res);
  usleep(100000);
  /* The command ended, its background processes did not. */
  assert_true(host_has_process(needle));
  stop_guest(&gp);
  assert_false(host_has_process(needle));
}

static void *
kill_later(void *arg)
{
  usleep(300000);
  eph_guest_kill(arg, false);
  return NULL;
}

static void
test_kill_and_disk_full(void **state)
{
  (void)state;
  guest_proc_t gp;
  start_guest(&gp);
  pthread_t t;
  pthread_create(&t, NULL, kill_later, gp.g);
  eph_exec_result_t res;
  run(&gp, "sleep 20", 0, &res);
  pthread_join(t, NULL);
  assert_int_equal(res.reason, EPH_END_KILLED);
  assert_int_equal(res.signal, SIGKILL);
  eph_exec_result_clear(&res);

  /* /tmp is an 8 MiB tmpfs: writing 64 MiB fills it. */
  run(&gp, "dd if=/dev/zero of=fill bs=1M count=64", 0, &res);
  assert_int_not_equal(res.exit_code, 0);
  assert_int_equal(res.reason, EPH_END_DISK_FULL);
  eph_exec_result_clear(&res);
  /* A command that succeeds on the full disk is not misreported. */
  run(&gp, "true", 0, &res);
  assert_int_equal(res.reason, EPH_END_EXITED);
  eph_exec_result_clear(&res);
  /* Writing through the protocol reports the errno. */
  eph_error_t err = {0};
  char blob[100000] = {0};
  assert_int_equal(eph_guest_write(gp.g, "more", blob, sizeof blob, &err), -ENOSPC);
  run(&gp, "rm -f fill more; echo ok", 0, &res);
  assert_string_equal(res.stdout_text, "ok\n");
  eph_exec_result_clear(&res);
  stop_guest(&gp);
}

/* Reads frames from the raw stream until one of type `type`; returns it (owned). */
static json_object *
raw_expect(int fd, const char *type)
{
  eph_frame_reader_t rd = {0};
  json_object *o = NULL;
  int64_t end = eph_now_ms() + 10000;
  while (eph_now_ms() < end) {
    int r = eph_frame_reader_feed(&rd, fd, &o);
    if (r == 1) {
      const char *t = eph_json_get_string(o, "type");
      if (t && strcmp(t, type) == 0)
        break;
      json_object_put(o);
      o = NULL;
    } else if (r < 0) {
      break;
    }
  }
  eph_frame_reader_clear(&rd);
  return o;
}

static void
expect_session_ends(const unsigned char *bytes, size_t n, const char *why_part)
{
  guest_proc_t gp;
  spawn_guest(&gp);
  json_object *hello = raw_expect(gp.fd, "hello");
  assert_non_null(hello);
  json_object_put(hello);
  assert_int_equal(write(gp.fd, bytes, n), (ssize_t)n);
  json_object *e = raw_expect(gp.fd, "error");
  assert_non_null(e);
  json_object *fatal;
  assert_true(json_object_object_get_ex(e, "fatal", &fatal) && json_object_get_boolean(fatal));
  assert_non_null(strstr(eph_json_get_string(e, "message"), why_part));
  json_object_put(e);
  /* Then the stream ends and the guest exits by itself, with status 1 (not a crash). */
  char c; /* 0, or ECONNRESET when the guest left our extra bytes unread */
  assert_true(read(gp.fd, &c, 1) <= 0);
  assert_int_equal(wait_exit(gp.pid, 10000), 1);
  close(gp.fd);
}

static void
test_garbage_and_oversized_frames(void **state)
{
  (void)state;
  static const unsigned char garbage[] = "\x00\x00\x00\x10GET / HTTP/1.1\r\n";
  expect_session_ends(garbage, sizeof garbage - 1, "not JSON");
  static const unsigned char oversized[] = {0x7f, 0xff, 0xff, 0xff, '{'};
  expect_session_ends(oversized, sizeof oversized, "outside 1..");
  static const unsigned char array[] = "\x00\x00\x00\x02[]";
  expect_session_ends(array, sizeof array - 1, "not exactly one JSON object");
  static const unsigned char two[] = "\x00\x00\x00\x04{}{}";
  expect_session_ends(two, sizeof two - 1, "not exactly one JSON object");
  unsigned char rnd[4096];
  eph_random_bytes(rnd, sizeof rnd);
  rnd[0] = 0x00; /* a 256-byte frame of random bytes */
  rnd[1] = 0x00;
  rnd[2] = 0x01;
  rnd[3] = 0x00;
  rnd[4] = '\x01'; /* never valid JSON */
  expect_session_ends(rnd, sizeof rnd, "JSON");

  /* Well-formed frames with bad content get a per-request error; the session goes on. */
  guest_proc_t gp;
  start_guest(&gp);
  eph_error_t err = {0};
  eph_exec_request_t req = {.struct_size = sizeof req, .command = "true", .cwd = "relative"};
  eph_exec_result_t res;
  assert_int_equal(eph_guest_exec(gp.g, &req, &res, &err), -EINVAL);
  assert_non_null(strstr(err.message, "cwd"));
  assert_false(eph_guest_broken(gp.g));
  run(&gp, "echo still", 0, &res);
  assert_string_equal(res.stdout_text, "still\n");
  eph_exec_result_clear(&res);
  stop_guest(&gp);
}

/* A broken guest on the other side: the client reports it and never crashes. */
static void
test_client_rejects_bad_guest(void **state)
{
  (void)state;
  static const struct {
    const char *bytes;
    size_t n;
    int code;
  } cases[] = {
      {"\xff\xff\xff\xff", 4, EPH_E_PROTOCOL},
      {"\x00\x00\x00\x05hello", 9, EPH_E_PROTOCOL},
      {"\x00\x00\x00\x1c{\"type\":\"hello\",\"version\":2}", 32, EPH_E_PROTOCOL},
      {"\x00\x00\x00\x0a{\"type\":1}", 14, EPH_E_PROTOCOL},
      {"\x00\x00", 2, EPH_E_PROTOCOL}, /* ends inside a frame */
      {"", 0, EPIPE},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    assert_int_equal(write(sv[1], cases[i].bytes, cases[i].n), (ssize_t)cases[i].n);
    close(sv[1]);
    eph_guest_t *g = NULL;
    eph_error_t err = {0};
    int r = eph_guest_open(sv[0], eph_now_ms() + 2000, &g, &err);
    assert_int_equal(r, -cases[i].code);
    assert_null(g);
  }
  /* Silence: the hello deadline holds. */
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  eph_guest_t *g = NULL;
  eph_error_t err = {0};
  int64_t t0 = eph_now_ms();
  assert_int_equal(eph_guest_open(sv[0], t0 + 300, &g, &err), -ETIMEDOUT);
  assert_true(eph_now_ms() - t0 >= 300);
  close(sv[1]);
}

/* Writes obj as one frame to fd (the fake guest's side of a socketpair). */
static void
fake_send(int fd, const char *json)
{
  json_object *o = json_tokener_parse(json);
  assert_non_null(o);
  assert_int_equal(eph_proto_write_frame(fd, o), 0);
  json_object_put(o);
}

/* A guest answering the right id with the wrong type. The client used to free the frame
 * and then print its `type` into the error (a use-after-free ASan reports); now the error
 * names the type and the connection is marked unusable. */
static void
test_client_wrong_reply_type(void **state)
{
  (void)state;
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  fake_send(sv[1], "{\"type\":\"hello\",\"version\":1,\"scratch\":\"/s\",\"kernel\":\"k\"}");
  /* Request 1 will be list_dir; its reply comes with another type (a long one, so a
   * freed string would be a real heap block). */
  fake_send(sv[1], "{\"type\":\"entries-but-not-really-the-type-that-was-asked-for\",\"id\":1}");
  eph_guest_t *g = NULL;
  eph_error_t err = {0};
  assert_int_equal(eph_guest_open(sv[0], eph_now_ms() + 2000, &g, &err), 0);
  eph_dirent_t *ents = NULL;
  size_t n = 0;
  int r = eph_guest_list(g, "", &ents, &n, &err);
  assert_int_equal(r, -EPH_E_PROTOCOL);
  assert_non_null(strstr(err.message, "got 'entries-but-not-really"));
  assert_true(eph_guest_broken(g));
  eph_guest_close(g);
  close(sv[1]);

  /* The same handling from bytes alone, as the fuzz target drives it. */
  static const struct {
    const char *body;
    int64_t id;
    int want_r;
    bool fatal;
    size_t extra; /* bytes after the string's end counted in (its NUL) */
  } cases[] = {
      {"{\"type\":\"entries\",\"id\":3}", 3, EPH_GUEST_REPLY_MATCH, false, 0},
      {"{\"type\":\"entries\",\"id\":2}", 3, EPH_GUEST_REPLY_STALE, false, 0},
      {"{\"type\":\"pong\",\"id\":3}", 3, -EPH_E_PROTOCOL, true, 0},
      {"{\"id\":3}", 3, -EPH_E_PROTOCOL, true, 0},
      {"{\"type\":\"error\",\"id\":3,\"errno\":2,\"message\":\"m\"}", 3, -ENOENT, false, 0},
      {"{\"type\":\"error\",\"fatal\":true}", 3, -EPH_E_PROTOCOL, true, 0},
      {"{\"type\":\"entries\",\"id\":3}{}", 3, -EPH_E_PROTOCOL, true, 0},
      {"[1]", 3, -EPH_E_PROTOCOL, true, 0},
      {"{\"type\":\"entries\",\"id\":3}", 3, -EPH_E_PROTOCOL, true, 1}, /* a NUL after it */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    json_object *out = NULL;
    bool fatal = false;
    eph_error_t e = {0};
    size_t len = strlen(cases[i].body) + cases[i].extra;
    r = eph_guest_reply_bytes(cases[i].body, len, cases[i].id, "entries", &out, &fatal, &e);
    assert_int_equal(r, cases[i].want_r);
    assert_int_equal(fatal, cases[i].fatal);
    assert_true((out != NULL) == (r == EPH_GUEST_REPLY_MATCH));
    json_object_put(out);
  }
}

static void
test_capture(void **state)
{
  (void)state;
  eph_capture_t c;
  size_t n;
  int trunc;
  uint64_t dropped;
  eph_capture_init(&c, 10);
  eph_capture_add(&c, "abc", 3);
  char *s = eph_capture_finish(&c, &n, &trunc, &dropped);
  assert_string_equal(s, "abc");
  assert_int_equal(trunc, 0);
  free(s);

  eph_capture_init(&c, 10);
  eph_capture_add(&c, "0123456789", 10); /* exactly the cap: nothing dropped */
  s = eph_capture_finish(&c, &n, &trunc, &dropped);
  assert_string_equal(s, "0123456789");
  assert_int_equal(trunc, 0);
  free(s);

  eph_capture_init(&c, 10);
  for (char ch = 'a'; ch <= 'z'; ch++) /* byte by byte through the ring */
    eph_capture_add(&c, &ch, 1);
  s = eph_capture_finish(&c, &n, &trunc, &dropped);
  assert_string_equal(s, "abcde\n[... 16 bytes dropped ...]\nvwxyz");
  assert_int_equal(trunc, 1);
  assert_int_equal(dropped, 16);
  assert_int_equal(n, strlen(s));
  free(s);

  eph_capture_init(&c, 10);
  eph_capture_add(&c, "ABCDEFG", 7);
  eph_capture_add(&c, "HIJKLMNOPQRSTUVWXYZ", 19); /* one chunk larger than the tail */
  eph_capture_add(&c, "12", 2);
  s = eph_capture_finish(&c, &n, &trunc, &dropped);
  assert_string_equal(s, "ABCDE\n[... 18 bytes dropped ...]\nXYZ12");
  free(s);
}

/* ---------------------------------------------------------------- the shell tool */

/* A fake core for the tool-shell plugin: its sandbox_exec reaches a real guest. */
static eph_guest_t *tool_guest;

static int
fake_sandbox_exec(eph_run_t *run, const eph_exec_request_t *req, eph_exec_result_t *result,
                  eph_error_t *err)
{
  (void)run;
  return eph_guest_exec(tool_guest, req, result, err);
}

static json_object *
tool_call(const eph_plugin_t *p, void *st, const char *args_json, int64_t deadline_ms)
{
  const eph_tool_ops_t *ops = p->ops;
  json_object *args = json_tokener_parse(args_json);
  assert_non_null(args);
  eph_tool_call_t call = {.struct_size = sizeof call,
                          .run_id = "run_test",
                          .tool = "shell",
                          .args = args,
                          .deadline_ms = deadline_ms};
  json_object *result = NULL;
  eph_error_t err = {0};
  int r = ops->call(st, &call, &result, &err);
  json_object_put(args);
  if (r < 0)
    fail_msg("shell call: %s", err.message);
  return result;
}

static const char *
jstr(json_object *o, const char *key)
{
  json_object *v;
  return json_object_object_get_ex(o, key, &v) ? json_object_get_string(v) : NULL;
}

static int64_t
jint(json_object *o, const char *key)
{
  json_object *v;
  return json_object_object_get_ex(o, key, &v) ? json_object_get_int64(v) : -999;
}

static void
test_shell_tool(void **state)
{
  (void)state;
  const char *b = getenv("EPH_BUILDDIR");
  char so[4096];
  snprintf(so, sizeof so, "%s/plugins/.libs/tool-shell.so", b ? b : EPH_BUILDDIR);
  void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!h)
    skip(); /* built with --disable-tool-shell */
  const eph_plugin_t *p = dlsym(h, EPH_PLUGIN_SYMBOL);
  assert_non_null(p);
  assert_string_equal(p->name, "tool-shell");
  assert_int_equal(p->kind, EPH_KIND_TOOL);
  const eph_tool_ops_t *ops = p->ops;
  assert_int_equal(ops->n_tools, 1);
  assert_string_equal(ops->tools[0].name, "shell");
  assert_int_equal(ops->tools[0].permission, EPH_PERM_SHELL);
  json_object *schema = json_tokener_parse(ops->tools[0].parameters_json);
  assert_non_null(schema);
  json_object_put(schema);

  guest_proc_t gp;
  start_guest(&gp);
  tool_guest = gp.g;
  eph_host_t host = {.struct_size = sizeof host,
                     .abi_major = EPH_ABI_MAJOR,
                     .abi_minor = EPH_ABI_MINOR,
                     .cfg_int = eph_cfg_int,
                     .cfg_bool = eph_cfg_bool,
                     .cfg_string = eph_cfg_string,
                     .sandbox_exec = fake_sandbox_exec,
                     .exec_result_clear = eph_exec_result_clear};
  config_t cfg;
  config_init(&cfg);
  assert_int_equal(config_read_string(&cfg,
                                      "tool-shell: { output_cap_bytes = 100; "
                                      "max_timeout_seconds = 2; default_timeout_seconds = 2; };"),
                   CONFIG_TRUE);
  void *st = NULL;
  eph_error_t err = {0};
  assert_int_equal(p->init(&host, config_lookup(&cfg, "tool-shell"), &st, &err), 0);

  json_object *r = tool_call(p, st, "{\"command\":\"echo hi; echo err >&2; exit 2\"}", 0);
  assert_int_equal(jint(r, "exit_code"), 2);
  assert_string_equal(jstr(r, "stdout"), "hi\n");
  assert_string_equal(jstr(r, "stderr"), "err\n");
  assert_string_equal(jstr(r, "reason"), "exited");
  assert_string_equal(jstr(r, "stdout_truncated"), "false");
  assert_true(jint(r, "duration_ms") >= 0);
  assert_int_equal(jint(r, "signal"), -999);
  json_object_put(r);

  /* The configured cap: head and tail of 50 bytes each, the middle replaced. */
  r = tool_call(p, st, "{\"command\":\"seq 1 10000\"}", 0);
  assert_string_equal(jstr(r, "stdout_truncated"), "true");
  assert_non_null(strstr(jstr(r, "stdout"), "bytes dropped ...]"));
  assert_memory_equal(jstr(r, "stdout"), "1\n2\n3\n", 6);
  const char *out = jstr(r, "stdout");
  assert_string_equal(out + strlen(out) - 6, "10000\n");
  json_object_put(r);

  /* A timeout above max_timeout_seconds (2) is lowered to it. */
  int64_t t0 = eph_now_ms();
  r = tool_call(p, st, "{\"command\":\"sleep 20\",\"timeout_seconds\":100}", 0);
  assert_string_equal(jstr(r, "reason"), "timeout");
  assert_int_equal(jint(r, "signal"), SIGKILL);
  assert_int_equal(jint(r, "exit_code"), 128 + SIGKILL);
  assert_true(eph_now_ms() - t0 < 6000);
  json_object_put(r);

  /* The run deadline cuts a command short too. */
  t0 = eph_now_ms();
  r = tool_call(p, st, "{\"command\":\"sleep 20\"}", t0 + 400);
  assert_string_equal(jstr(r, "reason"), "timeout");
  json_object_put(r);
  r = tool_call(p, st, "{\"command\":\"true\"}", eph_now_ms() - 1);
  assert_non_null(jstr(r, "error"));
  json_object_put(r);

  /* Bytes that are not UTF-8 reach the model as U+FFFD, so the result is valid JSON. */
  r = tool_call(p, st, "{\"command\":\"printf 'a\\\\377b\\\\000c'\"}", 0);
  assert_string_equal(jstr(r, "stdout"), "a\xef\xbf\xbd"
                                         "b\xef\xbf\xbd"
                                         "c");
  json_object_put(r);

  /* Bad arguments are answers for the model, not tool failures. */
  r = tool_call(p, st, "{}", 0);
  assert_non_null(strstr(jstr(r, "error"), "command"));
  json_object_put(r);
  r = tool_call(p, st, "{\"command\":\"true\",\"timeout_seconds\":\"soon\"}", 0);
  assert_non_null(strstr(jstr(r, "error"), "timeout_seconds"));
  json_object_put(r);

  p->fini(st);
  config_destroy(&cfg);
  stop_guest(&gp);
  tool_guest = NULL;
  dlclose(h);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_capture),
      cmocka_unit_test(test_client_rejects_bad_guest),
      cmocka_unit_test(test_client_wrong_reply_type),
      cmocka_unit_test(test_hello_and_identity),
      cmocka_unit_test(test_worker_is_unprivileged),
      cmocka_unit_test(test_stdin_binary),
      cmocka_unit_test(test_files_round_trip),
      cmocka_unit_test(test_huge_output_capped),
      cmocka_unit_test(test_timeout_kills_group),
      cmocka_unit_test(test_background_killed_at_shutdown),
      cmocka_unit_test(test_kill_and_disk_full),
      cmocka_unit_test(test_garbage_and_oversized_frames),
      cmocka_unit_test(test_shell_tool),
  };
  return cmocka_run_group_tests(tests, setup_all, NULL);
}
