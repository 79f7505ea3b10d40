/* Fuzz target: model-replay (plugins/model-replay): a transcript file (JSONL of recorded
 * response bodies) checked against a run's messages. A transcript may come from a request
 * ("replay:PATH") or from a shared recording, so both are untrusted. The input is the
 * transcript, then a line holding only "%%", then the request's messages (a JSON array);
 * without the separator the whole input is the transcript and the messages are one user
 * message. The transcript reaches the plugin as a file (a memfd through /proc/self/fd). The
 * call is made twice: the second answers from the parsed transcript the first cached. */
#include "../../plugins/model-replay/replay.c"

#include <sys/mman.h>

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
  size_t tlen = size;
  const char *msgs_text = NULL;
  size_t msgs_len = 0;
  const uint8_t *sep = memmem(data, size, "\n%%\n", 4);
  if (sep) {
    tlen = (size_t)(sep - data) + 1;
    msgs_text = (const char *)sep + 4;
    msgs_len = size - tlen - 3;
  }
  int fd = memfd_create("transcript", MFD_CLOEXEC);
  if (fd < 0)
    return 0;
  if (tlen && write(fd, data, tlen) != (ssize_t)tlen) {
    close(fd);
    return 0;
  }
  json_object *messages = NULL;
  if (msgs_text) {
    json_tokener *tok = json_tokener_new();
    messages = json_tokener_parse_ex(tok, msgs_text, (int)msgs_len);
    json_tokener_free(tok);
  } else {
    messages = json_tokener_parse("[{\"role\":\"user\",\"content\":\"hi\"}]");
  }
  char model[64];
  snprintf(model, sizeof model, "replay:/proc/self/fd/%d", fd);
  replay_t s = {.host = &host, .transcript = NULL, .pace = 0};
  transcript_cache_init(&s.cache);
  eph_model_request_t req = {.struct_size = sizeof req, .model = model, .messages = messages};
  for (int call = 0; call < 2; call++) {
    eph_model_response_t resp = {.struct_size = sizeof resp};
    eph_error_t err = {0};
    if (replay_complete(&s, &req, &resp, &err) == 0) {
      (void)json_object_to_json_string(resp.message);
      eph_model_response_clear(&resp);
    }
  }
  transcript_cache_fini(&s.cache);
  json_object_put(messages);
  close(fd);
  return 0;
}
