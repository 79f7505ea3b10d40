/* Base64 (RFC 4648 section 4: standard alphabet, padded) through OpenSSL's codec: the one
 * codec of the tree (sdk/support/README.md). The core, the plugins and the guest protocol
 * (guest/protocol.h, which compiles base64.c into the static guest) all use it.
 *
 * Decoding is strict, as RFC 4648 section 3.3/3.5 allow a decoder that must not hide data
 * to be: a length that is not a multiple of 4, a character outside the alphabet (blanks
 * and line breaks included), misplaced padding and non-zero pad bits (a non-canonical
 * text: "QR==" for "QQ==") are all refused. No caller needs a lenient or URL-safe decoder:
 * every base64 text the tree reads comes from a JSON field defined as standard padded
 * base64 (request files, tool-file's content, the guest's frames). */
#ifndef EPH_SUPPORT_BASE64_H
#define EPH_SUPPORT_BASE64_H

#include <stddef.h>
#include <sys/types.h>

/* Bytes of the padded base64 text for in_bytes raw bytes (without the NUL). */
static inline size_t
eph_base64_encoded_bytes(size_t in_bytes)
{
  return (in_bytes + 2) / 3 * 4;
}

/* Decodes in_bytes of strict base64 (above). *out is heap memory owned by the caller
 * (NUL-terminated for convenience; *out_bytes excludes the NUL). Returns 0, -EINVAL on
 * invalid input, -ENOMEM, -ELIBACC when libcrypto cannot be loaded (crypto_api.h). */
int eph_base64_decode(const char *in, size_t in_bytes, unsigned char **out, size_t *out_bytes);

/* The same into a caller's buffer of out_size bytes, which must hold in_bytes / 4 * 3
 * (else -ENOBUFS). Returns the decoded byte count, -EINVAL or -ELIBACC. */
ssize_t eph_base64_decode_into(const char *in, size_t in_bytes, void *out, size_t out_size);

/* Encodes in_bytes; returns a NUL-terminated heap string owned by the caller (of
 * eph_base64_encoded_bytes(in_bytes) characters), or NULL when out of memory or in_bytes
 * is over 1.5 GiB (OpenSSL's int lengths) or libcrypto cannot be loaded. */
char *eph_base64_encode(const void *in, size_t in_bytes);

#endif
