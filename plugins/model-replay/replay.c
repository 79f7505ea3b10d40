/* model-replay: answers model calls from a recorded transcript instead of a model API.
 *
 * A transcript is JSONL: one response body per line, exactly what the provider plugin
 * returned in resp->raw (and what `--record` writes): a Chat Completions body, a Responses
 * API object or an Anthropic message, each read with its provider's own parser. The plugin keeps no
 * per-run state: the response to give is line N+1 where N is the number of assistant
 * messages already in req->messages, so any number of runs can replay concurrently and a
 * run can be replayed again from the start. What it keeps is the parsed transcript
 * (transcript.h): each call reads the file, and parses it only when its bytes are not
 * those of a transcript already parsed, so a run's calls cost in proportion to its length
 * rather than its square.
 *
 * Before answering it checks that the run still follows the transcript, and fails with
 * -EPH_E_DIVERGED naming the transcript line when it does not:
 *  - the transcript has no line N+1 (exhausted);
 *  - an earlier assistant message differs from the recorded response (content, or a tool
 *    call's name or arguments; arguments are compared as JSON values);
 *  - a tool call of an earlier response has no tool message answering its id.
 * A recorded tool call naming a tool the run does not offer is NOT a divergence: the
 * answer is returned as recorded and the core's gate denies the call.
 *
 * The transcript is `transcript` from the config block, or, when the request's model is
 * "replay:PATH", PATH (absolute or relative to the current directory).
 *
 * A recorded assistant text may quote the real results of this run's tool calls, so that a
 * replayed answer reports what this sandbox did rather than what the recorded one did:
 * `{{call_N.FIELD}}` is replaced by FIELD of the result of the run's N-th tool call (1-based,
 * in order over every assistant message; FIELD a key of the tool's JSON result such as
 * stdout, stderr or exit_code; a string without its trailing newlines), and
 * `{{call_N.FIELD#K}}` by its K-th line. A reference to a call the run did not make or a
 * field its result lacks is a divergence. The answer names its provenance
 * (replayed_from, recorded_model) so the core reports the run as replayed. */
#include "config.h" /* autoconf: _GNU_SOURCE, PACKAGE_VERSION */

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ephemeral/plugin.h>

#include "support/model_chat.h"
#include "support/model_messages.h"
#include "support/model_responses.h"
#include "transcript.h"

#define MODEL_PREFIX "replay:"

static const eph_config_key_t replay_keys[] = {
    {"transcript", EPH_CFG_STRING, "\"\"", NULL,
     "Transcript replayed when the request's model is not \"replay:PATH\": JSONL, one "
     "recorded response body per line (Chat Completions, Responses API or Anthropic Messages, "
     "as --record writes them). A relative path is looked up under the data "
     "directory first, then the current directory."},
    {"pace", EPH_CFG_BOOL, "false", NULL,
     "Sleep each line's recorded x_latency_ms before answering, so a replay keeps the "
     "original run's timing (never past the call's deadline)."},
    {0},
};

typedef struct replay {
  const eph_host_t *host;
  char *transcript; /* configured transcript, resolved; NULL when unset */
  int pace;
  transcript_cache_t cache; /* transcripts parsed once, shared by the runs (transcript.h) */
} replay_t;

/* A JSON text shortened for messages. */
static void
shorten(const char *s, char *out, size_t size)
{
  size_t n = strlen(s);
  if (n < size) {
    memcpy(out, s, n + 1);
    return;
  }
  memcpy(out, s, size - 4);
  memcpy(out + size - 4, "...", 4);
}

static const char *
content_of(json_object *msg)
{
  const char *c = eph_json_get_string(msg, "content");
  return c ? c : "";
}

static json_object *
tool_calls_of(json_object *msg)
{
  json_object *v = NULL;
  if (json_object_object_get_ex(msg, "tool_calls", &v) && json_object_is_type(v, json_type_array))
    return v;
  return NULL;
}

static json_object *
function_of(json_object *call)
{
  json_object *f = NULL;
  if (call && json_object_object_get_ex(call, "function", &f) &&
      json_object_is_type(f, json_type_object))
    return f;
  return NULL;
}

/* Arguments are a JSON text: compare values, so whitespace or key order is no divergence. */
static bool
arguments_equal(const char *a, const char *b)
{
  if (strcmp(a, b) == 0)
    return true;
  json_object *ja = json_tokener_parse(a), *jb = json_tokener_parse(b);
  bool eq = ja && jb && json_object_equal(ja, jb);
  if (ja)
    json_object_put(ja);
  if (jb)
    json_object_put(jb);
  return eq;
}

/* Compares the run's k-th assistant message with the recorded one (normalised). */
static int
compare_assistant(json_object *live, json_object *rec, size_t k, const char *where,
                  eph_error_t *err)
{
  char a[160], b[160];
  if (strcmp(content_of(live), content_of(rec)) != 0) {
    shorten(content_of(live), a, sizeof a);
    shorten(content_of(rec), b, sizeof b);
    return eph_error_set(err, EPH_E_DIVERGED,
                         "%s: the run's assistant message %zu has content \"%s\", the transcript "
                         "recorded \"%s\"",
                         where, k + 1, a, b);
  }
  json_object *lc = tool_calls_of(live), *rc = tool_calls_of(rec);
  size_t ln = lc ? json_object_array_length(lc) : 0, rn = rc ? json_object_array_length(rc) : 0;
  if (ln != rn)
    return eph_error_set(err, EPH_E_DIVERGED,
                         "%s: the run's assistant message %zu has %zu tool calls, the transcript "
                         "recorded %zu",
                         where, k + 1, ln, rn);
  for (size_t i = 0; i < ln; i++) {
    json_object *lf = function_of(json_object_array_get_idx(lc, i));
    json_object *rf = function_of(json_object_array_get_idx(rc, i));
    const char *lname = eph_json_get_string(lf, "name"), *rname = eph_json_get_string(rf, "name");
    const char *largs = eph_json_get_string(lf, "arguments");
    const char *rargs = eph_json_get_string(rf, "arguments");
    if (!lname || !largs)
      return eph_error_set(err, EPH_E_DIVERGED,
                           "%s: the run's assistant message %zu tool call %zu has no function "
                           "name or arguments",
                           where, k + 1, i + 1);
    if (strcmp(lname, rname) != 0)
      return eph_error_set(err, EPH_E_DIVERGED,
                           "%s: the run's assistant message %zu tool call %zu is \"%s\", the "
                           "transcript recorded \"%s\"",
                           where, k + 1, i + 1, lname, rname);
    if (!arguments_equal(largs, rargs)) {
      shorten(largs, a, sizeof a);
      shorten(rargs, b, sizeof b);
      return eph_error_set(err, EPH_E_DIVERGED,
                           "%s: the run's assistant message %zu tool call %zu (%s) has arguments "
                           "%s, the transcript recorded %s",
                           where, k + 1, i + 1, lname, a, b);
    }
  }
  return 0;
}

/* Every tool call of the assistant message at index `at` must be answered by a tool message
 * carrying its id before the next assistant message. */
static int
check_tool_results(json_object *messages, size_t at, size_t k, const char *where, eph_error_t *err)
{
  json_object *calls = tool_calls_of(json_object_array_get_idx(messages, at));
  size_t total = json_object_array_length(messages);
  size_t end = at + 1;
  while (end < total) {
    const char *role = eph_json_get_string(json_object_array_get_idx(messages, end), "role");
    if (role && strcmp(role, "assistant") == 0)
      break;
    end++;
  }
  for (size_t i = 0; calls && i < json_object_array_length(calls); i++) {
    json_object *call = json_object_array_get_idx(calls, i);
    const char *id = eph_json_get_string(call, "id");
    const char *name = eph_json_get_string(function_of(call), "name");
    bool found = false;
    for (size_t m = at + 1; id && m < end && !found; m++) {
      json_object *msg = json_object_array_get_idx(messages, m);
      const char *role = eph_json_get_string(msg, "role");
      const char *tid = eph_json_get_string(msg, "tool_call_id");
      found = role && tid && strcmp(role, "tool") == 0 && strcmp(tid, id) == 0;
    }
    if (!found)
      return eph_error_set(err, EPH_E_DIVERGED,
                           "%s: no tool message answers tool call %s (%s) of assistant message "
                           "%zu",
                           where, id ? id : "(no id)", name ? name : "?", k + 1);
  }
  return 0;
}

/* ---------------------------------------------------------------- {{call_N.FIELD}} */

/* The parsed tool result (the tool message's JSON content) of the run's n-th tool call
 * (1-based), or NULL. *calls counts the run's tool calls. Owned by the caller. */
static json_object *
nth_call_result(json_object *messages, size_t n, size_t *calls)
{
  size_t total = json_object_array_length(messages), k = 0;
  const char *want = NULL;
  for (size_t m = 0; m < total; m++) {
    json_object *msg = json_object_array_get_idx(messages, m);
    const char *role = eph_json_get_string(msg, "role");
    json_object *tcs = role && strcmp(role, "assistant") == 0 ? tool_calls_of(msg) : NULL;
    for (size_t i = 0; tcs && i < json_object_array_length(tcs); i++)
      if (++k == n)
        want = eph_json_get_string(json_object_array_get_idx(tcs, i), "id");
  }
  *calls = k;
  for (size_t m = 0; want && m < total; m++) {
    json_object *msg = json_object_array_get_idx(messages, m);
    const char *role = eph_json_get_string(msg, "role");
    const char *tid = eph_json_get_string(msg, "tool_call_id");
    if (role && tid && strcmp(role, "tool") == 0 && strcmp(tid, want) == 0) {
      const char *content = eph_json_get_string(msg, "content");
      return content ? json_tokener_parse(content) : NULL;
    }
  }
  return NULL;
}

/* Appends the value of one reference "call_N.FIELD[#K]" (ref, len bytes) to *buf. */
static int
expand_ref(const char *ref, size_t len, json_object *messages, const char *where, char **buf,
           size_t *used, eph_error_t *err)
{
  char spec[128], field[64] = "";
  unsigned long n = 0, line = 0;
  int consumed = 0, tail = 0;
  if (len >= sizeof spec)
    return eph_error_set(err, EPH_E_PROTOCOL, "%s: template {{%.*s...}} is too long", where, 32,
                         ref);
  memcpy(spec, ref, len);
  spec[len] = '\0';
  bool ok = sscanf(spec, "call_%lu.%63[A-Za-z0-9_]%n", &n, field, &consumed) == 2 && n > 0;
  if (ok && spec[consumed]) /* "#LINE" and nothing after it */
    ok = sscanf(spec + consumed, "#%lu%n", &line, &tail) == 1 && line > 0 &&
         spec[consumed + tail] == '\0';
  if (!ok)
    return eph_error_set(err, EPH_E_PROTOCOL,
                         "%s: template {{%s}} is not {{call_N.FIELD}} or {{call_N.FIELD#LINE}}",
                         where, spec);
  size_t calls = 0;
  json_object *result = nth_call_result(messages, n, &calls);
  json_object *v = NULL;
  if (!result || !json_object_object_get_ex(result, field, &v)) {
    int r = result ? eph_error_set(err, EPH_E_DIVERGED,
                                   "%s: the answer quotes {{%s}} but the result of the run's "
                                   "tool call %lu has no '%s'",
                                   where, spec, n, field)
                   : eph_error_set(err, EPH_E_DIVERGED,
                                   "%s: the answer quotes {{%s}} but the run made %zu tool "
                                   "call%s",
                                   where, spec, calls, calls == 1 ? "" : "s");
    if (result)
      json_object_put(result);
    return r;
  }
  const char *text = json_object_is_type(v, json_type_string)
                         ? json_object_get_string(v)
                         : json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN);
  size_t tlen = strlen(text);
  if (line) { /* the line-th line, without its newline */
    for (unsigned long l = 1; l < line && text; l++) {
      const char *nl = memchr(text, '\n', tlen);
      tlen -= nl ? (size_t)(nl + 1 - text) : tlen;
      text = nl ? nl + 1 : NULL;
    }
    const char *nl = text ? memchr(text, '\n', tlen) : NULL;
    if (!text || (!nl && tlen == 0)) {
      json_object_put(result);
      return eph_error_set(err, EPH_E_DIVERGED,
                           "%s: the answer quotes {{%s}} but that output has fewer lines", where,
                           spec);
    }
    if (nl)
      tlen = (size_t)(nl - text);
  }
  while (tlen && (text[tlen - 1] == '\n' || text[tlen - 1] == '\r'))
    tlen--;
  char *nb = realloc(*buf, *used + tlen + 1);
  if (!nb) {
    json_object_put(result);
    return eph_error_set(err, ENOMEM, "out of memory");
  }
  memcpy(nb + *used, text, tlen);
  *used += tlen;
  nb[*used] = '\0';
  *buf = nb;
  json_object_put(result);
  return 0;
}

/* Replaces the {{call_N.FIELD}} references in msg's content with this run's tool results
 * (from messages). A content without "{{call_" is left as it is. */
static int
expand_message(json_object *msg, json_object *messages, const char *where, eph_error_t *err)
{
  const char *content = msg ? eph_json_get_string(msg, "content") : NULL;
  if (!content || !strstr(content, "{{call_"))
    return 0;
  char *buf = NULL;
  size_t used = 0;
  const char *p = content;
  int r = 0;
  while (r == 0 && *p) {
    const char *open = strstr(p, "{{call_");
    const char *close = open ? strstr(open, "}}") : NULL;
    size_t lit = open && close ? (size_t)(open - p) : strlen(p);
    char *nb = realloc(buf, used + lit + 1);
    if (!nb) {
      r = eph_error_set(err, ENOMEM, "out of memory");
      break;
    }
    buf = nb;
    memcpy(buf + used, p, lit);
    used += lit;
    buf[used] = '\0';
    if (!open || !close)
      break;
    r = expand_ref(open + 2, (size_t)(close - open - 2), messages, where, &buf, &used, err);
    p = close + 2;
  }
  if (r == 0)
    json_object_object_add(msg, "content", json_object_new_string(buf ? buf : ""));
  free(buf);
  return r;
}

/* A transcript line is the body its provider returned (what --record writes), read with
 * that provider's own parser; the wire format itself says which: Chat Completions bodies
 * have "choices", Responses API objects are {"object":"response"}, Anthropic messages are
 * {"type":"message"}. */
static int
parse_line(json_object *line, const char *where, eph_model_response_t *resp, eph_error_t *err)
{
  json_object *v = NULL;
  const char *object = eph_json_get_string(line, "object");
  const char *type = eph_json_get_string(line, "type");
  if (object && strcmp(object, "response") == 0)
    return eph_responses_parse(line, where, resp, err);
  if (type && strcmp(type, "message") == 0 && !json_object_object_get_ex(line, "choices", &v))
    return eph_messages_parse(line, where, resp, err);
  return eph_chat_parse_response(line, where, resp, err);
}

/* This call's own copy of line k of t (the shared one is only read), or NULL with err set. */
static json_object *
line_copy(const transcript_t *t, size_t k, eph_error_t *err)
{
  json_object *copy = NULL;
  if (json_object_deep_copy(t->lines[k], &copy, NULL) < 0) {
    eph_error_set(err, ENOMEM, "out of memory");
    return NULL;
  }
  return copy;
}

static int
replay_answer(replay_t *s, const transcript_t *t, const eph_model_request_t *req,
              eph_model_response_t *resp, eph_error_t *err)
{
  char where[4096];
  size_t total = json_object_array_length(req->messages), k = 0;
  int r;

  for (size_t m = 0; m < total; m++) {
    json_object *msg = json_object_array_get_idx(req->messages, m);
    const char *role = eph_json_get_string(msg, "role");
    if (!role || strcmp(role, "assistant") != 0)
      continue;
    if (k >= t->n)
      return eph_error_set(err, EPH_E_DIVERGED,
                           "%s: the run holds more assistant messages than the transcript's %zu "
                           "responses",
                           t->path, t->n);
    snprintf(where, sizeof where, "%s:%zu", t->path, t->lineno[k]);
    /* The recorded message as parsed once (shared: only read), or this call's own copy
     * where it quotes the run's results or where the parser refused the line (parsed
     * again here for its error). */
    json_object *rec = t->recorded[k], *own = NULL;
    const char *content = eph_json_get_string(rec, "content");
    if (!rec) {
      json_object *line = line_copy(t, k, err);
      eph_model_response_t parsed = {.struct_size = sizeof parsed};
      r = line ? parse_line(line, where, &parsed, err) : -ENOMEM;
      if (line)
        json_object_put(line);
      if (r < 0)
        return r;
      own = rec = parsed.message;
      parsed.message = NULL;
      eph_model_response_clear(&parsed);
    } else if (content && strstr(content, "{{call_")) {
      if (json_object_deep_copy(rec, &own, NULL) < 0)
        return eph_error_set(err, ENOMEM, "out of memory");
      rec = own;
    }
    r = own ? expand_message(own, req->messages, where, err) : 0;
    if (r == 0)
      r = compare_assistant(msg, rec, k, where, err);
    if (own)
      json_object_put(own);
    if (r < 0 || (r = check_tool_results(req->messages, m, k, where, err)) < 0)
      return r;
    k++;
  }
  if (k >= t->n)
    return eph_error_set(err, EPH_E_DIVERGED,
                         "%s: transcript exhausted: it holds %zu responses and the run asks for "
                         "response %zu",
                         t->path, t->n, k + 1);

  snprintf(where, sizeof where, "%s:%zu", t->path, t->lineno[k]);
  /* The answer is read from this call's copy of the line, which becomes resp->raw: the
   * caller owns both, and the shared transcript is never handed out. */
  json_object *line = line_copy(t, k, err);
  if (!line)
    return -ENOMEM;
  if ((r = parse_line(line, where, resp, err)) < 0) {
    json_object_put(line);
    return r;
  }
  if ((r = expand_message(resp->message, req->messages, where, err)) < 0) {
    eph_model_response_clear(resp);
    json_object_put(line);
    return r;
  }
  if (EPH_MODEL_RESPONSE_HAS_REPLAY(resp)) {
    const char *model = eph_json_get_string(line, "model");
    snprintf(resp->replayed_from, sizeof resp->replayed_from, "%s", where);
    snprintf(resp->recorded_model, sizeof resp->recorded_model, "%s", model ? model : "");
  }

  json_object *lat = NULL;
  if (s->pace && json_object_object_get_ex(line, "x_latency_ms", &lat) &&
      json_object_is_type(lat, json_type_int)) {
    int64_t ms = json_object_get_int64(lat);
    bool late = req->deadline_ms > 0 && eph_now_ms() + ms > req->deadline_ms;
    if (late)
      ms = req->deadline_ms - eph_now_ms();
    if (ms > 0) {
      struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
      while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
    }
    if (late) {
      eph_model_response_clear(resp);
      r = eph_error_set(err, ETIMEDOUT,
                        "%s: the recorded latency (%lld ms) passes the run deadline", where,
                        (long long)json_object_get_int64(lat));
      json_object_put(line);
      return r;
    }
  }
  resp->raw = line;
  if (s->host && s->host->log)
    s->host->log(EPH_LOG_DEBUG, "replayed %s (%llu+%llu tokens, %s)", where,
                 (unsigned long long)resp->input_tokens, (unsigned long long)resp->output_tokens,
                 resp->finish_reason);
  return 0;
}

static int
replay_complete(void *state, const eph_model_request_t *req, eph_model_response_t *resp,
                eph_error_t *err)
{
  replay_t *s = state;
  const char *path;

  resp->message = resp->raw = NULL;
  resp->finish_reason[0] = '\0';
  resp->input_tokens = resp->output_tokens = 0;
  if (!req || !req->messages || !json_object_is_type(req->messages, json_type_array))
    return eph_error_set(err, EINVAL, "model request: a messages array is required");
  if (req->model && strncmp(req->model, MODEL_PREFIX, strlen(MODEL_PREFIX)) == 0) {
    path = req->model + strlen(MODEL_PREFIX);
    if (!*path)
      return eph_error_set(err, EINVAL, "model \"%s\": no transcript path after \"%s\"", req->model,
                           MODEL_PREFIX);
  } else {
    path = s->transcript;
    if (!path)
      return eph_error_set(err, EPH_E_CONFIG,
                           "no transcript to replay: set `transcript` in the model-replay block "
                           "or use the model \"replay:PATH\"");
  }

  transcript_t *t = NULL;
  int r = transcript_get(&s->cache, s->host, path, parse_line, &t, err);
  if (r < 0)
    return r;
  r = replay_answer(s, t, req, resp, err);
  transcript_release(&s->cache, t);
  return r;
}

/* Ready when the transcript a run of model would replay opens (exists, readable, a regular
 * file within the size cap). Not parsed: the health check calls this every second. */
static int
replay_ready(void *state, const char *model, eph_error_t *err)
{
  replay_t *s = state;
  const char *path = s->transcript;
  if (model && strncmp(model, MODEL_PREFIX, strlen(MODEL_PREFIX)) == 0)
    path = model + strlen(MODEL_PREFIX);
  if (!path || !*path)
    return eph_error_set(err, EPH_E_CONFIG,
                         "no transcript to replay: set `transcript` in the model-replay block "
                         "or use the model \"replay:PATH\"");
  int fd = transcript_open(path, err);
  if (fd < 0)
    return fd;
  close(fd);
  return 0;
}

static void
replay_fini(void *state)
{
  replay_t *s = state;
  if (!s)
    return;
  transcript_cache_fini(&s->cache);
  free(s->transcript);
  free(s);
}

static int
replay_init(const eph_host_t *host, const config_setting_t *config, void **state, eph_error_t *err)
{
  const char *path = NULL;
  int pace = 0, r;
  if ((r = host->cfg_string(config, "transcript", "", &path, err)) < 0 ||
      (r = host->cfg_bool(config, "pace", 0, &pace, err)) < 0)
    return r;

  replay_t *s = calloc(1, sizeof *s);
  if (!s)
    return eph_error_set(err, ENOMEM, "out of memory");
  s->host = host;
  s->pace = pace;
  transcript_cache_init(&s->cache);
  if (*path) {
    struct stat st;
    char *under_data = NULL;
    /* Shipped transcripts live in the data directory; a relative path names one of them
     * when it exists there, otherwise a file relative to the current directory. */
    if (path[0] != '/' && host->data_dir &&
        asprintf(&under_data, "%s/%s", host->data_dir, path) < 0)
      under_data = NULL;
    if (under_data && stat(under_data, &st) == 0) {
      /* Canonical, as a replayed run names it ("replayed from PATH:LINE"). */
      s->transcript = realpath(under_data, NULL);
      if (s->transcript)
        free(under_data);
      else
        s->transcript = under_data;
    } else {
      free(under_data);
      s->transcript = strdup(path);
    }
    if (!s->transcript) {
      transcript_cache_fini(&s->cache);
      free(s);
      return eph_error_set(err, ENOMEM, "out of memory");
    }
  }
  *state = s;
  return 0;
}

static const eph_model_ops_t replay_ops = {
    .struct_size = sizeof(eph_model_ops_t),
    .complete = replay_complete,
    .ready = replay_ready,
};

EPH_PLUGIN_EXPORT = {
    .abi_major = EPH_ABI_MAJOR,
    .abi_minor = EPH_ABI_MINOR,
    .struct_size = sizeof(eph_plugin_t),
    .name = "model-replay",
    .kind = EPH_KIND_MODEL,
    .version = PACKAGE_VERSION,
    .description = "Replays a recorded Chat Completions transcript (JSONL) with divergence checks",
    .config_keys = replay_keys,
    .init = replay_init,
    .fini = replay_fini,
    .ops = &replay_ops,
};
