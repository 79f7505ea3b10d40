/* Fuzz target: the guest protocol's frame decoder (guest/protocol.h, shared by
 * ephemeral-guest and the core): a 4-byte big-endian length + exactly one JSON object.
 * The input is the byte stream; it reaches the incremental reader through a non-blocking
 * pipe in chunks of varying size (1 byte up to 4 KiB), so frame headers and bodies split at
 * every position are exercised. Each decoded frame goes through the field helpers and the
 * base64 decoder the guest and the client use on it, and is written back as a frame.
 * Oracle besides memory errors: an accepted frame holds one object and blanks only. */
#include <config.h>

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "../../guest/protocol.h"
#include "fuzz.h"

static int devnull = -1;

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
  devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
  return 0;
}

static void
use_frame(json_object *obj)
{
  static const char *const b64_keys[] = {"data", "stdin"};
  for (size_t i = 0; i < sizeof b64_keys / sizeof b64_keys[0]; i++) {
    void *buf = NULL;
    size_t n = 0;
    if (eph_proto_get_b64(obj, b64_keys[i], EPH_PROTO_MAX_DATA_BYTES, &buf, &n) == 0)
      free(buf);
  }
  int64_t v;
  (void)eph_json_get_string(obj, "type");
  (void)eph_proto_int(obj, "id", &v);
  if (devnull >= 0)
    (void)eph_proto_write_frame(devnull, obj);
}

/* A frame the reader accepted is one JSON object and blanks (space, tab, CR, LF) after it,
 * nothing else: its body's last non-blank byte is the object's closing brace. */
static void
check_body(const eph_frame_reader_t *r)
{
  size_t end = r->body_len;
  while (end > 0 && memchr(" \t\r\n", r->body[end - 1], 4))
    end--;
  if (end == 0 || r->body[end - 1] != '}') {
    fprintf(stderr, "fuzz-frame: accepted a frame with bytes after its object\n");
    abort();
  }
}

/* Feeds until the pipe is empty; false once the reader gave up (stream out of step). */
static bool
drain(eph_frame_reader_t *r, int fd)
{
  for (;;) {
    int avail = 0;
    if (ioctl(fd, FIONREAD, &avail) < 0 || avail <= 0)
      return true;
    json_object *obj = NULL;
    int rc = eph_frame_reader_feed(r, fd, &obj);
    if (rc == 1) {
      check_body(r);
      use_frame(obj);
      json_object_put(obj);
    } else if (rc < 0) {
      return false;
    }
  }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  int p[2];
  if (pipe2(p, O_CLOEXEC | O_NONBLOCK) < 0)
    return 0;
  eph_frame_reader_t r;
  memset(&r, 0, sizeof r);
  size_t off = 0;
  bool alive = true;
  for (unsigned k = 0; alive && off < size; k++) {
    static const size_t steps[] = {1, 3, 4, 5, 64, 4096, 2, 17};
    size_t n = steps[(k + size) % (sizeof steps / sizeof steps[0])];
    if (n > size - off)
      n = size - off;
    ssize_t w = write(p[1], data + off, n);
    if (w <= 0)
      break;
    off += (size_t)w;
    alive = drain(&r, p[0]);
  }
  close(p[1]);
  /* End of stream: the reader must report it (EPIPE, or EPROTO inside a frame). */
  while (alive) {
    json_object *obj = NULL;
    int rc = eph_frame_reader_feed(&r, p[0], &obj);
    if (rc == 1) {
      check_body(&r);
      use_frame(obj);
      json_object_put(obj);
    } else if (rc < 0) {
      break;
    }
  }
  eph_frame_reader_clear(&r);
  close(p[0]);
  return 0;
}
