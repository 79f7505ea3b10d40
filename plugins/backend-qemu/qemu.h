/* backend-qemu internals shared by its files: the QMP client (qmp.c) and the plugin
 * (qemu.c). Nothing here is exported: the plugin's only public symbol is eph_plugin. */
#ifndef EPH_BACKEND_QEMU_H
#define EPH_BACKEND_QEMU_H

#include <stdbool.h>
#include <stdint.h>

#include <ephemeral/plugin.h>

/* A QMP connection over a connected stream socket (one end of a socketpair whose other end
 * QEMU got as `-chardev socket,fd=N -mon mode=control`). Zero-initialise, then qmp_open. */
typedef struct qmp {
  int fd;
  char buf[65536];
  size_t len;
} qmp_t;

/* Reads the greeting and negotiates capabilities before deadline_ms (CLOCK_MONOTONIC ms).
 * Takes ownership of fd (closed by qmp_close, also on failure). */
int qmp_open(qmp_t *q, int fd, int64_t deadline_ms, eph_error_t *err);
void qmp_close(qmp_t *q);

/* Runs one command. args (borrowed, may be NULL) is the "arguments" object. pass_fd >= 0 is
 * sent with the command as SCM_RIGHTS (for getfd). On success *ret (optional) receives the
 * "return" value (owned by the caller, json_object_put). A QMP "error" reply is -EIO with
 * its class and description in err. Events arriving meanwhile are dropped. */
int qmp_exec(qmp_t *q, const char *cmd, json_object *args, int pass_fd, int64_t deadline_ms,
             json_object **ret, eph_error_t *err);

/* Polls query-status until the VM's run state is none of `while_in` (NULL-terminated list,
 * e.g. {"inmigrate", NULL}); *state_out (optional, >= 32 bytes) gets the final state. */
int qmp_wait_status(qmp_t *q, const char *const *while_in, int64_t deadline_ms,
                    char *state_out, size_t state_size, eph_error_t *err);

/* Polls query-migrate until the outgoing migration completed (0) or failed (-EIO). */
int qmp_wait_migration(qmp_t *q, int64_t deadline_ms, uint64_t *bytes, eph_error_t *err);

/* tap.c: the microVM's NIC when a run grants web. */

/* Parses proxy_url "http://A.B.C.D:PORT" into *proxy (host order); A.B.C.D must be the
 * first host of a /30. -EINVAL with the url in err otherwise. */
int qemu_tap_parse_url(const char *url, uint32_t *proxy, eph_error_t *err);

/* Creates a non-persistent tap (IFF_TAP | IFF_NO_PI) in the network namespace proxy_ns_fd,
 * gives it the proxy's address P/30 (from proxy_url) and brings it up. Returns the tap's
 * fd (O_CLOEXEC, owned by the caller: closing the last copy removes the tap), *proxy = P
 * in host order and name (>= IFNAMSIZ bytes) = the tap's name in that netns. On failure
 * nothing is left and a negative errno is returned with err set. */
int qemu_tap_open(int proxy_ns_fd, const char *proxy_url, uint32_t *proxy, char *name,
                  eph_error_t *err);

/* True when an interface `name` exists in the network namespace proxy_ns_fd. */
bool qemu_tap_exists(int proxy_ns_fd, const char *name);

#endif
