/* OpenAI Responses API (POST {base_url}/responses) request building and response parsing,
 * shared by model-openai and model-replay (which reads recorded response objects back).
 * https://platform.openai.com/docs/api-reference/responses
 *
 * Part of sdk/support/libephmodel.la, linked into each of those plugins (hidden
 * visibility: nothing here is exported). */
#ifndef EPH_SUPPORT_MODEL_RESPONSES_H
#define EPH_SUPPORT_MODEL_RESPONSES_H

#include "model_chat.h"

/* The core's Chat Completions messages as Responses input items: system/user/assistant
 * text as message items, each assistant tool call as a function_call item, each tool
 * message as a function_call_output item. Returns a new array or NULL (err set: EINVAL
 * naming the message). */
json_object *eph_responses_input(json_object *messages, eph_error_t *err);

/* The core's Chat Completions tools ({type, function {name, description, parameters}}) as
 * Responses function tools ({type "function", name, description, parameters}). New array. */
json_object *eph_responses_tools(json_object *tools);

/* Reads one response object ({"object":"response", "status", "output":[...], "usage"})
 * into resp, normalised as eph_chat_parse_response does: message items' output_text joined
 * as content, function_call items as tool_calls (call_id as the id), reasoning items
 * dropped. finish_reason: "tool_calls" when there are calls, else "length" or
 * "content_filter" for an incomplete response, else "stop". Usage: input_tokens,
 * output_tokens, input_tokens_details.cached_tokens. A "failed" response is an error
 * carrying its message. */
int eph_responses_parse(json_object *body, const char *where, eph_model_response_t *resp,
                        eph_error_t *err);

/* Responses streaming: response.output_item.added / .done, response.output_text.delta,
 * response.function_call_arguments.delta assemble the output items; response.completed
 * (or .incomplete) carries the final response object, whose output wins when present. */
#define EPH_RESPONSES_MAX_ITEMS 256
typedef struct eph_responses_stream {
  json_object *final; /* the response object of response.completed / .incomplete */
  json_object *items[EPH_RESPONSES_MAX_ITEMS];
  size_t n_items;
  eph_text_delta_fn on_text; /* optional: output_text deltas; survives a reset */
  void *text_opaque;
} eph_responses_stream_t;

void eph_responses_stream_reset(eph_responses_stream_t *st);
int eph_responses_stream_event(eph_responses_stream_t *st, const char *event, const char *data,
                               size_t len, const char *where, eph_error_t *err);
/* The response object (owned by the caller), or NULL when the stream ended without
 * response.completed (-EPH_E_PROTOCOL). */
json_object *eph_responses_stream_finish(eph_responses_stream_t *st, const char *where,
                                         eph_error_t *err);

#endif
