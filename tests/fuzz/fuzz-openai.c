/* Fuzz target: model-openai's handling of an API response (plugins/model-openai), i.e.
 * whatever the configured base_url answers: a compromised or impostor endpoint, or a
 * proxy in between, controls all of it. The plugin is included here so its static
 * callbacks are reached without a server. The input is a response as on the wire after
 * the status line: header lines, a blank line, then the body (without a blank line the
 * whole input is the body). Headers go through the header callback (Retry-After), the
 * body through the body callback in chunks and then through the 2xx parser (JSON, then
 * the Chat Completions fields: eph_chat_parse_response in chat.c) and the error-text
 * extraction used for other statuses. Oracle besides memory errors: no error message
 * holds the API key once redacted (the API may echo a wrong key back). */
#include "../../plugins/model-openai/openai.c"

#include "fuzz.h"

__attribute__((format(printf, 2, 3))) static void
fake_log(eph_log_level_t level, const char *fmt, ...)
{
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  static eph_host_t host;
  host.log = fake_log;
  char url[] = "http://127.0.0.1:9/v1/chat/completions";
  char key[] = "sk-fuzz-0123456789abcdef";
  openai_t s = {.host = &host, .url = url, .api_key = key, .max_response_bytes = 1 << 20};

  const uint8_t *body = data;
  size_t body_len = size;
  const uint8_t *sep = memmem(data, size, "\r\n\r\n", 4);
  attempt_t a = {.limit = (size_t)s.max_response_bytes, .retry_after_ms = -1};
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
  for (size_t off = 0; off < body_len;) {
    size_t n = body_len - off < 1000 ? body_len - off : 1000;
    char *chunk = malloc(n);
    memcpy(chunk, body + off, n);
    size_t took = on_body(chunk, 1, n, &a);
    free(chunk);
    if (took != n)
      break;
    off += n;
  }

  eph_model_response_t resp = {.struct_size = sizeof resp};
  eph_error_t err = {0};
  if (parse_ok_body(&s, &a, 200, 42, &resp, &err) == 0) {
    (void)json_object_to_json_string(resp.message);
    eph_model_response_clear(&resp);
  } else {
    /* openai_complete redacts every error message: the API key never leaves in one,
     * even when the body (quoted in the message) echoes it. */
    redact(err.message, sizeof err.message, key);
    if (strstr(err.message, key))
      abort();
  }
  /* The error text of a non-2xx answer, as do_complete quotes it, redacted the same way. */
  char text[512];
  api_error_text(&a, text, sizeof text);
  eph_error_t err2 = {0};
  eph_error_set(&err2, EPH_E_UPSTREAM, "model call to %s: HTTP %d: %s", url, 401, text);
  redact(err2.message, sizeof err2.message, key);
  if (strstr(err2.message, key))
    abort();
  free(a.body);
  return 0;
}
