#include <config.h>

#include "runstore.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster.h"
#include "evqueue.h"
#include "loader.h"
#include "log.h"
#include "util.h"

typedef struct link {
  eph_run_t *run;
  eph_store_t *store;
  eph_evq_t *events; /* the run's events on their way to the store (evqueue.h) */
  eph_run_observer_t next;
  struct link *older;
  atomic_bool running_written; /* the last row written at once said running */
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
  const char *text = (zdr && ev->content) ? "[redacted: zero data retention]" : ev->text;
  /* A failed write stops the run (storage_error), reported by the queue. */
  eph_evq_push(l->events, ev->seq, ev->t_ms, ev->source, ev->kind, text,
               (zdr && ev->content) ? NULL : ev->data);
  if (l->next.on_event)
    l->next.on_event(l->next.opaque, run, ev);
}

static void
on_sync(void *opaque, eph_run_t *run)
{
  link_t *l = opaque;
  eph_evq_flush(l->events); /* a failure is reported to the run by the queue */
  if (l->next.on_sync)
    l->next.on_sync(l->next.opaque, run);
}

/* The run's row as of now: {"status", "output", "usage"} as the store keeps them, sharing no
 * object with the run (a deferred row is freed by the writer thread). */
static json_object *
row_of(eph_run_t *run)
{
  cleanup_json json_object *obj = eph_run_to_json(run, false);
  json_object *output = NULL, *usage = NULL, *status = NULL;
  json_object_object_get_ex(obj, "output", &output);
  json_object_object_get_ex(obj, "usage", &usage);
  json_object_object_get_ex(obj, "status", &status);
  /* reason and error travel inside usage's sibling fields: keep them with the output. */
  json_object *reason = NULL, *error = NULL;
  if (json_object_object_get_ex(obj, "reason", &reason))
    json_object_object_add(usage, "reason", json_object_get(reason));
  /* What the run object says of the run besides its money, kept in the row so that every
   * node answers the same object (eph_run_json_from_store lifts them out of usage again):
   * the backend that ran it, the model that answered. A replayed run stays marked as one
   * in its stored record (honest replay). */
  static const char *const facts[] = {"backend", "model"};
  for (size_t i = 0; i < sizeof facts / sizeof facts[0]; i++) {
    json_object *v = NULL;
    if (json_object_object_get_ex(obj, facts[i], &v))
      json_object_object_add(usage, facts[i], json_object_get(v));
  }
  json_object *replayed = NULL, *transcript = NULL;
  if (json_object_object_get_ex(obj, "replayed", &replayed) && json_object_get_boolean(replayed)) {
    json_object_object_add(usage, "replayed", json_object_get(replayed));
    if (json_object_object_get_ex(obj, "transcript", &transcript))
      json_object_object_add(usage, "transcript", json_object_get(transcript));
  }
  if (json_object_object_get_ex(obj, "error", &error) && !eph_run_zdr(run))
    json_object_object_add(usage, "error", json_object_get(error));
  /* A deep copy: the output's files are the run's own array. */
  json_object *row = json_object_new_object(), *copy = NULL;
  json_object_object_add(row, "status", json_object_get(status));
  if (output && json_object_deep_copy(output, &copy, NULL) == 0)
    json_object_object_add(row, "output", copy);
  json_object_object_add(row, "usage", json_object_get(usage));
  return row;
}

/* Writes row (row_of) as the run's row (the queue's row writer: called by a commit, after
 * the batch, with the queue's flush lock held). */
static void
write_row(void *opaque, json_object *row)
{
  link_t *l = opaque;
  json_object *output = NULL, *usage = NULL;
  json_object_object_get_ex(row, "output", &output);
  json_object_object_get_ex(row, "usage", &usage);
  eph_error_t err = {0};
  if (eph_store_run_update(l->store, eph_run_id(l->run), eph_json_get_string(row, "status"), output,
                           usage, &err) < 0) {
    eph_warn("run %s: storing state: %s", eph_run_id(l->run), err.message);
    eph_run_storage_failed(l->run, err.message);
  }
}

static void
on_update(void *opaque, eph_run_t *run)
{
  link_t *l = opaque;
  /* A running run's progress (a model call's money) waits for the next batch of its events
   * (evqueue.h): the agent loop does not wait for two commits per model call. A change of
   * status is written now, after what is queued. The row is taken here, after the events it
   * reflects were pushed, not when the commit writes it (evqueue.h). */
  json_object *row = row_of(run);
  const char *status = eph_json_get_string(row, "status");
  bool running = status && strcmp(status, "running") == 0;
  if (!running || !atomic_load(&l->running_written) || !eph_evq_defer_row(l->events, row)) {
    atomic_store(&l->running_written, running);
    eph_evq_flush_row(l->events, row);
  }
  if (l->next.on_update)
    l->next.on_update(l->next.opaque, run);
}

int
eph_runstore_attach(eph_store_t *store, eph_run_t *run, const eph_run_observer_t *next,
                    eph_error_t *err)
{
  cleanup_json json_object *obj = eph_run_to_json(run, false);
  json_object *request = NULL;
  json_object_object_get_ex(obj, "request", &request);
  /* The run's own creation time, not the insert's (later by the reservation): the stored
   * row, which other nodes and the list read, says the created_at the 201 said. */
  int r = eph_store_run_insert(store, eph_run_id(run), eph_run_org(run), "queued",
                               eph_run_created_us(run), request, eph_run_zdr(run), err);
  if (r < 0) {
    /* The budget is reserved and the run has no record: a storage failure of the run, so
     * its end keeps the owner lock file (abandon_owner_lock) and the next process's
     * recovery makes the record the settlement belongs to (complete_record). Dropping the
     * lock here left a settled reservation of no run. */
    eph_run_storage_failed(run, err->message);
    return r;
  }
  return eph_runstore_adopt(store, run, next, 0, err);
}

int
eph_runstore_adopt(eph_store_t *store, eph_run_t *run, const eph_run_observer_t *next,
                   int64_t seq_stored, eph_error_t *err)
{
  (void)err;
  link_t *l = eph_xcalloc(1, sizeof *l);
  l->run = run;
  l->store = store;
  l->events = eph_evq_new(store, run, eph_run_event_flush_ms(run));
  atomic_init(&l->running_written, false);
  eph_evq_set_row(l->events, write_row, l);
  if (next)
    l->next = *next;
  pthread_mutex_lock(&links_lock);
  l->older = links;
  links = l;
  pthread_mutex_unlock(&links_lock);
  eph_run_observer_t obs = {
      .on_event = on_event, .on_update = on_update, .on_sync = on_sync, .opaque = l};
  eph_run_set_observer_after(run, &obs, seq_stored);
  return 0;
}

void
eph_runstore_detach(eph_run_t *run)
{
  link_t *l = NULL;
  pthread_mutex_lock(&links_lock);
  for (link_t **p = &links; *p; p = &(*p)->older) {
    if ((*p)->run == run) {
      l = *p;
      *p = l->older;
      break;
    }
  }
  pthread_mutex_unlock(&links_lock);
  if (l) {
    eph_evq_free(l->events); /* its last events committed: outside the leaf lock */
    free(l);
  }
}

/* ------------------------------------------------------------------ recovery */

/* The note a run left in its lock file (see run.c's abandon_owner_lock), or NULL when it
 * left none (its process died). */
static json_object *
read_note(int fd)
{
  char buf[1024];
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0)
    return NULL;
  buf[n] = '\0';
  json_object *o = json_tokener_parse(buf);
  if (o && !json_object_is_type(o, json_type_object)) {
    json_object_put(o);
    o = NULL;
  }
  return o;
}

static const char *
end_source(const char *status)
{
  return strcmp(status, "succeeded") == 0          ? "Succeeded"
         : strcmp(status, "timed_out") == 0        ? "Timed out"
         : strcmp(status, "budget_exhausted") == 0 ? "Budget exhausted"
         : strcmp(status, "cancelled") == 0        ? "Cancelled"
                                                   : "Failed";
}

/* Completes the record of run_id in the store from the ledger's totals: the ended event
 * (from the note, else failed/host_lost) and the settled event when missing, then the
 * row's status, reason and money. Idempotent: a second pass finds both events and writes
 * the same row. 0, or negative when the store failed (the caller keeps the lock file). */
static int
complete_record(eph_store_t *store, const char *run_id, json_object *note,
                const eph_ledger_totals_t *t, bool have_totals, eph_error_t *err)
{
  cleanup_json json_object *row = NULL, *events = NULL;
  int r = eph_store_run_get(store, run_id, NULL, &row, err);
  const char *org = eph_json_get_string(note, "org");
  if (r == -ENOENT && have_totals && org && *org) {
    /* Its process reserved the budget and died before it stored the record (or the insert
     * failed): the record is made now from the owner note (org, queued at), so the ledger's
     * settlement has the run it belongs to, as a node lost that way gets (settle_orphan). */
    json_object *v = NULL;
    int64_t now_us = eph_wall_us();
    int64_t created_us = json_object_object_get_ex(note, "created_at_us", &v) &&
                                 json_object_is_type(v, json_type_int)
                             ? json_object_get_int64(v)
                             : now_us;
    if (created_us <= 0 || created_us > now_us)
      created_us = now_us; /* not a time this run can have been queued at */
    r = eph_store_run_insert(store, run_id, org, "queued", created_us, NULL, false, err);
    if (r < 0 && r != -EEXIST)
      return r;
    r = eph_store_run_get(store, run_id, NULL, &row, err);
  }
  if (r == -ENOENT)
    return 0; /* no record, no reservation (or a note without its org): nothing to record */
  if (r < 0 || (r = eph_store_events_since(store, run_id, -1, 0, &events, err)) < 0)
    return r;
  int64_t next_seq = 1;
  json_object *ended = NULL, *settled = NULL;
  for (size_t i = 0; i < json_object_array_length(events); i++) {
    json_object *e = json_object_array_get_idx(events, i), *v = NULL;
    int64_t seq = json_object_object_get_ex(e, "seq", &v) ? json_object_get_int64(v) : 0;
    if (seq >= next_seq)
      next_seq = seq + 1;
    const char *kind = json_object_object_get_ex(e, "kind", &v) ? json_object_get_string(v) : "";
    if (strcmp(kind, "ended") == 0)
      ended = e;
    else if (strcmp(kind, "settled") == 0)
      settled = e;
  }
  json_object *v = NULL;
  int64_t created_us =
      json_object_object_get_ex(row, "created_at_us", &v) ? json_object_get_int64(v) : 0;
  int64_t t_ms = created_us > 0 ? (eph_wall_us() - created_us) / 1000 : 0;

  /* How the run ended: its stored ended event if it got that far, else its note, else
   * its process died with it (host_lost). */
  const char *status = eph_json_get_string(note, "status");
  const char *reason = eph_json_get_string(note, "reason");
  const char *error = eph_json_get_string(note, "error");
  if (!status || strcmp(status, "queued") == 0 || strcmp(status, "running") == 0)
    status = "failed";
  if (!reason)
    reason = "host_lost";
  json_object *ed = NULL;
  if (ended && json_object_object_get_ex(ended, "data", &ed)) {
    const char *s = eph_json_get_string(ed, "status"), *why = eph_json_get_string(ed, "reason");
    if (s)
      status = s;
    if (why)
      reason = why;
    error = eph_json_get_string(ed, "error");
  }
  if (!ended) {
    json_object *d = json_object_new_object();
    json_object_object_add(d, "status", json_object_new_string(status));
    json_object_object_add(d, "reason", json_object_new_string(reason));
    if (error)
      json_object_object_add(d, "error", json_object_new_string(error));
    json_object_object_add(d, "recovered", json_object_new_boolean(1));
    cleanup_free char *text =
        strcmp(reason, "host_lost") == 0
            ? eph_xstrdup("host_lost · the process running this run died; recovered")
            : eph_xasprintf("%s%s%s · recovered", reason, error ? " · " : "", error ? error : "");
    r = eph_store_event_append(store, run_id, next_seq++, t_ms, end_source(status), "ended", text,
                               d, err);
    json_object_put(d);
    if (r < 0)
      return r;
  }
  if (!settled && have_totals) {
    json_object *d = json_object_new_object();
    eph_run_json_money(d, t);
    json_object_object_add(d, "recovered", json_object_new_boolean(1));
    char text[64];
    eph_format_settled(t->billed_micros, t->released_micros, text, sizeof text);
    r = eph_store_event_append(store, run_id, next_seq++, t_ms, "Worker destroyed", "settled", text,
                               d, err);
    json_object_put(d);
    if (r < 0)
      return r;
  }
  /* The row: status and reason of the end, the ledger's money to the micro. */
  json_object *usage = NULL;
  json_object_object_get_ex(row, "usage", &usage);
  cleanup_json json_object *u = usage && json_object_is_type(usage, json_type_object)
                                    ? json_object_get(usage)
                                    : json_object_new_object();
  json_object_object_add(u, "reason", json_object_new_string(reason));
  if (error)
    json_object_object_add(u, "error", json_object_new_string(error));
  if (have_totals)
    eph_run_json_money(u, t);
  return eph_store_run_update(store, run_id, status, NULL, u, err);
}

int
eph_runstore_settle_lost(eph_ctx_t *ctx, eph_store_t *store, const char *run_id,
                         eph_ledger_totals_t *totals, eph_error_t *err)
{
  return eph_runstore_settle_as(ctx, store, run_id, "failed", "host_lost", totals, err);
}

/* The ledger that settles a run from outside it (the first loaded), or NULL with err set. */
static const eph_plugin_slot_t *
settling_ledger(eph_ctx_t *ctx, const char *run_id, eph_error_t *err)
{
  const eph_plugin_slot_t *ledger = eph_plugins_first(&ctx->plugins, EPH_KIND_LEDGER);
  if (!ledger)
    eph_error_set(err, EPH_E_CONFIG, "run %s: no ledger plugin to settle it", run_id);
  return ledger;
}

/* Settles run_id in ledger, then completes its record as note says (status, reason,
 * error); *totals (may be NULL) gets the ledger's totals. A run the ledger holds no
 * reservation of is completed without them. */
static int
settle_and_complete(const eph_plugin_slot_t *ledger, eph_store_t *store, const char *run_id,
                    json_object *note, eph_ledger_totals_t *totals, eph_error_t *err)
{
  const eph_ledger_ops_t *ops = ledger->desc->ops;
  eph_ledger_totals_t t = {0};
  eph_error_t e = {0};
  int r = EPH_WITH_PLUGIN(ledger, ops->settle(ledger->state, run_id, &t, &e));
  if (r < 0 && e.code != ENOENT) {
    *err = e;
    return r;
  }
  if ((r = complete_record(store, run_id, note, &t, r >= 0, err)) < 0)
    return r;
  if (totals)
    *totals = t;
  return 0;
}

int
eph_runstore_settle_as(eph_ctx_t *ctx, eph_store_t *store, const char *run_id, const char *status,
                       const char *reason, eph_ledger_totals_t *totals, eph_error_t *err)
{
  const eph_plugin_slot_t *ledger = settling_ledger(ctx, run_id, err);
  if (!ledger)
    return -err->code;
  cleanup_json json_object *note = json_object_new_object();
  json_object_object_add(note, "status", json_object_new_string(status));
  json_object_object_add(note, "reason", json_object_new_string(reason));
  return settle_and_complete(ledger, store, run_id, note, totals, err);
}

int
eph_runstore_settle_orphan(eph_ctx_t *ctx, eph_store_t *store, const char *run_id, const char *org,
                           int64_t reserved_unix_us, const char *reserved_by,
                           eph_ledger_totals_t *totals, eph_error_t *err)
{
  const eph_plugin_slot_t *ledger = settling_ledger(ctx, run_id, err);
  if (!ledger)
    return -err->code;
  /* The request was never stored: the row has none (an empty object). */
  int r = eph_store_run_insert(store, run_id, org, "queued", reserved_unix_us, NULL, false, err);
  if (r == -EEXIST)
    return 0;
  if (r < 0)
    return r;
  cleanup_free char *why = eph_xasprintf(
      "node '%s' reserved this run's budget and was lost before it recorded the run; the "
      "reservation was released",
      reserved_by && *reserved_by ? reserved_by : "(unknown)");
  cleanup_json json_object *note = json_object_new_object();
  json_object_object_add(note, "status", json_object_new_string("failed"));
  json_object_object_add(note, "reason", json_object_new_string("host_lost"));
  json_object_object_add(note, "error", json_object_new_string(why));
  if ((r = settle_and_complete(ledger, store, run_id, note, totals, err)) < 0)
    return r;
  return 1;
}

/* The ledger's open reservations, read once per recovery pass (one scan, not one per lock
 * file: a pass over many stale lock files with many open reservations was lock files x
 * reservations), sorted by run id: who each is for and when it was made, which a
 * recovered record takes over the owner note's words (the ledger holds the money; a note
 * is a file in the state directory, and may be unreadable or wrong). */
typedef struct {
  char *run_id, *org;
  int64_t reserved_us;
} open_res_t;

typedef struct {
  open_res_t *v;
  size_t n, cap;
  bool read; /* scanned (or the ledger cannot list: then empty) */
} open_table_t;

static void
open_table_add(void *ctx, const eph_ledger_open_t *r)
{
  open_table_t *t = ctx;
  if (!r->run_id || !r->org)
    return;
  if (t->n == t->cap) {
    t->cap = t->cap ? 2 * t->cap : 64;
    t->v = eph_xrealloc(t->v, t->cap * sizeof *t->v);
  }
  t->v[t->n++] = (open_res_t){eph_xstrdup(r->run_id), eph_xstrdup(r->org), r->reserved_unix_us};
}

static int
open_res_cmp(const void *a, const void *b)
{
  return strcmp(((const open_res_t *)a)->run_id, ((const open_res_t *)b)->run_id);
}

static void
open_table_clear(open_table_t *t)
{
  for (size_t i = 0; i < t->n; i++) {
    free(t->v[i].run_id);
    free(t->v[i].org);
  }
  free(t->v);
  *t = (open_table_t){0};
}

static const open_res_t *
open_table_find(const eph_plugin_slot_t *ledger, open_table_t *t, const char *run_id)
{
  const eph_ledger_ops_t *ops = ledger->desc->ops;
  if (!t->read) {
    t->read = true;
    eph_error_t e = {0};
    if (EPH_OPS_HAS(ops, eph_ledger_ops_t, open_reservations) &&
        EPH_WITH_PLUGIN(
            ledger, ops->open_reservations(ledger->state, 0, INT32_MAX, open_table_add, t, &e)) < 0)
      eph_warn("listing the ledger's open reservations: %s (lock files' notes are used)",
               e.message);
    if (t->n)
      qsort(t->v, t->n, sizeof *t->v, open_res_cmp);
  }
  open_res_t key = {.run_id = (char *)run_id};
  return t->n ? bsearch(&key, t->v, t->n, sizeof *t->v, open_res_cmp) : NULL;
}

/* Rewrites note's org and created_at_us from the ledger's open reservation when the
 * ledger can list them (open_reservations is optional: else the note's are kept), and
 * drops a status that is no run's end (the record then says failed). note may be NULL (a
 * file of no JSON): a new one is returned when the ledger knows the run. What the ledger
 * said is written back into the lock file (fd, held) before the settle: a pass that
 * settles and then cannot record leaves the next pass, which finds the reservation no
 * longer open, the ledger's words rather than the note's. */
static json_object *
note_from_ledger(const eph_plugin_slot_t *ledger, open_table_t *t, int fd, const char *run_id,
                 json_object *note)
{
  static const char *const ends[] = {"succeeded", "failed", "cancelled", "timed_out",
                                     "budget_exhausted"};
  const char *status = note ? eph_json_get_string(note, "status") : NULL;
  bool known = false;
  for (size_t i = 0; status && i < sizeof ends / sizeof *ends; i++)
    known |= strcmp(status, ends[i]) == 0;
  if (note && status && !known) {
    eph_warn("run %s: its lock file says status '%.32s', no run's end: recorded as failed", run_id,
             status);
    json_object_object_del(note, "status");
    json_object_object_del(note, "reason");
  }
  const open_res_t *w = open_table_find(ledger, t, run_id);
  if (!w)
    return note;
  if (!note)
    note = json_object_new_object();
  const char *said = eph_json_get_string(note, "org");
  if (said && strcmp(said, w->org) != 0)
    eph_warn("run %s: its lock file names organisation '%.64s', the ledger '%s': the ledger's",
             run_id, said, w->org);
  json_object_object_add(note, "org", json_object_new_string(w->org));
  if (w->reserved_us > 0)
    json_object_object_add(note, "created_at_us", json_object_new_int64(w->reserved_us));
  const char *text = json_object_to_json_string_ext(note, JSON_C_TO_STRING_PLAIN);
  size_t len = strlen(text);
  if (len < 1024 && (pwrite(fd, text, len, 0) != (ssize_t)len || ftruncate(fd, (off_t)len) < 0))
    eph_warn("run %s: rewriting its lock file's note: %s", run_id, strerror(errno));
  return note;
}

/* Who left an owner lock file, by its note: the run itself wrote how it ended (its storage
 * failed), or only the note of its start is there (its process died). */
static const char *
left_by(json_object *note)
{
  return eph_json_get_string(note, "status") ? "a run whose storage failed" : "a process that died";
}

int
eph_runstore_recover(eph_ctx_t *ctx, eph_store_t *store, bool quiet, int *pending)
{
  if (pending)
    *pending = 0;
  const eph_plugin_slot_t *ledger = eph_plugins_first(&ctx->plugins, EPH_KIND_LEDGER);
  cleanup_free char *dir = eph_xasprintf("%s/runs", ctx->state_dir);
  DIR *d = opendir(dir);
  if (!d)
    return 0;
  eph_store_t *own = NULL;
  int recovered = 0, left = 0;
  open_table_t opened = {0}; /* the ledger's open reservations, read at the first lock file */
  struct dirent *de;
  while ((de = readdir(d))) {
    size_t n = strlen(de->d_name);
    if (strncmp(de->d_name, ".claim-", 7) == 0) {
      /* The admission mark of an Idempotency-Key left by a daemon that died admitting
       * (server_runs.c): unlocked, it says nothing any more. */
      cleanup_free char *path = eph_xasprintf("%s/%s", dir, de->d_name);
      cleanup_close int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
      if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0)
        unlink(path);
      continue;
    }
    if (n < 6 || strcmp(de->d_name + n - 5, ".lock") != 0 || strncmp(de->d_name, "run_", 4))
      continue;
    cleanup_free char *path = eph_xasprintf("%s/%s", dir, de->d_name);
    cleanup_close int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno != ENOENT) {
      /* Not a lock file of ours (a symlink, a directory: no run makes one) or unreadable:
       * said, not skipped in silence, since its run's reservation stays open meanwhile. */
      eph_log(quiet ? EPH_LOG_DEBUG : EPH_LOG_WARN,
              "%s: %s: not a run's lock file; its reservation is left open (remove it)", path,
              strerror(errno));
      left++;
      continue;
    }
    if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) < 0)
      continue; /* its run is alive (in this process or another) */
    /* The owner may have settled, unlinked and closed between our open and our lock:
     * then the file we hold is no longer the one at `path`, and there is nothing to do. */
    struct stat a, b;
    if (fstat(fd, &a) < 0 || stat(path, &b) < 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev)
      continue;
    if (!ledger) {
      left++;
      continue;
    }
    cleanup_free char *run_id = eph_xstrndup(de->d_name, n - 5);
    cleanup_json json_object *note = note_from_ledger(ledger, &opened, fd, run_id, read_note(fd));
    const eph_ledger_ops_t *ops = ledger->desc->ops;
    eph_error_t e = {0};
    eph_ledger_totals_t totals = {0};
    int r = EPH_WITH_PLUGIN(ledger, ops->settle(ledger->state, run_id, &totals, &e));
    if (r < 0 && e.code != ENOENT) {
      eph_log(quiet ? EPH_LOG_DEBUG : EPH_LOG_WARN, "run %s: settling (left by %s): %s", run_id,
              left_by(note), e.message);
      left++;
      continue; /* the lock file stays: the next pass tries again */
    }
    bool have_totals = r == 0;
    if (have_totals)
      eph_info("run %s: settled (left by %s): %" PRId64 " billed, %" PRId64 " released", run_id,
               left_by(note), totals.billed_micros, totals.released_micros);
    eph_store_t *st = store;
    if (!st) {
      if (!own) {
        if (eph_store_open_ctx(ctx, NULL, false, &own, &e) < 0) {
          eph_log(quiet ? EPH_LOG_DEBUG : EPH_LOG_WARN, "run %s: %s", run_id, e.message);
          own = NULL;
        }
      }
      st = own;
    }
    if (!st || complete_record(st, run_id, note, &totals, have_totals, &e) < 0) {
      if (st && e.code == ESTALE) {
        /* A cluster node lost this run to another node (its lease expired: a stall, a
         * restart slower than lease_seconds), which ended, settled and recorded it: the
         * record is that node's, and nothing is left to do here. */
        eph_info("%s; nothing left to record here", e.message);
        unlink(path);
        recovered++;
        continue;
      }
      if (st)
        eph_log(quiet ? EPH_LOG_DEBUG : EPH_LOG_WARN, "run %s: recording its end: %s", run_id,
                e.message);
      left++;
      continue; /* money settled (idempotent); the record is completed on the next pass */
    }
    unlink(path);
    recovered++;
  }
  closedir(d);
  open_table_clear(&opened);
  if (own)
    eph_store_close(own);
  if (pending)
    *pending = left;
  return recovered;
}
