/* bench/bare-mhd: the peer of GET /v1/runs/{id}: a bare libmicrohttpd server answering
 * every request with the same bytes (a file's content, e.g. a run's JSON), with ephemerald's
 * threading (internal polling thread, epoll, a pool of THREADS) and nothing else: no
 * routing, no auth, no store. Prints "listening on http://127.0.0.1:PORT" and serves until
 * stdin closes.
 *
 * Usage: bench/bare-mhd BODY_FILE [THREADS]   (default 4, ephemerald's http_threads) */
#include <config.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#if MHD_VERSION < 0x00097002
typedef int MHD_RESULT;
#else
typedef enum MHD_Result MHD_RESULT;
#endif

static char *body;
static size_t body_bytes;

static MHD_RESULT
on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
           const char *version, const char *upload, size_t *upload_bytes, void **state)
{
  (void)cls, (void)url, (void)method, (void)version, (void)upload;
  /* Answer on the second call, as ephemerald does: a response queued on the first (before
   * the request was read to its end) makes libmicrohttpd close the connection. */
  static int first;
  if (!*state) {
    *state = &first;
    return MHD_YES;
  }
  if (*upload_bytes) {
    *upload_bytes = 0;
    return MHD_YES;
  }
  struct MHD_Response *r =
      MHD_create_response_from_buffer(body_bytes, body, MHD_RESPMEM_PERSISTENT);
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
  MHD_RESULT ret = MHD_queue_response(c, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ret;
}

int
main(int argc, char **argv)
{
  if (argc < 2) {
    fprintf(stderr, "usage: bare-mhd BODY_FILE [THREADS]\n");
    return 2;
  }
  FILE *f = fopen(argv[1], "rb");
  if (!f) {
    perror(argv[1]);
    return 1;
  }
  static char buf[1 << 22];
  body_bytes = fread(buf, 1, sizeof buf, f);
  fclose(f);
  body = buf;
  unsigned threads = argc > 2 ? (unsigned)atoi(argv[2]) : 4;

  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 1024) < 0 ||
      getsockname(fd, (struct sockaddr *)&a, &len) < 0) {
    perror("listen");
    return 1;
  }
  struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL, 0, NULL,
                                          NULL, on_request, NULL, MHD_OPTION_LISTEN_SOCKET, fd,
                                          MHD_OPTION_THREAD_POOL_SIZE, threads, MHD_OPTION_END);
  if (!d) {
    fprintf(stderr, "bare-mhd: MHD_start_daemon failed\n");
    return 1;
  }
  printf("listening on http://127.0.0.1:%u\n", ntohs(a.sin_port));
  fflush(stdout);
  char c;
  while (read(STDIN_FILENO, &c, 1) > 0)
    ;
  MHD_stop_daemon(d);
  return 0;
}
