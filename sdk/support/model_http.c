/* The hosted-model transport shared by model-openai and model-anthropic (see model_http.h);
 * the keys and base URLs are model_keys.c's.
 *
 * The API key is only ever written into the headers the caller builds for requests to its
 * base_url: redirects are not followed, plain http is refused for anything but a loopback
 * address, and every log line and error message is scrubbed of it.
 *
 * Streams are Server-Sent Events (https://html.spec.whatwg.org/multipage/server-sent-events.html):
 * lines end in LF, CRLF or CR; "event:" names the event, "data:" lines are joined with LF, a
 * blank line dispatches, a line starting with ':' is a comment. The parser is bounded: one
 * event may not exceed max_response_bytes, nor the whole stream. Each event's payload is
 * decoded by the caller with json-c. */
#include "config.h" /* autoconf: _GNU_SOURCE */

#include "model_http.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

struct curl_slist *
eph_mhttp_headers(const char *const *lines, size_t n, eph_error_t *err)
{
  struct curl_slist *headers = NULL, *h;
  for (size_t i = 0; i < n; i++) {
    if (!lines[i])
      continue;
    if (!(h = curl_slist_append(headers, lines[i]))) {
      curl_slist_free_all(headers);
      eph_error_set(err, ENOMEM, "out of memory building request headers");
      return NULL;
    }
    headers = h;
  }
  return headers;
}

struct curl_slist *
eph_mhttp_json_headers(bool stream, const char *line1, const char *line2, eph_error_t *err)
{
  const char *lines[] = {"Content-Type: application/json",
                         stream ? "Accept: text/event-stream" : "Accept: application/json", line1,
                         line2};
  return eph_mhttp_headers(lines, sizeof lines / sizeof lines[0], err);
}

int
eph_mhttp_state_new(size_t size, void **state, eph_error_t *err)
{
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
    return eph_error_set(err, EIO, "curl_global_init failed");
  if (!(*state = calloc(1, size))) {
    curl_global_cleanup();
    return eph_error_set(err, ENOMEM, "out of memory");
  }
  return 0;
}

void
eph_mhttp_attempt_begins(int *attempts, void (*on_text)(void *, const char *, size_t),
                         void *text_opaque)
{
  if ((*attempts)++ > 0 && on_text)
    on_text(text_opaque, NULL, 0);
}

int
eph_mhttp_answer(json_object *root,
                 int (*parse)(json_object *, const char *, eph_model_response_t *, eph_error_t *),
                 const char *where, int64_t latency_ms, eph_model_response_t *resp,
                 eph_error_t *err)
{
  if (!root)
    return err && err->code ? -err->code : -EPH_E_PROTOCOL;
  int r = parse(root, where, resp, err);
  if (r < 0) {
    json_object_put(root);
    return r;
  }
  json_object_object_add(root, "x_latency_ms", json_object_new_int64(latency_ms));
  resp->raw = root;
  return 0;
}

char *
eph_mhttp_body_text(json_object *body, eph_error_t *err)
{
  const char *text =
      json_object_to_json_string_ext(body, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
  char *copy = text ? strdup(text) : NULL;
  json_object_put(body);
  if (!copy)
    eph_error_set(err, ENOMEM, "out of memory building the request body");
  return copy;
}

json_object *
eph_mhttp_parse_body(const char *body, size_t len, const char *url, eph_error_t *err)
{
  const char *why = NULL;
  json_object *root = eph_mhttp_parse_json(body, len, &why);
  if (!root) {
    char ex[120];
    eph_mhttp_excerpt(body, len, ex, sizeof ex);
    eph_error_set(err, EPH_E_PROTOCOL, "model call to %s: body is not valid JSON (%s): %s", url,
                  why, ex);
  }
  return root;
}

int
eph_mhttp_complete_end(const eph_host_t *host, const char *key, eph_model_response_t *resp, int r)
{
  if (r < 0) {
    eph_model_response_clear(resp);
    return r;
  }
  eph_mhttp_log(host, key, EPH_LOG_DEBUG, "model call: %llu+%llu tokens, %s",
                (unsigned long long)resp->input_tokens, (unsigned long long)resp->output_tokens,
                resp->finish_reason);
  return r;
}

int
eph_mhttp_policy_read(const eph_host_t *host, const config_setting_t *config, eph_mhttp_policy_t *p,
                      eph_error_t *err)
{
  int r;
  if ((r = host->cfg_int(config, "connect_timeout_ms", 10000, &p->connect_timeout_ms, err)) < 0 ||
      (r = host->cfg_int(config, "timeout_ms", 120000, &p->timeout_ms, err)) < 0 ||
      (r = host->cfg_int(config, "max_retries", 3, &p->max_retries, err)) < 0 ||
      (r = host->cfg_int(config, "backoff_initial_ms", 500, &p->backoff_initial_ms, err)) < 0 ||
      (r = host->cfg_int(config, "backoff_max_ms", 20000, &p->backoff_max_ms, err)) < 0 ||
      (r = host->cfg_int(config, "max_response_bytes", 8 << 20, &p->max_response_bytes, err)) < 0)
    return r;
  if (p->connect_timeout_ms <= 0 || p->timeout_ms <= 0 || p->max_retries < 0 ||
      p->max_retries > 100 || p->backoff_initial_ms < 0 || p->backoff_max_ms < 0 ||
      p->max_response_bytes < 1024 || p->max_response_bytes > (1 << 30))
    return eph_error_set(err, EPH_E_CONFIG,
                         "timeouts must be positive, max_retries within 0..100, backoffs not "
                         "negative and max_response_bytes within 1024..1073741824 (json-c "
                         "takes int lengths)");
  return 0;
}

json_object *
eph_mhttp_parse_json(const char *text, size_t len, const char **why)
{
  json_tokener *tok = json_tokener_new();
  json_object *root = NULL;
  *why = "empty";
  if (!tok)
    return NULL;
  if (text && len > 0 && len < INT32_MAX) {
    root = json_tokener_parse_ex(tok, text, (int)len);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    if (!root) {
      *why = jerr == json_tokener_continue ? "truncated" : json_tokener_error_desc(jerr);
    } else {
      /* Trailing garbage after the value: only whitespace is allowed. */
      for (size_t i = (size_t)json_tokener_get_parse_end(tok); i < len; i++)
        if (!isspace((unsigned char)text[i])) {
          json_object_put(root);
          root = NULL;
          *why = "trailing data after the JSON value";
          break;
        }
    }
  }
  json_tokener_free(tok);
  return root;
}

/* ---------------------------------------------------------------- one attempt */

typedef struct attempt {
  const eph_mhttp_call_t *call;
  CURL *curl;
  size_t limit;
  int64_t retry_after_ms; /* -1: no header */
  int status_known;       /* 0 unknown, 1 streaming a 2xx, 2 buffering a non-2xx body */
  /* The whole body (non-streaming, or an error answer). */
  char *body;
  size_t len, cap;
  bool too_large;
  /* SSE state */
  size_t stream_bytes;
  char *line;
  size_t line_len, line_cap;
  bool last_cr; /* the previous chunk ended in CR: a following LF belongs to it */
  char event[64];
  char *data;
  size_t data_len, data_cap;
  bool has_data;
  int cb_error; /* a callback failed: its error is in *err */
  eph_error_t *err;
} attempt_t;

static int
grow(char **buf, size_t *cap, size_t need)
{
  if (need <= *cap)
    return 0;
  size_t c = *cap ? *cap : 1024;
  while (c < need)
    c *= 2;
  char *p = realloc(*buf, c);
  if (!p)
    return -1;
  *buf = p;
  *cap = c;
  return 0;
}

static int
sse_dispatch(attempt_t *a)
{
  int r = 0;
  if (a->has_data) {
    a->data[a->data_len] = '\0';
    r = a->call->on_event(a->call->opaque, a->event, a->data, a->data_len, a->err);
  }
  a->event[0] = '\0';
  a->data_len = 0;
  a->has_data = false;
  return r;
}

/* One complete line (without its terminator). */
static int
sse_line(attempt_t *a, const char *line, size_t len)
{
  if (len == 0)
    return sse_dispatch(a);
  if (line[0] == ':')
    return 0; /* comment (keep-alive) */
  const char *colon = memchr(line, ':', len);
  size_t nlen = colon ? (size_t)(colon - line) : len;
  const char *value = colon ? colon + 1 : line + len;
  size_t vlen = colon ? len - nlen - 1 : 0;
  if (vlen > 0 && *value == ' ') {
    value++;
    vlen--;
  }
  if (nlen == 5 && memcmp(line, "event", 5) == 0) {
    size_t n = vlen < sizeof a->event - 1 ? vlen : sizeof a->event - 1;
    memcpy(a->event, value, n);
    a->event[n] = '\0';
  } else if (nlen == 4 && memcmp(line, "data", 4) == 0) {
    size_t need = a->data_len + (a->has_data ? 1 : 0) + vlen + 1;
    if (need > a->limit) {
      a->too_large = true;
      return -1;
    }
    if (grow(&a->data, &a->data_cap, need) < 0)
      return -1;
    if (a->has_data)
      a->data[a->data_len++] = '\n';
    memcpy(a->data + a->data_len, value, vlen);
    a->data_len += vlen;
    a->has_data = true;
  }
  /* "id", "retry" and unknown fields are ignored, as the specification says. */
  return 0;
}

static int
sse_feed(attempt_t *a, const char *p, size_t n)
{
  for (size_t i = 0; i < n; i++) {
    char ch = p[i];
    if (a->last_cr && ch == '\n') {
      a->last_cr = false;
      continue;
    }
    a->last_cr = false;
    if (ch == '\r' || ch == '\n') {
      a->last_cr = ch == '\r';
      int r = sse_line(a, a->line ? a->line : "", a->line_len);
      a->line_len = 0;
      if (r < 0)
        return r;
      continue;
    }
    if (a->line_len + 2 > a->limit) {
      a->too_large = true;
      return -1;
    }
    if (grow(&a->line, &a->line_cap, a->line_len + 2) < 0)
      return -1;
    a->line[a->line_len++] = ch;
    a->line[a->line_len] = '\0';
  }
  return 0;
}

static size_t
on_body(char *data, size_t size, size_t nmemb, void *opaque)
{
  attempt_t *a = opaque;
  size_t n = size * nmemb;
  if (!a->status_known) {
    long status = 0;
    curl_easy_getinfo(a->curl, CURLINFO_RESPONSE_CODE, &status);
    a->status_known = a->call->on_event && status >= 200 && status < 300 ? 1 : 2;
  }
  if (a->status_known == 1) {
    a->stream_bytes += n;
    if (a->stream_bytes > a->limit) {
      a->too_large = true;
      return 0;
    }
    if (sse_feed(a, data, n) < 0) {
      if (!a->too_large)
        a->cb_error = 1;
      return 0; /* aborts the transfer with CURLE_WRITE_ERROR */
    }
    return n;
  }
  if (a->len + n > a->limit) {
    a->too_large = true;
    return 0;
  }
  if (grow(&a->body, &a->cap, a->len + n + 1) < 0)
    return 0;
  memcpy(a->body + a->len, data, n);
  a->len += n;
  a->body[a->len] = '\0';
  return n;
}

/* Reads Retry-After (seconds or an HTTP date, RFC 9110 10.2.3) and retry-after-ms, the
 * latter winning as it is more precise. */
static size_t
on_header(char *data, size_t size, size_t nmemb, void *opaque)
{
  attempt_t *a = opaque;
  size_t n = size * nmemb;
  char line[256];
  if (n >= sizeof line)
    return n;
  memcpy(line, data, n);
  line[n] = '\0';
  /* A new status line (after a 100 Continue, say) resets what an earlier response said. */
  if (strncmp(line, "HTTP/", 5) == 0) {
    a->retry_after_ms = -1;
    return n;
  }
  char *colon = strchr(line, ':');
  if (!colon)
    return n;
  *colon = '\0';
  char *value = eph_mhttp_trim(colon + 1);
  char *end = NULL;
  if (strcasecmp(eph_mhttp_trim(line), "retry-after-ms") == 0) {
    double ms = strtod(value, &end);
    if (end != value && ms >= 0 && ms < 1e9)
      a->retry_after_ms = (int64_t)ms;
  } else if (strcasecmp(eph_mhttp_trim(line), "retry-after") == 0 && a->retry_after_ms < 0) {
    /* Delay-seconds or an HTTP-date (RFC 9110 10.2.3); either is taken only below 10^6 s
     * (11 days, longer than any run): a date in year 2^31, which curl_getdate accepts, would
     * overflow the milliseconds. */
    long secs = strtol(value, &end, 10);
    if (!(end != value && *end == '\0')) {
      time_t when = curl_getdate(value, NULL), now = time(NULL);
      secs = when < 0 ? -1 : when > now ? (long)(when - now) : 0;
    }
    if (secs >= 0 && secs < 1000000)
      a->retry_after_ms = (int64_t)secs * 1000;
  }
  return n;
}

/* The API's own error text ({"error":{"message":...}}, OpenAI's and Anthropic's shape),
 * else an excerpt of the body. */
static void
api_error_text(const attempt_t *a, char *out, size_t size)
{
  json_object *root = a->body ? json_tokener_parse(a->body) : NULL;
  json_object *e = NULL, *m = NULL;
  const char *msg = NULL;
  if (root && json_object_object_get_ex(root, "error", &e)) {
    if (json_object_is_type(e, json_type_string))
      msg = json_object_get_string(e);
    else if (json_object_object_get_ex(e, "message", &m) &&
             json_object_is_type(m, json_type_string))
      msg = json_object_get_string(m);
  }
  if (msg)
    snprintf(out, size, "%s", msg);
  else if (a->body && a->len)
    eph_mhttp_excerpt(a->body, a->len, out, size < 200 ? size : 200);
  else
    snprintf(out, size, "(empty body)");
  if (root)
    json_object_put(root);
}

static bool
status_is_retryable(long status)
{
  return status == 408 || status == 409 || status == 429 || status >= 500;
}

static bool
curl_is_transient(CURLcode c)
{
  switch (c) {
  case CURLE_COULDNT_RESOLVE_HOST:
  case CURLE_COULDNT_CONNECT:
  case CURLE_OPERATION_TIMEDOUT:
  case CURLE_SEND_ERROR:
  case CURLE_RECV_ERROR:
  case CURLE_GOT_NOTHING:
  case CURLE_PARTIAL_FILE:
  case CURLE_SSL_CONNECT_ERROR:
  case CURLE_HTTP2:
  case CURLE_HTTP2_STREAM:
    return true;
  default:
    return false;
  }
}

static int64_t
backoff_ms(const eph_mhttp_policy_t *p, int retry)
{
  int64_t d = p->backoff_initial_ms;
  for (int i = 0; i < retry && d < p->backoff_max_ms; i++)
    d *= 2;
  if (d > p->backoff_max_ms)
    d = p->backoff_max_ms;
  uint32_t rnd = 0;
  if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
    rnd = (uint32_t)eph_now_ms();
  /* Jitter over [d/2, d]: spreads retries of many runs without ever retrying at once. */
  return d / 2 + (d > 1 ? (int64_t)(rnd % (uint32_t)(d - d / 2 + 1)) : 0);
}

static void
sleep_ms(int64_t ms)
{
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_sec += ms / 1000;
  until.tv_nsec += (ms % 1000) * 1000000;
  if (until.tv_nsec >= 1000000000) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000;
  }
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) == EINTR)
    ;
}

static void
attempt_free(attempt_t *a)
{
  free(a->body);
  free(a->line);
  free(a->data);
}

static int
do_post(const eph_mhttp_policy_t *p, const eph_host_t *host, const eph_mhttp_call_t *call,
        eph_error_t *err)
{
  char curl_err[CURL_ERROR_SIZE], api_text[512], last[EPH_ERROR_MESSAGE_BYTES];
  const char *url = call->url;
  int r = 0;

  last[0] = '\0';
  for (int attempt = 0;; attempt++) {
    int64_t now = eph_now_ms();
    int64_t remaining = call->deadline_ms > 0 ? call->deadline_ms - now : INT64_MAX;
    if (remaining <= 0) {
      r = eph_error_set(err, ETIMEDOUT, "model call to %s: the run deadline passed%s%s", url,
                        last[0] ? " after " : "", last);
      break;
    }
    bool deadline_bound = remaining <= p->timeout_ms;
    int64_t total = deadline_bound ? remaining : p->timeout_ms;
    int64_t connect = p->connect_timeout_ms < total ? p->connect_timeout_ms : total;

    CURL *c = curl_easy_init();
    if (!c) {
      r = eph_error_set(err, ENOMEM, "curl_easy_init failed");
      break;
    }
    if (call->on_attempt)
      call->on_attempt(call->opaque);
    attempt_t a = {.call = call,
                   .curl = c,
                   .limit = (size_t)p->max_response_bytes,
                   .retry_after_ms = -1,
                   .err = err};
    curl_err[0] = '\0';
    curl_easy_setopt(c, CURLOPT_URL, url);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(c, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L); /* the key goes to base_url only */
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);       /* threads: no SIGALRM for DNS */
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, call->headers);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, call->body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(call->body));
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)total);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)connect);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &a);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &a);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, curl_err);
    curl_easy_setopt(c, CURLOPT_USERAGENT, call->user_agent);
    curl_easy_setopt(c, CURLOPT_ACCEPT_ENCODING, ""); /* whatever curl can decode */

    int64_t t0 = eph_now_ms();
    CURLcode rc = curl_easy_perform(c);
    int64_t latency = eph_now_ms() - t0;
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);

    bool retryable = false;
    if (rc == CURLE_WRITE_ERROR && a.cb_error) {
      r = err && err->code ? -abs(err->code) : -EPH_E_PROTOCOL;
    } else if (rc == CURLE_WRITE_ERROR && a.too_large) {
      r = eph_error_set(err, EPH_E_PROTOCOL,
                        "model call to %s: %s larger than max_response_bytes (%lld)", url,
                        a.status_known == 1 ? "stream (or one of its events)" : "response",
                        (long long)p->max_response_bytes);
    } else if (rc == CURLE_OPERATION_TIMEDOUT && deadline_bound) {
      r = eph_error_set(err, ETIMEDOUT, "model call to %s: no %s within the run deadline (%lld ms)",
                        url, a.status_known == 1 ? "end of the stream" : "answer",
                        (long long)total);
    } else if (rc != CURLE_OK) {
      snprintf(last, sizeof last, "%s", curl_err[0] ? curl_err : curl_easy_strerror(rc));
      /* A stream already under way has been (partly) billed by the provider and its
       * events consumed: it is not silently started again. */
      retryable = curl_is_transient(rc) && a.status_known != 1;
      r = eph_error_set(err, EPH_E_UPSTREAM, "model call to %s failed%s: %s", url,
                        a.status_known == 1 ? " mid-stream" : "", last);
    } else if (status >= 200 && status < 300) {
      if (a.status_known == 1) {
        /* A stream whose last event lacks its blank line is cut short: no dispatch. */
        r = call->on_done(call->opaque, NULL, 0, latency, err);
      } else if (call->on_event && !a.status_known) {
        r = call->on_done(call->opaque, NULL, 0, latency, err); /* empty 2xx stream */
      } else {
        r = call->on_done(call->opaque, a.body ? a.body : "", a.len, latency, err);
      }
      if (r >= 0)
        eph_mhttp_log(host, call->key, EPH_LOG_DEBUG, "model call to %s: HTTP %ld in %lld ms", url,
                      status, (long long)latency);
    } else {
      api_error_text(&a, api_text, sizeof api_text);
      snprintf(last, sizeof last, "HTTP %ld: %s", status, api_text);
      retryable = status_is_retryable(status);
      r = eph_error_set(err, status >= 400 ? EPH_E_UPSTREAM : EPH_E_PROTOCOL,
                        "model call to %s: %s", url, last);
    }
    int64_t retry_after = a.retry_after_ms;
    attempt_free(&a);

    if (!retryable)
      break;
    if (attempt >= p->max_retries) {
      r = eph_error_set(err, EPH_E_UPSTREAM, "model call to %s failed after %d attempts: %s", url,
                        attempt + 1, last);
      break;
    }
    int64_t delay = retry_after >= 0 ? retry_after : backoff_ms(p, attempt);
    if (call->deadline_ms > 0 && eph_now_ms() + delay >= call->deadline_ms) {
      r = eph_error_set(err, EPH_E_UPSTREAM,
                        "model call to %s: %s; not retried: the next attempt (in %lld ms) "
                        "would start after the run deadline",
                        url, last, (long long)delay);
      break;
    }
    eph_mhttp_log(host, call->key, EPH_LOG_WARN, "model call to %s: %s; retry %d/%lld in %lld ms",
                  url, last, attempt + 1, (long long)p->max_retries, (long long)delay);
    sleep_ms(delay);
  }
  return r;
}

int
eph_mhttp_post(const eph_mhttp_policy_t *policy, const eph_host_t *host,
               const eph_mhttp_call_t *call, eph_error_t *err)
{
  int r = do_post(policy, host, call, err);
  if (r < 0 && err)
    eph_mhttp_redact(err->message, sizeof err->message, call->key);
  return r;
}
