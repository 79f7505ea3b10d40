/* Fuzz target: the egress proxy's request-head parser (core/egress.c). A sandbox's
 * workload writes these bytes, so they are hostile. The proxy's static functions are
 * reached by including egress.c here (its public face needs a backend's listener in a
 * sandbox's network namespace). One connection is served from a socketpair: the input is
 * what the sandbox sends.
 *
 * No byte leaves the machine: the policy allows every name and the ports 80, 443 and 8080,
 * and the connection is in the host's network namespace (as eph_egress_start records it),
 * so parsing, the domain, port and namespace checks run, and the announce callback then
 * refuses the charge, which ends the connection before any name is resolved. The parsers
 * serve() only reaches after connecting are then run directly on the same input: the
 * upstream request of a GET/HEAD (rewrite_request: the Connection header and hop-by-hop
 * removal) with its Host header check (host_header_refusal), and the TLS ClientHello
 * reader (client_hello_sni) on the bytes after a CONNECT head as well as on the whole
 * input. */
#include "../../core/egress.c"

#include <signal.h>

#include "fuzz.h"

/* The proxy's charge callback: refuses every connection, so nothing is resolved. */
static int
announce(void *opaque, const char *method, const char *target, const char *refusal,
         eph_error_t *err)
{
  if (refusal)
    return 0;
  return eph_error_set(err, EPH_E_DENIED, "fuzzing: no connection is made");
}

/* The upstream request serve() would send for an allowed GET/HEAD, built from exactly
 * what serve() passes rewrite_request (its head buffer is the first HEAD_MAX_BYTES - 1
 * bytes, a C string). Called directly: serve() only gets there after connecting. */
static void
rewrite(const uint8_t *data, size_t size)
{
  size_t keep = size < HEAD_MAX_BYTES - 1 ? size : HEAD_MAX_BYTES - 1;
  char *buf = eph_xmalloc(keep + 1);
  memcpy(buf, data, keep);
  buf[keep] = '\0';
  char method[16], target[2048], version[16];
  const char *line_end = strstr(buf, "\r\n");
  char *host = NULL;
  int port = 0;
  eph_error_t err = {0};
  if (line_end && strstr(buf, "\r\n\r\n") &&
      sscanf(buf, "%15s %2047s %15s", method, target, version) == 3 &&
      (strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0) &&
      strncasecmp(target, "http://", 7) == 0 && eph_net_url_host(target, &host, &port, &err) == 0) {
    /* The Host header check serve() made on this head (before the domain check), here
     * also for a head serve() refused earlier (a GET with a body). */
    char msg[600];
    (void)host_header_refusal(line_end + 2, host, port, msg, sizeof msg);
    char *req = rewrite_request(method, target, host, port, line_end + 2);
    /* Still one head: the request line, headers, the blank line, nothing after it. */
    char *end = strstr(req, "\r\n\r\n");
    if (!end || end[4] != '\0')
      abort();
    free(req);
  }
  free(host);
  free(buf);
}

/* The first TLS record of a CONNECT tunnel, cut as serve() cuts it (the record header's
 * length, at most what arrived), and the SNI it names. */
static void
sni(const uint8_t *rec, size_t have)
{
  size_t reclen = have;
  if (have >= TLS_HEADER_BYTES && rec[0] == 22) {
    size_t want = TLS_HEADER_BYTES + ((size_t)rec[3] << 8 | rec[4]);
    reclen = want < have ? want : have;
  }
  if (reclen > TLS_HEADER_BYTES + TLS_RECORD_MAX)
    reclen = TLS_HEADER_BYTES + TLS_RECORD_MAX;
  /* On the heap with exactly reclen bytes: ASan sees any read past the record. */
  uint8_t *copy = eph_xmalloc(reclen ? reclen : 1);
  memcpy(copy, rec, reclen);
  char name[256];
  const char *bad = client_hello_sni(copy, reclen, name, sizeof name);
  /* An accepted name is what the CONNECT host is compared with: NUL-terminated within
   * the buffer and only host-name characters. */
  if (!bad) {
    size_t n = strnlen(name, sizeof name);
    if (n >= sizeof name || strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                         "0123456789-._:") != n)
      abort();
  }
  free(copy);
}

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
  signal(SIGPIPE, SIG_IGN);
  return 0;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size >= HEAD_MAX_BYTES * 2)
    return 0; /* the socket buffer holds it: no writer thread needed */
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0)
    return 0;
  size_t off = 0;
  while (off < size) {
    ssize_t w = send(sp[1], data + off, size - off, MSG_NOSIGNAL);
    if (w <= 0)
      break;
    off += (size_t)w;
  }
  shutdown(sp[1], SHUT_WR);

  static int ports[] = {80, 443, 8080};
  static eph_net_policy_t allow_all = {.ports = ports, .n_ports = 3};
  eph_egress_t e;
  memset(&e, 0, sizeof e);
  struct stat st;
  if (stat("/proc/thread-self/ns/net", &st) == 0) {
    e.host_netns_dev = st.st_dev;
    e.host_netns_ino = st.st_ino;
  }
  e.opt.max_connections = 1;
  e.opt.max_bytes = 1 << 20;
  e.opt.max_connection_ms = 10000;
  e.opt.idle_ms = 10000; /* the input ends with EOF: nothing waits for it */
  e.opt.policy = &allow_all;
  e.opt.announce = announce;
  pthread_mutex_init(&e.lock, NULL);
  conn_t c = {.e = &e, .client = sp[0], .upstream = -1};
  serve(&c);
  pthread_mutex_destroy(&e.lock);
  close(sp[0]);
  close(sp[1]);
  rewrite(data, size);
  const uint8_t *tunnel = memmem(data, size, "\r\n\r\n", 4);
  if (tunnel)
    sni(tunnel + 4, size - (size_t)(tunnel + 4 - data));
  sni(data, size);
  return 0;
}
