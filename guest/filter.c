/* The workers' seccomp filter: its rules, and libseccomp's compilation of them to a BPF
 * program. guest/gen-filter runs this when the guest is built and writes the program into
 * guest/guest-filter.h, which the guest installs as it is (worker.c: guest_seccomp_compile);
 * a guest built where that program cannot run (cross-compiled) links this file and compiles
 * at start-up instead. tests/test-guest-filter checks the two agree. */
#include <config.h>

#include "guest.h"

#include <errno.h>
#include <linux/netlink.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <termios.h>
#include <unistd.h>

/* Refused with EPERM: system calls that change the machine, other namespaces, the kernel,
 * or reach into another process. Most already need a capability the worker lacks; the
 * filter is the second wall in case a kernel bug hands one back. */
static const char *const denied_eperm[] = {
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "setns",
    "unshare",
    "open_by_handle_at",
    "name_to_handle_at",
    "userfaultfd",
    "acct",
    "iopl",
    "ioperm",
    "quotactl",
    "lookup_dcookie",
    "syslog",
    "vhangup",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    /* No privilege needed, but a large kernel attack surface with its own stream of
     * privilege escalations; Docker, ChromeOS and Android refuse it too. */
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    NULL,
};

/* clone() flags that would create a namespace. */
static const unsigned long ns_flags[] = {
    CLONE_NEWNS,  CLONE_NEWUTS, CLONE_NEWIPC,    CLONE_NEWUSER,
    CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWCGROUP,
};

/* Address families a worker may open. Everything else fails with EAFNOSUPPORT, as on a
 * kernel built without it: AF_VSOCK is not scoped by the network namespace (it reaches the
 * host or other guests), AF_PACKET, AF_ALG, AF_BLUETOOTH, AF_RDS, AF_TIPC, ... are kernel
 * attack surface no shell command needs. AF_NETLINK is kept for NETLINK_ROUTE only:
 * glibc's getaddrinfo(AI_ADDRCONFIG) and getifaddrs() read the interfaces through it. */
static const int allowed_families[] = {AF_UNIX, AF_INET, AF_INET6, AF_NETLINK};

/* Rules on socket() and socketpair() arg0 (the family). The filter allows by default, so
 * the complement of allowed_families is denied: every value from 0 to the largest allowed
 * family that is not in the list, one EQ rule each, and everything above it with one GT
 * rule. The comparison is on the whole 64-bit register, so garbage in the upper half or a
 * negative int is above the largest family and denied too (fail closed; the kernel would
 * have read only the low 32 bits). */
static int
add_socket_family_rules(scmp_filter_ctx ctx, char *why, size_t why_size)
{
  static const int calls[] = {SCMP_SYS(socket), SCMP_SYS(socketpair)};
  int top = 0, r;
  for (size_t i = 0; i < sizeof allowed_families / sizeof allowed_families[0]; i++)
    if (allowed_families[i] > top)
      top = allowed_families[i];
  for (size_t c = 0; c < sizeof calls / sizeof calls[0]; c++) {
    for (int fam = 0; fam <= top; fam++) {
      bool allowed = false;
      for (size_t i = 0; i < sizeof allowed_families / sizeof allowed_families[0]; i++)
        allowed = allowed || allowed_families[i] == fam;
      if (allowed)
        continue;
      if ((r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), calls[c], 1,
                                SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)fam))) < 0)
        goto fail;
    }
    if ((r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), calls[c], 1,
                              SCMP_A0(SCMP_CMP_GT, (scmp_datum_t)top))) < 0)
      goto fail;
    /* Netlink: the routing family only (NETLINK_ROUTE is protocol 0). Audit, uevents,
     * netfilter, xfrm, crypto... are refused like a missing protocol. */
    if ((r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPROTONOSUPPORT), calls[c], 2,
                              SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)AF_NETLINK),
                              SCMP_A2(SCMP_CMP_NE, (scmp_datum_t)NETLINK_ROUTE))) < 0)
      goto fail;
  }
  return 0;
fail:
  snprintf(why, why_size, "seccomp rule socket family: %s", strerror(-r));
  return -1;
}

scmp_filter_ctx
guest_seccomp_build(char *why, size_t why_size)
{
  /* Default allow; a syscall of another architecture (int 0x80, x32) kills the process:
   * libseccomp's default bad-arch action, since only the native arch is in the filter. */
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx) {
    snprintf(why, why_size, "seccomp_init failed");
    return NULL;
  }
  int r;
  for (size_t i = 0; denied_eperm[i]; i++) {
    int nr = seccomp_syscall_resolve_name(denied_eperm[i]);
    if (nr == __NR_SCMP_ERROR)
      continue; /* not on this architecture */
    if ((r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0)) < 0) {
      snprintf(why, why_size, "seccomp rule %s: %s", denied_eperm[i], strerror(-r));
      goto fail;
    }
  }
  /* clone3 passes its flags in memory the filter cannot read: ENOSYS makes glibc fall
   * back to clone(), whose flags register is checked below. */
  if ((r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0)) < 0) {
    snprintf(why, why_size, "seccomp rule clone3: %s", strerror(-r));
    goto fail;
  }
  for (size_t i = 0; i < sizeof ns_flags / sizeof ns_flags[0]; i++) {
#if defined(__s390__) || defined(__s390x__)
    struct scmp_arg_cmp cmp = SCMP_A1(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]);
#else
    struct scmp_arg_cmp cmp = SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]);
#endif
    if ((r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1, cmp)) < 0) {
      snprintf(why, why_size, "seccomp rule clone flags: %s", strerror(-r));
      goto fail;
    }
  }
  if (add_socket_family_rules(ctx, why, why_size) < 0)
    goto fail;
  /* Pushing bytes into a terminal's input queue would type commands for someone else. */
  static const unsigned long tty_inject[] = {TIOCSTI, TIOCLINUX};
  for (size_t i = 0; i < 2; i++) {
    if ((r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                              SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffUL, tty_inject[i]))) < 0) {
      snprintf(why, why_size, "seccomp rule ioctl: %s", strerror(-r));
      goto fail;
    }
  }
  return ctx;
fail:
  seccomp_release(ctx);
  return NULL;
}

int
guest_seccomp_generate(guest_filter_t *out, char *why, size_t why_size)
{
  *out = (guest_filter_t){0};
  scmp_filter_ctx ctx = guest_seccomp_build(why, why_size);
  if (!ctx)
    return -EINVAL;
  /* libseccomp 2.5 exports only to a descriptor: a memfd, read back whole. */
  int fd = memfd_create("seccomp-bpf", MFD_CLOEXEC);
  int r = fd < 0 ? -errno : seccomp_export_bpf(ctx, fd);
  seccomp_release(ctx);
  off_t size = r < 0 ? -1 : lseek(fd, 0, SEEK_END);
  size_t n = size > 0 ? (size_t)size / sizeof(struct sock_filter) : 0;
  if (r == 0 && (n == 0 || n > BPF_MAXINSNS || (size_t)size % sizeof(struct sock_filter)))
    r = -EINVAL;
  struct sock_filter *insns = r == 0 ? malloc((size_t)size) : NULL;
  if (r == 0 && (!insns || pread(fd, insns, (size_t)size, 0) != size))
    r = insns ? -EIO : -ENOMEM;
  if (fd >= 0)
    close(fd);
  if (r < 0) {
    free(insns);
    snprintf(why, why_size, "seccomp: compiling the filter: %s", strerror(-r));
    return r;
  }
  out->prog = (struct sock_fprog){.len = (unsigned short)n, .filter = insns};
  return 0;
}
