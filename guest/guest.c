/* ephemeral-guest: PID 1 inside every sandbox (jail or microVM).
 *
 * It speaks the guest protocol (guest/PROTOCOL.md) on one byte stream to the host, runs
 * the host's commands as the worker (exec.c; see worker.c for how a child becomes the worker),
 * streams their output, enforces per-command timeouts, reaps every orphan, and on shutdown
 * or when the host goes away kills every process of the sandbox and exits.
 *
 * One thread, one poll() loop over: the control stream, a signalfd (SIGCHLD and termination
 * signals) and, while a command runs, its stdout/stderr pipes and stdin pipe. The guest
 * holds at most one output chunk per stream: it reads a pipe only after the previous chunk
 * was written to the host, so a command printing gigabytes is slowed to the host's pace
 * instead of filling guest memory.
 */
#include <config.h>

#include "guest.h"
#include "protocol.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <linux/random.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/reboot.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_TIMEOUT_MS 300000u
#define DEFAULT_NOFILE 1024

void
guest_log(const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  fputs("ephemeral-guest: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

int64_t
guest_now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void
guest_send_frame(guest_t *g, json_object *obj)
{
  int r = eph_proto_write_frame(g->ctl, obj);
  json_object_put(obj);
  if (r == -EMSGSIZE) {
    guest_log("dropping a reply over the frame limit");
    return;
  }
  if (r < 0) {
    guest_log("control stream: %s; shutting down", strerror(-r));
    guest_shutdown_and_exit(g, 1);
  }
}

json_object *
guest_new_msg(const char *type, int64_t id, bool with_id)
{
  json_object *o = json_object_new_object();
  json_object_object_add(o, "type", json_object_new_string(type));
  if (with_id)
    json_object_object_add(o, "id", json_object_new_int64(id));
  return o;
}

void
guest_send_error(guest_t *g, json_object *req, int err_no, const char *message, bool fatal)
{
  json_object *o = guest_new_msg("error", 0, false);
  json_object *id;
  if (req && json_object_object_get_ex(req, "id", &id))
    json_object_object_add(o, "id", json_object_get(id));
  json_object_object_add(o, "errno", json_object_new_int(err_no));
  json_object_object_add(o, "message", json_object_new_string(message));
  if (fatal)
    json_object_object_add(o, "fatal", json_object_new_boolean(true));
  guest_send_frame(g, o);
}

static void
op_kill(guest_t *g, json_object *req)
{
  json_object *allv;
  bool all = json_object_object_get_ex(req, "all", &allv) && json_object_get_boolean(allv);
  if (g->job && !g->job->reaped) {
    g->job->killed = true;
    guest_kill_job(g->job);
  }
  if (all) {
    if (g->pid1) {
      kill(-1, SIGKILL);
    } else {
      char path[64];
      snprintf(path, sizeof path, "/proc/self/task/%d/children", (int)getpid());
      FILE *f = fopen(path, "re");
      int child;
      while (f && fscanf(f, "%d", &child) == 1)
        kill(child, SIGKILL);
      if (f)
        fclose(f);
    }
  }
}

static void
op_shutdown(guest_t *g, json_object *req, int64_t id)
{
  (void)req;
  guest_kill_everything(g);
  if (g->rundir[0])
    nftw(g->rundir, guest_rm_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
  g->rundir[0] = '\0';
  guest_send_frame(g, guest_new_msg("bye", id, true));
  guest_shutdown_and_exit(g, 0);
}

static int make_scratch(guest_t *g, const char *tmp);
static void send_hello(guest_t *g);

/* After a microVM snapshot restore every copy of the guest holds the same kernel CRNG state,
 * wall clock and scratch name. The host's reseed gives this copy its own: the entropy is
 * added to the pool and the CRNG reseeded from it at once (RNDADDENTROPY, RNDRESEEDCRNG),
 * the clock is set, the old run directory is replaced by a fresh mkdtemp one, and the
 * answer is a new hello, the one the host's client reads as the session's first frame. */
static void
op_reseed(guest_t *g, json_object *req, int64_t id)
{
  (void)id;
  if (g->job) {
    guest_send_error(g, req, EBUSY, "reseed while a command runs", false);
    return;
  }
  void *seed = NULL;
  size_t n = 0;
  int r = eph_proto_get_b64(req, "entropy", 4096, &seed, &n);
  if (r < 0 || n < 32) {
    free(seed);
    guest_send_error(g, req, r < 0 ? -r : EINVAL, "reseed: 'entropy' must be 32..4096 bytes", true);
    guest_shutdown_and_exit(g, 1);
  }
  struct rand_pool_info *info = malloc(sizeof *info + n);
  int fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC);
  bool ok = info && fd >= 0;
  if (ok) {
    info->entropy_count = (int)(n * 8);
    info->buf_size = (int)n;
    memcpy(info->buf, seed, n);
    ok = ioctl(fd, RNDADDENTROPY, info) == 0 && ioctl(fd, RNDRESEEDCRNG) == 0;
  }
  int e = errno;
  if (fd >= 0)
    close(fd);
  if (info)
    explicit_bzero(info, sizeof *info + n);
  explicit_bzero(seed, n);
  free(info);
  free(seed);
  if (!ok) {
    guest_send_error(g, req, e ? e : EIO, "reseed: adding entropy failed", true);
    guest_shutdown_and_exit(g, 1);
  }
  int64_t ns;
  if (eph_proto_int(req, "realtime_ns", &ns) && ns > 0) {
    struct timespec ts = {.tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL};
    if (clock_settime(CLOCK_REALTIME, &ts) < 0)
      guest_log("reseed: clock_settime: %s", strerror(errno));
  }
  if (g->rundir[0])
    nftw(g->rundir, guest_rm_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
  g->rundir[0] = '\0';
  if (g->fs.scratch_fd >= 0)
    close(g->fs.scratch_fd);
  g->fs.scratch_fd = -1;
  r = make_scratch(g, g->tmp);
  if (r < 0) {
    char why[256];
    snprintf(why, sizeof why, "reseed: new scratch in %s: %s", g->tmp, strerror(-r));
    guest_send_error(g, NULL, -r, why, true);
    guest_shutdown_and_exit(g, 1);
  }
  send_hello(g);
}

static void
handle_frame(guest_t *g, json_object *req)
{
  const char *type = eph_json_get_string(req, "type");
  if (!type) {
    guest_send_error(g, req, EPROTO, "frame without a string 'type'", true);
    guest_shutdown_and_exit(g, 1);
  }
  int64_t id = 0;
  json_object *idv;
  if (json_object_object_get_ex(req, "id", &idv) && !json_object_is_type(idv, json_type_int)) {
    guest_send_error(g, NULL, EINVAL, "'id' must be an integer", false);
    return;
  }
  eph_proto_int(req, "id", &id);

  if (strcmp(type, "exec") == 0) {
    guest_op_exec(g, req, id);
  } else if (strcmp(type, "kill") == 0) {
    op_kill(g, req);
  } else if (strcmp(type, "shutdown") == 0) {
    op_shutdown(g, req, id);
  } else if (strcmp(type, "reseed") == 0) {
    op_reseed(g, req, id);
  } else if (strcmp(type, "ping") == 0) {
    guest_send_frame(g, guest_new_msg("pong", id, true));
  } else if (!strcmp(type, "write_file") || !strcmp(type, "read_file") ||
             !strcmp(type, "list_dir")) {
    int err_no = 0;
    char why[512] = "";
    json_object *reply = type[0] == 'w'   ? guest_fs_write(&g->fs, req, &err_no, why, sizeof why)
                         : type[0] == 'r' ? guest_fs_read(&g->fs, req, &err_no, why, sizeof why)
                                          : guest_fs_list(&g->fs, req, &err_no, why, sizeof why);
    if (reply)
      guest_send_frame(g, reply);
    else
      guest_send_error(g, req, err_no, why, false);
  } else {
    char msg[160];
    snprintf(msg, sizeof msg, "unknown request type '%.64s'", type);
    guest_send_error(g, req, EINVAL, msg, false);
  }
}

static void
loop(guest_t *g)
{
  for (;;) {
    struct pollfd p[5];
    int n = 0, i_out = -1, i_err = -1, i_in = -1;
    p[n++] = (struct pollfd){.fd = g->ctl, .events = POLLIN};
    p[n++] = (struct pollfd){.fd = g->sigfd, .events = POLLIN};
    job_t *j = g->job;
    int timeout = -1;
    if (j) {
      if (j->out_fd >= 0)
        p[i_out = n++] = (struct pollfd){.fd = j->out_fd, .events = POLLIN};
      if (j->err_fd >= 0)
        p[i_err = n++] = (struct pollfd){.fd = j->err_fd, .events = POLLIN};
      if (j->in_fd >= 0)
        p[i_in = n++] = (struct pollfd){.fd = j->in_fd, .events = POLLOUT};
      if (!j->reaped && !j->timed_out) {
        int64_t left = j->deadline_ms - guest_now_ms();
        timeout = left < 0 ? 0 : left > INT_MAX ? INT_MAX : (int)left;
      }
    }
    if (poll(p, (nfds_t)n, timeout) < 0) {
      if (errno == EINTR)
        continue;
      guest_log("poll: %s", strerror(errno));
      guest_shutdown_and_exit(g, 1);
    }
    if (p[1].revents) {
      struct signalfd_siginfo si[8];
      ssize_t got;
      /* Every pending signal in one read (a full buffer: read again). */
      do {
        got = read(g->sigfd, si, sizeof si);
        for (ssize_t k = 0; got > 0 && k < got / (ssize_t)sizeof si[0]; k++) {
          if (si[k].ssi_signo != SIGCHLD) {
            guest_log("signal %u: shutting down", si[k].ssi_signo);
            guest_shutdown_and_exit(g, 0);
          }
        }
      } while (got == (ssize_t)sizeof si);
      guest_reap(g);
    }
    if (j && i_out >= 0 && p[i_out].revents)
      guest_forward_chunk(g, 1);
    if (j && i_err >= 0 && p[i_err].revents)
      guest_forward_chunk(g, 2);
    if (j && i_in >= 0 && j->in_fd >= 0 && p[i_in].revents)
      guest_feed_stdin(j);
    /* Both pipes at end of file: the command's main process is exiting (or closed them),
     * usually reapable already; reaped now, the exit needs no second wake-up for SIGCHLD
     * (still queued on the signalfd: the next poll returns at once). */
    if (j && !j->reaped && j->out_fd < 0 && j->err_fd < 0)
      guest_reap(g);
    if (j && !j->reaped && !j->timed_out && guest_now_ms() >= j->deadline_ms) {
      j->timed_out = true;
      guest_kill_job(j);
    }
    if (g->job && g->job->reaped)
      guest_finish_job(g);
    if (p[0].revents) {
      json_object *req = NULL;
      int r = eph_frame_reader_feed(&g->rd, g->ctl, &req);
      if (r == 1) {
        handle_frame(g, req);
        json_object_put(req);
      } else if (r == -EPIPE) {
        guest_log("the host closed the control stream; shutting down");
        guest_shutdown_and_exit(g, 0);
      } else if (r < 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", g->rd.why[0] ? g->rd.why : strerror(-r));
        guest_log("control stream: %s; ending the session", msg);
        guest_send_error(g, NULL, -r, msg, true);
        guest_shutdown_and_exit(g, 1);
      }
    }
  }
}

/* ---------------------------------------------------------------- start-up */

static int
vm_setup(const char *hostname, uint64_t tmp_mib)
{
  struct {
    const char *src, *dir, *type;
    unsigned long flags;
    const char *data;
  } mounts[] = {
      {"proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL},
      {"sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL},
      {"devtmpfs", "/dev", "devtmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755"},
      {"tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, NULL},
  };
  char tmpopts[64];
  snprintf(tmpopts, sizeof tmpopts, "size=%llum,mode=1777", (unsigned long long)tmp_mib);
  mounts[3].data = tmpopts;
  for (size_t i = 0; i < sizeof mounts / sizeof mounts[0]; i++) {
    mkdir(mounts[i].dir, 0755);
    if (mount(mounts[i].src, mounts[i].dir, mounts[i].type, mounts[i].flags, mounts[i].data) < 0 &&
        errno != EBUSY) {
      guest_log("mount %s on %s: %s", mounts[i].type, mounts[i].dir, strerror(errno));
      return -errno;
    }
  }
  if (sethostname(hostname, strlen(hostname)) < 0) {
    guest_log("sethostname: %s", strerror(errno));
    return -errno;
  }
  return 0;
}

static int
write_sysctl(const char *path, const char *value)
{
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return errno == ENOENT ? 0 : -errno; /* a kernel without IPv6 has nothing to disable */
  ssize_t n = write(fd, value, strlen(value));
  int e = errno;
  close(fd);
  return n == (ssize_t)strlen(value) ? 0 : -(e ? e : EIO);
}

/* --net ADDR/32,PROXY (from eph_net= on the kernel command line, when the run grants web):
 * the microVM's virtio-net NIC eth0, whose only peer is a tap beside the proxy's listener
 * (plugins/backend-qemu/tap.c): ADDR/32 on eth0, up, one route PROXY/32 dev eth0,
 * no default route (every other destination is "Network is unreachable"), IPv6 disabled
 * before the link comes up (so no link-local address ever appears), no resolver (the image
 * has no /etc/resolv.conf). Plain ioctls (netdevice(7), SIOCADDRT of route(8)): a handful
 * of calls, no netlink library in the static guest. Any failure fails the boot: the host
 * then sees no hello and the create fails closed. */
static int
vm_net(const char *spec)
{
  char addr[INET_ADDRSTRLEN], gw[INET_ADDRSTRLEN];
  int used = 0;
  struct in_addr a, p;
  if (sscanf(spec, "%15[0-9.]/32,%15[0-9.]%n", addr, gw, &used) != 2 || spec[used] ||
      inet_pton(AF_INET, addr, &a) != 1 || inet_pton(AF_INET, gw, &p) != 1) {
    guest_log("--net '%s': expected ADDR/32,PROXY", spec);
    return -EINVAL;
  }
  static const char *const v6[] = {"all", "default", "lo", "eth0", NULL};
  for (size_t i = 0; v6[i]; i++) {
    char path[96];
    snprintf(path, sizeof path, "/proc/sys/net/ipv6/conf/%s/disable_ipv6", v6[i]);
    int r = write_sysctl(path, "1");
    if (r < 0) {
      guest_log("%s: %s", path, strerror(-r));
      return r;
    }
  }
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    guest_log("socket: %s", strerror(errno));
    return -errno;
  }
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "eth0");
  struct sockaddr_in *sin = (struct sockaddr_in *)&ifr.ifr_addr;
  sin->sin_family = AF_INET;
  sin->sin_addr = a;
  const char *step = "SIOCSIFADDR eth0";
  int r = ioctl(fd, SIOCSIFADDR, &ifr);
  if (r == 0) {
    /* SIOCSIFADDR gave a classful mask; /32 keeps the link free of any prefix route */
    step = "SIOCSIFNETMASK eth0";
    sin->sin_addr.s_addr = htonl(0xffffffffu);
    r = ioctl(fd, SIOCSIFNETMASK, &ifr);
  }
  if (r == 0) {
    /* and its classful broadcast address would add a broadcast route: none */
    step = "SIOCSIFBRDADDR eth0";
    sin->sin_addr.s_addr = 0;
    r = ioctl(fd, SIOCSIFBRDADDR, &ifr);
  }
  if (r == 0 && (step = "SIOCGIFFLAGS eth0", r = ioctl(fd, SIOCGIFFLAGS, &ifr)) == 0) {
    step = "SIOCSIFFLAGS eth0";
    ifr.ifr_flags |= IFF_UP;
    r = ioctl(fd, SIOCSIFFLAGS, &ifr);
  }
  if (r == 0) {
    struct rtentry rt;
    memset(&rt, 0, sizeof rt);
    struct sockaddr_in *dst = (struct sockaddr_in *)&rt.rt_dst;
    struct sockaddr_in *mask = (struct sockaddr_in *)&rt.rt_genmask;
    dst->sin_family = mask->sin_family = AF_INET;
    dst->sin_addr = p;
    mask->sin_addr.s_addr = htonl(0xffffffffu);
    rt.rt_flags = RTF_UP | RTF_HOST;
    rt.rt_dev = (char *)"eth0";
    step = "SIOCADDRT (the proxy's /32 via eth0)";
    r = ioctl(fd, SIOCADDRT, &rt);
  }
  int e = errno;
  close(fd);
  if (r < 0) {
    guest_log("%s: %s", step, strerror(e));
    return -e;
  }
  return 0;
}

static int
open_device(const char *path)
{
  /* A virtio serial port appears once the driver has handled the host's "port add"
   * control message, from a work queue, so it may not exist yet when /init execs us:
   * wait for it (bounded; the host's hello deadline bounds the whole boot anyway). */
  int fd = -1;
  for (int i = 0; i < 1000; i++) {
    fd = open(path, O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (fd >= 0 || (errno != ENOENT && errno != ENXIO && errno != ENODEV))
      break;
    struct timespec pause = {0, 10 * 1000000L};
    nanosleep(&pause, NULL);
  }
  if (fd < 0)
    return -errno;
  /* A console's line discipline would rewrite bytes (CR/LF, ^C): raw mode carries frames
   * unchanged. */
  struct termios t;
  if (isatty(fd) && tcgetattr(fd, &t) == 0) {
    cfmakeraw(&t);
    if (tcsetattr(fd, TCSANOW, &t) < 0)
      return -errno;
  }
  return fd;
}

static int
make_scratch(guest_t *g, const char *tmp)
{
  snprintf(g->rundir, sizeof g->rundir, "%s/ephemeral-run-XXXXXX", tmp);
  if (!mkdtemp(g->rundir)) {
    int e = errno;
    guest_log("mkdtemp in %s: %s", tmp, strerror(e));
    g->rundir[0] = '\0';
    return -e;
  }
  snprintf(g->scratch, sizeof g->scratch, "%s/scratch", g->rundir);
  if (chmod(g->rundir, 0755) < 0 || mkdir(g->scratch, 0700) < 0 ||
      chown(g->scratch, g->uid, g->gid) < 0) {
    int e = errno;
    guest_log("creating %s: %s", g->scratch, strerror(e));
    return -e;
  }
  g->fs.scratch_fd = open(g->scratch, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (g->fs.scratch_fd < 0)
    return -errno;
  g->fs.scratch = g->scratch;
  g->fs.uid = g->uid;
  g->fs.gid = g->gid;
  return 0;
}

static void
send_hello(guest_t *g)
{
  struct utsname u;
  uname(&u);
  json_object *hello = guest_new_msg("hello", 0, false);
  json_object_object_add(hello, "version", json_object_new_int(EPH_PROTO_VERSION));
  json_object_object_add(hello, "kernel", json_object_new_string(u.release));
  json_object_object_add(hello, "scratch", json_object_new_string(g->scratch));
  json_object_object_add(hello, "uid", json_object_new_int((int)g->uid));
  json_object_object_add(hello, "gid", json_object_new_int((int)g->gid));
  json_object_object_add(hello, "pid1", json_object_new_boolean(g->pid1));
  json_object_object_add(hello, "max_frame_bytes", json_object_new_int(EPH_PROTO_MAX_FRAME_BYTES));
  guest_send_frame(g, hello);
}

static void
usage(FILE *f)
{
  fputs("usage: ephemeral-guest (--fd N | --device PATH) [options]\n"
        "  --fd N                  the control stream is inherited file descriptor N\n"
        "  --device PATH           the control stream is a device (e.g. /dev/vport0p1)\n"
        "  --vm                    be the microVM's init: mount /proc /sys /dev /tmp,\n"
        "                          set the hostname, power off at shutdown\n"
        "  --uid N, --gid N        the worker's ids (default 1000)\n"
        "  --tmp DIR               where the run directory is created (default /tmp)\n"
        "  --tmp-size-mib N        size of /tmp in --vm mode (default 256)\n"
        "  --hostname NAME         hostname in --vm mode (default ephemeral)\n"
        "  --net ADDR/32,PROXY     --vm mode: eth0 gets ADDR/32 and one route to PROXY/32,\n"
        "                          IPv6 off (a run granting web)\n"
        "  --default-timeout-ms N  per-command timeout when a request sets none (300000)\n"
        "  --nofile N              RLIMIT_NOFILE ceiling of worker commands (1024)\n",
        f);
}

static long long
num_arg(const char *opt, const char *s, long long min, long long max)
{
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || *end || v < min || v > max) {
    guest_log("%s: '%s' is not a number within %lld..%lld", opt, s, min, max);
    exit(2);
  }
  return v;
}

int
main(int argc, char **argv)
{
  static guest_t g = {.ctl = -1,
                      .sigfd = -1,
                      .devnull = -1,
                      .uid = 1000,
                      .gid = 1000,
                      .default_timeout_ms = DEFAULT_TIMEOUT_MS,
                      .nofile = DEFAULT_NOFILE};
  const char *device = NULL, *tmp = "/tmp", *hostname = "ephemeral", *net = NULL;
  long long tmp_mib = 256;
  enum { O_UID = 256, O_GID, O_TMP, O_TMPSIZE, O_HOST, O_TIMEOUT, O_NOFILE, O_NET };
  static const struct option opts[] = {
      {"fd", required_argument, NULL, 'f'},
      {"device", required_argument, NULL, 'd'},
      {"vm", no_argument, NULL, 'v'},
      {"uid", required_argument, NULL, O_UID},
      {"gid", required_argument, NULL, O_GID},
      {"tmp", required_argument, NULL, O_TMP},
      {"tmp-size-mib", required_argument, NULL, O_TMPSIZE},
      {"hostname", required_argument, NULL, O_HOST},
      {"default-timeout-ms", required_argument, NULL, O_TIMEOUT},
      {"nofile", required_argument, NULL, O_NOFILE},
      {"net", required_argument, NULL, O_NET},
      {"help", no_argument, NULL, 'h'},
      {0},
  };
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'f':
      g.ctl = (int)num_arg("--fd", optarg, 0, INT_MAX);
      break;
    case 'd':
      device = optarg;
      break;
    case 'v':
      g.vm = true;
      break;
    case O_UID:
      g.uid = (uid_t)num_arg("--uid", optarg, 1, 0xfffffffe);
      break;
    case O_GID:
      g.gid = (gid_t)num_arg("--gid", optarg, 1, 0xfffffffe);
      break;
    case O_TMP:
      tmp = optarg;
      break;
    case O_TMPSIZE:
      tmp_mib = num_arg("--tmp-size-mib", optarg, 1, 1 << 20);
      break;
    case O_HOST:
      hostname = optarg;
      break;
    case O_NET:
      net = optarg;
      break;
    case O_TIMEOUT:
      g.default_timeout_ms = (uint32_t)num_arg("--default-timeout-ms", optarg, 1, 86400000);
      break;
    case O_NOFILE:
      g.nofile = (rlim_t)num_arg("--nofile", optarg, 16, 1 << 20);
      break;
    case 'h':
      usage(stdout);
      return 0;
    default:
      usage(stderr);
      return 2;
    }
  }
  if ((g.ctl >= 0) == (device != NULL) || optind != argc) {
    usage(stderr);
    return 2;
  }
  g.pid1 = getpid() == 1;
  g.tmp = tmp;

  /* Nobody may ptrace us or read our fds through /proc, and we never dump core. */
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  /* Limits every worker inherits (soft = hard): set once here, not per command. */
  const char *which = "";
  int lr = guest_set_inherited_limits(&which);
  if (lr < 0) {
    guest_log("setrlimit(%s): %s", which, strerror(-lr));
    return 1;
  }
  /* Dispositions inherited from whoever started us (SIG_IGN survives execve: a daemon
   * started under nohup, a CLI run in the background with SIGINT ignored) back to
   * SIG_DFL, once: a worker then resets only what the guest itself ignores. */
  for (int sig = 1; sig < NSIG; sig++)
    if (sig != SIGKILL && sig != SIGSTOP)
      signal(sig, SIG_DFL); /* EINVAL for the few reserved numbers: ignored */
  /* SCHED_BATCH: woken by a command's output or its exit, the guest does not preempt the
   * command (an exiting process closes its stdout, then its stderr, then signals: each
   * woke the guest in turn, three round trips per command); it runs when the command
   * sleeps or on another CPU. Each worker goes back to SCHED_OTHER (worker.c). */
  struct sched_param sp = {0};
  g.batch = sched_setscheduler(0, SCHED_BATCH, &sp) == 0;
  /* Outside a pid namespace orphans must still come to us so shutdown finds them. */
  if (!g.pid1)
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);

  if (net && !g.vm) {
    guest_log("--net needs --vm (the jail's network is set up by the host)");
    return 2;
  }
  if (g.vm && (vm_setup(hostname, (uint64_t)tmp_mib) < 0 || (net && vm_net(net) < 0)))
    guest_shutdown_and_exit(&g, 1);
  for (int fd = 0; fd < 3; fd++)
    if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) != fd)
      break;
  /* A session of our own, without a controlling terminal: the jail's guest is cloned by
   * the CLI or daemon, whose session may have one (reachable through the sandbox's
   * /dev/tty). Each worker then only takes a process group of its own in it. */
  g.session = setsid() >= 0; /* else (a group leader already) each worker makes its own */
  /* Without it (no /dev/null) each command's stdin is a pipe closed at once. */
  g.devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (device) {
    g.ctl = open_device(device);
    if (g.ctl < 0) {
      guest_log("%s: %s", device, strerror(-g.ctl));
      guest_shutdown_and_exit(&g, 1);
    }
  } else if (fcntl(g.ctl, F_SETFD, FD_CLOEXEC) < 0) {
    guest_log("--fd %d: %s", g.ctl, strerror(errno));
    return 1;
  }

  for (size_t i = 0; i < guest_n_ignored_signals; i++)
    signal(guest_ignored_signals[i], SIG_IGN);
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  /* Exactly these, whatever the host left blocked (the jail clones us with every signal
   * blocked, so that none of the host's handlers runs in the child before its exec). */
  sigprocmask(SIG_SETMASK, &mask, NULL);
  g.sigfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  if (g.sigfd < 0) {
    guest_log("signalfd: %s", strerror(errno));
    guest_shutdown_and_exit(&g, 1);
  }

  char why[256] = "";
  /* Every worker inherits the emptied bounding set at fork (its own step 6 then only reads
   * it): the guest needs no capability an execve() would grant, it execs nothing itself. */
  int dr = guest_drop_bounding_set();
  if (dr < 0) {
    snprintf(why, sizeof why, "dropping the capability bounding set: %s", strerror(-dr));
    guest_log("%s", why);
    guest_send_error(&g, NULL, -dr, why, true);
    guest_shutdown_and_exit(&g, 1);
  }
  if (guest_seccomp_compile(&g.filter, why, sizeof why) < 0) {
    guest_log("%s", why);
    guest_send_error(&g, NULL, EIO, why, true);
    guest_shutdown_and_exit(&g, 1);
  }
  /* The jail: the guest takes the workers' filter itself, once, and every fork inherits it.
   * Nothing the guest does from here on is refused by it (no mount, no namespace, no
   * reboot or clock_settime: those are the microVM's, which installs per worker instead),
   * and without it no command runs: failing here fails the sandbox's start. */
  if (!g.vm) {
    int r = guest_seccomp_install(&g.filter.prog);
    if (r < 0) {
      snprintf(why, sizeof why, "seccomp: installing the filter: %s", strerror(-r));
      guest_log("%s", why);
      guest_send_error(&g, NULL, -r, why, true);
      guest_shutdown_and_exit(&g, 1);
    }
    g.filter.on_guest = true;
  }
  int r = make_scratch(&g, tmp);
  if (r < 0) {
    snprintf(why, sizeof why, "creating the scratch directory in %s: %s", tmp, strerror(-r));
    guest_send_error(&g, NULL, -r, why, true);
    guest_shutdown_and_exit(&g, 1);
  }

  send_hello(&g);
  loop(&g);
  return 0;
}
