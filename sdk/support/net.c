/* The pinned libcurl fetch (each hop resolved and checked by net_policy.c); see net.h. */
#include "config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "net.h"

#include "curl_api.h"

#include "cleanup.h"
#include "text.h"

/* ---------------------------------------------------------------- URLs */

static bool
host_is_text(const char *host)
{
  if (!eph_utf8_is_text((const unsigned char *)host, strlen(host)))
    return false;
  for (const unsigned char *p = (const unsigned char *)host; *p; p++)
    if (*p == ' ' || eph_control_len(p))
      return false;
  return true;
}

static int
parse_url(const char *url, CURLU **out, char **host, int *port, eph_error_t *err)
{
  int r = eph_curl_load(err);
  if (r < 0)
    return r;
  CURLU *u = curl_url();
  char *scheme = NULL, *h = NULL, *user = NULL, *pw = NULL, *zone = NULL, *portstr = NULL;
  if (!u)
    return eph_error_set(err, ENOMEM, "out of memory");
  if (curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK) {
    r = eph_error_set(err, EINVAL, "not a valid absolute URL");
    goto out;
  }
  if (curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
      (strcasecmp(scheme, "http") != 0 && strcasecmp(scheme, "https") != 0)) {
    r = eph_error_set(err, EINVAL, "only http:// and https:// URLs are allowed");
    goto out;
  }
  if (curl_url_get(u, CURLUPART_USER, &user, 0) == CURLUE_OK ||
      curl_url_get(u, CURLUPART_PASSWORD, &pw, 0) == CURLUE_OK) {
    r = eph_error_set(err, EINVAL, "URLs with credentials (user@host) are not allowed");
    goto out;
  }
  if (curl_url_get(u, CURLUPART_ZONEID, &zone, 0) == CURLUE_OK) {
    r = eph_error_set(err, EINVAL, "IPv6 zone identifiers are not allowed");
    goto out;
  }
  if (curl_url_get(u, CURLUPART_HOST, &h, 0) != CURLUE_OK || !*h) {
    r = eph_error_set(err, EINVAL, "URL has no host");
    goto out;
  }
  if (curl_url_get(u, CURLUPART_PORT, &portstr, CURLU_DEFAULT_PORT) != CURLUE_OK) {
    r = eph_error_set(err, EINVAL, "URL has no port");
    goto out;
  }
  /* libcurl decodes the host (%ff is the byte 0xff): such a name went to the resolver and,
   * quoted in the errors below and in the callers' refusals, put invalid UTF-8 and raw
   * control bytes into events and tool results. A host must be UTF-8 text (an IDN may be)
   * without controls or spaces. */
  if (!host_is_text(h)) {
    r = eph_error_set(err, EINVAL, "the URL's host has bytes no host name has");
    goto out;
  }
  *port = atoi(portstr);
  size_t n = strlen(h);
  if (h[0] == '[' && n >= 2 && h[n - 1] == ']') {
    memmove(h, h + 1, n - 2);
    h[n - 2] = 0;
  }
  for (char *c = h; *c; c++)
    *c = (char)tolower((unsigned char)*c);
  *host = strdup(h);
  if (!*host)
    r = eph_error_set(err, ENOMEM, "out of memory");
out:
  curl_free(scheme);
  curl_free(h);
  curl_free(user);
  curl_free(pw);
  curl_free(zone);
  curl_free(portstr);
  if (r == 0 && out)
    *out = u;
  else
    curl_url_cleanup(u);
  return r;
}

int
eph_net_url_host(const char *url, char **host, int *port, eph_error_t *err)
{
  return parse_url(url, NULL, host, port, err);
}

/* ---------------------------------------------------------------- one hop */

typedef struct hop {
  const eph_net_policy_t *policy;
  struct sockaddr_storage pinned;
  int socket_refused;
  eph_net_response_t *resp;
  size_t max_bytes;
  size_t cap; /* allocated */
} hop_t;

static bool
same_addr(const struct sockaddr *a, const struct sockaddr_storage *b)
{
  if (a->sa_family != b->ss_family)
    return false;
  if (a->sa_family == AF_INET) {
    const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
    return x->sin_addr.s_addr == y->sin_addr.s_addr && x->sin_port == y->sin_port;
  }
  if (a->sa_family == AF_INET6) {
    const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
    return memcmp(&x->sin6_addr, &y->sin6_addr, 16) == 0 && x->sin6_port == y->sin6_port;
  }
  return false;
}

static curl_socket_t
open_socket(void *opaque, curlsocktype purpose, struct curl_sockaddr *a)
{
  hop_t *h = opaque;
  if (purpose != CURLSOCKTYPE_IPCXN || eph_net_addr_refusal(h->policy, &a->addr) ||
      !same_addr(&a->addr, &h->pinned)) {
    h->socket_refused = 1;
    return CURL_SOCKET_BAD;
  }
  return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

static size_t
on_body(char *data, size_t size, size_t nmemb, void *opaque)
{
  hop_t *h = opaque;
  eph_net_response_t *r = h->resp;
  size_t n = size * nmemb, room = h->max_bytes - r->body_bytes;
  size_t take = n < room ? n : room;
  if (r->body_bytes + take + 1 > h->cap) {
    size_t cap = h->cap ? h->cap : 16384;
    while (cap < r->body_bytes + take + 1)
      cap *= 2;
    char *b = realloc(r->body, cap);
    if (!b)
      return 0;
    r->body = b;
    h->cap = cap;
  }
  memcpy(r->body + r->body_bytes, data, take);
  r->body_bytes += take;
  r->body[r->body_bytes] = 0;
  if (take < n) {
    r->truncated = 1;
    return 0; /* stop the transfer: CURLE_WRITE_ERROR, recognised by `truncated` */
  }
  return n;
}

static size_t
on_header(char *data, size_t size, size_t nmemb, void *opaque)
{
  hop_t *h = opaque;
  size_t n = size * nmemb;
  if (n >= 5 && strncmp(data, "HTTP/", 5) == 0) { /* a new response (100 Continue, ...) */
    json_object_put(h->resp->headers);
    h->resp->headers = json_object_new_object();
    return n;
  }
  const char *colon = memchr(data, ':', n);
  if (!colon || colon == data)
    return n;
  char name[128];
  size_t nl = (size_t)(colon - data);
  if (nl >= sizeof name)
    return n;
  for (size_t i = 0; i < nl; i++)
    name[i] = (char)tolower((unsigned char)data[i]);
  name[nl] = 0;
  const char *v = colon + 1, *end = data + n;
  while (v < end && (*v == ' ' || *v == '\t'))
    v++;
  while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' '))
    end--;
  json_object *prev = NULL;
  if (json_object_object_get_ex(h->resp->headers, name, &prev)) {
    cleanup_free char *joined = NULL;
    if (asprintf(&joined, "%s, %.*s", json_object_get_string(prev), (int)(end - v), v) < 0)
      return 0;
    json_object_object_add(h->resp->headers, name, json_object_new_string(joined));
  } else {
    json_object_object_add(h->resp->headers, name, json_object_new_string_len(v, (int)(end - v)));
  }
  return n;
}

static int
do_hop(const eph_net_policy_t *p, const eph_net_request_t *req, const char *url, const char *method,
       int send_body, int hop_no, int64_t end_ms, eph_net_response_t *resp, char **redirect_to,
       eph_error_t *err)
{
  cleanup_free char *host = NULL;
  int port = 0, r;
  CURLU *u = NULL;
  if ((r = parse_url(url, &u, &host, &port, err)) < 0)
    return r;
  curl_url_cleanup(u);
  if (req->check_domains) {
    const char *why = eph_net_host_refusal(p, host);
    if (why)
      return eph_error_set(err, EPH_E_DENIED, "host '%s' refused: %s", host, why);
    if ((why = eph_net_port_refusal(p, port)))
      return eph_error_set(err, EPH_E_DENIED, "port %d of '%s' refused: %s", port, host, why);
  }
  /* Charged before any I/O, name resolution included. */
  if (req->before_request && (r = req->before_request(req->opaque, method, url, hop_no, err)) < 0)
    return r;
  hop_t h = {.policy = p, .resp = resp, .max_bytes = req->max_response_bytes};
  char addr[INET6_ADDRSTRLEN];
  if ((r = eph_net_resolve_checked(p, host, port, &h.pinned, addr, err)) < 0)
    return r;
  snprintf(resp->addr, sizeof resp->addr, "%s", addr);

  int64_t left = end_ms - eph_now_ms();
  if (left <= 0)
    return eph_error_set(err, ETIMEDOUT, "request timed out");

  /* Reset what a previous hop left. */
  free(resp->body);
  resp->body = NULL;
  resp->body_bytes = 0;
  resp->truncated = 0;
  json_object_put(resp->headers);
  resp->headers = json_object_new_object();

  CURL *c = curl_easy_init();
  if (!c)
    return eph_error_set(err, ENOMEM, "curl_easy_init failed");
  char pin[512], errbuf[CURL_ERROR_SIZE] = "";
  bool v6 = h.pinned.ss_family == AF_INET6;
  bool literal = strchr(host, ':') != NULL;
  snprintf(pin, sizeof pin, "%s%s%s:%d:%s%s%s", literal ? "[" : "", host, literal ? "]" : "", port,
           v6 ? "[" : "", addr, v6 ? "]" : "");
  struct curl_slist *resolve = curl_slist_append(NULL, pin);
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_RESOLVE, resolve);
  curl_easy_setopt(c, CURLOPT_OPENSOCKETFUNCTION, open_socket);
  curl_easy_setopt(c, CURLOPT_OPENSOCKETDATA, &h);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_PROXY, "");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
#if LIBCURL_VERSION_NUM >= 0x075500
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
#else
  curl_easy_setopt(c, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)left);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)(left < 10000 ? left : 10000));
  curl_easy_setopt(c, CURLOPT_ACCEPT_ENCODING, "");
  curl_easy_setopt(c, CURLOPT_USERAGENT, "ephemeral/" PACKAGE_VERSION);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &h);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &h);
  if (req->headers)
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, req->headers);
  if (strcmp(method, "HEAD") == 0)
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  else if (strcmp(method, "GET") != 0)
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  if (send_body && req->body) {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, req->body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_bytes);
    if (strcmp(method, "POST") != 0)
      curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  }

  CURLcode cc = curl_easy_perform(c);
  if (cc != CURLE_OK && !(cc == CURLE_WRITE_ERROR && resp->truncated)) {
    if (h.socket_refused)
      r = eph_error_set(err, EPH_E_DENIED, "connection to a refused address blocked");
    else if (cc == CURLE_OPERATION_TIMEDOUT)
      r = eph_error_set(err, ETIMEDOUT, "request timed out");
    else
      r = eph_error_set(err, EPH_E_UPSTREAM, "request failed: %s",
                        errbuf[0] ? errbuf : curl_easy_strerror(cc));
    goto out;
  }
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &resp->status);
  char *ct = NULL, *loc = NULL;
  curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &ct);
  free(resp->content_type);
  resp->content_type = ct ? strdup(ct) : NULL;
  free(resp->final_url);
  resp->final_url = strdup(url);
  if (resp->status >= 300 && resp->status < 400 &&
      curl_easy_getinfo(c, CURLINFO_REDIRECT_URL, &loc) == CURLE_OK && loc)
    *redirect_to = strdup(loc);
  r = 0;
out:
  curl_easy_cleanup(c);
  curl_slist_free_all(resolve);
  return r;
}

int
eph_net_fetch(const eph_net_policy_t *p, const eph_net_request_t *req, eph_net_response_t *resp,
              eph_error_t *err)
{
  memset(resp, 0, sizeof *resp);
  int64_t end_ms = eph_now_ms() + (req->timeout_ms > 0 ? req->timeout_ms : 30000);
  cleanup_free char *url = strdup(req->url);
  char method[32];
  snprintf(method, sizeof method, "%s", req->method ? req->method : "GET");
  int send_body = 1;
  for (int hop_no = 0;; hop_no++) {
    char *next = NULL;
    int r = do_hop(p, req, url, method, send_body, hop_no, end_ms, resp, &next, err);
    if (r < 0) {
      free(next);
      eph_net_response_clear(resp);
      return r;
    }
    if (!next)
      return 0;
    if (req->max_redirects <= 0) {
      resp->location = next;
      return 0;
    }
    if (hop_no >= req->max_redirects) {
      free(next);
      eph_net_response_clear(resp);
      return eph_error_set(err, EPH_E_UPSTREAM, "too many redirects (more than %d)",
                           req->max_redirects);
    }
    /* As browsers do: 303 turns anything but HEAD into GET; 301/302 turn POST into GET. */
    if ((resp->status == 303 && strcmp(method, "HEAD") != 0) ||
        ((resp->status == 301 || resp->status == 302) && strcmp(method, "POST") == 0)) {
      snprintf(method, sizeof method, "GET");
      send_body = 0;
    }
    free(url);
    url = next;
    resp->redirects = hop_no + 1;
  }
}

int64_t
eph_net_time_left(int64_t timeout_ms, int64_t deadline_ms)
{
  if (deadline_ms > 0) {
    int64_t left = deadline_ms - eph_now_ms();
    if (left < timeout_ms)
      return left;
  }
  return timeout_ms;
}

int
eph_net_fetch_within(const eph_net_policy_t *p, eph_net_request_t *req, int64_t left_ms,
                     eph_net_response_t *resp, eph_error_t *err)
{
  memset(resp, 0, sizeof *resp);
  if (left_ms <= 0)
    return eph_error_set(err, ETIMEDOUT, "the run deadline has passed");
  req->timeout_ms = left_ms;
  return eph_net_fetch(p, req, resp, err);
}

void
eph_net_response_clear(eph_net_response_t *r)
{
  free(r->content_type);
  free(r->final_url);
  free(r->location);
  free(r->body);
  json_object_put(r->headers);
  memset(r, 0, sizeof *r);
}
