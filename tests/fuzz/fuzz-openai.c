/* Fuzz target: what a hosted model API answers (plugins/model-openai, plugins/model-anthropic),
 * i.e. whatever the configured base_url sends back: a compromised or impostor endpoint, or a
 * proxy in between, controls all of it. The shared transport (sdk/support/model_http.c) is
 * included here so its static curl callbacks (header, body, the SSE line parser) are reached
 * without a server; the response parsers are linked as the plugins link them.
 *
 * Input: one byte choosing the API and the mode (byte % 6, see enum mode; byte / 6 sets the
 * size of the body chunks curl would hand over, so lines and events split anywhere), then the
 * response as on the wire after the status line: header lines, a blank line, the body
 * (without a blank line the whole rest is the body).
 *  - plain modes: the body through on_body (buffered), then as the plugin's on_done does:
 *    eph_mhttp_parse_json and the API's parser (eph_chat_parse_response,
 *    eph_responses_parse, eph_messages_parse); and the error text of a non-2xx answer
 *    (api_error_text);
 *  - stream modes: the body through on_body as a 2xx SSE stream (sse_feed, sse_line), each
 *    event to the API's stream parser, then its finish and the parser of the assembled
 *    body.
 * Oracle besides memory errors and leaks: no error message holds the API key once redacted
 * with eph_mhttp_redact (as eph_mhttp_post does; the API may echo a wrong key back), and each
 * event's data is NUL-terminated at its length (model_http.h's promise). */
#include "../../sdk/support/model_http.c"

#include "support/model_chat.h"
#include "support/model_messages.h"
#include "support/model_responses.h"

#include "fuzz.h"

enum mode {
  M_CHAT,
  M_RESPONSES,
  M_MESSAGES,
  M_CHAT_STREAM,
  M_RESPONSES_STREAM,
  M_MESSAGES_STREAM,
  M_COUNT
};

static const char key[] = "sk-fuzz-0123456789abcdef";
static const char url[] = "http://127.0.0.1:9/v1/chat/completions";

typedef struct {
  enum mode mode;
  eph_chat_stream_t chat;
  eph_responses_stream_t responses;
  eph_messages_stream_t messages;
} ctx_t;

/* Every error leaves the plugin through eph_mhttp_post, which redacts the key. */
static void
check_redacted(eph_error_t *err)
{
  eph_mhttp_redact(err->message, sizeof err->message, key);
  if (strstr(err->message, key))
    abort();
}

static int
fuzz_event(void *opaque, const char *event, const char *data, size_t len, eph_error_t *err)
{
  ctx_t *c = opaque;
  if (data[len] != '\0' || strlen(event) >= 64)
    abort();
  switch (c->mode) {
  case M_CHAT_STREAM:
    return eph_chat_stream_event(&c->chat, data, len, url, err);
  case M_RESPONSES_STREAM:
    return eph_responses_stream_event(&c->responses, event, data, len, url, err);
  default:
    return eph_messages_stream_event(&c->messages, event, data, len, url, err);
  }
}

/* The plugins' on_done: the body (or the assembled stream) through the API's parser. */
static void
parse_body(ctx_t *c, const attempt_t *a)
{
  eph_error_t err = {0};
  json_object *root = NULL;
  switch (c->mode) {
  case M_CHAT_STREAM:
    root = eph_chat_stream_finish(&c->chat, url, &err);
    break;
  case M_RESPONSES_STREAM:
    root = eph_responses_stream_finish(&c->responses, url, &err);
    break;
  case M_MESSAGES_STREAM:
    root = eph_messages_stream_finish(&c->messages, url, &err);
    break;
  default: {
    const char *why = NULL;
    root = eph_mhttp_parse_json(a->body ? a->body : "", a->len, &why);
    if (!root) {
      char ex[120];
      eph_mhttp_excerpt(a->body ? a->body : "", a->len, ex, sizeof ex);
      eph_error_set(&err, EPH_E_PROTOCOL, "model call to %s: body is not valid JSON (%s): %s", url,
                    why, ex);
    }
  }
  }
  if (!root) {
    check_redacted(&err);
    return;
  }
  eph_model_response_t resp = {.struct_size = sizeof resp};
  int r;
  if (c->mode == M_CHAT || c->mode == M_CHAT_STREAM)
    r = eph_chat_parse_response(root, url, &resp, &err);
  else if (c->mode == M_RESPONSES || c->mode == M_RESPONSES_STREAM)
    r = eph_responses_parse(root, url, &resp, &err);
  else
    r = eph_messages_parse(root, url, &resp, &err);
  if (r == 0) {
    (void)json_object_to_json_string(resp.message);
    eph_model_response_clear(&resp);
  } else {
    check_redacted(&err);
  }
  json_object_put(root);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size < 1)
    return 0;
  ctx_t c = {.mode = (enum mode)(data[0] % M_COUNT)};
  size_t chunk_max = 1 + (size_t)(data[0] / M_COUNT) * 25;
  bool stream = c.mode >= M_CHAT_STREAM;
  data++;
  size--;
  eph_chat_stream_reset(&c.chat);
  eph_responses_stream_reset(&c.responses);
  eph_messages_stream_reset(&c.messages);

  eph_error_t err = {0};
  eph_mhttp_call_t call = {
      .url = url, .key = key, .on_event = stream ? fuzz_event : NULL, .opaque = &c};
  /* status_known as on_body sets it from the status: 1 a 2xx stream, 2 a buffered body. */
  attempt_t a = {.call = &call,
                 .limit = 1 << 20,
                 .retry_after_ms = -1,
                 .status_known = stream ? 1 : 2,
                 .err = &err};

  const uint8_t *body = data;
  size_t body_len = size;
  const uint8_t *sep = memmem(data, size, "\r\n\r\n", 4);
  if (sep) {
    /* curl hands the header callback one line at a time, CRLF included. */
    const uint8_t *l = data, *end = sep + 4;
    while (l < end) {
      const uint8_t *nl = memchr(l, '\n', (size_t)(end - l));
      size_t n = nl ? (size_t)(nl - l) + 1 : (size_t)(end - l);
      char *line = malloc(n);
      memcpy(line, l, n);
      on_header(line, 1, n, &a);
      free(line);
      l += n;
    }
    body = end;
    body_len = size - (size_t)(end - data);
  }
  bool complete = true;
  for (size_t off = 0; off < body_len;) {
    size_t n = body_len - off < chunk_max ? body_len - off : chunk_max;
    char *chunk = malloc(n);
    memcpy(chunk, body + off, n);
    size_t took = on_body(chunk, 1, n, &a);
    free(chunk);
    if (took != n) {
      /* Aborted: a callback's error (in err) or too large; either is the call's error. */
      complete = false;
      if (!a.cb_error)
        eph_error_set(&err, EPH_E_PROTOCOL, "model call to %s: larger than max_response_bytes",
                      url);
      check_redacted(&err);
      break;
    }
    off += n;
  }
  if (complete)
    parse_body(&c, &a);

  if (!stream) {
    /* The error text of a non-2xx answer, as do_post quotes it, redacted the same way. */
    char text[512];
    api_error_text(&a, text, sizeof text);
    eph_error_t err2 = {0};
    eph_error_set(&err2, EPH_E_UPSTREAM, "model call to %s: HTTP %d: %s", url, 401, text);
    check_redacted(&err2);
  }
  attempt_free(&a);
  eph_chat_stream_reset(&c.chat);
  eph_responses_stream_reset(&c.responses);
  eph_messages_stream_reset(&c.messages);
  return 0;
}
