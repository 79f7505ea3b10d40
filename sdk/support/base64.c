/* Base64 through OpenSSL (EVP_EncodeBlock/EVP_DecodeBlock): see base64.h. OpenSSL's block
 * decoder accepts blanks and counts padding as zero bytes, so the strictness RFC 4648
 * section 3.3 asks of a decoder that must not hide data is checked here first. */
#include "base64.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include <openssl/evp.h>

int
eph_base64_decode(const char *in, size_t in_bytes, unsigned char **out, size_t *out_bytes)
{
  if (in_bytes % 4 != 0 || in_bytes > (size_t)INT32_MAX)
    return -EINVAL;
  for (size_t i = 0; i < in_bytes; i++) {
    char c = in[i];
    bool alpha = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                 c == '+' || c == '/';
    /* '=' only as the last one or two characters. */
    if (!alpha && !(c == '=' && i >= in_bytes - 2 && (i == in_bytes - 1 || in[i + 1] == '=')))
      return -EINVAL;
  }
  unsigned char *buf = malloc(in_bytes / 4 * 3 + 1);
  if (!buf)
    return -ENOMEM;
  int n = in_bytes ? EVP_DecodeBlock(buf, (const unsigned char *)in, (int)in_bytes) : 0;
  if (n < 0) {
    free(buf);
    return -EINVAL;
  }
  /* EVP_DecodeBlock counts the padding as zero bytes. */
  if (in_bytes >= 1 && in[in_bytes - 1] == '=')
    n--;
  if (in_bytes >= 2 && in[in_bytes - 2] == '=')
    n--;
  buf[n] = 0;
  *out = buf;
  *out_bytes = (size_t)n;
  return 0;
}

char *
eph_base64_encode(const void *in, size_t in_bytes)
{
  if (in_bytes > (size_t)INT32_MAX / 4 * 3)
    return NULL;
  char *out = malloc(4 * ((in_bytes + 2) / 3) + 1);
  if (!out)
    return NULL;
  int n = EVP_EncodeBlock((unsigned char *)out, in, (int)in_bytes);
  out[n] = '\0';
  return out;
}
