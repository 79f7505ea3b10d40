/* A sandbox as the core sees it: a backend plugin's machine plus the guest protocol client
 * talking to ephemeral-guest (PID 1 inside) over the byte stream the backend returned.
 * Tools reach it only through the host services (eph_host_t.sandbox_*), after the gate. */
#ifndef EPH_SANDBOX_H
#define EPH_SANDBOX_H

#include <ephemeral/plugin.h>

#include "loader.h"

typedef struct eph_sbx eph_sbx_t;

/* Creates a sandbox with `backend` and waits (until spec->deadline_ms at most) for the
 * guest's hello. On failure nothing is left (the backend destroyed it). *out is owned by the
 * caller and released by eph_sbx_destroy(). */
int eph_sbx_create(const eph_plugin_slot_t *backend, const eph_sandbox_spec_t *spec,
                   eph_sbx_t **out, eph_error_t *err);
/* eph_sbx_create, calling booting(opaque) (when not NULL) once the backend made the
 * machine and while its guest boots: work the caller does there (`exec` starts its signal
 * thread, which must not exist while the backend clones) overlaps the boot instead of
 * following the hello. */
int eph_sbx_create_booting(const eph_plugin_slot_t *backend, const eph_sandbox_spec_t *spec,
                           void (*booting)(void *opaque), void *opaque, eph_sbx_t **out,
                           eph_error_t *err);

/* The worker's scratch directory inside the sandbox, as the guest reported it
 * ("/tmp/ephemeral-run-XXXXXX/scratch"). Borrowed, valid until destroy. */
const char *eph_sbx_scratch(const eph_sbx_t *s);
/* The guest's kernel release and protocol version from its hello. Borrowed. */
const char *eph_sbx_guest_kernel(const eph_sbx_t *s);

/* Guest operations; same contracts as eph_host_t.sandbox_exec/_write/_read/_list. One
 * operation at a time per sandbox (callers serialise); eph_sbx_cancel may come from any
 * thread. */
int eph_sbx_exec(eph_sbx_t *s, const eph_exec_request_t *req, eph_exec_result_t *result,
                 eph_error_t *err);
void eph_exec_result_clear(eph_exec_result_t *result);
int eph_sbx_write(eph_sbx_t *s, const char *path, const void *data, size_t bytes, eph_error_t *err);
int eph_sbx_read(eph_sbx_t *s, const char *path, size_t max_bytes, void **data, size_t *bytes,
                 int *truncated, eph_error_t *err);
int eph_sbx_list(eph_sbx_t *s, const char *path, eph_dirent_t **entries, size_t *count,
                 eph_error_t *err);
void eph_dirents_free(eph_dirent_t *entries, size_t count);

/* Kills every running command of the sandbox (cancellation, deadline). Thread-safe. */
void eph_sbx_cancel(eph_sbx_t *s);

/* Shuts the guest down, has the backend destroy the machine and verify nothing is left,
 * and frees s (even on failure). report (optional) receives what was verified. Returns
 * negative when a process or file was left behind. */
int eph_sbx_destroy(eph_sbx_t *s, eph_sandbox_report_t *report, eph_error_t *err);

#endif
