/* The guest protocol: framing, limits and base64, shared by ephemeral-guest (PID 1 inside
 * every sandbox) and the core's guest client (core/guest_client.c). guest/PROTOCOL.md
 * documents the messages; this header holds what both sides must agree on byte for byte.
 *
 * A frame is a 4-byte big-endian length N (1 <= N <= EPH_PROTO_MAX_FRAME_BYTES) followed
 * by N bytes of one JSON object (json-c). Binary payloads travel base64-encoded (RFC 4648,
 * standard alphabet, padded). Everything here is static inline so the static guest and the
 * core library each carry their own copy without a shared object between them. */
#ifndef EPH_GUEST_PROTOCOL_H
#define EPH_GUEST_PROTOCOL_H

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <json-c/json.h>

#include "support/base64.h"
#include "support/json_strict.h" /* eph_json_parse_one: exactly one JSON value, strictly */
#include "support/text.h"        /* eph_json_get_string: a string member, borrowed */

/* Protocol version announced in the guest's hello; the client refuses another one. */
#define EPH_PROTO_VERSION 1

/* Largest frame body either side accepts (1 MiB). A larger announced length ends the
 * session: the reader never allocates more than this. */
#define EPH_PROTO_MAX_FRAME_BYTES (1u << 20)

/* Largest raw payload carried in one frame (stdin of exec, one write_file/read_file chunk):
 * its base64 form (4/3 larger) plus the JSON envelope stays under the frame limit. */
#define EPH_PROTO_MAX_DATA_BYTES (512u * 1024)

/* Largest raw bytes of one "output" frame (one read() of a worker pipe). */
#define EPH_PROTO_OUTPUT_CHUNK_BYTES (256u * 1024)

/* json-c escapes '/' by default, which would bloat base64 text; every frame is written
 * plain and without that escaping. */
#define EPH_PROTO_JSON_FLAGS (JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE)

/* ---------------------------------------------------------------- base64 */

/* The codec is the tree's one (sdk/support/base64.c, strict and canonical): the guest
 * compiles that file into its static binary, the core and backend-qemu take it from the
 * support library. */
/* Adds key = base64(data) to obj. Returns 0 or -ENOMEM. */
static inline int
eph_proto_add_b64(json_object *obj, const char *key, const void *data, size_t n)
{
  char *text = eph_base64_encode(data, n);
  if (!text)
    return -ENOMEM;
  json_object *s = json_object_new_string_len(text, (int)eph_base64_encoded_bytes(n));
  free(text);
  if (!s)
    return -ENOMEM;
  json_object_object_add(obj, key, s);
  return 0;
}

/* Decodes the base64 string member `key` of obj into a heap buffer (*out, owned by the
 * caller, free(); NUL-terminated for convenience) of *bytes bytes, refusing more than
 * max_bytes decoded. A missing key gives an empty buffer. Returns 0, -EINVAL (not a string
 * or not base64), -EFBIG or -ENOMEM. */
static inline int
eph_proto_get_b64(json_object *obj, const char *key, size_t max_bytes, void **out, size_t *bytes)
{
  json_object *v = NULL;
  const char *text = "";
  size_t len = 0;
  if (json_object_object_get_ex(obj, key, &v)) {
    if (!json_object_is_type(v, json_type_string))
      return -EINVAL;
    text = json_object_get_string(v);
    len = (size_t)json_object_get_string_len(v);
  }
  if (len / 4 * 3 > max_bytes + 2)
    return -EFBIG;
  unsigned char *buf = NULL;
  size_t n = 0;
  int r = eph_base64_decode(text, len, &buf, &n);
  if (r < 0)
    return r;
  if (n > max_bytes) {
    free(buf);
    return -EFBIG;
  }
  *out = buf;
  *bytes = n;
  return 0;
}

/* ---------------------------------------------------------------- frames */

/* Writes obj as one frame to fd, looping over short writes and EINTR (fd may be blocking;
 * a non-blocking fd is waited on with poll). Returns 0, -EMSGSIZE when the serialised
 * object passes the frame limit (nothing written), or -errno of the failed write (EPIPE:
 * peer gone). The caller serialises concurrent writers. */
static inline int
eph_proto_write_frame(int fd, json_object *obj)
{
  size_t len = 0;
  const char *text = json_object_to_json_string_length(obj, EPH_PROTO_JSON_FLAGS, &len);
  if (!text)
    return -ENOMEM;
  if (len == 0 || len > EPH_PROTO_MAX_FRAME_BYTES)
    return -EMSGSIZE;
  unsigned char hdr[4] = {(unsigned char)(len >> 24), (unsigned char)(len >> 16),
                          (unsigned char)(len >> 8), (unsigned char)len};
  /* Header and body in one writev(): the reader is woken once per frame, not once for the
   * header and again for the body (two context switches each way on a busy host). */
  struct iovec iov[2] = {{.iov_base = hdr, .iov_len = 4},
                         {.iov_base = (void *)text, .iov_len = len}};
  struct iovec *v = iov;
  int nv = 2;
  while (nv > 0) {
    ssize_t w = writev(fd, v, nv);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        (void)poll(&p, 1, -1);
        continue;
      }
      return -errno;
    }
    size_t done = (size_t)w;
    while (nv > 0 && done >= v->iov_len) {
      done -= v->iov_len;
      v++;
      nv--;
    }
    if (nv > 0) {
      v->iov_base = (char *)v->iov_base + done;
      v->iov_len -= done;
    }
  }
  return 0;
}

/* Parses one frame body of len bytes (len <= EPH_PROTO_MAX_FRAME_BYTES) as exactly one JSON
 * object with nothing after it but blanks. Returns 1 with *out set (owned by the caller,
 * json_object_put()), -EPROTO with why (>= 1 byte) saying what was wrong, or -ENOMEM. The
 * reader's last step, callable on its own (the guest client's reply handling and its fuzz
 * target feed frame bytes through it without a stream). */
static inline int
eph_proto_parse_body(const char *body, size_t len, json_object **out, char *why, size_t why_size)
{
  *out = NULL;
  if (len == 0 || len > EPH_PROTO_MAX_FRAME_BYTES) {
    snprintf(why, why_size, "frame length %zu outside 1..%u", len, EPH_PROTO_MAX_FRAME_BYTES);
    return -EPROTO;
  }
  json_object *obj = NULL;
  eph_json_fault_t fault;
  int r = eph_json_parse_one(body, len, 0, &obj, &fault);
  if (r == -ENOMEM)
    return r;
  if (r < 0 && !fault.trailing) {
    snprintf(why, why_size, "frame is not JSON: %s", fault.truncated ? "truncated" : fault.desc);
    return -EPROTO;
  }
  if (r < 0 || !json_object_is_type(obj, json_type_object)) {
    json_object_put(obj);
    snprintf(why, why_size, "frame is not exactly one JSON object");
    return -EPROTO;
  }
  *out = obj;
  return 1;
}

/* Incremental frame reader: feed it whenever fd is readable; it never blocks beyond one
 * read() and never holds more than one frame. Zero-initialise before use; release with
 * eph_frame_reader_clear(). */
typedef struct eph_frame_reader {
  unsigned char hdr[4];
  size_t hdr_got;
  char *body; /* EPH_PROTO_MAX_FRAME_BYTES + 1 once a header arrived */
  size_t body_len, body_got;
  bool not_socket; /* fd is no socket (a virtio port): the body waits for the next poll */
  char why[160];   /* after -EPROTO / -EMSGSIZE: what was wrong */
} eph_frame_reader_t;

static inline void
eph_frame_reader_clear(eph_frame_reader_t *r)
{
  free(r->body);
  memset(r, 0, sizeof *r);
}

/* Does one read() on fd (call it when poll() says readable; a blocking fd then does not
 * block), and after a whole header one recv(MSG_DONTWAIT) of the body on a socket. Returns 1 with
 * *out set (a JSON object, owned by the caller, json_object_put()) when a frame completed, 0 when
 * more bytes are needed, -EPIPE at end of stream (-EPROTO if it ended inside a frame), -EMSGSIZE
 * for a length of 0 or over the limit, -EPROTO for a body that is not exactly one JSON object
 * (r->why says which), -ENOMEM, or the -errno of read(). After any negative return the stream is
 * out of step: end the session. */
static inline int
eph_frame_reader_feed(eph_frame_reader_t *r, int fd, json_object **out)
{
  *out = NULL;
  ssize_t n;
  if (r->hdr_got < 4) {
    n = read(fd, r->hdr + r->hdr_got, 4 - r->hdr_got);
  } else {
    n = read(fd, r->body + r->body_got, r->body_len - r->body_got);
  }
  if (n < 0)
    return errno == EINTR || errno == EAGAIN ? 0 : -errno;
  if (n == 0) {
    if (r->hdr_got == 0)
      return -EPIPE;
    snprintf(r->why, sizeof r->why, "stream ended inside a frame");
    return -EPROTO;
  }
  if (r->hdr_got < 4) {
    r->hdr_got += (size_t)n;
    if (r->hdr_got < 4)
      return 0;
    uint32_t len = (uint32_t)r->hdr[0] << 24 | (uint32_t)r->hdr[1] << 16 |
                   (uint32_t)r->hdr[2] << 8 | r->hdr[3];
    if (len == 0 || len > EPH_PROTO_MAX_FRAME_BYTES) {
      snprintf(r->why, sizeof r->why, "frame length %u outside 1..%u", len,
               EPH_PROTO_MAX_FRAME_BYTES);
      return -EMSGSIZE;
    }
    if (!r->body && !(r->body = malloc(EPH_PROTO_MAX_FRAME_BYTES + 1)))
      return -ENOMEM;
    r->body_len = len;
    r->body_got = 0;
    /* The body was usually written with the header (one writev): take what is there now
     * without waiting (MSG_DONTWAIT, whether fd blocks or not), sparing a poll. Nothing
     * yet, an error or the end of the stream: the next feed, after poll, sees it. */
    if (r->not_socket)
      return 0;
    n = recv(fd, r->body, r->body_len, MSG_DONTWAIT);
    if (n < 0 && errno == ENOTSOCK)
      r->not_socket = true;
    if (n <= 0)
      return 0;
  }
  r->body_got += (size_t)n;
  if (r->body_got < r->body_len)
    return 0;
  /* A whole frame: parse it as exactly one JSON object, nothing after it. */
  r->hdr_got = 0;
  return eph_proto_parse_body(r->body, r->body_len, out, r->why, sizeof r->why);
}

/* ---------------------------------------------------------------- field helpers */

/* The integer member key of obj into *out; returns false when absent or not an integer. */
static inline bool
eph_proto_int(json_object *obj, const char *key, int64_t *out)
{
  json_object *v;
  if (!json_object_object_get_ex(obj, key, &v) || !json_object_is_type(v, json_type_int))
    return false;
  *out = json_object_get_int64(v);
  return true;
}

#endif
