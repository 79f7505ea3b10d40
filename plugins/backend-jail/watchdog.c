/* backend-jail: the deadline watchdog, one thread that SIGKILLs a sandbox whose deadline
 * passed. It runs while sandboxes are live: started with the first (jail_watch), it ends
 * with the last (a CLI command then does not wait at exit for it to wake up and end), and
 * jail_fini joins it. */
#include "config.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "jail.h"

/* SIGKILL of the pid namespace's init: the kernel kills every process of the namespace.
 * The cgroup pass catches anything that is in the group but not (yet) in the namespace. */
static void
kill_sandbox(jail_t *j, struct eph_sandbox *sb)
{
  if (sb->pidfd >= 0)
    syscall(SYS_pidfd_send_signal, sb->pidfd, SIGKILL, NULL, 0);
  jail_cg_kill_all(&j->cg, sb->run_id, 0, NULL, NULL);
}

static void *
watchdog_main(void *arg)
{
  jail_t *j = arg;
  pthread_mutex_lock(&j->lock);
  /* It ends with the last sandbox (jail_watch starts another with the next one): a CLI command
   * then does not wait at exit for this thread to wake up and end. */
  while (!j->stopping && j->live) {
    int64_t now = eph_now_ms(), next = INT64_MAX;
    for (struct eph_sandbox *sb = j->live; sb; sb = sb->next) {
      if (sb->deadline_hit || sb->deadline_ms <= 0)
        continue;
      if (sb->deadline_ms <= now) {
        sb->deadline_hit = true;
        j->host->log(EPH_LOG_INFO, "sandbox %s: deadline passed, killing it", sb->run_id);
        kill_sandbox(j, sb);
      } else if (sb->deadline_ms < next) {
        next = sb->deadline_ms;
      }
    }
    if (next == INT64_MAX) {
      pthread_cond_wait(&j->cond, &j->lock);
    } else {
      struct timespec ts = {next / 1000, (long)(next % 1000) * 1000000L};
      pthread_cond_timedwait(&j->cond, &j->lock, &ts);
    }
  }
  j->watchdog_running = false;
  pthread_mutex_unlock(&j->lock);
  return NULL;
}

/* Started on the first sandbox rather than at init, so a daemon that forks after loading
 * its plugins still has it. */
int
jail_watch(jail_t *j, struct eph_sandbox *sb, eph_error_t *err)
{
  pthread_mutex_lock(&j->lock);
  if (!j->watchdog_running) {
    /* The previous one left its loop under this lock and takes it no more: joined here. */
    if (j->watchdog_joinable)
      pthread_join(j->watchdog, NULL);
    j->watchdog_joinable = false;
    int r = pthread_create(&j->watchdog, NULL, watchdog_main, j);
    if (r != 0) {
      pthread_mutex_unlock(&j->lock);
      return eph_error_set(err, r, "starting the deadline watchdog: %s", strerror(r));
    }
    j->watchdog_running = j->watchdog_joinable = true;
  }
  sb->next = j->live;
  if (j->live)
    j->live->prev = sb;
  j->live = sb;
  pthread_cond_signal(&j->cond);
  pthread_mutex_unlock(&j->lock);
  return 0;
}

void
jail_unwatch(jail_t *j, struct eph_sandbox *sb)
{
  pthread_mutex_lock(&j->lock);
  if (sb->prev)
    sb->prev->next = sb->next;
  else if (j->live == sb)
    j->live = sb->next;
  if (sb->next)
    sb->next->prev = sb->prev;
  sb->next = sb->prev = NULL;
  if (!j->live) /* the watchdog ends meanwhile (watchdog_main) */
    pthread_cond_signal(&j->cond);
  pthread_mutex_unlock(&j->lock);
}
