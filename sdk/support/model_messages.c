/* Anthropic Messages API request building and response parsing (see model_messages.h). */
#include "config.h" /* autoconf: _GNU_SOURCE */

#include "model_messages.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_object *
text_block(const char *text)
{
  json_object *b = json_object_new_object();
  json_object_object_add(b, "type", json_object_new_string("text"));
  json_object_object_add(b, "text", json_object_new_string(text));
  return b;
}

/* Appends blocks to the last message when it has this role, else starts a new one. */
static void
push_blocks(json_object *out, const char *role, json_object *blocks)
{
  size_t n = json_object_array_length(out);
  json_object *last = n ? json_object_array_get_idx(out, n - 1) : NULL, *content = NULL;
  const char *lrole = eph_json_get_string(last, "role");
  if (lrole && strcmp(lrole, role) == 0 && json_object_object_get_ex(last, "content", &content)) {
    for (size_t i = 0; i < json_object_array_length(blocks); i++)
      json_object_array_add(content, json_object_get(json_object_array_get_idx(blocks, i)));
    json_object_put(blocks);
    return;
  }
  json_object *m = json_object_new_object();
  json_object_object_add(m, "role", json_object_new_string(role));
  json_object_object_add(m, "content", blocks);
  json_object_array_add(out, m);
}

json_object *
eph_messages_request(const char *model, json_object *messages, json_object *tools,
                     uint32_t max_tokens, bool stream, json_object *extra_messages,
                     eph_error_t *err)
{
  json_object *out = json_object_new_array();
  eph_chat_buf_t system = {0};
  size_t n = json_object_array_length(messages);
  for (size_t i = 0; i < n; i++) {
    json_object *m = json_object_array_get_idx(messages, i), *tcs = NULL;
    const char *role, *text;
    if (eph_chat_message_at(messages, i, &role, &text, err) < 0)
      goto fail;
    json_object *blocks = json_object_new_array();
    if (strcmp(role, "system") == 0 || strcmp(role, "developer") == 0) {
      json_object_put(blocks);
      if (text && *text &&
          ((system.len && eph_chat_buf_add(&system, "\n\n", 2) < 0) ||
           eph_chat_buf_add(&system, text, strlen(text)) < 0)) {
        eph_error_set(err, ENOMEM, "out of memory");
        goto fail;
      }
    } else if (strcmp(role, "user") == 0) {
      json_object_array_add(blocks, text_block(text ? text : ""));
      push_blocks(out, "user", blocks);
    } else if (strcmp(role, "tool") == 0) {
      const char *id = eph_chat_tool_result_id(m, i, err);
      if (!id) {
        json_object_put(blocks);
        goto fail;
      }
      json_object *b = json_object_new_object();
      json_object_object_add(b, "type", json_object_new_string("tool_result"));
      json_object_object_add(b, "tool_use_id", json_object_new_string(id));
      json_object_object_add(b, "content", json_object_new_string(text ? text : ""));
      json_object_array_add(blocks, b);
      push_blocks(out, "user", blocks);
    } else if (strcmp(role, "assistant") == 0) {
      if (text && *text)
        json_object_array_add(blocks, text_block(text));
      if (json_object_object_get_ex(m, "tool_calls", &tcs) &&
          json_object_is_type(tcs, json_type_array)) {
        for (size_t j = 0; j < json_object_array_length(tcs); j++) {
          const char *id, *name, *args;
          eph_chat_tool_call_at(tcs, j, &id, &name, &args);
          json_object *input = args ? json_tokener_parse(args) : NULL;
          if (!id || !name || !input || !json_object_is_type(input, json_type_object)) {
            if (input)
              json_object_put(input);
            json_object_put(blocks);
            eph_error_set(err, EINVAL,
                          "messages[%zu].tool_calls[%zu]: id, name or an object of arguments "
                          "missing",
                          i, j);
            goto fail;
          }
          json_object *b = json_object_new_object();
          json_object_object_add(b, "type", json_object_new_string("tool_use"));
          json_object_object_add(b, "id", json_object_new_string(id));
          json_object_object_add(b, "name", json_object_new_string(name));
          json_object_object_add(b, "input", input);
          json_object_array_add(blocks, b);
        }
      }
      if (json_object_array_length(blocks) == 0)
        json_object_put(blocks); /* an empty assistant turn is not sent */
      else
        push_blocks(out, "assistant", blocks);
    } else {
      json_object_put(blocks);
      eph_error_set(err, EINVAL, "messages[%zu]: unknown role \"%s\"", i, role);
      goto fail;
    }
  }
  for (size_t i = 0; extra_messages && i < json_object_array_length(extra_messages); i++)
    json_object_array_add(out, json_object_get(json_object_array_get_idx(extra_messages, i)));

  json_object *body = json_object_new_object();
  json_object_object_add(body, "model", json_object_new_string(model));
  json_object_object_add(body, "max_tokens", json_object_new_int64(max_tokens ? max_tokens : 4096));
  if (system.len)
    json_object_object_add(body, "system", json_object_new_string_len(system.p, (int)system.len));
  json_object_object_add(body, "messages", out);
  if (tools && json_object_is_type(tools, json_type_array) && json_object_array_length(tools)) {
    json_object *ts = json_object_new_array(), *fn = NULL, *v = NULL;
    for (size_t i = 0; i < json_object_array_length(tools); i++) {
      if (!json_object_object_get_ex(json_object_array_get_idx(tools, i), "function", &fn))
        continue;
      json_object *t = json_object_new_object();
      if (json_object_object_get_ex(fn, "name", &v))
        json_object_object_add(t, "name", json_object_get(v));
      if (json_object_object_get_ex(fn, "description", &v))
        json_object_object_add(t, "description", json_object_get(v));
      if (json_object_object_get_ex(fn, "parameters", &v))
        json_object_object_add(t, "input_schema", json_object_get(v));
      else
        json_object_object_add(t, "input_schema", json_tokener_parse("{\"type\":\"object\"}"));
      json_object_array_add(ts, t);
    }
    json_object *choice = json_object_new_object();
    json_object_object_add(choice, "type", json_object_new_string("auto"));
    json_object_object_add(body, "tools", ts);
    json_object_object_add(body, "tool_choice", choice);
  }
  if (stream)
    json_object_object_add(body, "stream", json_object_new_boolean(1));
  eph_chat_buf_free(&system);
  return body;
fail:
  eph_chat_buf_free(&system);
  json_object_put(out);
  return NULL;
}

static const char *
map_stop_reason(const char *s)
{
  if (!s)
    return "";
  if (strcmp(s, "end_turn") == 0 || strcmp(s, "stop_sequence") == 0)
    return "stop";
  if (strcmp(s, "tool_use") == 0)
    return "tool_calls";
  if (strcmp(s, "max_tokens") == 0 || strcmp(s, "model_context_window_exceeded") == 0)
    return "length";
  if (strcmp(s, "refusal") == 0)
    return "content_filter";
  return s; /* pause_turn and anything newer, as sent */
}

int
eph_messages_parse(json_object *body, const char *where, eph_model_response_t *resp,
                   eph_error_t *err)
{
  json_object *content = NULL, *usage = NULL, *v = NULL;
  int r;
  if ((r = eph_chat_parse_begin(body, where, resp, err)) < 0)
    return r;
  const char *type = eph_json_get_string(body, "type");
  if (type && strcmp(type, "error") == 0) {
    json_object_object_get_ex(body, "error", &v);
    const char *m = eph_json_get_string(v, "message");
    return eph_error_set(err, EPH_E_UPSTREAM, "%s: %s", where, m ? m : "(error without message)");
  }
  if (!type || strcmp(type, "message") != 0)
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: response type is not \"message\"", where);
  if (!json_object_object_get_ex(body, "content", &content) ||
      !json_object_is_type(content, json_type_array))
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: response content is not an array", where);
  if (!(usage = eph_chat_usage(body, where, err)))
    return -EPH_E_PROTOCOL;
  uint64_t in = 0, cw = 0, cr = 0;
  if ((r = eph_chat_get_count(usage, "input_tokens", where, "usage.input_tokens", true, &in, err)) <
          0 ||
      (r = eph_chat_get_count(usage, "output_tokens", where, "usage.output_tokens", true,
                              &resp->output_tokens, err)) < 0 ||
      (r = eph_chat_get_count(usage, "cache_creation_input_tokens", where,
                              "usage.cache_creation_input_tokens", false, &cw, err)) < 0 ||
      (r = eph_chat_get_count(usage, "cache_read_input_tokens", where,
                              "usage.cache_read_input_tokens", false, &cr, err)) < 0)
    return r;
  if (in > UINT32_MAX * 1024ull || cw > UINT32_MAX * 1024ull || cr > UINT32_MAX * 1024ull)
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: usage token counts are absurd", where);
  resp->input_tokens = in + cw + cr;
  eph_chat_set_cache(resp, cr, cw);

  const char *stop = NULL;
  if (json_object_object_get_ex(body, "stop_reason", &v) && v) {
    if (!json_object_is_type(v, json_type_string))
      return eph_error_set(err, EPH_E_PROTOCOL, "%s: stop_reason is not a string", where);
    stop = json_object_get_string(v);
  }
  snprintf(resp->finish_reason, sizeof resp->finish_reason, "%s", map_stop_reason(stop));

  eph_chat_buf_t text = {0};
  bool has_text = false;
  json_object *calls = json_object_new_array();
  for (size_t i = 0; i < json_object_array_length(content); i++) {
    json_object *b = json_object_array_get_idx(content, i), *t = NULL, *input = NULL;
    const char *btype = eph_json_get_string(b, "type");
    if (!btype) {
      r = eph_error_set(err, EPH_E_PROTOCOL, "%s: content[%zu].type missing", where, i);
      goto fail;
    }
    if (strcmp(btype, "text") == 0) {
      if (!json_object_object_get_ex(b, "text", &t) || !json_object_is_type(t, json_type_string)) {
        r = eph_error_set(err, EPH_E_PROTOCOL, "%s: content[%zu].text missing", where, i);
        goto fail;
      }
      has_text = true;
      if (eph_chat_buf_add_json(&text, t) < 0) {
        r = eph_error_set(err, ENOMEM, "out of memory");
        goto fail;
      }
    } else if (strcmp(btype, "tool_use") == 0) {
      const char *id = eph_json_get_string(b, "id");
      const char *name = eph_json_get_string(b, "name");
      if (!id || !*id || !name || !*name || !json_object_object_get_ex(b, "input", &input) ||
          !json_object_is_type(input, json_type_object)) {
        r = eph_error_set(err, EPH_E_PROTOCOL,
                          "%s: content[%zu]: tool_use without id, name or an input object", where,
                          i);
        goto fail;
      }
      json_object_array_add(
          calls, eph_chat_tool_call_new(
                     id, name,
                     json_object_to_json_string_ext(input, JSON_C_TO_STRING_PLAIN |
                                                               JSON_C_TO_STRING_NOSLASHESCAPE)));
    }
    /* thinking, redacted_thinking and server tool blocks are not part of the answer */
  }
  resp->message = eph_chat_answer_new(&text, has_text, calls);
  eph_chat_buf_free(&text);
  return 0;
fail:
  eph_chat_buf_free(&text);
  json_object_put(calls);
  return r;
}

/* ---------------------------------------------------------------- streaming */

void
eph_messages_stream_reset(eph_messages_stream_t *st)
{
  if (st->message)
    json_object_put(st->message);
  for (size_t i = 0; i < st->n_blocks; i++) {
    if (st->blocks[i])
      json_object_put(st->blocks[i]);
    eph_chat_buf_free(&st->text[i]);
  }
  EPH_STREAM_CLEAR(st);
}

static int
block_index(json_object *ev, const char *where, const char *type, eph_error_t *err)
{
  json_object *v = NULL;
  if (!json_object_object_get_ex(ev, "index", &v) || !json_object_is_type(v, json_type_int))
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: %s without an index", where, type);
  int64_t i = json_object_get_int64(v);
  if (i < 0 || i >= EPH_MESSAGES_MAX_BLOCKS)
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: %s index %lld out of range", where, type,
                         (long long)i);
  return (int)i;
}

/* Closes block i: its accumulated text or tool input goes into the block object. */
static int
close_block(eph_messages_stream_t *st, size_t i, const char *where, eph_error_t *err)
{
  json_object *b = st->blocks[i];
  if (!b || st->stopped[i])
    return 0;
  st->stopped[i] = true;
  const char *type = eph_json_get_string(b, "type");
  eph_chat_buf_t *t = &st->text[i];
  if (type && strcmp(type, "text") == 0 && t->len) {
    json_object_object_add(b, "text", json_object_new_string_len(t->p, (int)t->len));
  } else if (type && strcmp(type, "tool_use") == 0 && t->len) {
    json_object *input = json_tokener_parse(t->p);
    if (!input || !json_object_is_type(input, json_type_object)) {
      if (input)
        json_object_put(input);
      return eph_error_set(err, EPH_E_PROTOCOL,
                           "%s: content block %zu: the streamed tool input is not a JSON object",
                           where, i);
    }
    json_object_object_add(b, "input", input);
  } else if (type && strcmp(type, "thinking") == 0 && t->len) {
    json_object_object_add(b, "thinking", json_object_new_string_len(t->p, (int)t->len));
  }
  return 0;
}

int
eph_messages_stream_event(eph_messages_stream_t *st, const char *event, const char *data,
                          size_t len, const char *where, eph_error_t *err)
{
  json_object *v = NULL, *u = NULL;
  char what[96];
  snprintf(what, sizeof what, "event %s", event && *event ? event : "(unnamed)");
  json_object *ev = eph_chat_stream_json(data, len, where, what, err);
  if (!ev)
    return -EPH_E_PROTOCOL;
  const char *type = eph_json_get_string(ev, "type");
  if (!type)
    type = event;
  int r = 0, i;
  if (st->done && strcmp(type, "ping") != 0) {
    r = eph_error_set(err, EPH_E_PROTOCOL, "%s: %s after message_stop", where, type);
  } else if (strcmp(type, "message_start") == 0) {
    if (!json_object_object_get_ex(ev, "message", &v) || !json_object_is_type(v, json_type_object))
      r = eph_error_set(err, EPH_E_PROTOCOL, "%s: message_start without a message", where);
    else if (st->message)
      r = eph_error_set(err, EPH_E_PROTOCOL, "%s: a second message_start", where);
    else
      json_object_deep_copy(v, &st->message, NULL);
  } else if (!st->message && strcmp(type, "ping") != 0 && strcmp(type, "error") != 0) {
    r = eph_error_set(err, EPH_E_PROTOCOL, "%s: %s before message_start", where, type);
  } else if (strcmp(type, "content_block_start") == 0) {
    if ((i = r = block_index(ev, where, type, err)) < 0)
      goto out;
    r = 0;
    if (!json_object_object_get_ex(ev, "content_block", &v) ||
        !json_object_is_type(v, json_type_object) || st->blocks[i]) {
      r = eph_error_set(err, EPH_E_PROTOCOL, "%s: content_block_start %d without a new block",
                        where, i);
      goto out;
    }
    json_object_deep_copy(v, &st->blocks[i], NULL);
    if ((size_t)i >= st->n_blocks)
      st->n_blocks = (size_t)i + 1;
  } else if (strcmp(type, "content_block_delta") == 0) {
    if ((i = r = block_index(ev, where, type, err)) < 0)
      goto out;
    r = 0;
    if (!st->blocks[i] || st->stopped[i] || !json_object_object_get_ex(ev, "delta", &v)) {
      r = eph_error_set(err, EPH_E_PROTOCOL, "%s: content_block_delta %d for no open block", where,
                        i);
      goto out;
    }
    const char *dtype = eph_json_get_string(v, "type");
    const char *piece = NULL;
    if (dtype && strcmp(dtype, "text_delta") == 0)
      piece = eph_json_get_string(v, "text");
    else if (dtype && strcmp(dtype, "input_json_delta") == 0)
      piece = eph_json_get_string(v, "partial_json");
    else if (dtype && strcmp(dtype, "thinking_delta") == 0)
      piece = eph_json_get_string(v, "thinking");
    else if (dtype && strcmp(dtype, "signature_delta") == 0) {
      const char *sig = eph_json_get_string(v, "signature");
      if (sig)
        json_object_object_add(st->blocks[i], "signature", json_object_new_string(sig));
    }
    if (piece && eph_chat_buf_add(&st->text[i], piece, strlen(piece)) < 0)
      r = eph_error_set(err, ENOMEM, "%s: out of memory reading the stream", where);
    else if (piece && *piece && st->on_text && strcmp(dtype, "text_delta") == 0)
      st->on_text(st->text_opaque, piece, strlen(piece));
  } else if (strcmp(type, "content_block_stop") == 0) {
    if ((i = r = block_index(ev, where, type, err)) < 0)
      goto out;
    r = st->blocks[i] ? close_block(st, (size_t)i, where, err)
                      : eph_error_set(err, EPH_E_PROTOCOL, "%s: content_block_stop %d for no block",
                                      where, i);
  } else if (strcmp(type, "message_delta") == 0) {
    if (json_object_object_get_ex(ev, "delta", &v) && json_object_is_type(v, json_type_object)) {
      json_object_object_foreach(v, k, dv)
        json_object_object_add(st->message, k, json_object_get(dv));
    }
    /* message_delta usage counts are cumulative: they replace message_start's. */
    if (json_object_object_get_ex(ev, "usage", &u) && json_object_is_type(u, json_type_object)) {
      json_object *mu = NULL;
      if (!json_object_object_get_ex(st->message, "usage", &mu) ||
          !json_object_is_type(mu, json_type_object)) {
        mu = json_object_new_object();
        json_object_object_add(st->message, "usage", mu);
      }
      json_object_object_foreach(u, k, uv)
        if (uv)
          json_object_object_add(mu, k, json_object_get(uv));
    }
  } else if (strcmp(type, "message_stop") == 0) {
    st->done = true;
  } else if (strcmp(type, "error") == 0) {
    json_object *e = NULL;
    json_object_object_get_ex(ev, "error", &e);
    const char *m = eph_json_get_string(e, "message");
    const char *et = eph_json_get_string(e, "type");
    r = eph_error_set(err, EPH_E_UPSTREAM, "%s: the stream reported an error (%s): %s", where,
                      et ? et : "error", m ? m : "(no message)");
  }
  /* ping and event types added later are ignored, as the API asks. */
out:
  json_object_put(ev);
  return r;
}

json_object *
eph_messages_stream_finish(eph_messages_stream_t *st, const char *where, eph_error_t *err)
{
  if (!st->message || !st->done) {
    eph_error_set(err, EPH_E_PROTOCOL, "%s: the stream ended before message_stop (truncated)",
                  where);
    return NULL;
  }
  json_object *content = json_object_new_array();
  for (size_t i = 0; i < st->n_blocks; i++) {
    if (!st->blocks[i])
      continue;
    if (close_block(st, i, where, err) < 0) {
      json_object_put(content);
      return NULL;
    }
    json_object_array_add(content, json_object_get(st->blocks[i]));
  }
  json_object *body = json_object_get(st->message);
  json_object_object_add(body, "content", content);
  return body;
}

static void
mark_last(json_object *arr)
{
  size_t n = arr && json_object_is_type(arr, json_type_array) ? json_object_array_length(arr) : 0;
  json_object *last = n ? json_object_array_get_idx(arr, n - 1) : NULL;
  if (!last || !json_object_is_type(last, json_type_object))
    return;
  json_object *cc = json_object_new_object();
  json_object_object_add(cc, "type", json_object_new_string("ephemeral"));
  json_object_object_add(last, "cache_control", cc);
}

void
eph_messages_mark_cache(json_object *body)
{
  json_object *tools = NULL, *messages = NULL, *content = NULL;
  if (json_object_object_get_ex(body, "tools", &tools))
    mark_last(tools);
  if (json_object_object_get_ex(body, "messages", &messages)) {
    size_t n = json_object_array_length(messages);
    json_object *last = n ? json_object_array_get_idx(messages, n - 1) : NULL;
    if (last && json_object_object_get_ex(last, "content", &content))
      mark_last(content);
  }
}
