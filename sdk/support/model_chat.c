/* Chat Completions response parsing shared by model-openai and model-replay. The shape is
 * OpenAI's documented response object (https://platform.openai.com/docs/api-reference/chat/object):
 * choices[0].message {role, content, tool_calls[] {id, type "function", function {name,
 * arguments (a JSON text)}}}, choices[0].finish_reason, usage {prompt_tokens,
 * completion_tokens, total_tokens}. */
#include "config.h" /* autoconf: _GNU_SOURCE */

#include "model_chat.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

json_object *
eph_chat_usage(json_object *body, const char *where, eph_error_t *err)
{
  json_object *usage = NULL;
  if (!json_object_object_get_ex(body, "usage", &usage) ||
      !json_object_is_type(usage, json_type_object)) {
    eph_error_set(err, EPH_E_PROTOCOL,
                  "%s: response has no usage object (token counts are needed for billing)", where);
    return NULL;
  }
  return usage;
}

static int
get_tokens(json_object *usage, const char *key, const char *where, uint64_t *out, eph_error_t *err)
{
  json_object *v = NULL;
  if (!json_object_object_get_ex(usage, key, &v) || !json_object_is_type(v, json_type_int))
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: usage.%s missing or not an integer", where, key);
  int64_t n = json_object_get_int64(v);
  if (n < 0)
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: usage.%s is negative", where, key);
  *out = (uint64_t)n;
  return 0;
}

/* Copies one tool call into the normalised shape, checking every field the core relies on. */
static int
normalise_tool_call(json_object *tc, size_t i, const char *where, json_object *out_calls,
                    eph_error_t *err)
{
  json_object *fn = NULL;
  if (!json_object_is_type(tc, json_type_object))
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: tool_calls[%zu] is not an object", where, i);
  const char *id = eph_json_get_string(tc, "id");
  const char *type = eph_json_get_string(tc, "type");
  if (!id || !*id)
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: tool_calls[%zu].id missing", where, i);
  /* "function" is the only tool call type Chat Completions defines for function tools;
   * a missing type is tolerated because some compatible servers omit it. */
  if (type && strcmp(type, "function") != 0)
    return eph_error_set(err, EPH_E_PROTOCOL,
                         "%s: tool_calls[%zu].type is \"%s\", not \"function\"", where, i, type);
  if (!json_object_object_get_ex(tc, "function", &fn) || !json_object_is_type(fn, json_type_object))
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: tool_calls[%zu].function missing", where, i);
  const char *name = eph_json_get_string(fn, "name");
  const char *args = eph_json_get_string(fn, "arguments");
  if (!name || !*name)
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: tool_calls[%zu].function.name missing", where,
                         i);
  if (!args)
    return eph_error_set(err, EPH_E_PROTOCOL,
                         "%s: tool_calls[%zu].function.arguments missing or not a string", where,
                         i);

  json_object_array_add(out_calls, eph_chat_tool_call_new(id, name, args));
  return 0;
}

json_object *
eph_chat_tool_call_new(const char *id, const char *name, const char *arguments)
{
  json_object *c = json_object_new_object(), *f = json_object_new_object();
  json_object_object_add(c, "id", json_object_new_string(id ? id : ""));
  json_object_object_add(c, "type", json_object_new_string("function"));
  json_object_object_add(f, "name", json_object_new_string(name ? name : ""));
  json_object_object_add(f, "arguments", json_object_new_string(arguments ? arguments : ""));
  json_object_object_add(c, "function", f);
  return c;
}

json_object *
eph_chat_answer_new(const eph_chat_buf_t *text, bool has_text, json_object *calls)
{
  json_object *out = json_object_new_object();
  json_object_object_add(out, "role", json_object_new_string("assistant"));
  json_object_object_add(
      out, "content",
      has_text ? json_object_new_string_len(text->p ? text->p : "", (int)text->len) : NULL);
  if (calls && json_object_array_length(calls))
    json_object_object_add(out, "tool_calls", calls);
  else if (calls)
    json_object_put(calls);
  return out;
}

const char *
eph_chat_tool_result_id(json_object *m, size_t i, eph_error_t *err)
{
  const char *id = eph_json_get_string(m, "tool_call_id");
  if (!id)
    eph_error_set(err, EINVAL, "messages[%zu]: tool message without tool_call_id", i);
  return id;
}

void
eph_chat_tool_call_at(json_object *tool_calls, size_t j, const char **id, const char **name,
                      const char **arguments)
{
  json_object *tc = json_object_array_get_idx(tool_calls, j), *fn = NULL;
  json_object_object_get_ex(tc, "function", &fn);
  *id = eph_json_get_string(tc, "id");
  *name = eph_json_get_string(fn, "name");
  *arguments = eph_json_get_string(fn, "arguments");
}

json_object *
eph_chat_stream_json(const char *data, size_t len, const char *where, const char *what,
                     eph_error_t *err)
{
  const char *why = NULL;
  json_tokener *tok = json_tokener_new();
  json_object *o = tok ? json_tokener_parse_ex(tok, data, (int)len) : NULL;
  if (!o)
    why = tok ? json_tokener_error_desc(json_tokener_get_error(tok)) : "out of memory";
  if (tok)
    json_tokener_free(tok);
  if (o && json_object_is_type(o, json_type_object))
    return o;
  if (o)
    json_object_put(o);
  eph_error_set(err, EPH_E_PROTOCOL, "%s: stream %s is not a JSON object (%s)", where, what,
                why ? why : "wrong type");
  return NULL;
}

int
eph_chat_parse_begin(json_object *body, const char *where, eph_model_response_t *resp,
                     eph_error_t *err)
{
  resp->message = NULL;
  if (!json_object_is_type(body, json_type_object))
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: response body is not a JSON object", where);
  return 0;
}

int
eph_chat_parse_response(json_object *body, const char *where, eph_model_response_t *resp,
                        eph_error_t *err)
{
  json_object *choices = NULL, *choice = NULL, *msg = NULL, *usage = NULL, *v = NULL;
  int r;

  if ((r = eph_chat_parse_begin(body, where, resp, err)) < 0)
    return r;
  if (!json_object_object_get_ex(body, "choices", &choices) ||
      !json_object_is_type(choices, json_type_array) || json_object_array_length(choices) == 0)
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: response has no choices", where);
  choice = json_object_array_get_idx(choices, 0);
  if (!json_object_is_type(choice, json_type_object) ||
      !json_object_object_get_ex(choice, "message", &msg) ||
      !json_object_is_type(msg, json_type_object))
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: choices[0].message missing", where);

  if (!(usage = eph_chat_usage(body, where, err)))
    return -EPH_E_PROTOCOL;
  if ((r = get_tokens(usage, "prompt_tokens", where, &resp->input_tokens, err)) < 0 ||
      (r = get_tokens(usage, "completion_tokens", where, &resp->output_tokens, err)) < 0)
    return r;
  uint64_t cached = 0;
  if (json_object_object_get_ex(usage, "prompt_tokens_details", &v) &&
      json_object_is_type(v, json_type_object) &&
      (r = eph_chat_get_count(v, "cached_tokens", where,
                              "usage.prompt_tokens_details.cached_tokens", false, &cached, err)) <
          0)
    return r;
  eph_chat_set_cache(resp, cached, 0);

  resp->finish_reason[0] = '\0';
  if (json_object_object_get_ex(choice, "finish_reason", &v) && v) {
    if (!json_object_is_type(v, json_type_string))
      return eph_error_set(err, EPH_E_PROTOCOL, "%s: choices[0].finish_reason is not a string",
                           where);
    snprintf(resp->finish_reason, sizeof resp->finish_reason, "%s", json_object_get_string(v));
  }

  json_object *out = json_object_new_object();
  json_object_object_add(out, "role", json_object_new_string("assistant"));
  if (json_object_object_get_ex(msg, "content", &v) && v) {
    if (!json_object_is_type(v, json_type_string)) {
      json_object_put(out);
      return eph_error_set(err, EPH_E_PROTOCOL, "%s: choices[0].message.content is not a string",
                           where);
    }
    json_object_object_add(out, "content", json_object_new_string(json_object_get_string(v)));
  } else {
    json_object_object_add(out, "content", NULL);
  }

  if (json_object_object_get_ex(msg, "tool_calls", &v) && v) {
    if (!json_object_is_type(v, json_type_array)) {
      json_object_put(out);
      return eph_error_set(err, EPH_E_PROTOCOL, "%s: choices[0].message.tool_calls is not an array",
                           where);
    }
    size_t n = json_object_array_length(v);
    if (n > 0) {
      json_object *calls = json_object_new_array();
      for (size_t i = 0; i < n; i++) {
        if ((r = normalise_tool_call(json_object_array_get_idx(v, i), i, where, calls, err)) < 0) {
          json_object_put(calls);
          json_object_put(out);
          return r;
        }
      }
      json_object_object_add(out, "tool_calls", calls);
    }
  }

  resp->message = out;
  return 0;
}

int
eph_chat_get_count(json_object *obj, const char *key, const char *where, const char *what,
                   bool required, uint64_t *out, eph_error_t *err)
{
  json_object *v = NULL;
  *out = 0;
  if (!obj || !json_object_object_get_ex(obj, key, &v) || !v) {
    if (required)
      return eph_error_set(err, EPH_E_PROTOCOL,
                           "%s: %s missing (token counts are needed for "
                           "billing)",
                           where, what);
    return 0;
  }
  if (!json_object_is_type(v, json_type_int))
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: %s is not an integer", where, what);
  int64_t n = json_object_get_int64(v);
  if (n < 0)
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: %s is negative", where, what);
  *out = (uint64_t)n;
  return 0;
}

void
eph_chat_set_cache(eph_model_response_t *resp, uint64_t read, uint64_t write)
{
  if (EPH_MODEL_RESPONSE_HAS_CACHE(resp)) {
    resp->cache_read_tokens = read;
    resp->cache_write_tokens = write;
  }
}

int
eph_chat_response_begin(const eph_model_request_t *req, eph_model_response_t *resp,
                        eph_error_t *err)
{
  resp->message = resp->raw = NULL;
  resp->finish_reason[0] = '\0';
  resp->input_tokens = resp->output_tokens = 0;
  eph_chat_set_cache(resp, 0, 0);
  if (!req || !req->model || !req->messages || !json_object_is_type(req->messages, json_type_array))
    return eph_error_set(err, EINVAL, "model request: model and a messages array are required");
  return 0;
}

int
eph_chat_message_at(json_object *messages, size_t i, const char **role, const char **text,
                    eph_error_t *err)
{
  json_object *m = json_object_array_get_idx(messages, i), *content = NULL;
  *text = NULL;
  if (!(*role = eph_json_get_string(m, "role")))
    return eph_error_set(err, EINVAL, "messages[%zu]: no role", i);
  json_object_object_get_ex(m, "content", &content);
  if (content && !json_object_is_type(content, json_type_string))
    return eph_error_set(err, EINVAL, "messages[%zu].content is not a string", i);
  *text = content ? json_object_get_string(content) : NULL;
  return 0;
}

int
eph_chat_buf_add(eph_chat_buf_t *b, const char *s, size_t n)
{
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1)
      cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p)
      return -ENOMEM;
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
  return 0;
}

int
eph_chat_buf_add_json(eph_chat_buf_t *b, json_object *str)
{
  return eph_chat_buf_add(b, json_object_get_string(str), (size_t)json_object_get_string_len(str));
}

void
eph_chat_buf_free(eph_chat_buf_t *b)
{
  free(b->p);
  b->p = NULL;
  b->len = b->cap = 0;
}

void
eph_chat_stream_reset(eph_chat_stream_t *st)
{
  if (st->meta)
    json_object_put(st->meta);
  if (st->usage)
    json_object_put(st->usage);
  eph_chat_buf_free(&st->content);
  for (size_t i = 0; i < st->n_calls; i++) {
    eph_chat_buf_free(&st->calls[i].id);
    eph_chat_buf_free(&st->calls[i].name);
    eph_chat_buf_free(&st->calls[i].args);
  }
  EPH_STREAM_CLEAR(st);
}

static int
add_string(eph_chat_buf_t *b, json_object *obj, const char *key)
{
  json_object *v = NULL;
  if (!json_object_object_get_ex(obj, key, &v) || !v || !json_object_is_type(v, json_type_string))
    return 0;
  return eph_chat_buf_add_json(b, v);
}

/* Replaces b with obj.key when that is a non-empty string. */
static int
set_string(eph_chat_buf_t *b, json_object *obj, const char *key)
{
  json_object *v = NULL;
  if (!json_object_object_get_ex(obj, key, &v) || !v || !json_object_is_type(v, json_type_string) ||
      json_object_get_string_len(v) == 0)
    return 0;
  b->len = 0;
  return eph_chat_buf_add_json(b, v);
}

int
eph_chat_stream_event(eph_chat_stream_t *st, const char *data, size_t len, const char *where,
                      eph_error_t *err)
{
  json_object *v = NULL, *choices = NULL;
  if (st->done)
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: stream data after [DONE]", where);
  if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
    st->done = true;
    return 0;
  }
  json_object *chunk = eph_chat_stream_json(data, len, where, "chunk", err);
  if (!chunk)
    return -EPH_E_PROTOCOL;
  int r = 0;
  if (json_object_object_get_ex(chunk, "error", &v) && v) {
    const char *m = json_object_is_type(v, json_type_string) ? json_object_get_string(v)
                                                             : eph_json_get_string(v, "message");
    r = eph_error_set(err, EPH_E_UPSTREAM, "%s: the stream reported an error: %s", where,
                      m ? m : "(no message)");
    goto out;
  }
  if (!st->meta) {
    st->meta = json_object_new_object();
    static const char *const keep[] = {"id", "model", "created", "system_fingerprint"};
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
      if (json_object_object_get_ex(chunk, keep[i], &v) && v)
        json_object_object_add(st->meta, keep[i], json_object_get(v));
  }
  if (json_object_object_get_ex(chunk, "usage", &v) && v &&
      json_object_is_type(v, json_type_object)) {
    if (st->usage)
      json_object_put(st->usage);
    st->usage = json_object_get(v);
  }
  if (!json_object_object_get_ex(chunk, "choices", &choices) || !choices)
    goto out;
  if (!json_object_is_type(choices, json_type_array)) {
    r = eph_error_set(err, EPH_E_PROTOCOL, "%s: stream chunk choices is not an array", where);
    goto out;
  }
  for (size_t i = 0; i < json_object_array_length(choices); i++) {
    json_object *ch = json_object_array_get_idx(choices, i), *delta = NULL, *tcs = NULL, *idx;
    if (!json_object_is_type(ch, json_type_object))
      continue;
    if (json_object_object_get_ex(ch, "index", &idx) && json_object_get_int(idx) != 0)
      continue; /* n = 1 is asked for: only the first choice exists */
    const char *fr = eph_json_get_string(ch, "finish_reason");
    if (fr)
      snprintf(st->finish_reason, sizeof st->finish_reason, "%s", fr);
    if (!json_object_object_get_ex(ch, "delta", &delta) ||
        !json_object_is_type(delta, json_type_object))
      continue;
    if (json_object_object_get_ex(delta, "content", &v) && v &&
        json_object_is_type(v, json_type_string)) {
      st->has_content = true;
      if ((r = add_string(&st->content, delta, "content")) < 0)
        goto nomem;
      if (st->on_text && json_object_get_string_len(v))
        st->on_text(st->text_opaque, json_object_get_string(v),
                    (size_t)json_object_get_string_len(v));
    }
    if (!json_object_object_get_ex(delta, "tool_calls", &tcs) || !tcs)
      continue;
    if (!json_object_is_type(tcs, json_type_array)) {
      r = eph_error_set(err, EPH_E_PROTOCOL, "%s: delta.tool_calls is not an array", where);
      goto out;
    }
    for (size_t j = 0; j < json_object_array_length(tcs); j++) {
      json_object *tc = json_object_array_get_idx(tcs, j), *fn = NULL;
      if (!json_object_is_type(tc, json_type_object) ||
          !json_object_object_get_ex(tc, "index", &idx) ||
          !json_object_is_type(idx, json_type_int)) {
        r = eph_error_set(err, EPH_E_PROTOCOL, "%s: delta.tool_calls[%zu].index missing", where, j);
        goto out;
      }
      int64_t k = json_object_get_int64(idx);
      if (k < 0 || k >= EPH_CHAT_STREAM_MAX_CALLS) {
        r = eph_error_set(err, EPH_E_PROTOCOL, "%s: delta.tool_calls index %lld out of range",
                          where, (long long)k);
        goto out;
      }
      if ((size_t)k >= st->n_calls)
        st->n_calls = (size_t)k + 1;
      st->calls[k].used = true;
      /* id and name come whole (some servers repeat them in every chunk: the last wins, as
       * in OpenAI's own SDK); arguments come in pieces. */
      if ((r = set_string(&st->calls[k].id, tc, "id")) < 0)
        goto nomem;
      if (json_object_object_get_ex(tc, "function", &fn) &&
          json_object_is_type(fn, json_type_object) &&
          ((r = set_string(&st->calls[k].name, fn, "name")) < 0 ||
           (r = add_string(&st->calls[k].args, fn, "arguments")) < 0))
        goto nomem;
    }
  }
  goto out;
nomem:
  r = eph_error_set(err, ENOMEM, "%s: out of memory reading the stream", where);
out:
  json_object_put(chunk);
  return r;
}

json_object *
eph_chat_stream_finish(eph_chat_stream_t *st, const char *where, eph_error_t *err)
{
  if (!st->done) {
    eph_error_set(err, EPH_E_PROTOCOL, "%s: the stream ended before data: [DONE] (truncated)",
                  where);
    return NULL;
  }
  json_object *body = json_object_new_object();
  if (st->meta) {
    json_object_object_foreach(st->meta, k, mv)
      json_object_object_add(body, k, json_object_get(mv));
  }
  json_object_object_add(body, "object", json_object_new_string("chat.completion"));
  json_object *calls = json_object_new_array();
  for (size_t i = 0; i < st->n_calls; i++)
    if (st->calls[i].used)
      json_object_array_add(calls, eph_chat_tool_call_new(st->calls[i].id.p, st->calls[i].name.p,
                                                          st->calls[i].args.p));
  json_object *msg = eph_chat_answer_new(&st->content, st->has_content, calls);
  json_object *choice = json_object_new_object();
  json_object_object_add(choice, "index", json_object_new_int(0));
  json_object_object_add(choice, "message", msg);
  json_object_object_add(choice, "finish_reason",
                         st->finish_reason[0] ? json_object_new_string(st->finish_reason) : NULL);
  json_object *choices = json_object_new_array();
  json_object_array_add(choices, choice);
  json_object_object_add(body, "choices", choices);
  if (st->usage)
    json_object_object_add(body, "usage", json_object_get(st->usage));
  return body;
}
