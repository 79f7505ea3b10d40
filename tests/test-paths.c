/* Where an installed binary looks for its files, for a build configured the way Debian
 * configures it (--prefix=/usr --sysconfdir=/etc --localstatedir=/var): installed, staged
 * under a DESTDIR (the package build runs the staged copy in its tests), relocated. A staged
 * copy must never read the host's /etc/ephemeral nor default to its /var/lib/ephemeral.
 * paths.c is compiled into this test with those install locations. */
#include <config.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#undef EPH_PREFIX
#undef EPH_PLUGINDIR
#undef EPH_CONFDIR
#undef EPH_DATADIR
#undef EPH_LIBEXECDIR
#undef EPH_LOCALSTATEDIR
#undef EPH_BUILDDIR
#undef EPH_SRCDIR
#define EPH_PREFIX "/usr"
#define EPH_PLUGINDIR "/usr/lib/x86_64-linux-gnu/ephemeral/plugins"
#define EPH_CONFDIR "/etc/ephemeral"
#define EPH_DATADIR "/usr/share/ephemeral"
#define EPH_LIBEXECDIR "/usr/libexec/ephemeral"
#define EPH_LOCALSTATEDIR "/var"
#define EPH_BUILDDIR "/nonexistent/eph-build"
#define EPH_SRCDIR "/nonexistent/eph-src"
#include "../core/paths.c"

static void
expect(const char *exe, const char *conf, const char *confd, const char *plugins,
       const char *libexec, const char *state)
{
  eph_paths_t p;
  paths_init_exe(&p, exe);
  assert_false(p.build_tree);
  assert_string_equal(p.config_file, conf);
  assert_string_equal(p.confd_dir, confd);
  assert_string_equal(p.plugin_dir, plugins);
  assert_string_equal(p.libexec_dir, libexec);
  char *s = eph_paths_default_state_dir(&p, true);
  assert_string_equal(s, state);
  free(s);
  eph_paths_free(&p);
}

static void
test_installed(void **state)
{
  (void)state;
  expect("/usr/bin/ephemeral", "/etc/ephemeral/ephemeral.conf", "/etc/ephemeral/conf.d",
         "/usr/lib/x86_64-linux-gnu/ephemeral/plugins", "/usr/libexec/ephemeral",
         "/var/lib/ephemeral");
  expect("/usr/sbin/ephemerald", "/etc/ephemeral/ephemeral.conf", "/etc/ephemeral/conf.d",
         "/usr/lib/x86_64-linux-gnu/ephemeral/plugins", "/usr/libexec/ephemeral",
         "/var/lib/ephemeral");
}

/* make install DESTDIR=/tmp/d (debian/tmp, tests/install.test): /etc and /var move too. */
static void
test_staged_under_destdir(void **state)
{
  (void)state;
  expect("/tmp/d/usr/bin/ephemeral", "/tmp/d/etc/ephemeral/ephemeral.conf",
         "/tmp/d/etc/ephemeral/conf.d", "/tmp/d/usr/lib/x86_64-linux-gnu/ephemeral/plugins",
         "/tmp/d/usr/libexec/ephemeral", "/tmp/d/var/lib/ephemeral");
  expect("/build/pkg/debian/tmp/usr/sbin/ephemerald",
         "/build/pkg/debian/tmp/etc/ephemeral/ephemeral.conf",
         "/build/pkg/debian/tmp/etc/ephemeral/conf.d",
         "/build/pkg/debian/tmp/usr/lib/x86_64-linux-gnu/ephemeral/plugins",
         "/build/pkg/debian/tmp/usr/libexec/ephemeral", "/build/pkg/debian/tmp/var/lib/ephemeral");
}

/* Copied to another prefix: what was under the prefix follows it; /etc and /var cannot be
 * guessed and stay (a missing conf.d there is then an error, not a fallback). */
static void
test_relocated(void **state)
{
  (void)state;
  expect("/opt/eph/bin/ephemeral", "/etc/ephemeral/ephemeral.conf", "/etc/ephemeral/conf.d",
         "/opt/eph/lib/x86_64-linux-gnu/ephemeral/plugins", "/opt/eph/libexec/ephemeral",
         "/var/lib/ephemeral");
}

int
main(void)
{
  unsetenv("EPHEMERAL_STATE_DIR");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_installed),
      cmocka_unit_test(test_staged_under_destdir),
      cmocka_unit_test(test_relocated),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
