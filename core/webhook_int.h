/* What the webhook units share (nothing else includes this): webhook.c signs and delivers
 * (the delivery thread, its policy, the attempt and its backoff, the URL check at
 * registration); webhook_queue.c, the layer below, keeps the rows (endpoints, default
 * secrets, the delivery queue) and fills the queue (a run's end, the catch-up of ends no
 * process announced), waking the thread when it adds one. */
#ifndef EPH_WEBHOOK_INT_H
#define EPH_WEBHOOK_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "support/net.h"
#include "webhook.h"

struct eph_webhooks {
  eph_store_t *store;
  eph_net_policy_t policy;
  int64_t retry_us;      /* give up this long after the run ended */
  int64_t base_delay_us; /* first retry after this; doubles per attempt */
  int64_t timeout_ms;    /* one attempt */
  int64_t retention_us;  /* finished deliveries older than this are purged (retention_days) */
  int64_t max_run_us;    /* max_timeout_seconds plus an hour: the longest a run lasts */
  int64_t next_purge_us;
  pthread_mutex_t mu; /* a leaf: guards stop, kicked; never held across I/O */
  pthread_cond_t cond;
  bool stop, kicked, started;
  pthread_t thread;
};

/* What webhook.c asks of the queue (webhook_queue.c), each in one store call; the queue
 * never calls into webhook.c (tests/check-cycles). */

/* A new endpoint id ("wh_" + 16 hex digits) and signing secret ("whsec_" + 48 hex
 * digits) from the kernel's random bytes. -EIO when there are none. */
typedef struct {
  char id[3 + 16 + 1];
  char secret[6 + 48 + 1];
} eph_webhook_ids_t;
int eph_webhooks_new_ids(eph_webhook_ids_t *ids);

/* Wakes the delivery thread: a delivery was queued. */
void eph_webhooks_kick(eph_webhooks_t *wh);

/* Inserts endpoint id of org (url already checked by the delivery policy). */
int eph_webhooks_add_endpoint(eph_webhooks_t *wh, const char *org, const char *id, const char *url,
                              const char *secret, int64_t now_us, eph_error_t *err);

/* The next delivery due at now_us, as {id, url, body, attempts, created_at_us, secret,
 * claim?} (*due, new), or *due = NULL and *next_us = the earliest future attempt (0: none).
 * On PostgreSQL the delivery is claimed for this node (docs/cluster.md): no other node's
 * thread gets it until the attempt's timeout plus a margin has passed; "claim" is the
 * token eph_webhooks_record must present. */
int eph_webhooks_next_due(eph_webhooks_t *wh, int64_t now_us, json_object **due, int64_t *next_us,
                          eph_error_t *err);

/* Records an attempt at delivery id: status "delivered", "pending" (retried at next_us) or
 * "failed"; code the HTTP status (<= 0: none), error the reason (NULL when delivered).
 * claim: the due delivery's "claim" (NULL on SQLite); an expired claim records nothing
 * (logged). */
int eph_webhooks_record(eph_webhooks_t *wh, const char *id, const char *claim, const char *status,
                        long code, const char *error, int64_t next_us, int64_t now_us,
                        eph_error_t *err);

/* Deletes the delivered and failed rows last updated before before_us. */
int eph_webhooks_purge(eph_webhooks_t *wh, int64_t before_us, eph_error_t *err);

#endif
