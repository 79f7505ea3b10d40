/* backend-qemu's pool (key `pool`) against real QEMU and the real guest image, the plugin
 * dlopen()ed with the fake core (mock-host.h), as a daemon would use it: several sandboxes
 * from one process. Promises checked:
 *   - from the second restore on, a microVM is started ahead and waits loaded; the next
 *     create takes it ("from the pool"), its guest answers the reseed with its own hello;
 *   - a pooled microVM serves one run only: destroy kills its QEMU and the next run gets
 *     another QEMU (another pid, another uid);
 *   - the run's deadline reaches a pooled microVM's keeper (started before the run existed):
 *     QEMU is killed at the deadline;
 *   - fini ends every pooled microVM (no QEMU, directory or slot of ours left);
 *   - SIGKILL of the owning process takes its pooled microVM along (the keeper's lifeline);
 *   - a microVM restored from an older image's snapshot is never handed out.
 * Run by tests/qemu-pool.test (which skips without root, QEMU or the image) with
 * EPH_STATE_DIR = the state directory holding the guest image. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <ephemeral/plugin.h>

#include "guest/protocol.h"
#include "mock-host.h"

static char plugin_path[1024];
static const char *state_dir;
static config_t cfg;

/* The plugin logs from its filler thread too: its own thread-safe log in place of the
 * mock's (which is for one thread). */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_text[1 << 16];

static void
safe_log(eph_log_level_t level, const char *fmt, ...)
{
  char line[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  (void)level;
  pthread_mutex_lock(&log_lock);
  size_t n = strlen(log_text);
  snprintf(log_text + n, sizeof log_text - n, "%s\n", line);
  pthread_mutex_unlock(&log_lock);
}

static bool
log_has(const char *needle)
{
  pthread_mutex_lock(&log_lock);
  bool r = strstr(log_text, needle) != NULL;
  pthread_mutex_unlock(&log_lock);
  return r;
}

static int
log_count(const char *needle)
{
  int n = 0;
  pthread_mutex_lock(&log_lock);
  for (const char *p = log_text; (p = strstr(p, needle)); p += strlen(needle))
    n++;
  pthread_mutex_unlock(&log_lock);
  return n;
}

typedef fh_backend_t loaded_t;

static void
load(loaded_t *l)
{
  eph_error_t err = {0};
  if (fh_backend_load(l, plugin_path, config_lookup(&cfg, "backend-qemu"), &err) < 0)
    fail_msg("%s", err.message);
}

/* The first frame of the guest (its hello, after the reseed), within 60 s. */
static json_object *
read_hello(int fd)
{
  json_object *o = fh_first_frame(fd, 60000);
  if (!o)
    fail_msg("no hello from the guest");
  assert_string_equal(eph_json_get_string(o, "type"), "hello");
  return o;
}

typedef struct box {
  eph_sandbox_t *s;
  int fd;
  char id[64];
  char scratch[256];
} box_t;

static void
make(loaded_t *l, box_t *b, const char *id, int64_t deadline_ms)
{
  snprintf(b->id, sizeof b->id, "%s", id);
  eph_sandbox_spec_t spec = {.struct_size = sizeof spec,
                             .run_id = b->id,
                             .deadline_ms = deadline_ms,
                             .proxy_netns_fd = -1};
  eph_error_t err = {0};
  if (l->ops->create(l->state, &spec, &b->s, &b->fd, &err) < 0)
    fail_msg("create %s: %s", id, err.message);
  json_object *h = read_hello(b->fd);
  snprintf(b->scratch, sizeof b->scratch, "%s", eph_json_get_string(h, "scratch"));
  json_object_put(h);
}

static void
drop(loaded_t *l, box_t *b, bool want_clean)
{
  eph_sandbox_report_t rep = {.struct_size = sizeof rep};
  eph_error_t err = {0};
  int r = l->ops->destroy(l->state, b->s, &rep, &err);
  close(b->fd);
  if (want_clean && r < 0)
    fail_msg("destroy %s: %s", b->id, err.message);
  assert_int_equal(rep.processes_left, 0);
  assert_int_equal(rep.files_left, 0);
}

/* The pid of the process whose command line has "-name NAME", or 0. */
static pid_t
named(const char *name)
{
  DIR *d = opendir("/proc");
  struct dirent *e;
  pid_t found = 0;
  while (d && !found && (e = readdir(d))) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (*end || pid <= 1)
      continue;
    char path[64], cmd[8192];
    snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
    FILE *f = fopen(path, "r");
    if (!f)
      continue;
    size_t n = fread(cmd, 1, sizeof cmd - 1, f);
    fclose(f);
    cmd[n] = '\0';
    for (char *a = cmd; a < cmd + n; a += strlen(a) + 1)
      if (strcmp(a, "-name") == 0 && a + strlen(a) + 1 < cmd + n &&
          strcmp(a + strlen(a) + 1, name) == 0)
        found = (pid_t)pid;
  }
  if (d)
    closedir(d);
  return found;
}

/* How many processes carry "-name ephemeral-pool-<owner>-*". */
static int
pooled_of(pid_t owner)
{
  int n = 0;
  for (unsigned i = 0; i < 64; i++) {
    char name[64];
    snprintf(name, sizeof name, "ephemeral-pool-%d-%u", (int)owner, i);
    n += named(name) != 0;
  }
  return n;
}

static uid_t
uid_of(pid_t pid)
{
  char path[64];
  snprintf(path, sizeof path, "/proc/%d", (int)pid);
  struct stat st;
  return stat(path, &st) == 0 ? st.st_uid : (uid_t)-1;
}

static bool
gone(pid_t pid)
{
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return true;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *p = strrchr(buf, ')');
  return p && p[2] == 'Z';
}

/* Polls (at most 60 s) until the log shows n pooled microVMs loaded. */
static void
wait_loaded(int n)
{
  int64_t end = eph_now_ms() + 60000;
  while (log_count("loaded and paused") < n && eph_now_ms() < end)
    usleep(20000);
  if (log_count("loaded and paused") < n)
    fail_msg("no pooled microVM loaded in 60 s; log:\n%s", log_text);
}

static void
test_pool_serves_one_run_each(void **st)
{
  (void)st;
  loaded_t l;
  load(&l);
  pid_t me = getpid();
  char run[64], pool0[64], pool1[64];
  box_t a, b, c, d;
  snprintf(run, sizeof run, "pooltest-%d-a", (int)me);
  make(&l, &a, run, 0); /* first restore of the process: no pool yet */
  assert_false(log_has("from the pool"));
  snprintf(run, sizeof run, "pooltest-%d-b", (int)me);
  make(&l, &b, run, 0); /* second: the filler starts one ahead */
  assert_false(log_has("from the pool"));
  wait_loaded(1);
  snprintf(pool0, sizeof pool0, "ephemeral-pool-%d-0", (int)me);
  pid_t p0 = named(pool0);
  assert_true(p0 > 0);
  uid_t u0 = uid_of(p0);
  assert_true(u0 != 0 && u0 != uid_of(me));

  /* c takes it, with a deadline: the keeper learns it at take. */
  snprintf(run, sizeof run, "pooltest-%d-c", (int)me);
  int64_t t_c = eph_now_ms();
  make(&l, &c, run, t_c + 6000);
  assert_true(log_has("from the pool"));
  assert_int_equal(named(pool0), p0); /* the same QEMU, now the run's */
  assert_string_not_equal(c.scratch, b.scratch);
  assert_string_not_equal(c.scratch, a.scratch);
  char path[512];
  snprintf(path, sizeof path, "%s/qemu/run/%s/pid", state_dir, c.id);
  assert_int_equal(access(path, F_OK), 0); /* its directory is the run's now */
  snprintf(path, sizeof path, "%s/qemu/run/pool-%d-0", state_dir, (int)me);
  assert_int_not_equal(access(path, F_OK), 0);
  /* The deadline kills it (the keeper's own clock; we do nothing). */
  while (!gone(p0) && eph_now_ms() < t_c + 30000)
    usleep(20000);
  assert_true(gone(p0));
  assert_true(eph_now_ms() >= t_c + 6000 - 50);
  drop(&l, &c, false);

  /* The replacement: another QEMU, another uid; d takes it and only d. */
  wait_loaded(2);
  snprintf(pool1, sizeof pool1, "ephemeral-pool-%d-1", (int)me);
  pid_t p1 = named(pool1);
  assert_true(p1 > 0 && p1 != p0);
  snprintf(run, sizeof run, "pooltest-%d-d", (int)me);
  make(&l, &d, run, 0);
  assert_int_equal(log_count("restored ahead, from the pool"), 2);
  assert_int_equal(named(pool1), p1);
  assert_true(uid_of(p1) != u0); /* claimed while p0 still held its slot */
  drop(&l, &d, true);
  assert_true(gone(p1)); /* destroyed with its run: never back in the pool */
  drop(&l, &a, true);
  drop(&l, &b, true);

  /* fini ends the pooled one waiting (or being started) now. */
  wait_loaded(3);
  assert_true(pooled_of(me) >= 1);
  fh_backend_unload(&l);
  assert_int_equal(pooled_of(me), 0);
  DIR *dir;
  snprintf(path, sizeof path, "%s/qemu/run", state_dir);
  assert_non_null(dir = opendir(path));
  struct dirent *e;
  char prefix[64];
  snprintf(prefix, sizeof prefix, "pool-%d-", (int)me);
  while ((e = readdir(dir)))
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
      fail_msg("%s/%s left", path, e->d_name);
  closedir(dir);
  /* no slot record names us */
  snprintf(path, sizeof path, "%s/qemu/slots", state_dir);
  assert_non_null(dir = opendir(path));
  char mine[64];
  snprintf(mine, sizeof mine, " %d ", (int)me);
  while ((e = readdir(dir))) {
    char p[1024], buf[256] = "";
    snprintf(p, sizeof p, "%s/%s", path, e->d_name);
    FILE *f = fopen(p, "r");
    if (!f)
      continue;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    if (strstr(buf, mine))
      fail_msg("slot record %s still names us: %s", p, buf);
  }
  closedir(dir);
}

/* A daemon killed with SIGKILL: its pooled microVM goes with it. */
static void
test_pool_dies_with_owner(void **st)
{
  (void)st;
  int pfd[2];
  assert_int_equal(pipe(pfd), 0);
  pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    close(pfd[0]);
    loaded_t l;
    load(&l);
    box_t a, b;
    char run[64];
    snprintf(run, sizeof run, "pooltest-%d-x", (int)getpid());
    make(&l, &a, run, 0);
    snprintf(run, sizeof run, "pooltest-%d-y", (int)getpid());
    make(&l, &b, run, 0);
    wait_loaded(1);
    (void)!write(pfd[1], "1", 1);
    pause();
    _exit(0);
  }
  close(pfd[1]);
  char c;
  int64_t end = eph_now_ms() + 180000;
  struct pollfd p = {.fd = pfd[0], .events = POLLIN};
  while (poll(&p, 1, 1000) == 0 && eph_now_ms() < end)
    ;
  assert_int_equal(read(pfd[0], &c, 1), 1);
  char name[64];
  snprintf(name, sizeof name, "ephemeral-pool-%d-0", (int)child);
  pid_t pooled = named(name);
  assert_true(pooled > 0);
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  end = eph_now_ms() + 10000;
  while (!gone(pooled) && eph_now_ms() < end)
    usleep(20000);
  assert_true(gone(pooled));
  /* the sweep of the next start clears what the dead owner left on disk */
  loaded_t l;
  load(&l);
  eph_error_t err = {0};
  l.ops->sweep(l.state, &err);
  char path[512];
  snprintf(path, sizeof path, "%s/qemu/run/pool-%d-0", state_dir, (int)child);
  assert_int_not_equal(access(path, F_OK), 0);
  fh_backend_unload(&l);
  close(pfd[0]);
}

/* The image changes while a microVM waits in the pool (restored from the old image's
 * snapshot): the next run must not get it. A private copy of the image (its path is part of
 * the identity, so this builds snapshots of its own, removed at the end and by
 * tests/qemu-pool.test whatever the outcome). */
static void
test_pool_refuses_an_older_image(void **st)
{
  (void)st;
  char dir[1024], cmd[4096];
  const char *tmp = getenv("EPH_POOL_TMP");
  if (!tmp)
    skip();
  snprintf(dir, sizeof dir, "%s/image", tmp);
  assert_int_equal(mkdir(dir, 0700), 0);
  snprintf(cmd, sizeof cmd, "cp %s/guest-image/* %s/", state_dir, dir);
  assert_int_equal(system(cmd), 0);
  char text[1200];
  snprintf(text, sizeof text,
           "backend-qemu: { pool = 1; snapshot = true; tsc_khz = 2595000; image_dir = \"%s\"; };",
           dir);
  config_t own;
  config_init(&own);
  assert_int_equal(config_read_string(&own, text), CONFIG_TRUE);
  config_t saved = cfg;
  cfg = own;
  loaded_t l;
  load(&l);
  pid_t me = getpid();
  int before = log_count("restored ahead, from the pool");
  int loaded = log_count("loaded and paused");
  box_t a, b, c;
  char run[64];
  snprintf(run, sizeof run, "pooltest-%d-i1", (int)me);
  make(&l, &a, run, 0);
  snprintf(run, sizeof run, "pooltest-%d-i2", (int)me);
  make(&l, &b, run, 0);
  wait_loaded(loaded + 1);
  char name[64];
  unsigned seq = 0;
  pid_t pooled = 0;
  for (; seq < 64 && !pooled; seq++) {
    snprintf(name, sizeof name, "ephemeral-pool-%d-%u", (int)me, seq);
    pooled = named(name);
  }
  assert_true(pooled > 0);
  /* a new kernel file (same bytes, another mtime): another identity */
  char path[1100];
  snprintf(path, sizeof path, "%s/vmlinuz", dir);
  struct timespec ts[2] = {{0, UTIME_OMIT}, {time(NULL) + 10, 0}};
  assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
  snprintf(run, sizeof run, "pooltest-%d-i3", (int)me);
  make(&l, &c, run, 0);
  assert_int_equal(log_count("restored ahead, from the pool"), before);
  assert_true(gone(pooled));
  drop(&l, &a, true);
  drop(&l, &b, true);
  drop(&l, &c, true);
  fh_backend_unload(&l);
  cfg = saved;
  config_destroy(&own);
  snprintf(
      cmd, sizeof cmd,
      "for f in $(grep -l -a 'kernel %s/vmlinuz' %s/qemu/snapshots/*.vmstate); do rm -f \"$f\"; "
      "done; rm -rf %s",
      dir, state_dir, dir);
  assert_int_equal(system(cmd), 0);
}

int
main(int argc, char **argv)
{
  (void)argc;
  state_dir = getenv("EPH_STATE_DIR");
  const char *b = getenv("EPH_BUILDDIR");
  if (!state_dir || !b) {
    printf("1..0 # SKIP EPH_STATE_DIR and EPH_BUILDDIR are set by tests/qemu-pool.test\n");
    return 0;
  }
  snprintf(plugin_path, sizeof plugin_path, "%s/plugins/.libs/backend-qemu.so", b);
  (void)argv;
  fh_reset(1000000, state_dir, NULL);
  fh_host.log = safe_log;
  config_init(&cfg);
  if (config_read_string(
          &cfg, "backend-qemu: { pool = 1; snapshot = true; tsc_khz = 2595000; };") != CONFIG_TRUE)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pool_serves_one_run_each),
      cmocka_unit_test(test_pool_dies_with_owner),
      cmocka_unit_test(test_pool_refuses_an_older_image),
  };
  int r = cmocka_run_group_tests(tests, NULL, NULL);
  config_destroy(&cfg);
  fh_free();
  return r;
}
