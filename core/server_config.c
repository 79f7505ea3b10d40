/* ephemerald's options from ephemeral.conf's `server` group. The keys, their defaults and
 * ranges are rows of core/conf_core.h, checked and parsed by eph_config_load; this only
 * copies the parsed values into the server's options and parses `listen`. */
#include <config.h>

#include "server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "util.h"

int
eph_server_options_from_config(eph_ctx_t *ctx, eph_server_options_t *opt, eph_error_t *err)
{
  (void)err;
  const eph_server_conf_t *v = &eph_config_values(&ctx->config)->server;
  memset(opt, 0, sizeof *opt);
  snprintf(opt->listen, sizeof opt->listen, "%s", v->listen);
  opt->max_concurrent_runs = (int)v->max_concurrent_runs;
  opt->max_queued_runs = (int)v->max_queued_runs;
  opt->max_body_bytes = (size_t)v->max_body_bytes;
  opt->drain_grace_seconds = (int)v->drain_grace_seconds;
  opt->idempotency_hours = (int)v->idempotency_hours;
  opt->live_grace_ms = 5000;
  opt->http_threads = 4;
  opt->max_inflight_body_bytes = (size_t)v->max_inflight_body_bytes;
  opt->max_connections = (int)v->max_connections;
  opt->max_connections_per_ip = (int)v->max_connections_per_ip;
  opt->header_timeout_seconds = (int)v->header_timeout_seconds;
  opt->body_timeout_seconds = (int)v->body_timeout_seconds;
  opt->idle_timeout_seconds = (int)v->idle_timeout_seconds;
  return 0;
}

int
eph_server_parse_listen(const char *text, struct sockaddr_storage *ss, unsigned *len,
                        eph_error_t *err)
{
  memset(ss, 0, sizeof *ss);
  char host[256];
  const char *port_text;
  if (text[0] == '[') {
    const char *close = strchr(text, ']');
    if (!close || close[1] != ':' || (size_t)(close - text - 1) >= sizeof host)
      return eph_error_set(err, EINVAL, "listen '%s': expected [IPV6]:PORT", text);
    memcpy(host, text + 1, (size_t)(close - text - 1));
    host[close - text - 1] = '\0';
    port_text = close + 2;
  } else {
    const char *colon = strrchr(text, ':');
    if (!colon || (size_t)(colon - text) >= sizeof host || strchr(text, ':') != colon)
      return eph_error_set(err, EINVAL, "listen '%s': expected ADDR:PORT or [IPV6]:PORT", text);
    memcpy(host, text, (size_t)(colon - text));
    host[colon - text] = '\0';
    port_text = colon + 1;
  }
  char *end = NULL;
  errno = 0;
  long port = strtol(port_text, &end, 10);
  if (!*port_text || errno || *end || port < 0 || port > 65535)
    return eph_error_set(err, EINVAL, "listen '%s': port must be 0..65535", text);
  struct sockaddr_in *in4 = (struct sockaddr_in *)ss;
  struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
  if (inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
    in4->sin_family = AF_INET;
    in4->sin_port = htons((uint16_t)port);
    *len = sizeof *in4;
  } else if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons((uint16_t)port);
    *len = sizeof *in6;
  } else {
    return eph_error_set(err, EINVAL, "listen '%s': '%s' is not a numeric IPv4 or IPv6 address",
                         text, host);
  }
  return 0;
}
