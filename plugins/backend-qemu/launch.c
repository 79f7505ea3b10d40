/* backend-qemu: starting and ending one QEMU. build_argv makes the command line, a slot gives
 * QEMU its own uid (ids.c), the keeper (a small process of ours) owns QEMU and kills it at
 * the run's deadline or the moment we die; resolve_accel picks KVM only after a bounded test
 * boot. */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <grp.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <x86intrin.h>

#include "guest/protocol.h"
#include "qemu.h"

/* Inherited fds of the QEMU child, in this order. */
enum { FD_GUEST = 3, FD_QMP, FD_KERNEL, FD_INITRD, FD_INCOMING, FD_TAP, FD_FIRST_FREE };

/* The host's TSC rate in kHz, measured against CLOCK_MONOTONIC_RAW over ~20 ms. Under TCG
 * the guest's TSC is the host's, and the guest kernel's own calibration against the
 * emulated PIT fails now and then on a busy host (the boot then hangs). */
static int64_t
measure_tsc_khz(void)
{
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC_RAW, &a);
  uint64_t t0 = __rdtsc();
  struct timespec pause = {0, 20 * 1000000L};
  nanosleep(&pause, NULL);
  uint64_t t1 = __rdtsc();
  clock_gettime(CLOCK_MONOTONIC_RAW, &b);
  int64_t ns = (b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec);
  return ns > 0 ? (int64_t)((t1 - t0) * 1000000ULL / (uint64_t)ns) : 0;
}

int64_t
qemu_tsc_khz(qemu_t *q)
{
  if (q->cfg.tsc_khz > 0)
    return q->cfg.tsc_khz;
  pthread_mutex_lock(&q->lock);
  if (q->tsc_khz < 0)
    q->tsc_khz = measure_tsc_khz();
  int64_t khz = q->tsc_khz;
  pthread_mutex_unlock(&q->lock);
  return khz;
}

/* ------------------------------------------------------------ launching QEMU */

/* Builds the argument vector of one QEMU start. Strings live in `store`. */
void
build_argv(const qemu_t *q, const launch_t *l, char **argv, size_t max, char store[][512])
{
  size_t n = 0, s = 0;
#define ARG(x) (argv[n++] = (char *)(x))
#define ARGF(...) (snprintf(store[s], 512, __VA_ARGS__), argv[n++] = store[s++])
  ARG(q->qemu_path);
  ARG("-M");
  ARG("microvm");
  ARG("-accel");
  ARG(l->accel);
  ARG("-cpu");
  ARG(strcmp(l->accel, "kvm") == 0 ? "host" : "max");
  ARG("-m");
  ARGF("%" PRIu64, l->memory_mib);
  ARG("-smp");
  ARGF("%u", l->vcpus);
  ARG("-nodefaults");
  ARG("-no-user-config");
  ARG("-nographic");
  ARG("-no-reboot"); /* a guest power-off or panic ends QEMU */
  ARG("-name");
  ARG(l->name);
  ARG("-sandbox");
  ARG("on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny");
  ARG("-kernel");
  ARGF("/proc/self/fd/%d", FD_KERNEL);
  /* A restore needs no initrd: the saved RAM holds the unpacked root, and the initrd only
   * lives in fw_cfg (host memory, not migrated), so it would be 60 MB read and copied for
   * nothing. The kernel stays: it brings the option ROM whose RAM block the stream has. */
  if (l->incoming_fd < 0) {
    ARG("-initrd");
    ARGF("/proc/self/fd/%d", FD_INITRD);
  }
  /* tsc_early_khz + tsc=reliable: see measure_tsc_khz (a cold boot under TCG only: a
   * restored kernel calibrated at its boot). panic=-1: reboot at once, which -no-reboot
   * turns into QEMU's exit. */
  char tsc[64] = "";
  if (strcmp(l->accel, "tcg") == 0 && l->tsc_khz > 0 && l->incoming_fd < 0)
    snprintf(tsc, sizeof tsc, "tsc_early_khz=%" PRId64 " tsc=reliable ", l->tsc_khz);
  /* init_on_free=1: a freed page is zeroed at once (and no longer at its next allocation).
   * Zero pages cost a snapshot nothing, so the pages the boot freed (the unpacked initrd,
   * init code) drop out of it: measured 195 -> 122 MB, and a restore copies that much
   * less. */
  ARG("-append");
  ARGF("%s%s panic=-1 no_timer_check init_on_free=1 i8042.noaux i8042.nokbd eph_tmp_mib=%" PRIu64
       " eph_pids=%u %s%s%s",
       q->cfg.console_log ? "console=ttyS0 " : "quiet ", tsc, l->tmp_mib, l->pids,
       l->tap_fd >= 0 ? l->net : "", l->tap_fd >= 0 ? " " : "", q->cfg.append);
  if (q->cfg.console_log) {
    ARG("-serial");
    ARG("stdio");
  }
  /* The guest's control stream: a virtio serial port (/dev/vport0p1 inside) on our
   * socketpair. Not a virtconsole: QEMU silently drops console bytes the host socket cannot
   * take at once (virtio-console.c flush_buf, "XXX ... silently dropping console data on
   * EAGAIN"), which broke every frame past ~1 MB of output. A plain port is flow-controlled
   * both ways: QEMU throttles the port until the socket drains. Port 0 stays reserved for a
   * console, so this one is nr 1. */
  ARG("-device");
  ARG("virtio-serial-device,max_ports=2");
  ARG("-chardev");
  ARGF("socket,id=guest,fd=%d", FD_GUEST);
  ARG("-device");
  ARG("virtserialport,chardev=guest,nr=1,name=org.ephemeral.guest");
  ARG("-chardev");
  ARGF("socket,id=qmp,fd=%d", FD_QMP);
  ARG("-mon");
  ARG("chardev=qmp,mode=control");
  if (l->tap_fd >= 0) {
    /* The NIC's only peer is the tap in its own namespace, beside the proxy's listener
     * (tap.c). */
    ARG("-netdev");
    ARGF("tap,id=n0,fd=%d", FD_TAP);
    ARG("-device");
    ARGF("virtio-net-device,netdev=n0,mac=%s", l->mac);
  }
  if (l->incoming_fd >= 0 && l->paused)
    ARG("-S"); /* pool.c: loaded, then paused until its run's `cont` */
  if (l->incoming_fd >= 0) {
    ARG("-incoming");
    ARGF("fd:%d", FD_INCOMING);
  }
  argv[n] = NULL;
  (void)max;
#undef ARG
#undef ARGF
}

/* ------------------------------------------------------------ the keeper */

/* In QEMU's process, before exec: only async-signal-safe calls. slot >= 0: QEMU gets the
 * slot's ids, in a user namespace of its own (ids.c; `sync` is our end of the socketpair to
 * the keeper, which writes its maps), where its binary's path shows the copy its uid cannot
 * read (qemu_exec_copy): exec'd, QEMU starts non-dumpable and finds its modules and firmware
 * where it always does. Every step fails closed: QEMU never runs as our uid then. */
static void __attribute__((noreturn))
child_exec(const qemu_t *q, char **argv, const int *src, int nsrc, int log_fd, int slot,
           gid_t extra_gid, const char *exec_src, pid_t keeper, int sync)
{
  static char *const no_env[] = {NULL};
  setsid();
  const char *what = NULL;
  int e;
  if (slot >= 0 && (e = ids_enter_namespaces(sync, exec_src, argv[0], &what))) {
    ids_log_errno(log_fd, what, e);
    _exit(126);
  }
  if (sync >= 0)
    close(sync);
  /* Every source first above the target range, then onto its target. */
  int moved[8];
  for (int i = 0; i < nsrc; i++)
    moved[i] = src[i] >= 0 ? fcntl(src[i], F_DUPFD, 64) : -1;
  int log_moved = fcntl(log_fd, F_DUPFD, 64);
  int null = open("/dev/null", O_RDONLY);
  if (null < 0 || dup2(null, 0) < 0 || dup2(log_moved, 1) < 0 || dup2(log_moved, 2) < 0)
    _exit(126);
  for (int i = 0; i < nsrc; i++)
    if (moved[i] >= 0 && dup2(moved[i], FD_GUEST + i) < 0)
      _exit(126);
  /* close_range(2) is Linux 5.9+; fall back to a loop */
  if (syscall(SYS_close_range, FD_FIRST_FREE, ~0U, 0) < 0)
    for (int fd = FD_FIRST_FREE; fd < 4096; fd++)
      close(fd);
  struct rlimit nocore = {0, 0};
  setrlimit(RLIMIT_CORE, &nocore); /* guest RAM never lands in a core file */
  /* Transparent huge pages stay on for guest RAM (QEMU madvises it MADV_HUGEPAGE): a
   * restore reads each zero page the stream names, and with THP one fault maps 2 MB of the
   * huge zero page. PR_SET_THP_DISABLE was tried: ~100 MB less resident, but ~100k 4 KiB
   * faults took QEMU's CPU time to resume from 80 to 210 ms and the ready p50 from 468 to
   * 767 ms (12 interleaved pairs). */
  if (slot >= 0) {
    uid_t id = (uid_t)(q->cfg.uid_base + slot);
    if (setgroups(extra_gid != (gid_t)-1 ? 1 : 0, &extra_gid) < 0 || setresgid(id, id, id) < 0 ||
        setresuid(id, id, id) < 0) {
      ids_log_errno(2, "taking the microVM's own ids", errno);
      _exit(126);
    }
  }
  /* No capability reaches QEMU: those of its user namespace (full until exec, whose uid is
   * not that namespace's root) and any ambient ones a caller left (the CLI under the unit's
   * AmbientCapabilities) are dropped here. */
  if ((e = ids_drop_caps())) {
    ids_log_errno(2, "dropping QEMU's capabilities", e);
    _exit(126);
  }
  /* After the id change (which clears it): QEMU dies with its keeper, whatever kills it. */
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0 || getppid() != keeper)
    _exit(126);
  prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  /* No variable of ours (API keys, credential_env secrets) reaches QEMU: an empty
   * environment. */
  execve(argv[0], argv, no_env);
  static const char msg[] = "backend-qemu: exec of QEMU failed\n";
  (void)!write(2, msg, sizeof msg - 1);
  _exit(127);
}

/* The keeper: a small process between us and QEMU (a forked copy of us, so only
 * async-signal-safe calls; root, or our uid with our CAP_SETUID/CAP_SETGID). It starts QEMU
 * as its child (for a slot: maps the child's user namespace first), tells us QEMU's pid
 * (-1: it could not start it; the reason is in QEMU's log), then waits
 * for the first of: our end of the lifeline closing (destroy, or our death: the kernel
 * closes it whichever thread or process of ours dies) -> kill QEMU, reap, exit 0; QEMU
 * ending by itself -> reap, exit 1; the run's deadline -> kill QEMU, reap, exit 3. So the
 * deadline holds and QEMU goes within milliseconds even when we are SIGKILLed; and should
 * the keeper itself be killed, QEMU's PR_SET_PDEATHSIG takes QEMU along. */
static void __attribute__((noreturn))
keeper_main(const qemu_t *q, char **argv, const int *src, int nsrc, int log_fd, int slot,
            gid_t extra_gid, const char *exec_src, int lifeline, int64_t deadline_ms)
{
  prctl(PR_SET_NAME, "eph-vm-keeper", 0, 0, 0);
  pid_t self = getpid();
  int sp[2] = {-1, -1};
  if (slot >= 0 && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0) {
    ids_log_errno(log_fd, "socketpair for the microVM's id maps", errno);
    int32_t none = -1;
    (void)!write(lifeline, &none, sizeof none);
    _exit(KEEPER_FAILED);
  }
  pid_t qemu = fork();
  if (qemu == 0) {
    if (sp[0] >= 0)
      close(sp[0]);
    child_exec(q, argv, src, nsrc, log_fd, slot, extra_gid, exec_src, self, sp[1]);
  }
  if (sp[1] >= 0)
    close(sp[1]);
  if (qemu > 0 && slot >= 0) {
    /* The child is in its new user namespace when it says 'u'; its ids go in now. */
    char c = 0;
    const char *what = "waiting for QEMU's child to make its user namespace";
    int e = read(sp[0], &c, 1) == 1 && c == 'u' ? 0 : EPROTO; /* else the child said why */
    if (!e && !(e = ids_write_maps(qemu, (uid_t)(q->cfg.uid_base + slot), extra_gid, &what)))
      e = write(sp[0], "m", 1) == 1 ? 0 : errno;
    if (e) {
      if (e != EPROTO)
        ids_log_errno(log_fd, what, e);
      kill(qemu, SIGKILL);
      while (waitpid(qemu, NULL, 0) < 0 && errno == EINTR)
        ;
      qemu = -1;
    }
    close(sp[0]);
  }
  int32_t msg = qemu;
  (void)!write(lifeline, &msg, sizeof msg);
  if (qemu < 0)
    _exit(KEEPER_FAILED);
  /* Nothing of ours stays open here but the lifeline (not the guest stream, not another
   * sandbox's lifeline). */
  if (lifeline != 3 && dup2(lifeline, 3) < 0) {
    kill(qemu, SIGKILL);
    _exit(KEEPER_FAILED);
  }
  if (syscall(SYS_close_range, 4, ~0U, 0) < 0)
    for (int fd = 4; fd < 4096; fd++)
      close(fd);
  int null = open("/dev/null", O_RDWR);
  for (int fd = 0; null >= 0 && fd < 3; fd++)
    dup2(null, fd); /* not our stdout: a caller reading it to its end must not wait on us */
  if (null > 3)
    close(null);
  int pidfd = (int)syscall(SYS_pidfd_open, qemu, 0);
  int code = KEEPER_QEMU_ENDED;
  unsigned char dl[sizeof(int64_t)]; /* a deadline being read from the lifeline */
  size_t dl_n = 0;
  for (;;) {
    int64_t left = deadline_ms > 0 ? deadline_ms - eph_now_ms() : -1;
    if (deadline_ms > 0 && left <= 0) {
      code = KEEPER_DEADLINE;
      break;
    }
    /* Without pidfds (Linux < 5.3) QEMU's end is polled for every 100 ms. */
    int wait = left < 0 ? -1 : left > INT32_MAX ? INT32_MAX : (int)left;
    if (pidfd < 0 && (wait < 0 || wait > 100))
      wait = 100;
    struct pollfd p[2] = {{.fd = 3, .events = POLLIN}, {.fd = pidfd, .events = POLLIN}};
    int n = poll(p, pidfd >= 0 ? 2 : 1, wait);
    if (n < 0 && errno != EINTR)
      break;
    if (n > 0 && p[0].revents) {
      /* EOF: stop. Eight bytes: the run's deadline (vm_set_deadline, for a pooled QEMU
       * started before its run existed). */
      ssize_t got = read(3, dl + dl_n, sizeof dl - dl_n);
      if (got <= 0) {
        code = KEEPER_STOPPED;
        break;
      }
      dl_n += (size_t)got;
      if (dl_n == sizeof dl) {
        int64_t v;
        memcpy(&v, dl, sizeof v);
        if (v > 0)
          deadline_ms = v;
        dl_n = 0;
      }
    }
    int st;
    if ((n > 0 && pidfd >= 0 && p[1].revents) ||
        (pidfd < 0 && waitpid(qemu, &st, WNOHANG) == qemu)) {
      if (pidfd < 0)
        _exit(KEEPER_QEMU_ENDED);
      break;
    }
  }
  kill(qemu, SIGKILL);
  while (waitpid(qemu, NULL, 0) < 0 && errno == EINTR)
    ;
  _exit(code);
}

/* ------------------------------------------------------------ the guest image */

static uint32_t
le32(const unsigned char *p)
{
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t
le64(const unsigned char *p)
{
  return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

/* What keeps the kernel (open on fd, size bytes, its first n at h) from booting, into why,
 * or "": the formats QEMU's x86 loader boots are a bzImage (the "HdrS" header: its setup
 * sectors and system size must fit in the file), a multiboot image and an ELF (PVH);
 * anything else it starts as an ancient zImage, which never says hello. */
static void
kernel_problem(int fd, off_t size, const unsigned char *h, ssize_t n, char *why, size_t wsize)
{
  why[0] = '\0';
  if (n >= 0x206 && memcmp(h + 0x202, "HdrS", 4) == 0) {
    uint64_t setup = (uint64_t)(h[0x1f1] ? h[0x1f1] : 4) + 1;
    uint64_t need = setup * 512 + (uint64_t)le32(h + 0x1f4) * 16;
    if ((uint64_t)size < need)
      snprintf(why, wsize, "truncated: %lld bytes, its bzImage header says %" PRIu64,
               (long long)size, need);
    return;
  }
  for (ssize_t i = 0; i + 12 <= n && i < 8192; i += 4)
    if (le32(h + i) == 0x1BADB002u && le32(h + i) + le32(h + i + 4) + le32(h + i + 8) == 0)
      return; /* multiboot: magic + flags + checksum = 0 */
  if (n >= 52 && memcmp(h, "\177ELF", 4) == 0 && (h[4] == 1 || h[4] == 2) && h[5] == 1) {
    bool is64 = h[4] == 2;
    uint64_t phoff = is64 ? le64(h + 0x20) : le32(h + 0x1c);
    unsigned phsize =
        is64 ? (unsigned)(h[0x36] | h[0x37] << 8) : (unsigned)(h[0x2a] | h[0x2b] << 8);
    unsigned phnum = is64 ? (unsigned)(h[0x38] | h[0x39] << 8) : (unsigned)(h[0x2c] | h[0x2d] << 8);
    uint64_t need = phoff + (uint64_t)phsize * phnum;
    unsigned char ph[64];
    for (unsigned i = 0; need <= (uint64_t)size && i < phnum && phsize >= (is64 ? 56u : 32u); i++) {
      if (pread(fd, ph, is64 ? 56 : 32, (off_t)(phoff + (uint64_t)i * phsize)) != (is64 ? 56 : 32))
        break;
      uint64_t end =
          is64 ? le64(ph + 8) + le64(ph + 0x20) : (uint64_t)le32(ph + 4) + le32(ph + 0x10);
      if (le32(ph) == 1 /* PT_LOAD */ && end > need)
        need = end;
    }
    if ((uint64_t)size < need)
      snprintf(why, wsize, "truncated: %lld bytes, its ELF headers say %" PRIu64, (long long)size,
               need);
    return;
  }
  snprintf(why, wsize, "not a Linux kernel (no bzImage, ELF or multiboot header)");
}

/* The value of the 8 hex digits at p, or -1. */
static int64_t
hex8(const unsigned char *p)
{
  int64_t v = 0;
  for (int i = 0; i < 8; i++) {
    int c = p[i];
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0)
      return -1;
    v = v * 16 + d;
  }
  return v;
}

/* What keeps the initramfs (open on fd, size bytes, its first n at h) from unpacking, into
 * why, or "": the kernel skips leading zero bytes, then wants a "newc" cpio header or the
 * magic of one of its decompressors (lib/decompress.c). A plain cpio (what build-image.sh
 * writes) must reach its TRAILER!!! entry within the file: found in the last 8 KiB at once,
 * else by walking its headers (an archive followed by a compressed one, say). */
static void
initrd_problem(int fd, off_t size, const unsigned char *h, ssize_t n, char *why, size_t wsize)
{
  static const unsigned char magic[][2] = {{037, 0213}, {037, 0236}, {'B', 'Z'},   {0x5d, 0},
                                           {0xfd, '7'}, {0x89, 'L'}, {0x02, 0x21}, {0x28, 0xb5}};
  why[0] = '\0';
  ssize_t at = 0;
  while (at < n && h[at] == 0)
    at++;
  if (at + 6 <= n && (memcmp(h + at, "070701", 6) == 0 || memcmp(h + at, "070702", 6) == 0)) {
    unsigned char tail[8192];
    off_t from = size > (off_t)sizeof tail ? size - (off_t)sizeof tail : 0;
    ssize_t t = pread(fd, tail, sizeof tail, from);
    if (t > 0 && memmem(tail, (size_t)t, "TRAILER!!!", 11))
      return;
    /* Each entry: a 110-byte header, the name (namesize bytes with its NUL), the data, each
     * padded to 4 bytes from the archive's start. */
    for (uint64_t off = (uint64_t)at;;) {
      unsigned char e[110 + 11];
      ssize_t got = pread(fd, e, sizeof e, (off_t)off);
      int64_t filesize = got >= 110 ? hex8(e + 54) : -1, namesize = got >= 110 ? hex8(e + 94) : -1;
      if (got < 110 || memcmp(e, "07070", 5) != 0 || filesize < 0 || namesize < 0) {
        if (off + 110 > (uint64_t)size)
          snprintf(why, wsize,
                   "truncated: %lld bytes, its cpio archive ends without its "
                   "TRAILER!!! entry",
                   (long long)size);
        else
          snprintf(why, wsize, "not a valid cpio archive: no entry header at byte %" PRIu64, off);
        return;
      }
      if (namesize == 11 && got >= 121 && memcmp(e + 110, "TRAILER!!!", 11) == 0)
        return;
      off = (off + 110 + (uint64_t)namesize + 3) & ~(uint64_t)3;
      off = (off + (uint64_t)filesize + 3) & ~(uint64_t)3;
    }
  }
  for (size_t i = 0; i < sizeof magic / sizeof magic[0]; i++)
    if (at + 2 <= n && h[at] == magic[i][0] && h[at + 1] == magic[i][1])
      return;
  snprintf(why, wsize, "not an initramfs (no cpio, gzip, bzip2, lzma, xz, lzo, lz4 or zstd magic)");
}

/* Opens image_dir/name for QEMU and checks it: the fd, or negative with err set. */
static int
image_file_open(const qemu_t *q, const char *name, bool kernel, eph_error_t *err)
{
  char path[PATH_MAX], why[160] = "";
  snprintf(path, sizeof path, "%s/%s", q->cfg.image_dir, name);
  /* O_NONBLOCK: a FIFO (or a device) must not hold us here; a regular file ignores it. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  struct stat st;
  int e = 0;
  if (fd < 0 || fstat(fd, &st) < 0)
    snprintf(why, sizeof why, "%s", strerror(e = errno));
  else if (S_ISDIR(st.st_mode))
    snprintf(why, sizeof why, "a directory, not a file");
  else if (!S_ISREG(st.st_mode))
    snprintf(why, sizeof why, "a %s, not a regular file",
             S_ISFIFO(st.st_mode)   ? "FIFO"
             : S_ISSOCK(st.st_mode) ? "socket"
             : S_ISCHR(st.st_mode)  ? "character device"
             : S_ISBLK(st.st_mode)  ? "block device"
                                    : "special file");
  else if (st.st_size == 0)
    snprintf(why, sizeof why, "empty");
  /* QEMU opens /proc/self/fd/N again, as the microVM's own uid (neither the file's owner
   * nor in its group): the inode's mode decides, not our open (root's passes any). */
  else if (q->ids == QEMU_IDS_OWN && !(st.st_mode & S_IROTH))
    snprintf(why, sizeof why,
             "mode %04o: QEMU runs as the microVM's own uid and cannot read it (chmod o+r)",
             (unsigned)(st.st_mode & 07777));
  else {
    /* The first 8 KiB: a kernel's headers (bzImage, multiboot, ELF) or an initrd's magic. */
    unsigned char head[8192];
    ssize_t n = pread(fd, head, sizeof head, 0);
    if (n < 0)
      snprintf(why, sizeof why, "%s", strerror(errno));
    else if (kernel)
      kernel_problem(fd, st.st_size, head, n, why, sizeof why);
    else
      initrd_problem(fd, st.st_size, head, n, why, sizeof why);
  }
  if (!why[0])
    return fd;
  if (fd >= 0)
    close(fd);
  /* A hint that works as given: `make guest-image` alone builds into the default state
   * directory (~/.local/state/ephemeral), which need not be this one. */
  size_t sl = strlen(q->base) - strlen("/qemu"); /* q->base is <state_dir>/qemu */
  bool ours = strncmp(q->cfg.image_dir, q->base, sl) == 0 &&
              strcmp(q->cfg.image_dir + sl, "/guest-image") == 0;
  if (ours)
    return eph_error_set(
        err, e ? e : EINVAL,
        "guest image: %s: %s (build it with `make guest-image EPH_STATE_DIR=%.*s`)", path, why,
        (int)sl, q->base);
  return eph_error_set(err, e ? e : EINVAL,
                       "guest image: %s: %s (image_dir in conf.d; `make guest-image "
                       "EPH_STATE_DIR=DIR` builds one in DIR/guest-image)",
                       path, why);
}

int
qemu_image_open(const qemu_t *q, qemu_image_t *img, eph_error_t *err)
{
  img->kernel_fd = img->initrd_fd = -1;
  int fd = image_file_open(q, "vmlinuz", true, err);
  if (fd < 0)
    return fd;
  img->kernel_fd = fd;
  if ((fd = image_file_open(q, "initrd.cpio", false, err)) < 0) {
    qemu_image_close(img);
    return fd;
  }
  img->initrd_fd = fd;
  return 0;
}

void
qemu_image_close(qemu_image_t *img)
{
  if (img->kernel_fd >= 0)
    close(img->kernel_fd);
  if (img->initrd_fd >= 0)
    close(img->initrd_fd);
  img->kernel_fd = img->initrd_fd = -1;
}

/* launch_qemu once the image is open: the slot, the socketpairs, the keeper. */
static int
start_keeper(const qemu_t *q, const launch_t *l, int kfd, int ifd, vmproc_t *vm, int *guest_fd,
             int *qmp_fd, eph_error_t *err)
{
  if (access(q->qemu_path, X_OK) < 0)
    return eph_error_set(err, errno, "%s: %s (install the Debian package qemu-system-x86)",
                         q->qemu_path, strerror(errno));
  /* Holding CAP_SETUID and CAP_SETGID (root, or the packaged unit's user), every microVM
   * gets its own uid/gid from a slot; with neither (tests without root), QEMU keeps ours
   * (qemu_ids_mode said so once); with half of them, or root without them, none starts. */
  int slot = -1;
  if (q->ids == QEMU_IDS_REFUSED || q->ids == QEMU_IDS_UNKNOWN)
    return eph_error_set(err, EPERM,
                         "refusing to start a microVM that could not get a uid of its own "
                         "(this process, uid %u, needs both CAP_SETUID and CAP_SETGID)",
                         (unsigned)geteuid());
  if (q->ids == QEMU_IDS_OWN && (slot = claim_slot(q, l->name, err)) < 0)
    return slot;
  int gp[2] = {-1, -1}, mp[2] = {-1, -1}, lp[2] = {-1, -1};
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, gp) < 0 ||
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, mp) < 0 ||
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, lp) < 0) {
    int e = errno;
    for (int i = 0; i < 2; i++) {
      if (gp[i] >= 0)
        close(gp[i]);
      if (mp[i] >= 0)
        close(mp[i]);
      if (lp[i] >= 0)
        close(lp[i]);
    }
    release_slot(q, slot);
    return eph_error_set(err, e, "socketpair: %s", strerror(e));
  }
  char *argv[64];
  char store[16][512];
  build_argv(q, l, argv, 64, store);

  gid_t kvm_gid = (gid_t)-1;
  struct stat st;
  /* Debian's udev makes /dev/kvm root:kvm 0660: QEMU keeps that group (mapped into its
   * user namespace too). Never root's group: a /dev/kvm left root:root opens to root only,
   * and gid 0 would give QEMU every file readable by that group. */
  if (slot >= 0 && strcmp(l->accel, "kvm") == 0 && stat("/dev/kvm", &st) == 0 && st.st_gid != 0)
    kvm_gid = st.st_gid;
  int src[] = {gp[1], mp[1], kfd, ifd, l->incoming_fd, l->tap_fd};
  pid_t keeper = fork();
  if (keeper == 0) {
    close(lp[0]);
    keeper_main(q, argv, src, 6, l->log_fd, slot, kvm_gid,
                slot >= 0 && q->exec_copy[0] ? q->exec_copy : NULL, lp[1], l->deadline_ms);
  }
  int e = errno;
  close(gp[1]);
  close(mp[1]);
  close(lp[1]);
  int32_t qpid = -1;
  ssize_t n = -1;
  if (keeper > 0)
    while ((n = read(lp[0], &qpid, sizeof qpid)) < 0 && errno == EINTR)
      ;
  if (keeper < 0 || n != (ssize_t)sizeof qpid || qpid <= 0) {
    close(gp[0]);
    close(mp[0]);
    close(lp[0]);
    if (keeper > 0)
      while (waitpid(keeper, NULL, 0) < 0 && errno == EINTR)
        ;
    release_slot(q, slot);
    return keeper < 0 ? eph_error_set(err, e, "fork: %s", strerror(e))
                      : eph_error_set(err, EAGAIN, "the QEMU keeper could not start QEMU%s",
                                      slot >= 0 ? " under the microVM's own ids" : "");
  }
  *vm = (vmproc_t){.keeper = keeper, .qemu = qpid, .lifeline = lp[0], .slot = slot};
  *guest_fd = gp[0];
  *qmp_fd = mp[0];
  return 0;
}

/* Starts QEMU under a keeper. On success *vm holds the keeper, QEMU's pid, the lifeline
 * and the slot; *guest_fd is the host end of the guest's stream and *qmp_fd of its monitor
 * (both owned by the caller). vm_stop() ends it all. */
int
launch_qemu(const qemu_t *q, const launch_t *l, vmproc_t *vm, int *guest_fd, int *qmp_fd,
            eph_error_t *err)
{
  *vm = (vmproc_t){.keeper = -1, .qemu = -1, .lifeline = -1, .slot = -1};
  /* The caller's checked image, else one opened and checked here (the same helper). */
  qemu_image_t own = {-1, -1};
  int r;
  if (!l->image && (r = qemu_image_open(q, &own, err)) < 0)
    return r;
  int kfd = l->image ? l->image->kernel_fd : own.kernel_fd;
  int ifd = l->image ? l->image->initrd_fd : own.initrd_fd;
  r = start_keeper(q, l, kfd, ifd, vm, guest_fd, qmp_fd, err);
  qemu_image_close(&own);
  return r;
}

int
vm_set_deadline(const vmproc_t *vm, int64_t deadline_ms, eph_error_t *err)
{
  ssize_t n = write(vm->lifeline, &deadline_ms, sizeof deadline_ms);
  return n == (ssize_t)sizeof deadline_ms
             ? 0
             : eph_error_set(err, n < 0 ? errno : EIO, "telling the QEMU keeper the deadline: %s",
                             strerror(n < 0 ? errno : EIO));
}

/* Ends a QEMU started by launch_qemu: closing the lifeline makes the keeper kill and reap
 * QEMU; we reap the keeper, then free the slot once no process runs as its uid. Returns the
 * keeper's verdict (KEEPER_*; KEEPER_DEADLINE when the run's deadline killed QEMU) and
 * *left the processes still running as the slot's uid (0 normally). */
int
vm_stop(const qemu_t *q, vmproc_t *vm, int *left)
{
  int code = KEEPER_STOPPED;
  if (left)
    *left = 0;
  if (vm->lifeline >= 0)
    close(vm->lifeline);
  vm->lifeline = -1;
  if (vm->keeper > 0) {
    int st = 0;
    while (waitpid(vm->keeper, &st, 0) < 0 && errno == EINTR)
      ;
    code = WIFEXITED(st) ? WEXITSTATUS(st) : KEEPER_FAILED;
  }
  vm->keeper = vm->qemu = -1;
  if (vm->slot >= 0) {
    uid_t uid = (uid_t)(q->cfg.uid_base + vm->slot);
    int n = uid_processes(uid, true);
    if (left)
      *left = n;
    if (n == 0)
      release_slot(q, vm->slot); /* else the sweep frees it once they are gone */
  }
  vm->slot = -1;
  return code;
}

/* ------------------------------------------------------------ the accelerator */

/* Boots the image once and reads the guest's hello before deadline_ms. */
int
boot_and_hello(const qemu_t *q, const char *dir, const launch_t *l, vmproc_t *vm, int *guest_fd,
               qmp_t *qmp, int64_t deadline_ms, eph_error_t *err)
{
  int qfd;
  int r = launch_qemu(q, l, vm, guest_fd, &qfd, err);
  if (r < 0)
    return r;
  if ((r = qmp_open(qmp, qfd, deadline_ms, err)) < 0)
    goto fail;
  eph_frame_reader_t rd = {0};
  json_object *hello = NULL;
  while (!hello) {
    int64_t left = deadline_ms - eph_now_ms();
    if (left <= 0) {
      r = eph_error_set(err, ETIMEDOUT, "no guest hello in time");
      break;
    }
    struct pollfd p = {.fd = *guest_fd, .events = POLLIN};
    if (poll(&p, 1, (int)(left > 1000 ? 1000 : left)) <= 0)
      continue;
    r = eph_frame_reader_feed(&rd, *guest_fd, &hello);
    if (r < 0) {
      r = eph_error_set(err, EPH_E_PROTOCOL, "guest stream: %s", rd.why[0] ? rd.why : strerror(-r));
      break;
    }
  }
  eph_frame_reader_clear(&rd);
  if (hello) {
    const char *type = eph_json_get_string(hello, "type");
    r = type && strcmp(type, "hello") == 0
            ? 0
            : eph_error_set(err, EPH_E_PROTOCOL, "guest: first frame is '%s', not hello",
                            type ? type : "?");
    json_object_put(hello);
  }
  if (r == 0)
    return 0;
fail:;
  char tail[400];
  log_tail(dir, tail, sizeof tail);
  if (tail[0])
    eph_error_wrap(err, "QEMU log: %s", tail);
  qmp_close(qmp);
  close(*guest_fd);
  *guest_fd = -1;
  vm_stop(q, vm, NULL);
  return r;
}

/* The accelerator to use: the configured one, or for auto the verdict of a bounded test
 * boot under KVM, cached in <state_dir>/qemu/accel for the image (its image.sha256). The
 * caller has opened and checked the image (base->image). Only an answer about KVM is
 * cached: the guest's hello (kvm), or QEMU still running under KVM without one when
 * kvm_probe_ms is up (tcg: the nested hosts where KVM hangs guests). A test boot that never
 * got that far (QEMU could not start, or ended by itself: a launch or image problem) and a
 * host whose /dev/kvm does not open give tcg for this create only: the next one asks again. */
const char *
resolve_accel(qemu_t *q, const launch_t *base)
{
  if (strcmp(q->cfg.accel, "auto") != 0)
    return q->cfg.accel;
  pthread_mutex_lock(&q->lock);
  if (q->accel[0])
    goto out;
  char path[PATH_MAX], buf[256], sha[128] = "";
  snprintf(path, sizeof path, "%s/image.sha256", q->cfg.image_dir);
  char shabuf[1024];
  if (read_small(path, shabuf, sizeof shabuf))
    snprintf(sha, sizeof sha, "%.64s", shabuf);
  snprintf(path, sizeof path, "%s/accel", q->base);
  /* "ACCEL SHA answered". A `tcg` without "answered" may be what an older version cached
   * after a test boot that never ran the guest (a missing vmlinuz, say): asked again. */
  char want[256], how[16] = "";
  int fields =
      read_small(path, buf, sizeof buf) ? sscanf(buf, "%7s %255s %15s", q->accel, want, how) : 0;
  if (fields >= 2 && strcmp(want, sha[0] ? sha : "-") == 0 &&
      (!strcmp(q->accel, "kvm") || (!strcmp(q->accel, "tcg") && !strcmp(how, "answered"))))
    goto out;
  q->accel[0] = '\0';
  /* QEMU must be able to open /dev/kvm: as we do (our open says), or as the microVM's own
   * uid, which gets the device's group when it is not root's (launch_qemu) and nothing else:
   * root's open passes any mode. */
  struct stat kst = {0};
  int kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC);
  bool usable = kvm >= 0 && fstat(kvm, &kst) == 0 &&
                (q->ids != QEMU_IDS_OWN || (kst.st_mode & 06) == 06 ||
                 (kst.st_gid != 0 && (kst.st_mode & 060) == 060));
  if (kvm >= 0)
    close(kvm);
  if (kvm >= 0 && !usable && !q->kvm_noted)
    q->host->log(EPH_LOG_INFO,
                 "/dev/kvm is mode %04o, gid %u: QEMU, as the microVM's own uid, cannot open it "
                 "(it needs a group other than root's with rw, e.g. Debian's root:kvm 0660): "
                 "using tcg",
                 (unsigned)(kst.st_mode & 07777), (unsigned)kst.st_gid);
  q->kvm_noted = kvm >= 0 && !usable;
  if (!usable)
    goto out;
  eph_error_t err = {0};
  char dir[PATH_MAX];
  int log_fd = -1;
  char id[64];
  snprintf(id, sizeof id, "kvm-probe-%d", (int)getpid());
  int64_t t0 = eph_now_ms();
  int r = make_run_dir(q, id, dir, sizeof dir, &log_fd, &err);
  if (r == 0) {
    char name[96];
    snprintf(name, sizeof name, "ephemeral-%s", id);
    launch_t l = *base;
    l.name = name;
    l.accel = "kvm";
    l.incoming_fd = -1;
    l.tap_fd = -1;
    l.log_fd = log_fd;
    /* The keeper's kill comes after the wait for the hello: a guest hung at the deadline is
     * a timeout (an answer), never a stream QEMU's end closed (none). */
    l.deadline_ms = t0 + q->cfg.kvm_probe_ms + 2000;
    vmproc_t vm;
    int gfd = -1;
    qmp_t qmp = {.fd = -1};
    if ((r = boot_and_hello(q, dir, &l, &vm, &gfd, &qmp, t0 + q->cfg.kvm_probe_ms, &err)) == 0) {
      qmp_close(&qmp);
      close(gfd);
      vm_stop(q, &vm, NULL);
    }
    close(log_fd);
    rm_tree(dir);
  }
  bool answer = r == 0 || r == -ETIMEDOUT;
  if (answer)
    snprintf(q->accel, sizeof q->accel, "%s", r == 0 ? "kvm" : "tcg");
  q->host->log(EPH_LOG_INFO, "KVM test boot %s after %" PRId64 " ms%s%s: using %s%s",
               r == 0 ? "succeeded" : "failed", eph_now_ms() - t0, err.message[0] ? ": " : "",
               err.message, r == 0 ? "kvm" : "tcg",
               answer ? ""
                      : " (QEMU never ran the guest: no verdict on KVM, asked again next time)");
  if (answer) {
    snprintf(buf, sizeof buf, "%s %s answered\n", q->accel, sha[0] ? sha : "-");
    eph_error_t werr = {0};
    if (write_file(path, buf, &werr) < 0)
      q->host->log(EPH_LOG_WARN, "%s", werr.message);
  }
out:;
  const char *accel = strcmp(q->accel, "kvm") == 0 ? "kvm" : "tcg";
  pthread_mutex_unlock(&q->lock);
  return accel;
}

/* ------------------------------------------------------------ run directories */

int
make_run_dir(const qemu_t *q, const char *run_id, char *dir, size_t size, int *log_fd,
             eph_error_t *err)
{
  for (const char *p = run_id; *p; p++)
    if (!(*p == '_' || *p == '-' || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
          (*p >= 'A' && *p <= 'Z')))
      return eph_error_set(err, EINVAL, "run id '%s': only [A-Za-z0-9_-] allowed", run_id);
  snprintf(dir, size, "%s/%s", q->run_base, run_id);
  if (mkdir(dir, 0700) < 0)
    return eph_error_set(err, errno, "%s: %s", dir, strerror(errno));
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/qemu.log", dir);
  *log_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
  if (*log_fd < 0) {
    int e = errno;
    rm_tree(dir);
    return eph_error_set(err, e, "%s: %s", path, strerror(e));
  }
  return 0;
}

/* "QEMU_PID OWNER_PID OWNER_START QEMU_NAME": the sweep kills QEMU when the owner is gone. */
int
write_pid_record(const char *dir, const qemu_t *q, pid_t qemu_pid, const char *qemu_name,
                 eph_error_t *err)
{
  char path[PATH_MAX + 8], text[256];
  snprintf(path, sizeof path, "%s/pid", dir);
  snprintf(text, sizeof text, "%d %d %llu %s\n", (int)qemu_pid, (int)getpid(), q->owner_start,
           qemu_name);
  return write_file(path, text, err);
}
