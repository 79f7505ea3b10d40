/* The guest tests' fixture (tests/test_guest_protocol.c, tests/test-guest-client.c): a real
 * ephemeral-guest as PID 1 of a fresh pid + mount namespace (its own /proc, an 8 MiB tmpfs on
 * /tmp), its stream one end of a socketpair. Needs root: the calls skip() otherwise. */
#ifndef EPH_TESTS_GUEST_FIXTURE_H
#define EPH_TESTS_GUEST_FIXTURE_H

#include <stdint.h>
#include <sys/types.h>

#include "guest_client.h"

typedef struct guest_proc {
  pid_t pid; /* the helper that owns the namespaces; exits with the guest */
  int fd;    /* our end of the stream (moved into g once opened) */
  eph_guest_t *g;
} guest_proc_t;

/* The guest binary's path ($EPH_BUILDDIR/guest/ephemeral-guest), set by guest_fixture_setup. */
extern char guest_path[4096];

/* cmocka group set-up: finds the guest binary. */
int guest_fixture_setup(void **state);
/* Starts a guest in new pid and mount namespaces; gp->fd is our end of its stream. */
void spawn_guest(guest_proc_t *gp);
/* spawn_guest, then the client's hello (gp->g open, gp->fd moved into it). */
void start_guest(guest_proc_t *gp);
/* Waits up to timeout_ms for the helper to exit; its exit status, or -1 (then killed). */
int wait_exit(pid_t pid, int timeout_ms);
/* Shuts the guest down and checks it exited with 0. */
void stop_guest(guest_proc_t *gp);
/* Runs `command` (timeout_ms, 0: none) and fails the test on a transport error; res is the
 * caller's to clear with eph_exec_result_clear. */
int guest_run(guest_proc_t *gp, const char *command, uint32_t timeout_ms, eph_exec_result_t *res);

#endif
