/* backend-jail: the counters of a run's group(s) the core reads around every command and
 * destroy() reports: v1 memory.oom_control "oom_kill N", memory.max_usage_in_bytes; v2
 * memory.events "oom_kill N", memory.peak; both pids.events "max N". The files are opened
 * once per sandbox and re-read from offset 0 (a cgroup file regenerates its text there). */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "jail.h"

/* The value after "key " on its own line of a flat-keyed file ("oom_kill 3"). */
static uint64_t
keyed_value(const char *text, const char *key)
{
  size_t klen = strlen(key);
  for (const char *line = text; line && *line;
       line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
    if (strncmp(line, key, klen) == 0 && line[klen] == ' ')
      return strtoull(line + klen + 1, NULL, 10);
  }
  return 0;
}

int
jail_cg_counters_open(jail_cgroups_t *cg, const char *name, jail_counter_fds_t *fds,
                      eph_error_t *err)
{
  *fds = JAIL_COUNTER_FDS_NONE;
  int mi = cg->v2 ? 0 : JAIL_CG_MEMORY, pi = cg->v2 ? 0 : JAIL_CG_PIDS;
  cleanup_close int mem = openat(cg->parent_fd[mi], name, O_PATH | O_DIRECTORY | O_CLOEXEC);
  cleanup_close int pids = openat(cg->parent_fd[pi], name, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (mem < 0 || pids < 0)
    return eph_error_set(err, errno, "cgroup of %s: %s", name, strerror(errno));
  fds->oom = openat(mem, cg->v2 ? "memory.events" : "memory.oom_control", O_RDONLY | O_CLOEXEC);
  fds->peak =
      openat(mem, cg->v2 ? "memory.peak" : "memory.max_usage_in_bytes", O_RDONLY | O_CLOEXEC);
  fds->pids = openat(pids, "pids.events", O_RDONLY | O_CLOEXEC);
  return 0;
}

/* The whole text of a counter file, from offset 0, NUL-terminated; false when unreadable. */
static bool
pread_all(int fd, char *buf, size_t size)
{
  size_t off = 0;
  while (fd >= 0 && off + 1 < size) {
    ssize_t n = pread(fd, buf + off, size - 1 - off, (off_t)off);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return false;
    if (n == 0)
      break;
    off += (size_t)n;
  }
  buf[off] = '\0';
  return fd >= 0;
}

void
jail_cg_counters_read(const jail_cgroups_t *cg, const jail_counter_fds_t *fds, jail_counters_t *out)
{
  (void)cg;
  char buf[2048];
  memset(out, 0, sizeof *out);
  if (pread_all(fds->oom, buf, sizeof buf))
    out->oom_kills = keyed_value(buf, "oom_kill");
  if (pread_all(fds->peak, buf, sizeof buf))
    out->memory_peak_bytes = strtoull(buf, NULL, 10);
  if (pread_all(fds->pids, buf, sizeof buf))
    out->pids_refused = keyed_value(buf, "max");
}

void
jail_cg_counters_close(jail_counter_fds_t *fds)
{
  int *all[] = {&fds->oom, &fds->peak, &fds->pids};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    if (*all[i] >= 0)
      close(*all[i]);
    *all[i] = -1;
  }
}

int
jail_cg_counters(jail_cgroups_t *cg, const char *name, jail_counters_t *out, eph_error_t *err)
{
  jail_counter_fds_t fds;
  memset(out, 0, sizeof *out);
  if (jail_cg_counters_open(cg, name, &fds, err) < 0)
    return -err->code;
  jail_cg_counters_read(cg, &fds, out);
  jail_cg_counters_close(&fds);
  return 0;
}
