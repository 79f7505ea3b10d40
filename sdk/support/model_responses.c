/* OpenAI Responses API: the core's conversation as input items, response objects read back
 * into the normalised assistant message (see model_responses.h). */
#include "config.h" /* autoconf: _GNU_SOURCE */

#include "model_responses.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_object *
text_message(const char *role, const char *text)
{
  json_object *m = json_object_new_object();
  json_object_object_add(m, "type", json_object_new_string("message"));
  json_object_object_add(m, "role", json_object_new_string(role));
  json_object_object_add(m, "content", json_object_new_string(text));
  return m;
}

json_object *
eph_responses_input(json_object *messages, eph_error_t *err)
{
  json_object *items = json_object_new_array();
  size_t n = json_object_array_length(messages);
  for (size_t i = 0; i < n; i++) {
    json_object *m = json_object_array_get_idx(messages, i), *tcs = NULL;
    const char *role, *text;
    if (eph_chat_message_at(messages, i, &role, &text, err) < 0)
      goto fail;
    if (strcmp(role, "tool") == 0) {
      const char *id = eph_chat_tool_result_id(m, i, err);
      if (!id) {
        goto fail;
      }
      json_object *o = json_object_new_object();
      json_object_object_add(o, "type", json_object_new_string("function_call_output"));
      json_object_object_add(o, "call_id", json_object_new_string(id));
      json_object_object_add(o, "output", json_object_new_string(text ? text : ""));
      json_object_array_add(items, o);
      continue;
    }
    if (strcmp(role, "system") != 0 && strcmp(role, "user") != 0 &&
        strcmp(role, "assistant") != 0 && strcmp(role, "developer") != 0) {
      eph_error_set(err, EINVAL, "messages[%zu]: unknown role \"%s\"", i, role);
      goto fail;
    }
    if (text && (*text || strcmp(role, "assistant") != 0))
      json_object_array_add(items, text_message(role, text));
    if (strcmp(role, "assistant") != 0 || !json_object_object_get_ex(m, "tool_calls", &tcs) ||
        !json_object_is_type(tcs, json_type_array))
      continue;
    for (size_t j = 0; j < json_object_array_length(tcs); j++) {
      const char *id, *name, *args;
      eph_chat_tool_call_at(tcs, j, &id, &name, &args);
      if (!id || !name) {
        eph_error_set(err, EINVAL, "messages[%zu].tool_calls[%zu]: id or name missing", i, j);
        goto fail;
      }
      json_object *o = json_object_new_object();
      json_object_object_add(o, "type", json_object_new_string("function_call"));
      json_object_object_add(o, "call_id", json_object_new_string(id));
      json_object_object_add(o, "name", json_object_new_string(name));
      json_object_object_add(o, "arguments", json_object_new_string(args ? args : "{}"));
      json_object_array_add(items, o);
    }
  }
  return items;
fail:
  json_object_put(items);
  return NULL;
}

json_object *
eph_responses_tools(json_object *tools)
{
  json_object *out = json_object_new_array();
  for (size_t i = 0; tools && i < json_object_array_length(tools); i++) {
    json_object *t = json_object_array_get_idx(tools, i), *fn = NULL, *v = NULL;
    if (!json_object_object_get_ex(t, "function", &fn))
      continue;
    json_object *o = json_object_new_object();
    json_object_object_add(o, "type", json_object_new_string("function"));
    static const char *const keys[] = {"name", "description", "parameters"};
    for (size_t k = 0; k < 3; k++)
      if (json_object_object_get_ex(fn, keys[k], &v))
        json_object_object_add(o, keys[k], json_object_get(v));
    json_object_array_add(out, o);
  }
  return out;
}

int
eph_responses_parse(json_object *body, const char *where, eph_model_response_t *resp,
                    eph_error_t *err)
{
  json_object *output = NULL, *usage = NULL, *v = NULL;
  int r;
  if ((r = eph_chat_parse_begin(body, where, resp, err)) < 0)
    return r;
  const char *status = eph_json_get_string(body, "status");
  if (status && strcmp(status, "failed") == 0) {
    json_object *e = NULL;
    json_object_object_get_ex(body, "error", &e);
    const char *m = eph_json_get_string(e, "message");
    return eph_error_set(err, EPH_E_UPSTREAM, "%s: the response failed: %s", where,
                         m ? m : "(no message)");
  }
  if (!json_object_object_get_ex(body, "output", &output) ||
      !json_object_is_type(output, json_type_array))
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: response has no output array", where);
  if (!(usage = eph_chat_usage(body, where, err)))
    return -EPH_E_PROTOCOL;
  uint64_t cached = 0;
  if ((r = eph_chat_get_count(usage, "input_tokens", where, "usage.input_tokens", true,
                              &resp->input_tokens, err)) < 0 ||
      (r = eph_chat_get_count(usage, "output_tokens", where, "usage.output_tokens", true,
                              &resp->output_tokens, err)) < 0)
    return r;
  if (json_object_object_get_ex(usage, "input_tokens_details", &v) &&
      json_object_is_type(v, json_type_object) &&
      (r = eph_chat_get_count(v, "cached_tokens", where, "usage.input_tokens_details.cached_tokens",
                              false, &cached, err)) < 0)
    return r;
  eph_chat_set_cache(resp, cached, 0);

  eph_chat_buf_t text = {0};
  bool has_text = false;
  json_object *calls = json_object_new_array();
  for (size_t i = 0; i < json_object_array_length(output); i++) {
    json_object *item = json_object_array_get_idx(output, i), *content = NULL;
    const char *type = eph_json_get_string(item, "type");
    if (!type) {
      r = eph_error_set(err, EPH_E_PROTOCOL, "%s: output[%zu].type missing", where, i);
      goto fail;
    }
    if (strcmp(type, "message") == 0) {
      if (!json_object_object_get_ex(item, "content", &content) ||
          !json_object_is_type(content, json_type_array)) {
        r = eph_error_set(err, EPH_E_PROTOCOL, "%s: output[%zu].content is not an array", where, i);
        goto fail;
      }
      for (size_t j = 0; j < json_object_array_length(content); j++) {
        json_object *part = json_object_array_get_idx(content, j), *t = NULL;
        const char *ptype = eph_json_get_string(part, "type");
        if (!ptype || strcmp(ptype, "output_text") != 0)
          continue; /* a refusal part carries no answer text */
        if (!json_object_object_get_ex(part, "text", &t) ||
            !json_object_is_type(t, json_type_string)) {
          r = eph_error_set(err, EPH_E_PROTOCOL, "%s: output[%zu].content[%zu].text missing", where,
                            i, j);
          goto fail;
        }
        has_text = true;
        if (eph_chat_buf_add_json(&text, t) < 0) {
          r = eph_error_set(err, ENOMEM, "out of memory");
          goto fail;
        }
      }
    } else if (strcmp(type, "function_call") == 0) {
      const char *id = eph_json_get_string(item, "call_id");
      const char *name = eph_json_get_string(item, "name");
      const char *args = eph_json_get_string(item, "arguments");
      if (!id || !*id || !name || !*name || !args) {
        r = eph_error_set(err, EPH_E_PROTOCOL,
                          "%s: output[%zu]: function_call without call_id, name or arguments",
                          where, i);
        goto fail;
      }
      json_object_array_add(calls, eph_chat_tool_call_new(id, name, args));
    }
    /* reasoning and other item types are not part of the answer */
  }

  size_t n_calls = json_object_array_length(calls);
  json_object *out = eph_chat_answer_new(&text, has_text, calls);
  calls = NULL;
  const char *fr = "stop";
  if (n_calls) {
    fr = "tool_calls";
  } else if (status && strcmp(status, "incomplete") == 0) {
    json_object *d = NULL;
    json_object_object_get_ex(body, "incomplete_details", &d);
    const char *why = eph_json_get_string(d, "reason");
    fr = why && strcmp(why, "content_filter") == 0 ? "content_filter" : "length";
  }
  snprintf(resp->finish_reason, sizeof resp->finish_reason, "%s", fr);
  eph_chat_buf_free(&text);
  resp->message = out;
  return 0;
fail:
  eph_chat_buf_free(&text);
  if (calls)
    json_object_put(calls);
  return r;
}

void
eph_responses_stream_reset(eph_responses_stream_t *st)
{
  if (st->final)
    json_object_put(st->final);
  for (size_t i = 0; i < st->n_items; i++)
    if (st->items[i])
      json_object_put(st->items[i]);
  EPH_STREAM_CLEAR(st);
}

/* Appends s to the string member key of obj (created when absent). obj comes from the
 * server (an item's content part may be a number or an array): anything but an object is
 * left alone, as json-c asserts on adding a member to a non-object (found by tests/fuzz). */
static void
append_member(json_object *obj, const char *key, const char *s)
{
  json_object *v = NULL;
  if (!json_object_is_type(obj, json_type_object))
    return;
  eph_chat_buf_t b = {0};
  if (json_object_object_get_ex(obj, key, &v) && json_object_is_type(v, json_type_string))
    eph_chat_buf_add_json(&b, v);
  eph_chat_buf_add(&b, s, strlen(s));
  json_object_object_add(obj, key, json_object_new_string_len(b.p ? b.p : "", (int)b.len));
  eph_chat_buf_free(&b);
}

int
eph_responses_stream_event(eph_responses_stream_t *st, const char *event, const char *data,
                           size_t len, const char *where, eph_error_t *err)
{
  json_object *v = NULL;
  json_object *ev = eph_chat_stream_json(data, len, where, "event", err);
  if (!ev)
    return -EPH_E_PROTOCOL;
  /* The payload's own "type" names the event; the SSE event line repeats it. */
  const char *type = eph_json_get_string(ev, "type");
  if (!type)
    type = event;
  int r = 0;
  int64_t idx = -1;
  if (json_object_object_get_ex(ev, "output_index", &v) && json_object_is_type(v, json_type_int))
    idx = json_object_get_int64(v);
  bool indexed = idx >= 0 && idx < EPH_RESPONSES_MAX_ITEMS;

  if (strcmp(type, "response.completed") == 0 || strcmp(type, "response.incomplete") == 0) {
    if (!json_object_object_get_ex(ev, "response", &v) ||
        !json_object_is_type(v, json_type_object)) {
      r = eph_error_set(err, EPH_E_PROTOCOL, "%s: %s without a response object", where, type);
    } else {
      if (st->final)
        json_object_put(st->final);
      st->final = json_object_get(v);
    }
  } else if (strcmp(type, "response.failed") == 0 || strcmp(type, "error") == 0) {
    json_object *e = NULL, *resp = NULL;
    const char *m = eph_json_get_string(ev, "message");
    if (!m && json_object_object_get_ex(ev, "response", &resp) &&
        json_object_object_get_ex(resp, "error", &e))
      m = eph_json_get_string(e, "message");
    if (!m && json_object_object_get_ex(ev, "error", &e))
      m = eph_json_get_string(e, "message");
    r = eph_error_set(err, EPH_E_UPSTREAM, "%s: the stream reported %s: %s", where, type,
                      m ? m : "(no message)");
  } else if ((strcmp(type, "response.output_item.added") == 0 ||
              strcmp(type, "response.output_item.done") == 0) &&
             indexed) {
    json_object *item = NULL;
    if (json_object_object_get_ex(ev, "item", &item) &&
        json_object_is_type(item, json_type_object)) {
      if (st->items[idx])
        json_object_put(st->items[idx]);
      /* A copy: deltas edit it in place. */
      json_object *copy = NULL;
      json_object_deep_copy(item, &copy, NULL);
      st->items[idx] = copy;
      if ((size_t)idx >= st->n_items)
        st->n_items = (size_t)idx + 1;
    }
  } else if (strcmp(type, "response.output_text.delta") == 0 && indexed && st->items[idx]) {
    json_object *content = NULL, *part = NULL;
    const char *d = eph_json_get_string(ev, "delta");
    int64_t ci = 0;
    if (json_object_object_get_ex(ev, "content_index", &v))
      ci = json_object_get_int64(v);
    if (!json_object_object_get_ex(st->items[idx], "content", &content) ||
        !json_object_is_type(content, json_type_array)) {
      content = json_object_new_array();
      json_object_object_add(st->items[idx], "content", content);
    }
    while (ci >= 0 && ci < 64 && (int64_t)json_object_array_length(content) <= ci) {
      part = json_object_new_object();
      json_object_object_add(part, "type", json_object_new_string("output_text"));
      json_object_object_add(part, "text", json_object_new_string(""));
      json_object_array_add(content, part);
    }
    part = ci >= 0 && ci < 64 ? json_object_array_get_idx(content, (size_t)ci) : NULL;
    if (d && part) {
      append_member(part, "text", d);
      if (st->on_text && *d)
        st->on_text(st->text_opaque, d, strlen(d));
    }
  } else if (strcmp(type, "response.function_call_arguments.delta") == 0 && indexed &&
             st->items[idx]) {
    const char *d = eph_json_get_string(ev, "delta");
    if (d)
      append_member(st->items[idx], "arguments", d);
  }
  /* response.created, .in_progress, content_part.*, *.done duplicates: nothing to keep. */
  json_object_put(ev);
  return r;
}

json_object *
eph_responses_stream_finish(eph_responses_stream_t *st, const char *where, eph_error_t *err)
{
  json_object *output = NULL;
  if (!st->final) {
    eph_error_set(err, EPH_E_PROTOCOL, "%s: the stream ended before response.completed (truncated)",
                  where);
    return NULL;
  }
  json_object *body = json_object_get(st->final);
  if (!json_object_object_get_ex(body, "output", &output) ||
      !json_object_is_type(output, json_type_array) || json_object_array_length(output) == 0) {
    /* Some compatible servers send the items only as events. */
    output = json_object_new_array();
    for (size_t i = 0; i < st->n_items; i++)
      if (st->items[i])
        json_object_array_add(output, json_object_get(st->items[i]));
    json_object_object_add(body, "output", output);
  }
  return body;
}
