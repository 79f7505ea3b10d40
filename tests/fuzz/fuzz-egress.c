/* Fuzz target: the egress proxy's request-head parser (core/egress.c). A sandbox's
 * workload writes these bytes, so they are hostile. The proxy's static functions are
 * reached by including egress.c here (its public face needs a network namespace and a
 * veth). One connection is served from a socketpair: the input is what the sandbox sends.
 *
 * No byte leaves the machine: the policy allows every name, so parsing, the Connection
 * header handling and the domain check all run, and the announce callback then refuses
 * the charge, which ends the connection before any name is resolved. For an allowed
 * GET/HEAD the callback first builds the upstream request (rewrite_request) from exactly
 * what serve() would pass it. */
#include "../../core/egress.c"

#include <signal.h>

#include "fuzz.h"

static const char *cur_head; /* the head as serve() sees it: NUL-terminated, capped */

static int
announce(void *opaque, const char *method, const char *target, const char *refusal,
         eph_error_t *err)
{
  if (refusal)
    return 0;
  if (strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0) {
    char *host = NULL;
    int port = 0;
    eph_error_t ignored = {0};
    const char *line_end = strstr(cur_head, "\r\n");
    if (line_end && eph_net_url_host(target, &host, &port, &ignored) == 0) {
      char *req = rewrite_request(method, target, host, port, line_end + 2);
      /* The rewritten head must still be one head: the request line, then headers. */
      if (!strstr(req, "\r\n\r\n"))
        abort();
      free(req);
    }
    free(host);
  }
  return eph_error_set(err, EPH_E_DENIED, "fuzzing: no connection is made");
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

  size_t keep = size < HEAD_MAX_BYTES - 1 ? size : HEAD_MAX_BYTES - 1;
  char *head = malloc(keep + 1);
  memcpy(head, data, keep);
  head[keep] = '\0';
  cur_head = head;

  static const eph_net_policy_t allow_all = {0};
  eph_egress_t e;
  memset(&e, 0, sizeof e);
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
  free(head);
  close(sp[0]);
  close(sp[1]);
  return 0;
}
