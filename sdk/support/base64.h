/* Base64 (RFC 4648 section 4: standard alphabet, padded) through OpenSSL's codec; the one
 * codec of the tree (sdk/support/README.md). */
#ifndef EPH_SUPPORT_BASE64_H
#define EPH_SUPPORT_BASE64_H

#include <stddef.h>

/* Decodes in_bytes of strict base64: length a multiple of 4, only the standard alphabet,
 * '=' only as the last one or two characters. *out is heap memory owned by the caller
 * (NUL-terminated for convenience; *out_bytes excludes the NUL). Returns 0, -EINVAL on
 * invalid input, -ENOMEM. */
int eph_base64_decode(const char *in, size_t in_bytes, unsigned char **out, size_t *out_bytes);

/* Encodes in_bytes; returns a NUL-terminated heap string owned by the caller, or NULL when
 * out of memory or in_bytes is over 1.5 GiB (OpenSSL's int lengths). */
char *eph_base64_encode(const void *in, size_t in_bytes);

#endif
