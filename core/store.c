/* The store's interface: argument checks, the parts both implementations share (key
 * generation, ZDR filtering of requests, list cursors, faults), and dispatch to
 * core/store_sqlite.c or core/store_pg.c. See store.h for the contract. */
#include "config.h"

#include "store.h"

#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "store_int.h"
#include "support/org_name.h"
#include "util.h"

#define MAX_ID_BYTES EPH_STORE_MAX_ID_BYTES
#define KEY_PREFIX EPH_STORE_KEY_PREFIX
#define KEY_RANDOM_BYTES EPH_STORE_KEY_RANDOM_BYTES

/* ---------------------------------------------------------------- checks */

static int
check_text(const char *what, const char *v, size_t max, eph_error_t *err)
{
  if (!v || !*v)
    return eph_error_set(err, EINVAL, "%s: empty", what);
  if (strlen(v) > max)
    return eph_error_set(err, EINVAL, "%s: longer than %zu bytes", what, max);
  return 0;
}

int
eph_sha256_hex(const void *data, size_t bytes, char out[65], eph_error_t *err)
{
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  int r = eph_crypto_load(err);
  if (r < 0)
    return r;
  if (EVP_Digest(data, bytes, md, &n, EVP_sha256(), NULL) != 1 || n != 32)
    return eph_error_set(err, EIO, "SHA-256: OpenSSL EVP_Digest failed");
  for (unsigned i = 0; i < n; i++)
    snprintf(out + 2 * i, 3, "%02x", md[i]);
  return 0;
}

/* ---------------------------------------------------------------- open / close */

bool
eph_store_target_is_pg(const char *target)
{
  if (!target)
    return false;
  if (strncmp(target, "postgresql://", 13) == 0 || strncmp(target, "postgres://", 11) == 0)
    return true;
  /* libpq's key=value form: a path has no '=' before its first '/'. */
  const char *eq = strchr(target, '='), *slash = strchr(target, '/');
  return eq && (!slash || eq < slash) &&
         (strstr(target, "host=") || strstr(target, "dbname=") || strstr(target, "service="));
}

int
eph_store_open(const char *path, const eph_store_options_t *opt, eph_store_t **out,
               eph_error_t *err)
{
  int idem_hours = opt && opt->idempotency_hours ? opt->idempotency_hours : 24;
  int busy_ms = opt && opt->busy_timeout_ms ? opt->busy_timeout_ms : 5000;
  if (!path || !*path)
    return eph_error_set(err, EINVAL, "store: no path");
  if (idem_hours < 24)
    return eph_error_set(err, EINVAL,
                         "store: idempotency_hours %d is below 24: clients retry for a day",
                         idem_hours);
  if (busy_ms < 0)
    return eph_error_set(err, EINVAL, "store: busy_timeout_ms %d is negative", busy_ms);
  /* Either store's key and idempotency code calls libcrypto through its table. */
  int r = eph_crypto_load(err);
  if (r < 0)
    return eph_error_wrap(err, "store");
  eph_store_options_t o = {.idempotency_hours = idem_hours,
                           .busy_timeout_ms = busy_ms,
                           .local_path = opt ? opt->local_path : NULL,
                           .node_name = opt ? opt->node_name : NULL,
                           .lease_seconds = opt ? opt->lease_seconds : 0,
                           .check_whole = opt && opt->check_whole};
  if (eph_store_target_is_pg(path)) {
#ifdef HAVE_LIBPQ
    return eph_store_pg_open(path, &o, out, err);
#else
    return eph_error_set(err, EPH_E_CONFIG,
                         "database: a PostgreSQL database was configured but this build has no "
                         "libpq (install libpq-dev and rebuild)");
#endif
  }
  return eph_store_sqlite_open(path, &o, out, err);
}

void
eph_store_close(eph_store_t *s)
{
  if (s)
    s->ops->close(s);
}

/* ---------------------------------------------------------------- organisations */

int
eph_store_org_create(eph_store_t *s, const char *org, eph_error_t *err)
{
  int r = eph_org_name_check(org, err);
  return r < 0 ? r : s->ops->org_create(s, org, err);
}

int
eph_store_member_add(eph_store_t *s, const char *org, const char *member, const char *role,
                     eph_error_t *err)
{
  int r = eph_org_name_check(org, err);
  if (r < 0 || (r = check_text("member", member, 256, err)) < 0)
    return r;
  if (!role || (strcmp(role, "owner") && strcmp(role, "admin") && strcmp(role, "member")))
    return eph_error_set(err, EINVAL, "member role '%s': expected owner, admin or member",
                         role ? role : "(null)");
  return s->ops->member_add(s, org, member, role, err);
}

/* ---------------------------------------------------------------- API keys */

static int
key_hash(const char *key, unsigned char md[32], eph_error_t *err)
{
  unsigned int n = 0;
  int r = eph_crypto_load(err);
  if (r < 0)
    return r;
  if (EVP_Digest(key, strlen(key), md, &n, EVP_sha256(), NULL) != 1 || n != 32)
    return eph_error_set(err, EIO, "SHA-256: OpenSSL EVP_Digest failed");
  return 0;
}

int
eph_store_key_create(eph_store_t *s, const char *org, const char *name, char **key_out,
                     char **key_id_out, eph_error_t *err)
{
  int r = eph_org_name_check(org, err);
  if (r < 0 || (r = check_text("key name", name, 128, err)) < 0)
    return r;
  char key[sizeof KEY_PREFIX + 2 * KEY_RANDOM_BYTES], id[4 + 16 + 1];
  memcpy(key, KEY_PREFIX, sizeof KEY_PREFIX - 1);
  memcpy(id, "key_", 4);
  if ((r = eph_random_hex(key + sizeof KEY_PREFIX - 1, KEY_RANDOM_BYTES)) < 0 ||
      (r = eph_random_hex(id + 4, 8)) < 0)
    return eph_error_set(err, -r, "generating an API key: %s", strerror(-r));
  unsigned char md[32];
  if ((r = key_hash(key, md, err)) >= 0)
    r = s->ops->key_insert(s, org, name, id, md, err);
  if (r >= 0) {
    *key_out = eph_xstrdup(key);
    if (key_id_out)
      *key_id_out = eph_xstrdup(id);
  }
  OPENSSL_cleanse(key, sizeof key);
  return r;
}

static bool
key_well_formed(const char *key)
{
  size_t p = sizeof KEY_PREFIX - 1;
  return key && strncmp(key, KEY_PREFIX, p) == 0 && strlen(key) == p + 2 * KEY_RANDOM_BYTES &&
         strspn(key + p, "0123456789abcdef") == 2 * KEY_RANDOM_BYTES;
}

int
eph_store_key_verify(eph_store_t *s, const char *key, char **org_out, char **key_id_out,
                     eph_error_t *err)
{
  if (!key_well_formed(key))
    return eph_error_set(err, EACCES, "invalid API key");
  unsigned char md[32];
  int r = key_hash(key, md, err);
  if (r < 0)
    return r;
  cleanup_free char *org = NULL, *id = NULL;
  if ((r = s->ops->key_lookup(s, md, &id, &org, err)) < 0)
    return r;
  if (org_out)
    *org_out = steal_pointer(&org);
  if (key_id_out)
    *key_id_out = steal_pointer(&id);
  return 0;
}

int
eph_store_key_revoke(eph_store_t *s, const char *key_id_or_name, const char *org, eph_error_t *err)
{
  int r = eph_org_name_check(org, err);
  if (r < 0 || (r = check_text("key", key_id_or_name, 128, err)) < 0)
    return r;
  return s->ops->key_revoke(s, key_id_or_name, org, err);
}

int
eph_store_key_list(eph_store_t *s, const char *org, json_object **out, eph_error_t *err)
{
  int r = eph_org_name_check(org, err);
  return r < 0 ? r : s->ops->key_list(s, org, out, err);
}

/* ---------------------------------------------------------------- runs */

/* The request as stored under zero data retention: booleans, numbers and null (the
 * permission table, budget, timeout), "model" and "connections" (names and methods); every
 * other string, object or array (prompt, inline files) is content and is dropped. */
static json_object *
request_without_content(json_object *request)
{
  json_object *out = json_object_new_object();
  json_object_object_foreach(request, k, v) {
    json_type t = json_object_get_type(v);
    if (t == json_type_boolean || t == json_type_int || t == json_type_double ||
        t == json_type_null || strcmp(k, "model") == 0 || strcmp(k, "connections") == 0)
      json_object_object_add(out, k, json_object_get(v));
  }
  return out;
}

int
eph_store_run_insert(eph_store_t *s, const char *id, const char *org, const char *status,
                     int64_t created_at_us, json_object *request, bool zdr, eph_error_t *err)
{
  int r = check_text("run id", id, MAX_ID_BYTES, err);
  if (r < 0 || (r = eph_org_name_check(org, err)) < 0 ||
      (r = check_text("status", status, 64, err)) < 0)
    return r;
  if (request && !json_object_is_type(request, json_type_object))
    return eph_error_set(err, EINVAL, "run %s: request is not a JSON object", id);
  cleanup_json json_object *stored = !request ? json_object_new_object()
                                     : zdr    ? request_without_content(request)
                                              : json_object_get(request);
  r = s->ops->run_insert(s, id, org, status, created_at_us, stored, zdr, err);
  if (r == -EEXIST)
    return eph_error_set(err, EEXIST, "run %s already exists", id);
  return r;
}

int
eph_store_run_update(eph_store_t *s, const char *id, const char *status, json_object *output,
                     json_object *usage, eph_error_t *err)
{
  int r = check_text("run id", id, MAX_ID_BYTES, err);
  return r < 0 ? r : s->ops->run_update(s, id, status, output, usage, err);
}

int
eph_store_run_get(eph_store_t *s, const char *id, const char *org, json_object **out,
                  eph_error_t *err)
{
  int r = check_text("run id", id, MAX_ID_BYTES, err);
  if (r < 0)
    return r;
  cleanup_json json_object *run = NULL;
  if ((r = s->ops->run_get(s, id, &run, err)) < 0)
    return r;
  if (run && org && strcmp(org, json_object_get_string(json_object_object_get(run, "org"))))
    json_object_put(steal_pointer(&run));
  if (!run)
    return eph_error_set(err, ENOENT, "run %s does not exist", id);
  *out = steal_pointer(&run);
  return 0;
}

char *
eph_store_cursor_encode(int64_t created_at_us, const char *id)
{
  cleanup_free char *plain = eph_xasprintf("%" PRId64 ":%s", created_at_us, id);
  size_t n = strlen(plain);
  char *out = eph_xmalloc(2 * n + 1);
  for (size_t i = 0; i < n; i++)
    snprintf(out + 2 * i, 3, "%02x", (unsigned char)plain[i]);
  return out;
}

static int
cursor_decode(const char *cursor, int64_t *created_at_us, char **id, eph_error_t *err)
{
  size_t n = strlen(cursor);
  if (n == 0 || n % 2 || n > 2 * (MAX_ID_BYTES + 24) || strspn(cursor, "0123456789abcdef") != n)
    return eph_error_set(err, EINVAL, "cursor: malformed");
  cleanup_free char *plain = eph_xmalloc(n / 2 + 1);
  for (size_t i = 0; i < n / 2; i++) {
    unsigned v;
    sscanf(cursor + 2 * i, "%2x", &v);
    plain[i] = (char)v;
  }
  plain[n / 2] = '\0';
  char *colon = strchr(plain, ':');
  if (!colon || colon == plain || !colon[1] || strlen(plain) != n / 2)
    return eph_error_set(err, EINVAL, "cursor: malformed");
  *colon = '\0';
  char *end = NULL;
  errno = 0;
  long long v = strtoll(plain, &end, 10);
  if (errno || *end)
    return eph_error_set(err, EINVAL, "cursor: malformed");
  *created_at_us = v;
  *id = eph_xstrdup(colon + 1);
  return 0;
}

int
eph_store_run_list(eph_store_t *s, const char *org, int limit, const char *cursor,
                   json_object **runs_out, char **next_cursor, eph_error_t *err)
{
  int r = eph_org_name_check(org, err);
  if (r < 0)
    return r;
  if (limit == 0)
    limit = 50;
  if (limit < 1 || limit > 1000)
    return eph_error_set(err, EINVAL, "limit %d: expected 1..1000", limit);
  int64_t after_us = 0;
  cleanup_free char *after_id = NULL;
  if (cursor && (r = cursor_decode(cursor, &after_us, &after_id, err)) < 0)
    return r;
  cleanup_json json_object *arr = NULL;
  /* One row more than asked tells whether another page exists. */
  if ((r = s->ops->run_list(s, org, limit, after_us, after_id, &arr, err)) < 0)
    return r;
  char *next = NULL;
  if (json_object_array_length(arr) > (size_t)limit) {
    json_object_array_del_idx(arr, (size_t)limit, json_object_array_length(arr) - limit);
    json_object *last = json_object_array_get_idx(arr, (size_t)limit - 1);
    next = eph_store_cursor_encode(
        json_object_get_int64(json_object_object_get(last, "created_at_us")),
        json_object_get_string(json_object_object_get(last, "id")));
  }
  *runs_out = steal_pointer(&arr);
  *next_cursor = next;
  return 0;
}

/* ---------------------------------------------------------------- events */

int
eph_store_event_append(eph_store_t *s, const char *run_id, int64_t seq, int64_t t_ms,
                       const char *source, const char *kind, const char *text, json_object *data,
                       eph_error_t *err)
{
  int r = check_text("run id", run_id, MAX_ID_BYTES, err);
  if (r < 0 || (r = check_text("event source", source, 64, err)) < 0 ||
      (r = check_text("event kind", kind, 64, err)) < 0)
    return r;
  if (seq < 0)
    return eph_error_set(err, EINVAL, "event seq %" PRId64 ": negative", seq);
  r = s->ops->event_append(s, run_id, seq, t_ms, source, kind, text ? text : "", data, err);
  if (r == -EEXIST)
    r = eph_error_set(err, EEXIST, "run %s already has event %" PRId64, run_id, seq);
  return r;
}

int
eph_store_events_append(eph_store_t *s, const char *run_id, const eph_store_event_t *evs, size_t n,
                        eph_error_t *err)
{
  int r = check_text("run id", run_id, MAX_ID_BYTES, err);
  if (r < 0)
    return r;
  if (!s->ops->events_append)
    return eph_error_set(err, ENOTSUP, "%s: events are stored one at a time", s->path);
  if (n == 0)
    return eph_error_set(err, EINVAL, "no events to append");
  for (size_t i = 0; i < n; i++) {
    if ((r = check_text("event source", evs[i].source, 64, err)) < 0 ||
        (r = check_text("event kind", evs[i].kind, 64, err)) < 0)
      return r;
    if (evs[i].seq < 0)
      return eph_error_set(err, EINVAL, "event seq %" PRId64 ": negative", evs[i].seq);
  }
  r = s->ops->events_append(s, run_id, evs, n, err);
  if (r == -EEXIST)
    r = eph_error_set(err, EEXIST, "run %s already has one of events %" PRId64 "..%" PRId64, run_id,
                      evs[0].seq, evs[n - 1].seq);
  return r;
}

bool
eph_store_groups_events(const eph_store_t *s)
{
  return s->ops->events_append != NULL;
}

int
eph_store_events_since(eph_store_t *s, const char *run_id, int64_t since_seq, int limit,
                       json_object **out, eph_error_t *err)
{
  int r = check_text("run id", run_id, MAX_ID_BYTES, err);
  if (r < 0)
    return r;
  if (limit < 0)
    return eph_error_set(err, EINVAL, "limit %d: negative", limit);
  return s->ops->events_since(s, run_id, since_seq, limit, out, err);
}

/* ---------------------------------------------------------------- idempotency */

int
eph_store_idem_claim(eph_store_t *s, const char *org, const char *key, const char *body_sha256_hex,
                     const char *new_run_id, char **existing_run_id, eph_error_t *err)
{
  int r = eph_org_name_check(org, err);
  if (r < 0 || (r = check_text("idempotency key", key, 255, err)) < 0 ||
      (r = check_text("run id", new_run_id, MAX_ID_BYTES, err)) < 0)
    return r;
  if (!body_sha256_hex || strlen(body_sha256_hex) != 64 ||
      strspn(body_sha256_hex, "0123456789abcdef") != 64)
    return eph_error_set(err, EINVAL, "body_sha256_hex: expected 64 lowercase hex digits");
  return s->ops->idem_claim(s, org, key, body_sha256_hex, new_run_id, eph_wall_us(),
                            existing_run_id, err);
}

int
eph_store_idem_release(eph_store_t *s, const char *org, const char *key, const char *run_id,
                       eph_error_t *err)
{
  int r = eph_org_name_check(org, err);
  if (r < 0 || (r = check_text("idempotency key", key, 255, err)) < 0 ||
      (r = check_text("run id", run_id, MAX_ID_BYTES, err)) < 0)
    return r;
  return s->ops->idem_release(s, org, key, run_id, err);
}

/* ---------------------------------------------------------------- cluster */

/* A cluster operation on a store without one (SQLite: one host). */
static int
no_cluster(const eph_store_t *s, eph_error_t *err)
{
  return eph_error_set(err, ENOTSUP, "%s: no cluster on this store", s->path);
}

int
eph_store_cancel_request(eph_store_t *s, const char *run_id, eph_error_t *err)
{
  int r = check_text("run id", run_id, MAX_ID_BYTES, err);
  if (r < 0)
    return r;
  if (!s->ops->cancel_request)
    return no_cluster(s, err);
  return s->ops->cancel_request(s, run_id, err);
}

int
eph_store_cancels_pending(eph_store_t *s, json_object **out, eph_error_t *err)
{
  if (!s->ops->cancels_pending)
    return no_cluster(s, err);
  return s->ops->cancels_pending(s, out, err);
}

int
eph_store_leases_renew(eph_store_t *s, json_object *ids, eph_error_t *err)
{
  if (!json_object_is_type(ids, json_type_array))
    return eph_error_set(err, EINVAL, "lease renewal: ids is not an array");
  if (!s->ops->leases_renew)
    return no_cluster(s, err);
  return s->ops->leases_renew(s, ids, err);
}

int
eph_store_cluster_ledger(eph_store_t *s, const char *identity, const char *plugin, const char *node,
                         json_object **out, eph_error_t *err)
{
  *out = NULL;
  if (!s->ops->cluster_ledger)
    return no_cluster(s, err);
  int r = 0;
  if (identity && ((r = check_text("ledger identity", identity, MAX_ID_BYTES, err)) < 0 ||
                   (r = check_text("ledger plugin", plugin, MAX_ID_BYTES, err)) < 0 ||
                   (r = check_text("node", node, MAX_ID_BYTES, err)) < 0))
    return r;
  return s->ops->cluster_ledger(s, identity, plugin, node, out, err);
}

int
eph_store_leases_take_expired(eph_store_t *s, json_object **out, eph_error_t *err)
{
  if (!s->ops->leases_take_expired)
    return no_cluster(s, err);
  return s->ops->leases_take_expired(s, out, err);
}

int
eph_store_run_take_ended(eph_store_t *s, const char *run_id, eph_error_t *err)
{
  int r = check_text("run id", run_id, MAX_ID_BYTES, err);
  if (r < 0)
    return r;
  if (!s->ops->run_take_ended)
    return eph_error_set(err, ENOTSUP, "%s: no cluster on this store", s->path);
  return s->ops->run_take_ended(s, run_id, err);
}

int
eph_store_queue_push(eph_store_t *s, const char *run_id, int64_t reserved_micros, bool local_only,
                     int max_queued, eph_error_t *err)
{
  int r = check_text("run id", run_id, MAX_ID_BYTES, err);
  if (r < 0)
    return r;
  if (reserved_micros < 0 || max_queued < 0)
    return eph_error_set(err, EINVAL, "queueing run %s: negative reservation or bound", run_id);
  if (!s->ops->queue_push)
    return no_cluster(s, err);
  return s->ops->queue_push(s, run_id, reserved_micros, local_only, max_queued, err);
}

int
eph_store_queue_claim(eph_store_t *s, json_object **out, eph_error_t *err)
{
  *out = NULL;
  if (!s->ops->queue_claim)
    return no_cluster(s, err);
  return s->ops->queue_claim(s, out, err);
}

int
eph_store_queue_remove(eph_store_t *s, const char *run_id, eph_error_t *err)
{
  int r = check_text("run id", run_id, MAX_ID_BYTES, err);
  if (r < 0)
    return r;
  if (!s->ops->queue_remove)
    return no_cluster(s, err);
  return s->ops->queue_remove(s, run_id, err);
}

int
eph_store_queue_length(eph_store_t *s, int64_t *n, eph_error_t *err)
{
  *n = 0;
  if (!s->ops->queue_length)
    return no_cluster(s, err);
  return s->ops->queue_length(s, n, err);
}

int
eph_store_queue_take(eph_store_t *s, const char *run_id, json_object **out, eph_error_t *err)
{
  *out = NULL;
  int r = check_text("run id", run_id, MAX_ID_BYTES, err);
  if (r < 0)
    return r;
  if (!s->ops->queue_take)
    return no_cluster(s, err);
  return s->ops->queue_take(s, run_id, out, err);
}

int
eph_store_listen(eph_store_t *s,
                 void (*fn)(void *opaque, eph_store_note_t note, const char *run_id), void *opaque,
                 eph_store_listener_t **out, eph_error_t *err)
{
  *out = NULL;
  if (!fn)
    return eph_error_set(err, EINVAL, "listening: no function to call");
  if (!s->ops->listen)
    return no_cluster(s, err);
  return s->ops->listen(s, fn, opaque, out, err);
}

bool
eph_store_listener_up(eph_store_listener_t *l)
{
  return l && l->up(l);
}

void
eph_store_listener_stop(eph_store_listener_t *l)
{
  if (l)
    l->stop(l);
}

/* ---------------------------------------------------------------- retention, health */

int
eph_store_purge(eph_store_t *s, int retention_days, eph_error_t *err)
{
  if (retention_days <= 0)
    return eph_error_set(err, EINVAL, "retention_days %d: expected > 0", retention_days);
  int64_t now = eph_wall_us();
  return s->ops->purge(s, now - (int64_t)retention_days * 86400 * 1000000, now - s->idempotency_us,
                       err);
}

int
eph_store_probe(eph_store_t *s, eph_error_t *err)
{
  return s->ops->probe(s, err);
}

bool
eph_store_fault(eph_store_t *s, char *buf, size_t size)
{
  pthread_mutex_lock(&s->fault_lock);
  const char *which = s->damaged[0] ? s->damaged : s->fault;
  bool failing = which[0] != '\0';
  if (failing && buf)
    snprintf(buf, size, "%s", which);
  pthread_mutex_unlock(&s->fault_lock);
  return failing;
}

const char *
eph_store_path(const eph_store_t *s)
{
  return s->path;
}

int
eph_store_schema_version(const eph_store_t *s)
{
  return s->schema_version;
}

eph_store_kind_t
eph_store_kind(const eph_store_t *s)
{
  return s->ops->kind;
}

int
eph_store_with_db(eph_store_t *s, int (*fn)(struct sqlite3 *db, void *opaque, eph_error_t *err),
                  void *opaque, eph_error_t *err)
{
  if (!s->ops->with_db)
    return eph_error_set(
        err, ENOTSUP, "%s: this store keeps no node-local tables (webhooks, admin audit)", s->path);
  return s->ops->with_db(s, fn, opaque, err);
}

int
eph_store_with_pg(eph_store_t *s, bool transaction,
                  int (*fn)(eph_store_t *store, void *opaque, eph_error_t *err), void *opaque,
                  eph_error_t *err)
{
  if (!s->ops->with_pg)
    return eph_error_set(err, ENOTSUP, "%s: not a PostgreSQL store", s->path);
  return s->ops->with_pg(s, transaction, fn, opaque, err);
}

#define PG_QUERY_MAX_PARAMS 16

int
eph_store_pg_query(eph_store_t *s, json_object **rows, int *changes, const char *what,
                   eph_error_t *err, const char *sql, const char *types, ...)
{
  size_t n = strlen(types);
  if (!s->ops->pg_query || n > PG_QUERY_MAX_PARAMS)
    return eph_error_set(err, s->ops->pg_query ? EINVAL : ENOTSUP,
                         "%s: %s: not a PostgreSQL store, or over %d parameters", s->path, what,
                         PG_QUERY_MAX_PARAMS);
  /* Integers as decimal text: the statements compare them with BIGINT columns. */
  char num[PG_QUERY_MAX_PARAMS][24];
  const char *vals[PG_QUERY_MAX_PARAMS];
  va_list ap;
  va_start(ap, types);
  for (size_t i = 0; i < n; i++) {
    if (types[i] == 't') {
      vals[i] = va_arg(ap, const char *);
      continue;
    }
    int64_t v = va_arg(ap, int64_t);
    snprintf(num[i], sizeof num[i], "%" PRId64, v);
    vals[i] = types[i] == 'n' && v <= 0 ? NULL : num[i];
  }
  va_end(ap);
  if (rows)
    *rows = NULL;
  if (changes)
    *changes = 0;
  return s->ops->pg_query(s, sql, (int)n, vals, rows, changes, what, err);
}
