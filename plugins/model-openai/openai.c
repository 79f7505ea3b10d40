/* model-openai: OpenAI and OpenAI-compatible APIs with tool calling, over libcurl.
 *
 * Two wire APIs, chosen per provider by `api`:
 *  - "chat": POST {base_url}/chat/completions with {model, messages, tools, tool_choice
 *    "auto", max_completion_tokens};
 *  - "responses": POST {base_url}/responses with {model, input items, tools, tool_choice,
 *    max_output_tokens, store false} (function_call / function_call_output items).
 * Either may stream (`stream = true`): Server-Sent Events accumulated into the very body a
 * non-streaming call returns, so both give the same answer and --record writes the same.
 *
 * Providers: the block itself is the "openai/" provider (strip_prefix); `providers` adds
 * operator-defined OpenAI-compatible servers (a gateway, vLLM, a local server), each with
 * its own prefix, base_url, key source and API. The core routes a model to this plugin when
 * one of the prefixes starts its name (serves()); the prefix is removed before sending.
 *
 * Retries, deadlines, key handling: sdk/support/model_http.h (the key is only ever written into the
 * Authorization header of requests to its provider's base_url and is scrubbed from every
 * message).
 *
 * Thread-safe: the state is read-only after init and each call uses its own easy handle. */
#include "config.h" /* autoconf: _GNU_SOURCE, PACKAGE_VERSION */

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <ephemeral/plugin.h>

#include "support/model_chat.h"
#include "support/model_http.h"
#include "support/model_responses.h"

#define MAX_PROVIDERS 32

static const eph_config_key_t openai_keys[] = {
    {"base_url", EPH_CFG_STRING, "\"https://api.openai.com/v1\"", NULL,
     "Base URL of the OpenAI-compatible API; requests go to {base_url}/chat/completions "
     "(api \"chat\") or {base_url}/responses (api \"responses\"). Plain http is refused unless "
     "the host is a loopback address or allow_plain_http is set."},
    {"api", EPH_CFG_STRING, "\"chat\"", NULL,
     "Wire API: \"chat\" (Chat Completions) or \"responses\" (the Responses API: input items, "
     "function_call / function_call_output items, store = false)."},
    {"stream", EPH_CFG_BOOL, "false", NULL,
     "Ask for a Server-Sent Events stream (stream: true; Chat Completions with "
     "stream_options.include_usage). The streamed answer is assembled into the same result "
     "as a non-streamed one; a stream cut short is an error, never a partial answer."},
    {"api_key_file", EPH_CFG_STRING, "\"\"", NULL,
     "File holding the API key (surrounding whitespace ignored). Takes precedence over "
     "api_key_env. Should be mode 0600; a group- or world-readable file is warned about."},
    {"api_key_env", EPH_CFG_STRING, "\"OPENAI_API_KEY\"", NULL,
     "Environment variable of the host process holding the API key, used when api_key_file "
     "is empty. With both empty no Authorization header is sent (local servers)."},
    {"strip_prefix", EPH_CFG_STRING, "\"openai/\"", NULL,
     "Provider prefix of the models this block serves, removed from the request's model name "
     "before it is sent (\"openai/gpt-6-luna\" is sent as \"gpt-6-luna\"). \"\" serves every "
     "model name no other provider claims."},
    {"max_tokens_field", EPH_CFG_STRING, "\"max_completion_tokens\"", NULL,
     "Chat Completions body field carrying the output-token cap: \"max_completion_tokens\" "
     "(OpenAI), \"max_tokens\" (older compatible servers) or \"\" to send none. The Responses "
     "API always uses max_output_tokens."},
    {"providers", EPH_CFG_LIST, "()", NULL,
     "Operator-defined OpenAI-compatible providers, each a group: prefix (required, e.g. "
     "\"local/\": \"local/qwen3\" is sent as \"qwen3\"), base_url (required), api, stream, "
     "api_key_file, api_key_env (default \"\": no key), max_tokens_field, allow_plain_http, "
     "each as for the block itself. The retry and timeout keys of the block apply. Prices "
     "are per full model name in the core's pricing.models."},
    EPH_MHTTP_POLICY_KEYS("408, 409, 429 or 5xx"),
    {0},
};

enum { API_CHAT, API_RESPONSES };

typedef struct provider {
  char *name;   /* "model-openai" or "model-openai providers[N]", for messages */
  char *prefix; /* removed from the model name; "" serves any name */
  char *url;    /* {base_url}/chat/completions or {base_url}/responses */
  int api;
  int stream;
  char *api_key;       /* NULL: send no Authorization header */
  char *auth_header;   /* "Authorization: Bearer <key>", or NULL */
  char *no_key_reason; /* set when a key source was configured but held nothing */
  char *max_tokens_field;
} provider_t;

typedef struct openai {
  const eph_host_t *host;
  eph_mhttp_policy_t policy;
  provider_t providers[MAX_PROVIDERS];
  size_t n;
} openai_t;

static void
provider_free(provider_t *p)
{
  free(p->name);
  free(p->prefix);
  free(p->url);
  eph_free_secret(p->api_key);
  eph_free_secret(p->auth_header);
  free(p->no_key_reason);
  free(p->max_tokens_field);
  memset(p, 0, sizeof *p);
}

static void
openai_fini(void *state)
{
  openai_t *s = state;
  if (!s)
    return;
  for (size_t i = 0; i < s->n; i++)
    provider_free(&s->providers[i]);
  free(s);
  curl_global_cleanup();
}

/* Reads one provider from block (the plugin's block itself when top-level). */
static int
provider_init(openai_t *s, provider_t *p, const config_setting_t *block, bool top, const char *name,
              eph_error_t *err)
{
  const eph_host_t *host = s->host;
  const char *base_url, *key_file, *key_env, *prefix, *mt_field, *api;
  int allow_http = 0, stream = 0, r;

  if (!(p->name = strdup(name)))
    return eph_error_set(err, ENOMEM, "out of memory");
  if ((r = host->cfg_string(block, "base_url", top ? "https://api.openai.com/v1" : NULL, &base_url,
                            err)) < 0 ||
      (r = host->cfg_string(block, "api", "chat", &api, err)) < 0 ||
      (r = host->cfg_bool(block, "stream", 0, &stream, err)) < 0 ||
      (r = host->cfg_string(block, "api_key_file", "", &key_file, err)) < 0 ||
      (r = host->cfg_string(block, "api_key_env", top ? "OPENAI_API_KEY" : "", &key_env, err)) <
          0 ||
      (r = host->cfg_string(block, top ? "strip_prefix" : "prefix", top ? "openai/" : NULL, &prefix,
                            err)) < 0 ||
      (r = host->cfg_string(block, "max_tokens_field", "max_completion_tokens", &mt_field, err)) <
          0 ||
      (r = host->cfg_bool(block, "allow_plain_http", 0, &allow_http, err)) < 0)
    return r;
  if (!base_url || !*base_url)
    return eph_error_set(err, EPH_E_CONFIG, "%s: base_url is required", name);
  if (!prefix || (!top && !*prefix))
    return eph_error_set(err, EPH_E_CONFIG, "%s: prefix is required (e.g. \"local/\")", name);
  if (strcmp(api, "chat") == 0)
    p->api = API_CHAT;
  else if (strcmp(api, "responses") == 0)
    p->api = API_RESPONSES;
  else
    return eph_error_set(err, EPH_E_CONFIG, "%s: api \"%s\": must be \"chat\" or \"responses\"",
                         name, api);
  p->stream = stream;
  eph_error_t uerr = {0};
  if ((r = eph_mhttp_check_base_url(base_url, allow_http, &uerr)) < 0)
    return eph_error_set(err, uerr.code, "%s: %s", name, uerr.message);
  if ((r = eph_mhttp_endpoint(base_url, p->api == API_CHAT ? "chat/completions" : "responses",
                              &p->url, err)) < 0)
    return r;
  if (!(p->prefix = strdup(prefix)) || !(p->max_tokens_field = strdup(mt_field)))
    return eph_error_set(err, ENOMEM, "out of memory");
  return eph_mhttp_key_header(host, name, key_file, key_env, "Authorization: Bearer ", false,
                              &p->api_key, &p->auth_header, &p->no_key_reason, err);
}

static int
openai_init(const eph_host_t *host, const config_setting_t *config, void **state, eph_error_t *err)
{
  void *mem;
  int r = eph_mhttp_state_new(sizeof(openai_t), &mem, err);
  if (r < 0)
    return r;
  openai_t *s = mem;
  s->host = host;
  if ((r = eph_mhttp_policy_read(host, config, &s->policy, err)) < 0)
    goto fail;
  s->n = 1;
  if ((r = provider_init(s, &s->providers[0], config, true, "model-openai", err)) < 0)
    goto fail;
  config_setting_t *list = config ? config_setting_get_member(config, "providers") : NULL;
  int n = list ? config_setting_length(list) : 0;
  if (n >= MAX_PROVIDERS) {
    r = eph_error_set(err, EPH_E_CONFIG, "providers: at most %d", MAX_PROVIDERS - 1);
    goto fail;
  }
  for (int i = 0; i < n; i++) {
    config_setting_t *b = config_setting_get_elem(list, (unsigned)i);
    char name[64];
    snprintf(name, sizeof name, "model-openai providers[%d]", i);
    if (!config_setting_is_group(b)) {
      r = eph_error_set(err, EPH_E_CONFIG,
                        "%s:%d: %s: not a group { prefix = ...; base_url = ...; }",
                        config_setting_source_file(b) ? config_setting_source_file(b) : "config",
                        config_setting_source_line(b), name);
      goto fail;
    }
    /* A misspelt key would silently fall back to its default (no key, another API). */
    static const char *const known[] = {"prefix",           "base_url",        "api",
                                        "stream",           "api_key_file",    "api_key_env",
                                        "max_tokens_field", "allow_plain_http"};
    for (int k = 0; k < config_setting_length(b); k++) {
      config_setting_t *m = config_setting_get_elem(b, (unsigned)k);
      bool ok = false;
      for (size_t q = 0; q < sizeof known / sizeof known[0] && !ok; q++)
        ok = strcmp(config_setting_name(m), known[q]) == 0;
      if (!ok) {
        r = eph_error_set(err, EPH_E_CONFIG, "%s:%d: %s: unknown key '%s' (a provider has %s)",
                          config_setting_source_file(m) ? config_setting_source_file(m) : "config",
                          config_setting_source_line(m), name, config_setting_name(m),
                          "prefix, base_url, api, stream, api_key_file, api_key_env, "
                          "max_tokens_field, allow_plain_http");
        goto fail;
      }
    }
    provider_t *p = &s->providers[s->n++];
    if ((r = provider_init(s, p, b, false, name, err)) < 0)
      goto fail;
    for (size_t j = 0; j + 1 < s->n; j++)
      if (strcmp(s->providers[j].prefix, p->prefix) == 0) {
        r = eph_error_set(err, EPH_E_CONFIG, "%s: prefix \"%s\" is already used by %s", name,
                          p->prefix, s->providers[j].name);
        goto fail;
      }
  }
  *state = s;
  return 0;
fail:
  openai_fini(s);
  return r;
}

/* The provider serving model: the longest matching prefix (the block's "" last). */
static const provider_t *
route(const openai_t *s, const char *model)
{
  const provider_t *best = NULL;
  for (size_t i = 0; i < s->n; i++) {
    size_t n = strlen(s->providers[i].prefix);
    if (strncmp(model, s->providers[i].prefix, n) == 0 && (!best || n > strlen(best->prefix)))
      best = &s->providers[i];
  }
  return best;
}

static int
openai_serves(void *state, const char *model)
{
  const provider_t *p = model ? route(state, model) : NULL;
  return p ? 1 + (int)strlen(p->prefix) : 0;
}

/* Ready when the provider serving model has its key (or needs none). */
static int
openai_ready(void *state, const char *model, eph_error_t *err)
{
  const openai_t *s = state;
  const provider_t *p = model ? route(s, model) : &s->providers[0];
  if (!p)
    return eph_error_set(err, EINVAL, "model '%s': no provider of model-openai has its prefix",
                         model);
  if (p->no_key_reason)
    return eph_error_set(err, EPH_E_CONFIG, "%s", p->no_key_reason);
  return 0;
}

/* ---------------------------------------------------------------- one call */

static char *
build_body(const provider_t *p, const eph_model_request_t *req, eph_error_t *err)
{
  json_object *body = json_object_new_object();
  json_object_object_add(body, "model", json_object_new_string(req->model + strlen(p->prefix)));
  bool tools = req->tools && json_object_is_type(req->tools, json_type_array) &&
               json_object_array_length(req->tools) > 0;
  if (p->api == API_CHAT) {
    json_object_object_add(body, "messages", json_object_get(req->messages));
    if (tools) {
      json_object_object_add(body, "tools", json_object_get(req->tools));
      json_object_object_add(body, "tool_choice", json_object_new_string("auto"));
    }
    if (*p->max_tokens_field && req->max_output_tokens > 0)
      json_object_object_add(body, p->max_tokens_field,
                             json_object_new_int64(req->max_output_tokens));
    if (p->stream) {
      json_object *so = json_object_new_object();
      json_object_object_add(so, "include_usage", json_object_new_boolean(1));
      json_object_object_add(body, "stream", json_object_new_boolean(1));
      json_object_object_add(body, "stream_options", so);
    }
  } else {
    json_object *input = eph_responses_input(req->messages, err);
    if (!input) {
      json_object_put(body);
      return NULL;
    }
    json_object_object_add(body, "input", input);
    if (tools) {
      json_object_object_add(body, "tools", eph_responses_tools(req->tools));
      json_object_object_add(body, "tool_choice", json_object_new_string("auto"));
    }
    if (req->max_output_tokens > 0)
      json_object_object_add(body, "max_output_tokens",
                             json_object_new_int64(req->max_output_tokens));
    /* Nothing is kept on the provider's side: each call carries the whole conversation. */
    json_object_object_add(body, "store", json_object_new_boolean(0));
    if (p->stream)
      json_object_object_add(body, "stream", json_object_new_boolean(1));
  }
  return eph_mhttp_body_text(body, err);
}

typedef struct call_ctx {
  const provider_t *p;
  eph_model_response_t *resp;
  eph_chat_stream_t chat;
  eph_responses_stream_t responses;
  int attempts; /* attempts started so far */
} call_ctx_t;

static void
on_attempt(void *opaque)
{
  call_ctx_t *c = opaque;
  eph_chat_stream_reset(&c->chat);
  eph_responses_stream_reset(&c->responses);
  eph_mhttp_attempt_begins(&c->attempts, c->chat.on_text, c->chat.text_opaque);
}

static int
on_event(void *opaque, const char *event, const char *data, size_t len, eph_error_t *err)
{
  call_ctx_t *c = opaque;
  if (c->p->api == API_CHAT)
    return eph_chat_stream_event(&c->chat, data, len, c->p->url, err);
  return eph_responses_stream_event(&c->responses, event, data, len, c->p->url, err);
}

static int
on_done(void *opaque, const char *body, size_t len, int64_t latency_ms, eph_error_t *err)
{
  call_ctx_t *c = opaque;
  json_object *root;
  if (!c->p->stream)
    root = eph_mhttp_parse_body(body, len, c->p->url, err);
  else if (c->p->api == API_CHAT)
    root = eph_chat_stream_finish(&c->chat, c->p->url, err);
  else
    root = eph_responses_stream_finish(&c->responses, c->p->url, err);
  return eph_mhttp_answer(root,
                          c->p->api == API_CHAT ? eph_chat_parse_response : eph_responses_parse,
                          c->p->url, latency_ms, c->resp, err);
}

static int
openai_complete(void *state, const eph_model_request_t *req, eph_model_response_t *resp,
                eph_error_t *err)
{
  openai_t *s = state;
  int r = eph_chat_response_begin(req, resp, err);
  if (r < 0)
    return r;
  const provider_t *p = route(s, req->model);
  if (!p)
    return eph_error_set(err, EINVAL, "model '%s': no provider of model-openai has its prefix",
                         req->model);
  if (p->no_key_reason)
    return eph_error_set(err, EPH_E_CONFIG, "%s", p->no_key_reason);

  char *body = build_body(p, req, err);
  if (!body)
    return err && err->code ? -err->code : -ENOMEM;

  struct curl_slist *headers = eph_mhttp_json_headers(p->stream, p->auth_header, NULL, err);
  if (!headers) {
    free(body);
    return -ENOMEM;
  }

  call_ctx_t ctx = {.p = p, .resp = resp};
  if (EPH_MODEL_REQUEST_HAS_DELTA(req) && req->on_delta) { /* text as it streams */
    ctx.chat.on_text = ctx.responses.on_text = req->on_delta;
    ctx.chat.text_opaque = ctx.responses.text_opaque = req->delta_opaque;
  }
  eph_mhttp_call_t call = {
      .url = p->url,
      .headers = headers,
      .body = body,
      .key = p->api_key,
      .deadline_ms = req->deadline_ms,
      .user_agent = "ephemeral-model-openai/" PACKAGE_VERSION,
      .on_event = p->stream ? on_event : NULL,
      .on_attempt = on_attempt,
      .on_done = on_done,
      .opaque = &ctx,
  };
  r = eph_mhttp_post(&s->policy, s->host, &call, err);
  eph_chat_stream_reset(&ctx.chat);
  eph_responses_stream_reset(&ctx.responses);
  curl_slist_free_all(headers);
  free(body);
  return eph_mhttp_complete_end(s->host, p->api_key, resp, r);
}

static const eph_model_ops_t openai_ops = {
    .struct_size = sizeof(eph_model_ops_t),
    .complete = openai_complete,
    .serves = openai_serves,
    .ready = openai_ready,
};

EPH_PLUGIN_EXPORT = {
    .abi_major = EPH_ABI_MAJOR,
    .abi_minor = EPH_ABI_MINOR,
    .struct_size = sizeof(eph_plugin_t),
    .name = "model-openai",
    .kind = EPH_KIND_MODEL,
    .version = PACKAGE_VERSION,
    .description = "OpenAI and OpenAI-compatible providers (Chat Completions, Responses; "
                   "streaming) with tool calling (libcurl)",
    .config_keys = openai_keys,
    .init = openai_init,
    .fini = openai_fini,
    .ops = &openai_ops,
};
