/* The host services table (eph_host_t) the core hands to every plugin. */
#ifndef EPH_HOST_H
#define EPH_HOST_H

#include <ephemeral/plugin.h>

struct eph_ctx;

/* Fills host for ctx. Strings point into ctx (valid until eph_ctx_close). The per-run
 * services (emit, charge, sandbox_*) dispatch on the eph_run_t they receive. */
void eph_host_init(eph_host_t *host, struct eph_ctx *ctx);

#endif
