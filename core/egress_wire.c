/* The egress proxy's reading of what a sandbox sends (core/egress.c serves the
 * connections): a request head's headers and its Host header check, the rewrite of an
 * absolute-form GET/HEAD for the upstream, and the TLS ClientHello's server name. Pure
 * functions over bytes already read (no I/O): the bytes are hostile, and
 * tests/fuzz/fuzz-egress.c runs them directly. */
#include <config.h>

#include "egress_int.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "support/curl_api.h"
#include "support/net.h"
#include "util.h"

/* ------------------------------------------------------------------ request heads */

static bool
hop_by_hop(const char *name, size_t len, const char *connection_tokens)
{
  static const char *const names[] = {"connection",        "keep-alive", "te",   "trailer",
                                      "transfer-encoding", "upgrade",    "host", NULL};
  for (size_t i = 0; names[i]; i++)
    if (strlen(names[i]) == len && strncasecmp(name, names[i], len) == 0)
      return true;
  if (len >= 6 && strncasecmp(name, "proxy-", 6) == 0)
    return true;
  /* Headers the client's Connection header lists are hop-by-hop too (RFC 9110 7.6.1). */
  for (const char *t = connection_tokens; t && *t;) {
    while (*t == ' ' || *t == ',' || *t == '\t' || *t == '\r')
      t++;
    size_t tl = strcspn(t, " ,\t\r");
    if (tl == len && tl && strncasecmp(t, name, len) == 0)
      return true;
    t += tl;
  }
  return false;
}

/* The value of header `name` in the head's header lines, copied into out; false if absent. */
bool
egress_header_value(const char *headers, const char *name, char *out, size_t size)
{
  size_t nl = strlen(name);
  for (const char *l = headers; *l && !(l[0] == '\r' && l[1] == '\n');) {
    const char *eol = strstr(l, "\r\n");
    if (!eol)
      break;
    if ((size_t)(eol - l) > nl && strncasecmp(l, name, nl) == 0 && l[nl] == ':') {
      const char *v = l + nl + 1;
      while (v < eol && (*v == ' ' || *v == '\t'))
        v++;
      snprintf(out, size, "%.*s", (int)(eol - v), v);
      return true;
    }
    l = eol + 2;
  }
  return false;
}

/* How many header lines named `name` the head has. */
static int
header_count(const char *headers, const char *name)
{
  size_t nl = strlen(name);
  int n = 0;
  for (const char *l = headers; *l && !(l[0] == '\r' && l[1] == '\n');) {
    const char *eol = strstr(l, "\r\n");
    if (!eol)
      break;
    /* "Host :" (space before the colon) is malformed (RFC 9112 5.1); counted so it
     * cannot slip past as "not a Host header" to a lenient upstream. */
    size_t k = nl;
    while (l + k < eol && (l[k] == ' ' || l[k] == '\t'))
      k++;
    if ((size_t)(eol - l) > k && strncasecmp(l, name, nl) == 0 && l[k] == ':')
      n++;
    l = eol + 2;
  }
  return n;
}

/* NULL when the client's Host header names the host and port the request was checked
 * against (or there is none: the upstream gets the checked one), else why not into msg. A
 * plain-HTTP request to an allowed name must not carry another name for a shared
 * upstream (virtual hosting, a CDN) to route by. */
const char *
host_header_refusal(const char *headers, const char *host, int port, char *msg, size_t size)
{
  int n = header_count(headers, "host");
  if (n == 0)
    return NULL;
  if (n > 1)
    return "several Host headers";
  char value[512] = "";
  bool got = egress_header_value(headers, "host", value, sizeof value);
  /* A host name is printable ASCII (IDNs travel as punycode): anything else is refused
   * without being echoed into the refusal (an event: no raw bytes, valid UTF-8). */
  for (const char *q = value; got && *q; q++)
    if ((unsigned char)*q <= 0x20 || (unsigned char)*q > 0x7e)
      return "the Host header has bytes no host name has";
  if (!got || !*value || strpbrk(value, "/?#@\\ \t")) {
    snprintf(msg, size, "Host header '%.200s' is not host[:port]", value);
    return msg;
  }
  char *url = eph_xasprintf("http://%s/", value), *h = NULL;
  int p = 0;
  eph_error_t ignored = {0};
  bool ok = eph_net_url_host(url, &h, &p, &ignored) == 0;
  free(url);
  size_t hl = ok ? strlen(h) : 0, cl = strlen(host);
  while (hl > 0 && h[hl - 1] == '.')
    h[--hl] = '\0';
  while (cl > 0 && host[cl - 1] == '.')
    cl--;
  ok = ok && hl == cl && strncasecmp(h, host, cl) == 0 && p == port;
  free(h);
  if (ok)
    return NULL;
  snprintf(msg, size, "Host header '%.200s' does not name the checked host %s:%d", value, host,
           port);
  return msg;
}

/* ------------------------------------------------------------------ TLS ClientHello */

/* The server name (SNI) a TLS ClientHello asks for, read WITHOUT terminating TLS.
 *
 * Why a parser of our own: the proxy must not terminate the sandbox's TLS (it has no
 * certificate for the destinations and must not see the plaintext), and OpenSSL has no
 * standalone ClientHello parser that works without running a handshake
 * (SSL_client_hello_get* exist only inside a server handshake's callback). So this reads
 * exactly one thing and nothing more: the first TLS record (RFC 8446 5.1), which must be a
 * handshake record holding one whole ClientHello (4.1.2), and in it the server_name
 * extension (RFC 6066 3). It is bounded: the record is at most TLS_RECORD_MAX bytes (read
 * into a fixed buffer by the caller), every length is checked against the bytes that
 * remain, and anything unexpected (another record type, a ClientHello split over records,
 * trailing bytes, a duplicate extension, several or non-host_name names, a name with
 * characters no host name has, an encrypted ClientHello) is a refusal, never a guess.
 *
 * rec/n: the whole record, header included. Returns NULL with the name in out ("" when
 * the ClientHello has no server_name extension), or a static reason. */
const char *
client_hello_sni(const uint8_t *rec, size_t n, char *out, size_t size)
{
  out[0] = '\0';
  if (n < TLS_HEADER_BYTES || rec[0] != 22 /* handshake */)
    return "the tunnel does not start with a TLS handshake (only TLS goes through CONNECT)";
  size_t len = (size_t)rec[3] << 8 | rec[4];
  if (rec[1] != 3 || rec[2] > 4 || len > TLS_RECORD_MAX || n != TLS_HEADER_BYTES + len)
    return "malformed TLS record";
  const uint8_t *p = rec + TLS_HEADER_BYTES, *end = p + len;
#define NEED(k)                                                                                    \
  do {                                                                                             \
    if ((size_t)(end - p) < (size_t)(k))                                                           \
      return "truncated TLS ClientHello";                                                          \
  } while (0)
  NEED(4);
  if (p[0] != 1 /* client_hello */)
    return "the first TLS handshake message is not a ClientHello";
  size_t hl = (size_t)p[1] << 16 | (size_t)p[2] << 8 | p[3];
  p += 4;
  if (hl > (size_t)(end - p))
    return "the TLS ClientHello spans several records (refused: only the first is read)";
  if (hl < (size_t)(end - p))
    return "bytes after the TLS ClientHello in its record";
  NEED(2 + 32 + 1); /* legacy_version, random, session id length */
  p += 2 + 32;
  size_t k = *p++;
  NEED(k);
  p += k;
  NEED(2); /* cipher suites */
  k = (size_t)p[0] << 8 | p[1];
  p += 2;
  NEED(k);
  p += k;
  NEED(1); /* compression methods */
  k = *p++;
  NEED(k);
  p += k;
  if (p == end)
    return NULL; /* no extensions at all: no SNI */
  NEED(2);
  k = (size_t)p[0] << 8 | p[1];
  p += 2;
  if (k != (size_t)(end - p))
    return "malformed TLS ClientHello extensions";
  bool seen = false;
  while (p < end) {
    NEED(4);
    unsigned type = (unsigned)p[0] << 8 | p[1];
    size_t el = (size_t)p[2] << 8 | p[3];
    p += 4;
    NEED(el);
    const uint8_t *ext = p, *ext_end = p + el;
    p += el;
    /* Encrypted ClientHello: the name in the clear is only the front's public name, the
     * real one is encrypted; it cannot be checked, so it is refused (GREASE ECH of
     * browsers included: indistinguishable by design). 0xfe0d: RFC draft-ietf-tls-esni;
     * 0xffce: the older encrypted_server_name. */
    if (type == 0xfe0d || type == 0xffce)
      return "an encrypted ClientHello (ECH/ESNI) hides the server name";
    if (type != 0 /* server_name */)
      continue;
    if (seen)
      return "two server_name extensions in the TLS ClientHello";
    seen = true;
    if (el < 2 || ((size_t)ext[0] << 8 | ext[1]) != el - 2)
      return "malformed TLS server_name extension";
    for (ext += 2; ext < ext_end;) {
      if (ext_end - ext < 3)
        return "malformed TLS server_name extension";
      unsigned name_type = ext[0];
      size_t nl = (size_t)ext[1] << 8 | ext[2];
      ext += 3;
      if (nl > (size_t)(ext_end - ext))
        return "malformed TLS server_name extension";
      if (name_type != 0 /* host_name */)
        return "a TLS server_name of another type than host_name";
      if (out[0])
        return "several host names in the TLS server_name extension";
      if (nl == 0 || nl >= size || nl > 255)
        return "a TLS server name that is empty or too long";
      for (size_t i = 0; i < nl; i++) {
        uint8_t c = ext[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '.' || c == '_' || c == ':'))
          return "a TLS server name with characters no host name has";
      }
      memcpy(out, ext, nl);
      out[nl] = '\0';
      ext += nl;
    }
    if (!out[0])
      return "an empty TLS server_name extension";
  }
#undef NEED
  return NULL;
}

/* Rewrites an absolute-form GET/HEAD into origin form for the upstream. Heap string. */
char *
rewrite_request(const char *method, const char *url, const char *host, int port,
                const char *headers)
{
  /* libcurl is loaded: the target was parsed by eph_net_url_host() before. */
  CURLU *u = eph_curl_load(NULL) == 0 ? curl_url() : NULL;
  char *path = NULL, *query = NULL;
  if (u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK) {
    curl_url_get(u, CURLUPART_PATH, &path, 0);
    curl_url_get(u, CURLUPART_QUERY, &query, 0);
  }
  char conn_tokens[512] = "";
  egress_header_value(headers, "connection", conn_tokens, sizeof conn_tokens);
  size_t cap = strlen(headers) + strlen(url) + 512, len = 0;
  char *out = eph_xmalloc(cap);
  bool v6 = strchr(host, ':') != NULL;
  len += (size_t)snprintf(out + len, cap - len, "%s %s%s%s HTTP/1.1\r\nHost: %s%s%s", method,
                          path && *path ? path : "/", query ? "?" : "", query ? query : "",
                          v6 ? "[" : "", host, v6 ? "]" : "");
  if (port != 80)
    len += (size_t)snprintf(out + len, cap - len, ":%d", port);
  len += (size_t)snprintf(out + len, cap - len, "\r\n");
  for (const char *l = headers; *l && !(l[0] == '\r' && l[1] == '\n');) {
    const char *eol = strstr(l, "\r\n");
    if (!eol)
      break;
    const char *colon = memchr(l, ':', (size_t)(eol - l));
    if (colon && !hop_by_hop(l, (size_t)(colon - l), conn_tokens)) {
      memcpy(out + len, l, (size_t)(eol - l) + 2);
      len += (size_t)(eol - l) + 2;
    }
    l = eol + 2;
  }
  len += (size_t)snprintf(out + len, cap - len, "Connection: close\r\n\r\n");
  curl_free(path);
  curl_free(query);
  curl_url_cleanup(u);
  return out;
}

/* An IP literal, which a TLS server_name cannot carry (RFC 6066 3). */
bool
egress_is_ip_literal(const char *host)
{
  struct in6_addr a;
  return inet_pton(AF_INET, host, &a) == 1 || inet_pton(AF_INET6, host, &a) == 1;
}

/* Whether the TLS server name names the CONNECT host (case and one trailing dot aside). */
bool
egress_same_name(const char *sni, const char *host)
{
  size_t a = strlen(sni), b = strlen(host);
  if (a > 0 && sni[a - 1] == '.')
    a--;
  if (b > 0 && host[b - 1] == '.')
    b--;
  return a == b && a > 0 && strncasecmp(sni, host, a) == 0;
}
