/* The hosted-model plugins' keys and base URLs (see model_http.h): a key read from its
 * file or the environment and put in the header line that carries it, the base_url
 * checked (http(s); plain http to loopback only, unless allowed), and every message
 * scrubbed of the key. The key is only ever written into the headers the caller builds for
 * requests to its base_url. The transport that sends them is model_http.c. */
#include "config.h" /* autoconf: _GNU_SOURCE */

#include "model_http.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define KEY_FILE_MAX_BYTES 16384

void
eph_mhttp_redact(char *msg, size_t size, const char *key)
{
  if (!key || !*key || !msg)
    return;
  size_t klen = strlen(key), minlen = klen < 12 ? klen : 12;
  char out[EPH_ERROR_MESSAGE_BYTES];
  size_t o = 0;
  for (size_t i = 0; msg[i] && o + 1 < sizeof out;) {
    size_t best = 0;
    for (size_t j = 0; j < klen; j++) {
      size_t m = 0;
      while (msg[i + m] && j + m < klen && msg[i + m] == key[j + m])
        m++;
      if (m > best)
        best = m;
    }
    if (best >= minlen) {
      static const char mark[] = "[redacted]";
      for (size_t k = 0; mark[k] && o + 1 < sizeof out; k++)
        out[o++] = mark[k];
      i += best;
    } else {
      out[o++] = msg[i++];
    }
  }
  out[o] = '\0';
  snprintf(msg, size, "%s", out);
}

void
eph_mhttp_log(const eph_host_t *host, const char *key, eph_log_level_t level, const char *fmt, ...)
{
  char buf[EPH_ERROR_MESSAGE_BYTES];
  va_list ap;
  if (!host || !host->log)
    return;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  eph_mhttp_redact(buf, sizeof buf, key);
  host->log(level, "%s", buf);
}

void
eph_mhttp_excerpt(const char *body, size_t len, char *out, size_t size)
{
  size_t n = len < size - 4 ? len : size - 4;
  for (size_t i = 0; i < n; i++)
    out[i] = isprint((unsigned char)body[i]) ? body[i] : '.';
  if (n < len)
    memcpy(out + n, "...", 4);
  else
    out[n] = '\0';
}

static bool
is_loopback_host(const char *host)
{
  return strcmp(host, "127.0.0.1") == 0 || strcmp(host, "localhost") == 0 ||
         strcmp(host, "[::1]") == 0 || strcmp(host, "::1") == 0 || strncmp(host, "127.", 4) == 0;
}

int
eph_mhttp_check_base_url(const char *base_url, bool allow_plain_http, eph_error_t *err)
{
  CURLU *u = curl_url();
  char *scheme = NULL, *host = NULL;
  int r = 0;
  if (!u)
    return eph_error_set(err, ENOMEM, "base_url: out of memory");
  if (curl_url_set(u, CURLUPART_URL, base_url, 0) != CURLUE_OK ||
      curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
      curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK) {
    r = eph_error_set(err, EPH_E_CONFIG, "base_url \"%s\": not a valid URL", base_url);
  } else if (strcmp(scheme, "https") != 0 && strcmp(scheme, "http") != 0) {
    r = eph_error_set(err, EPH_E_CONFIG, "base_url \"%s\": scheme must be https (or http)",
                      base_url);
  } else if (strcmp(scheme, "http") == 0 && !allow_plain_http && !is_loopback_host(host)) {
    r = eph_error_set(err, EPH_E_CONFIG,
                      "base_url \"%s\": plain http to a non-loopback host would send the API key "
                      "in clear; use https or set allow_plain_http",
                      base_url);
  }
  curl_free(scheme);
  curl_free(host);
  curl_url_cleanup(u);
  return r;
}

char *
eph_mhttp_trim(char *s)
{
  while (isspace((unsigned char)*s))
    s++;
  size_t n = strlen(s);
  while (n > 0 && isspace((unsigned char)s[n - 1]))
    s[--n] = '\0';
  return s;
}

/* A key is one header token: printable ASCII without spaces, or it could split the header. */
static int
check_key_chars(const char *key, const char *source, eph_error_t *err)
{
  for (const char *p = key; *p; p++)
    if (!isgraph((unsigned char)*p))
      return eph_error_set(err, EPH_E_CONFIG,
                           "%s: the API key contains a space or control character", source);
  return 0;
}

static int
read_key_file(const eph_host_t *host, const char *path, char **out, eph_error_t *err)
{
  struct stat st;
  FILE *f = fopen(path, "re");
  if (!f)
    return eph_error_set(err, errno == ENOENT ? EPH_E_CONFIG : errno, "api_key_file \"%s\": %s",
                         path, strerror(errno));
  if (fstat(fileno(f), &st) == 0 && (st.st_mode & 077))
    eph_mhttp_log(host, NULL, EPH_LOG_WARN,
                  "api_key_file \"%s\" is readable by group or others (mode %03o)", path,
                  (unsigned)(st.st_mode & 0777));
  char *buf = calloc(1, KEY_FILE_MAX_BYTES + 1);
  if (!buf) {
    fclose(f);
    return eph_error_set(err, ENOMEM, "api_key_file \"%s\": out of memory", path);
  }
  size_t n = fread(buf, 1, KEY_FILE_MAX_BYTES + 1, f);
  int read_err = ferror(f);
  fclose(f);
  if (read_err || n > KEY_FILE_MAX_BYTES) {
    eph_free_secret(buf);
    return eph_error_set(err, EPH_E_CONFIG, "api_key_file \"%s\": %s", path,
                         read_err ? "read error" : "larger than 16 KiB");
  }
  char *key = eph_mhttp_trim(buf);
  if (!*key) {
    eph_free_secret(buf);
    return eph_error_set(err, EPH_E_CONFIG, "api_key_file \"%s\": file is empty", path);
  }
  int r = check_key_chars(key, path, err);
  if (r == 0 && !(*out = strdup(key)))
    r = eph_error_set(err, ENOMEM, "api_key_file: out of memory");
  eph_free_secret(buf);
  return r;
}

int
eph_mhttp_load_key(const eph_host_t *host, const char *where, const char *key_file,
                   const char *key_env, char **key, char **no_key_reason, eph_error_t *err)
{
  *key = NULL;
  *no_key_reason = NULL;
  if (*key_file)
    return read_key_file(host, key_file, key, err);
  if (!*key_env)
    return 0;
  const char *v = getenv(key_env);
  char *copy = v ? strdup(v) : NULL;
  char *k = copy ? eph_mhttp_trim(copy) : NULL;
  int r = 0;
  if (k && *k) {
    if ((r = check_key_chars(k, key_env, err)) == 0 && !(*key = strdup(k)))
      r = eph_error_set(err, ENOMEM, "out of memory");
  }
  if (copy)
    eph_free_secret(copy);
  if (r == 0 && !*key &&
      asprintf(no_key_reason,
               "%s: no API key: environment variable %s is not set and api_key_file is empty",
               where, key_env) < 0)
    *no_key_reason = NULL;
  return r;
}

int
eph_mhttp_key_header(const eph_host_t *host, const char *where, const char *key_file,
                     const char *key_env, const char *header_prefix, bool required, char **key,
                     char **header, char **no_key_reason, eph_error_t *err)
{
  *header = NULL;
  int r = eph_mhttp_load_key(host, where, key_file, key_env, key, no_key_reason, err);
  if (r < 0)
    return r;
  if (required && !*key && !*no_key_reason &&
      asprintf(no_key_reason, "%s: no API key: set api_key_file or api_key_env", where) < 0)
    *no_key_reason = NULL;
  if (*key && asprintf(header, "%s%s", header_prefix, *key) < 0) {
    *header = NULL;
    return eph_error_set(err, ENOMEM, "out of memory");
  }
  if (*no_key_reason)
    eph_mhttp_log(host, NULL, EPH_LOG_DEBUG, "%s; model calls will fail until it is set",
                  *no_key_reason);
  return 0;
}

int
eph_mhttp_endpoint(const char *base_url, const char *path, char **url, eph_error_t *err)
{
  size_t blen = strlen(base_url);
  while (blen > 0 && base_url[blen - 1] == '/')
    blen--;
  if (asprintf(url, "%.*s/%s", (int)blen, base_url, path) < 0) {
    *url = NULL;
    return eph_error_set(err, ENOMEM, "out of memory");
  }
  return 0;
}
