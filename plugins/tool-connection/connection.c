/* tool-connection: the broker. The operator defines connections in conf.d (base URL,
 * credential, how it is applied, allowed methods and path prefixes); a run's permission
 * table names the connections it may use and may narrow their methods. The tool call names
 * a connection, a method and a path; everything is decided here, on the host, BEFORE any
 * network I/O: grant, method (operator ∩ grant), path (normalised, under an allowed
 * prefix), headers (only the connection's allow-list; the caller cannot place or override
 * the credential, nor override the method or URL). The credential is read at init, added per
 * request, and scrubbed in every form the scrubber knows (see "the scrubber") from
 * everything that leaves: results, events, logs. Redirects are never followed: a
 * credential must not travel to a Location the operator did not name. In the spirit of
 * OpenSSH's monitor: the side holding secrets serves a fixed table of allowed requests. */
#include "config.h"

#include <ctype.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <curl/curl.h>
#include <openssl/crypto.h>

#include <ephemeral/plugin.h>

#include "../tool-web/net.h"
#include "../tool-web/plugin-util.h"

typedef enum apply { APPLY_BEARER, APPLY_BASIC, APPLY_HEADER, APPLY_QUERY } apply_t;

/* The scrubber's views of a text (see "the scrubber"). */
enum { VIEW_PLAIN = 0, VIEW_DECODED = 1, VIEW_DECODED2 = 2, N_VIEWS = 3 };

typedef struct conn {
  char *name;
  char *base_url;  /* without trailing '/' */
  char *base_path; /* path part of base_url, without trailing '/' ("" for the root) */
  char *secret;    /* NULL when the credential could not be read: the connection refuses */
  apply_t apply;
  char *header_name; /* APPLY_HEADER */
  char *query_param; /* APPLY_QUERY */
  char **methods;
  size_t n_methods;
  char **prefixes;
  size_t n_prefixes;
  char **allowed_headers; /* lower case: the only caller headers that go out */
  size_t n_allowed_headers;
  eph_net_policy_t policy;
  /* Forms of the secret to remove from anything returned, normalised for each view of a
   * text (see "the scrubber" below), indexed by view (VIEW_PLAIN ...). */
  char **forms[N_VIEWS];
  size_t n_forms[N_VIEWS];
  size_t margin_bytes; /* read past max_response_bytes so a form cut there is still seen */
} conn_t;

typedef struct broker {
  const eph_host_t *host;
  conn_t *conns;
  size_t n_conns;
  int64_t max_response_bytes, timeout_ms, price_micros;
} broker_t;

static const eph_config_key_t broker_keys[] = {
    {"connections", EPH_CFG_LIST, "()", NULL,
     "The connections, a list of groups: name, base_url, credential_file or credential_env, "
     "apply (\"bearer\" | \"basic\" | \"header\" | \"query\"), header_name / query_param, "
     "methods (list), path_prefixes (list), allowed_headers (list: the only caller headers "
     "that go out, case-insensitive; default Accept, Accept-Language, Content-Type, "
     "User-Agent, If-Match, If-None-Match, If-Modified-Since, If-Unmodified-Since; others are "
     "dropped with a header_dropped event; credential, transport, Accept-Encoding, Range and "
     "method/URL override headers cannot be listed), allow_private_addresses (bool: also "
     "allows loopback). Empty: the broker offers nothing."},
    {"max_response_bytes", EPH_CFG_INT, "1048576", "bytes",
     "Response body bytes kept, at most 1073741824. The broker reads a little further (about "
     "32 times the credential's length) so that a form of the credential the cut falls into "
     "is scrubbed whole before the body is cut here.", EPH_CFG_RANGE(1, 1073741824)},
    {"timeout_ms", EPH_CFG_INT, "30000", "milliseconds", "Time limit of one request.",
     EPH_CFG_RANGE(1, INT64_MAX)},
    {"price_micros_per_request", EPH_CFG_INT, "0", "micros",
     "Charged to the run (category web) before each request.", EPH_CFG_RANGE(0, INT64_MAX)},
    {0},
};

static const eph_tool_def_t broker_tools[] = {
    {"connection_request",
     "Call an operator-defined API connection. The broker adds the credential; you choose "
     "only the connection, method, path (relative to the connection's base URL, starting "
     "with /), optional headers and body. Returns status, headers and body.",
     "{\"type\":\"object\",\"properties\":{"
     "\"connection\":{\"type\":\"string\"},"
     "\"method\":{\"type\":\"string\"},"
     "\"path\":{\"type\":\"string\",\"description\":\"starts with /, may carry ?query\"},"
     "\"headers\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"}},"
     "\"body\":{\"type\":\"string\"}},"
     "\"required\":[\"connection\",\"method\",\"path\"],\"additionalProperties\":false}",
     EPH_PERM_CONNECTIONS},
};

/* ---------------------------------------------------------------- config */

static void
strv_free(char **v, size_t n)
{
  for (size_t i = 0; i < n; i++)
    free(v[i]);
  free(v);
}

static void
conn_clear(conn_t *c)
{
  free(c->name);
  free(c->base_url);
  free(c->base_path);
  if (c->secret) {
    explicit_bzero(c->secret, strlen(c->secret));
    free(c->secret);
  }
  free(c->header_name);
  free(c->query_param);
  strv_free(c->methods, c->n_methods);
  strv_free(c->prefixes, c->n_prefixes);
  strv_free(c->allowed_headers, c->n_allowed_headers);
  eph_net_policy_free(&c->policy);
  for (int v = 0; v < N_VIEWS; v++) {
    for (size_t i = 0; i < c->n_forms[v]; i++) {
      explicit_bzero(c->forms[v][i], strlen(c->forms[v][i]));
      free(c->forms[v][i]);
    }
    free(c->forms[v]);
  }
  memset(c, 0, sizeof *c);
}

__attribute__((format(printf, 3, 4))) static int
cfg_fail(const config_setting_t *s, eph_error_t *err, const char *fmt, ...)
{
  const char *f = s ? config_setting_source_file(s) : NULL;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return eph_error_set(err, EPH_E_CONFIG, "%s:%d: tool-connection: %s", f ? f : "?",
                       s ? config_setting_source_line(s) : 0, msg);
}

/* A list of non-empty strings under `key` of group g; fold > 0 upper-cases, fold < 0
 * lower-cases. A missing or empty list is an error unless allow_empty (then *n stays 0). */
static int
str_list(const config_setting_t *g, const char *key, int fold, bool allow_empty, char ***out,
         size_t *n, eph_error_t *err)
{
  config_setting_t *l = config_setting_get_member(g, key);
  if (allow_empty && l && config_setting_is_aggregate(l) && config_setting_length(l) == 0)
    return 0;
  if (!l || !config_setting_is_aggregate(l) || config_setting_length(l) == 0)
    return cfg_fail(l ? l : g, err, "key '%s': a non-empty list of strings is required", key);
  int count = config_setting_length(l);
  *out = calloc((size_t)count + 1, sizeof **out);
  if (!*out)
    return eph_error_set(err, ENOMEM, "out of memory");
  for (int i = 0; i < count; i++) {
    const char *s = config_setting_get_string_elem(l, i);
    if (!s || !*s)
      return cfg_fail(l, err, "key '%s': every element must be a non-empty string", key);
    (*out)[i] = strdup(s);
    (*n)++;
    for (char *c = (*out)[i]; fold && *c; c++)
      *c = (char)(fold > 0 ? toupper((unsigned char)*c) : tolower((unsigned char)*c));
  }
  return 0;
}

/* Reads the credential: first line of credential_file, or the value of credential_env. */
static char *
read_secret(const eph_host_t *host, const config_setting_t *g, const char *name)
{
  const char *file = NULL, *env = NULL;
  config_setting_lookup_string(g, "credential_file", &file);
  config_setting_lookup_string(g, "credential_env", &env);
  if (file) {
    int fd = open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > 65536) {
      if (fd >= 0)
        close(fd);
      host->log(EPH_LOG_WARN, "connection '%s': credential_file %s unreadable", name, file);
      return NULL;
    }
    if (st.st_mode & 0077)
      host->log(EPH_LOG_WARN, "connection '%s': credential_file %s is readable by others (mode %o)",
                name, file, st.st_mode & 0777);
    char *buf = calloc(1, (size_t)st.st_size + 1);
    ssize_t got = buf ? read(fd, buf, (size_t)st.st_size) : -1;
    close(fd);
    if (got < 0) {
      free(buf);
      return NULL;
    }
    buf[got] = 0;
    buf[strcspn(buf, "\r\n")] = 0;
    if (!*buf) {
      free(buf);
      host->log(EPH_LOG_WARN, "connection '%s': credential_file %s is empty", name, file);
      return NULL;
    }
    return buf;
  }
  if (env) {
    const char *v = getenv(env);
    if (v && *v)
      return strdup(v);
    host->log(EPH_LOG_WARN, "connection '%s': credential_env %s is not set", name, env);
    return NULL;
  }
  host->log(EPH_LOG_WARN, "connection '%s': neither credential_file nor credential_env", name);
  return NULL;
}

static bool
valid_token(const char *s)
{
  if (!*s)
    return false;
  for (; *s; s++)
    if (!isalnum((unsigned char)*s) && !strchr("!#$%&'*+-.^_`|~", *s))
      return false;
  return true;
}

/* ---------------------------------------------------------------- the scrubber
 *
 * An upstream may echo the credential back in any encoding. The scrubber looks for it in three
 * views of a text, each a normalised copy that remembers, byte by byte, which bytes of the
 * original it came from:
 *   VIEW_PLAIN    ASCII letters folded to lower case, whitespace and NUL bytes dropped;
 *   VIEW_DECODED  the same after undoing one level of escaping where it appears: %XX,
 *                 &#NN; &#xNN; and the named entities of ASCII punctuation, \uXXXX, \xHH
 *                 and a backslash before punctuation (JSON's "\/");
 *   VIEW_DECODED2 the same, twice ("%252F", "&amp;#47;": text escaped again, as when a JSON
 *                 document is embedded in HTML).
 * In each it matches the forms of every target (the secret, the password alone, the value as
 * it went on the wire): raw, reversed, hex, and the inner part of its base64, standard and
 * URL alphabets, at each of the three offsets a string can start at within a base64 stream
 * (the characters that depend on the target's bytes alone). Case folding makes hex of either
 * case and upper- or lower-cased echoes match; dropping whitespace makes spaced-out and
 * line-wrapped forms match, dropping NULs UTF-16 (either byte order) of an ASCII secret; the
 * decoded views make percent-, entity- and JSON-escaped forms of all of these match, escaped
 * once or twice. Every 12-byte fragment of the secret is a form too (a split or cut secret).
 * A match is replaced in the original text by the whole span of original bytes it came
 * from. The encodings are made with OpenSSL (EVP_EncodeBlock through pu_b64_encode,
 * OPENSSL_buf2hexstr_ex); the views only recognise escapes in order to find the secret,
 * they decode nothing that is handed on. What no scrubber can promise (an upstream that
 * transforms the secret arbitrarily: encrypts, compresses, splits it small, re-orders it)
 * is in docs/security.md. */

static const char redacted_mark[] = "[REDACTED]";

/* Fragments of the secret at least this long are removed wherever they appear; shorter ones
 * cannot be told from innocent text. */
#define SCRUB_WINDOW_BYTES 12

typedef struct view {
  unsigned char *b;    /* normalised bytes */
  uint32_t *from, *to; /* b[i] came from original bytes [from[i], to[i]) */
  size_t n;
} view_t;

static void
view_free(view_t *v)
{
  free(v->b);
  free(v->from);
  free(v->to);
  memset(v, 0, sizeof *v);
}

/* UTF-8 of code point cp into out (4 bytes); returns its length, 0 when cp is none. */
static size_t
utf8_put(uint32_t cp, unsigned char *out)
{
  if (cp < 0x80) {
    out[0] = (unsigned char)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (unsigned char)(0xc0 | cp >> 6);
    out[1] = (unsigned char)(0x80 | (cp & 0x3f));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (unsigned char)(0xe0 | cp >> 12);
    out[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3f));
    out[2] = (unsigned char)(0x80 | (cp & 0x3f));
    return 3;
  }
  if (cp < 0x110000) {
    out[0] = (unsigned char)(0xf0 | cp >> 18);
    out[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3f));
    out[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3f));
    out[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
  }
  return 0;
}

/* Reads up to max digits (base 10 or 16) at p[0..left): the value in *v, how many were read. */
static size_t
digits_at(const char *p, size_t left, int base, size_t max, uint32_t *v)
{
  size_t k = 0;
  *v = 0;
  for (; k < left && k < max; k++) {
    int d = base == 16 ? OPENSSL_hexchar2int((unsigned char)p[k])
                       : (p[k] >= '0' && p[k] <= '9' ? p[k] - '0' : -1);
    if (d < 0)
      break;
    *v = *v * (uint32_t)base + (uint32_t)d;
    if (*v > 0x10ffff)
      return 0;
  }
  return k;
}

/* Recognises one escape at s[i] (s has n bytes): writes the bytes it stands for to out (at
 * most 4, never more than the escape is long) and returns how many bytes of s it spans, or 0
 * when none starts there. */
static size_t
unescape_at(const char *s, size_t n, size_t i, unsigned char *out, size_t *out_n)
{
  static const struct {
    const char *name;
    char ch;
  } named[] = {{"amp", '&'},    {"lt", '<'},     {"gt", '>'},     {"quot", '"'},
               {"apos", '\''},  {"sol", '/'},    {"bsol", '\\'},  {"plus", '+'},
               {"equals", '='}, {"colon", ':'},  {"semi", ';'},   {"comma", ','},
               {"period", '.'}, {"num", '#'},    {"excl", '!'},   {"quest", '?'},
               {"lowbar", '_'}, {"dollar", '$'}, {"percnt", '%'}, {"commat", '@'},
               {"lsqb", '['},   {"rsqb", ']'},   {"lcub", '{'},   {"rcub", '}'},
               {"verbar", '|'}, {"grave", '`'},  {"hat", '^'},    {"ast", '*'},
               {"lpar", '('},   {"rpar", ')'},   {"tilde", '~'},  {"hyphen", '-'},
               {"dash", '-'},   {"nbsp", ' '}};
  const char *p = s + i;
  size_t left = n - i, k;
  uint32_t cp;
  if (p[0] == '%' && left >= 3) {
    int h = OPENSSL_hexchar2int((unsigned char)p[1]), l = OPENSSL_hexchar2int((unsigned char)p[2]);
    if (h < 0 || l < 0)
      return 0;
    out[0] = (unsigned char)(h << 4 | l);
    *out_n = 1;
    return 3;
  }
  if (p[0] == '&' && left >= 3 && p[1] == '#') {
    int hex = p[2] == 'x' || p[2] == 'X';
    size_t start = hex ? 3 : 2;
    if ((k = digits_at(p + start, left - start, hex ? 16 : 10, 16, &cp)) == 0)
      return 0;
    k += start;
    if (k < left && p[k] == ';') /* optional, as browsers read it */
      k++;
    *out_n = utf8_put(cp, out);
    return *out_n && *out_n <= k ? k : 0;
  }
  if (p[0] == '&') {
    for (size_t e = 0; e < sizeof named / sizeof named[0]; e++) {
      size_t el = strlen(named[e].name);
      if (left >= el + 2 && strncasecmp(p + 1, named[e].name, el) == 0 && p[1 + el] == ';') {
        out[0] = (unsigned char)named[e].ch;
        *out_n = 1;
        return el + 2;
      }
    }
    return 0;
  }
  if (p[0] == '\\' && left >= 2) {
    if ((p[1] == 'u' || p[1] == 'x') && (k = p[1] == 'u' ? 4 : 2) &&
        digits_at(p + 2, left - 2, 16, k, &cp) == k) {
      *out_n = utf8_put(cp, out);
      return *out_n ? k + 2 : 0;
    }
    if (ispunct((unsigned char)p[1])) {
      out[0] = (unsigned char)p[1];
      *out_n = 1;
      return 2;
    }
  }
  return 0;
}

/* One normalising pass over s[0..n), undoing escapes when `decode`. Returns 0, or -1 when
 * out of memory or s is too long. */
static int
view_pass(const char *s, size_t n, bool decode, view_t *v)
{
  memset(v, 0, sizeof *v);
  if (n >= UINT32_MAX)
    return -1;
  /* An escape never stands for more bytes than it spans: n + 1 bytes suffice. */
  v->b = malloc(n + 1);
  v->from = malloc((n + 1) * sizeof *v->from);
  v->to = malloc((n + 1) * sizeof *v->to);
  if (!v->b || !v->from || !v->to) {
    view_free(v);
    return -1;
  }
  for (size_t i = 0; i < n;) {
    unsigned char unit[4];
    size_t un = 0, used = decode ? unescape_at(s, n, i, unit, &un) : 0;
    if (!used) {
      unit[0] = (unsigned char)s[i];
      un = used = 1;
    }
    for (size_t k = 0; k < un; k++) {
      unsigned char ch = unit[k];
      /* Blanks and NULs: spaced-out and wrapped forms, and UTF-16 of an ASCII secret. */
      if (ch == ' ' || ch == '\t' || ch == '\r' || ch == '\n' || ch == '\f' || ch == '\v' ||
          ch == 0)
        continue;
      v->b[v->n] = ch >= 'A' && ch <= 'Z' ? (unsigned char)(ch + 32) : ch;
      v->from[v->n] = (uint32_t)i;
      v->to[v->n] = (uint32_t)(i + used);
      v->n++;
    }
    i += used;
  }
  v->b[v->n] = 0;
  return 0;
}

/* Builds view `kind` of s[0..n). Returns 0, or -1 when out of memory or s is too long. */
static int
view_build(const char *s, size_t n, int kind, view_t *v)
{
  if (kind != VIEW_DECODED2)
    return view_pass(s, n, kind == VIEW_DECODED, v);
  view_t once;
  if (view_pass(s, n, true, &once) < 0)
    return -1;
  int r = view_pass((const char *)once.b, once.n, true, v);
  for (size_t i = 0; r == 0 && i < v->n; i++) { /* map back through the first pass */
    uint32_t a = v->from[i], z = v->to[i];
    v->from[i] = once.from[a];
    v->to[i] = once.to[z - 1];
  }
  view_free(&once);
  return r;
}

/* Adds raw[0..len) as a form to every view's list when its normalised text has at least min
 * bytes (shorter ones would match innocent text). Returns 0 or -1 (out of memory). */
static int
add_form(conn_t *c, const char *raw, size_t len, size_t min)
{
  for (int k = 0; k < N_VIEWS; k++) {
    view_t v;
    if (view_build(raw, len, k, &v) < 0)
      return -1;
    size_t fl = strnlen((const char *)v.b, v.n);
    char *f = fl >= min ? strndup((const char *)v.b, fl) : NULL;
    explicit_bzero(v.b, v.n);
    view_free(&v);
    if (fl < min)
      continue;
    if (!f)
      return -1;
    bool dup = false;
    for (size_t i = 0; i < c->n_forms[k] && !dup; i++)
      dup = strcmp(c->forms[k][i], f) == 0;
    char **grown = dup ? NULL : realloc(c->forms[k], (c->n_forms[k] + 1) * sizeof *grown);
    if (dup || !grown) {
      explicit_bzero(f, fl);
      free(f);
      if (dup)
        continue;
      return -1;
    }
    c->forms[k] = grown;
    c->forms[k][c->n_forms[k]++] = f;
  }
  /* Read this far past the cap: a form starting before it is then seen whole, even when
   * every byte of it is escaped (at most 12 bytes, "&#x0000002F;") and it is hex (x2). */
  if (c->margin_bytes < 32 * len + 256)
    c->margin_bytes = 32 * len + 256;
  return 0;
}

/* Adds every form of target t (tl bytes): raw, reversed, hex, base64 (both alphabets) at the
 * three offsets. Temporary copies are wiped. Returns 0 or -1 (out of memory). */
static int
add_target(conn_t *c, const char *t, size_t tl)
{
  if (tl == 0)
    return 0;
  int r = add_form(c, t, tl, 4);
  char *buf = malloc(2 * tl + 3), *enc = NULL;
  if (!buf)
    return -1;
  for (size_t i = 0; i < tl; i++)
    buf[i] = t[tl - 1 - i];
  if (r == 0)
    r = add_form(c, buf, tl, 6);
  size_t hl = 0;
  if (r == 0)
    r = OPENSSL_buf2hexstr_ex(buf, 2 * tl + 1, &hl, (const unsigned char *)t, tl, '\0') == 1
            ? add_form(c, buf, hl ? hl - 1 : 0, 8)
            : -1;
  for (size_t k = 0; k < 3 && r == 0; k++) {
    /* Within a base64 stream, t starting k bytes after a 3-byte boundary: the characters
     * from ceil(8k/6) to floor(8(k+tl)/6) depend on t alone, whatever surrounds it. */
    memset(buf, 0, k);
    memcpy(buf + k, t, tl);
    size_t el = 0, lo = (8 * k + 5) / 6, hi = 8 * (k + tl) / 6;
    enc = pu_b64_encode(buf, k + tl, &el);
    if (!enc) {
      r = -1;
      break;
    }
    if (hi > lo && hi <= el) {
      r = add_form(c, enc + lo, hi - lo, 8);
      for (size_t i = lo; i < hi; i++) /* the URL-safe alphabet (RFC 4648 section 5) */
        enc[i] = enc[i] == '+' ? '-' : enc[i] == '/' ? '_' : enc[i];
      if (r == 0)
        r = add_form(c, enc + lo, hi - lo, 8);
    }
    explicit_bzero(enc, el);
    free(enc);
  }
  explicit_bzero(buf, 2 * tl + 3);
  free(buf);
  return r;
}

/* Adds every SCRUB_WINDOW_BYTES-long piece of t as a form: a fragment of the secret that
 * long is removed wherever it appears (an upstream that splits the secret over two headers,
 * or any cut), in every view, so escaped fragments too. */
static int
add_windows(conn_t *c, const char *t, size_t tl)
{
  for (size_t i = 0; tl > SCRUB_WINDOW_BYTES && i + SCRUB_WINDOW_BYTES <= tl; i++)
    if (add_form(c, t + i, SCRUB_WINDOW_BYTES, SCRUB_WINDOW_BYTES) < 0)
      return -1;
  return 0;
}

typedef struct span {
  size_t from, to;
} span_t;

static int
span_cmp(const void *a, const void *b)
{
  const span_t *x = a, *y = b;
  return x->from < y->from ? -1 : x->from > y->from ? 1 : 0;
}

/* The spans of s[0..n) that carry a form of the secret, sorted and merged: *out is heap
 * memory owned by the caller (NULL when none). Returns how many, or -1 when out of memory. */
static ssize_t
find_spans(const conn_t *c, const char *s, size_t n, span_t **out)
{
  span_t *sp = NULL;
  size_t ns = 0, cap = 0;
  *out = NULL;
  for (int k = 0; k < N_VIEWS; k++) {
    if (c->n_forms[k] == 0)
      continue;
    view_t v;
    if (view_build(s, n, k, &v) < 0)
      goto oom;
    for (size_t f = 0; f < c->n_forms[k]; f++) {
      const char *form = c->forms[k][f];
      size_t fl = strlen(form), at = 0;
      const unsigned char *hit;
      while (at + fl <= v.n && (hit = memmem(v.b + at, v.n - at, form, fl))) {
        size_t i = (size_t)(hit - v.b);
        if (ns == cap) {
          span_t *g = realloc(sp, (cap = cap ? 2 * cap : 16) * sizeof *sp);
          if (!g) {
            view_free(&v);
            goto oom;
          }
          sp = g;
        }
        sp[ns++] = (span_t){v.from[i], v.to[i + fl - 1]};
        at = i + 1;
      }
    }
    view_free(&v);
  }
  if (ns == 0)
    return 0;
  qsort(sp, ns, sizeof *sp, span_cmp);
  size_t m = 0;
  for (size_t i = 1; i < ns; i++) {
    if (sp[i].from <= sp[m].to) {
      if (sp[i].to > sp[m].to)
        sp[m].to = sp[i].to;
    } else
      sp[++m] = sp[i];
  }
  *out = sp;
  return (ssize_t)(m + 1);
oom:
  free(sp);
  return -1;
}

/* A copy of s[0..n) with every span that carries the secret replaced by "[REDACTED]", cut
 * at `limit` bytes of the original: a span that starts before the cut is replaced whole, so
 * a form the cut falls into leaks nothing; the cut does not split a UTF-8 sequence. Heap,
 * NUL-terminated, its length in *out_n. NULL when out of memory: callers fail closed. */
static char *
scrub_copy(const conn_t *c, const char *s, size_t n, size_t limit, size_t *out_n)
{
  span_t *sp = NULL;
  ssize_t ns = find_spans(c, s, n, &sp);
  if (ns < 0)
    return NULL;
  if (limit < n)
    limit = pu_utf8_clip(s, limit);
  else
    limit = n;
  const size_t ml = sizeof redacted_mark - 1;
  char *o = malloc(limit + (size_t)ns * ml + 1);
  size_t on = 0, at = 0;
  if (!o) {
    free(sp);
    return NULL;
  }
  for (ssize_t i = 0; i < ns && sp[i].from < limit; i++) {
    memcpy(o + on, s + at, sp[i].from - at);
    on += sp[i].from - at;
    memcpy(o + on, redacted_mark, ml);
    on += ml;
    at = sp[i].to;
  }
  if (at < limit) {
    memcpy(o + on, s + at, limit - at);
    on += limit - at;
  }
  o[on] = 0;
  *out_n = on;
  free(sp);
  return o;
}

static char *
scrub_str(const conn_t *c, const char *s)
{
  size_t n = strlen(s), on = 0;
  return scrub_copy(c, s, n, n, &on);
}

/* ---------------------------------------------------------------- headers */

/* Headers no configuration may let a caller set: anything that carries or routes
 * credentials, that the transport owns, that would make the upstream answer in a form the
 * scrubber cannot read whole (compressed, or in ranges that split an echoed secret), or
 * that asks the upstream to treat the request as another method or URL than the one the
 * broker checked. */
static bool
header_never_allowed(const conn_t *c, const char *name)
{
  static const char *const no[] = {
      "authorization", "cookie", "host", "content-length", "transfer-encoding", "connection",
      "upgrade", "te", "trailer", "keep-alive", "expect", "forwarded", "via",
      "accept-encoding", "content-encoding", "range", "if-range", "x-http-method",
      "x-method", "x-host", NULL};
  for (size_t i = 0; no[i]; i++)
    if (strcasecmp(name, no[i]) == 0)
      return true;
  static const char *const prefix[] = {"proxy-", "x-forwarded-", "x-original-", "x-rewrite-",
                                       NULL};
  for (size_t i = 0; prefix[i]; i++)
    if (strncasecmp(name, prefix[i], strlen(prefix[i])) == 0)
      return true;
  if (strcasestr(name, "override"))
    return true;
  return c->header_name && strcasecmp(name, c->header_name) == 0;
}

/* The caller headers a connection lets through when its config has no allowed_headers. */
static const char *const default_allowed_headers[] = {
    "accept",   "accept-language",   "content-type",  "user-agent",
    "if-match", "if-none-match",     "if-modified-since", "if-unmodified-since", NULL};

static bool
header_allowed(const conn_t *c, const char *name)
{
  if (header_never_allowed(c, name))
    return false;
  for (size_t i = 0; i < c->n_allowed_headers; i++)
    if (strcasecmp(name, c->allowed_headers[i]) == 0)
      return true;
  return false;
}

static int
conn_load(const eph_host_t *host, const config_setting_t *g, conn_t *c, eph_error_t *err)
{
  const char *name = NULL, *base = NULL, *apply = "bearer", *hn = NULL, *qp = NULL;
  int r;
  if (!config_setting_is_group(g))
    return cfg_fail(g, err, "%s", "each element of 'connections' must be a group");
  if (!config_setting_lookup_string(g, "name", &name) || !*name)
    return cfg_fail(g, err, "%s", "connection without 'name'");
  c->name = strdup(name);
  if (!config_setting_lookup_string(g, "base_url", &base))
    return cfg_fail(g, err, "connection '%s': 'base_url' is required", name);
  config_setting_lookup_string(g, "apply", &apply);
  if (strcmp(apply, "bearer") == 0)
    c->apply = APPLY_BEARER;
  else if (strcmp(apply, "basic") == 0)
    c->apply = APPLY_BASIC;
  else if (strcmp(apply, "header") == 0) {
    c->apply = APPLY_HEADER;
    if (!config_setting_lookup_string(g, "header_name", &hn) || !valid_token(hn))
      return cfg_fail(g, err, "connection '%s': apply = \"header\" needs a valid header_name",
                      name);
    c->header_name = strdup(hn);
  } else if (strcmp(apply, "query") == 0) {
    c->apply = APPLY_QUERY;
    if (!config_setting_lookup_string(g, "query_param", &qp) || !*qp || strpbrk(qp, "&=#?/ "))
      return cfg_fail(g, err, "connection '%s': apply = \"query\" needs a valid query_param",
                      name);
    c->query_param = strdup(qp);
  } else
    return cfg_fail(g, err, "connection '%s': apply must be bearer, basic, header or query",
                    name);
  if ((r = str_list(g, "methods", 1, false, &c->methods, &c->n_methods, err)) < 0 ||
      (r = str_list(g, "path_prefixes", 0, false, &c->prefixes, &c->n_prefixes, err)) < 0)
    return r;
  if (config_setting_get_member(g, "allowed_headers")) {
    if ((r = str_list(g, "allowed_headers", -1, true, &c->allowed_headers,
                      &c->n_allowed_headers, err)) < 0)
      return r;
  } else {
    /* The default list, minus the credential's own header should it be one of them. */
    size_t n = sizeof default_allowed_headers / sizeof default_allowed_headers[0];
    c->allowed_headers = calloc(n, sizeof *c->allowed_headers);
    if (!c->allowed_headers)
      return eph_error_set(err, ENOMEM, "out of memory");
    for (size_t i = 0; default_allowed_headers[i]; i++) {
      if (header_never_allowed(c, default_allowed_headers[i]))
        continue;
      if (!(c->allowed_headers[c->n_allowed_headers] = strdup(default_allowed_headers[i])))
        return eph_error_set(err, ENOMEM, "out of memory");
      c->n_allowed_headers++;
    }
  }
  for (size_t i = 0; i < c->n_allowed_headers; i++)
    if (!valid_token(c->allowed_headers[i]) || header_never_allowed(c, c->allowed_headers[i]))
      return cfg_fail(config_setting_get_member(g, "allowed_headers"), err,
                      "connection '%s': header '%s' cannot be in allowed_headers: it is not a "
                      "header name, or it carries credentials, belongs to the transport, "
                      "changes the response's encoding or range, or overrides the method or "
                      "URL the broker checked", name, c->allowed_headers[i]);
  for (size_t i = 0; i < c->n_prefixes; i++)
    if (c->prefixes[i][0] != '/')
      return cfg_fail(g, err, "connection '%s': every path prefix must start with '/'", name);

  /* base_url: http(s), no query, no fragment, no credentials; kept without trailing '/'. */
  CURLU *u = curl_url();
  char *scheme = NULL, *path = NULL, *query = NULL, *frag = NULL, *user = NULL;
  r = 0;
  if (!u || curl_url_set(u, CURLUPART_URL, base, 0) != CURLUE_OK ||
      curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
      (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0) ||
      curl_url_get(u, CURLUPART_QUERY, &query, 0) == CURLUE_OK ||
      curl_url_get(u, CURLUPART_FRAGMENT, &frag, 0) == CURLUE_OK ||
      curl_url_get(u, CURLUPART_USER, &user, 0) == CURLUE_OK ||
      curl_url_get(u, CURLUPART_PATH, &path, 0) != CURLUE_OK)
    r = cfg_fail(g, err, "connection '%s': base_url must be an http(s) URL without query, "
                         "fragment or credentials", name);
  if (r == 0) {
    size_t n = strlen(path);
    while (n > 0 && path[n - 1] == '/')
      path[--n] = 0;
    c->base_path = strdup(path);
    size_t b = strlen(base);
    c->base_url = strdup(base);
    while (b > 0 && c->base_url[b - 1] == '/')
      c->base_url[--b] = 0;
  }
  curl_free(scheme);
  curl_free(path);
  curl_free(query);
  curl_free(frag);
  curl_free(user);
  curl_url_cleanup(u);
  if (r < 0)
    return r;

  int priv = 0;
  config_setting_lookup_bool(g, "allow_private_addresses", &priv);
  c->policy.allow_private = c->policy.allow_loopback = priv;

  c->secret = read_secret(host, g, name);
  if (c->secret) {
    if (strpbrk(c->secret, "\r\n")) { /* header injection through the credential itself */
      explicit_bzero(c->secret, strlen(c->secret));
      free(c->secret);
      c->secret = NULL;
      return cfg_fail(g, err, "connection '%s': credential contains a line break", name);
    }
    /* Targets: the secret; with basic, the password alone and the base64 that goes on the
     * wire; with query, the escaped form that goes in the URL. Each in all its forms. */
    size_t sl = strlen(c->secret);
    r = add_target(c, c->secret, sl);
    if (r == 0)
      r = add_windows(c, c->secret, sl);
    const char *colon = c->apply == APPLY_BASIC ? strchr(c->secret, ':') : NULL;
    if (r == 0 && colon)
      r = add_target(c, colon + 1, strlen(colon + 1));
    if (r == 0 && colon)
      r = add_windows(c, colon + 1, strlen(colon + 1));
    if (r == 0 && c->apply == APPLY_BASIC) {
      size_t el = 0;
      char *enc = pu_b64_encode(c->secret, sl, &el);
      r = enc ? add_target(c, enc, el) : -1;
      if (enc)
        explicit_bzero(enc, el);
      free(enc);
    }
    if (r == 0 && c->apply == APPLY_QUERY) {
      char *esc = curl_easy_escape(NULL, c->secret, 0);
      r = esc ? add_target(c, esc, strlen(esc)) : -1;
      if (esc)
        explicit_bzero(esc, strlen(esc));
      curl_free(esc);
    }
    if (r < 0)
      return eph_error_set(err, ENOMEM, "out of memory");
    if (sl < 16)
      host->log(EPH_LOG_WARN, "connection '%s': the credential is %zu bytes long: too short "
                              "to be scrubbed reliably from responses (encoded forms of fewer "
                              "than 8 characters and credentials under 4 are not matched)",
                name, sl);
  }
  return 0;
}

/* ---------------------------------------------------------------- checks */

static const conn_t *
find_conn(const broker_t *b, const char *name)
{
  for (size_t i = 0; i < b->n_conns; i++)
    if (strcmp(b->conns[i].name, name) == 0)
      return &b->conns[i];
  return NULL;
}

/* The grant for `name` in the run's permission table, or NULL. */
static json_object *
find_grant(json_object *grants, const char *name)
{
  json_object *list = NULL;
  if (!grants || !json_object_object_get_ex(grants, "connections", &list) ||
      !json_object_is_type(list, json_type_array))
    return NULL;
  for (size_t i = 0; i < json_object_array_length(list); i++) {
    json_object *g = json_object_array_get_idx(list, i), *n = NULL;
    if (json_object_is_type(g, json_type_string) && strcmp(json_object_get_string(g), name) == 0)
      return g;
    if (json_object_is_type(g, json_type_object) && json_object_object_get_ex(g, "name", &n) &&
        json_object_is_type(n, json_type_string) && strcmp(json_object_get_string(n), name) == 0)
      return g;
  }
  return NULL;
}

static bool
method_allowed(const conn_t *c, json_object *grant, const char *method)
{
  bool op = false;
  for (size_t i = 0; i < c->n_methods; i++)
    op |= strcmp(c->methods[i], method) == 0;
  if (!op)
    return false;
  json_object *ms = NULL;
  if (!json_object_is_type(grant, json_type_object) ||
      !json_object_object_get_ex(grant, "methods", &ms) || !ms)
    return true; /* the grant does not narrow */
  if (!json_object_is_type(ms, json_type_array))
    return false;
  for (size_t i = 0; i < json_object_array_length(ms); i++) {
    const char *m = json_object_get_string(json_object_array_get_idx(ms, i));
    if (m && strcasecmp(m, method) == 0)
      return true;
  }
  return false;
}

/* Checks the caller's path (relative to base_url): NULL when acceptable, else why not.
 * Conservative on purpose: encoded dots, slashes, backslashes and percent signs, dot
 * segments, empty segments, ';' parameters, backslashes, controls and anything that could
 * read as a scheme or authority are refused rather than normalised, so what the server
 * sees is exactly what was checked. */
static const char *
path_refusal(const conn_t *c, const char *path)
{
  if (path[0] != '/')
    return "path must start with '/'";
  if (path[1] == '/')
    return "path must not start with '//'";
  size_t plen = strcspn(path, "?");
  for (const char *p = path; *p; p++) {
    unsigned char ch = (unsigned char)*p;
    if (ch <= 0x20 || ch >= 0x7f)
      return "path contains a space, control or non-ASCII byte (percent-encode it)";
    if (ch == '\\')
      return "path contains a backslash";
    if (ch == '#')
      return "path contains a fragment";
    if (ch == '%') {
      if (!isxdigit((unsigned char)p[1]) || !isxdigit((unsigned char)p[2]))
        return "path contains a malformed percent escape";
      if ((size_t)(p - path) < plen) {
        char h[3] = {p[1], p[2], 0};
        long v = strtol(h, NULL, 16);
        if (v == '.' || v == '/' || v == '\\' || v == '%' || v == ';' || v == '?' || v == '#' ||
            v < 0x20)
          return "path contains an encoded '.', '/', '\\', '%', ';', '?', '#' or control";
      }
    }
  }
  /* Segments of the path part. */
  for (const char *s = path + 1; (size_t)(s - path) <= plen;) {
    size_t n = strcspn(s, "/?");
    if ((size_t)(s - path) + n > plen)
      n = plen - (size_t)(s - path);
    if ((n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
      return "path contains a '.' or '..' segment";
    if (n == 0 && (size_t)(s - path) < plen)
      return "path contains an empty segment ('//')";
    if (memchr(s, ';', n))
      return "path contains ';'";
    s += n + 1;
  }
  for (size_t i = 0; i < c->n_prefixes; i++) {
    const char *pre = c->prefixes[i];
    size_t n = strlen(pre);
    if (strncmp(path, pre, n) != 0 || n > plen)
      continue;
    /* "/repos" allows "/repos" and "/repos/..." but not "/reposx". */
    if (pre[n - 1] == '/' || n == plen || path[n] == '/')
      return NULL;
  }
  return "path is outside the connection's allowed path prefixes";
}

/* ---------------------------------------------------------------- the call */

typedef struct req_ctx {
  broker_t *b;
  const eph_tool_call_t *call;
  const conn_t *c;
  const char *path; /* as the caller gave it: never carries the secret */
} req_ctx_t;

static int
before_request(void *opaque, const char *method, const char *url, int hop, eph_error_t *err)
{
  (void)url; /* may carry the credential (apply = query): never emitted */
  req_ctx_t *x = opaque;
  const eph_host_t *host = x->b->host;
  int r;
  if (x->b->price_micros > 0 &&
      (r = host->charge(x->call->run, EPH_COST_WEB, x->b->price_micros, "connection_request",
                        err)) < 0)
    return r;
  cleanup_json json_object *data = json_object_new_object();
  json_object_object_add(data, "connection", json_object_new_string(x->c->name));
  json_object_object_add(data, "method", json_object_new_string(method));
  cleanup_free char *text = NULL;
  /* The path is the caller's, but nothing is stored that the scrubber has not seen. */
  cleanup_free char *path = scrub_str(x->c, x->path);
  if (!path)
    return eph_error_set(err, ENOMEM, "out of memory");
  if (x->call->zero_data_retention)
    r = asprintf(&text, "%s %s (path withheld: zero data retention)", method, x->c->name);
  else {
    json_object_object_add(data, "path", json_object_new_string(path));
    r = asprintf(&text, "%s %s %s", method, x->c->name, path);
  }
  if (r < 0)
    return eph_error_set(err, ENOMEM, "out of memory");
  return host->emit(x->call->run, "Connection", "connection_request", text, data, err);
}

static json_object *
refuse(broker_t *b, const eph_tool_call_t *call, const conn_t *c, const char *reason,
       const char *msg)
{
  eph_error_t ignore = {0};
  cleanup_free char *clean = c ? scrub_str(c, msg) : strdup(msg);
  cleanup_json json_object *data = json_object_new_object();
  json_object_object_add(data, "reason", json_object_new_string(reason));
  b->host->emit(call->run, "Connection", "denied",
                call->zero_data_retention ? reason : (clean ? clean : reason), data, &ignore);
  json_object *res = json_object_new_object();
  json_object_object_add(res, "error", json_object_new_string(clean ? clean : reason));
  json_object_object_add(res, "reason", json_object_new_string(reason));
  return res;
}

/* The caller's headers that were not on the connection's allow-list: an event, so the
 * timeline shows what was withheld from the upstream. Names only (never values); under zero
 * data retention only how many. */
static void
emit_dropped(broker_t *b, const eph_tool_call_t *call, const conn_t *c, const char *method,
             json_object *dropped)
{
  eph_error_t ignore = {0};
  size_t n = json_object_array_length(dropped);
  cleanup_json json_object *data = json_object_new_object();
  json_object_object_add(data, "connection", json_object_new_string(c->name));
  json_object_object_add(data, "method", json_object_new_string(method));
  json_object_object_add(data, "count", json_object_new_int((int)n));
  cleanup_free char *text = NULL;
  if (call->zero_data_retention) {
    if (asprintf(&text, "%s %s: %zu header%s not allowed, dropped", method, c->name, n,
                 n == 1 ? "" : "s") < 0)
      text = NULL;
  } else {
    /* The names are the caller's, but nothing is stored that the scrubber has not seen. */
    json_object *list = json_object_new_array();
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
      char *name = scrub_str(c, json_object_get_string(json_object_array_get_idx(dropped, i)));
      json_object_array_add(list, json_object_new_string(name ? name : "?"));
      len += (name ? strlen(name) : 1) + 2;
      free(name);
    }
    json_object_object_add(data, "headers", list);
    cleanup_free char *names = calloc(1, len + 1);
    for (size_t i = 0; names && i < n; i++) {
      if (i)
        strcat(names, ", ");
      strcat(names, json_object_get_string(json_object_array_get_idx(list, i)));
    }
    if (asprintf(&text, "%s %s: header%s not allowed, dropped: %s", method, c->name,
                 n == 1 ? "" : "s", names ? names : "?") < 0)
      text = NULL;
  }
  b->host->emit(call->run, "Connection", "header_dropped", text ? text : "headers dropped",
                data, &ignore);
}

static const char *
arg_str(json_object *args, const char *key)
{
  json_object *v = NULL;
  if (!json_object_object_get_ex(args, key, &v) || !json_object_is_type(v, json_type_string))
    return NULL;
  return json_object_get_string(v);
}

static int
broker_call(void *state, const eph_tool_call_t *call, json_object **result, eph_error_t *err)
{
  broker_t *b = state;
  if (strcmp(call->tool, "connection_request") != 0)
    return eph_error_set(err, EINVAL, "tool-connection has no tool '%s'", call->tool);
  const char *name = arg_str(call->args, "connection"), *m = arg_str(call->args, "method"),
             *path = arg_str(call->args, "path");
  if (!name || !m || !path) {
    *result = pu_error_result("arguments 'connection', 'method' and 'path' (strings) are required");
    return 0;
  }
  const conn_t *c = find_conn(b, name);
  json_object *grant = find_grant(call->grants, name);
  if (!c || !grant) {
    *result = refuse(b, call, NULL, "not_granted",
                     "this run is not granted that connection");
    return 0;
  }
  char method[16];
  size_t ml = strlen(m);
  if (ml == 0 || ml >= sizeof method) {
    *result = refuse(b, call, c, "method", "method is not allowed");
    return 0;
  }
  for (size_t i = 0; i <= ml; i++)
    method[i] = (char)toupper((unsigned char)m[i]);
  if (!valid_token(method) || !method_allowed(c, grant, method)) {
    char msg[128];
    snprintf(msg, sizeof msg, "method %s is not allowed on connection '%s'", method, c->name);
    *result = refuse(b, call, c, "method", msg);
    return 0;
  }
  const char *why = path_refusal(c, path);
  if (why) {
    *result = refuse(b, call, c, "path", why);
    return 0;
  }
  if (c->apply == APPLY_QUERY) {
    /* The caller cannot set (or shadow) the broker's query parameter. */
    const char *q = strchr(path, '?');
    size_t ql = strlen(c->query_param);
    for (const char *p = q; p && *p; p = strchr(p + 1, '&'))
      if (strncmp(p + 1, c->query_param, ql) == 0 && (p[1 + ql] == '=' || p[1 + ql] == '&' ||
                                                     p[1 + ql] == 0)) {
        *result = refuse(b, call, c, "header", "the query parameter carrying the credential "
                                               "is set by the broker");
        return 0;
      }
  }
  if (!c->secret) {
    *result = refuse(b, call, c, "unavailable",
                     "the connection's credential is not available on this host");
    return 0;
  }

  /* A body on GET or HEAD: servers and proxies disagree on whether it is part of the
   * request or the start of the next one, so it is refused rather than sent. */
  json_object *jb = NULL;
  if (json_object_object_get_ex(call->args, "body", &jb) && jb) {
    if (!json_object_is_type(jb, json_type_string)) {
      *result = pu_error_result("argument 'body' must be a string");
      return 0;
    }
    if (json_object_get_string_len(jb) > 0 &&
        (strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0)) {
      char msg[128];
      snprintf(msg, sizeof msg, "a %s request cannot carry a body: drop 'body' or use a method "
                                "that takes one", method);
      *result = refuse(b, call, c, "body", msg);
      return 0;
    }
  }

  /* Headers: only the connection's allow-list goes out; the rest are dropped (and the drop
   * is an event). The credential, routing, encoding and method/URL override headers can
   * never be on the list. */
  struct curl_slist *hdrs = NULL;
  json_object *jh = NULL;
  json_object *dropped = json_object_new_array();
  if (json_object_object_get_ex(call->args, "headers", &jh) && jh) {
    if (!json_object_is_type(jh, json_type_object)) {
      json_object_put(dropped);
      *result = pu_error_result("argument 'headers' must be an object of strings");
      return 0;
    }
    json_object_object_foreach(jh, hk, hv)
    {
      const char *v = json_object_get_string(hv);
      if (!valid_token(hk) || !json_object_is_type(hv, json_type_string) || strpbrk(v, "\r\n")) {
        curl_slist_free_all(hdrs);
        json_object_put(dropped);
        *result = pu_error_result("headers must be token names with single-line string values");
        return 0;
      }
      if (!header_allowed(c, hk)) {
        json_object_array_add(dropped, json_object_new_string(hk));
        continue;
      }
      cleanup_free char *line = NULL;
      if (asprintf(&line, *v ? "%s: %s" : "%s;", hk, v) < 0)
        break;
      hdrs = curl_slist_append(hdrs, line);
    }
  }
  /* curl adds these unless told not to; the broker's request must not carry an Expect. */
  hdrs = curl_slist_append(hdrs, "Expect:");
  char *cred_line = NULL;
  cleanup_free char *url = NULL;
  int r = 0;
  switch (c->apply) {
  case APPLY_BEARER:
    r = asprintf(&cred_line, "Authorization: Bearer %s", c->secret);
    break;
  case APPLY_BASIC: {
    char *enc = pu_b64_encode(c->secret, strlen(c->secret), NULL);
    r = enc ? asprintf(&cred_line, "Authorization: Basic %s", enc) : -1;
    if (enc) {
      explicit_bzero(enc, strlen(enc));
      free(enc);
    }
    break;
  }
  case APPLY_HEADER:
    r = asprintf(&cred_line, "%s: %s", c->header_name, c->secret);
    break;
  case APPLY_QUERY:
    break;
  }
  if (r < 0) {
    curl_slist_free_all(hdrs);
    json_object_put(dropped);
    return eph_error_set(err, ENOMEM, "out of memory");
  }
  if (cred_line)
    hdrs = curl_slist_append(hdrs, cred_line);
  if (c->apply == APPLY_QUERY) {
    char *esc = curl_easy_escape(NULL, c->secret, 0);
    r = esc ? asprintf(&url, "%s%s%s%s=%s", c->base_url, path, strchr(path, '?') ? "&" : "?",
                       c->query_param, esc)
            : -1;
    if (esc) {
      explicit_bzero(esc, strlen(esc));
      curl_free(esc);
    }
  } else
    r = asprintf(&url, "%s%s", c->base_url, path);
  if (r < 0) {
    url = NULL;
    curl_slist_free_all(hdrs);
    json_object_put(dropped);
    return eph_error_set(err, ENOMEM, "out of memory");
  }

  /* Defence in depth: whatever the path held, the URL must still name the base's host. */
  {
    cleanup_free char *h1 = NULL, *h2 = NULL;
    int p1 = 0, p2 = 0;
    eph_error_t ig = {0};
    if (eph_net_url_host(c->base_url, &h1, &p1, &ig) < 0 || eph_net_url_host(url, &h2, &p2, &ig) < 0 ||
        strcmp(h1, h2) != 0 || p1 != p2) {
      explicit_bzero(url, strlen(url));
      curl_slist_free_all(hdrs);
      if (cred_line) {
        explicit_bzero(cred_line, strlen(cred_line));
        free(cred_line);
      }
      json_object_put(dropped);
      *result = refuse(b, call, c, "path", "path changes the connection's host");
      return 0;
    }
  }
  if (json_object_array_length(dropped) > 0)
    emit_dropped(b, call, c, method, dropped);
  const char *body = arg_str(call->args, "body");
  int64_t t = b->timeout_ms;
  if (call->deadline_ms > 0 && call->deadline_ms - eph_now_ms() < t)
    t = call->deadline_ms - eph_now_ms();
  req_ctx_t ctx = {b, call, c, path};
  eph_net_request_t req = {
      .url = url,
      .method = method,
      .headers = hdrs,
      .body = body,
      .body_bytes = body ? strlen(body) : 0,
      /* Past the cap by the longest escaped form of the secret: scrubbed, then cut. */
      .max_response_bytes = (size_t)b->max_response_bytes + c->margin_bytes,
      .timeout_ms = t > 0 ? t : 1,
      .max_redirects = 0,
      .check_domains = 0,
      .before_request = before_request,
      .opaque = &ctx,
  };
  eph_net_response_t resp;
  eph_error_t e = {0};
  r = t > 0 ? eph_net_fetch(&c->policy, &req, &resp, &e)
            : eph_error_set(&e, ETIMEDOUT, "the run deadline has passed");
  curl_slist_free_all(hdrs);
  if (cred_line) {
    explicit_bzero(cred_line, strlen(cred_line));
    free(cred_line);
  }
  explicit_bzero(url, strlen(url));
  if (r < 0) {
    json_object_put(dropped);
    *result = refuse(b, call, c,
                     e.code == EPH_E_BUDGET   ? "budget_exhausted"
                     : e.code == EPH_E_DENIED ? "address"
                                              : "failed",
                     e.message);
    return 0;
  }

  /* Everything from the upstream passes the scrubber before it is kept: header names and
   * values, and the body, scrubbed whole (up to the cap plus the margin) and then cut at the
   * cap. Out of memory while scrubbing fails closed. */
  json_object *res = json_object_new_object();
  json_object_object_add(res, "connection", json_object_new_string(c->name));
  json_object_object_add(res, "status", json_object_new_int((int)resp.status));
  json_object *outh = json_object_new_object();
  bool clean = true;
  json_object_object_foreach(resp.headers, rk, rv)
  {
    if (strcasecmp(rk, "set-cookie") == 0)
      continue; /* session material of the connection, not the run's */
    cleanup_free char *k = scrub_str(c, rk);
    cleanup_free char *v = scrub_str(c, json_object_get_string(rv));
    clean = clean && k && v;
    json_object *prev = NULL;
    if (k && v && json_object_object_get_ex(outh, k, &prev)) {
      /* Two names scrubbed to the same text: keep both values, as repeated headers are. */
      cleanup_free char *joined = NULL;
      if (asprintf(&joined, "%s, %s", json_object_get_string(prev), v) < 0)
        joined = NULL;
      clean = clean && joined;
      json_object_object_add(outh, k, json_object_new_string(joined ? joined : ""));
    } else if (k && v)
      json_object_object_add(outh, k, json_object_new_string(v));
  }
  json_object_object_add(res, "headers", outh);
  size_t cap = (size_t)b->max_response_bytes, bn = 0;
  cleanup_free char *body_out =
      resp.body ? scrub_copy(c, resp.body, resp.body_bytes, cap, &bn) : strdup("");
  clean = clean && body_out;
  if (body_out && bn == 0)
    json_object_object_add(res, "body", json_object_new_string(""));
  else if (body_out && pu_is_utf8_text((const unsigned char *)body_out, bn))
    json_object_object_add(res, "body", json_object_new_string_len(body_out, (int)bn));
  else if (body_out) {
    cleanup_free char *enc = pu_b64_encode(body_out, bn, NULL);
    clean = clean && enc;
    json_object_object_add(res, "body_base64", json_object_new_string(enc ? enc : ""));
  }
  json_object_object_add(res, "truncated",
                         json_object_new_boolean(resp.truncated || resp.body_bytes > cap));
  if (json_object_array_length(dropped) > 0)
    json_object_object_add(res, "dropped_headers", dropped);
  else
    json_object_put(dropped);
  eph_net_response_clear(&resp);
  /* Last look, at the very text that will be stored and shown: nothing the scrubber has not
   * passed leaves, even if a part above was missed. */
  const char *txt = json_object_to_json_string_ext(res, JSON_C_TO_STRING_PLAIN);
  span_t *sp = NULL;
  ssize_t ns = clean ? find_spans(c, txt, strlen(txt), &sp) : -1;
  free(sp);
  if (ns != 0) {
    json_object_put(res);
    *result = refuse(b, call, c, "scrub",
                     ns < 0 ? "the response could not be scrubbed (out of memory): withheld"
                            : "the response still carried the credential after scrubbing: "
                              "withheld");
    return 0;
  }
  *result = res;
  return 0;
}

/* ---------------------------------------------------------------- lifecycle */

static void
broker_fini(void *state)
{
  broker_t *b = state;
  if (!b)
    return;
  for (size_t i = 0; i < b->n_conns; i++)
    conn_clear(&b->conns[i]);
  free(b->conns);
  free(b);
  curl_global_cleanup();
}

static int
broker_init(const eph_host_t *host, const config_setting_t *config, void **state,
            eph_error_t *err)
{
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
    return eph_error_set(err, EIO, "curl_global_init failed");
  broker_t *b = calloc(1, sizeof *b);
  int r;
  if (!b) {
    curl_global_cleanup();
    return eph_error_set(err, ENOMEM, "out of memory");
  }
  b->host = host;
  if ((r = host->cfg_int(config, "max_response_bytes", 1048576, &b->max_response_bytes, err)) < 0 ||
      (r = host->cfg_int(config, "timeout_ms", 30000, &b->timeout_ms, err)) < 0 ||
      (r = host->cfg_int(config, "price_micros_per_request", 0, &b->price_micros, err)) < 0)
    goto fail;
  config_setting_t *list = config ? config_setting_get_member(config, "connections") : NULL;
  int n = list ? config_setting_length(list) : 0;
  if (list && !config_setting_is_aggregate(list)) {
    r = cfg_fail(list, err, "%s", "'connections' must be a list of groups");
    goto fail;
  }
  b->conns = calloc((size_t)n + 1, sizeof *b->conns);
  if (!b->conns) {
    r = eph_error_set(err, ENOMEM, "out of memory");
    goto fail;
  }
  for (int i = 0; i < n; i++) {
    b->n_conns++;
    if ((r = conn_load(host, config_setting_get_elem(list, (unsigned)i), &b->conns[i], err)) < 0)
      goto fail;
    for (int j = 0; j < i; j++)
      if (strcmp(b->conns[j].name, b->conns[i].name) == 0) {
        r = cfg_fail(config_setting_get_elem(list, (unsigned)i), err,
                     "connection '%s' is defined twice", b->conns[i].name);
        goto fail;
      }
  }
  *state = b;
  return 0;
fail:
  broker_fini(b);
  return r;
}

/* The core asks before admitting a run that grants `name` (the connections are fixed at
 * init: nothing to lock). */
static int
broker_connection_defined(void *state, const char *name)
{
  return find_conn(state, name) ? 1 : 0;
}

static const eph_tool_ops_t broker_ops = {
    .struct_size = sizeof(eph_tool_ops_t),
    .tools = broker_tools,
    .n_tools = sizeof broker_tools / sizeof broker_tools[0],
    .call = broker_call,
    .connection_defined = broker_connection_defined,
};

EPH_PLUGIN_EXPORT = {
    .abi_major = EPH_ABI_MAJOR,
    .abi_minor = EPH_ABI_MINOR,
    .struct_size = sizeof(eph_plugin_t),
    .name = "tool-connection",
    .kind = EPH_KIND_TOOL,
    .version = PACKAGE_VERSION,
    .description = "the connection broker: operator-defined API connections, credentials "
                   "added on the host",
    .config_keys = broker_keys,
    .init = broker_init,
    .fini = broker_fini,
    .ops = &broker_ops,
};
