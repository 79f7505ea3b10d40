/* The libFuzzer entry points every tests/fuzz/fuzz-*.c target defines. Each target is built
 * twice: with clang's -fsanitize=fuzzer (configure --enable-fuzzers; tests/fuzz/run-fuzzers)
 * and, for `make check`, with replay-main.c, which runs the same function over the target's
 * seed corpus and crash regressions (tests/fuzz/corpus/<target>/) under the normal build. */
#ifndef EPH_FUZZ_H
#define EPH_FUZZ_H

#include <stddef.h>
#include <stdint.h>

/* One input: data/size are owned by the caller and valid for the call only. Returns 0. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Optional one-time set-up; a target defines it only when it needs it (weak here so the
 * replay driver can tell). */
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

#endif
