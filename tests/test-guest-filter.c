/* The guest installs the workers' seccomp filter as guest/gen-filter generated it when the
 * guest was built (guest/guest-filter.h), not as libseccomp would compile guest/filter.c's
 * rules at start-up: the two must be the same program, instruction for instruction, or
 * the sandbox would run under rules nobody wrote. Checked here, on the machine (libseccomp,
 * architecture) the tests run on; the filter's effect is tested by attacks in
 * tests/hostile-jail.test and tests/sandbox.test. */
#include <config.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "guest.h"

#include "guest/guest-filter.h"

static void
test_prebuilt_filter_is_libseccomps(void **state)
{
  guest_filter_t f;
  char why[256] = "";
  if (guest_seccomp_generate(&f, why, sizeof why) < 0)
    fail_msg("%s", why);
  size_t n = sizeof guest_prebuilt_filter / sizeof guest_prebuilt_filter[0];
  assert_int_equal(f.prog.len, n);
  for (size_t i = 0; i < n; i++) {
    const struct sock_filter *a = &guest_prebuilt_filter[i], *b = &f.prog.filter[i];
    if (a->code != b->code || a->jt != b->jt || a->jf != b->jf || a->k != b->k)
      fail_msg("instruction %zu: generated {0x%04x, %u, %u, 0x%08x}, libseccomp now "
               "{0x%04x, %u, %u, 0x%08x}",
               i, a->code, a->jt, a->jf, a->k, b->code, b->jt, b->jf, b->k);
  }
  free(f.prog.filter);
  (void)state;
}

/* Not an empty or allow-all program: it ends in returns and denies something. */
static void
test_prebuilt_filter_denies(void **state)
{
  size_t n = sizeof guest_prebuilt_filter / sizeof guest_prebuilt_filter[0], errnos = 0;
  assert_true(n > 20);
  for (size_t i = 0; i < n; i++)
    if (guest_prebuilt_filter[i].code == (BPF_RET | BPF_K) &&
        (guest_prebuilt_filter[i].k & SECCOMP_RET_ACTION_FULL) == SECCOMP_RET_ERRNO)
      errnos++;
  assert_true(errnos >= 3); /* EPERM, EAFNOSUPPORT, EPROTONOSUPPORT, ENOSYS */
  (void)state;
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_prebuilt_filter_is_libseccomps),
      cmocka_unit_test(test_prebuilt_filter_denies),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
