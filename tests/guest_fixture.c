/* The guest tests' fixture: see guest_fixture.h. */
#include <config.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "guest_fixture.h"
#include "util.h"

char guest_path[4096];

char guest_path[4096];

int
guest_fixture_setup(void **state)
{
  (void)state;
  const char *b = getenv("EPH_BUILDDIR");
  snprintf(guest_path, sizeof guest_path, "%s/guest/ephemeral-guest", b ? b : EPH_BUILDDIR);
  return 0;
}

/* Starts a guest in new pid and mount namespaces. Returns our end of the stream. */
void
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

void
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
int
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

void
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

int
guest_run(guest_proc_t *gp, const char *command, uint32_t timeout_ms, eph_exec_result_t *res)
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
