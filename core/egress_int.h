/* Internal to the egress proxy: the pure readers of what a sandbox sends
 * (core/egress_wire.c), used by core/egress.c and run directly by tests/fuzz/fuzz-egress.c.
 * Not part of the core's interface to anyone else. */
#ifndef EPH_EGRESS_INT_H
#define EPH_EGRESS_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A TLS record header and the largest plaintext record (RFC 8446 5.1: 2^14 bytes). */
#define TLS_HEADER_BYTES 5
#define TLS_RECORD_MAX 16384

/* The value of header `name` in the head's header lines (CRLF-terminated, up to the blank
 * line), copied into out; false if absent. */
bool egress_header_value(const char *headers, const char *name, char *out, size_t size);

/* NULL when the plain-HTTP request's Host header names the host and port it was checked
 * against (or there is none: the upstream gets the checked one), else why not, written
 * into msg (and returned). */
const char *host_header_refusal(const char *headers, const char *host, int port, char *msg,
                                size_t size);

/* The server name (SNI) of the TLS ClientHello in the first record rec[0..n) (header
 * included), read without terminating TLS. Returns NULL with the name in out ("" when there
 * is no server_name extension), or a static reason for a refusal. See egress_wire.c. */
const char *client_hello_sni(const uint8_t *rec, size_t n, char *out, size_t size);

/* The origin-form request for the upstream of an absolute-form GET/HEAD: the checked host
 * and port in Host, hop-by-hop headers (and those the Connection header names) removed,
 * "Connection: close". Heap string owned by the caller. */
char *rewrite_request(const char *method, const char *url, const char *host, int port,
                      const char *headers);

/* An IP literal, which a TLS server_name cannot carry (RFC 6066 3). */
bool egress_is_ip_literal(const char *host);

/* Whether the TLS server name names the CONNECT host (case and one trailing dot aside). */
bool egress_same_name(const char *sni, const char *host);

#endif
