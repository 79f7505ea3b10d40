/*
 * Webhooks: an organisation registers an endpoint (an http(s) URL); when one of its runs
 * settles, the daemon POSTs the run's summary there, signed, and retries until the
 * endpoint answers 2xx or retry_hours (default 24) have passed since the run ended.
 *
 * Delivery rows live in the store (tables webhooks, webhook_deliveries, created by the
 * SQLite store's migration 2 -> 3 and the PostgreSQL store's 4 -> 5), inserted in the same
 * call that learns of the run's end, so a daemon restart resumes every pending delivery.
 * On PostgreSQL the rows are the cluster's: every node's delivery thread takes due
 * deliveries, each claimed for one node at a time (FOR UPDATE SKIP LOCKED) and recorded
 * only by its claimant, so no two nodes attempt one delivery at once (docs/cluster.md). A (webhook,
 * run) pair has one row: a run is announced once per endpoint. Delivered and failed rows are purged
 * (hourly) once older than the config's retention_days; pending ones never are.
 *
 * The signature: header `Ephemeral-Signature: t=UNIX_SECONDS,v1=HEX` where HEX is the
 * lowercase hex HMAC-SHA256 (OpenSSL) keyed with the endpoint's secret ("whsec_" + 48 hex
 * digits, shown once at registration) over "<t>.<body>". Receivers check it and reject a
 * t far from their clock (the SDKs' verify_webhook).
 *
 * Where deliveries may go: the `webhooks` group of the config is an address policy read
 * like the egress proxy's (sdk/support/net.h): allow_domains, deny_domains, allowed_ports
 * (default 80, 443), allow_private_addresses and allow_loopback (both off: a tenant must not
 * make the daemon POST into the operator's network). A URL is judged at registration
 * (400 naming `url`) and again, resolved and pinned, at every attempt (libcurl through
 * eph_net_fetch: no redirect is followed, a 3xx is a failed attempt).
 *
 * Threads: one delivery thread; eph_webhooks_run_ended and the store calls are safe from
 * any thread.
 */
#ifndef EPH_WEBHOOK_H
#define EPH_WEBHOOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <json-c/json.h>

#include "context.h"
#include "store.h"

typedef struct eph_webhooks eph_webhooks_t;

/* Reads the config's `webhooks` group and starts the delivery thread, which first picks up
 * the deliveries a previous daemon left pending. store is borrowed and must outlive *out.
 * Errors: -EPH_E_CONFIG naming file:line. */
int eph_webhooks_start(eph_ctx_t *ctx, eph_store_t *store, eph_webhooks_t **out, eph_error_t *err);

/* Stops the thread (an attempt in flight finishes first, at most timeout_ms) and frees.
 * Pending deliveries stay in the store for the next start. NULL is a no-op. */
void eph_webhooks_stop(eph_webhooks_t *wh);

/* A run of org settled: queues one delivery per registered endpoint of org, and one to the
 * request's webhook_url (run.request.webhook_url, signed with the org's default secret),
 * body {"type":"run.ended","created_at_us":..,"run":summary of run} (run borrowed).
 * Failures are logged (the run's own record is unaffected). */
void eph_webhooks_run_ended(eph_webhooks_t *wh, const char *org, const char *run_id,
                            json_object *summary);

/* Catch-up for run ends no process announced: runs settled by the store's recovery
 * (eph_runstore_recover: host_lost, storage_error), in this daemon's reconciler, at its
 * start, or in another process such as the CLI, before any delivery thread existed. Queues,
 * like eph_webhooks_run_ended, every settled run that ended within the retry window
 * (webhooks.retry_hours, at most retention_days) and has no delivery yet for an endpoint
 * of its org that existed when it ended (or to its request's webhook_url); the
 * (endpoint, run) uniqueness makes a second pass, or a race with run_ended, add none.
 * Runs ended in the last 2 s are left to run_ended. run_object turns a store row
 * (eph_store_run_get's shape, borrowed) into the API's run object (a new reference).
 * Called by the reconciler every pass. Returns the number of runs queued (errors logged,
 * -1). NULL wh is a no-op. */
int eph_webhooks_catch_up(eph_webhooks_t *wh, json_object *(*run_object)(json_object *row));

/* Registers url for org. On success *out (owned by the caller) is
 * {"id","url","secret","created_at_us"}. -EINVAL with *field = "url" and err naming the
 * reason when the URL is malformed or its host, port or any address it resolves to is
 * refused by the policy. */
int eph_webhooks_register(eph_webhooks_t *wh, const char *org, const char *url, json_object **out,
                          const char **field, eph_error_t *err);

/* Judges a URL as registration does (scheme, length, host, port, every resolved address).
 * 0, or -EINVAL with err naming the reason (without a field name). */
int eph_webhooks_check_url(eph_webhooks_t *wh, const char *url, eph_error_t *err);

/* The org's default signing secret (created on first use), which signs deliveries to a
 * request's own webhook_url. *secret_out heap, owned by the caller. */
int eph_webhooks_default_secret(eph_webhooks_t *wh, const char *org, char **secret_out,
                                eph_error_t *err);

/* The org's endpoints, newest first, without secrets: a JSON array owned by the caller. */
int eph_webhooks_list(eph_webhooks_t *wh, const char *org, json_object **out, eph_error_t *err);

/* Deletes one of org's endpoints (its pending deliveries are given up). -ENOENT when org
 * has no such endpoint. */
int eph_webhooks_delete(eph_webhooks_t *wh, const char *org, const char *id, eph_error_t *err);

/* The org's deliveries, newest first, at most limit (1..500): a JSON array owned by the
 * caller of {"id","webhook_id","run_id","url","status","attempts","next_attempt_us",
 * "last_status_code"|null,"last_error"|null,"created_at_us","updated_at_us"}. */
int eph_webhooks_deliveries(eph_webhooks_t *wh, const char *org, int limit, json_object **out,
                            eph_error_t *err);

/* The header value for body signed with secret at time t (unix seconds) into out:
 * "t=<t>,v1=<64 hex>". Returns 0 or -EIO. */
int eph_webhook_sign(const char *secret, int64_t t, const char *body, size_t body_bytes, char *out,
                     size_t size);

#endif
