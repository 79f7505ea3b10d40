/* The guest protocol, end to end, from the guest's side: the core's guest client against a
 * real ephemeral-guest process on a socketpair (tests/guest_fixture.c). What the client does
 * with a broken or hostile guest, and the shell tool over a guest: tests/test-guest-client.c. Each
 * guest runs as PID 1 of a fresh pid + mount namespace with its own /proc and an 8 MiB tmpfs on
 * /tmp (so the tests also see what the worker sees and can fill the disk), and runs commands as the
 * worker uid 1000. Needs root: skipped otherwise. */
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
#include "guest_fixture.h"
#include "util.h"

/* The ASan quarantine would keep up to 256 MiB of freed frames resident and hide whether
 * the client's memory stays flat; a small one keeps the RSS figure honest. */
const char *__asan_default_options(void);
const char *
__asan_default_options(void)
{
  return "quarantine_size_mb=4";
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
  guest_run(&gp, "id -u; id -g; id -G; pwd; echo \"$HOME $USER $LOGNAME $PATH\"", 0, &res);
  char want[1024];
  snprintf(want, sizeof want,
           "1000\n1000\n1000\n%s\n%s worker worker /usr/local/bin:/usr/bin:/bin\n", scratch,
           scratch);
  assert_string_equal(res.stdout_text, want);
  assert_int_equal(res.exit_code, 0);
  assert_int_equal(res.reason, EPH_END_EXITED);
  eph_exec_result_clear(&res);

  guest_run(&gp, "echo out; echo err >&2; exit 3", 0, &res);
  assert_string_equal(res.stdout_text, "out\n");
  assert_string_equal(res.stderr_text, "err\n");
  assert_int_equal(res.exit_code, 3);
  assert_int_equal(res.signal, 0);
  eph_exec_result_clear(&res);

  guest_run(&gp, "kill -TERM $$", 0, &res);
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
  guest_run(&gp,
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
  guest_run(&gp, "unshare -U true", 0, &res);
  assert_int_not_equal(res.exit_code, 0);
  assert_non_null(strstr(res.stderr_text, "Operation not permitted"));
  eph_exec_result_clear(&res);

  /* The guest (PID 1) is not dumpable: its fds and memory are closed to the worker. */
  guest_run(&gp, "ls /proc/1/fd; cat /proc/1/environ", 0, &res);
  assert_int_not_equal(res.exit_code, 0);
  assert_non_null(strstr(res.stderr_text, "Permission denied"));
  assert_string_equal(res.stdout_text, "");
  eph_exec_result_clear(&res);

  /* The control stream is not among the worker's descriptors: only 0, 1, 2 (and the one
   * ls opens to list the directory). */
  guest_run(&gp, "ls /proc/self/fd | sort -n | tr '\\n' ' '", 0, &res);
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
  guest_run(&gp, "echo after", 0, &res);
  assert_string_equal(res.stdout_text, "after\n");
  eph_exec_result_clear(&res);

  /* The same with another process in the sandbox (a background job left by a command): the
   * guest then forks the worker instead of vfork'ing it, and the failed step still reaches
   * it (shared memory, not the child's copy of the guest's). */
  guest_run(&gp, "sleep 60 >/dev/null 2>&1 &", 0, &res);
  eph_exec_result_clear(&res);
  memset(&res, 0, sizeof res);
  err = (eph_error_t){0};
  assert_true(eph_guest_exec(gp.g, &bad, &res, &err) < 0);
  assert_non_null(strstr(err.message, "worker set-up failed at chdir"));
  eph_exec_result_clear(&res);
  guest_run(&gp, "echo still", 0, &res);
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
  guest_run(&gp, "wc -c", 2000, &res);
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
  guest_run(&gp, "stat -c '%u %g %s' dir/sub/blob.bin; md5sum < dir/sub/blob.bin | cut -c1-32", 0,
            &res);
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
  guest_run(&gp, "ln -s /etc/passwd evil; ln -s / root; mkfifo pipe", 0, &res);
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
  guest_run(&gp, "echo before; sleep 30 | sleep 31 & sleep 32", 500, &res);
  int64_t ms = eph_now_ms() - t0;
  assert_int_equal(res.reason, EPH_END_TIMEOUT);
  assert_int_equal(res.signal, SIGKILL);
  assert_string_equal(res.stdout_text, "before\n");
  assert_true(ms >= 500 && ms < 5000);
  assert_true(res.duration_ms >= 500);
  eph_exec_result_clear(&res);
  /* Every process of the command's group died with it. */
  guest_run(&gp, "cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -c 'sleep 3[012]'", 0, &res);
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
  guest_run(&gp, cmd, 0, &res);
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
  guest_run(&gp, "sleep 20", 0, &res);
  pthread_join(t, NULL);
  assert_int_equal(res.reason, EPH_END_KILLED);
  assert_int_equal(res.signal, SIGKILL);
  eph_exec_result_clear(&res);

  /* /tmp is an 8 MiB tmpfs: writing 64 MiB fills it. */
  guest_run(&gp, "dd if=/dev/zero of=fill bs=1M count=64", 0, &res);
  assert_int_not_equal(res.exit_code, 0);
  assert_int_equal(res.reason, EPH_END_DISK_FULL);
  eph_exec_result_clear(&res);
  /* A command that succeeds on the full disk is not misreported. */
  guest_run(&gp, "true", 0, &res);
  assert_int_equal(res.reason, EPH_END_EXITED);
  eph_exec_result_clear(&res);
  /* Writing through the protocol reports the errno. */
  eph_error_t err = {0};
  char blob[100000] = {0};
  assert_int_equal(eph_guest_write(gp.g, "more", blob, sizeof blob, &err), -ENOSPC);
  guest_run(&gp, "rm -f fill more; echo ok", 0, &res);
  assert_string_equal(res.stdout_text, "ok\n");
  eph_exec_result_clear(&res);
  stop_guest(&gp);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hello_and_identity),
      cmocka_unit_test(test_worker_is_unprivileged),
      cmocka_unit_test(test_stdin_binary),
      cmocka_unit_test(test_files_round_trip),
      cmocka_unit_test(test_huge_output_capped),
      cmocka_unit_test(test_timeout_kills_group),
      cmocka_unit_test(test_background_killed_at_shutdown),
      cmocka_unit_test(test_kill_and_disk_full),
  };
  return cmocka_run_group_tests(tests, guest_fixture_setup, NULL);
}
