/* unit-seccomp: runs a command under the seccomp filters a systemd unit's directives make,
 * for tests/deb.test, where systemd is not PID 1 and cannot apply them itself. What each
 * option reproduces (systemd's src/shared/seccomp-util.c, as of systemd 252):
 *   --deny SYSCALL,...     SystemCallFilter=~... (names expanded from @groups by the caller
 *                          with `systemd-analyze syscall-filter`): each refused with
 *                          --errno; a name this libseccomp does not know is skipped, as
 *                          systemd skips it
 *   --errno NAME           SystemCallErrorNumber= (EPERM, EACCES or ENOSYS; empty or KILL:
 *                          the call kills the process, systemd's default)
 *   --families AF_X,...    RestrictAddressFamilies= (allow list): socket() of any other
 *                          family fails with EAFNOSUPPORT
 *   --namespaces T,...     RestrictNamespaces= (allow list of cgroup ipc net mnt pid user
 *                          uts time): nothing when every type is listed (systemd installs no
 *                          filter then); otherwise clone/unshare with another type's flag and
 *                          setns into one fail with EPERM, clone3 with ENOSYS
 *   --no-realtime          RestrictRealtime=yes: sched_setscheduler to FIFO, RR, DEADLINE
 *   --no-suid              RestrictSUIDSGID=yes: chmod/fchmod/fchmodat, open/openat/creat
 *                          with O_CREAT, mknod/mknodat, each with S_ISUID or S_ISGID
 *   --lock-personality     LockPersonality=yes: personality() other than PER_LINUX
 * Always: SystemCallArchitectures=native (the filter has the native architecture only, a
 * call of another one kills the process) and no_new_privs (systemd implies it for a non-root
 * user). Then execvp(CMD). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <seccomp.h>

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif

static scmp_filter_ctx ctx;

static void
rule(uint32_t action, const char *call, unsigned n, const struct scmp_arg_cmp *cmp)
{
  int nr = seccomp_syscall_resolve_name(call);
  if (nr == __NR_SCMP_ERROR)
    return; /* not on this architecture */
  int r = seccomp_rule_add_exact_array(ctx, action, nr, n, cmp);
  if (r == -EDOM)
    return; /* a name of another architecture (a pseudo number here): systemd skips it too */
  if (r < 0) {
    fprintf(stderr, "unit-seccomp: rule for %s: %s\n", call, strerror(-r));
    exit(125);
  }
}

/* -1: kill. */
static int
errno_named(const char *name)
{
  if (!*name || strcmp(name, "KILL") == 0)
    return -1;
  static const struct {
    const char *name;
    int value;
  } names[] = {{"EPERM", EPERM}, {"EACCES", EACCES}, {"ENOSYS", ENOSYS}};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (strcmp(name, names[i].name) == 0)
      return names[i].value;
  fprintf(stderr, "unit-seccomp: --errno %s: not one of EPERM, EACCES, ENOSYS\n", name);
  exit(125);
}

static void
deny(const char *list, int err)
{
  char *copy = strdup(list), *save = NULL;
  for (char *s = strtok_r(copy, ", ", &save); s; s = strtok_r(NULL, ", ", &save))
    rule(err < 0 ? SCMP_ACT_KILL_PROCESS : SCMP_ACT_ERRNO((uint32_t)err), s, 0, NULL);
  free(copy);
}

static int
family_named(const char *name)
{
  static const struct {
    const char *name;
    int value;
  } names[] = {{"AF_UNIX", AF_UNIX},       {"AF_INET", AF_INET},   {"AF_INET6", AF_INET6},
               {"AF_NETLINK", AF_NETLINK}, {"AF_VSOCK", AF_VSOCK}, {"AF_PACKET", AF_PACKET}};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (strcmp(name, names[i].name) == 0)
      return names[i].value;
  fprintf(stderr, "unit-seccomp: --families: unknown family %s\n", name);
  exit(125);
}

static void
families(const char *list)
{
  bool allowed[AF_MAX] = {false};
  char *copy = strdup(list), *save = NULL;
  for (char *s = strtok_r(copy, ", ", &save); s; s = strtok_r(NULL, ", ", &save))
    allowed[family_named(s)] = true;
  free(copy);
  for (int af = 0; af < AF_MAX; af++) {
    if (allowed[af])
      continue;
    struct scmp_arg_cmp c = SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)af);
    rule(SCMP_ACT_ERRNO(EAFNOSUPPORT), "socket", 1, &c);
  }
  struct scmp_arg_cmp beyond = SCMP_A0(SCMP_CMP_GE, AF_MAX);
  rule(SCMP_ACT_ERRNO(EAFNOSUPPORT), "socket", 1, &beyond);
}

static void
namespaces(const char *list)
{
  static const struct {
    const char *name;
    unsigned long flag;
  } types[] = {{"cgroup", CLONE_NEWCGROUP}, {"ipc", CLONE_NEWIPC},  {"net", CLONE_NEWNET},
               {"mnt", CLONE_NEWNS},        {"pid", CLONE_NEWPID},  {"user", CLONE_NEWUSER},
               {"uts", CLONE_NEWUTS},       {"time", CLONE_NEWTIME}};
  const size_t n = sizeof types / sizeof *types;
  bool kept[8] = {false};
  char *copy = strdup(list), *save = NULL;
  for (char *s = strtok_r(copy, ", ", &save); s; s = strtok_r(NULL, ", ", &save)) {
    size_t i = 0;
    while (i < n && strcmp(s, types[i].name) != 0)
      i++;
    if (i == n) {
      fprintf(stderr, "unit-seccomp: --namespaces: unknown type %s\n", s);
      exit(125);
    }
    kept[i] = true;
  }
  free(copy);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    k += kept[i];
  if (k == n)
    return; /* systemd: every type retained is no filter at all */
  rule(SCMP_ACT_ERRNO(ENOSYS), "clone3", 0, NULL);
  struct scmp_arg_cmp zero = SCMP_A1(SCMP_CMP_EQ, 0);
  rule(SCMP_ACT_ERRNO(EPERM), "setns", 1, &zero);
  for (size_t i = 0; i < n; i++) {
    if (kept[i])
      continue;
    struct scmp_arg_cmp a0 = SCMP_A0(SCMP_CMP_MASKED_EQ, types[i].flag, types[i].flag);
    struct scmp_arg_cmp a1 = SCMP_A1(SCMP_CMP_MASKED_EQ, types[i].flag, types[i].flag);
    rule(SCMP_ACT_ERRNO(EPERM), "unshare", 1, &a0);
    rule(SCMP_ACT_ERRNO(EPERM), "clone", 1, &a0); /* x86-64: flags are the first argument */
    rule(SCMP_ACT_ERRNO(EPERM), "setns", 1, &a1);
  }
}

static void
no_realtime(void)
{
  static const int rt[] = {SCHED_FIFO, SCHED_RR, 6 /* SCHED_DEADLINE */};
  for (size_t i = 0; i < sizeof rt / sizeof *rt; i++) {
    struct scmp_arg_cmp c = SCMP_A1(SCMP_CMP_MASKED_EQ, 0x3fffffff, (scmp_datum_t)rt[i]);
    rule(SCMP_ACT_ERRNO(EPERM), "sched_setscheduler", 1, &c);
  }
}

static void
no_suid(void)
{
  static const scmp_datum_t bits[] = {S_ISUID, S_ISGID};
  for (size_t i = 0; i < 2; i++) {
    scmp_datum_t b = bits[i];
    struct scmp_arg_cmp m1 = SCMP_A1(SCMP_CMP_MASKED_EQ, b, b);
    struct scmp_arg_cmp m2 = SCMP_A2(SCMP_CMP_MASKED_EQ, b, b);
    rule(SCMP_ACT_ERRNO(EPERM), "chmod", 1, &m1);
    rule(SCMP_ACT_ERRNO(EPERM), "fchmod", 1, &m1);
    rule(SCMP_ACT_ERRNO(EPERM), "fchmodat", 1, &m2);
    rule(SCMP_ACT_ERRNO(EPERM), "creat", 1, &m1);
    rule(SCMP_ACT_ERRNO(EPERM), "mknod", 1, &m1);
    rule(SCMP_ACT_ERRNO(EPERM), "mknodat", 1, &m2);
    struct scmp_arg_cmp open_[2] = {SCMP_A1(SCMP_CMP_MASKED_EQ, O_CREAT, O_CREAT), m2};
    rule(SCMP_ACT_ERRNO(EPERM), "open", 2, open_);
    struct scmp_arg_cmp openat_[2] = {SCMP_A2(SCMP_CMP_MASKED_EQ, O_CREAT, O_CREAT),
                                      SCMP_A3(SCMP_CMP_MASKED_EQ, b, b)};
    rule(SCMP_ACT_ERRNO(EPERM), "openat", 2, openat_);
  }
}

int
main(int argc, char **argv)
{
  static const struct option opts[] = {
      {"deny", required_argument, NULL, 'd'},       {"errno", required_argument, NULL, 'e'},
      {"families", required_argument, NULL, 'f'},   {"namespaces", required_argument, NULL, 'n'},
      {"no-realtime", no_argument, NULL, 'r'},      {"no-suid", no_argument, NULL, 's'},
      {"lock-personality", no_argument, NULL, 'p'}, {NULL, 0, NULL, 0},
  };
  const char *denied = NULL, *fams = NULL, *nss = NULL;
  int err = EPERM, c;
  bool rt = false, suid = false, pers = false;
  while ((c = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
    switch (c) {
    case 'd':
      denied = optarg;
      break;
    case 'e':
      err = errno_named(optarg);
      break;
    case 'f':
      fams = optarg;
      break;
    case 'n':
      nss = optarg;
      break;
    case 'r':
      rt = true;
      break;
    case 's':
      suid = true;
      break;
    case 'p':
      pers = true;
      break;
    default:
      return 125;
    }
  }
  if (optind >= argc) {
    fprintf(stderr, "usage: unit-seccomp [options] -- CMD [ARG...]\n");
    return 125;
  }
  ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx || seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS) < 0) {
    fprintf(stderr, "unit-seccomp: seccomp_init failed\n");
    return 125;
  }
  if (denied)
    deny(denied, err);
  if (fams)
    families(fams);
  if (nss)
    namespaces(nss);
  if (rt)
    no_realtime();
  if (suid)
    no_suid();
  if (pers) {
    struct scmp_arg_cmp linux_only = SCMP_A0(SCMP_CMP_NE, PER_LINUX);
    rule(SCMP_ACT_ERRNO(EPERM), "personality", 1, &linux_only);
  }
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
    fprintf(stderr, "unit-seccomp: PR_SET_NO_NEW_PRIVS: %s\n", strerror(errno));
    return 125;
  }
  if ((c = seccomp_load(ctx)) < 0) {
    fprintf(stderr, "unit-seccomp: loading the filter: %s\n", strerror(-c));
    return 125;
  }
  seccomp_release(ctx);
  execvp(argv[optind], argv + optind);
  fprintf(stderr, "unit-seccomp: %s: %s\n", argv[optind], strerror(errno));
  return 127;
}
