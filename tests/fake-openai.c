/* fake-openai: a local stand-in for an OpenAI-compatible Chat Completions API, for tests.
 * It is the one test double the project allows (a hosted model API cannot be reached from
 * tests); it speaks the real protocol over real HTTP on 127.0.0.1 (libmicrohttpd).
 *
 *   fake-openai [--key KEY] [--record FILE] [--script FILE] [STEP...]
 *
 * Prints the port it listens on (127.0.0.1, chosen by the kernel) on stdout, then serves
 * until its stdin reaches end of file (so it never outlives the test that started it).
 * It serves the three hosted wire formats the model plugins speak: POST /v1/chat/completions
 * and /v1/responses (OpenAI: the key in "Authorization: Bearer KEY") and /v1/messages
 * (Anthropic: the key in x-api-key, anthropic-version required); 404 otherwise. With --key,
 * a request without the right key gets 401 in the provider's own shape (OpenAI's wording
 * echoes the key it received) and consumes no step. Each request that passes takes the
 * next STEP (from the command line, then the --script file, one per line, '#' comments):
 *
 *   tool_calls     200, two parallel "shell" tool calls, usage 100 + 20 tokens
 *   final          200, a final answer "done", usage 150 + 10 tokens
 *   429:SECS       429 rate limit with Retry-After: SECS
 *   500            500 server error
 *   400            400 with an API error message
 *   malformed      200 with a truncated JSON body
 *   slow:MS        waits MS milliseconds, then answers like final
 *   line:PATH:N    200 with line N (1-based) of the JSONL file PATH as the body
 *   file:PATH      200 application/json with the file PATH as the body
 *   file400:PATH   400 application/json with the file PATH as the body (a crafted API error)
 *   sse:PATH       200 text/event-stream with the file PATH as the body, written 7 bytes at
 *                  a time (events and lines split across reads, as on a real network)
 *   ssecut:PATH:N  as sse:, but the stream ends cleanly after N bytes (a truncated stream)
 *   sseslow:PATH:MS  as sse:, one line every MS milliseconds (a stream the deadline cuts)
 *   529            529 with Anthropic's overloaded_error
 *
 * A step ending in '*' repeats forever. Past the last step: 500 "script exhausted".
 * With --record, each request appends one JSON line to FILE:
 *   {"t_ms": CLOCK_MONOTONIC ms, "step": "...", "auth_ok": bool, "content_type": "...",
 *    "path": "/v1/...", "accept": "...", "anthropic_version": "..." (or ""),
 *    "has_authorization": bool,
 *    "body": "<the request body as received>"}                                            */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>
#include <microhttpd.h>

#define MAX_STEPS 256
#define MAX_BODY_BYTES (16u << 20)

static char *steps[MAX_STEPS];
static size_t n_steps, next_step;
static const char *expected_key;
static FILE *record;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static int64_t
now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void
add_step(const char *s)
{
  if (n_steps == MAX_STEPS) {
    fprintf(stderr, "fake-openai: more than %d steps\n", MAX_STEPS);
    exit(2);
  }
  steps[n_steps++] = strdup(s);
}

static void
load_script(const char *path)
{
  FILE *f = fopen(path, "r");
  char line[4096];
  if (!f) {
    fprintf(stderr, "fake-openai: %s: %s\n", path, strerror(errno));
    exit(2);
  }
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\r\n")] = '\0';
    char *p = line;
    while (*p == ' ' || *p == '\t')
      p++;
    if (*p && *p != '#')
      add_step(p);
  }
  fclose(f);
}

/* Takes the next step; a copy the caller frees. */
static char *
take_step(void)
{
  char *s = NULL;
  pthread_mutex_lock(&lock);
  if (next_step < n_steps) {
    size_t len = strlen(steps[next_step]);
    if (len > 0 && steps[next_step][len - 1] == '*') {
      s = strndup(steps[next_step], len - 1);
    } else {
      s = strdup(steps[next_step]);
      next_step++;
    }
  }
  pthread_mutex_unlock(&lock);
  return s;
}

static __thread const char *req_path, *req_accept, *req_version;
static __thread bool req_has_auth;

static void
record_request(const char *step, bool auth_ok, const char *content_type, const char *body,
               size_t len)
{
  if (!record)
    return;
  json_object *o = json_object_new_object();
  json_object_object_add(o, "path", json_object_new_string(req_path ? req_path : ""));
  json_object_object_add(o, "accept", json_object_new_string(req_accept ? req_accept : ""));
  json_object_object_add(o, "anthropic_version",
                         json_object_new_string(req_version ? req_version : ""));
  json_object_object_add(o, "has_authorization", json_object_new_boolean(req_has_auth));
  json_object_object_add(o, "t_ms", json_object_new_int64(now_ms()));
  json_object_object_add(o, "step", json_object_new_string(step));
  json_object_object_add(o, "auth_ok", json_object_new_boolean(auth_ok));
  json_object_object_add(o, "content_type",
                         json_object_new_string(content_type ? content_type : ""));
  json_object_object_add(o, "body", json_object_new_string_len(body ? body : "", (int)len));
  pthread_mutex_lock(&lock);
  fprintf(record, "%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
  fflush(record);
  pthread_mutex_unlock(&lock);
  json_object_put(o);
}

static const char tool_calls_body[] =
    "{\"id\":\"chatcmpl-fake1\",\"object\":\"chat.completion\",\"created\":1759849323,"
    "\"model\":\"gpt-6-luna\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
    "\"content\":null,\"tool_calls\":["
    "{\"id\":\"call_fake_1\",\"type\":\"function\",\"function\":{\"name\":\"shell\","
    "\"arguments\":\"{\\\"command\\\": \\\"pwd; whoami\\\"}\"}},"
    "{\"id\":\"call_fake_2\",\"type\":\"function\",\"function\":{\"name\":\"shell\","
    "\"arguments\":\"{\\\"command\\\": \\\"echo hi\\\"}\"}}],\"refusal\":null},"
    "\"logprobs\":null,\"finish_reason\":\"tool_calls\"}],"
    "\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":20,\"total_tokens\":120}}";

static const char final_body[] =
    "{\"id\":\"chatcmpl-fake2\",\"object\":\"chat.completion\",\"created\":1759849328,"
    "\"model\":\"gpt-6-luna\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
    "\"content\":\"done\",\"refusal\":null},\"logprobs\":null,\"finish_reason\":\"stop\"}],"
    "\"usage\":{\"prompt_tokens\":150,\"completion_tokens\":10,\"total_tokens\":160}}";

static enum MHD_Result
respond(struct MHD_Connection *conn, unsigned status, const char *body, size_t len,
        const char *retry_after)
{
  struct MHD_Response *r =
      MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
  if (!r)
    return MHD_NO;
  MHD_add_response_header(r, "Content-Type", "application/json");
  if (retry_after)
    MHD_add_response_header(r, "Retry-After", retry_after);
  enum MHD_Result ret = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result
respond_str(struct MHD_Connection *conn, unsigned status, const char *body, const char *ra)
{
  return respond(conn, status, body, strlen(body), ra);
}

static enum MHD_Result
serve_line(struct MHD_Connection *conn, const char *arg)
{
  char path[4096];
  const char *colon = strrchr(arg, ':');
  if (!colon || (size_t)(colon - arg) >= sizeof path)
    return respond_str(conn, 500, "{\"error\":{\"message\":\"fake-openai: bad line: step\"}}",
                       NULL);
  memcpy(path, arg, (size_t)(colon - arg));
  path[colon - arg] = '\0';
  long want = strtol(colon + 1, NULL, 10);
  FILE *f = fopen(path, "r");
  char *line = NULL;
  size_t cap = 0;
  ssize_t len = -1;
  for (long i = 1; f && (len = getline(&line, &cap, f)) >= 0 && i < want; i++)
    ;
  if (f)
    fclose(f);
  enum MHD_Result ret;
  if (len < 0)
    ret = respond_str(conn, 500, "{\"error\":{\"message\":\"fake-openai: no such line\"}}", NULL);
  else
    ret = respond(conn, 200, line, (size_t)len, NULL);
  free(line);
  return ret;
}

static char *
slurp(const char *path, size_t *len)
{
  FILE *f = fopen(path, "r");
  char *buf = NULL;
  size_t cap = 0;
  *len = 0;
  if (!f)
    return NULL;
  FILE *m = open_memstream(&buf, &cap);
  char chunk[4096];
  size_t n;
  while (m && (n = fread(chunk, 1, sizeof chunk, f)) > 0)
    fwrite(chunk, 1, n, m);
  fclose(f);
  if (!m)
    return NULL;
  fclose(m);
  *len = cap;
  return buf;
}

/* A stream body written piecewise: `chunk` bytes per read, or one line per `line_ms`. */
typedef struct sse {
  char *buf;
  size_t len, off;
  size_t chunk;
  long line_ms;
} sse_t;

static ssize_t
sse_read(void *cls, uint64_t pos, char *out, size_t max)
{
  sse_t *s = cls;
  (void)pos;
  if (s->off >= s->len)
    return MHD_CONTENT_READER_END_OF_STREAM;
  size_t n = s->len - s->off;
  if (s->line_ms > 0) {
    struct timespec ts = {.tv_sec = s->line_ms / 1000, .tv_nsec = (s->line_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    const char *nl = memchr(s->buf + s->off, '\n', n);
    if (nl)
      n = (size_t)(nl - (s->buf + s->off)) + 1;
  } else if (n > s->chunk) {
    n = s->chunk;
  }
  if (n > max)
    n = max;
  memcpy(out, s->buf + s->off, n);
  s->off += n;
  return (ssize_t)n;
}

static void
sse_free(void *cls)
{
  sse_t *s = cls;
  free(s->buf);
  free(s);
}

/* arg: PATH or PATH:N (ssecut: N bytes; sseslow: N ms per line). */
static enum MHD_Result
serve_sse(struct MHD_Connection *conn, const char *arg, bool with_n, bool slow)
{
  char path[4096];
  long num = 0;
  const char *colon = with_n ? strrchr(arg, ':') : NULL;
  size_t plen = colon ? (size_t)(colon - arg) : strlen(arg);
  if (plen >= sizeof path || (with_n && !colon))
    return respond_str(conn, 500, "{\"error\":{\"message\":\"fake-openai: bad sse step\"}}", NULL);
  memcpy(path, arg, plen);
  path[plen] = '\0';
  if (colon)
    num = strtol(colon + 1, NULL, 10);
  sse_t *s = calloc(1, sizeof *s);
  if (!s || !(s->buf = slurp(path, &s->len))) {
    free(s);
    return respond_str(conn, 500, "{\"error\":{\"message\":\"fake-openai: no such file\"}}", NULL);
  }
  s->chunk = 7;
  if (with_n && !slow && (size_t)num < s->len)
    s->len = (size_t)num;
  if (slow)
    s->line_ms = num;
  struct MHD_Response *r =
      MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 1024, sse_read, s, sse_free);
  if (!r) {
    sse_free(s);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", "text/event-stream");
  MHD_add_response_header(r, "Cache-Control", "no-cache");
  enum MHD_Result ret = MHD_queue_response(conn, 200, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result
serve_file(struct MHD_Connection *conn, const char *path, unsigned status)
{
  size_t len = 0;
  char *buf = slurp(path, &len);
  if (!buf)
    return respond_str(conn, 500, "{\"error\":{\"message\":\"fake-openai: no such file\"}}", NULL);
  enum MHD_Result ret = respond(conn, status, buf, len, NULL);
  free(buf);
  return ret;
}

typedef struct upload {
  char *buf;
  size_t len;
} upload_t;

static enum MHD_Result
on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
           const char *version, const char *data, size_t *data_size, void **con_cls)
{
  upload_t *u = *con_cls;
  if (!u) {
    u = calloc(1, sizeof *u);
    if (!u)
      return MHD_NO;
    *con_cls = u;
    return MHD_YES;
  }
  if (*data_size) {
    if (u->len + *data_size > MAX_BODY_BYTES)
      return MHD_NO;
    char *p = realloc(u->buf, u->len + *data_size + 1);
    if (!p)
      return MHD_NO;
    memcpy(p + u->len, data, *data_size);
    u->buf = p;
    u->len += *data_size;
    u->buf[u->len] = '\0';
    *data_size = 0;
    return MHD_YES;
  }

  bool anthropic = strcmp(url, "/v1/messages") == 0;
  if (strcmp(method, "POST") != 0 ||
      (!anthropic && strcmp(url, "/v1/chat/completions") != 0 && strcmp(url, "/v1/responses") != 0))
    return respond_str(conn, 404, "{\"error\":{\"message\":\"fake-openai: not found\"}}", NULL);

  const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
  const char *ctype = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Type");
  const char *xkey = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "x-api-key");
  req_path = url;
  req_accept = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Accept");
  req_version = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "anthropic-version");
  req_has_auth = auth != NULL;
  bool auth_ok = true;
  if (expected_key && anthropic) {
    auth_ok = xkey && strcmp(xkey, expected_key) == 0 && !auth;
  } else if (expected_key) {
    auth_ok = auth && strncmp(auth, "Bearer ", 7) == 0 && strcmp(auth + 7, expected_key) == 0;
  }
  if (anthropic && !req_version) {
    record_request("400", auth_ok, ctype, u->buf, u->len);
    return respond_str(conn, 400,
                       "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\","
                       "\"message\":\"anthropic-version: header is required\"}}",
                       NULL);
  }
  if (!auth_ok && anthropic) {
    record_request("401", false, ctype, u->buf, u->len);
    return respond_str(conn, 401,
                       "{\"type\":\"error\",\"error\":{\"type\":\"authentication_error\","
                       "\"message\":\"invalid x-api-key\"}}",
                       NULL);
  }
  if (!auth_ok) {
    record_request("401", false, ctype, u->buf, u->len);
    /* OpenAI's 401 text quotes the key it was given: the client must scrub it. */
    json_object *e = json_object_new_object(), *o = json_object_new_object();
    char msg[1024];
    snprintf(msg, sizeof msg,
             "Incorrect API key provided: %s. You can find your API key at "
             "https://platform.openai.com/account/api-keys.",
             auth && strncmp(auth, "Bearer ", 7) == 0 ? auth + 7 : "(none)");
    json_object_object_add(e, "message", json_object_new_string(msg));
    json_object_object_add(e, "type", json_object_new_string("invalid_request_error"));
    json_object_object_add(e, "code", json_object_new_string("invalid_api_key"));
    json_object_object_add(o, "error", e);
    enum MHD_Result ret = respond_str(conn, 401, json_object_to_json_string(o), NULL);
    json_object_put(o);
    return ret;
  }

  char *step = take_step();
  record_request(step ? step : "(exhausted)", true, ctype, u->buf, u->len);
  enum MHD_Result ret;
  if (!step)
    ret =
        respond_str(conn, 500, "{\"error\":{\"message\":\"fake-openai: script exhausted\"}}", NULL);
  else if (strcmp(step, "tool_calls") == 0)
    ret = respond_str(conn, 200, tool_calls_body, NULL);
  else if (strcmp(step, "final") == 0)
    ret = respond_str(conn, 200, final_body, NULL);
  else if (strncmp(step, "429:", 4) == 0)
    ret = respond_str(conn, 429,
                      "{\"error\":{\"message\":\"Rate limit reached for gpt-6-luna\","
                      "\"type\":\"requests\",\"code\":\"rate_limit_exceeded\"}}",
                      step + 4);
  else if (strcmp(step, "500") == 0)
    ret = respond_str(conn, 500,
                      "{\"error\":{\"message\":\"The server had an error while processing your "
                      "request.\",\"type\":\"server_error\"}}",
                      NULL);
  else if (strcmp(step, "400") == 0)
    ret = respond_str(conn, 400,
                      "{\"error\":{\"message\":\"Invalid 'messages[1].role': fake rejection.\","
                      "\"type\":\"invalid_request_error\"}}",
                      NULL);
  else if (strcmp(step, "malformed") == 0)
    ret = respond_str(conn, 200, "{\"id\":\"chatcmpl-x\",\"choices\":[{\"message\":", NULL);
  else if (strncmp(step, "slow:", 5) == 0) {
    long ms = strtol(step + 5, NULL, 10);
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    ret = respond_str(conn, 200, final_body, NULL);
  } else if (strncmp(step, "line:", 5) == 0)
    ret = serve_line(conn, step + 5);
  else if (strncmp(step, "file:", 5) == 0)
    ret = serve_file(conn, step + 5, 200);
  else if (strncmp(step, "file400:", 8) == 0)
    ret = serve_file(conn, step + 8, 400);
  else if (strncmp(step, "sse:", 4) == 0)
    ret = serve_sse(conn, step + 4, false, false);
  else if (strncmp(step, "ssecut:", 7) == 0)
    ret = serve_sse(conn, step + 7, true, false);
  else if (strncmp(step, "sseslow:", 8) == 0)
    ret = serve_sse(conn, step + 8, true, true);
  else if (strcmp(step, "529") == 0)
    ret = respond_str(conn, 529,
                      "{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\","
                      "\"message\":\"Overloaded\"}}",
                      NULL);
  else
    ret = respond_str(conn, 500, "{\"error\":{\"message\":\"fake-openai: unknown step\"}}", NULL);
  free(step);
  return ret;
}

static void
on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
             enum MHD_RequestTerminationCode toe)
{
  upload_t *u = *con_cls;
  if (u) {
    free(u->buf);
    free(u);
    *con_cls = NULL;
  }
}

int
main(int argc, char **argv)
{
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--key") == 0 && i + 1 < argc)
      expected_key = argv[++i];
    else if (strcmp(argv[i], "--record") == 0 && i + 1 < argc) {
      if (!(record = fopen(argv[++i], "a"))) {
        fprintf(stderr, "fake-openai: %s: %s\n", argv[i], strerror(errno));
        return 2;
      }
    } else if (strcmp(argv[i], "--script") == 0 && i + 1 < argc)
      load_script(argv[++i]);
    else if (argv[i][0] == '-') {
      fprintf(stderr, "usage: fake-openai [--key KEY] [--record FILE] [--script FILE] [STEP...]\n");
      return 2;
    } else
      add_step(argv[i]);
  }

  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG, 0, NULL,
      NULL, on_request, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
      MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_END);
  if (!d) {
    fprintf(stderr, "fake-openai: cannot start the HTTP server on 127.0.0.1\n");
    return 1;
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  if (!info || !info->port) {
    fprintf(stderr, "fake-openai: cannot read the bound port\n");
    return 1;
  }
  printf("%u\n", (unsigned)info->port);
  fflush(stdout);

  char buf[256];
  while (read(STDIN_FILENO, buf, sizeof buf) > 0)
    ;
  /* A slow step may still be sleeping in its connection thread: do not wait for it. */
  if (record)
    fflush(record);
  _exit(0);
}
