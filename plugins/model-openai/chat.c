/* Chat Completions response parsing shared by model-openai and model-replay. The shape is
 * OpenAI's documented response object (https://platform.openai.com/docs/api-reference/chat/object):
 * choices[0].message {role, content, tool_calls[] {id, type "function", function {name,
 * arguments (a JSON text)}}}, choices[0].finish_reason, usage {prompt_tokens,
 * completion_tokens, total_tokens}. */
#include "config.h" /* autoconf: _GNU_SOURCE */

#include "chat.h"

#include <stdbool.h>

const char *
eph_chat_get_string(json_object *obj, const char *key)
{
  json_object *v = NULL;
  if (!obj || !json_object_object_get_ex(obj, key, &v) || !json_object_is_type(v, json_type_string))
    return NULL;
  return json_object_get_string(v);
}

static int
get_tokens(json_object *usage, const char *key, const char *where, uint64_t *out, eph_error_t *err)
{
  json_object *v = NULL;
  if (!json_object_object_get_ex(usage, key, &v) || !json_object_is_type(v, json_type_int))
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: usage.%s missing or not an integer", where,
                         key);
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
  const char *id = eph_chat_get_string(tc, "id");
  const char *type = eph_chat_get_string(tc, "type");
  if (!id || !*id)
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: tool_calls[%zu].id missing", where, i);
  /* "function" is the only tool call type Chat Completions defines for function tools;
   * a missing type is tolerated because some compatible servers omit it. */
  if (type && strcmp(type, "function") != 0)
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: tool_calls[%zu].type is \"%s\", not \"function\"",
                         where, i, type);
  if (!json_object_object_get_ex(tc, "function", &fn) || !json_object_is_type(fn, json_type_object))
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: tool_calls[%zu].function missing", where, i);
  const char *name = eph_chat_get_string(fn, "name");
  const char *args = eph_chat_get_string(fn, "arguments");
  if (!name || !*name)
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: tool_calls[%zu].function.name missing", where,
                         i);
  if (!args)
    return eph_error_set(err, EPH_E_PROTOCOL,
                         "%s: tool_calls[%zu].function.arguments missing or not a string", where,
                         i);

  json_object *f = json_object_new_object();
  json_object_object_add(f, "name", json_object_new_string(name));
  json_object_object_add(f, "arguments", json_object_new_string(args));
  json_object *c = json_object_new_object();
  json_object_object_add(c, "id", json_object_new_string(id));
  json_object_object_add(c, "type", json_object_new_string("function"));
  json_object_object_add(c, "function", f);
  json_object_array_add(out_calls, c);
  return 0;
}

int
eph_chat_parse_response(json_object *body, const char *where, eph_model_response_t *resp,
                        eph_error_t *err)
{
  json_object *choices = NULL, *choice = NULL, *msg = NULL, *usage = NULL, *v = NULL;
  int r;

  resp->message = NULL;
  if (!json_object_is_type(body, json_type_object))
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: response body is not a JSON object", where);
  if (!json_object_object_get_ex(body, "choices", &choices) ||
      !json_object_is_type(choices, json_type_array) || json_object_array_length(choices) == 0)
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: response has no choices", where);
  choice = json_object_array_get_idx(choices, 0);
  if (!json_object_is_type(choice, json_type_object) ||
      !json_object_object_get_ex(choice, "message", &msg) ||
      !json_object_is_type(msg, json_type_object))
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: choices[0].message missing", where);

  if (!json_object_object_get_ex(body, "usage", &usage) ||
      !json_object_is_type(usage, json_type_object))
    return eph_error_set(err, EPH_E_PROTOCOL,
                         "%s: response has no usage object (token counts are needed for billing)",
                         where);
  if ((r = get_tokens(usage, "prompt_tokens", where, &resp->input_tokens, err)) < 0 ||
      (r = get_tokens(usage, "completion_tokens", where, &resp->output_tokens, err)) < 0)
    return r;

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
      return eph_error_set(err, EPH_E_PROTOCOL,
                           "%s: choices[0].message.tool_calls is not an array", where);
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
