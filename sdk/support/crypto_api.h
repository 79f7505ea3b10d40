/* OpenSSL's libcrypto, bound on first use (lazylib.h): SHA-256 (API keys, idempotency
 * keys), base64 (base64.c) and the constant-time compare and cleanse of the store, so the
 * `ephemeral` CLI does not map and relocate libcrypto (4,200 symbol and 17,000 relative
 * relocations, the largest part of its start-up) at every start; `ephemeral exec` uses it
 * only to decode the first output its command writes.
 *
 * Include this instead of <openssl/crypto.h> and <openssl/evp.h>: the calls keep their
 * names (macros below) and their types. Entry points load first: base64.c's functions,
 * eph_sha256_hex, and the store's open (core/store.c), after which the store's code may
 * call any of them. A program that links libcrypto itself (ephemerald's webhook signing,
 * tool-connection, backend-qemu) may mix direct calls and these: dlopen() returns the
 * library already mapped.
 *
 * EPH_CRYPTO_LINKED (the static guest, which cannot dlopen): no table; the calls are
 * direct and eph_crypto_load() succeeds at once. */
#ifndef EPH_SUPPORT_CRYPTO_API_H
#define EPH_SUPPORT_CRYPTO_API_H

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <ephemeral/plugin.h>

#ifdef EPH_CRYPTO_LINKED
static inline int
eph_crypto_load(eph_error_t *err)
{
  (void)err;
  return 0;
}
#else
#include "lazylib.h"

#define EPH_CRYPTO_FUNCTIONS(X)                                                                    \
  X(CRYPTO_memcmp)                                                                                 \
  X(EVP_DecodeBlock)                                                                               \
  X(EVP_Digest)                                                                                    \
  X(EVP_EncodeBlock)                                                                               \
  X(EVP_sha256)                                                                                    \
  X(OPENSSL_cleanse)

EPH_LAZYLIB_API(eph_crypto_api_t, EPH_CRYPTO_FUNCTIONS);

/* Filled by the first successful eph_crypto_load(); read-only afterwards. */
extern eph_crypto_api_t eph_crypto_api;

/* 0 once libcrypto (EPH_SONAME_CRYPTO, e.g. libcrypto.so.3) is loaded and bound; else
 * -ELIBACC, err names why. */
int eph_crypto_load(eph_error_t *err);

#ifndef EPH_CRYPTO_API_IMPLEMENTATION
#define CRYPTO_memcmp (eph_crypto_api.CRYPTO_memcmp)
#define EVP_DecodeBlock (eph_crypto_api.EVP_DecodeBlock)
#define EVP_Digest (eph_crypto_api.EVP_Digest)
#define EVP_EncodeBlock (eph_crypto_api.EVP_EncodeBlock)
#define EVP_sha256 (eph_crypto_api.EVP_sha256)
#define OPENSSL_cleanse (eph_crypto_api.OPENSSL_cleanse)
#endif
#endif

#endif
