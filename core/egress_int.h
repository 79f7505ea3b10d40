/* Internal to the egress proxy: the pure readers of what a sandbox sends
 * (core/egress_wire.c), used by core/egress.c and run directly by tests/fuzz/fuzz-egress.c,
 * and its socket I/O (core/egress_io.c). Not part of the core's interface to anyone else. */
#ifndef EPH_EGRESS_INT_H
#define EPH_EGRESS_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <ephemeral/plugin.h>

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

/* ---- socket I/O (egress_io.c). Times are CLOCK_MONOTONIC milliseconds (eph_now_ms);
 * idle_ms bounds one wait without progress, end_ms the whole operation. */

/* 1 when fd is ready for `events` (poll(2) bits) within idle_ms and before end_ms, else 0
 * (ran out, or the poll failed): the caller gives the connection up either way. */
int egress_wait_ready(int fd, short events, int64_t idle_ms, int64_t end_ms);

/* Sends all of data unless the peer takes nothing for idle_ms or end_ms passes (a peer
 * that stops reading must not hold a connection thread). true when all was sent. */
bool egress_send_until(int fd, const char *data, size_t bytes, int64_t idle_ms, int64_t end_ms);

/* The proxy's own short messages (an HTTP answer, a TLS alert, the CONNECT's 200): sent
 * within 2 s or dropped. */
void egress_send_all(int fd, const char *data, size_t bytes);

/* An HTTP/1.1 answer with a text/plain body "ephemeral egress: msg", then the close. */
void egress_reply(int fd, int status, const char *reason, const char *msg);

/* Reads until the end of the request head into buf (size bytes, NUL-terminated). Returns
 * the head length (up to and including the blank line) with *got the bytes read (may
 * include bytes after the head), 0 on EOF, idle or end_ms, -1 when the head is too large. */
ssize_t egress_read_head(int fd, char *buf, size_t size, size_t *got, int64_t idle_ms,
                         int64_t end_ms);

/* A blocking TCP connection to ss within timeout_ms. Returns the fd, or -errno with err. */
int egress_connect(const struct sockaddr_storage *ss, int64_t timeout_ms, eph_error_t *err);

/* Reads the client's first TLS record into rec (TLS_HEADER_BYTES + TLS_RECORD_MAX bytes,
 * already holding `have`). Returns its length, or 0 when the client went quiet or closed;
 * what is not a TLS record is returned as it came, for the caller's verdict. */
size_t egress_read_tls_record(int fd, uint8_t *rec, size_t have, int64_t idle_ms, int64_t end_ms);

/* A fatal TLS alert (RFC 8446 6.2) with this description, so a refused client sees why in
 * its own protocol. */
void egress_tls_alert(int fd, uint8_t description);

#endif
