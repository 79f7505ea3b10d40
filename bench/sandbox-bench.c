/* bench/sandbox-bench: the jail's create + exec `true` + destroy, side by side with
 * bubblewrap (`bwrap --unshare-all --die-with-parent` with the same binds) running `true`,
 * interleaved in the same run; then the memory cost of 50 idle sandboxes alive at once.
 * Prints figures only (never pass/fail). Needs root, a built backend-jail.so and
 * ephemeral-guest.
 *
 *   make bench/sandbox-bench && sudo bench/sandbox-bench [iterations]   (default 200)
 *
 * "exec true" for the jail is the full guest round trip: the guest's hello, an exec request
 * over the protocol, the worker forked with caps dropped and seccomp on, its exit frame. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ephemeral/plugin.h>

#include "../guest/protocol.h"

#define IDLE_SANDBOXES 50

static void
host_log(eph_log_level_t level, const char *fmt, ...)
{
  if (level > EPH_LOG_WARN)
    return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static int
cfg_int(const config_setting_t *b, const char *k, int64_t def, int64_t *out, eph_error_t *e)
{
  long long v;
  *out = b && config_setting_lookup_int64(b, k, &v) ? v : def;
  return 0;
}

static int
cfg_bool(const config_setting_t *b, const char *k, int def, int *out, eph_error_t *e)
{
  *out = def;
  return 0;
}

static int
cfg_string(const config_setting_t *b, const char *k, const char *def, const char **out,
           eph_error_t *e)
{
  *out = def;
  if (b)
    config_setting_lookup_string(b, k, out);
  return 0;
}

static double
now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int
cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double
pct(double *v, int n, double p)
{
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  int i = (int)(p * (n - 1) + 0.5);
  return v[i];
}

/* Reads frames until one of type `want` (returns it) or the stream ends (NULL). */
static json_object *
wait_frame(int fd, eph_frame_reader_t *r, const char *want)
{
  for (;;) {
    json_object *o;
    int k = eph_frame_reader_feed(r, fd, &o);
    if (k < 0)
      return NULL;
    if (k == 0)
      continue;
    const char *t = eph_json_get_string(o, "type");
    if (t && !strcmp(t, want))
      return o;
    json_object_put(o);
  }
}

static const eph_plugin_t *plugin;
static const eph_backend_ops_t *ops;
static void *state;

static int
jail_create(int i, eph_sandbox_t **sb, int *fd)
{
  char run_id[64];
  snprintf(run_id, sizeof run_id, "run_bench%d_%d", (int)getpid(), i);
  eph_sandbox_spec_t spec = {.struct_size = sizeof spec, .run_id = run_id};
  eph_error_t err = {0};
  if (ops->create(state, &spec, sb, fd, &err) < 0) {
    fprintf(stderr, "create: %s\n", err.message);
    return -1;
  }
  return 0;
}

static int
jail_exec_true(int fd)
{
  eph_frame_reader_t r = {0};
  json_object *hello = wait_frame(fd, &r, "hello");
  if (!hello) {
    eph_frame_reader_clear(&r);
    return -1;
  }
  json_object_put(hello);
  json_object *req = json_object_new_object();
  json_object_object_add(req, "type", json_object_new_string("exec"));
  json_object_object_add(req, "id", json_object_new_int(1));
  json_object *argv = json_object_new_array();
  json_object_array_add(argv, json_object_new_string("true"));
  json_object_object_add(req, "argv", argv);
  eph_proto_write_frame(fd, req);
  json_object_put(req);
  json_object *ex = wait_frame(fd, &r, "exit");
  eph_frame_reader_clear(&r);
  int64_t code = -1;
  if (ex)
    eph_proto_int(ex, "exit_code", &code);
  json_object_put(ex);
  return ex && code == 0 ? 0 : -1;
}

static int
jail_destroy(eph_sandbox_t *sb, int fd)
{
  eph_sandbox_report_t rep = {.struct_size = sizeof rep};
  eph_error_t err = {0};
  int r = ops->destroy(state, sb, &rep, &err);
  close(fd);
  if (r < 0)
    fprintf(stderr, "destroy: %s\n", err.message);
  return r;
}

static int
bwrap_true(void)
{
  pid_t pid = fork();
  if (pid == 0) {
    int devnull = open("/dev/null", O_RDWR);
    dup2(devnull, 1);
    dup2(devnull, 2);
    execlp("bwrap", "bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
           "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin", "--symlink", "usr/lib",
           "/lib", "--symlink", "usr/lib64", "/lib64", "--ro-bind", "/etc/alternatives",
           "/etc/alternatives", "--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache", "--proc",
           "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--uid", "1000", "--gid", "1000", "--chdir",
           "/tmp", "--", "true", (char *)NULL);
    _exit(127);
  }
  int st;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static long
mem_available_kib(void)
{
  FILE *f = fopen("/proc/meminfo", "r");
  char line[256];
  long v = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %ld kB", &v) == 1)
      break;
  if (f)
    fclose(f);
  return v;
}

static long long
cg_usage(const char *run_id)
{
  char path[512];
  snprintf(path, sizeof path, "/sys/fs/cgroup/memory/ephemeral-bench/%s/memory.usage_in_bytes",
           run_id);
  FILE *f = fopen(path, "r");
  long long v = -1;
  if (f) {
    if (fscanf(f, "%lld", &v) != 1)
      v = -1;
    fclose(f);
  }
  if (v < 0) { /* v2 */
    snprintf(path, sizeof path, "/sys/fs/cgroup/ephemeral-bench/%s/memory.current", run_id);
    f = fopen(path, "r");
    if (f) {
      if (fscanf(f, "%lld", &v) != 1)
        v = -1;
      fclose(f);
    }
  }
  return v;
}

int
main(int argc, char **argv)
{
  int n = argc > 1 ? atoi(argv[1]) : 200;
  const char *b = getenv("EPH_BUILDDIR") ? getenv("EPH_BUILDDIR") : ".";
  char so[1024], guest[1024], text[2048];
  snprintf(so, sizeof so, "%s/plugins/.libs/backend-jail.so", b);
  snprintf(guest, sizeof guest, "%s/guest/ephemeral-guest", b);
  if (getuid() != 0 || n < 2) {
    fprintf(stderr, "usage: (as root) sandbox-bench [iterations >= 2]\n");
    return 2;
  }
  config_t cfg;
  config_init(&cfg);
  snprintf(text, sizeof text,
           "backend-jail: { guest = \"%s\"; cgroup_parent = "
           "\"ephemeral-bench\"; run_dir = \"/run/ephemeral-bench\"; };",
           guest);
  config_read_string(&cfg, text);
  eph_host_t host = {.struct_size = sizeof host,
                     .abi_major = EPH_ABI_MAJOR,
                     .abi_minor = EPH_ABI_MINOR,
                     .log = host_log,
                     .cfg_int = cfg_int,
                     .cfg_bool = cfg_bool,
                     .cfg_string = cfg_string,
                     .state_dir = "/tmp",
                     .data_dir = "/tmp",
                     .libexec_dir = b};
  void *dl = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!dl || !(plugin = dlsym(dl, EPH_PLUGIN_SYMBOL))) {
    fprintf(stderr, "%s: %s\n", so, dlerror());
    return 1;
  }
  ops = plugin->ops;
  eph_error_t err = {0};
  if (plugin->init(&host, config_lookup(&cfg, "backend-jail"), &state, &err) < 0) {
    fprintf(stderr, "init: %s\n", err.message);
    return 1;
  }

  double *ours = calloc((size_t)n, sizeof *ours), *theirs = calloc((size_t)n, sizeof *theirs);
  int fails = 0;
  for (int i = 0; i < n; i++) { /* interleaved: both see the same machine load */
    double t0 = now_ms();
    eph_sandbox_t *sb;
    int fd;
    if (jail_create(i, &sb, &fd) < 0)
      return 1;
    fails += jail_exec_true(fd) < 0;
    fails += jail_destroy(sb, fd) < 0;
    double t1 = now_ms();
    fails += bwrap_true() < 0;
    double t2 = now_ms();
    ours[i] = t1 - t0;
    theirs[i] = t2 - t1;
  }
  double o50 = pct(ours, n, 0.5), o99 = pct(ours, n, 0.99);
  double b50 = pct(theirs, n, 0.5), b99 = pct(theirs, n, 0.99);
  printf("create + exec true + destroy, %d iterations (%d failures)\n", n, fails);
  printf("%-32s %10s %10s\n", "", "p50 ms", "p99 ms");
  printf("%-32s %10.2f %10.2f\n", "backend-jail (+ guest exec)", o50, o99);
  printf("%-32s %10.2f %10.2f\n", "bwrap --unshare-all true", b50, b99);
  printf("%-32s %10.2f %10.2f\n", "ratio ours/bwrap", o50 / b50, o99 / b99);

  /* Memory: 50 sandboxes booted (hello received) and idle. */
  eph_sandbox_t *sbs[IDLE_SANDBOXES];
  int fds[IDLE_SANDBOXES];
  long before = mem_available_kib();
  long long charged = 0;
  for (int i = 0; i < IDLE_SANDBOXES; i++) {
    if (jail_create(100000 + i, &sbs[i], &fds[i]) < 0)
      return 1;
    eph_frame_reader_t r = {0};
    json_object *hello = wait_frame(fds[i], &r, "hello");
    json_object_put(hello);
    eph_frame_reader_clear(&r);
  }
  usleep(200000);
  long after = mem_available_kib();
  for (int i = 0; i < IDLE_SANDBOXES; i++) {
    char id[64];
    snprintf(id, sizeof id, "run_bench%d_%d", (int)getpid(), 100000 + i);
    long long u = cg_usage(id);
    if (u > 0)
      charged += u;
  }
  printf("\n%d idle sandboxes alive at once\n", IDLE_SANDBOXES);
  printf("  cgroup-charged memory per sandbox: %.2f MiB\n",
         charged / (double)IDLE_SANDBOXES / 1048576.0);
  printf("  MemAvailable drop per sandbox:     %.2f MiB (whole machine; noisy)\n",
         (before - after) / (double)IDLE_SANDBOXES / 1024.0);
  for (int i = 0; i < IDLE_SANDBOXES; i++)
    jail_destroy(sbs[i], fds[i]);
  plugin->fini(state);
  dlclose(dl);
  config_destroy(&cfg);
  rmdir("/run/ephemeral-bench");
  free(ours);
  free(theirs);
  return 0;
}
