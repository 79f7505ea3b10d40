/* Calls each system call the worker must not have, as a raw syscall with plausible
 * arguments, and prints "<name> <errno name>" per line ("ok" when it succeeded). Run inside
 * a sandbox by tests/sandbox.test, which expects EPERM on every line. Static (it is copied
 * into scratch). Refuses to run as uid 0 so it never probes a host: reboot is called with an
 * invalid magic anyway. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/perf_event.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <unistd.h>

static void
report(const char *name, long r)
{
  const char *e = r == 0                     ? "ok"
                  : errno == EPERM           ? "EPERM"
                  : errno == EACCES          ? "EACCES"
                  : errno == ENOSYS          ? "ENOSYS"
                  : errno == EINVAL          ? "EINVAL"
                  : errno == EFAULT          ? "EFAULT"
                  : errno == EBADF           ? "EBADF"
                  : errno == ENOENT          ? "ENOENT"
                  : errno == EAFNOSUPPORT    ? "EAFNOSUPPORT"
                  : errno == EPROTONOSUPPORT ? "EPROTONOSUPPORT"
                                             : "OTHER";
  if (r >= 0 && r != 0)
    e = "ok";
  printf("%s %s\n", name, e);
}

int
main(void)
{
  if (getuid() == 0) {
    fprintf(stderr, "syscall-probe: refusing to run as root\n");
    return 2;
  }
  union bpf_attr battr;
  struct perf_event_attr pattr;
  memset(&battr, 0, sizeof battr);
  memset(&pattr, 0, sizeof pattr);
  pattr.size = sizeof pattr;
  pattr.type = PERF_TYPE_SOFTWARE;
  pattr.config = PERF_COUNT_SW_CPU_CLOCK;
  unsigned char handle[128];
  memset(handle, 0, sizeof handle);
  handle[0] = 8; /* struct file_handle: handle_bytes */
  int nsfd = open("/proc/self/ns/uts", O_RDONLY);

  errno = 0;
  report("mount", syscall(SYS_mount, "none", "/tmp", "tmpfs", 0L, NULL));
  errno = 0;
  report("ptrace", syscall(SYS_ptrace, PTRACE_TRACEME, 0L, NULL, NULL));
  errno = 0;
  report("bpf", syscall(SYS_bpf, BPF_MAP_CREATE, &battr, sizeof battr));
  errno = 0;
  report("perf_event_open", syscall(SYS_perf_event_open, &pattr, 0, -1, -1, 0L));
  errno = 0;
  report("keyctl", syscall(SYS_keyctl, 0L /* KEYCTL_GET_KEYRING_ID */, -3L, 0L));
  errno = 0;
  report("add_key", syscall(SYS_add_key, "user", "probe", "x", 1L, -3L));
  errno = 0;
  report("kexec_load", syscall(SYS_kexec_load, 0L, 0L, NULL, 0L));
  errno = 0;
  report("init_module", syscall(SYS_init_module, NULL, 0L, ""));
  errno = 0;
  report("reboot", syscall(SYS_reboot, 0L, 0L, 0L, NULL));
  errno = 0;
  report("swapon", syscall(SYS_swapon, "/tmp", 0L));
  errno = 0;
  report("setns", syscall(SYS_setns, nsfd, 0L));
  errno = 0;
  report("unshare", syscall(SYS_unshare, (long)CLONE_NEWUSER));
  errno = 0;
  report("open_by_handle_at", syscall(SYS_open_by_handle_at, AT_FDCWD, handle, 0L));
  errno = 0;
  report("userfaultfd", syscall(SYS_userfaultfd, 0L));

  /* Socket families the worker must not open (EAFNOSUPPORT expected): vsock reaches past
   * the network namespace; AF_UNIX with garbage in the register's upper half must be
   * refused too, though the kernel would only read the low 32 bits. A success returns an
   * fd, reported as "ok". */
  int sv[2];
  errno = 0;
  report("socket-vsock", syscall(SYS_socket, 40L /* AF_VSOCK */, 1L, 0L));
  errno = 0;
  report("socket-packet", syscall(SYS_socket, 17L /* AF_PACKET */, 3L, 0L));
  errno = 0;
  report("socket-alg", syscall(SYS_socket, 38L /* AF_ALG */, 5L, 0L));
  errno = 0;
  report("socketpair-vsock", syscall(SYS_socketpair, 40L, 1L, 0L, sv));
  errno = 0;
  report("socket-unix-high-bits", syscall(SYS_socket, 0x100000001L, 1L, 0L));
  errno = 0;
  report("socket-netlink-uevent", syscall(SYS_socket, 16L, 3L, 15L));
  return 0;
}
