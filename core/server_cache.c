/* The rendered JSON of ended runs, cached (issue 17). A run that has ended and settled never
 * changes again, yet GET /v1/runs/{id} parsed its stored record and events and serialised
 * them anew on every request (781k instructions, against 69k for /v1/health). The cache
 * holds the exact bytes the uncached path sends, keyed by run id and checked against the
 * caller's organisation; a run still in memory (queued, running, or settled within
 * live_grace_ms) is never cached: it is rendered from the live run as before.
 *
 * Direct-mapped: CACHE_SLOTS entries, a new run takes its slot over. Entries go when the
 * history is purged (eph_srv_cache_clear) and when the server stops. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include "server_cache.h"
#include "util.h"

#define CACHE_SLOTS 512

typedef struct cached {
  const eph_server_t *srv; /* whose store the bytes came from */
  char *id, *org, *json;   /* owned */
  size_t bytes;
} cached_t;

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static cached_t cache[CACHE_SLOTS];
/* Bumped by every clear: a rendering that started before a purge is not cached after it. */
static unsigned long generation;

static size_t
slot_of(const char *id)
{
  size_t h = 5381;
  for (const unsigned char *p = (const unsigned char *)id; *p; p++)
    h = h * 33 + *p;
  return h % CACHE_SLOTS;
}

static void
entry_free(cached_t *e)
{
  free(e->id);
  free(e->org);
  free(e->json);
  memset(e, 0, sizeof *e);
}

void
eph_srv_cache_clear(const eph_server_t *srv)
{
  pthread_mutex_lock(&cache_lock);
  for (size_t i = 0; i < CACHE_SLOTS; i++)
    if (cache[i].srv == srv)
      entry_free(&cache[i]);
  generation++;
  pthread_mutex_unlock(&cache_lock);
}

/* True when the stored run has ended and settled: a terminal status and a last event
 * `settled` (a record the reconciler may still rewrite lacks it). */
static bool
ended_for_good(json_object *o)
{
  json_object *v = NULL, *evs = NULL;
  const char *status = json_object_object_get_ex(o, "status", &v) ? json_object_get_string(v) : "";
  if (!status || strcmp(status, "queued") == 0 || strcmp(status, "running") == 0)
    return false;
  if (!json_object_object_get_ex(o, "events", &evs) || json_object_array_length(evs) == 0)
    return false;
  json_object *last = json_object_array_get_idx(evs, json_object_array_length(evs) - 1);
  return json_object_object_get_ex(last, "kind", &v) && v &&
         strcmp(json_object_get_string(v), "settled") == 0;
}

int
eph_srv_ended_json(eph_server_t *srv, const char *id, const char *org, eph_srv_render_fn render,
                   char **json, size_t *bytes)
{
  size_t k = slot_of(id);
  pthread_mutex_lock(&cache_lock);
  cached_t *e = &cache[k];
  if (e->srv == srv && strcmp(e->id, id) == 0) {
    /* Another organisation's run answers 404 on the uncached path: the same here. */
    int r = strcmp(e->org, org) == 0 ? 0 : 1;
    if (r == 0) {
      *json = eph_xmalloc(e->bytes);
      memcpy(*json, e->json, e->bytes);
      *bytes = e->bytes;
    }
    pthread_mutex_unlock(&cache_lock);
    return r;
  }
  unsigned long gen = generation;
  pthread_mutex_unlock(&cache_lock);

  cleanup_json json_object *o = render(srv, id, org);
  if (!o || !ended_for_good(o))
    return 1;
  /* The bytes json_h() sends. */
  char *text =
      eph_xasprintf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
                                                                  JSON_C_TO_STRING_NOSLASHESCAPE));
  size_t n = strlen(text);
  pthread_mutex_lock(&cache_lock);
  if (gen == generation) {
    e = &cache[k];
    entry_free(e);
    *e = (cached_t){.srv = srv,
                    .id = eph_xstrdup(id),
                    .org = eph_xstrdup(org),
                    .json = eph_xmalloc(n),
                    .bytes = n};
    memcpy(e->json, text, n);
  }
  pthread_mutex_unlock(&cache_lock);
  *json = text;
  *bytes = n;
  return 0;
}
