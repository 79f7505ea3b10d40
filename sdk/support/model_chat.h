/* Chat Completions response parsing shared by model-openai (which receives the bodies) and
 * model-replay (which reads the same bodies back from a transcript), so a recorded
 * transcript is read exactly the way it was first understood; the normalised assistant
 * message, token counts and stream buffers it defines are model-anthropic's too.
 *
 * Part of sdk/support/libephmodel.la, linked into each of those plugins (hidden
 * visibility: nothing here is exported). */
#ifndef EPH_SUPPORT_MODEL_CHAT_H
#define EPH_SUPPORT_MODEL_CHAT_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <ephemeral/plugin.h>

#include "text.h" /* eph_json_get_string */

/* Reads one Chat Completions response body (an object, borrowed) into resp:
 *  - resp->message: a new normalised assistant message owned by resp:
 *      {"role":"assistant","content":string|null,
 *       "tool_calls":[{"id","type":"function","function":{"name","arguments"}}]}
 *    ("tool_calls" only when the model asked for at least one; extra fields the API
 *    adds, such as "refusal" or "annotations", are dropped);
 *  - resp->finish_reason from choices[0].finish_reason ("" when null);
 *  - resp->input_tokens / output_tokens from usage.prompt_tokens / completion_tokens, the
 *    cache reads from usage.prompt_tokens_details.cached_tokens (when present).
 * resp->raw is left untouched. `where` prefixes messages (e.g. "transcript.jsonl:2" or the
 * URL). Returns 0, or -EPH_E_PROTOCOL naming the missing or mistyped field; on failure
 * resp->message is left NULL. */
int eph_chat_parse_response(json_object *body, const char *where, eph_model_response_t *resp,
                            eph_error_t *err);

/* What every parser of a response body starts with: resp->message NULL (it stays so on
 * failure), then -EPH_E_PROTOCOL "<where>: response body is not a JSON object" unless body
 * is one. */
int eph_chat_parse_begin(json_object *body, const char *where, eph_model_response_t *resp,
                         eph_error_t *err);

/* The response body's "usage" object (borrowed), or NULL with -EPH_E_PROTOCOL: every
 * wire format must count its tokens, they are billed. */
json_object *eph_chat_usage(json_object *body, const char *where, eph_error_t *err);

/* A token count: obj.key as a non-negative integer into *out. A missing (or null) key is
 * an error naming `what` (e.g. "usage.input_tokens") when required, else *out = 0. */
int eph_chat_get_count(json_object *obj, const char *key, const char *where, const char *what,
                       bool required, uint64_t *out, eph_error_t *err);

/* What every hosted-model complete() starts with: resp emptied (no message, no raw body,
 * no reason, zero counts), then req checked for a model and a messages array (-EINVAL). */
int eph_chat_response_begin(const eph_model_request_t *req, eph_model_response_t *resp,
                            eph_error_t *err);

/* messages[i] of the core's conversation read for a request builder: *role (required) and
 * *text, the string content or NULL when there is none. -EINVAL naming messages[i] when the
 * role is missing or the content is not a string. Both strings borrowed from messages. */
int eph_chat_message_at(json_object *messages, size_t i, const char **role, const char **text,
                        eph_error_t *err);

/* Request builders: the tool_call_id of messages[i] (role "tool", borrowed), or NULL with
 * -EINVAL "messages[i]: tool message without tool_call_id". */
const char *eph_chat_tool_result_id(json_object *m, size_t i, eph_error_t *err);

/* Request builders: tool_calls[j] of an assistant message as its id, function.name and
 * function.arguments (each borrowed, NULL when absent or not a string). */
void eph_chat_tool_call_at(json_object *tool_calls, size_t j, const char **id, const char **name,
                           const char **arguments);

/* Parsers: one call in the normalised shape {"id","type":"function","function":{"name",
 * "arguments"}} (the strings copied; NULL counts as ""). New reference. */
json_object *eph_chat_tool_call_new(const char *id, const char *name, const char *arguments);

/* Stores the prompt-cache counts in resp when the caller's struct has room for them. */
void eph_chat_set_cache(eph_model_response_t *resp, uint64_t read, uint64_t write);

/* A growable byte buffer for streamed text (always NUL-terminated once used). */
typedef struct eph_chat_buf {
  char *p;
  size_t len, cap;
} eph_chat_buf_t;
int eph_chat_buf_add(eph_chat_buf_t *b, const char *s, size_t n);
/* Appends the JSON string str (its whole length, NULs included). -ENOMEM. */
int eph_chat_buf_add_json(eph_chat_buf_t *b, json_object *str);
void eph_chat_buf_free(eph_chat_buf_t *b);

/* Parsers: the normalised assistant message {"role":"assistant","content":text or null,
 * "tool_calls":calls}: content is text's bytes when has_text (null otherwise), tool_calls
 * only when calls holds at least one. Takes calls' reference. New reference. */
json_object *eph_chat_answer_new(const eph_chat_buf_t *text, bool has_text, json_object *calls);

/* Streams: one SSE data payload as a JSON object (new reference), or NULL with
 * -EPH_E_PROTOCOL "<where>: stream <what> is not a JSON object (<why>)", what naming the
 * payload ("chunk", "event message_start"). */
json_object *eph_chat_stream_json(const char *data, size_t len, const char *where, const char *what,
                                  eph_error_t *err);

/* Called with each piece of the answer's text as a stream delivers it (model_delta), text
 * borrowed for the call, not NUL-terminated. Set on a stream struct; kept across resets. */
typedef void (*eph_text_delta_fn)(void *opaque, const char *text, size_t bytes);

/* Empties a stream struct *st (every stream below) but for its on_text and text_opaque,
 * which survive a reset; what the struct owned must be freed first. */
#define EPH_STREAM_CLEAR(st)                                                                       \
  do {                                                                                             \
    eph_text_delta_fn on_text_ = (st)->on_text;                                                    \
    void *text_opaque_ = (st)->text_opaque;                                                        \
    memset((st), 0, sizeof *(st));                                                                 \
    (st)->on_text = on_text_;                                                                      \
    (st)->text_opaque = text_opaque_;                                                              \
  } while (0)

/* Chat Completions streaming (stream: true, stream_options.include_usage): the chunks of
 * one answer, accumulated into the chat.completion body a non-streaming call would have
 * returned, so both read the same (and --record writes the same). */
#define EPH_CHAT_STREAM_MAX_CALLS 128
typedef struct eph_chat_stream {
  json_object *meta;  /* id, model, created of the first chunk */
  json_object *usage; /* the usage chunk */
  eph_chat_buf_t content;
  bool has_content;
  char finish_reason[32];
  struct {
    eph_chat_buf_t id, name, args;
    bool used;
  } calls[EPH_CHAT_STREAM_MAX_CALLS];
  size_t n_calls;
  bool done;                 /* "data: [DONE]" */
  eph_text_delta_fn on_text; /* optional; survives eph_chat_stream_reset() */
  void *text_opaque;
} eph_chat_stream_t;

void eph_chat_stream_reset(eph_chat_stream_t *st);
/* One SSE data payload: a chat.completion.chunk, an {"error":...} object or [DONE]. */
int eph_chat_stream_event(eph_chat_stream_t *st, const char *data, size_t len, const char *where,
                          eph_error_t *err);
/* The assembled chat.completion body (owned by the caller), or NULL with -EPH_E_PROTOCOL
 * when the stream ended before [DONE]. */
json_object *eph_chat_stream_finish(eph_chat_stream_t *st, const char *where, eph_error_t *err);

#endif
