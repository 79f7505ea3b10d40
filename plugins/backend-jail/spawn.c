/* backend-jail: the host's side of a sandbox's set-up, between its clone and its exec
 * (jail.c's create calls these): the id maps, the egress listener, the cgroup moves and the
 * go bytes (jail_parent_side), done by the cloning thread after a copying clone or by a
 * helper thread while the cloning thread sleeps in a clone without a copy (below). */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/sched.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "jail.h"

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#endif

static int
write_proc(pid_t pid, const char *file, const char *text, eph_error_t *err)
{
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, file);
  cleanup_close int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return eph_error_set(err, errno, "open %s: %s", path, strerror(errno));
  size_t len = strlen(text);
  if (write(fd, text, len) != (ssize_t)len)
    return eph_error_set(err, errno, "write %s: %s", path, strerror(errno));
  return 0;
}

/* The failed step the child wrote on the error pipe, if any (the pipe is readable: a
 * record, or EOF once the child exec'd or died): negative with err naming it, or 0. */
int
jail_child_error(int err_fd, const char *run_id, eph_error_t *err)
{
  jail_child_error_t ce;
  struct pollfd pf = {.fd = err_fd, .events = POLLIN};
  if (poll(&pf, 1, 0) <= 0 || read(err_fd, &ce, sizeof ce) != (ssize_t)sizeof ce)
    return 0;
  ce.step[sizeof ce.step - 1] = '\0';
  return eph_error_set(err, ce.errnum, "sandbox %s: set-up step '%s' failed: %s", run_id, ce.step,
                       strerror(ce.errnum));
}

/* ------------------------------------------------------------ the host's side of set-up */

void
jail_close_child_ends(jail_parent_side_t *ps)
{
  for (int i = 0; i < 3; i++)
    if (*ps->child_ends[i] >= 0) {
      close(*ps->child_ends[i]);
      *ps->child_ends[i] = -1;
    }
}

/* Maps the child's ids, gives it its network and cgroups and lets it through steps 1 and 9
 * (setup.c). 0, or negative with ps->err. */
int
jail_parent_side(jail_parent_side_t *ps)
{
  jail_t *j = ps->j;
  eph_sandbox_t *sb = ps->sb;
  eph_error_t *err = &ps->err;
  int r;
  if (ps->limit_memory && (r = jail_cg_limit_memory(&j->cg, sb->run_id, ps->lim, err)) < 0) {
    eph_error_wrap(err, "sandbox %s", sb->run_id);
    return r;
  }
  /* The child waits on `go` while we map its ids and put it in its cgroups. */
  char map[64];
  uint64_t host_id = j->uid_base + (uint64_t)sb->slot * JAIL_IDS_PER_SLOT;
  snprintf(map, sizeof map, "0 %" PRIu64 " %llu\n", host_id, JAIL_IDS_PER_SLOT);
  if ((r = write_proc(sb->pid, "uid_map", map, err)) < 0 ||
      (r = write_proc(sb->pid, "gid_map", map, err)) < 0)
    return r;
  if (ps->spec->network && (r = jail_net_setup(ps->spec, ps->go_fd, ps->limit_ms, err)) < 0) {
    /* A child that failed its step 0 said why on the error pipe before it closed its end. */
    jail_child_error_t ce;
    struct pollfd ep = {.fd = ps->err_fd, .events = POLLIN};
    if (poll(&ep, 1, 0) > 0 && read(ps->err_fd, &ce, sizeof ce) == (ssize_t)sizeof ce) {
      ce.step[sizeof ce.step - 1] = '\0';
      r = eph_error_set(err, ce.errnum, "set-up step '%s' failed: %s", ce.step,
                        strerror(ce.errnum));
    }
    eph_error_wrap(err, "sandbox %s: egress network", sb->run_id);
    return r;
  }
  /* cgroup v1 lets a process other than root move a task only while the task has its
   * uid: after the 'g' the child becomes root of its user namespace (another host uid), so
   * a daemon running as its own user (the packaged unit) moves it first. Root may move it
   * any time: then the move overlaps the child's mounts (v1 makes it wait for an RCU grace
   * period) and the child goes no further than its mounts before the 'c'. */
  bool move_first = !ps->born_in_group && geteuid() != 0;
  if (move_first && (r = jail_cg_attach(&j->cg, sb->run_id, sb->pid, err)) < 0)
    return r;
  if (send(ps->go_fd, "g", 1, MSG_NOSIGNAL) != 1)
    return eph_error_set(err, errno, "sandbox %s: waking the child: %s", sb->run_id,
                         strerror(errno));
  if (!ps->born_in_group && !move_first &&
      (r = jail_cg_attach(&j->cg, sb->run_id, sb->pid, err)) < 0)
    return r;
  if (send(ps->go_fd, "c", 1, MSG_NOSIGNAL) != 1)
    return eph_error_set(err, errno, "sandbox %s: waking the child: %s", sb->run_id,
                         strerror(errno));
  return 0;
}

/* ------------------------------------------------------------ clone without a copy
 *
 * A copying clone of the host (a fork with namespaces) gives the child a copy-on-write
 * image of the whole process until its exec, a few milliseconds later. In a daemon that
 * is the costly part of a sandbox: clone3 copies the page tables of every thread's heap
 * and stacks, write-protects them all, and every page the daemon's threads write next
 * faults once (the reuse path, with a TLB shootdown to the other CPUs): ~20 % of the
 * daemon's CPU under concurrent runs went there, and more the bigger it grows.
 *
 * So, where clone_vm.c can, the child is cloned with CLONE_VM | CLONE_VFORK, as
 * posix_spawn(3) does: it runs in the host's own memory on a stack of its own while the
 * cloning thread sleeps until its exec (or exit); it writes only that stack (its copy of
 * the arguments) and errno, and does only system calls (setup.c). Its files, signal
 * handlers and fs are still its own copies, so every set-up step acts on the child alone.
 * The host's side of the set-up (the id maps, network, cgroups, the go bytes) is then done
 * by a helper thread, told the child exists by the child's 's' on the go socket, that also
 * holds the set-up deadline: a child that misses it is killed, which wakes the sleeper.
 * Signals are blocked around the clone: none of the host's handlers may run in the child
 * (it execs the guest with all blocked; the guest sets its own mask). The child dies with
 * the cloning thread (PR_SET_PDEATHSIG, step 4), the run's thread as before. */

#define VM_STACK_BYTES (256U * 1024U)

static void
vm_kill_child(jail_parent_side_t *ps)
{
  if (ps->sb->pidfd >= 0)
    syscall(SYS_pidfd_send_signal, ps->sb->pidfd, SIGKILL, NULL, 0);
}

/* Waits for fd (POLLIN) or the clone's end (wake_fd) until the deadline: 1 fd ready, 0 the
 * clone ended first, -ETIMEDOUT. */
static int
vm_wait(jail_parent_side_t *ps, int fd)
{
  struct pollfd pf[2] = {{.fd = ps->wake_fd, .events = POLLIN}, {.fd = fd, .events = POLLIN}};
  for (;;) {
    int64_t wait = ps->limit_ms - eph_now_ms();
    int pr = poll(pf, fd >= 0 ? 2 : 1, wait > 0 ? (int)wait : 0);
    if (pr < 0 && errno == EINTR)
      continue;
    if (pr <= 0)
      return -ETIMEDOUT;
    if (fd >= 0 && pf[1].revents)
      return 1;
    return 0;
  }
}

static void *
vm_helper(void *arg)
{
  jail_parent_side_t *ps = arg;
  eph_sandbox_t *sb = ps->sb;
  char b = 0;
  int w = vm_wait(ps, ps->go_fd);
  if (w == 1 && recv(ps->go_fd, &b, 1, 0) == 1 && b == 's') {
    sb->pid = ps->tid;
    jail_close_child_ends(ps); /* the child has its own copies since the clone */
    ps->r = jail_parent_side(ps);
    if (ps->r < 0)
      vm_kill_child(ps);
    else if (vm_wait(ps, -1) < 0) { /* the exec (or exit) ends the clone */
      vm_kill_child(ps);
      ps->r = eph_error_set(&ps->err, ETIMEDOUT, "sandbox %s: set-up did not finish in time",
                            sb->run_id);
    }
  } else if (w < 0 || w == 1) {
    /* No 's' in time (or something else on the socket): the child never got going. It is
     * killed, and if the clone has not even happened yet, when it does: a child left
     * waiting for a 'g' nobody sends would keep the cloning thread asleep for good. */
    ps->r = eph_error_set(&ps->err, w < 0 ? ETIMEDOUT : EPROTO,
                          "sandbox %s: the child did not start its set-up", sb->run_id);
    struct pollfd pf[2] = {{.fd = ps->wake_fd, .events = POLLIN},
                           {.fd = ps->go_fd, .events = POLLIN}};
    for (;;) {
      vm_kill_child(ps);
      if (poll(pf, 2, 100) > 0 && pf[0].revents)
        break;
    }
  }
  /* w == 0: the clone ended before any 's' (it failed, or the child died at once): the
   * cloning thread reports it. */
  return NULL;
}

/* Starts the helper thread; false (and nothing started) where CLONE_VM is not available,
 * the host is not root, or the thread cannot start: the caller then clones a copy.
 *
 * Not root: the child's uid change (step 3) marks its mm non-dumpable, and with CLONE_VM
 * that mm is the host's: from the first sandbox on, every later child's /proc files (its
 * uid_map, gid_map, timens_offsets) belong to root, and a host running as its own user
 * (the packaged unit: CAP_SETUID and CAP_SETGID, no CAP_DAC_OVERRIDE) can no longer open
 * them ("open /proc/N/uid_map: Permission denied" for every create after the first, and
 * during any other child's set-up). Root owns those files whichever way they fall. */
bool
jail_vm_clone_begin(jail_vm_clone_t *vc, jail_parent_side_t *ps)
{
  memset(vc, 0, sizeof *vc);
  vc->ps = ps;
  vc->wake_fd = -1;
  ps->wake_fd = -1;
  if (!jail_clone3_vm_supported || geteuid() != 0)
    return false;
  vc->wake_fd = eventfd(0, EFD_CLOEXEC);
  if (vc->wake_fd < 0)
    return false;
  ps->wake_fd = vc->wake_fd;
  if (pthread_create(&vc->helper, NULL, vm_helper, ps) != 0) {
    close(vc->wake_fd);
    vc->wake_fd = ps->wake_fd = -1;
    return false;
  }
  return true;
}

/* The child's uid change (step 3) clears the dumpable flag of its mm, this process's:
 * the host stayed non-dumpable (no core dump, its /proc files root's) after its first
 * sandbox. It is put back to its value at init, but only once no child of a clone without
 * a copy is left on the mm: with the flag set, such a child after its uid change has its
 * /proc/<pid> files owned by its slot uid, and some act on the mm, the host's, with no
 * check beyond the file's owner (clear_refs write-protects every page of it,
 * coredump_filter). */
void
jail_vm_release(jail_t *j)
{
  pthread_mutex_lock(&j->lock);
  if (--j->vm_children == 0 && j->dumpable == 1)
    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
  pthread_mutex_unlock(&j->lock);
}

static int
vm_child(void *arg)
{
  jail_child_main(arg); /* never returns */
}

/* Clones the child with CLONE_VM | CLONE_VFORK (returns after its exec or exit), then wakes
 * and joins the helper. The child's pid, or -1 with errno; ps->r/err carry the helper's. */
long
jail_vm_clone_run(jail_vm_clone_t *vc, struct clone_args *ca, jail_child_args_t *args)
{
  jail_parent_side_t *ps = vc->ps;
  long pid = -1;
  int e = ENOMEM;
  void *stack = mmap(NULL, VM_STACK_BYTES, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK | MAP_NORESERVE, -1, 0);
  if (stack != MAP_FAILED) {
    struct clone_args c = *ca;
    c.flags |= CLONE_VM | CLONE_VFORK | CLONE_PARENT_SETTID;
    c.parent_tid = (uint64_t)(uintptr_t)&ps->tid;
    c.stack = (uint64_t)(uintptr_t)stack;
    c.stack_size = VM_STACK_BYTES;
    pthread_mutex_lock(&ps->j->lock);
    ps->j->vm_children++;
    pthread_mutex_unlock(&ps->j->lock);
    sigset_t all, old;
    sigfillset(&all);
    /* The child's cancellable calls (read, write, poll, ...) switch this thread's cancel
     * type to asynchronous and back around each call, in this thread's descriptor (glibc's
     * __pthread_enable_asynccancel): one killed inside such a call (the set-up deadline)
     * would leave the thread asynchronously cancellable for good. Put back after. */
    int cancel_type = PTHREAD_CANCEL_DEFERRED;
    pthread_setcanceltype(PTHREAD_CANCEL_DEFERRED, &cancel_type);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid = jail_clone3_vm(&c, vm_child, args);
    e = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_setcanceltype(cancel_type, NULL);
    if (pid < 0)
      jail_vm_release(ps->j); /* no child */
#ifdef __SANITIZE_ADDRESS__
    /* The child's frames poisoned their redzones in this memory and never returned. */
    __asan_unpoison_memory_region(stack, VM_STACK_BYTES);
#endif
    munmap(stack, VM_STACK_BYTES);
  }
  uint64_t one = 1;
  if (write(vc->wake_fd, &one, sizeof one) != (ssize_t)sizeof one)
    vm_kill_child(ps); /* cannot happen (an eventfd below its maximum); never leave it */
  pthread_join(vc->helper, NULL);
  close(vc->wake_fd);
  vc->wake_fd = ps->wake_fd = -1;
  if (pid < 0)
    errno = e;
  return pid;
}
