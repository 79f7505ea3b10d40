/* The host side of the guest protocol (guest/PROTOCOL.md): one connection to one
 * ephemeral-guest over the byte stream a backend returned. Used by core/sandbox.c; the tests
 * drive it directly against a real guest on a socketpair.
 *
 * Threading: one operation at a time (callers serialise exec/write/read/list/shutdown);
 * eph_guest_kill() may be called from any thread while an operation runs. */
#ifndef EPH_GUEST_CLIENT_H
#define EPH_GUEST_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ephemeral/plugin.h>

/* Output kept per stream when a request sets output_cap_bytes = 0 (head + tail). */
#define EPH_GUEST_DEFAULT_OUTPUT_CAP_BYTES (64u * 1024)
/* Timeout the guest applies when a request sets timeout_ms = 0 (its --default-timeout-ms
 * default); the client waits this long plus EPH_GUEST_GRACE_MS before giving up. */
#define EPH_GUEST_DEFAULT_TIMEOUT_MS 300000u
#define EPH_GUEST_GRACE_MS 15000

typedef struct eph_guest eph_guest_t;

/* Takes ownership of fd (closed by eph_guest_close, also on failure) and reads the guest's
 * hello until deadline_ms (CLOCK_MONOTONIC ms). Errors: -ETIMEDOUT (no hello in time),
 * -EPH_E_PROTOCOL (not a hello, another protocol version, a malformed frame), -EPIPE
 * (stream closed). *out is owned by the caller: eph_guest_close(). */
int eph_guest_open(int fd, int64_t deadline_ms, eph_guest_t **out, eph_error_t *err);

/* From the hello; borrowed, valid until eph_guest_close. */
const char *eph_guest_scratch(const eph_guest_t *g);
const char *eph_guest_kernel(const eph_guest_t *g);
int eph_guest_version(const eph_guest_t *g);

/* True once the connection is out of step (protocol error, timeout, stream closed): every
 * later operation fails with -EPH_E_PROTOCOL. */
bool eph_guest_broken(const eph_guest_t *g);

/* Runs one command; same contract as eph_host_t.sandbox_exec: 0 when it ran to any end
 * (result filled, release with eph_exec_result_clear), negative when the guest could not be
 * reached or refused the request (-EINVAL with the guest's message for a bad request).
 * Output is capped as it arrives: host memory is bounded by output_cap_bytes per stream,
 * whatever the command prints. stdin_bytes over EPH_PROTO_MAX_DATA_BYTES: -E2BIG. */
int eph_guest_exec(eph_guest_t *g, const eph_exec_request_t *req, eph_exec_result_t *result,
                   eph_error_t *err);

/* Releases a result's texts (also declared in sandbox.h, the public face). */
void eph_exec_result_clear(eph_exec_result_t *result);

/* Same contracts as eph_host_t.sandbox_write/_read/_list (paths relative to scratch). */
int eph_guest_write(eph_guest_t *g, const char *path, const void *data, size_t bytes,
                    eph_error_t *err);
int eph_guest_read(eph_guest_t *g, const char *path, size_t max_bytes, void **data, size_t *bytes,
                   int *truncated, eph_error_t *err);
int eph_guest_list(eph_guest_t *g, const char *path, eph_dirent_t **entries, size_t *count,
                   eph_error_t *err);
void eph_dirents_free(eph_dirent_t *entries, size_t count);

/* Kills the running command's process group; with all, every process of the sandbox but
 * the guest (background ones too). Thread-safe, and never waits for another thread's frame
 * (one being written to a guest that stopped reading): the kill is then sent right after
 * that frame. Returns 0, or -EBADF without a connection. */
int eph_guest_kill(eph_guest_t *g, bool all);

/* Asks the guest to kill everything, remove the run directory and exit; waits for its
 * "bye" (or the end of the stream) until deadline_ms. */
int eph_guest_shutdown(eph_guest_t *g, int64_t deadline_ms, eph_error_t *err);

/* Closes the stream and frees g. NULL is fine. */
void eph_guest_close(eph_guest_t *g);

/* Reply handling, callable without a live guest (the fuzz target's entry point).
 * eph_guest_classify_reply says what one received frame (borrowed) means to an operation
 * waiting for the reply of type `want` to request `id`: EPH_GUEST_REPLY_MATCH (it is the
 * reply), EPH_GUEST_REPLY_STALE (another request's frame: skip it), or a negative error with
 * err set: the guest's errno for a per-request "error" frame, -EPH_E_PROTOCOL for a fatal
 * "error" or a frame of the right id with the wrong type. *fatal is true when the
 * connection is out of step and must not be used again. err's message never refers to the
 * frame's memory. */
#define EPH_GUEST_REPLY_MATCH 1
#define EPH_GUEST_REPLY_STALE 0
int eph_guest_classify_reply(json_object *frame, int64_t id, const char *want, bool *fatal,
                             eph_error_t *err);
/* The same from a frame body's len bytes (what follows the 4-byte length on the stream):
 * parsed as the stream reader does (exactly one JSON object), then classified. On MATCH
 * *out is the frame (owned by the caller, json_object_put()); otherwise *out is NULL. A body
 * that is not one JSON object is -EPH_E_PROTOCOL with *fatal set. */
int eph_guest_reply_bytes(const char *body, size_t len, int64_t id, const char *want,
                          json_object **out, bool *fatal, eph_error_t *err);

/* Head-and-tail capture of one output stream, bounded by its cap whatever is added. */
typedef struct eph_capture {
  size_t head_cap, tail_cap;
  char *head;
  size_t head_len;
  char *tail; /* ring of tail_cap bytes, allocated once the head is full */
  size_t tail_pos, tail_len;
  uint64_t total_bytes;
} eph_capture_t;

/* cap_bytes is split in half: head and tail (0 = EPH_GUEST_DEFAULT_OUTPUT_CAP_BYTES). */
void eph_capture_init(eph_capture_t *c, size_t cap_bytes);
void eph_capture_add(eph_capture_t *c, const void *data, size_t bytes);
/* Builds the kept text: everything when it fitted, else head, a line
 * "[... N bytes dropped ...]" and tail. Heap string (NUL-terminated, may hold NULs) owned
 * by the caller; *bytes its length. Leaves c cleared. */
char *eph_capture_finish(eph_capture_t *c, size_t *bytes, int *truncated, uint64_t *dropped);
void eph_capture_clear(eph_capture_t *c);

#endif
