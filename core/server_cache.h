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
int eph_srv_ended_json(eph_server_t *srv, const char *id, const char *org, char **json,
                       size_t *bytes);

/* Forgets every cached run of srv (history purged, server stopping). */
void eph_srv_cache_clear(const eph_server_t *srv);

#endif
