/* Anthropic Messages API (POST {base_url}/messages, anthropic-version 2023-06-01): request
 * building from the core's Chat Completions conversation and response parsing into the
 * normalised assistant message, shared by model-anthropic and model-replay (which reads
 * recorded message objects back). https://docs.anthropic.com/en/api/messages
 *
 * Part of sdk/support/libephmodel.la, linked into each of those plugins (hidden
 * visibility: nothing here is exported). */
#ifndef EPH_SUPPORT_MODEL_MESSAGES_H
#define EPH_SUPPORT_MODEL_MESSAGES_H

#include "model_chat.h"

/* The request body {model, max_tokens, system, messages, tools, tool_choice, stream}:
 *  - system messages joined (blank line between) into the top-level "system";
 *  - user text as text blocks; each assistant message as text + tool_use blocks (the
 *    arguments JSON text parsed into "input", which must be an object);
 *  - tool messages as tool_result blocks in a user message;
 *  - consecutive messages of one role merged (the API wants roles to alternate and all
 *    tool_results of a turn in one user message);
 *  - tools as {name, description, input_schema}.
 * extra_messages (NULL or an array of Anthropic messages) is appended as-is (the
 * continuation of a pause_turn). Returns a new object or NULL with err set (EINVAL naming
 * the message). */
json_object *eph_messages_request(const char *model, json_object *messages, json_object *tools,
                                  uint32_t max_tokens, bool stream, json_object *extra_messages,
                                  eph_error_t *err);

/* Prompt caching: marks the last tool definition and the last content block of the last
 * message with cache_control {"type":"ephemeral"} (2 of the API's 4 breakpoints), so each
 * call of an agent loop reads the previous call's prefix from the cache. */
void eph_messages_mark_cache(json_object *body);

/* Reads one message object ({"type":"message","content":[...],"stop_reason","usage"}) into
 * resp: text blocks joined as content (null when none), tool_use blocks as tool_calls
 * (input serialised as the arguments text), thinking blocks dropped. finish_reason is the
 * stop_reason in the run's vocabulary: end_turn, stop_sequence -> "stop"; tool_use ->
 * "tool_calls"; max_tokens -> "length"; refusal -> "content_filter"; pause_turn ->
 * "pause_turn"; others as sent. input_tokens counts every prompt token: usage.input_tokens
 * + cache_creation_input_tokens + cache_read_input_tokens (the last two also as the cache
 * write / read counts). */
int eph_messages_parse(json_object *body, const char *where, eph_model_response_t *resp,
                       eph_error_t *err);

/* Streaming: message_start, content_block_start / _delta (text_delta, input_json_delta,
 * thinking_delta, signature_delta) / _stop, message_delta, message_stop, ping, error,
 * assembled into the message object a non-streaming call returns. */
#define EPH_MESSAGES_MAX_BLOCKS 256
typedef struct eph_messages_stream {
  json_object *message; /* from message_start, completed by the other events */
  json_object *blocks[EPH_MESSAGES_MAX_BLOCKS];
  eph_chat_buf_t text[EPH_MESSAGES_MAX_BLOCKS]; /* text, or tool_use partial_json */
  bool stopped[EPH_MESSAGES_MAX_BLOCKS];
  size_t n_blocks;
  bool done;                 /* message_stop */
  eph_text_delta_fn on_text; /* optional: text_delta pieces; survives a reset */
  void *text_opaque;
} eph_messages_stream_t;

void eph_messages_stream_reset(eph_messages_stream_t *st);
int eph_messages_stream_event(eph_messages_stream_t *st, const char *event, const char *data,
                              size_t len, const char *where, eph_error_t *err);
/* The assembled message (owned by the caller), or NULL (-EPH_E_PROTOCOL) when the stream
 * ended before message_stop or a tool_use input is not a JSON object. */
json_object *eph_messages_stream_finish(eph_messages_stream_t *st, const char *where,
                                        eph_error_t *err);

#endif
