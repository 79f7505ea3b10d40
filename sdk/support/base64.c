/* Base64 through OpenSSL (EVP_EncodeBlock/EVP_DecodeBlock): see base64.h. OpenSSL's block
 * decoder accepts blanks, ignores the pad bits and counts padding as zero bytes, so the
 * strictness RFC 4648 section 3.3 asks of a decoder that must not hide data is checked
 * here first. */
#include "base64.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crypto_api.h"

/* Index of c in the standard alphabet, or -1. */
static int
alphabet_index(char c)
{
  if (c >= 'A' && c <= 'Z')
    return c - 'A';
  if (c >= 'a' && c <= 'z')
    return c - 'a' + 26;
  if (c >= '0' && c <= '9')
    return c - '0' + 52;
  return c == '+' ? 62 : c == '/' ? 63 : -1;
}

ssize_t
eph_base64_decode_into(const char *in, size_t in_bytes, void *out, size_t out_size)
{
  if (in_bytes % 4 != 0 || in_bytes > (size_t)INT32_MAX)
    return -EINVAL;
  if (out_size < in_bytes / 4 * 3)
    return -ENOBUFS;
  size_t pad = 0;
  for (size_t i = 0; i < in_bytes; i++) {
    /* '=' only as the last one or two characters. */
    if (in[i] == '=' && i + 2 >= in_bytes && (i + 1 == in_bytes || in[i + 1] == '='))
      pad++;
    else if (alphabet_index(in[i]) < 0)
      return -EINVAL;
  }
  /* Canonical: the bits the padding leaves unused in the last character are zero. */
  if (pad && (alphabet_index(in[in_bytes - pad - 1]) & (pad == 1 ? 0x3 : 0xf)) != 0)
    return -EINVAL;
  if (in_bytes == 0)
    return 0;
  if (eph_crypto_load(NULL) < 0)
    return -ELIBACC;
  int n = EVP_DecodeBlock(out, (const unsigned char *)in, (int)in_bytes);
  if (n < 0)
    return -EINVAL;
  return (ssize_t)n - (ssize_t)pad; /* EVP_DecodeBlock counts the padding as zero bytes */
}

int
eph_base64_decode(const char *in, size_t in_bytes, unsigned char **out, size_t *out_bytes)
{
  if (in_bytes % 4 != 0 || in_bytes > (size_t)INT32_MAX)
    return -EINVAL;
  size_t size = in_bytes / 4 * 3;
  unsigned char *buf = malloc(size + 1);
  if (!buf)
    return -ENOMEM;
  ssize_t n = eph_base64_decode_into(in, in_bytes, buf, size);
  if (n < 0) {
    free(buf);
    return (int)n;
  }
  buf[n] = 0;
  *out = buf;
  *out_bytes = (size_t)n;
  return 0;
}

char *
eph_base64_encode(const void *in, size_t in_bytes)
{
  if (in_bytes > (size_t)INT32_MAX / 4 * 3 || eph_crypto_load(NULL) < 0)
    return NULL;
  char *out = malloc(eph_base64_encoded_bytes(in_bytes) + 1);
  if (!out)
    return NULL;
  int n = EVP_EncodeBlock((unsigned char *)out, in, (int)in_bytes);
  out[n] = '\0';
  return out;
}
