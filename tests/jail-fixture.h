/* What the backend-jail unit tests share (test-backend-jail.c, test-backend-jail-host.c):
 * tests/jail-init's line protocol and a look at a process from the host. */
#ifndef EPH_TESTS_JAIL_FIXTURE_H
#define EPH_TESTS_JAIL_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* The files and places every jail test uses. */
typedef struct jf_paths {
  char plugin[1024];  /* <EPH_BUILDDIR>/plugins/.libs/backend-jail.so, or $JAIL_PLUGIN */
  char init[1024];    /* <EPH_BUILDDIR>/tests/jail-init (or $JAIL_INIT): the guest's stand-in */
  char run_dir[256];  /* /run/ephemeral-<tag>-<pid>: slot records of this test's own */
  char cg_parent[64]; /* ephemeral-<tag>-<pid>: its cgroup parent (another process's sweep,
                       * judging by other records, would reap its groups) */
} jf_paths_t;

/* Fills p for the test called tag. False when not root, the TAP plan's skip line printed:
 * the jail needs cgroups and uid maps. */
bool jf_paths_init(jf_paths_t *p, const char *tag);
/* Removes p's run_dir and cgroup parents (those that are empty). */
void jf_paths_remove(const jf_paths_t *p);

/* A cmocka group teardown: unloads the fh_backend_t *ctx points to (mock-host.h). */
int jf_unload(void **ctx);

/* Runs cmd as uid inside the sandbox whose guest stream (tests/jail-init) is fd, waiting
 * 30 s at most for its end. Its wait status, or -1 when the stream ended or stalled first
 * (the sandbox died); its output in out (NUL-terminated, cut at size - 1 bytes). */
int jf_run(int fd, int uid, const char *cmd, char *out, size_t size);

/* Whether host pid is a sandbox's PID 1 (its innermost pid, NSpid's last, is 1). */
bool jf_is_sandbox_init(pid_t pid);

/* The parent pid of host pid (PPid in /proc/<pid>/status), or -1 when it is gone. */
pid_t jf_parent_of(pid_t pid);

#endif
