/* tool-connection internals, shared by connection.c (the tool call: grant, method, path and
 * header checks, the request, the result), conn_config.c (reading a connection from the
 * configuration) and scrub.c (the credential scrubber). Nothing here is exported: the
 * plugin's only public symbol is `eph_plugin` (-fvisibility=hidden). */
#ifndef EPH_TOOL_CONNECTION_H
#define EPH_TOOL_CONNECTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <ephemeral/plugin.h>

#include "support/net.h"

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

/* ------------------------------------------------------------ conn_config.c */

/* Frees everything c holds (the secret and its forms wiped first) and zeroes it. */
void conn_clear(conn_t *c);
/* -EPH_E_CONFIG "file:line: tool-connection: ..." at setting s. */
__attribute__((format(printf, 3, 4))) int cfg_fail(const config_setting_t *s, eph_error_t *err,
                                                   const char *fmt, ...);
/* True when s is a non-empty RFC 9110 token (header names, methods). */
bool valid_token(const char *s);
/* True when a caller may set header `name` on connection c (its allow-list, minus the
 * headers no configuration may allow). */
bool header_allowed(const conn_t *c, const char *name);
/* Reads the connection group g into c (zeroed first; conn_clear() on any outcome). The
 * credential is read and its forms are made for the scrubber. Returns 0 or -EPH_E_CONFIG. */
int conn_load(const eph_host_t *host, const config_setting_t *g, conn_t *c, eph_error_t *err);

/* ------------------------------------------------------------ scrub.c */

typedef struct span {
  size_t from, to;
} span_t;

/* Adds every form of target t (tl bytes) to c's forms; every window of it too
 * (add_windows). Return 0 or -1 when out of memory. */
int add_target(conn_t *c, const char *t, size_t tl);
int add_windows(conn_t *c, const char *t, size_t tl);
/* The spans of s[0..n) that carry a form of the secret, sorted and merged: *out is heap
 * memory owned by the caller (NULL when none). Returns how many, or -1 when out of memory. */
ssize_t find_spans(const conn_t *c, const char *s, size_t n, span_t **out);
/* A copy of s[0..n) with every span carrying the secret replaced by "[REDACTED]", cut at
 * `limit` bytes of the original (see scrub.c). Heap, NUL-terminated, its length in *out_n;
 * NULL when out of memory: callers fail closed. */
char *scrub_copy(const conn_t *c, const char *s, size_t n, size_t limit, size_t *out_n);
/* scrub_copy() of a whole NUL-terminated string. */
char *scrub_str(const conn_t *c, const char *s);

#endif
