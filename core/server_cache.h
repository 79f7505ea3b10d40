/* The cached JSON of ended runs (core/server_cache.c). */
#ifndef EPH_SERVER_CACHE_H
#define EPH_SERVER_CACHE_H

#include <stddef.h>

#include "server_int.h"

/* The body GET /v1/runs/{id} answers for a run of `org` that has ended and settled, from
 * the cache or rendered and cached now. Returns 0 with *json (malloc'd, owned by the caller,
 * *bytes long, not NUL-terminated) or 1 when the caller must render it itself: the run is
 * live, not ended, absent, another organisation's, or the store failed (the uncached path
 * then answers, with its own error). */
/* render: the run as the uncached path would answer it (a new reference), or NULL when it
 * is live or cannot be read. A callback, so this unit stays below server_runs.c (which
 * owns the live table) with no dependency cycle between them. */
typedef json_object *(*eph_srv_render_fn)(eph_server_t *srv, const char *id, const char *org);
int eph_srv_ended_json(eph_server_t *srv, const char *id, const char *org, eph_srv_render_fn render,
                       char **json, size_t *bytes);

/* Forgets every cached run of srv (history purged, server stopping). */
void eph_srv_cache_clear(const eph_server_t *srv);

#endif
