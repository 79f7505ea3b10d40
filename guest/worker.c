/* Turning a forked child of the guest into the worker: the order is written out plainly,
 * as in bubblewrap, and every step that fails stops the child before exec.
 *
 *   1. its own process group (timeouts kill the whole group, and the main process by
 *      pid: sharing the guest's session it may setpgid() into another worker's group), in
 *      the guest's session, which has no controlling terminal (the guest left any at
 *      start-up), or else a new session (so no terminal of the host's is ever reachable
 *      through /dev/tty)
 *   2. stdin/stdout/stderr onto the pipes, every other descriptor closed (the control
 *      stream is never inherited)
 *   3. signal mask and dispositions back to defaults (the guest ignores SIGPIPE; it reset
 *      every other disposition at start-up and sets no handler); the scheduling policy
 *      back to SCHED_OTHER (the guest's SCHED_BATCH is inherited)
 *   4. rlimits: RLIMIT_NOFILE from the request; RLIMIT_CORE 0, RLIMIT_SIGPENDING and
 *      RLIMIT_MSGQUEUE small are the guest's own, inherited (set once at start-up, soft =
 *      hard: host-wide per-user counts, below)
 *   5. oom_score_adj 1000: the kernel kills worker processes first, never the guest
 *   6. bounding set empty: the guest emptied its own at start-up and a bounding set only
 *      ever shrinks (PR_CAPBSET_DROP is the one operation on it), so the worker's, inherited,
 *      is empty; ambient set cleared
 *   7. supplementary groups cleared, gid then uid switched to the worker (which empties
 *      the permitted and effective sets), capset() with empty sets to be explicit
 *   8. chdir to the working directory, as the worker (its permissions apply)
 *   9. PR_SET_NO_NEW_PRIVS, then the seccomp filter (compiled once per guest; in the jail
 *      installed on the guest itself, with no_new_privs, so inherited at fork and already
 *      in force: see guest_worker_exec)
 *  10. execve
 *
 * A failed step is written into the guest's memory (spec->failed; the child shares it
 * until execve), as posix_spawn reports its errno: no status pipe per command.
 */
#include <config.h>

#include "guest.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/capability.h>
#include <linux/netlink.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <paths.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

/* Signals with data (sigqueue, POSIX timers) one worker may have queued at once. */
#define GUEST_WORKER_SIGPENDING 256

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
guest_seccomp_compile(guest_filter_t *out, char *why, size_t why_size)
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

int
guest_seccomp_install(const struct sock_fprog *prog)
{
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
    return -errno;
  if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, prog) == 0)
    return 0;
  if (errno != ENOSYS)
    return -errno;
  return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prog, 0, 0) < 0 ? -errno : 0;
}

__attribute__((noreturn)) static void
die(const guest_worker_spec_t *spec, const char *step, int err)
{
  /* The parent sleeps until this child exits (CLONE_VFORK) and reads the message then. */
  snprintf(spec->failed, spec->failed_size, "%s: %s", step, strerror(err));
  _exit(126);
}

const int guest_ignored_signals[] = {SIGPIPE};
const size_t guest_n_ignored_signals =
    sizeof guest_ignored_signals / sizeof guest_ignored_signals[0];

int
guest_set_inherited_limits(const char **which)
{
  /* Queued signals and POSIX message queue bytes are counted per user at every level of
   * the user-namespace tree; on a shared kernel (the jail) the host's level is the uid that
   * created the sandbox, the daemon's, so without these one sandbox exhausts that uid's
   * quota host-wide (sigqueue and timer_create then fail with EAGAIN, mq_open with EMFILE,
   * in the daemon and in every other sandbox). Signals the kernel or kill(2) sends are never
   * refused for it (the guest's SIGCHLD and SIGTERM included); message queues are not a
   * shell tool's business, nor the guest's. Soft = hard: no worker can raise them back. */
  static const struct {
    int resource;
    rlim_t value;
    const char *name;
  } limits[] = {
      {RLIMIT_CORE, 0, "RLIMIT_CORE"},
      {RLIMIT_SIGPENDING, GUEST_WORKER_SIGPENDING, "RLIMIT_SIGPENDING"},
      {RLIMIT_MSGQUEUE, 0, "RLIMIT_MSGQUEUE"},
  };
  for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
    struct rlimit rl = {limits[i].value, limits[i].value};
    if (setrlimit(limits[i].resource, &rl) < 0) {
      *which = limits[i].name;
      return -errno;
    }
  }
  return 0;
}

int
guest_drop_bounding_set(void)
{
  /* PR_CAPBSET_READ fails with EINVAL past the kernel's last capability. Only what is
   * still in the set is dropped: each drop commits new credentials, so the guest empties
   * the set once at start-up and a worker, which inherits it empty, only reads it. */
  for (unsigned long cap = 0; cap < 64; cap++) {
    int in_set = prctl(PR_CAPBSET_READ, cap, 0, 0, 0);
    if (in_set < 0) {
      if (errno == EINVAL)
        break;
      return -errno;
    }
    if (in_set && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0)
      return -errno;
  }
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
    return -errno;
  return 0;
}

static int
clear_capability_sets(void)
{
  struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct data[2];
  memset(data, 0, sizeof data);
  if (syscall(SYS_capset, &hdr, data) < 0)
    return -errno;
  /* Read back: nothing may be left in any set. */
  memset(data, 0xff, sizeof data);
  if (syscall(SYS_capget, &hdr, data) < 0)
    return -errno;
  for (int i = 0; i < 2; i++)
    if (data[i].effective || data[i].permitted || data[i].inheritable)
      return -EPERM;
  return 0;
}

/* execvpe() with the PATH of envp rather than of environ (which a CLONE_VM child must not
 * set: it is the guest's), following glibc's execvpe: a name with a slash is executed as
 * is; otherwise each PATH entry in turn (an empty one is the working directory), going on
 * past ENOENT, ENOTDIR, ESTALE, ENODEV and ETIMEDOUT, remembering EACCES; a file the kernel
 * does not recognise (ENOEXEC) runs as a /bin/sh script. Returns only on failure (errno). */
static void
exec_script(const char *file, char *const *argv, char *const *envp)
{
  size_t argc = 0;
  while (argv[argc])
    argc++;
  const char *sh_argv[argc + 2];
  sh_argv[0] = "/bin/sh";
  sh_argv[1] = file;
  for (size_t i = 1; i <= argc; i++)
    sh_argv[i + 1] = argv[i];
  execve("/bin/sh", (char *const *)sh_argv, envp);
}

static void
exec_in_path(char *const *argv, char *const *envp)
{
  const char *file = argv[0];
  if (!*file) {
    errno = ENOENT;
    return;
  }
  if (strchr(file, '/')) {
    execve(file, argv, envp);
    if (errno == ENOEXEC)
      exec_script(file, argv, envp);
    return;
  }
  const char *path = "/bin:/usr/bin"; /* glibc's default when PATH is unset */
  for (char *const *e = envp; *e; e++)
    if (strncmp(*e, "PATH=", 5) == 0)
      path = *e + 5;
  size_t flen = strlen(file);
  bool eacces = false;
  for (const char *p = path;; p++) {
    const char *end = strchrnul(p, ':');
    size_t dlen = (size_t)(end - p);
    char full[PATH_MAX];
    if (dlen + 1 + flen + 1 <= sizeof full) {
      memcpy(full, p, dlen);
      size_t at = dlen;
      if (dlen)
        full[at++] = '/';
      memcpy(full + at, file, flen + 1);
      execve(full, argv, envp);
      if (errno == ENOEXEC)
        exec_script(full, argv, envp);
      if (errno == EACCES)
        eacces = true;
      else if (errno != ENOENT && errno != ENOTDIR && errno != ESTALE && errno != ENODEV &&
               errno != ETIMEDOUT)
        return;
    }
    if (!*end)
      break;
    p = end;
  }
  errno = eacces ? EACCES : ENOENT;
}

void
guest_worker_exec(const guest_worker_spec_t *spec)
{
  if (spec->guest_session ? setpgid(0, 0) < 0 : setsid() < 0)
    die(spec, spec->guest_session ? "setpgid" : "setsid", errno);

  /* The guest keeps 0..2 open, so the pipes it made are above 2 and dup2() onto 0, 1, 2
   * cannot clobber one another. Were one below 3, each is first moved above 9. */
  int in = spec->stdin_fd, out = spec->stdout_fd, errfd = spec->stderr_fd;
  if (in < 3 || out < 3 || errfd < 3) {
    in = fcntl(in, F_DUPFD_CLOEXEC, 10);
    out = fcntl(out, F_DUPFD_CLOEXEC, 10);
    errfd = fcntl(errfd, F_DUPFD_CLOEXEC, 10);
    if (in < 0 || out < 0 || errfd < 0)
      die(spec, "dup", errno);
  }
  if (dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(errfd, 2) < 0)
    die(spec, "dup2", errno);
  if (close_range(3, ~0U, 0) < 0)
    die(spec, "close_range", errno);

  sigset_t none;
  sigemptyset(&none);
  if (sigprocmask(SIG_SETMASK, &none, NULL) < 0)
    die(spec, "sigprocmask", errno);
  for (size_t i = 0; i < guest_n_ignored_signals; i++)
    if (signal(guest_ignored_signals[i], SIG_DFL) == SIG_ERR)
      die(spec, "signal", errno);

  struct sched_param sp = {0};
  if (spec->guest_batch && sched_setscheduler(0, SCHED_OTHER, &sp) < 0)
    die(spec, "sched_setscheduler(SCHED_OTHER)", errno);

  struct rlimit nofile = {spec->nofile, spec->nofile};
  if (setrlimit(RLIMIT_NOFILE, &nofile) < 0)
    die(spec, "setrlimit(RLIMIT_NOFILE)", errno);

  /* Raising oom_score_adj needs no privilege. Without /proc (an odd backend) the worker
   * still runs, only the OOM preference is lost. */
  int oom = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (oom >= 0) {
    if (write(oom, "1000", 4) != 4)
      die(spec, "oom_score_adj", errno);
    close(oom);
  } else if (errno != ENOENT) {
    die(spec, "open(/proc/self/oom_score_adj)", errno);
  }

  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
    die(spec, "clearing the ambient capability set", errno);
  if (setgroups(0, NULL) < 0)
    die(spec, "setgroups", errno);
  if (setresgid(spec->gid, spec->gid, spec->gid) < 0)
    die(spec, "setresgid", errno);
  if (setresuid(spec->uid, spec->uid, spec->uid) < 0)
    die(spec, "setresuid", errno);
  int r;
  if ((r = clear_capability_sets()) < 0)
    die(spec, "capset", -r);
  if (spec->uid != 0 && (setuid(0) == 0 || seteuid(0) == 0))
    die(spec, "uid switch did not stick", EPERM);

  if (chdir(spec->cwd) < 0)
    die(spec, "chdir", errno);

  /* In the jail the filter was installed on the guest before its first command, after
   * no_new_privs, and came with fork(): the same program, in force from this child's first
   * instruction, so the steps above ran under it too (it refuses none of them), and
   * no_new_privs (which nothing can unset) with it. Installing it again would stack a second
   * copy and pay the kernel's BPF check and JIT per command. */
  if (!spec->filter->on_guest) {
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
      die(spec, "PR_SET_NO_NEW_PRIVS", errno);
    if ((r = guest_seccomp_install(&spec->filter->prog)) < 0)
      die(spec, "seccomp", -r);
  }

  /* The worker's own PATH decides what runs, never the guest's (possibly none as PID 1). */
  exec_in_path(spec->argv, spec->envp);
  int e = errno;
  /* Like a shell: 127 with a message on stderr when the program is missing. */
  dprintf(2, "%s: %s\n", spec->argv[0], strerror(e));
  _exit(e == ENOENT ? 127 : 126);
}

/* The child's stack: the guest is suspended while the child runs (CLONE_VFORK) and runs
 * one command at a time, so one stack serves them all. */
static char worker_stack[256 * 1024] __attribute__((aligned(64)));

static int
worker_main(void *arg)
{
  guest_worker_exec(arg);
}

/* Whether some process other than the guest exists in the sandbox: every process there is
 * a descendant of the guest (PID 1, or a subreaper outside a pid namespace), and orphans are
 * re-parented to it, so "the guest has no child at all" (ECHILD, whatever their state) means
 * nobody else is there. */
static bool
guest_has_children(void)
{
  siginfo_t si;
  return waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT | __WALL) == 0 || errno != ECHILD;
}

pid_t
guest_worker_spawn(const guest_worker_spec_t *spec)
{
  /* CLONE_VM | CLONE_VFORK, as posix_spawn does: no copy of the guest's page tables, no
   * copy-on-write faults in the guest afterwards, no teardown of the copy at execve. The
   * guest sleeps until the child has exec'd or exited, so the child has the memory to
   * itself meanwhile; it writes only its own stack (worker_stack) and errno, and reads
   * spec. Its files, signal handlers and fs (cwd) are its own copies (no CLONE_FILES,
   * CLONE_SIGHAND, CLONE_FS), so every set-up step acts on the child alone, as after fork.
   *
   * Only when no other process is in the sandbox, though. From its uid switch to its execve
   * the child is the worker's uid, so any worker process (a command's background job) may
   * SIGSTOP it there, and a guest in the vfork wait then sleeps with it: no kill frame, no
   * timeout, no reply until the host gives up on the guest (the red team froze PID 1 so
   * with `kill -STOP -1` in a loop). With anyone else around the child is forked: the guest
   * goes on, and a stopped child is one command that times out. */
  if (guest_has_children()) {
    pid_t pid = fork();
    if (pid == 0)
      guest_worker_exec(spec);
    return pid;
  }
  return clone(worker_main, worker_stack + sizeof worker_stack, CLONE_VM | CLONE_VFORK | SIGCHLD,
               (void *)spec);
}
