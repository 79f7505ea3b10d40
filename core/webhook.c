/* Webhooks, the delivery: the signature, the delivery thread and its attempts (policy,
 * backoff, giving up), start and stop, the URL check. The rows it delivers are kept by
 * webhook_queue.c. See webhook.h for the contract. */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include "conf.h"
#include "log.h"
#include "util.h"
#include "webhook_int.h"

#define MAX_URL_BYTES 2048
#define MAX_BACKOFF_US (3600LL * 1000000) /* an hour between attempts at most */
#define IDLE_WAKE_US (60LL * 1000000)     /* re-read the table at least this often */

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

/* ------------------------------------------------------------------ delivery */

/* One attempt at delivery d; records its outcome. */
static void
attempt(eph_webhooks_t *wh, json_object *d)
{
  const char *id = eph_json_get_string(d, "id"), *url = eph_json_get_string(d, "url"),
             *body = eph_json_get_string(d, "body");
  const char *secret = eph_json_get_string(d, "secret");
  int64_t attempts = eph_json_int64(d, "attempts") + 1;
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
  int64_t now = eph_wall_us(), next = now;
  const char *status = "delivered";
  if (why[0]) {
    int shift = attempts - 1 > 20 ? 20 : (int)(attempts - 1);
    int64_t delay = wh->base_delay_us << shift;
    if (delay > MAX_BACKOFF_US)
      delay = MAX_BACKOFF_US;
    next = now + delay;
    bool expired = next > eph_json_int64(d, "created_at_us") + wh->retry_us;
    status = expired ? "failed" : "pending";
    eph_info("webhook delivery %s to %s: attempt %" PRId64 " failed (%s)%s", id, url, attempts, why,
             expired ? "; given up" : "");
  }
  if (eph_webhooks_record(wh, id, eph_json_get_string(d, "claim"), status, code,
                          why[0] ? why : NULL, next, now, &err) < 0)
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
      if (eph_webhooks_purge(wh, eph_wall_us() - wh->retention_us, &err) < 0)
        eph_warn("%s", err.message);
      wh->next_purge_us = eph_wall_us() + 3600LL * 1000000;
    }
    int64_t next = 0;
    for (;;) {
      eph_error_t err = {0};
      json_object *due = NULL;
      if (eph_webhooks_next_due(wh, eph_wall_us(), &due, &next, &err) < 0) {
        eph_warn("%s", err.message);
        next = eph_wall_us() + wh->base_delay_us;
        break;
      }
      if (!due)
        break;
      attempt(wh, due);
      json_object_put(due);
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
    return eph_error_set(err, EINVAL, "%s:%d refused by the webhook policy: %s", host, port, why);
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
  eph_webhook_ids_t ids;
  if (eph_webhooks_new_ids(&ids) < 0)
    return eph_error_set(err, EIO, "webhooks: no random bytes");
  const char *id = ids.id, *secret = ids.secret;
  *field = NULL;
  int64_t now = eph_wall_us();
  int r = eph_webhooks_add_endpoint(wh, org, id, url, secret, now, err);
  if (r < 0)
    return r;
  json_object *o = json_object_new_object();
  json_object_object_add(o, "id", json_object_new_string(id));
  json_object_object_add(o, "url", json_object_new_string(url));
  json_object_object_add(o, "secret", json_object_new_string(secret));
  json_object_object_add(o, "created_at_us", json_object_new_int64(now));
  *out = o;
  return 0;
}
