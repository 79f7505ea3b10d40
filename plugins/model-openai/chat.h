/* Chat Completions response parsing shared by model-openai (which receives the bodies) and
 * model-replay (which reads the same bodies back from a transcript), so a recorded
 * transcript is read exactly the way it was first understood.
 *
 * Compiled into each of the two plugins (hidden visibility: nothing here is exported). */
#ifndef EPH_PLUGIN_CHAT_H
#define EPH_PLUGIN_CHAT_H

#include <ephemeral/plugin.h>

/* Reads one Chat Completions response body (an object, borrowed) into resp:
 *  - resp->message: a new normalised assistant message owned by resp:
 *      {"role":"assistant","content":string|null,
 *       "tool_calls":[{"id","type":"function","function":{"name","arguments"}}]}
 *    ("tool_calls" only when the model asked for at least one; extra fields the API
 *    adds, such as "refusal" or "annotations", are dropped);
 *  - resp->finish_reason from choices[0].finish_reason ("" when null);
 *  - resp->input_tokens / output_tokens from usage.prompt_tokens / completion_tokens.
 * resp->raw is left untouched. `where` prefixes messages (e.g. "transcript.jsonl:2" or the
 * URL). Returns 0, or -EPH_E_PROTOCOL naming the missing or mistyped field; on failure
 * resp->message is left NULL. */
int eph_chat_parse_response(json_object *body, const char *where, eph_model_response_t *resp,
                            eph_error_t *err);

/* The string value of key in obj, or NULL when absent or not a string. */
const char *eph_chat_get_string(json_object *obj, const char *key);

#endif
