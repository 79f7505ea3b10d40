/* model-anthropic: the Anthropic Messages API with tool use, over libcurl.
 *
 * One model call = POST {base_url}/messages with the headers x-api-key and
 * anthropic-version, the body of eph_messages_request() (sdk/support): the core's Chat
 * Completions conversation as Anthropic messages, tool calls as tool_use / tool_result
 * blocks. With `stream = true` the Server-Sent Events are assembled into the message
 * object a non-streaming call returns, so both give the same answer and --record writes
 * the same.
 *
 * A pause_turn stop (the API paused a long turn) is continued as the API documents: the
 * paused assistant content is sent back as-is and the answers are joined, their usage
 * summed, within the same call and deadline (at most max_continuations times).
 *
 * Retries (429, 529 overloaded, 5xx, honouring retry-after), deadlines and key handling are
 * the shared transport's (sdk/support/model_http.h): the key is only ever written into the
 * x-api-key header of requests to base_url and is scrubbed from every message.
 *
 * Thread-safe: the state is read-only after init and each call uses its own easy handle. */
#include "config.h" /* autoconf: _GNU_SOURCE, PACKAGE_VERSION */

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <ephemeral/plugin.h>

#include "support/model_http.h"
#include "support/model_messages.h"

static const eph_config_key_t anthropic_keys[] = {
    {"base_url", EPH_CFG_STRING, "\"https://api.anthropic.com/v1\"", NULL,
     "Base URL of the Anthropic API; requests go to {base_url}/messages. Plain http is "
     "refused unless the host is a loopback address or allow_plain_http is set."},
    {"api_key_file", EPH_CFG_STRING, "\"\"", NULL,
     "File holding the API key (surrounding whitespace ignored). Takes precedence over "
     "api_key_env. Should be mode 0600; a group- or world-readable file is warned about."},
    {"api_key_env", EPH_CFG_STRING, "\"ANTHROPIC_API_KEY\"", NULL,
     "Environment variable of the host process holding the API key (sent as x-api-key), "
     "used when api_key_file is empty."},
    {"strip_prefix", EPH_CFG_STRING, "\"anthropic/\"", NULL,
     "Provider prefix of the models this plugin serves, removed before sending "
     "(\"anthropic/claude-sonnet-4-5\" is sent as \"claude-sonnet-4-5\")."},
    {"anthropic_version", EPH_CFG_STRING, "\"2023-06-01\"", NULL,
     "Value of the anthropic-version header (the API version the plugin speaks)."},
    {"stream", EPH_CFG_BOOL, "false", NULL,
     "Ask for a Server-Sent Events stream (stream: true). The streamed message is assembled "
     "into the same result as a non-streamed one; a stream cut short is an error."},
    {"prompt_cache", EPH_CFG_BOOL, "true", NULL,
     "Mark the tools and the conversation so far with cache_control (ephemeral) on every "
     "call: the next call of the run reads that prefix from Anthropic's prompt cache. Cache "
     "writes and reads are billed at their own prices (pricing.models)."},
    {"max_continuations", EPH_CFG_INT, "3", NULL,
     "How many times one call continues a turn the API paused (stop_reason pause_turn).",
     EPH_CFG_RANGE(0, 100)},
    EPH_MHTTP_POLICY_KEYS("408, 409, 429, 529 (overloaded) or other 5xx"),
    {0},
};

typedef struct anthropic {
  const eph_host_t *host;
  eph_mhttp_policy_t policy;
  char *url; /* {base_url}/messages */
  char *prefix;
  char *api_key;
  char *key_header;     /* "x-api-key: <key>" */
  char *version_header; /* "anthropic-version: ..." */
  char *no_key_reason;
  int stream;
  int prompt_cache;
  int64_t max_continuations;
} anthropic_t;

static void
anthropic_fini(void *state)
{
  anthropic_t *s = state;
  if (!s)
    return;
  free(s->url);
  free(s->prefix);
  eph_free_secret(s->api_key);
  eph_free_secret(s->key_header);
  free(s->version_header);
  free(s->no_key_reason);
  free(s);
  curl_global_cleanup();
}

static int
anthropic_init(const eph_host_t *host, const config_setting_t *config, void **state,
               eph_error_t *err)
{
  const char *base_url, *key_file, *key_env, *prefix, *version;
  int allow_http = 0, r;
  void *mem;
  if ((r = eph_mhttp_state_new(sizeof(anthropic_t), &mem, err)) < 0)
    return r;
  anthropic_t *s = mem;
  s->host = host;
  if ((r = eph_mhttp_policy_read(host, config, &s->policy, err)) < 0 ||
      (r = host->cfg_string(config, "base_url", "https://api.anthropic.com/v1", &base_url, err)) <
          0 ||
      (r = host->cfg_string(config, "api_key_file", "", &key_file, err)) < 0 ||
      (r = host->cfg_string(config, "api_key_env", "ANTHROPIC_API_KEY", &key_env, err)) < 0 ||
      (r = host->cfg_string(config, "strip_prefix", "anthropic/", &prefix, err)) < 0 ||
      (r = host->cfg_string(config, "anthropic_version", "2023-06-01", &version, err)) < 0 ||
      (r = host->cfg_bool(config, "stream", 0, &s->stream, err)) < 0 ||
      (r = host->cfg_bool(config, "prompt_cache", 1, &s->prompt_cache, err)) < 0 ||
      (r = host->cfg_int(config, "max_continuations", 3, &s->max_continuations, err)) < 0 ||
      (r = host->cfg_bool(config, "allow_plain_http", 0, &allow_http, err)) < 0)
    goto fail;
  if (!*prefix) {
    r = eph_error_set(err, EPH_E_CONFIG, "strip_prefix must not be empty (e.g. \"anthropic/\")");
    goto fail;
  }
  for (const char *p = version; *p; p++)
    if (!((*p >= '0' && *p <= '9') || *p == '-')) {
      r = eph_error_set(err, EPH_E_CONFIG, "anthropic_version \"%s\": digits and '-' only",
                        version);
      goto fail;
    }
  if ((r = eph_mhttp_check_base_url(base_url, allow_http, err)) < 0 ||
      (r = eph_mhttp_endpoint(base_url, "messages", &s->url, err)) < 0)
    goto fail;
  if (asprintf(&s->version_header, "anthropic-version: %s", version) < 0 ||
      !(s->prefix = strdup(prefix))) {
    s->version_header = NULL;
    r = eph_error_set(err, ENOMEM, "out of memory");
    goto fail;
  }
  if ((r = eph_mhttp_key_header(host, "model-anthropic", key_file, key_env, "x-api-key: ", true,
                                &s->api_key, &s->key_header, &s->no_key_reason, err)) < 0)
    goto fail;
  *state = s;
  return 0;
fail:
  anthropic_fini(s);
  return r;
}

static int
anthropic_serves(void *state, const char *model)
{
  anthropic_t *s = state;
  size_t n = strlen(s->prefix);
  return model && strncmp(model, s->prefix, n) == 0 ? 1 + (int)n : 0;
}

/* Ready when the key is there (every Anthropic call needs one). */
static int
anthropic_ready(void *state, const char *model, eph_error_t *err)
{
  anthropic_t *s = state;
  if (model && !anthropic_serves(s, model))
    return eph_error_set(err, EINVAL, "model '%s' does not start with \"%s\"", model, s->prefix);
  if (s->no_key_reason)
    return eph_error_set(err, EPH_E_CONFIG, "%s", s->no_key_reason);
  return 0;
}

typedef struct call_ctx {
  anthropic_t *s;
  eph_model_response_t *resp;
  eph_messages_stream_t st;
  int attempts; /* attempts started so far */
} call_ctx_t;

static void
on_attempt(void *opaque)
{
  call_ctx_t *c = opaque;
  eph_messages_stream_reset(&c->st);
  eph_mhttp_attempt_begins(&c->attempts, c->st.on_text, c->st.text_opaque);
}

static int
on_event(void *opaque, const char *event, const char *data, size_t len, eph_error_t *err)
{
  call_ctx_t *c = opaque;
  return eph_messages_stream_event(&c->st, event, data, len, c->s->url, err);
}

static int
on_done(void *opaque, const char *body, size_t len, int64_t latency_ms, eph_error_t *err)
{
  call_ctx_t *c = opaque;
  json_object *root = c->s->stream ? eph_messages_stream_finish(&c->st, c->s->url, err)
                                   : eph_mhttp_parse_body(body, len, c->s->url, err);
  return eph_mhttp_answer(root, eph_messages_parse, c->s->url, latency_ms, c->resp, err);
}

/* One POST of the conversation (plus `extra`, the paused turns) into resp. */
static int
post_once(anthropic_t *s, const eph_model_request_t *req, json_object *extra,
          const struct curl_slist *headers, eph_model_response_t *resp, eph_error_t *err)
{
  json_object *body =
      eph_messages_request(req->model + strlen(s->prefix), req->messages, req->tools,
                           req->max_output_tokens, s->stream, extra, err);
  if (!body)
    return err && err->code ? -err->code : -EINVAL;
  if (s->prompt_cache)
    eph_messages_mark_cache(body);
  char *text = eph_mhttp_body_text(body, err);
  if (!text)
    return -ENOMEM;
  call_ctx_t ctx = {.s = s, .resp = resp};
  if (EPH_MODEL_REQUEST_HAS_DELTA(req) && req->on_delta) { /* text as it streams */
    ctx.st.on_text = req->on_delta;
    ctx.st.text_opaque = req->delta_opaque;
  }
  eph_mhttp_call_t call = {
      .url = s->url,
      .headers = headers,
      .body = text,
      .key = s->api_key,
      .deadline_ms = req->deadline_ms,
      .user_agent = "ephemeral-model-anthropic/" PACKAGE_VERSION,
      .on_event = s->stream ? on_event : NULL,
      .on_attempt = on_attempt,
      .on_done = on_done,
      .opaque = &ctx,
  };
  int r = eph_mhttp_post(&s->policy, s->host, &call, err);
  eph_messages_stream_reset(&ctx.st);
  free(text);
  return r;
}

/* Joins a continuation's answer onto the first: content blocks appended (the recorded raw
 * message stays one message object), usage summed, the last stop reason kept. */
static void
join(eph_model_response_t *into, eph_model_response_t *next, const char *where)
{
  json_object *a = NULL, *b = NULL, *ua = NULL, *ub = NULL;
  json_object_object_get_ex(into->raw, "content", &a);
  json_object_object_get_ex(next->raw, "content", &b);
  for (size_t i = 0; a && b && i < json_object_array_length(b); i++)
    json_object_array_add(a, json_object_get(json_object_array_get_idx(b, i)));
  json_object_object_get_ex(into->raw, "usage", &ua);
  json_object_object_get_ex(next->raw, "usage", &ub);
  if (ua && ub) {
    json_object_object_foreach(ub, k, v) {
      json_object *old = NULL;
      if (json_object_is_type(v, json_type_int) && json_object_object_get_ex(ua, k, &old) &&
          json_object_is_type(old, json_type_int))
        json_object_object_add(
            ua, k, json_object_new_int64(json_object_get_int64(old) + json_object_get_int64(v)));
    }
  }
  json_object *sr = NULL;
  if (json_object_object_get_ex(next->raw, "stop_reason", &sr))
    json_object_object_add(into->raw, "stop_reason", json_object_get(sr));
  /* Re-read the joined message so message, reason and counts all describe it. */
  json_object *raw = json_object_get(into->raw);
  eph_model_response_clear(into);
  eph_error_t ignored = {0};
  if (eph_messages_parse(raw, where, into, &ignored) == 0)
    into->raw = raw;
  else
    json_object_put(raw);
}

static int
anthropic_complete(void *state, const eph_model_request_t *req, eph_model_response_t *resp,
                   eph_error_t *err)
{
  anthropic_t *s = state;
  int r = eph_chat_response_begin(req, resp, err);
  if (r < 0)
    return r;
  if (!anthropic_serves(s, req->model))
    return eph_error_set(err, EINVAL, "model '%s' does not start with \"%s\"", req->model,
                         s->prefix);
  if (s->no_key_reason)
    return eph_error_set(err, EPH_E_CONFIG, "%s", s->no_key_reason);

  struct curl_slist *headers =
      eph_mhttp_json_headers(s->stream, s->version_header, s->key_header, err);
  if (!headers)
    return -ENOMEM;

  r = post_once(s, req, NULL, headers, resp, err);
  json_object *extra = NULL;
  for (int64_t k = 0;
       r == 0 && strcmp(resp->finish_reason, "pause_turn") == 0 && k < s->max_continuations; k++) {
    json_object *content = NULL;
    json_object_object_get_ex(resp->raw, "content", &content);
    if (!extra)
      extra = json_object_new_array();
    /* The paused turn so far, sent back as-is; each round repeats it whole. */
    json_object *m = json_object_new_object();
    json_object_object_add(m, "role", json_object_new_string("assistant"));
    json_object_object_add(m, "content", json_object_get(content));
    while (json_object_array_length(extra))
      json_object_array_del_idx(extra, 0, 1);
    json_object_array_add(extra, m);
    eph_model_response_t next = {.struct_size = sizeof next};
    if ((r = post_once(s, req, extra, headers, &next, err)) == 0)
      join(resp, &next, s->url);
    eph_model_response_clear(&next);
    if (r == 0 && !resp->message)
      r = eph_error_set(err, EPH_E_PROTOCOL, "%s: a continued turn could not be joined", s->url);
  }
  if (r == 0 && strcmp(resp->finish_reason, "pause_turn") == 0)
    /* The answer stays marked pause_turn: the core ends the run (reason pause_limit)
     * instead of taking an unfinished turn for a final answer. */
    eph_mhttp_log(s->host, NULL, EPH_LOG_WARN,
                  "model-anthropic: the turn is still paused after %" PRId64
                  " continuations (max_continuations)",
                  s->max_continuations);
  if (extra)
    json_object_put(extra);
  curl_slist_free_all(headers);
  return eph_mhttp_complete_end(s->host, s->api_key, resp, r);
}

static const eph_model_ops_t anthropic_ops = {
    .struct_size = sizeof(eph_model_ops_t),
    .complete = anthropic_complete,
    .serves = anthropic_serves,
    .ready = anthropic_ready,
};

EPH_PLUGIN_EXPORT = {
    .abi_major = EPH_ABI_MAJOR,
    .abi_minor = EPH_ABI_MINOR,
    .struct_size = sizeof(eph_plugin_t),
    .name = "model-anthropic",
    .kind = EPH_KIND_MODEL,
    .version = PACKAGE_VERSION,
    .description = "Anthropic Messages API with tool use and streaming (libcurl)",
    .config_keys = anthropic_keys,
    .init = anthropic_init,
    .fini = anthropic_fini,
    .ops = &anthropic_ops,
};
