/* backend-qemu: small file and /proc helpers shared by its files. */
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

#include "qemu.h"

/* ------------------------------------------------------------ small helpers */

int
write_file(const char *path, const char *text, eph_error_t *err)
{
  char tmp[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    return eph_error_set(err, errno, "%s: %s", tmp, strerror(errno));
  size_t len = strlen(text);
  bool ok = write(fd, text, len) == (ssize_t)len;
  ok &= close(fd) == 0;
  if (!ok || rename(tmp, path) < 0) {
    int e = errno ? errno : EIO;
    unlink(tmp);
    return eph_error_set(err, e, "%s: %s", path, strerror(e));
  }
  return 0;
}

char *
read_small(const char *path, char *buf, size_t size)
{
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return NULL;
  ssize_t n = read(fd, buf, size - 1);
  close(fd);
  if (n < 0)
    return NULL;
  buf[n] = '\0';
  return buf;
}

/* The start time of pid (clock ticks since boot, /proc/PID/stat field 22), 0 if gone. */
unsigned long long
start_time(pid_t pid)
{
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  if (!read_small(path, buf, sizeof buf))
    return 0;
  char *p = strrchr(buf, ')');
  unsigned long long t = 0;
  /* after ")": state(3) ppid(4) ... starttime(22) */
  if (!p || sscanf(p + 2,
                   "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d "
                   "%*d %*d %*d %llu",
                   &t) != 1)
    return 0;
  return t;
}

bool
alive(pid_t pid)
{
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  if (!read_small(path, buf, sizeof buf))
    return false;
  char *p = strrchr(buf, ')');
  return p && p[2] != 'Z' && p[2] != 'X';
}

/* True when /proc/PID/cmdline holds the argument `arg` exactly. */
bool
cmdline_has(pid_t pid, const char *arg)
{
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return false;
  char buf[8192];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0)
    return false;
  buf[n] = '\0';
  for (char *s = buf; s < buf + n; s += strlen(s) + 1)
    if (strcmp(s, arg) == 0)
      return true;
  return false;
}

/* Counts the live processes (PID 1 and zombies aside) that `match` accepts; with kill_them
 * they get SIGKILL. */
static int
scan_processes(bool (*match)(pid_t pid, const void *arg), const void *arg, bool kill_them)
{
  DIR *d = opendir("/proc");
  if (!d)
    return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (*end || pid <= 1 || !match((pid_t)pid, arg) || !alive((pid_t)pid))
      continue;
    n++;
    if (kill_them)
      kill((pid_t)pid, SIGKILL);
  }
  closedir(d);
  return n;
}

static bool
match_name(pid_t pid, const void *name)
{
  return cmdline_has(pid, name);
}

/* Processes whose command line carries `-name <name>` (name = "ephemeral-<run_id>"). With
 * kill_them they get SIGKILL. */
int
count_named(const char *name, bool kill_them)
{
  return scan_processes(match_name, name, kill_them);
}

int
rm_tree(const char *dir)
{
  DIR *d = opendir(dir);
  if (!d)
    return errno == ENOENT ? 0 : -errno;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
      continue;
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (unlinkat(dirfd(d), e->d_name, 0) < 0 && errno == EISDIR)
      rm_tree(p);
  }
  closedir(d);
  return rmdir(dir) < 0 && errno != ENOENT ? -errno : 0;
}

int
count_files(const char *dir)
{
  DIR *d = opendir(dir);
  if (!d)
    return errno == ENOENT ? 0 : 1;
  int n = 1; /* the directory itself */
  struct dirent *e;
  while ((e = readdir(d)))
    n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  closedir(d);
  return n;
}

void
find_in_path(const char *prog, char *out, size_t size)
{
  snprintf(out, size, "%s", prog);
  if (strchr(prog, '/'))
    return;
  const char *path = getenv("PATH");
  char dirs[4096];
  snprintf(dirs, sizeof dirs, "%s", path && *path ? path : "/usr/local/bin:/usr/bin:/bin");
  for (char *save, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
    char c[PATH_MAX];
    snprintf(c, sizeof c, "%s/%s", d, prog);
    if (access(c, X_OK) == 0) {
      snprintf(out, size, "%s", c);
      return;
    }
  }
}

static bool
match_uid(pid_t pid, const void *arg)
{
  unsigned long uid = *(const uid_t *)arg;
  char path[64], buf[4096];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  if (!read_small(path, buf, sizeof buf))
    return false;
  const char *u = strstr(buf, "\nUid:");
  unsigned long ru, eu;
  return u && sscanf(u + 5, "%lu %lu", &ru, &eu) == 2 && (ru == uid || eu == uid);
}

/* Processes whose real or effective uid is `uid`; with kill_them they get SIGKILL. */
int
uid_processes(uid_t uid, bool kill_them)
{
  return scan_processes(match_uid, &uid, kill_them);
}

/* The last lines of QEMU's log, for an error message. */
void
log_tail(const char *dir, char *out, size_t size)
{
  char path[PATH_MAX], buf[8192];
  snprintf(path, sizeof path, "%s/qemu.log", dir);
  out[0] = '\0';
  if (!read_small(path, buf, sizeof buf))
    return;
  size_t len = strlen(buf);
  while (len && buf[len - 1] == '\n')
    buf[--len] = '\0';
  const char *start = len > 300 ? buf + len - 300 : buf;
  snprintf(out, size, "%s", start);
  for (char *p = out; *p; p++)
    if (*p == '\n')
      *p = ' ';
}
