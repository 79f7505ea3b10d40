/* model-openai: an OpenAI-compatible Chat Completions client with tool calling, over libcurl.
 *
 * One model call = POST {base_url}/chat/completions with {model, messages, tools,
 * tool_choice "auto", max_completion_tokens}. 408, 409, 429 and 5xx answers and transient
 * transport failures are retried (max_retries) with exponential backoff and full jitter,
 * honouring Retry-After / retry-after-ms (the same policy as OpenAI's own SDKs). No attempt
 * and no backoff ever runs past req->deadline_ms.
 *
 * The API key is read on the host at init (api_key_file, else the api_key_env variable). It
 * is only ever written into the Authorization header of requests to base_url: redirects are
 * not followed, plain http is refused for anything but a loopback address, and every log
 * line and error message is scrubbed of it (APIs echo a wrong key back in their 401 text).
 *
 * Thread-safe: the state is read-only after init and each call uses its own easy handle. */
#include "config.h" /* autoconf: _GNU_SOURCE, PACKAGE_VERSION */

#include <ctype.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <curl/curl.h>
#include <ephemeral/plugin.h>

#include "chat.h"

#define KEY_FILE_MAX_BYTES 16384

static const eph_config_key_t openai_keys[] = {
  {"base_url", EPH_CFG_STRING, "\"https://api.openai.com/v1\"", NULL,
   "Base URL of the OpenAI-compatible API; requests go to {base_url}/chat/completions. "
   "Plain http is refused unless the host is a loopback address or allow_plain_http is set."},
  {"api_key_file", EPH_CFG_STRING, "\"\"", NULL,
   "File holding the API key (surrounding whitespace ignored). Takes precedence over "
   "api_key_env. Should be mode 0600; a group- or world-readable file is warned about."},
  {"api_key_env", EPH_CFG_STRING, "\"OPENAI_API_KEY\"", NULL,
   "Environment variable of the host process holding the API key, used when api_key_file "
   "is empty. With both empty no Authorization header is sent (local servers)."},
  {"strip_prefix", EPH_CFG_STRING, "\"openai/\"", NULL,
   "Provider prefix removed from the request's model name before it is sent "
   "(\"openai/gpt-6-luna\" is sent as \"gpt-6-luna\")."},
  {"max_tokens_field", EPH_CFG_STRING, "\"max_completion_tokens\"", NULL,
   "Body field carrying the output-token cap: \"max_completion_tokens\" (OpenAI), "
   "\"max_tokens\" (older compatible servers) or \"\" to send none."},
  {"connect_timeout_ms", EPH_CFG_INT, "10000", "ms",
   "Connection set-up timeout of one attempt (never past the call's deadline)."},
  {"timeout_ms", EPH_CFG_INT, "120000", "ms",
   "Whole-attempt timeout; a timed-out attempt is retried if the deadline allows."},
  {"max_retries", EPH_CFG_INT, "3", NULL,
   "Retries after a 408, 409, 429 or 5xx answer or a transient transport failure."},
  {"backoff_initial_ms", EPH_CFG_INT, "500", "ms",
   "First retry delay; it doubles on each retry (full jitter: a random delay between half "
   "and all of it). A Retry-After header replaces it."},
  {"backoff_max_ms", EPH_CFG_INT, "20000", "ms", "Cap of the computed retry delay."},
  {"max_response_bytes", EPH_CFG_INT, "8388608", "bytes",
   "Largest response body accepted; a longer one is a protocol error."},
  {"allow_plain_http", EPH_CFG_BOOL, "false", NULL,
   "Allow an http:// base_url to a non-loopback host (the API key would travel in clear)."},
  {0},
};

typedef struct openai {
  const eph_host_t *host;
  char *url;         /* {base_url}/chat/completions */
  char *api_key;     /* NULL: send no Authorization header */
  char *auth_header; /* "Authorization: Bearer <key>", or NULL */
  char *no_key_reason; /* set when a key source was configured but held nothing */
  char *strip_prefix;
  char *max_tokens_field;
  int64_t connect_timeout_ms, timeout_ms, max_retries, backoff_initial_ms, backoff_max_ms;
  int64_t max_response_bytes;
} openai_t;

static void
freep(void *p)
{
  free(*(void **)p);
}
#define cleanup_free __attribute__((cleanup(freep)))
static void
json_putp(json_object **o)
{
  if (*o)
    json_object_put(*o);
}
#define cleanup_json __attribute__((cleanup(json_putp)))
#define steal_pointer(pp) ({ __typeof__(*(pp)) _p = *(pp); *(pp) = NULL; _p; })

/* Overwrites secrets before free so they do not linger in freed heap. */
static void
free_secret(char *s)
{
  if (!s)
    return;
  explicit_bzero(s, strlen(s));
  free(s);
}

/* Replaces in msg (NUL-terminated, at most EPH_ERROR_MESSAGE_BYTES) every run of at least
 * min(12, strlen(key)) characters that also appears in key with "[redacted]": an API that
 * echoes part of a wrong key must not get it into logs. */
static void
redact(char *msg, size_t size, const char *key)
{
  if (!key || !*key || !msg)
    return;
  size_t klen = strlen(key), minlen = klen < 12 ? klen : 12;
  char out[EPH_ERROR_MESSAGE_BYTES];
  size_t o = 0;
  for (size_t i = 0; msg[i] && o + 1 < sizeof out;) {
    size_t best = 0;
    for (size_t j = 0; j < klen; j++) {
      size_t m = 0;
      while (msg[i + m] && j + m < klen && msg[i + m] == key[j + m])
        m++;
      if (m > best)
        best = m;
    }
    if (best >= minlen) {
      static const char mark[] = "[redacted]";
      for (size_t k = 0; mark[k] && o + 1 < sizeof out; k++)
        out[o++] = mark[k];
      i += best;
    } else {
      out[o++] = msg[i++];
    }
  }
  out[o] = '\0';
  snprintf(msg, size, "%s", out);
}

__attribute__((format(printf, 3, 4))) static void
log_safe(const openai_t *s, eph_log_level_t level, const char *fmt, ...)
{
  char buf[EPH_ERROR_MESSAGE_BYTES];
  va_list ap;
  if (!s->host || !s->host->log)
    return;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  redact(buf, sizeof buf, s->api_key);
  s->host->log(level, "%s", buf);
}

/* A short printable excerpt of a body for error messages (control bytes become '.'). */
static void
excerpt(const char *body, size_t len, char *out, size_t size)
{
  size_t n = len < size - 4 ? len : size - 4;
  for (size_t i = 0; i < n; i++)
    out[i] = isprint((unsigned char)body[i]) ? body[i] : '.';
  if (n < len)
    memcpy(out + n, "...", 4);
  else
    out[n] = '\0';
}

static bool
is_loopback_host(const char *host)
{
  return strcmp(host, "127.0.0.1") == 0 || strcmp(host, "localhost") == 0 ||
         strcmp(host, "[::1]") == 0 || strcmp(host, "::1") == 0 ||
         strncmp(host, "127.", 4) == 0;
}

static int
check_base_url(const char *base_url, bool allow_plain_http, eph_error_t *err)
{
  CURLU *u = curl_url();
  char *scheme = NULL, *host = NULL;
  int r = 0;
  if (!u)
    return eph_error_set(err, ENOMEM, "base_url: out of memory");
  if (curl_url_set(u, CURLUPART_URL, base_url, 0) != CURLUE_OK ||
      curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
      curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK) {
    r = eph_error_set(err, EPH_E_CONFIG, "base_url \"%s\": not a valid URL", base_url);
  } else if (strcmp(scheme, "https") != 0 && strcmp(scheme, "http") != 0) {
    r = eph_error_set(err, EPH_E_CONFIG, "base_url \"%s\": scheme must be https (or http)",
                      base_url);
  } else if (strcmp(scheme, "http") == 0 && !allow_plain_http && !is_loopback_host(host)) {
    r = eph_error_set(err, EPH_E_CONFIG,
                      "base_url \"%s\": plain http to a non-loopback host would send the API key "
                      "in clear; use https or set allow_plain_http",
                      base_url);
  }
  curl_free(scheme);
  curl_free(host);
  curl_url_cleanup(u);
  return r;
}

static char *
trim(char *s)
{
  while (isspace((unsigned char)*s))
    s++;
  size_t n = strlen(s);
  while (n > 0 && isspace((unsigned char)s[n - 1]))
    s[--n] = '\0';
  return s;
}

/* A key is one header token: printable ASCII without spaces, or it could split the header. */
static int
check_key_chars(const char *key, const char *source, eph_error_t *err)
{
  for (const char *p = key; *p; p++)
    if (!isgraph((unsigned char)*p))
      return eph_error_set(err, EPH_E_CONFIG,
                           "%s: the API key contains a space or control character", source);
  return 0;
}

static int
read_key_file(openai_t *s, const char *path, eph_error_t *err)
{
  struct stat st;
  FILE *f = fopen(path, "re");
  if (!f)
    return eph_error_set(err, errno == ENOENT ? EPH_E_CONFIG : errno,
                         "api_key_file \"%s\": %s", path, strerror(errno));
  if (fstat(fileno(f), &st) == 0 && (st.st_mode & 077))
    log_safe(s, EPH_LOG_WARN, "api_key_file \"%s\" is readable by group or others (mode %03o)",
             path, (unsigned)(st.st_mode & 0777));
  char *buf = calloc(1, KEY_FILE_MAX_BYTES + 1);
  if (!buf) {
    fclose(f);
    return eph_error_set(err, ENOMEM, "api_key_file \"%s\": out of memory", path);
  }
  size_t n = fread(buf, 1, KEY_FILE_MAX_BYTES + 1, f);
  int read_err = ferror(f);
  fclose(f);
  if (read_err || n > KEY_FILE_MAX_BYTES) {
    free_secret(buf);
    return eph_error_set(err, EPH_E_CONFIG, "api_key_file \"%s\": %s", path,
                         read_err ? "read error" : "larger than 16 KiB");
  }
  char *key = trim(buf);
  if (!*key) {
    free_secret(buf);
    return eph_error_set(err, EPH_E_CONFIG, "api_key_file \"%s\": file is empty", path);
  }
  int r = check_key_chars(key, path, err);
  if (r == 0 && !(s->api_key = strdup(key)))
    r = eph_error_set(err, ENOMEM, "api_key_file: out of memory");
  free_secret(buf);
  return r;
}

static void
openai_fini(void *state)
{
  openai_t *s = state;
  if (!s)
    return;
  free(s->url);
  free_secret(s->api_key);
  free_secret(s->auth_header);
  free(s->no_key_reason);
  free(s->strip_prefix);
  free(s->max_tokens_field);
  free(s);
  curl_global_cleanup();
}

static int
openai_init(const eph_host_t *host, const config_setting_t *config, void **state, eph_error_t *err)
{
  const char *base_url, *key_file, *key_env, *strip, *mt_field;
  int allow_http = 0, r;

  /* curl_global_init is reference counted: balanced by curl_global_cleanup in fini. */
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
    return eph_error_set(err, EIO, "curl_global_init failed");
  openai_t *s = calloc(1, sizeof *s);
  if (!s) {
    curl_global_cleanup();
    return eph_error_set(err, ENOMEM, "out of memory");
  }
  s->host = host;

  if ((r = host->cfg_string(config, "base_url", "https://api.openai.com/v1", &base_url, err)) < 0 ||
      (r = host->cfg_string(config, "api_key_file", "", &key_file, err)) < 0 ||
      (r = host->cfg_string(config, "api_key_env", "OPENAI_API_KEY", &key_env, err)) < 0 ||
      (r = host->cfg_string(config, "strip_prefix", "openai/", &strip, err)) < 0 ||
      (r = host->cfg_string(config, "max_tokens_field", "max_completion_tokens", &mt_field, err)) <
          0 ||
      (r = host->cfg_int(config, "connect_timeout_ms", 10000, &s->connect_timeout_ms, err)) < 0 ||
      (r = host->cfg_int(config, "timeout_ms", 120000, &s->timeout_ms, err)) < 0 ||
      (r = host->cfg_int(config, "max_retries", 3, &s->max_retries, err)) < 0 ||
      (r = host->cfg_int(config, "backoff_initial_ms", 500, &s->backoff_initial_ms, err)) < 0 ||
      (r = host->cfg_int(config, "backoff_max_ms", 20000, &s->backoff_max_ms, err)) < 0 ||
      (r = host->cfg_int(config, "max_response_bytes", 8 << 20, &s->max_response_bytes, err)) <
          0 ||
      (r = host->cfg_bool(config, "allow_plain_http", 0, &allow_http, err)) < 0)
    goto fail;

  if (s->connect_timeout_ms <= 0 || s->timeout_ms <= 0 || s->max_retries < 0 ||
      s->max_retries > 100 || s->backoff_initial_ms < 0 || s->backoff_max_ms < 0 ||
      s->max_response_bytes < 1024) {
    r = eph_error_set(err, EPH_E_CONFIG,
                      "timeouts must be positive, max_retries within 0..100, backoffs not "
                      "negative and max_response_bytes at least 1024");
    goto fail;
  }
  if ((r = check_base_url(base_url, allow_http, err)) < 0)
    goto fail;

  size_t blen = strlen(base_url);
  while (blen > 0 && base_url[blen - 1] == '/')
    blen--;
  if (asprintf(&s->url, "%.*s/chat/completions", (int)blen, base_url) < 0) {
    s->url = NULL;
    r = eph_error_set(err, ENOMEM, "out of memory");
    goto fail;
  }
  s->strip_prefix = strdup(strip);
  s->max_tokens_field = strdup(mt_field);
  if (!s->strip_prefix || !s->max_tokens_field) {
    r = eph_error_set(err, ENOMEM, "out of memory");
    goto fail;
  }

  if (*key_file) {
    if ((r = read_key_file(s, key_file, err)) < 0)
      goto fail;
  } else if (*key_env) {
    const char *v = getenv(key_env);
    cleanup_free char *copy = v ? strdup(v) : NULL;
    char *k = copy ? trim(copy) : NULL;
    if (k && *k) {
      if ((r = check_key_chars(k, key_env, err)) < 0) {
        explicit_bzero(copy, strlen(copy));
        goto fail;
      }
      s->api_key = strdup(k);
    }
    if (copy)
      explicit_bzero(copy, strlen(copy));
    if (!s->api_key && asprintf(&s->no_key_reason,
                                "no API key: environment variable %s is not set and "
                                "api_key_file is empty",
                                key_env) < 0)
      s->no_key_reason = NULL;
  }
  if (s->api_key && asprintf(&s->auth_header, "Authorization: Bearer %s", s->api_key) < 0) {
    s->auth_header = NULL;
    r = eph_error_set(err, ENOMEM, "out of memory");
    goto fail;
  }
  if (s->no_key_reason)
    log_safe(s, EPH_LOG_DEBUG, "%s; model calls will fail until it is set", s->no_key_reason);

  *state = s;
  return 0;
fail:
  openai_fini(s);
  return r;
}

/* ---------------------------------------------------------------- one HTTP attempt */

typedef struct attempt {
  char *body;
  size_t len, cap, limit;
  bool too_large;
  int64_t retry_after_ms; /* -1: no header */
} attempt_t;

static size_t
on_body(char *data, size_t size, size_t nmemb, void *opaque)
{
  attempt_t *a = opaque;
  size_t n = size * nmemb;
  if (a->len + n > a->limit) {
    a->too_large = true;
    return 0; /* aborts the transfer with CURLE_WRITE_ERROR */
  }
  if (a->len + n + 1 > a->cap) {
    size_t cap = a->cap ? a->cap : 4096;
    while (cap < a->len + n + 1)
      cap *= 2;
    char *p = realloc(a->body, cap);
    if (!p)
      return 0;
    a->body = p;
    a->cap = cap;
  }
  memcpy(a->body + a->len, data, n);
  a->len += n;
  a->body[a->len] = '\0';
  return n;
}

/* Reads Retry-After (seconds or an HTTP date, RFC 9110 10.2.3) and OpenAI's retry-after-ms,
 * the latter winning as it is more precise. */
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
  char *value = trim(colon + 1);
  char *end = NULL;
  if (strcasecmp(trim(line), "retry-after-ms") == 0) {
    double ms = strtod(value, &end);
    if (end != value && ms >= 0 && ms < 1e9)
      a->retry_after_ms = (int64_t)ms;
  } else if (strcasecmp(trim(line), "retry-after") == 0 && a->retry_after_ms < 0) {
    long secs = strtol(value, &end, 10);
    if (end != value && *end == '\0' && secs >= 0 && secs < 1000000) {
      a->retry_after_ms = (int64_t)secs * 1000;
    } else {
      time_t when = curl_getdate(value, NULL);
      if (when > 0) {
        time_t now = time(NULL);
        a->retry_after_ms = when > now ? (int64_t)(when - now) * 1000 : 0;
      }
    }
  }
  return n;
}

/* The API's own error text ({"error":{"message":...}}), else an excerpt of the body. */
static void
api_error_text(const attempt_t *a, char *out, size_t size)
{
  json_object *root = a->body ? json_tokener_parse(a->body) : NULL;
  json_object *e = NULL;
  const char *msg = NULL;
  if (root && json_object_object_get_ex(root, "error", &e)) {
    msg = json_object_is_type(e, json_type_string) ? json_object_get_string(e)
                                                   : eph_chat_get_string(e, "message");
  }
  if (msg)
    snprintf(out, size, "%s", msg);
  else if (a->body && a->len)
    excerpt(a->body, a->len, out, size < 200 ? size : 200);
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
backoff_ms(const openai_t *s, int retry)
{
  int64_t d = s->backoff_initial_ms;
  for (int i = 0; i < retry && d < s->backoff_max_ms; i++)
    d *= 2;
  if (d > s->backoff_max_ms)
    d = s->backoff_max_ms;
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

static const char *
strip_model(const openai_t *s, const char *model)
{
  size_t n = strlen(s->strip_prefix);
  if (n && strncmp(model, s->strip_prefix, n) == 0)
    return model + n;
  return model;
}

static char *
build_body(const openai_t *s, const eph_model_request_t *req, eph_error_t *err)
{
  cleanup_json json_object *body = json_object_new_object();
  json_object_object_add(body, "model", json_object_new_string(strip_model(s, req->model)));
  json_object_object_add(body, "messages", json_object_get(req->messages));
  if (req->tools && json_object_is_type(req->tools, json_type_array) &&
      json_object_array_length(req->tools) > 0) {
    json_object_object_add(body, "tools", json_object_get(req->tools));
    json_object_object_add(body, "tool_choice", json_object_new_string("auto"));
  }
  if (*s->max_tokens_field && req->max_output_tokens > 0)
    json_object_object_add(body, s->max_tokens_field,
                           json_object_new_int64(req->max_output_tokens));
  const char *text =
      json_object_to_json_string_ext(body, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
  char *copy = text ? strdup(text) : NULL;
  if (!copy)
    eph_error_set(err, ENOMEM, "out of memory building the request body");
  return copy;
}

/* The request loop. Error messages may quote the API; the caller scrubs the key. */
/* Reads a 2xx body: exactly one JSON object (only whitespace after it), then the Chat
 * Completions fields. On success resp->raw holds the body with x_latency_ms added. A
 * function of its own so tests/fuzz/fuzz-openai.c reaches it without a server. */
static int
parse_ok_body(const openai_t *s, const attempt_t *a, long status, int64_t latency,
              eph_model_response_t *resp, eph_error_t *err)
{
  int r;
  json_tokener *tok = json_tokener_new();
  json_object *root = NULL;
  enum json_tokener_error jerr = json_tokener_error_parse_eof;
  if (tok && a->body) {
    root = json_tokener_parse_ex(tok, a->body, (int)a->len);
    jerr = json_tokener_get_error(tok);
    if (root && tok->char_offset < (int)a->len) {
      /* Trailing garbage after the object: only whitespace is allowed. */
      for (size_t i = (size_t)tok->char_offset; i < a->len; i++)
        if (!isspace((unsigned char)a->body[i])) {
          json_object_put(root);
          root = NULL;
          jerr = json_tokener_error_parse_unexpected;
          break;
        }
    }
  }
  if (tok)
    json_tokener_free(tok);
  if (!root) {
    char ex[120];
    excerpt(a->body ? a->body : "", a->len, ex, sizeof ex);
    r = eph_error_set(err, EPH_E_PROTOCOL,
                      "model call to %s: HTTP %ld body is not valid JSON (%s): %s", s->url,
                      status,
                      jerr == json_tokener_continue ? "truncated"
                                                    : json_tokener_error_desc(jerr),
                      ex);
  } else if ((r = eph_chat_parse_response(root, s->url, resp, err)) < 0) {
    json_object_put(root);
  } else {
    /* Recorded with the body so a replay can pace itself like the original run. */
    json_object_object_add(root, "x_latency_ms", json_object_new_int64(latency));
    resp->raw = root;
    log_safe(s, EPH_LOG_DEBUG, "model call: HTTP %ld in %lld ms, %llu+%llu tokens, %s",
             status, (long long)latency, (unsigned long long)resp->input_tokens,
             (unsigned long long)resp->output_tokens, resp->finish_reason);
    r = 0;
  }
  return r;
}

static int
do_complete(openai_t *s, const eph_model_request_t *req, eph_model_response_t *resp,
            eph_error_t *err)
{
  char curl_err[CURL_ERROR_SIZE], api_text[512], last[EPH_ERROR_MESSAGE_BYTES];
  int r;

  if (!req || !req->model || !req->messages ||
      !json_object_is_type(req->messages, json_type_array))
    return eph_error_set(err, EINVAL, "model request: model and a messages array are required");
  if (s->no_key_reason)
    return eph_error_set(err, EPH_E_CONFIG, "%s", s->no_key_reason);

  cleanup_free char *body = build_body(s, req, err);
  if (!body)
    return -ENOMEM;

  struct curl_slist *headers = NULL, *h;
  h = curl_slist_append(headers, "Content-Type: application/json");
  headers = h ? h : headers;
  if (h && (h = curl_slist_append(headers, "Accept: application/json")))
    headers = h;
  if (h && s->auth_header && (h = curl_slist_append(headers, s->auth_header)))
    headers = h;
  if (!h) {
    curl_slist_free_all(headers);
    return eph_error_set(err, ENOMEM, "out of memory building request headers");
  }

  last[0] = '\0';
  r = 0;
  for (int attempt = 0;; attempt++) {
    int64_t now = eph_now_ms();
    int64_t remaining = req->deadline_ms > 0 ? req->deadline_ms - now : INT64_MAX;
    if (remaining <= 0) {
      r = eph_error_set(err, ETIMEDOUT, "model call to %s: the run deadline passed%s%s", s->url,
                        last[0] ? " after " : "", last);
      break;
    }
    bool deadline_bound = remaining <= s->timeout_ms;
    int64_t total = deadline_bound ? remaining : s->timeout_ms;
    int64_t connect = s->connect_timeout_ms < total ? s->connect_timeout_ms : total;

    CURL *c = curl_easy_init();
    if (!c) {
      r = eph_error_set(err, ENOMEM, "curl_easy_init failed");
      break;
    }
    attempt_t a = {.limit = (size_t)s->max_response_bytes, .retry_after_ms = -1};
    curl_err[0] = '\0';
    curl_easy_setopt(c, CURLOPT_URL, s->url);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(c, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L); /* the key goes to base_url only */
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);       /* threads: no SIGALRM for DNS */
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)total);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)connect);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &a);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &a);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, curl_err);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "ephemeral-model-openai/" PACKAGE_VERSION);
    curl_easy_setopt(c, CURLOPT_ACCEPT_ENCODING, ""); /* whatever curl can decode */

    int64_t t0 = eph_now_ms();
    CURLcode rc = curl_easy_perform(c);
    int64_t latency = eph_now_ms() - t0;
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);

    bool retryable = false;
    if (rc == CURLE_WRITE_ERROR && a.too_large) {
      r = eph_error_set(err, EPH_E_PROTOCOL,
                        "model call to %s: response larger than max_response_bytes (%lld)",
                        s->url, (long long)s->max_response_bytes);
    } else if (rc == CURLE_OPERATION_TIMEDOUT && deadline_bound) {
      r = eph_error_set(err, ETIMEDOUT,
                        "model call to %s: no answer within the run deadline (%lld ms)", s->url,
                        (long long)total);
    } else if (rc != CURLE_OK) {
      snprintf(last, sizeof last, "%s", curl_err[0] ? curl_err : curl_easy_strerror(rc));
      retryable = curl_is_transient(rc);
      r = eph_error_set(err, EPH_E_UPSTREAM, "model call to %s failed: %s", s->url, last);
    } else if (status >= 200 && status < 300) {
      r = parse_ok_body(s, &a, status, latency, resp, err);
    } else {
      api_error_text(&a, api_text, sizeof api_text);
      snprintf(last, sizeof last, "HTTP %ld: %s", status, api_text);
      retryable = status_is_retryable(status);
      r = eph_error_set(err, status >= 400 ? EPH_E_UPSTREAM : EPH_E_PROTOCOL,
                        "model call to %s: %s", s->url, last);
    }
    free(a.body);

    if (!retryable)
      break;
    if (attempt >= s->max_retries) {
      r = eph_error_set(err, EPH_E_UPSTREAM, "model call to %s failed after %d attempts: %s",
                        s->url, attempt + 1, last);
      break;
    }
    int64_t delay = a.retry_after_ms >= 0 ? a.retry_after_ms : backoff_ms(s, attempt);
    if (req->deadline_ms > 0 && eph_now_ms() + delay >= req->deadline_ms) {
      r = eph_error_set(err, EPH_E_UPSTREAM,
                        "model call to %s: %s; not retried: the next attempt (in %lld ms) "
                        "would start after the run deadline",
                        s->url, last, (long long)delay);
      break;
    }
    log_safe(s, EPH_LOG_WARN, "model call to %s: %s; retry %d/%lld in %lld ms", s->url, last,
             attempt + 1, (long long)s->max_retries, (long long)delay);
    sleep_ms(delay);
  }
  curl_slist_free_all(headers);
  return r;
}

static int
openai_complete(void *state, const eph_model_request_t *req, eph_model_response_t *resp,
                eph_error_t *err)
{
  openai_t *s = state;
  resp->message = resp->raw = NULL;
  resp->finish_reason[0] = '\0';
  resp->input_tokens = resp->output_tokens = 0;
  int r = do_complete(s, req, resp, err);
  if (r < 0 && err)
    redact(err->message, sizeof err->message, s->api_key);
  return r;
}

static const eph_model_ops_t openai_ops = {
  .struct_size = sizeof(eph_model_ops_t),
  .complete = openai_complete,
};

EPH_PLUGIN_EXPORT = {
  .abi_major = EPH_ABI_MAJOR,
  .abi_minor = EPH_ABI_MINOR,
  .struct_size = sizeof(eph_plugin_t),
  .name = "model-openai",
  .kind = EPH_KIND_MODEL,
  .version = PACKAGE_VERSION,
  .description = "OpenAI-compatible Chat Completions with tool calling (libcurl)",
  .config_keys = openai_keys,
  .init = openai_init,
  .fini = openai_fini,
  .ops = &openai_ops,
};
