/* A run's timeline events queued and committed together (see evqueue.h for the contract). */
#include <config.h>

#include "evqueue.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "util.h"

/* A batch is committed at once past these (a command printing fast fills events quickly;
 * the queue holds the run's memory only so long). */
#define EVQ_MAX_EVENTS 256
#define EVQ_MAX_BYTES (1024 * 1024)

typedef struct qev {
  int64_t seq, t_ms;
  char *source, *kind, *text, *data; /* data: JSON text or NULL */
} qev_t;

struct eph_evq {
  eph_store_t *store;
  eph_run_t *run;
  int64_t flush_ms;
  bool grouped; /* the store commits a batch in one transaction; else write-through */
  /* One batch at a time, in seq order: a push that commits and the writer thread. */
  pthread_mutex_t flush_lock;
  pthread_mutex_t lock; /* pending, n, cap, bytes, first_ms */
  qev_t *pending;
  size_t n, cap, bytes;
  int64_t first_ms; /* when the oldest pending event was queued */
  /* The writer's list (writer.lock): listed while it may hold events; inflight while the
   * writer commits it outside its lock (eph_evq_free waits for that). */
  eph_evq_t *next;
  bool listed;
  int inflight;
  /* The run's row (eph_evq_set_row): written by the commit after the batch. row (under
   * lock) is the deferred row, the run's state as it was when it was deferred, after the
   * events it reflects were pushed: taken with the batch in one step, so that it never says
   * more than the batch and what was stored before. */
  eph_evq_row_fn row_fn;
  void *row_opaque;
  json_object *row;
};

/* The process's writer thread: commits the queues whose oldest event waited flush_ms. */
static struct {
  pthread_mutex_t lock;
  pthread_cond_t wake, idle; /* wake: a queue to watch; idle: an inflight commit ended */
  bool started, failed;      /* failed: it could not be started; events are committed at once */
  int64_t wait_until;        /* the deadline it sleeps to (INT64_MAX: none) */
  eph_evq_t *queues;
} writer = {.lock = PTHREAD_MUTEX_INITIALIZER, .wait_until = INT64_MAX};

static void
qev_clear(qev_t *e)
{
  free(e->source);
  free(e->kind);
  free(e->text);
  free(e->data);
}

static void
report(eph_evq_t *q, int r, const eph_error_t *err)
{
  if (r >= 0)
    return;
  eph_warn("run %s: storing its events: %s", eph_run_id(q->run), err->message);
  /* A timeline with a hole is not a record: the run stops (storage_error). */
  eph_run_storage_failed(q->run, err->message);
}

/* Commits what is pending now: one transaction, then the row deferred with it, or fresh
 * (owned; newer than the deferred one, which it replaces) when not NULL (flush_lock held by
 * the caller). */
static int
commit_locked(eph_evq_t *q, json_object *fresh)
{
  pthread_mutex_lock(&q->lock);
  qev_t *batch = q->pending;
  size_t n = q->n;
  json_object *row = q->row;
  q->pending = NULL;
  q->n = q->cap = q->bytes = 0;
  q->row = NULL;
  pthread_mutex_unlock(&q->lock);
  if (fresh) {
    json_object_put(row);
    row = fresh;
  }
  int r = 0;
  if (n) {
    eph_store_event_t *evs = eph_xcalloc(n, sizeof *evs);
    for (size_t i = 0; i < n; i++)
      evs[i] = (eph_store_event_t){.seq = batch[i].seq,
                                   .t_ms = batch[i].t_ms,
                                   .source = batch[i].source,
                                   .kind = batch[i].kind,
                                   .text = batch[i].text,
                                   .data_json = batch[i].data};
    eph_error_t err = {0};
    r = eph_store_events_append(q->store, eph_run_id(q->run), evs, n, &err);
    report(q, r, &err);
    free(evs);
    for (size_t i = 0; i < n; i++)
      qev_clear(&batch[i]);
  }
  free(batch);
  /* A row after a batch that failed would say more than the store's timeline: the run has
   * its storage error, and its last row write (which comes after) says so. */
  if (row && q->row_fn && r >= 0)
    q->row_fn(q->row_opaque, row);
  json_object_put(row);
  return r < 0 ? r : 0;
}

int
eph_evq_flush(eph_evq_t *q)
{
  pthread_mutex_lock(&q->flush_lock);
  int r = commit_locked(q, NULL);
  pthread_mutex_unlock(&q->flush_lock);
  return r;
}

static void *
writer_main(void *arg)
{
  (void)arg;
  pthread_mutex_lock(&writer.lock);
  for (;;) {
    int64_t now = eph_now_ms(), earliest = INT64_MAX;
    eph_evq_t *due = NULL;
    for (eph_evq_t **p = &writer.queues; *p;) {
      eph_evq_t *q = *p;
      pthread_mutex_lock(&q->lock);
      size_t n = q->n + (q->row ? 1 : 0);
      int64_t at = q->first_ms + q->flush_ms;
      pthread_mutex_unlock(&q->lock);
      if (!n && !q->inflight) {
        /* Empty: its next push lists it again. */
        *p = q->next;
        q->listed = false;
        continue;
      }
      if (n && at <= now) {
        due = q;
        break;
      }
      if (n && at < earliest)
        earliest = at;
      p = &q->next;
    }
    if (due) {
      due->inflight++;
      pthread_mutex_unlock(&writer.lock);
      eph_evq_flush(due);
      pthread_mutex_lock(&writer.lock);
      if (--due->inflight == 0)
        pthread_cond_broadcast(&writer.idle);
      continue;
    }
    writer.wait_until = earliest;
    if (earliest == INT64_MAX) {
      pthread_cond_wait(&writer.wake, &writer.lock);
    } else {
      struct timespec ts = {.tv_sec = earliest / 1000, .tv_nsec = (earliest % 1000) * 1000000};
      pthread_cond_timedwait(&writer.wake, &writer.lock, &ts);
    }
    writer.wait_until = INT64_MAX;
  }
  return NULL;
}

/* Puts q in the writer's watch (it has just got its first pending event, queued at
 * first_ms), starting the writer on first use; wakes it when it sleeps past q's deadline.
 * False when no writer could be started: the caller commits at once instead. */
static bool
writer_watch(eph_evq_t *q, int64_t first_ms)
{
  pthread_mutex_lock(&writer.lock);
  if (writer.failed) {
    pthread_mutex_unlock(&writer.lock);
    return false;
  }
  if (!writer.started) {
    eph_cond_init_monotonic(&writer.wake);
    eph_cond_init_monotonic(&writer.idle);
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    writer.started = pthread_create(&t, &a, writer_main, NULL) == 0;
    pthread_attr_destroy(&a);
    if (!writer.started) {
      writer.failed = true;
      pthread_mutex_unlock(&writer.lock);
      eph_warn("event writer thread: %s; events are committed one by one", strerror(EAGAIN));
      return false;
    }
  }
  if (!q->listed) {
    q->next = writer.queues;
    writer.queues = q;
    q->listed = true;
  }
  if (first_ms + q->flush_ms < writer.wait_until)
    pthread_cond_signal(&writer.wake);
  pthread_mutex_unlock(&writer.lock);
  return true;
}

eph_evq_t *
eph_evq_new(eph_store_t *store, eph_run_t *run, int64_t flush_ms)
{
  eph_evq_t *q = eph_xcalloc(1, sizeof *q);
  q->store = store;
  q->run = run;
  q->flush_ms = flush_ms > 0 ? flush_ms : 0;
  q->grouped = q->flush_ms > 0 && eph_store_groups_events(store);
  pthread_mutex_init(&q->flush_lock, NULL);
  pthread_mutex_init(&q->lock, NULL);
  return q;
}

void
eph_evq_push(eph_evq_t *q, int64_t seq, int64_t t_ms, const char *source, const char *kind,
             const char *text, json_object *data)
{
  if (!q->grouped) {
    eph_error_t err = {0};
    int r = eph_store_event_append(q->store, eph_run_id(q->run), seq, t_ms, source, kind, text,
                                   data, &err);
    report(q, r, &err);
    return;
  }
  /* The run's end is in the store before the ledger's settle and the lock file's removal
   * are decided on (run.c reads eph_run_storage_failed right after these). */
  bool ends = kind && (!strcmp(kind, "ended") || !strcmp(kind, "settled"));
  qev_t e = {.seq = seq,
             .t_ms = t_ms,
             .source = eph_xstrdup(source ? source : ""),
             .kind = eph_xstrdup(kind ? kind : ""),
             .text = eph_xstrdup(text ? text : ""),
             .data = data
                         ? eph_xstrdup(json_object_to_json_string_ext(data, JSON_C_TO_STRING_PLAIN))
                         : NULL};
  size_t bytes = strlen(e.text) + (e.data ? strlen(e.data) : 0) + 64;
  int64_t now = eph_now_ms();
  pthread_mutex_lock(&q->lock);
  if (q->n == q->cap) {
    q->cap = q->cap ? 2 * q->cap : 16;
    q->pending = eph_xrealloc(q->pending, q->cap * sizeof *q->pending);
  }
  q->pending[q->n++] = e;
  q->bytes += bytes;
  bool first = q->n == 1 && !q->row;
  if (first)
    q->first_ms = now;
  /* Past its deadline the batch is the writer thread's to commit (it wakes at the deadline),
   * not this pusher's: a run's agent loop does not wait for a commit between two calls. A
   * writer late by a whole interval more (busy with another run's slow commit) is not
   * waited for: the pusher commits, so what waits stays bounded (2 x flush_ms). */
  bool commit =
      q->n >= EVQ_MAX_EVENTS || q->bytes >= EVQ_MAX_BYTES || now - q->first_ms >= 2 * q->flush_ms;
  pthread_mutex_unlock(&q->lock);
  if (commit || ends || (first && !writer_watch(q, now)))
    eph_evq_flush(q);
}

void
eph_evq_set_row(eph_evq_t *q, eph_evq_row_fn fn, void *opaque)
{
  q->row_fn = fn;
  q->row_opaque = opaque;
}

bool
eph_evq_defer_row(eph_evq_t *q, json_object *row)
{
  if (!q->grouped || !q->row_fn)
    return false;
  int64_t now = eph_now_ms();
  pthread_mutex_lock(&q->lock);
  bool first = q->n == 0 && !q->row;
  json_object *older = q->row;
  q->row = row;
  if (first)
    q->first_ms = now;
  pthread_mutex_unlock(&q->lock);
  json_object_put(older);
  if (first && !writer_watch(q, now))
    eph_evq_flush(q);
  return true;
}

int
eph_evq_flush_row(eph_evq_t *q, json_object *row)
{
  pthread_mutex_lock(&q->flush_lock);
  int r = commit_locked(q, row);
  pthread_mutex_unlock(&q->flush_lock);
  return r;
}

void
eph_evq_free(eph_evq_t *q)
{
  if (!q)
    return;
  pthread_mutex_lock(&writer.lock);
  for (eph_evq_t **p = &writer.queues; *p; p = &(*p)->next)
    if (*p == q) {
      *p = q->next;
      break;
    }
  q->listed = false;
  while (q->inflight)
    pthread_cond_wait(&writer.idle, &writer.lock);
  pthread_mutex_unlock(&writer.lock);
  eph_evq_flush(q);
  pthread_mutex_destroy(&q->lock);
  pthread_mutex_destroy(&q->flush_lock);
  free(q);
}
