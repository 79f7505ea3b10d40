/* See jail-fixture.h. */
#define _GNU_SOURCE
#include "jail-fixture.h"
#include "mock-host.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

bool
jf_paths_init(jf_paths_t *p, const char *tag)
{
  const char *b = getenv("EPH_BUILDDIR");
  if (getuid() != 0) {
    printf("1..0 # SKIP backend-jail tests need root (cgroups, uid maps)\n");
    return false;
  }
  snprintf(p->plugin, sizeof p->plugin, "%s/plugins/.libs/backend-jail.so", b ? b : ".");
  if (getenv("JAIL_PLUGIN"))
    snprintf(p->plugin, sizeof p->plugin, "%s", getenv("JAIL_PLUGIN"));
  snprintf(p->init, sizeof p->init, "%s/tests/jail-init", b ? b : ".");
  if (getenv("JAIL_INIT"))
    snprintf(p->init, sizeof p->init, "%s", getenv("JAIL_INIT"));
  snprintf(p->run_dir, sizeof p->run_dir, "/run/ephemeral-%s-%d", tag, (int)getpid());
  snprintf(p->cg_parent, sizeof p->cg_parent, "ephemeral-%s-%d", tag, (int)getpid());
  return true;
}

void
jf_paths_remove(const jf_paths_t *p)
{
  rmdir(p->run_dir);
  char path[512];
  static const char *const where[] = {"memory/", "pids/", "cpu/", ""};
  for (size_t i = 0; i < sizeof where / sizeof where[0]; i++) {
    snprintf(path, sizeof path, "/sys/fs/cgroup/%s%s", where[i], p->cg_parent);
    rmdir(path);
  }
}

int
jf_unload(void **ctx)
{
  fh_backend_unload(*ctx);
  return 0;
}

int
jf_run(int fd, int uid, const char *cmd, char *out, size_t size)
{
  char line[4096];
  int n = snprintf(line, sizeof line, "%d %s\n", uid, cmd);
  if (write(fd, line, (size_t)n) != n)
    return -1;
  size_t off = 0;
  out[0] = '\0';
  for (;;) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, 30000) <= 0)
      return -1;
    char buf[4096];
    ssize_t r = read(fd, buf, sizeof buf);
    if (r <= 0)
      return -1;
    size_t take = (size_t)r < size - 1 - off ? (size_t)r : size - 1 - off;
    memcpy(out + off, buf, take);
    off += take;
    out[off] = '\0';
    char *m = strstr(out, "\n@@EXIT ");
    if (m && strchr(m + 8, '\n')) {
      int st = atoi(m + 8);
      *m = '\0';
      return st;
    }
  }
}

/* The value of field `key` ("NSpid:") of /proc/<pid>/status, into buf; false when the
 * process or the field is not there. */
static bool
status_field(pid_t pid, const char *key, char *buf, size_t size)
{
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  bool found = false;
  if (!f)
    return false;
  while (!found && fgets(line, sizeof line, f))
    if (strncmp(line, key, strlen(key)) == 0) {
      snprintf(buf, size, "%s", line + strlen(key));
      found = true;
    }
  fclose(f);
  return found;
}

bool
jf_is_sandbox_init(pid_t pid)
{
  char v[256];
  if (!status_field(pid, "NSpid:", v, sizeof v))
    return false;
  char *last = strrchr(v, '\t');
  return last && atoi(last + 1) == 1;
}

pid_t
jf_parent_of(pid_t pid)
{
  char v[256];
  return status_field(pid, "PPid:", v, sizeof v) ? (pid_t)atoi(v) : -1;
}
