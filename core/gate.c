#include <config.h>

#include "gate.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "util.h"

void
eph_gate_init(eph_gate_t *g, const eph_request_t *req, struct eph_ctx *ctx)
{
  (void)ctx;
  memset(g, 0, sizeof *g);
  g->shell = req->shell;
  g->web = req->web;
  g->files = req->files_granted;
  g->connections = req->connections;
  g->n_connections = req->n_connections;
}

void
eph_gate_free(eph_gate_t *g)
{
  memset(g, 0, sizeof *g);
}

bool
eph_gate_permits(const eph_gate_t *g, eph_permission_t p)
{
  switch (p) {
  case EPH_PERM_SHELL:
    return g->shell;
  case EPH_PERM_WEB:
    return g->web;
  case EPH_PERM_FILES:
    return g->files;
  case EPH_PERM_CONNECTIONS:
    return g->n_connections > 0;
  }
  return false; /* an unknown row is never granted */
}

int
eph_gate_check_tool(const eph_gate_t *g, const eph_tool_def_t *tool, json_object *args, char *why,
                    size_t why_size)
{
  if (!eph_gate_permits(g, tool->permission)) {
    switch (tool->permission) {
    case EPH_PERM_SHELL:
      snprintf(why, why_size, "shell is disabled for this run");
      break;
    case EPH_PERM_WEB:
      snprintf(why, why_size, "web is disabled for this run");
      break;
    case EPH_PERM_FILES:
      snprintf(why, why_size, "file tools are disabled for this run");
      break;
    case EPH_PERM_CONNECTIONS:
      snprintf(why, why_size, "no connection is granted to this run");
      break;
    default:
      snprintf(why, why_size, "tool '%s' is not permitted for this run", tool->name);
    }
    return -EPH_E_DENIED;
  }
  if (tool->permission != EPH_PERM_CONNECTIONS)
    return 0;
  /* Connections: the named connection must be granted, and a narrowed grant must list
   * the method. The broker re-checks against the operator's own definition. */
  const char *name = eph_json_get_string(args, "connection");
  const char *method = eph_json_get_string(args, "method");
  for (size_t i = 0; name && i < g->n_connections; i++) {
    const eph_connection_grant_t *c = &g->connections[i];
    if (strcmp(c->name, name) != 0)
      continue;
    if (!c->methods)
      return 0;
    for (size_t j = 0; method && j < c->n_methods; j++)
      if (strcasecmp(c->methods[j], method) == 0)
        return 0;
    snprintf(why, why_size, "method %.16s is not granted for connection '%.64s' in this run",
             method ? method : "(none)", name);
    return -EPH_E_DENIED;
  }
  snprintf(why, why_size, "connection '%.64s' is not granted to this run", name ? name : "(none)");
  return -EPH_E_DENIED;
}
