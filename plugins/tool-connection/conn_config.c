/* tool-connection: reading a connection from the configuration (base URL, credential,
 * how it is applied, methods, path prefixes, allowed headers, address policy) and the
 * header rules no configuration can relax. See connection.c for the broker. */
#include "config.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "connection.h"
#include "support/base64.h"
#include "support/cleanup.h"

/* ---------------------------------------------------------------- config */

static void
strv_free(char **v, size_t n)
{
  for (size_t i = 0; i < n; i++)
    free(v[i]);
  free(v);
}

void
conn_clear(conn_t *c)
{
  free(c->name);
  free(c->base_url);
  free(c->base_path);
  eph_free_secret(c->secret);
  free(c->header_name);
  free(c->query_param);
  strv_free(c->methods, c->n_methods);
  strv_free(c->prefixes, c->n_prefixes);
  strv_free(c->allowed_headers, c->n_allowed_headers);
  eph_net_policy_free(&c->policy);
  for (int v = 0; v < N_VIEWS; v++) {
    for (size_t i = 0; i < c->n_forms[v]; i++)
      eph_free_secret(c->forms[v][i]);
    free(c->forms[v]);
  }
  memset(c, 0, sizeof *c);
}

__attribute__((format(printf, 3, 4))) int
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

bool
valid_token(const char *s)
{
  if (!*s)
    return false;
  for (; *s; s++)
    if (!isalnum((unsigned char)*s) && !strchr("!#$%&'*+-.^_`|~", *s))
      return false;
  return true;
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
  static const char *const no[] = {"authorization",
                                   "cookie",
                                   "host",
                                   "content-length",
                                   "transfer-encoding",
                                   "connection",
                                   "upgrade",
                                   "te",
                                   "trailer",
                                   "keep-alive",
                                   "expect",
                                   "forwarded",
                                   "via",
                                   "accept-encoding",
                                   "content-encoding",
                                   "range",
                                   "if-range",
                                   "x-http-method",
                                   "x-method",
                                   "x-host",
                                   NULL};
  for (size_t i = 0; no[i]; i++)
    if (strcasecmp(name, no[i]) == 0)
      return true;
  static const char *const prefix[] = {"proxy-", "x-forwarded-", "x-original-", "x-rewrite-", NULL};
  for (size_t i = 0; prefix[i]; i++)
    if (strncasecmp(name, prefix[i], strlen(prefix[i])) == 0)
      return true;
  if (strcasestr(name, "override"))
    return true;
  return c->header_name && strcasecmp(name, c->header_name) == 0;
}

/* The caller headers a connection lets through when its config has no allowed_headers. */
static const char *const default_allowed_headers[] = {
    "accept",        "accept-language",   "content-type",        "user-agent", "if-match",
    "if-none-match", "if-modified-since", "if-unmodified-since", NULL};

bool
header_allowed(const conn_t *c, const char *name)
{
  if (header_never_allowed(c, name))
    return false;
  for (size_t i = 0; i < c->n_allowed_headers; i++)
    if (strcasecmp(name, c->allowed_headers[i]) == 0)
      return true;
  return false;
}

int
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
      return cfg_fail(g, err, "connection '%s': apply = \"query\" needs a valid query_param", name);
    c->query_param = strdup(qp);
  } else
    return cfg_fail(g, err, "connection '%s': apply must be bearer, basic, header or query", name);
  if ((r = str_list(g, "methods", 1, false, &c->methods, &c->n_methods, err)) < 0 ||
      (r = str_list(g, "path_prefixes", 0, false, &c->prefixes, &c->n_prefixes, err)) < 0)
    return r;
  if (config_setting_get_member(g, "allowed_headers")) {
    if ((r = str_list(g, "allowed_headers", -1, true, &c->allowed_headers, &c->n_allowed_headers,
                      err)) < 0)
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
                      "URL the broker checked",
                      name, c->allowed_headers[i]);
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
    r = cfg_fail(g, err,
                 "connection '%s': base_url must be an http(s) URL without query, "
                 "fragment or credentials",
                 name);
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
      eph_free_secret(steal_pointer(&c->secret));
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
      char *enc = eph_base64_encode(c->secret, sl);
      el = eph_base64_encoded_bytes(sl);
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
      host->log(EPH_LOG_WARN,
                "connection '%s': the credential is %zu bytes long: too short "
                "to be scrubbed reliably from responses (encoded forms of fewer "
                "than 8 characters and credentials under 4 are not matched)",
                name, sl);
  }
  return 0;
}
