/* backend-jail: slot records and the sweep. A sandbox's slot (its uid range) is claimed by
 * an O_EXCL record in run_dir naming the run and its owner (pid and start time); the sweep,
 * at start-up and from the daemon's reconciler, reaps the cgroups of runs whose owner is
 * gone and drops their records, with the process tree as a second witness so a lost record
 * never gets a live sandbox killed. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "jail.h"

/* Field 22 of /proc/<pid>/stat: start time in clock ticks since boot; with the pid it names
 * one process for good (pids are reused). 0 when the process does not exist. */
uint64_t
jail_proc_start_time(pid_t pid)
{
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  cleanup_close int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  if (n <= 0)
    return 0;
  buf[n] = '\0';
  const char *p = strrchr(buf, ')'); /* comm may hold spaces and parentheses */
  if (!p)
    return 0;
  /* after ") ": field 3 (state) .. field 22 (starttime) */
  unsigned long long start = 0;
  if (sscanf(p + 2,
             "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d "
             "%*d %*d %llu",
             &start) != 1)
    return 0;
  return start;
}

/* ------------------------------------------------------------ slot records */

int
jail_slot_claim(jail_t *j, const char *run_id, eph_error_t *err)
{
  uint32_t h = 2166136261u; /* FNV-1a: spreads concurrent runs over the slots */
  for (const char *s = run_id; *s; s++)
    h = (h ^ (unsigned char)*s) * 16777619u;
  json_object *rec = json_object_new_object();
  json_object_object_add(rec, "run_id", json_object_new_string(run_id));
  json_object_object_add(rec, "owner_pid", json_object_new_int64(j->owner_pid));
  json_object_object_add(rec, "owner_start", json_object_new_int64((int64_t)j->owner_start));
  const char *text = json_object_to_json_string_ext(rec, JSON_C_TO_STRING_PLAIN);
  for (uint32_t i = 0; i < j->slots; i++) {
    int slot = (int)((h + i) % j->slots);
    char name[32];
    snprintf(name, sizeof name, "slot-%d", slot);
    int fd = openat(j->run_dir_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST)
      continue;
    if (fd < 0) {
      int e = errno;
      json_object_put(rec);
      return eph_error_set(err, e, "slot record %s/%s: %s", j->run_dir, name, strerror(e));
    }
    size_t len = strlen(text);
    ssize_t n = write(fd, text, len);
    int e = errno;
    close(fd);
    if (n != (ssize_t)len) {
      unlinkat(j->run_dir_fd, name, 0);
      json_object_put(rec);
      return eph_error_set(err, n < 0 ? e : EIO, "write %s/%s: %s", j->run_dir, name,
                           strerror(n < 0 ? e : EIO));
    }
    json_object_put(rec);
    return slot;
  }
  json_object_put(rec);
  return eph_error_set(err, EAGAIN, "all %u sandbox slots are in use (key 'slots')", j->slots);
}

int
jail_slot_release(jail_t *j, int slot)
{
  char name[32];
  snprintf(name, sizeof name, "slot-%d", slot);
  return unlinkat(j->run_dir_fd, name, 0) == 0 || errno == ENOENT ? 0 : -errno;
}

/* ------------------------------------------------------------ sweep */

/* Calls fn(opaque, record file name, run id or NULL, owner alive) for each slot record. */
static void
scan_records(jail_t *j, void (*fn)(void *, const char *, const char *, bool), void *opaque)
{
  int fd = openat(j->run_dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return;
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return;
  }
  struct dirent *de;
  while ((de = readdir(d))) {
    if (strncmp(de->d_name, "slot-", 5) != 0)
      continue;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", j->run_dir, de->d_name);
    json_object *rec = json_object_from_file(path);
    json_object *id = NULL, *opid = NULL, *ostart = NULL;
    const char *run_id = NULL;
    bool alive = false;
    if (rec && json_object_object_get_ex(rec, "run_id", &id) &&
        json_object_object_get_ex(rec, "owner_pid", &opid) &&
        json_object_object_get_ex(rec, "owner_start", &ostart)) {
      run_id = json_object_get_string(id);
      pid_t pid = (pid_t)json_object_get_int64(opid);
      alive = pid > 0 && jail_proc_start_time(pid) == (uint64_t)json_object_get_int64(ostart);
    } else {
      /* Unreadable or half written: the claim is being written right now, or its owner died
       * mid-write. A fresh one is left alone. */
      struct stat st;
      alive = fstatat(j->run_dir_fd, de->d_name, &st, 0) == 0 && st.st_mtime + 10 > time(NULL);
      /* A record that exists but cannot be read (EACCES, EMFILE) is not evidence of death. */
      if (!rec && faccessat(j->run_dir_fd, de->d_name, R_OK, 0) < 0 && errno != ENOENT)
        alive = true;
    }
    fn(opaque, de->d_name, run_id, alive);
    if (rec)
      json_object_put(rec);
  }
  closedir(d);
}

typedef struct sweep_ctx {
  jail_t *j;
  const char *want; /* live_owner(): the run id looked for */
  bool found;
  char **reaped; /* run ids reaped so far */
  size_t n_reaped;
  char **live; /* run ids of live owners at the sweep's start, sorted */
  size_t n_live;
} sweep_ctx_t;

static int
cmp_str(const void *a, const void *b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void
collect_live(void *opaque, const char *file, const char *run_id, bool alive)
{
  sweep_ctx_t *s = opaque;
  (void)file;
  if (!alive || !run_id)
    return;
  char **l = realloc(s->live, (s->n_live + 1) * sizeof *l);
  if (!l)
    return;
  s->live = l;
  if ((s->live[s->n_live] = strdup(run_id)))
    s->n_live++;
}

static void
match_live(void *opaque, const char *file, const char *run_id, bool alive)
{
  sweep_ctx_t *s = opaque;
  (void)file;
  if (alive && run_id && !strcmp(run_id, s->want))
    s->found = true;
}

/* Re-read at the moment a group is judged: a record is written before its group is made,
 * so a concurrent create is seen here and not reaped. */
static bool
live_owner(jail_t *j, const char *run_id)
{
  sweep_ctx_t s = {.j = j, .want = run_id};
  scan_records(j, match_live, &s);
  return s.found;
}

static bool
already_reaped(const sweep_ctx_t *s, const char *run_id)
{
  for (size_t i = 0; i < s->n_reaped; i++)
    if (!strcmp(s->reaped[i], run_id))
      return true;
  return false;
}

static void
note_reaped(sweep_ctx_t *s, const char *run_id)
{
  char **r = realloc(s->reaped, (s->n_reaped + 1) * sizeof *r);
  if (!r)
    return;
  s->reaped = r;
  s->reaped[s->n_reaped] = strdup(run_id);
  if (s->reaped[s->n_reaped])
    s->n_reaped++;
}

static void
reap_group(void *opaque, const char *run_id)
{
  sweep_ctx_t *s = opaque;
  /* Linear in live sandboxes: one scan of the records up front answers for every group
   * whose owner was alive then; only the others (dead, or created since) are re-read. */
  if (s->n_live && bsearch(&run_id, s->live, s->n_live, sizeof *s->live, cmp_str))
    return;
  if (already_reaped(s, run_id) || live_owner(s->j, run_id))
    return;
  /* The record is one witness; the process tree is another, so a lost or unreadable record
   * never gets a live sandbox killed. A sandbox whose owner just died still shows a parent
   * for a moment (reparented to a subreaper while its PDEATHSIG kill completes): give it
   * half a second to go before trusting the tree. */
  for (int waited = 0; jail_cg_has_live_parent(&s->j->cg, run_id); waited += 20) {
    if (waited >= 500)
      return;
    struct timespec ts = {0, 20 * 1000000};
    nanosleep(&ts, NULL);
  }
  /* Every controller's group and the groups below them: what was put in one from outside
   * (in one controller's group only, in a child group) is killed too, and child groups are
   * removed before the run's. */
  jail_cg_tally_t killed = {0}, listed = {0};
  int still = jail_cg_kill_all(&s->j->cg, run_id, 2000, &killed, &listed);
  /* Host processes are never killed: when only they are left, or nothing was listed nor
   * killed (what stays is groups past the walk's bounds), waiting would not help; every
   * later start paid the 2 s for such a tree. What was killed may still be exiting. */
  int groups = jail_cg_remove(&s->j->cg, run_id,
                              still == listed.host && (still || !killed.procs) ? 0 : 2000);
  char ktext[400], ltext[400];
  jail_cg_tally_text(&s->j->cg, &killed, ktext, sizeof ktext);
  if (groups) {
    jail_cg_count(&s->j->cg, run_id, &listed);
    jail_cg_tally_text(&s->j->cg, &listed, ltext, sizeof ltext);
    s->j->host->log(EPH_LOG_WARN,
                    "sweep: sandbox %s of a dead owner: could not remove its cgroups (killed %s; "
                    "%d group(s) left, still listed %s)",
                    run_id, ktext, groups, ltext);
  } else {
    /* A warning when some were where no sandbox process can be: only in another controller's
     * group, or below the run's groups (put there from outside). */
    bool outside = killed.in_children > 0 || killed.groups > 0 ||
                   (!s->j->cg.v2 && killed.in_ctl[JAIL_CG_PIDS] < killed.procs);
    s->j->host->log(outside ? EPH_LOG_WARN : EPH_LOG_INFO,
                    "sweep: sandbox %s of a dead owner: reaped (killed %s)", run_id, ktext);
  }
  note_reaped(s, run_id);
}

static void
drop_dead_record(void *opaque, const char *file, const char *run_id, bool alive)
{
  sweep_ctx_t *s = opaque;
  if (alive)
    return;
  /* Its group (if any) was reaped above; one still present means it could not be removed,
   * and the record stays so the next sweep retries. */
  if (run_id && jail_valid_run_id(run_id) && jail_cg_remove(&s->j->cg, run_id, 0) > 0)
    return;
  if (unlinkat(s->j->run_dir_fd, file, 0) == 0 && run_id && !already_reaped(s, run_id))
    note_reaped(s, run_id);
}

int
jail_sweep(void *state, eph_error_t *err)
{
  jail_t *j = state;
  sweep_ctx_t s = {.j = j};
  if (faccessat(j->run_dir_fd, ".", F_OK, 0) < 0)
    return eph_error_set(err, errno, "sweep: %s: %s", j->run_dir, strerror(errno));
  scan_records(j, collect_live, &s);
  if (s.n_live)
    qsort(s.live, s.n_live, sizeof *s.live, cmp_str);
  /* Groups first, then records: a record outlives its group, never the reverse. */
  jail_cg_list(&j->cg, reap_group, &s);
  scan_records(j, drop_dead_record, &s);
  int n = (int)s.n_reaped;
  for (size_t i = 0; i < s.n_reaped; i++)
    free(s.reaped[i]);
  free(s.reaped);
  for (size_t i = 0; i < s.n_live; i++)
    free(s.live[i]);
  free(s.live);
  return n;
}
