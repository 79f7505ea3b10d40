/* tool-connection against a hostile upstream (half of the program
 * tests/test-tool-connection, with tests/test-tool-connection.c). */
#include <config.h>

#include "tool-connection-tests.h"

/* ---------------------------------------------------------------- a hostile upstream
 *
 * It reflects the Authorization header it received in one of many encodings (the `form`
 * query parameter), in the body and in a response header between "<<" and ">>", in a
 * response header NAME (/hname), or after n bytes of padding so the reflection straddles
 * max_response_bytes (/pad?n=N). The encodings are made with OpenSSL (core's base64 helper,
 * OPENSSL_buf2hexstr_ex), as a real upstream would. */

struct MHD_Daemon *hostile;
static int hostile_port;

static char *
b64k(const char *in, size_t n, size_t k, bool url)
{
  char *buf = eph_xmalloc(n + k + 1);
  memset(buf, 'x', k);
  memcpy(buf + k, in, n);
  char *enc = eph_base64_encode(buf, n + k);
  free(buf);
  for (char *c = enc; url && *c; c++)
    *c = *c == '+' ? '-' : *c == '/' ? '_' : *c;
  return enc;
}

static char *
hexs(const char *in, size_t n, bool upper, const char *sep)
{
  char *out = eph_xmalloc(3 * n + 1);
  size_t len = 0;
  char *h = eph_xmalloc(2 * n + 1);
  assert_int_equal(OPENSSL_buf2hexstr_ex(h, 2 * n + 1, &len, (const unsigned char *)in, n, '\0'),
                   1);
  out[0] = 0;
  for (size_t i = 0; i < n; i++) {
    char pair[3] = {upper ? h[2 * i] : (char)tolower(h[2 * i]),
                    upper ? h[2 * i + 1] : (char)tolower(h[2 * i + 1]), 0};
    if (i && sep)
      strcat(out, sep);
    strcat(out, pair);
  }
  free(h);
  return out;
}

/* Each byte through fmt (e.g. "&#%d;"), or only the non-alphanumeric ones when punct_only. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
static char *
per_byte(const char *in, size_t n, const char *fmt, bool punct_only)
{
  char *out = eph_xmalloc(16 * n + 1);
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)in[i];
    if (punct_only && isalnum(ch))
      out[o++] = (char)ch;
    else
      o += (size_t)snprintf(out + o, 16, fmt, ch);
  }
  out[o] = 0;
  return out;
}
#pragma GCC diagnostic pop

static const char *const forms[] = {
    "raw",       "upper",    "lower",  "b64",      "b64k1",  "b64k2",    "b64url",
    "b64urlk1",  "b64urlk2", "b64hdr", "b64mime",  "b64pct", "hex",      "HEX",
    "hexspaced", "entdec",   "enthex", "entpunct", "pctall", "pctlower", "pctcurl",
    "jsonu",     "reversed", "spaced", "pctpct",   "entamp", NULL};

/* The upstream's transformation `form` of in[0..n). Heap. */
static char *
transform(const char *form, const char *in)
{
  size_t n = strlen(in);
  if (strcmp(form, "raw") == 0)
    return eph_xstrdup(in);
  if (strcmp(form, "upper") == 0 || strcmp(form, "lower") == 0) {
    char *o = eph_xstrdup(in);
    for (char *c = o; *c; c++)
      *c = (char)(form[0] == 'u' ? toupper((unsigned char)*c) : tolower((unsigned char)*c));
    return o;
  }
  if (strncmp(form, "b64", 3) == 0 && (form[3] == 0 || form[3] == 'k' || form[3] == 'u')) {
    bool url = strncmp(form, "b64url", 6) == 0;
    const char *k = strchr(form, 'k');
    return b64k(in, n, k ? (size_t)(k[1] - '0') : 0, url);
  }
  if (strcmp(form, "b64hdr") == 0) { /* the whole header line, as some debug APIs echo it */
    cleanup_free char *line = eph_xasprintf("Authorization: %s", in);
    return eph_base64_encode(line, strlen(line));
  }
  if (strcmp(form, "b64mime") == 0) { /* wrapped every 8 characters */
    cleanup_free char *enc = eph_base64_encode(in, n);
    char *o = eph_xmalloc(strlen(enc) * 2 + 1);
    size_t w = 0;
    for (size_t i = 0; enc[i]; i++) {
      if (i && i % 8 == 0) {
        o[w++] = '\r';
        o[w++] = '\n';
      }
      o[w++] = enc[i];
    }
    o[w] = 0;
    return o;
  }
  if (strcmp(form, "b64pct") == 0) {
    cleanup_free char *enc = eph_base64_encode(in, n);
    char *o = eph_xmalloc(3 * strlen(enc) + 1);
    size_t w = 0;
    for (size_t i = 0; enc[i]; i++)
      w += (size_t)(isalnum((unsigned char)enc[i]) ? sprintf(o + w, "%c", enc[i])
                                                   : sprintf(o + w, "%%%02X", enc[i]));
    return o;
  }
  if (strcmp(form, "hex") == 0 || strcmp(form, "HEX") == 0)
    return hexs(in, n, form[0] == 'H', NULL);
  if (strcmp(form, "hexspaced") == 0)
    return hexs(in, n, false, " ");
  if (strcmp(form, "entdec") == 0)
    return per_byte(in, n, "&#%d;", false);
  if (strcmp(form, "enthex") == 0)
    return per_byte(in, n, "&#x%02x;", false);
  if (strcmp(form, "entpunct") == 0)
    return per_byte(in, n, "&#%d;", true);
  if (strcmp(form, "pctall") == 0)
    return per_byte(in, n, "%%%02X", false);
  if (strcmp(form, "pctlower") == 0)
    return per_byte(in, n, "%%%02x", false);
  if (strcmp(form, "pctcurl") == 0)
    return per_byte(in, n, "%%%02X", true);
  if (strcmp(form, "pctpct") == 0) /* percent-encoded twice: %2573 */
    return per_byte(in, n, "%%25%02X", false);
  if (strcmp(form, "entamp") == 0) /* an entity escaped again: &amp;#115; */
    return per_byte(in, n, "&amp;#%d;", false);
  if (strcmp(form, "jsonu") == 0)
    return per_byte(in, n, "\\u%04x", false);
  if (strcmp(form, "reversed") == 0) {
    char *o = eph_xstrdup(in);
    for (size_t i = 0; i < n; i++)
      o[i] = in[n - 1 - i];
    return o;
  }
  if (strcmp(form, "spaced") == 0) {
    char *o = eph_xmalloc(2 * n + 1);
    for (size_t i = 0; i < n; i++) {
      o[2 * i] = in[i];
      o[2 * i + 1] = ' ';
    }
    o[n > 0 ? 2 * n - 1 : 0] = 0;
    return o;
  }
  fail_msg("no form %s", form);
  return NULL;
}

static enum MHD_Result
hostile_handle(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
               const char *version, const char *upload_data, size_t *upload_size, void **con_cls)
{
  (void)cls, (void)method, (void)version, (void)upload_data;
  if (!*con_cls) {
    *con_cls = (void *)1;
    return MHD_YES;
  }
  *upload_size = 0;
  const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
  const char *form = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "form");
  const char *pad = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "n");
  if (!auth)
    auth = "";
  cleanup_free char *t = transform(form ? form : "raw", auth);
  cleanup_free char *body = NULL;
  struct MHD_Response *r;
  if (strcmp(url, "/utf16") == 0) {
    /* "<<" Authorization ">>" in UTF-16LE: the broker hands it on as body_base64. */
    cleanup_free char *line = eph_xasprintf("<<%s>>", auth);
    size_t n = strlen(line);
    body = eph_xcalloc(2 * n, 1);
    for (size_t i = 0; i < n; i++)
      body[2 * i] = line[i];
    r = MHD_create_response_from_buffer(2 * n, body, MHD_RESPMEM_MUST_COPY);
  } else if (strcmp(url, "/split") == 0) {
    /* The secret (without "Bearer ") in two halves: two headers, and two places in the body. */
    const char *sp = strchr(auth, ' ');
    const char *sec = sp ? sp + 1 : auth;
    size_t half = strlen(sec) / 2;
    cleanup_free char *a = eph_xstrndup(sec, half);
    body = eph_xasprintf("first=%s; then some text; second=%s", a, sec + half);
    r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(r, "X-Part-1", a);
    MHD_add_response_header(r, "X-Part-2", sec + half);
  } else if (strcmp(url, "/hname") == 0) {
    /* The secret (without "Bearer ") as a header name. */
    const char *sp = strchr(auth, ' ');
    cleanup_free char *name = transform(form ? form : "raw", sp ? sp + 1 : auth);
    body = eph_xstrdup("{}");
    r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(r, name, "1");
    cleanup_free char *name2 = eph_xasprintf("X-%s-Echo", name);
    MHD_add_response_header(r, name2, "2");
  } else {
    size_t n = pad ? (size_t)atol(pad) : 0;
    body = eph_xmalloc(n + strlen(t) + 64 + 5);
    memset(body, '.', n);
    sprintf(body + n, "<<%s>>", t);
    memset(body + strlen(body), '.', 64);
    body[n + strlen(t) + 4 + 64] = 0;
    r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_COPY);
    if (!strpbrk(t, "\r\n")) {
      cleanup_free char *hv = eph_xasprintf("<<%s>>", t);
      MHD_add_response_header(r, "X-Reflect", hv);
    }
  }
  MHD_add_response_header(r, "Content-Type", "text/plain");
  enum MHD_Result ret = MHD_queue_response(conn, 200, r);
  MHD_destroy_response(r);
  return ret;
}

void
hostile_start(void)
{
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  hostile = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, hostile_handle, NULL,
                             MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_END);
  assert_non_null(hostile);
  hostile_port = MHD_get_daemon_info(hostile, MHD_DAEMON_INFO_BIND_PORT)->port;
}

/* Case-insensitive: does hay hold any window of `win` bytes of needle[0..n)? */
static bool
holds_window(const char *hay, const char *needle, size_t n, size_t win)
{
  cleanup_free char *h = eph_xstrdup(hay);
  for (char *c = h; *c; c++)
    *c = (char)tolower((unsigned char)*c);
  cleanup_free char *nd = eph_xstrndup(needle, n);
  for (char *c = nd; *c; c++)
    *c = (char)tolower((unsigned char)*c);
  if (n < win)
    win = n;
  for (size_t i = 0; i + win <= n; i++)
    if (memmem(h, strlen(h), nd + i, win))
      return true;
  return false;
}

/* Why text holds the secret in a form the test knows (heap), or NULL: 8 consecutive
 * characters of it (any case, also reversed), 16 of its hex, 12 of its base64 at any offset
 * (either alphabet). This is what "all but the last character" and every plain echo trip
 * over. */
static char *
form_in(const char *what, const char *text)
{
  const char *targets[] = {SECRET, BASIC_PW};
  for (size_t t = 0; t < 2; t++) {
    const char *s = targets[t];
    size_t n = strlen(s);
    cleanup_free char *rev = transform("reversed", s);
    cleanup_free char *hex = hexs(s, n, false, NULL);
    if (holds_window(text, s, n, 8) || holds_window(text, rev, n, 8) ||
        holds_window(text, hex, strlen(hex), 16))
      return eph_xasprintf("%s holds the secret %s (raw, reversed or hex): %s", what, s, text);
    for (size_t k = 0; k < 3; k++)
      for (int url = 0; url < 2; url++) {
        cleanup_free char *enc = b64k(s, n, k, url);
        size_t lo = (8 * k + 5) / 6, hi = 8 * (k + n) / 6;
        if (holds_window(text, enc + lo, hi - lo, 12))
          return eph_xasprintf("%s holds base64 of the secret %s (offset %zu): %s", what, s, k,
                               text);
      }
  }
  return NULL;
}

/* Why the result, a header name or value, the body, the events or the log holds a form of
 * the secret (heap), or NULL when none does. */
static char *
unclean(json_object *r)
{
  char *why = form_in(
      "the tool result",
      json_object_to_json_string_ext(r, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
  json_object *h = NULL;
  if (!why && json_object_object_get_ex(r, "headers", &h)) {
    json_object_object_foreach(h, k, v) {
      if (!why)
        why = form_in("a response header name", k);
      if (!why)
        why = form_in("a response header value", json_object_get_string(v));
    }
  }
  if (!why && str_of(r, "body"))
    why = form_in("the body", str_of(r, "body"));
  if (!why)
    why = form_in("the events",
                  json_object_to_json_string_ext(th.events, JSON_C_TO_STRING_PLAIN |
                                                                JSON_C_TO_STRING_NOSLASHESCAPE));
  if (!why)
    why = form_in("the log", th.log ? th.log : "");
  return why;
}

static void
assert_clean(json_object *r)
{
  cleanup_free char *why = unclean(r);
  if (why)
    fail_msg("%s", why);
}

/* Non-blank characters between "<<" (or the end of the '.' padding) and ">>" (or the end)
 * that are not "[REDACTED]": what is left of the reflection. */
static size_t
leftover(const char *text)
{
  const char *a = strstr(text, "<<");
  if (!a)
    return 0;
  a += 2;
  const char *e = strstr(a, ">>");
  size_t n = e ? (size_t)(e - a) : strlen(a), left = 0;
  for (size_t i = 0; i < n;) {
    if (strncmp(a + i, "[REDACTED]", 10) == 0) {
      i += 10;
      continue;
    }
    left += !isspace((unsigned char)a[i]);
    i++;
  }
  return left;
}

static size_t
nonblank(const char *s)
{
  size_t n = 0;
  for (; *s; s++)
    n += !isspace((unsigned char)*s);
  return n;
}

static const eph_plugin_slot_t *
load_hostile(int64_t max_response_bytes)
{
  eph_error_t err = {0};
  cleanup_free char *cfg =
      eph_xasprintf("tool-connection: { max_response_bytes = %lld; connections = ("
                    " { name = \"evil\"; base_url = \"http://127.0.0.1:%d\"; credential_env = "
                    "\"TOOLS_TEST_SECRET\";"
                    "   apply = \"bearer\"; methods = [\"GET\"]; path_prefixes = [\"/\"];"
                    "   allow_private_addresses = true; }"
                    "); };",
                    (long long)max_response_bytes, hostile_port);
  return th_load(&th_plugins, "tool-connection", cfg, 0, &err);
}

#define EVIL_GRANT "{\"connections\":[\"evil\"]}"

/* Finding 5: every encoding of the reflected Authorization header is scrubbed from the body
 * and from a header value; what is left of the reflection is the encoded "Bearer " prefix. */
void
test_hostile_encodings(void **state)
{
  const eph_plugin_slot_t *s = load_hostile(1048576);
  cleanup_free char *failed = eph_xstrdup("");
  for (size_t i = 0; forms[i]; i++) {
    cleanup_free char *args = eph_xasprintf(
        "{\"connection\":\"evil\",\"method\":\"GET\",\"path\":\"/reflect?form=%s\"}", forms[i]);
    json_object *r = request(s, args, EVIL_GRANT);
    if (str_of(r, "error"))
      fail_msg("%s: %s", forms[i], json_object_to_json_string(r));
    /* What the upstream made of the non-secret part ("Bearer ", or the header line). */
    cleanup_free char *pre =
        transform(forms[i], strcmp(forms[i], "b64hdr") == 0 ? "Authorization: Bearer " : "Bearer ");
    size_t bound = nonblank(pre) + 8;
    const char *body = str_of(r, "body");
    json_object *h = NULL;
    json_object_object_get_ex(r, "headers", &h);
    const char *hv = h ? str_of(h, "x-reflect") : NULL;
    char *why = unclean(r);
    if (!why && (!body || !strstr(body, "<<") || leftover(body) > bound))
      why = eph_xasprintf("%zu characters of the reflection left in the body (at most %zu): %s",
                          body ? leftover(body) : 0, bound, body ? body : "(none)");
    if (!why && hv && leftover(hv) > bound)
      why = eph_xasprintf("%zu characters of the reflection left in a header (at most %zu): %s",
                          leftover(hv), bound, hv);
    if (why) {
      print_message("form %s: %s\n", forms[i], why);
      char *more = eph_xasprintf("%s %s", failed, forms[i]);
      free(failed);
      failed = more;
      free(why);
    }
    json_object_put(r);
  }
  if (*failed)
    fail_msg("the secret leaked in these forms:%s", failed);
}

/* Finding 5: the secret as a response header name (raw, upper, hex, base64, reversed). */
void
test_hostile_header_names(void **state)
{
  const eph_plugin_slot_t *s = load_hostile(1048576);
  static const char *const names[] = {"raw", "upper",  "lower",    "hex",
                                      "b64", "b64url", "reversed", NULL};
  for (size_t i = 0; names[i]; i++) {
    cleanup_free char *args = eph_xasprintf(
        "{\"connection\":\"evil\",\"method\":\"GET\",\"path\":\"/hname?form=%s\"}", names[i]);
    json_object *r = request(s, args, EVIL_GRANT);
    if (str_of(r, "error"))
      fail_msg("%s: %s", names[i], json_object_to_json_string(r));
    assert_clean(r);
    json_object_put(r);
  }
}

/* Finding 5, beyond the brief: the secret split in halves (two headers, two places in the
 * body). Each half is longer than the scrubber's window, so each goes. */
void
test_hostile_split(void **state)
{
  const eph_plugin_slot_t *s = load_hostile(1048576);
  json_object *r =
      request(s, "{\"connection\":\"evil\",\"method\":\"GET\",\"path\":\"/split\"}", EVIL_GRANT);
  assert_null(str_of(r, "error"));
  json_object *h = NULL;
  assert_true(json_object_object_get_ex(r, "headers", &h));
  assert_string_equal(str_of(h, "x-part-1"), "[REDACTED]");
  assert_string_equal(str_of(h, "x-part-2"), "[REDACTED]");
  assert_string_equal(str_of(r, "body"), "first=[REDACTED]; then some text; second=[REDACTED]");
  assert_clean(r);
  json_object_put(r);
}

/* Finding 5, beyond the brief: the header in UTF-16 (a binary body, handed on as base64):
 * decoded, it holds no form of the secret. */
void
test_hostile_utf16(void **state)
{
  const eph_plugin_slot_t *s = load_hostile(1048576);
  json_object *r =
      request(s, "{\"connection\":\"evil\",\"method\":\"GET\",\"path\":\"/utf16\"}", EVIL_GRANT);
  assert_null(str_of(r, "error"));
  assert_clean(r);
  const char *b64 = str_of(r, "body_base64");
  assert_non_null(b64);
  unsigned char *raw = NULL;
  size_t n = 0;
  assert_int_equal(eph_base64_decode(b64, strlen(b64), &raw, &n), 0);
  cleanup_free char *text = eph_xcalloc(n + 1, 1);
  size_t w = 0;
  for (size_t i = 0; i < n; i++)
    if (raw[i])
      text[w++] = (char)raw[i];
  free(raw);
  cleanup_free char *why = form_in("the UTF-16 body, decoded", text);
  if (why)
    fail_msg("%s", why);
  assert_non_null(strstr(text, "<<Bearer [REDACTED]>>"));
  json_object_put(r);
}

/* Finding 5: a response cut at max_response_bytes inside the reflected value leaks no part
 * of it: it is scrubbed before the cut. Cut 1 character in, half way, and before the last. */
void
test_hostile_truncation(void **state)
{
  const int64_t cap = 1024;
  const eph_plugin_slot_t *s = load_hostile(cap);
  static const char *const cut_forms[] = {"raw",    "upper",  "b64",      "b64k1", "hex",
                                          "entdec", "pctall", "reversed", NULL};
  cleanup_free char *auth = eph_xasprintf("Bearer %s", SECRET);
  for (size_t i = 0; cut_forms[i]; i++) {
    cleanup_free char *t = transform(cut_forms[i], auth);
    cleanup_free char *pre = transform(cut_forms[i], "Bearer ");
    size_t tl = strlen(t), pl = strlen(pre);
    size_t at[] = {pl + 1, pl + (tl - pl) / 2, tl - 1};
    for (size_t j = 0; j < 3; j++) {
      /* "<<" then t: the cut falls at[j] characters into t. */
      size_t pad = (size_t)cap - 2 - at[j];
      cleanup_free char *args = eph_xasprintf(
          "{\"connection\":\"evil\",\"method\":\"GET\",\"path\":\"/pad?form=%s&n=%zu\"}",
          cut_forms[i], pad);
      json_object *r = request(s, args, EVIL_GRANT);
      if (str_of(r, "error"))
        fail_msg("%s: %s", cut_forms[i], json_object_to_json_string(r));
      assert_clean(r);
      json_object *tr = NULL;
      assert_true(json_object_object_get_ex(r, "truncated", &tr) && json_object_get_boolean(tr));
      const char *body = str_of(r, "body");
      assert_non_null(body);
      if (leftover(body) > nonblank(pre) + 8)
        fail_msg("%s cut %zu in: %zu characters of the reflection left: ...%s", cut_forms[i], at[j],
                 leftover(body), body + pad);
      assert_true(strlen(body) <= (size_t)cap + 10);
      json_object_put(r);
    }
  }
}
