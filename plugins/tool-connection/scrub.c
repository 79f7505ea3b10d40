/* tool-connection: the credential scrubber (what it matches and why: the comment below). */
#include "config.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/crypto.h>

#include "connection.h"
#include "support/base64.h"
#include "support/text.h"

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
 * from. The encodings are made with OpenSSL (EVP_EncodeBlock through eph_base64_encode,
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
  } named[] = {{"amp", '&'},   {"lt", '<'},     {"gt", '>'},     {"quot", '"'},   {"apos", '\''},
               {"sol", '/'},   {"bsol", '\\'},  {"plus", '+'},   {"equals", '='}, {"colon", ':'},
               {"semi", ';'},  {"comma", ','},  {"period", '.'}, {"num", '#'},    {"excl", '!'},
               {"quest", '?'}, {"lowbar", '_'}, {"dollar", '$'}, {"percnt", '%'}, {"commat", '@'},
               {"lsqb", '['},  {"rsqb", ']'},   {"lcub", '{'},   {"rcub", '}'},   {"verbar", '|'},
               {"grave", '`'}, {"hat", '^'},    {"ast", '*'},    {"lpar", '('},   {"rpar", ')'},
               {"tilde", '~'}, {"hyphen", '-'}, {"dash", '-'},   {"nbsp", ' '}};
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
int
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
    enc = eph_base64_encode(buf, k + tl);
    el = eph_base64_encoded_bytes(k + tl);
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
int
add_windows(conn_t *c, const char *t, size_t tl)
{
  for (size_t i = 0; tl > SCRUB_WINDOW_BYTES && i + SCRUB_WINDOW_BYTES <= tl; i++)
    if (add_form(c, t + i, SCRUB_WINDOW_BYTES, SCRUB_WINDOW_BYTES) < 0)
      return -1;
  return 0;
}

static int
span_cmp(const void *a, const void *b)
{
  const span_t *x = a, *y = b;
  return x->from < y->from ? -1 : x->from > y->from ? 1 : 0;
}

/* The spans of s[0..n) that carry a form of the secret, sorted and merged: *out is heap
 * memory owned by the caller (NULL when none). Returns how many, or -1 when out of memory. */
ssize_t
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
char *
scrub_copy(const conn_t *c, const char *s, size_t n, size_t limit, size_t *out_n)
{
  span_t *sp = NULL;
  ssize_t ns = find_spans(c, s, n, &sp);
  if (ns < 0)
    return NULL;
  if (limit < n)
    limit = eph_utf8_clip(s, limit);
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

char *
scrub_str(const conn_t *c, const char *s)
{
  size_t n = strlen(s), on = 0;
  return scrub_copy(c, s, n, n, &on);
}
