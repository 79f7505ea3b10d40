/* Fuzz target: the core's handling of what a guest sends back (core/guest_client.c). The
 * guest runs the workload's code, so after a sandbox escape into PID 1 (or a malicious
 * image) every byte of this stream is hostile. The input is the whole stream from the
 * guest: a hello, then replies. A thread plays the guest (writes the input, then reads
 * and discards the client's requests until the client closes); the client opens the
 * session and runs one of each operation (exec, write_file, read_file, list_dir,
 * shutdown) while the connection stays usable. Request ids are 1, 2, 3, ... in that
 * order, so a seed can answer them. Oracle besides memory errors: the kept output of a
 * command stays within its cap. */
#include <config.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"
#include "guest_client.h"

typedef struct {
  int fd;
  const uint8_t *data;
  size_t size;
} guest_side_t;

static void *
guest_main(void *arg)
{
  guest_side_t *gs = arg;
  size_t off = 0;
  while (off < gs->size) {
    ssize_t w = send(gs->fd, gs->data + off, gs->size - off, MSG_NOSIGNAL);
    if (w <= 0)
      break;
    off += (size_t)w;
  }
  shutdown(gs->fd, SHUT_WR);
  char buf[65536];
  while (read(gs->fd, buf, sizeof buf) > 0)
    ;
  return NULL;
}

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
  signal(SIGPIPE, SIG_IGN);
  return 0;
}

static void
on_output(void *opaque, int stream, const char *data, size_t bytes)
{
  size_t *total = opaque;
  *total += bytes;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0)
    return 0;
  guest_side_t gs = {.fd = sp[1], .data = data, .size = size};
  pthread_t t;
  if (pthread_create(&t, NULL, guest_main, &gs) != 0) {
    close(sp[0]);
    close(sp[1]);
    return 0;
  }
  /* The stream ends with the input, so no operation waits for the deadline; it is only
   * there so that a bug cannot hang the fuzzer. */
  int64_t deadline = eph_now_ms() + 10000;
  eph_guest_t *g = NULL;
  eph_error_t err = {0};
  if (eph_guest_open(sp[0], deadline, &g, &err) == 0) {
    (void)eph_guest_scratch(g);
    (void)eph_guest_kernel(g);
    size_t seen = 0;
    /* A small cap: the head-and-tail capture drops bytes from short inputs too. */
    eph_exec_request_t req = {.struct_size = sizeof req,
                              .command = "echo hi",
                              .timeout_ms = 1000,
                              .output_cap_bytes = 64,
                              .on_output = on_output,
                              .opaque = &seen};
    eph_exec_result_t res;
    memset(&res, 0, sizeof res);
    if (eph_guest_exec(g, &req, &res, &err) == 0) {
      /* Host memory per stream is bounded by the cap (plus the dropped-bytes line),
       * whatever the guest sends. */
      if (res.stdout_bytes > req.output_cap_bytes + 64 ||
          res.stderr_bytes > req.output_cap_bytes + 64 ||
          (!res.stdout_truncated && res.stdout_bytes > req.output_cap_bytes) ||
          (!res.stderr_truncated && res.stderr_bytes > req.output_cap_bytes)) {
        fprintf(stderr, "fuzz-guest-client: output over its cap\n");
        abort();
      }
      eph_exec_result_clear(&res);
    }
    if (!eph_guest_broken(g))
      (void)eph_guest_write(g, "in.txt", "hello", 5, &err);
    if (!eph_guest_broken(g)) {
      void *buf = NULL;
      size_t bytes = 0;
      int truncated = 0;
      if (eph_guest_read(g, "out.txt", 64, &buf, &bytes, &truncated, &err) == 0)
        free(buf);
    }
    if (!eph_guest_broken(g)) {
      eph_dirent_t *ents = NULL;
      size_t n = 0;
      if (eph_guest_list(g, "", &ents, &n, &err) == 0)
        eph_dirents_free(ents, n);
    }
    if (!eph_guest_broken(g))
      (void)eph_guest_shutdown(g, deadline, &err);
    eph_guest_close(g); /* closes sp[0]: the guest thread sees the end and returns */
  }
  /* eph_guest_open closed sp[0] itself on failure. */
  pthread_join(t, NULL);
  close(sp[1]);
  return 0;
}
