/* The transport shared by the hosted-model plugins (model-openai, model-anthropic): API key
 * loading, base_url checks, key scrubbing, and one POST with retries, backoff, deadlines and
 * an optional Server-Sent Events (SSE) stream, over libcurl.
 *
 * Part of sdk/support/libephmodelhttp.la, linked into each of those plugins (hidden
 * visibility: nothing here is exported). */
#ifndef EPH_SUPPORT_MODEL_HTTP_H
#define EPH_SUPPORT_MODEL_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>
#include <ephemeral/plugin.h>

#include "cleanup.h" /* eph_free_secret */

/* Retry and size policy of one plugin instance (all from its config block). */
typedef struct eph_mhttp_policy {
  int64_t connect_timeout_ms, timeout_ms;
  int64_t max_retries, backoff_initial_ms, backoff_max_ms;
  int64_t max_response_bytes; /* a body, or a whole stream, longer than this is refused */
} eph_mhttp_policy_t;

/* The key rows of the keys eph_mhttp_policy_read() reads, plus allow_plain_http, for a
 * provider plugin's key table (one copy of their defaults and docs): expand before the
 * table's {0}. retry_answers names the HTTP answers the provider retries, e.g.
 * "408, 409, 429 or 5xx". */
/* clang-format off */
#define EPH_MHTTP_POLICY_KEYS(retry_answers)                                                       \
  {"connect_timeout_ms", EPH_CFG_INT, "10000", "ms",                                               \
   "Connection set-up timeout of one attempt (never past the call's deadline)."},                  \
  {"timeout_ms", EPH_CFG_INT, "120000", "ms",                                                      \
   "Whole-attempt timeout (a stream included); a timed-out attempt is retried if the "             \
   "deadline allows and no stream had started."},                                                  \
  {"max_retries", EPH_CFG_INT, "3", NULL,                                                          \
   "Retries after a " retry_answers " answer or a transient transport failure."},                  \
  {"backoff_initial_ms", EPH_CFG_INT, "500", "ms",                                                 \
   "First retry delay; it doubles on each retry (full jitter: a random delay between half "        \
   "and all of it). A Retry-After header replaces it."},                                           \
  {"backoff_max_ms", EPH_CFG_INT, "20000", "ms", "Cap of the computed retry delay."},              \
  {"max_response_bytes", EPH_CFG_INT, "8388608", "bytes",                                          \
   "Largest response body (or whole stream) accepted, at most 1 GiB; a longer one is a "           \
   "protocol error."},                                                                             \
  {"allow_plain_http", EPH_CFG_BOOL, "false", NULL,                                                \
   "Allow an http:// base_url to a non-loopback host (the API key would travel in clear)."}
/* clang-format on */

/* Reads the policy keys (connect_timeout_ms, timeout_ms, max_retries, backoff_initial_ms,
 * backoff_max_ms, max_response_bytes) from config with the documented defaults; each must
 * be positive (max_retries >= 0). */
int eph_mhttp_policy_read(const eph_host_t *host, const config_setting_t *config,
                          eph_mhttp_policy_t *p, eph_error_t *err);

/* Loads an API key: key_file (wins when non-empty), else the environment variable key_env.
 * On success *key is a heap string (free with eph_free_secret) or NULL when no
 * source is configured or the variable is unset; in the latter case *no_key_reason (heap)
 * says why, and calls must fail with it before sending anything. where names the config
 * block for messages. */
int eph_mhttp_load_key(const eph_host_t *host, const char *where, const char *key_file,
                       const char *key_env, char **key, char **no_key_reason, eph_error_t *err);

/* What a hosted-model plugin's init does with its key: loads it (eph_mhttp_load_key) and
 * formats the header line that carries it, "<header_prefix><key>" (e.g. "x-api-key: "),
 * into *header (NULL when there is no key). When `required` and no key source is
 * configured at all, *no_key_reason says so too (otherwise no key means no header: local
 * servers). A missing key is logged at debug level; calls must then fail with
 * *no_key_reason. *key and *header are freed with eph_free_secret, *no_key_reason
 * with free(). Errors as eph_mhttp_load_key, or -ENOMEM. */
int eph_mhttp_key_header(const eph_host_t *host, const char *where, const char *key_file,
                         const char *key_env, const char *header_prefix, bool required, char **key,
                         char **header, char **no_key_reason, eph_error_t *err);

/* "<base_url>/<path>" into *url (heap), the base's trailing slashes dropped. -ENOMEM. */
int eph_mhttp_endpoint(const char *base_url, const char *path, char **url, eph_error_t *err);

/* The request's header list from lines (NULL entries skipped), or NULL with err set
 * (-ENOMEM). Free with curl_slist_free_all. */
struct curl_slist *eph_mhttp_headers(const char *const *lines, size_t n, eph_error_t *err);

/* The headers of a JSON POST: Content-Type: application/json, Accept: text/event-stream
 * when stream (else application/json), then line1 and line2 (NULL: none; e.g. the key's
 * header). NULL with err set (-ENOMEM). Free with curl_slist_free_all. */
struct curl_slist *eph_mhttp_json_headers(bool stream, const char *line1, const char *line2,
                                          eph_error_t *err);

/* What a hosted-model plugin's init starts with: curl_global_init (reference counted: its
 * fini ends with curl_global_cleanup) and a zeroed state of size bytes into *state (heap).
 * 0, or -EIO / -ENOMEM with err set and curl left as it was. */
int eph_mhttp_state_new(size_t size, void **state, eph_error_t *err);

/* The start of each attempt of a call whose text streams to on_text (NULL: none): the
 * first attempt starts from nothing; a retry first tells on_text (NULL text) that the
 * text streamed by the failed attempt is discarded. *attempts counts the attempts. */
void eph_mhttp_attempt_begins(int *attempts, void (*on_text)(void *, const char *, size_t),
                              void *text_opaque);

/* How a call's on_done ends with root, its answer read by the wire format's parser (NULL
 * root: the parser's error is in err): parse(root, where, resp, err) and, on success, root
 * with "x_latency_ms" (recorded with the body so a replay can pace itself like the original
 * run) becomes resp->raw. Takes root's reference. 0, or the error (-EPH_E_PROTOCOL when
 * err has no code). */
int eph_mhttp_answer(json_object *root,
                     int (*parse)(json_object *, const char *, eph_model_response_t *,
                                  eph_error_t *),
                     const char *where, int64_t latency_ms, eph_model_response_t *resp,
                     eph_error_t *err);

/* The request body as compact JSON text (slashes unescaped), heap; consumes body (one
 * reference). NULL with err set (-ENOMEM). */
char *eph_mhttp_body_text(json_object *body, eph_error_t *err);

/* A non-streamed 2xx body as one JSON value (owned by the caller), or NULL with
 * -EPH_E_PROTOCOL naming url, the parser's complaint and an excerpt of the body. */
json_object *eph_mhttp_parse_body(const char *body, size_t len, const char *url, eph_error_t *err);

/* How a hosted-model complete() ends with the result r of its call: on failure resp is
 * cleared (no half answer), on success the debug line with its tokens and finish reason
 * (scrubbed of key). Returns r. */
int eph_mhttp_complete_end(const eph_host_t *host, const char *key, eph_model_response_t *resp,
                           int r);

/* Refuses a base_url that is not http(s), or plain http to a non-loopback host (the key
 * would travel in clear) unless allow_plain_http. */
int eph_mhttp_check_base_url(const char *base_url, bool allow_plain_http, eph_error_t *err);

/* Replaces every run of at least min(12, strlen(key)) characters of msg that also appears
 * in key with "[redacted]" (APIs echo a wrong key back in their 401 text). */
void eph_mhttp_redact(char *msg, size_t size, const char *key);

/* Logs through host->log after scrubbing key. */
__attribute__((format(printf, 4, 5))) void
eph_mhttp_log(const eph_host_t *host, const char *key, eph_log_level_t level, const char *fmt, ...);

/* s without its leading and trailing white space (cut in place; a pointer into s). */
char *eph_mhttp_trim(char *s);

/* A printable excerpt of len bytes of body (control bytes become '.'). */
void eph_mhttp_excerpt(const char *body, size_t len, char *out, size_t size);

/* What one POST is given. Borrowed for the call. */
typedef struct eph_mhttp_call {
  const char *url;
  const struct curl_slist *headers; /* Content-Type, auth, ... */
  const char *body;
  const char *key;     /* scrubbed from every message; may be NULL */
  int64_t deadline_ms; /* CLOCK_MONOTONIC ms; <= 0: none */
  const char *user_agent;
  /* Streaming (NULL: a plain JSON answer). Called once per SSE event of a 2xx answer,
   * event "" when the server named none; data is NUL-terminated (the "data:" lines joined
   * with '\n'). A negative return aborts the attempt with that error (not retried). */
  int (*on_event)(void *opaque, const char *event, const char *data, size_t len, eph_error_t *err);
  /* Called before each attempt (streaming state must start afresh after a retry). */
  void (*on_attempt)(void *opaque);
  /* Called once the 2xx answer is complete: body/len is the whole body when not streaming
   * (NULL, 0 when streaming). Returns 0 or a negative error (not retried). */
  int (*on_done)(void *opaque, const char *body, size_t len, int64_t latency_ms, eph_error_t *err);
  void *opaque;
} eph_mhttp_call_t;

/* POSTs call->body to call->url. 408, 409, 429 and 5xx answers (529 "overloaded"
 * included) and transient transport failures are retried up to policy->max_retries times
 * with exponential backoff and full jitter, honouring Retry-After and retry-after-ms; no
 * attempt and no wait runs past the deadline. Errors: -ETIMEDOUT (deadline),
 * -EPH_E_UPSTREAM (an API error, with its message), -EPH_E_PROTOCOL (a body or stream that
 * is too large, malformed or ends early), or what a callback returned. The message is
 * scrubbed of call->key. */
int eph_mhttp_post(const eph_mhttp_policy_t *policy, const eph_host_t *host,
                   const eph_mhttp_call_t *call, eph_error_t *err);

/* Parses len bytes of text as exactly one JSON value (only whitespace may follow). Returns
 * it (owned by the caller) or NULL with *why set to a static description. */
json_object *eph_mhttp_parse_json(const char *text, size_t len, const char **why);

#endif
