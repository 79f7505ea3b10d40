#include <config.h>

#include "runstore.h"

#include <pthread.h>
#include <string.h>

#include "log.h"
#include "util.h"

typedef struct link {
  eph_run_t *run;
  eph_store_t *store;
  eph_run_observer_t next;
  struct link *older;
} link_t;

/* The links live until detach; a tiny list keyed by run keeps the observer's opaque
 * pointer valid without touching the run's own struct. */
static pthread_mutex_t links_lock = PTHREAD_MUTEX_INITIALIZER;
static link_t *links;

static void
on_event(void *opaque, eph_run_t *run, const eph_event_t *ev)
{
  link_t *l = opaque;
  bool zdr = eph_run_zdr(run);
  eph_error_t err = {0};
  const char *text = (zdr && ev->content) ? "[redacted: zero data retention]" : ev->text;
  if (eph_store_event_append(l->store, eph_run_id(run), ev->seq, ev->t_ms, ev->source, ev->kind,
                             text, (zdr && ev->content) ? NULL : ev->data, &err) < 0)
    eph_warn("run %s: storing event %lld: %s", eph_run_id(run), (long long)ev->seq,
             err.message);
  if (l->next.on_event)
    l->next.on_event(l->next.opaque, run, ev);
}

static void
on_update(void *opaque, eph_run_t *run)
{
  link_t *l = opaque;
  cleanup_json json_object *obj = eph_run_to_json(run, false);
  json_object *output = NULL, *usage = NULL, *status = NULL;
  json_object_object_get_ex(obj, "output", &output);
  json_object_object_get_ex(obj, "usage", &usage);
  json_object_object_get_ex(obj, "status", &status);
  /* reason and error travel inside usage's sibling fields: keep them with the output. */
  json_object *reason = NULL, *error = NULL;
  if (json_object_object_get_ex(obj, "reason", &reason))
    json_object_object_add(usage, "reason", json_object_get(reason));
  if (json_object_object_get_ex(obj, "error", &error) && !eph_run_zdr(run))
    json_object_object_add(usage, "error", json_object_get(error));
  eph_error_t err = {0};
  if (eph_store_run_update(l->store, eph_run_id(run), json_object_get_string(status), output,
                           usage, &err) < 0)
    eph_warn("run %s: storing state: %s", eph_run_id(run), err.message);
  if (l->next.on_update)
    l->next.on_update(l->next.opaque, run);
}

int
eph_runstore_attach(eph_store_t *store, eph_run_t *run, const eph_run_observer_t *next,
                    eph_error_t *err)
{
  cleanup_json json_object *obj = eph_run_to_json(run, false);
  json_object *request = NULL, *created = NULL;
  json_object_object_get_ex(obj, "request", &request);
  json_object_object_get_ex(obj, "created_at", &created);
  (void)created;
  int r = eph_store_run_insert(store, eph_run_id(run), eph_run_org(run), "queued",
                               eph_wall_us(), request, eph_run_zdr(run), err);
  if (r < 0)
    return r;
  link_t *l = eph_xcalloc(1, sizeof *l);
  l->run = run;
  l->store = store;
  if (next)
    l->next = *next;
  pthread_mutex_lock(&links_lock);
  l->older = links;
  links = l;
  pthread_mutex_unlock(&links_lock);
  eph_run_observer_t obs = {.on_event = on_event, .on_update = on_update, .opaque = l};
  eph_run_set_observer(run, &obs);
  return 0;
}

void
eph_runstore_detach(eph_run_t *run)
{
  pthread_mutex_lock(&links_lock);
  for (link_t **p = &links; *p; p = &(*p)->older) {
    if ((*p)->run == run) {
      link_t *l = *p;
      *p = l->older;
      free(l);
      break;
    }
  }
  pthread_mutex_unlock(&links_lock);
}
