/* Webhooks: registration, the delivery rows, the signed POST and its retries. See
 * webhook.h for the contract. */
#include "config.h"

#include "webhook.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <sqlite3.h>

#include "../plugins/tool-web/net.h"
#include "conf.h"
#include "log.h"
#include "util.h"

#define MAX_URL_BYTES 2048
#define MAX_BACKOFF_US (3600LL * 1000000) /* an hour between attempts at most */
#define IDLE_WAKE_US (60LL * 1000000)     /* re-read the table at least this often */
/* A run settled by this daemon is announced by its worker (finished()) right after the
 * row is written: the catch-up leaves it that long so the live payload is the one sent. */
#define CATCH_UP_GRACE_US (2LL * 1000000)
#define CATCH_UP_BATCH 64 /* runs per pass: a backlog drains over passes, the lock is short */

struct eph_webhooks {
  eph_store_t *store;
  eph_net_policy_t policy;
  int64_t retry_us;      /* give up this long after the run ended */
  int64_t base_delay_us; /* first retry after this; doubles per attempt */
  int64_t timeout_ms;    /* one attempt */
  int64_t retention_us;  /* finished deliveries older than this are purged (retention_days) */
  int64_t max_run_us;    /* max_timeout_seconds plus an hour: the longest a run lasts */
  int64_t next_purge_us;
  pthread_mutex_t mu;
  pthread_cond_t cond;
  bool stop, kicked, started;
  pthread_t thread;
};

/* ------------------------------------------------------------------ signature */

int
eph_webhook_sign(const char *secret, int64_t t, const char *body, size_t body_bytes, char *out,
                 size_t size)
{
  /* The signed message is "<t>.<body>": computed incrementally so the body is not copied. */
  char prefix[32];
  int n = snprintf(prefix, sizeof prefix, "%" PRId64 ".", t);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  EVP_MAC *m = EVP_MAC_fetch(NULL, "HMAC", NULL);
  EVP_MAC_CTX *ctx = m ? EVP_MAC_CTX_new(m) : NULL;
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", (char *)"SHA256", 0),
                         OSSL_PARAM_construct_end()};
  size_t len = 0;
  int ok = ctx && EVP_MAC_init(ctx, (const unsigned char *)secret, strlen(secret), params) &&
           EVP_MAC_update(ctx, (const unsigned char *)prefix, (size_t)n) &&
           EVP_MAC_update(ctx, (const unsigned char *)body, body_bytes) &&
           EVP_MAC_final(ctx, mac, &len, sizeof mac);
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(m);
  if (!ok)
    return -EIO;
  mac_len = (unsigned int)len;
  int w = snprintf(out, size, "t=%" PRId64 ",v1=", t);
  if (w < 0 || (size_t)w + 2 * mac_len + 1 > size)
    return -EIO;
  /* OpenSSL's hex (OPENSSL_buf2hexstr_ex) writes upper case with separators; the wire
   * format is Stripe's lowercase: one byte at a time. */
  for (unsigned i = 0; i < mac_len; i++)
    snprintf(out + w + 2 * i, 3, "%02x", mac[i]);
  return 0;
}

/* ------------------------------------------------------------------ store access */

static int
sql_error(sqlite3 *db, const char *what, eph_error_t *err)
{
  return eph_error_set(err, EIO, "webhooks: %s: %s", what, sqlite3_errmsg(db));
}

typedef struct {
  const char *org, *id, *url, *secret, *run_id, *body;
  int64_t now_us, next_us, limit;
  int64_t ended_us, since_us; /* db_enqueue, db_unannounced */
  long code;
  const char *error;
  const char *status;
  json_object *out;
  int changes;
  char *text, *default_id; /* heap results */
} sql_args_t;

static void
bind_opt_text(sqlite3_stmt *st, int i, const char *v)
{
  if (v)
    sqlite3_bind_text(st, i, v, -1, SQLITE_TRANSIENT);
  else
    sqlite3_bind_null(st, i);
}

static int
db_register(sqlite3 *db, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO webhooks(id, org, url, secret, created_at_us)"
                         " VALUES (?1, ?2, ?3, ?4, ?5)",
                         -1, &st, NULL) != SQLITE_OK)
    return sql_error(db, "registering", err);
  bind_opt_text(st, 1, a->id);
  bind_opt_text(st, 2, a->org);
  bind_opt_text(st, 3, a->url);
  bind_opt_text(st, 4, a->secret);
  sqlite3_bind_int64(st, 5, a->now_us);
  int r = sqlite3_step(st) == SQLITE_DONE ? 0 : sql_error(db, "registering", err);
  sqlite3_finalize(st);
  return r;
}

static int
db_list(sqlite3 *db, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db,
                         "SELECT id, url, created_at_us FROM webhooks"
                         " WHERE org = ?1 AND deleted_at_us IS NULL AND kind = 'endpoint'"
                         " ORDER BY created_at_us DESC, id DESC",
                         -1, &st, NULL) != SQLITE_OK)
    return sql_error(db, "listing", err);
  bind_opt_text(st, 1, a->org);
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    json_object *w = json_object_new_object();
    json_object_object_add(w, "id", json_object_new_string((const char *)sqlite3_column_text(st, 0)));
    json_object_object_add(w, "url", json_object_new_string((const char *)sqlite3_column_text(st, 1)));
    json_object_object_add(w, "created_at_us", json_object_new_int64(sqlite3_column_int64(st, 2)));
    json_object_array_add(a->out, w);
  }
  int r = rc == SQLITE_DONE ? 0 : sql_error(db, "listing", err);
  sqlite3_finalize(st);
  return r;
}

/* Runs statements in one transaction; each binds ?1 = org, ?2 = id, ?3 = now. */
static int
db_delete(sqlite3 *db, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  static const char *const sql[] = {
      "UPDATE webhooks SET deleted_at_us = ?3"
      " WHERE org = ?1 AND id = ?2 AND deleted_at_us IS NULL AND kind = 'endpoint'",
      "UPDATE webhook_deliveries SET status = 'failed', last_error = 'endpoint deleted',"
      " updated_at_us = ?3 WHERE org = ?1 AND webhook_id = ?2 AND status = 'pending'",
  };
  if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
    return sql_error(db, "deleting", err);
  int r = 0;
  for (size_t i = 0; r == 0 && i < sizeof sql / sizeof sql[0]; i++) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, sql[i], -1, &st, NULL) != SQLITE_OK) {
      r = sql_error(db, "deleting", err);
      break;
    }
    bind_opt_text(st, 1, a->org);
    bind_opt_text(st, 2, a->id);
    sqlite3_bind_int64(st, 3, a->now_us);
    if (sqlite3_step(st) != SQLITE_DONE)
      r = sql_error(db, "deleting", err);
    else if (i == 0 && sqlite3_changes(db) == 0)
      r = eph_error_set(err, ENOENT, "no webhook '%s'", a->id);
    sqlite3_finalize(st);
  }
  sqlite3_exec(db, r == 0 ? "COMMIT" : "ROLLBACK", NULL, NULL, NULL);
  return r;
}

static int
db_enqueue(sqlite3 *db, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  sqlite3_stmt *st = NULL;
  /* One row per live endpoint of the org that existed when the run ended (?5: a catch-up
   * must not announce an old run to an endpoint registered since); a second notice of the
   * same run adds none. */
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO webhook_deliveries(id, webhook_id, org, run_id, url, body,"
                         " status, next_attempt_us, created_at_us, updated_at_us)"
                         " SELECT 'whd_' || lower(hex(randomblob(12))), id, org, ?2, url, ?3,"
                         " 'pending', ?4, ?4, ?4 FROM webhooks"
                         " WHERE org = ?1 AND deleted_at_us IS NULL AND kind = 'endpoint'"
                         " AND created_at_us <= ?5"
                         " ON CONFLICT(webhook_id, run_id) DO NOTHING",
                         -1, &st, NULL) != SQLITE_OK)
    return sql_error(db, "queueing a delivery", err);
  bind_opt_text(st, 1, a->org);
  bind_opt_text(st, 2, a->run_id);
  bind_opt_text(st, 3, a->body);
  sqlite3_bind_int64(st, 4, a->now_us);
  sqlite3_bind_int64(st, 5, a->ended_us);
  int r = sqlite3_step(st) == SQLITE_DONE ? 0 : sql_error(db, "queueing a delivery", err);
  a->changes = sqlite3_changes(db);
  sqlite3_finalize(st);
  return r;
}

/* The org's default row (created with a->id and a->secret when missing); a->text gets its
 * secret (heap). */
static int
db_default(sqlite3 *db, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO webhooks(id, org, url, secret, created_at_us, kind)"
                         " VALUES (?1, ?2, '', ?3, ?4, 'default')"
                         " ON CONFLICT DO NOTHING",
                         -1, &st, NULL) != SQLITE_OK)
    return sql_error(db, "creating the default secret", err);
  bind_opt_text(st, 1, a->id);
  bind_opt_text(st, 2, a->org);
  bind_opt_text(st, 3, a->secret);
  sqlite3_bind_int64(st, 4, a->now_us);
  int r = sqlite3_step(st) == SQLITE_DONE ? 0 : sql_error(db, "creating the default secret", err);
  sqlite3_finalize(st);
  if (r < 0)
    return r;
  if (sqlite3_prepare_v2(db, "SELECT id, secret FROM webhooks WHERE org = ?1 AND kind = 'default'",
                         -1, &st, NULL) != SQLITE_OK)
    return sql_error(db, "reading the default secret", err);
  bind_opt_text(st, 1, a->org);
  if (sqlite3_step(st) == SQLITE_ROW) {
    a->default_id = eph_xstrdup((const char *)sqlite3_column_text(st, 0));
    a->text = eph_xstrdup((const char *)sqlite3_column_text(st, 1));
  } else {
    r = sql_error(db, "reading the default secret", err);
  }
  sqlite3_finalize(st);
  if (r < 0 || !a->run_id)
    return r;
  /* A request's own webhook_url: one delivery signed with the default secret. */
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO webhook_deliveries(id, webhook_id, org, run_id, url, body,"
                         " status, next_attempt_us, created_at_us, updated_at_us)"
                         " VALUES ('whd_' || lower(hex(randomblob(12))), ?1, ?2, ?3, ?4, ?5,"
                         " 'pending', ?6, ?6, ?6) ON CONFLICT(webhook_id, run_id) DO NOTHING",
                         -1, &st, NULL) != SQLITE_OK)
    return sql_error(db, "queueing the request's delivery", err);
  bind_opt_text(st, 1, a->default_id);
  bind_opt_text(st, 2, a->org);
  bind_opt_text(st, 3, a->run_id);
  bind_opt_text(st, 4, a->url);
  bind_opt_text(st, 5, a->body);
  sqlite3_bind_int64(st, 6, a->now_us);
  r = sqlite3_step(st) == SQLITE_DONE ? 0 : sql_error(db, "queueing the request's delivery", err);
  a->changes = sqlite3_changes(db);
  sqlite3_finalize(st);
  return r;
}

static json_object *
col_json(sqlite3_stmt *st, int i)
{
  switch (sqlite3_column_type(st, i)) {
  case SQLITE_NULL:
    return NULL;
  case SQLITE_INTEGER:
    return json_object_new_int64(sqlite3_column_int64(st, i));
  default:
    return json_object_new_string((const char *)sqlite3_column_text(st, i));
  }
}

static int
db_deliveries(sqlite3 *db, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  static const char *const cols[] = {"id", "webhook_id", "run_id", "url", "status", "attempts",
                                     "next_attempt_us", "last_status_code", "last_error",
                                     "created_at_us", "updated_at_us"};
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db,
                         "SELECT id, webhook_id, run_id, url, status, attempts, next_attempt_us,"
                         " last_status_code, last_error, created_at_us, updated_at_us"
                         " FROM webhook_deliveries WHERE org = ?1"
                         " ORDER BY created_at_us DESC, id DESC LIMIT ?2",
                         -1, &st, NULL) != SQLITE_OK)
    return sql_error(db, "listing deliveries", err);
  bind_opt_text(st, 1, a->org);
  sqlite3_bind_int64(st, 2, a->limit);
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    json_object *d = json_object_new_object();
    for (int i = 0; i < (int)(sizeof cols / sizeof cols[0]); i++)
      json_object_object_add(d, cols[i], col_json(st, i));
    json_object_array_add(a->out, d);
  }
  int r = rc == SQLITE_DONE ? 0 : sql_error(db, "listing deliveries", err);
  sqlite3_finalize(st);
  return r;
}

/* The next due delivery (a->now_us), or a->out stays NULL; a->next_us receives the
 * earliest future attempt time (0: none pending). */
static int
db_next_due(sqlite3 *db, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db,
                         "SELECT d.id, d.url, d.body, d.attempts, d.created_at_us, w.secret,"
                         " d.next_attempt_us FROM webhook_deliveries d"
                         " JOIN webhooks w ON w.id = d.webhook_id"
                         " WHERE d.status = 'pending' ORDER BY d.next_attempt_us LIMIT 1",
                         -1, &st, NULL) != SQLITE_OK)
    return sql_error(db, "reading due deliveries", err);
  int rc = sqlite3_step(st);
  int r = 0;
  a->next_us = 0;
  if (rc == SQLITE_ROW) {
    int64_t at = sqlite3_column_int64(st, 6);
    if (at <= a->now_us) {
      json_object *d = json_object_new_object();
      static const char *const cols[] = {"id", "url", "body", "attempts", "created_at_us",
                                         "secret"};
      for (int i = 0; i < 6; i++)
        json_object_object_add(d, cols[i], col_json(st, i));
      a->out = d;
    } else {
      a->next_us = at;
    }
  } else if (rc != SQLITE_DONE) {
    r = sql_error(db, "reading due deliveries", err);
  }
  sqlite3_finalize(st);
  return r;
}

/* Finished deliveries (delivered, failed) go with the history they describe. */
static int
db_purge(sqlite3 *db, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db,
                         "DELETE FROM webhook_deliveries"
                         " WHERE status != 'pending' AND updated_at_us < ?1",
                         -1, &st, NULL) != SQLITE_OK)
    return sql_error(db, "purging deliveries", err);
  sqlite3_bind_int64(st, 1, a->now_us);
  int r = sqlite3_step(st) == SQLITE_DONE ? 0 : sql_error(db, "purging deliveries", err);
  sqlite3_finalize(st);
  return r;
}

/* Settled runs that ended in [a->since_us, a->now_us] and still lack a delivery: for an
 * endpoint of their org that existed when they ended, or to their request's webhook_url.
 * a->out receives [[run id, ended_at_us], ...], at most a->limit. A run's row is last
 * written when it settles (its updated_at_us is the end); created_at_us is bounded too
 * (a->next_us) so the runs index, not the whole history, is read every second. */
static int
db_unannounced(sqlite3 *db, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(
          db,
          "SELECT r.id, r.updated_at_us FROM runs r"
          " WHERE r.created_at_us >= ?3 AND r.updated_at_us BETWEEN ?1 AND ?2"
          " AND r.status NOT IN ('queued', 'running')"
          " AND (EXISTS (SELECT 1 FROM webhooks w WHERE w.org = r.org AND w.kind = 'endpoint'"
          "              AND w.deleted_at_us IS NULL AND w.created_at_us <= r.updated_at_us"
          "              AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d"
          "                              WHERE d.webhook_id = w.id AND d.run_id = r.id))"
          "  OR (json_valid(r.request) AND json_extract(r.request, '$.webhook_url') IS NOT NULL"
          "      AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d"
          "                      JOIN webhooks w ON w.id = d.webhook_id"
          "                      WHERE d.run_id = r.id AND w.kind = 'default')))"
          " ORDER BY r.updated_at_us LIMIT ?4",
          -1, &st, NULL) != SQLITE_OK)
    return sql_error(db, "finding unannounced run ends", err);
  sqlite3_bind_int64(st, 1, a->since_us);
  sqlite3_bind_int64(st, 2, a->now_us);
  sqlite3_bind_int64(st, 3, a->next_us);
  sqlite3_bind_int64(st, 4, a->limit);
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    json_object *p = json_object_new_array();
    json_object_array_add(p, col_json(st, 0));
    json_object_array_add(p, col_json(st, 1));
    json_object_array_add(a->out, p);
  }
  int r = rc == SQLITE_DONE ? 0 : sql_error(db, "finding unannounced run ends", err);
  sqlite3_finalize(st);
  return r;
}

static int
db_record(sqlite3 *db, void *opaque, eph_error_t *err)
{
  sql_args_t *a = opaque;
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db,
                         "UPDATE webhook_deliveries SET status = ?2, attempts = attempts + 1,"
                         " next_attempt_us = ?3, last_status_code = ?4, last_error = ?5,"
                         " updated_at_us = ?6 WHERE id = ?1",
                         -1, &st, NULL) != SQLITE_OK)
    return sql_error(db, "recording an attempt", err);
  bind_opt_text(st, 1, a->id);
  bind_opt_text(st, 2, a->status);
  sqlite3_bind_int64(st, 3, a->next_us);
  if (a->code > 0)
    sqlite3_bind_int64(st, 4, a->code);
  else
    sqlite3_bind_null(st, 4);
  bind_opt_text(st, 5, a->error);
  sqlite3_bind_int64(st, 6, a->now_us);
  int r = sqlite3_step(st) == SQLITE_DONE ? 0 : sql_error(db, "recording an attempt", err);
  sqlite3_finalize(st);
  return r;
}

/* ------------------------------------------------------------------ delivery */

static const char *
jstr(json_object *o, const char *k)
{
  json_object *v = NULL;
  return json_object_object_get_ex(o, k, &v) ? json_object_get_string(v) : NULL;
}

static int64_t
jint(json_object *o, const char *k)
{
  json_object *v = NULL;
  return json_object_object_get_ex(o, k, &v) ? json_object_get_int64(v) : 0;
}

/* One attempt at delivery d; records its outcome. */
static void
attempt(eph_webhooks_t *wh, json_object *d)
{
  const char *id = jstr(d, "id"), *url = jstr(d, "url"), *body = jstr(d, "body");
  const char *secret = jstr(d, "secret");
  int64_t attempts = jint(d, "attempts") + 1;
  char sig[160], sig_header[200], id_header[96];
  eph_error_t err = {0};
  long code = 0;
  char why[1100] = "";
  int64_t t = eph_wall_us() / 1000000;
  if (eph_webhook_sign(secret, t, body, strlen(body), sig, sizeof sig) < 0) {
    snprintf(why, sizeof why, "signing failed");
  } else {
    snprintf(sig_header, sizeof sig_header, "Ephemeral-Signature: %s", sig);
    snprintf(id_header, sizeof id_header, "Ephemeral-Delivery: %s", id);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    h = curl_slist_append(h, sig_header);
    h = curl_slist_append(h, id_header);
    h = curl_slist_append(h, "User-Agent: ephemeral-webhooks/1");
    eph_net_request_t rq = {
        .url = url,
        .method = "POST",
        .headers = h,
        .body = body,
        .body_bytes = strlen(body),
        .max_response_bytes = 1024,
        .timeout_ms = wh->timeout_ms,
        .max_redirects = 0, /* a redirect could lead anywhere: a 3xx is a failure */
        .check_domains = 1,
    };
    eph_net_response_t resp = {0};
    if (eph_net_fetch(&wh->policy, &rq, &resp, &err) < 0) {
      snprintf(why, sizeof why, "%s", err.message);
    } else {
      code = resp.status;
      if (code < 200 || code > 299)
        snprintf(why, sizeof why, "HTTP %ld", code);
    }
    eph_net_response_clear(&resp);
    curl_slist_free_all(h);
  }
  int64_t now = eph_wall_us();
  sql_args_t a = {.id = id, .code = code, .now_us = now};
  if (!why[0]) {
    a.status = "delivered";
    a.next_us = now;
  } else {
    a.error = why;
    int shift = attempts - 1 > 20 ? 20 : (int)(attempts - 1);
    int64_t delay = wh->base_delay_us << shift;
    if (delay > MAX_BACKOFF_US)
      delay = MAX_BACKOFF_US;
    a.next_us = now + delay;
    bool expired = a.next_us > jint(d, "created_at_us") + wh->retry_us;
    a.status = expired ? "failed" : "pending";
    eph_info("webhook delivery %s to %s: attempt %" PRId64 " failed (%s)%s", id, url, attempts,
             why, expired ? "; given up" : "");
  }
  if (eph_store_with_db(wh->store, db_record, &a, &err) < 0)
    eph_warn("%s", err.message);
}

static void *
deliver_main(void *arg)
{
  eph_webhooks_t *wh = arg;
  for (;;) {
    pthread_mutex_lock(&wh->mu);
    bool stop = wh->stop;
    wh->kicked = false;
    pthread_mutex_unlock(&wh->mu);
    if (stop)
      break;
    if (eph_wall_us() >= wh->next_purge_us) {
      eph_error_t err = {0};
      sql_args_t a = {.now_us = eph_wall_us() - wh->retention_us};
      if (eph_store_with_db(wh->store, db_purge, &a, &err) < 0)
        eph_warn("%s", err.message);
      wh->next_purge_us = eph_wall_us() + 3600LL * 1000000;
    }
    int64_t next = 0;
    for (;;) {
      eph_error_t err = {0};
      sql_args_t a = {.now_us = eph_wall_us()};
      if (eph_store_with_db(wh->store, db_next_due, &a, &err) < 0) {
        eph_warn("%s", err.message);
        next = eph_wall_us() + wh->base_delay_us;
        break;
      }
      if (!a.out) {
        next = a.next_us;
        break;
      }
      attempt(wh, a.out);
      json_object_put(a.out);
      pthread_mutex_lock(&wh->mu);
      stop = wh->stop;
      pthread_mutex_unlock(&wh->mu);
      if (stop)
        break;
    }
    int64_t now = eph_wall_us();
    if (!next || next > now + IDLE_WAKE_US)
      next = now + IDLE_WAKE_US;
    struct timespec until = {.tv_sec = next / 1000000, .tv_nsec = (next % 1000000) * 1000};
    pthread_mutex_lock(&wh->mu);
    while (!wh->stop && !wh->kicked)
      if (pthread_cond_timedwait(&wh->cond, &wh->mu, &until) == ETIMEDOUT)
        break;
    pthread_mutex_unlock(&wh->mu);
  }
  return NULL;
}

static void
kick(eph_webhooks_t *wh)
{
  pthread_mutex_lock(&wh->mu);
  wh->kicked = true;
  pthread_cond_signal(&wh->cond);
  pthread_mutex_unlock(&wh->mu);
}

/* ------------------------------------------------------------------ public */

int
eph_webhooks_start(eph_ctx_t *ctx, eph_store_t *store, eph_webhooks_t **out, eph_error_t *err)
{
  const config_setting_t *g =
      ctx->config.core ? config_setting_get_member(ctx->config.core, "webhooks") : NULL;
  /* Checked against their rows' ranges by eph_config_load (core/conf_core.h). */
  const eph_webhooks_conf_t *v = &eph_config_values(&ctx->config)->webhooks;
  int64_t hours = v->retry_hours, base_ms = v->retry_base_ms, timeout_ms = v->timeout_ms;
  int64_t retention_days = eph_config_values(&ctx->config)->retention_days;
  int64_t max_timeout_s = eph_config_values(&ctx->config)->max_timeout_seconds;
  int r;
  eph_webhooks_t *wh = eph_xcalloc(1, sizeof *wh);
  if ((r = eph_net_policy_load(&wh->policy, &ctx->host, g, err)) < 0) {
    free(wh);
    return r;
  }
  wh->store = store;
  wh->retry_us = hours * 3600 * 1000000;
  wh->base_delay_us = base_ms * 1000;
  wh->timeout_ms = timeout_ms;
  wh->retention_us = (retention_days > 0 ? retention_days : 30) * 86400LL * 1000000;
  wh->max_run_us = (max_timeout_s + 3600) * 1000000;
  pthread_mutex_init(&wh->mu, NULL);
  pthread_cond_init(&wh->cond, NULL);
  if ((r = pthread_create(&wh->thread, NULL, deliver_main, wh)) != 0) {
    eph_webhooks_stop(wh);
    return eph_error_set(err, r, "webhooks: starting the delivery thread: %s", strerror(r));
  }
  wh->started = true;
  *out = wh;
  return 0;
}

void
eph_webhooks_stop(eph_webhooks_t *wh)
{
  if (!wh)
    return;
  if (wh->started) {
    pthread_mutex_lock(&wh->mu);
    wh->stop = true;
    pthread_cond_signal(&wh->cond);
    pthread_mutex_unlock(&wh->mu);
    pthread_join(wh->thread, NULL);
  }
  eph_net_policy_free(&wh->policy);
  pthread_cond_destroy(&wh->cond);
  pthread_mutex_destroy(&wh->mu);
  free(wh);
}

/* What a receiver learns of a run: its outcome and usage, never the request (prompt,
 * inline files); under zero data retention not the answer or the error text either. */
static json_object *
summary_of(json_object *run)
{
  json_object *s = json_object_new_object(), *req = NULL, *zdr = NULL;
  bool hide = json_object_object_get_ex(run, "request", &req) &&
              json_object_object_get_ex(req, "zero_data_retention", &zdr) &&
              json_object_get_boolean(zdr);
  static const char *const keep[] = {"id", "object", "status", "reason", "created_at",
                                     "organisation", "backend", "usage", "output", "error"};
  for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++) {
    json_object *v = NULL;
    if (hide && (strcmp(keep[i], "output") == 0 || strcmp(keep[i], "error") == 0))
      continue;
    if (json_object_object_get_ex(run, keep[i], &v))
      json_object_object_add(s, keep[i], json_object_get(v));
  }
  return s;
}

/* Queues run's end (ended_us: when it ended) for org's endpoints and its webhook_url. */
static void
announce(eph_webhooks_t *wh, const char *org, const char *run_id, json_object *run,
         int64_t ended_us)
{
  int64_t now = eph_wall_us();
  cleanup_json json_object *body = json_object_new_object();
  json_object_object_add(body, "type", json_object_new_string("run.ended"));
  json_object_object_add(body, "created_at_us", json_object_new_int64(now));
  json_object_object_add(body, "run", summary_of(run));
  sql_args_t a = {.org = org,
                  .run_id = run_id,
                  .body = json_object_to_json_string_ext(body, JSON_C_TO_STRING_PLAIN),
                  .now_us = now,
                  .ended_us = ended_us};
  eph_error_t err = {0};
  if (eph_store_with_db(wh->store, db_enqueue, &a, &err) < 0)
    eph_warn("run %s: %s", run_id, err.message);
  else if (a.changes > 0)
    kick(wh);
  json_object *req = NULL, *u = NULL;
  if (json_object_object_get_ex(run, "request", &req) &&
      json_object_object_get_ex(req, "webhook_url", &u) && json_object_is_type(u, json_type_string)) {
    char id[3 + 16 + 1] = "wh_", secret[6 + 48 + 1] = "whsec_";
    if (eph_random_hex(id + 3, 8) < 0 || eph_random_hex(secret + 6, 24) < 0) {
      eph_warn("run %s: webhook_url: no random bytes", run_id);
      return;
    }
    a.id = id;
    a.secret = secret;
    a.url = json_object_get_string(u);
    a.changes = 0;
    if (eph_store_with_db(wh->store, db_default, &a, &err) < 0)
      eph_warn("run %s: %s", run_id, err.message);
    else if (a.changes > 0)
      kick(wh);
    free(a.text);
    free(a.default_id);
  }
}

void
eph_webhooks_run_ended(eph_webhooks_t *wh, const char *org, const char *run_id,
                       json_object *run)
{
  if (wh)
    announce(wh, org, run_id, run, eph_wall_us());
}

int
eph_webhooks_catch_up(eph_webhooks_t *wh, json_object *(*run_object)(json_object *row))
{
  if (!wh)
    return 0;
  int64_t now = eph_wall_us();
  /* Within the retry window (older ends would be given up at once anyway) and within the
   * deliveries' retention (a purged row must not look unannounced). */
  int64_t window = wh->retry_us < wh->retention_us ? wh->retry_us : wh->retention_us;
  sql_args_t a = {.since_us = now - window,
                  .now_us = now - CATCH_UP_GRACE_US,
                  .next_us = now - window - wh->max_run_us,
                  .limit = CATCH_UP_BATCH,
                  .out = json_object_new_array()};
  eph_error_t err = {0};
  if (eph_store_with_db(wh->store, db_unannounced, &a, &err) < 0) {
    eph_warn("%s", err.message);
    json_object_put(a.out);
    return -1;
  }
  int n = 0;
  for (size_t i = 0; i < json_object_array_length(a.out); i++) {
    json_object *p = json_object_array_get_idx(a.out, i);
    const char *id = json_object_get_string(json_object_array_get_idx(p, 0));
    int64_t ended = json_object_get_int64(json_object_array_get_idx(p, 1));
    cleanup_json json_object *row = NULL;
    eph_error_t rerr = {0};
    if (eph_store_run_get(wh->store, id, NULL, &row, &rerr) < 0) {
      eph_warn("webhooks: run %s: %s", id, rerr.message);
      continue;
    }
    json_object *org = NULL;
    json_object_object_get_ex(row, "org", &org);
    cleanup_json json_object *run = run_object(row);
    announce(wh, json_object_get_string(org), id, run, ended);
    n++;
  }
  json_object_put(a.out);
  if (n > 0)
    eph_info("webhooks: queued the end of %d run(s) no process announced (recovered runs)", n);
  return n;
}

int
eph_webhooks_default_secret(eph_webhooks_t *wh, const char *org, char **secret_out,
                            eph_error_t *err)
{
  char id[3 + 16 + 1] = "wh_", secret[6 + 48 + 1] = "whsec_";
  if (eph_random_hex(id + 3, 8) < 0 || eph_random_hex(secret + 6, 24) < 0)
    return eph_error_set(err, EIO, "webhooks: no random bytes");
  sql_args_t a = {.org = org, .id = id, .secret = secret, .now_us = eph_wall_us()};
  int r = eph_store_with_db(wh->store, db_default, &a, err);
  free(a.default_id);
  if (r < 0) {
    free(a.text);
    return r;
  }
  *secret_out = a.text;
  return 0;
}

int
eph_webhooks_check_url(eph_webhooks_t *wh, const char *url, eph_error_t *err)
{
  if (!url || strlen(url) > MAX_URL_BYTES ||
      (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0))
    return eph_error_set(err, EINVAL, "expected an http:// or https:// URL of at most %d bytes",
                         MAX_URL_BYTES);
  cleanup_free char *host = NULL;
  int port = 0;
  eph_error_t herr = {0};
  if (eph_net_url_host(url, &host, &port, &herr) < 0)
    return eph_error_set(err, EINVAL, "%s", herr.message);
  const char *why = eph_net_host_refusal(&wh->policy, host);
  if (!why)
    why = eph_net_port_refusal(&wh->policy, port);
  if (why)
    return eph_error_set(err, EINVAL, "%s:%d refused by the webhook policy: %s", host, port,
                         why);
  struct sockaddr_storage ss;
  char addr[64];
  eph_error_t rerr = {0};
  if (eph_net_resolve_checked(&wh->policy, host, port, &ss, addr, &rerr) < 0)
    return eph_error_set(err, EINVAL, "%s", rerr.message);
  return 0;
}

int
eph_webhooks_register(eph_webhooks_t *wh, const char *org, const char *url, json_object **out,
                      const char **field, eph_error_t *err)
{
  *field = "url";
  eph_error_t cerr = {0};
  if (eph_webhooks_check_url(wh, url, &cerr) < 0)
    return eph_error_set(err, EINVAL, "field 'url': %s", cerr.message);
  char id[3 + 16 + 1] = "wh_", secret[6 + 48 + 1] = "whsec_";
  if (eph_random_hex(id + 3, 8) < 0 || eph_random_hex(secret + 6, 24) < 0)
    return eph_error_set(err, EIO, "webhooks: no random bytes");
  *field = NULL;
  sql_args_t a = {.org = org, .id = id, .url = url, .secret = secret, .now_us = eph_wall_us()};
  int r = eph_store_with_db(wh->store, db_register, &a, err);
  if (r < 0)
    return r;
  json_object *o = json_object_new_object();
  json_object_object_add(o, "id", json_object_new_string(id));
  json_object_object_add(o, "url", json_object_new_string(url));
  json_object_object_add(o, "secret", json_object_new_string(secret));
  json_object_object_add(o, "created_at_us", json_object_new_int64(a.now_us));
  *out = o;
  return 0;
}

int
eph_webhooks_list(eph_webhooks_t *wh, const char *org, json_object **out, eph_error_t *err)
{
  sql_args_t a = {.org = org, .out = json_object_new_array()};
  int r = eph_store_with_db(wh->store, db_list, &a, err);
  if (r < 0) {
    json_object_put(a.out);
    return r;
  }
  *out = a.out;
  return 0;
}

int
eph_webhooks_delete(eph_webhooks_t *wh, const char *org, const char *id, eph_error_t *err)
{
  sql_args_t a = {.org = org, .id = id, .now_us = eph_wall_us()};
  return eph_store_with_db(wh->store, db_delete, &a, err);
}

int
eph_webhooks_deliveries(eph_webhooks_t *wh, const char *org, int limit, json_object **out,
                        eph_error_t *err)
{
  sql_args_t a = {.org = org, .limit = limit, .out = json_object_new_array()};
  int r = eph_store_with_db(wh->store, db_deliveries, &a, err);
  if (r < 0) {
    json_object_put(a.out);
    return r;
  }
  *out = a.out;
  return 0;
}
