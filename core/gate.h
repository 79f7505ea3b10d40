/* The policy gate: built from a run's permission table, consulted by the core before every
 * tool call (and, with the deadline and reservation, before every model call: see run.c).
 * A call it refuses never enters the plugin. */
#ifndef EPH_GATE_H
#define EPH_GATE_H

#include <stdbool.h>
#include <stddef.h>

#include <ephemeral/plugin.h>

#include "request.h"

struct eph_ctx;

typedef struct eph_gate {
  bool shell, web, files;
  const eph_connection_grant_t *connections; /* borrowed from the request */
  size_t n_connections;
} eph_gate_t;

void eph_gate_init(eph_gate_t *g, const eph_request_t *req, struct eph_ctx *ctx);
void eph_gate_free(eph_gate_t *g);

/* Whether a permission row is granted at all (decides which tools are offered). */
bool eph_gate_permits(const eph_gate_t *g, eph_permission_t p);

/* Checks one call. Returns 0 when allowed; -EPH_E_DENIED with a plain sentence for the
 * model in why ("web is disabled for this run"). args may be NULL. */
int eph_gate_check_tool(const eph_gate_t *g, const eph_tool_def_t *tool, json_object *args,
                        char *why, size_t why_size);

#endif
