#include <config.h>

#include "paths.h"

#include <errno.h>
#include <limits.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

/* Compiled-in install locations; EPH_PREFIX is what they are rebased from when the tree was
 * copied elsewhere (DESTDIR staging, relocated prefix). */
#ifndef EPH_PREFIX
#define EPH_PREFIX "/usr/local"
#endif

static char *
dirname_dup(const char *path)
{
  char *d = eph_xstrdup(path);
  char *slash = strrchr(d, '/');
  if (slash && slash != d)
    *slash = '\0';
  else if (slash)
    slash[1] = '\0';
  return d;
}

/* Where a compiled-in install path is for the copy we run from. `root` non-NULL: a DESTDIR
 * staging copy (the running prefix is root + EPH_PREFIX), so every absolute install path,
 * under the prefix or not (--sysconfdir=/etc, --localstatedir=/var), is root + path: a
 * staged binary never reads the host's /etc/ephemeral or writes its /var/lib/ephemeral.
 * Else `actual_prefix` non-NULL: a relocated prefix; only paths under the prefix move. */
static char *
rebase(const char *compiled, const char *root, const char *actual_prefix)
{
  if (root)
    return eph_xasprintf("%s%s", root, compiled);
  size_t n = strlen(EPH_PREFIX);
  if (actual_prefix && strncmp(compiled, EPH_PREFIX, n) == 0 &&
      (compiled[n] == '/' || compiled[n] == '\0'))
    return eph_xasprintf("%s%s", actual_prefix, compiled + n);
  return eph_xstrdup(compiled);
}

/* The DESTDIR of a staging copy: actual_prefix = ROOT + EPH_PREFIX with ROOT a non-empty
 * absolute path; NULL when we run from the compiled prefix or a relocated one. */
static char *
staging_root(const char *actual_prefix)
{
  size_t n = strlen(EPH_PREFIX), an = strlen(actual_prefix);
  if (strcmp(EPH_PREFIX, "/") == 0 || n == 0 || an <= n ||
      strcmp(actual_prefix + an - n, EPH_PREFIX) != 0 || actual_prefix[0] != '/')
    return NULL;
  return eph_xstrndup(actual_prefix, an - n);
}

/* eph_paths_init for a given executable path (tests/test-paths.c calls it directly). */
static void
paths_init_exe(eph_paths_t *p, const char *exe)
{
  memset(p, 0, sizeof *p);
  p->exe = eph_xstrdup(exe);
  char *exe_dir = dirname_dup(exe);

  char build_real[PATH_MAX];
  const char *builddir = realpath(EPH_BUILDDIR, build_real) ? build_real : EPH_BUILDDIR;
  size_t bl = strlen(builddir);
  /* The build tree: the CLI sits in the top build dir, tests and benchmarks below it. */
  if (strncmp(exe_dir, builddir, bl) == 0 && (exe_dir[bl] == '\0' || exe_dir[bl] == '/')) {
    p->build_tree = true;
    p->config_file = eph_xasprintf("%s/ephemeral.conf", EPH_SRCDIR);
    p->confd_dir = eph_xasprintf("%s/conf.d", EPH_SRCDIR);
    p->plugin_dir = eph_xasprintf("%s/plugins/.libs", builddir);
    p->libexec_dir = eph_xasprintf("%s/guest", builddir);
    p->data_dir = eph_xstrdup(EPH_SRCDIR);
    p->src_dir = eph_xstrdup(EPH_SRCDIR);
  } else {
    /* Installed: <prefix>/bin/ephemeral or <prefix>/sbin/ephemerald. */
    char *prefix = NULL;
    size_t el = strlen(exe_dir);
    if (el >= 4 && strcmp(exe_dir + el - 4, "/bin") == 0)
      prefix = eph_xstrndup(exe_dir, el - 4);
    else if (el >= 5 && strcmp(exe_dir + el - 5, "/sbin") == 0)
      prefix = eph_xstrndup(exe_dir, el - 5);
    if (prefix && prefix[0] == '\0') {
      free(prefix);
      prefix = eph_xstrdup("");
    }
    p->root = prefix ? staging_root(prefix) : NULL;
    p->config_file = rebase(EPH_CONFDIR "/ephemeral.conf", p->root, prefix);
    p->confd_dir = rebase(EPH_CONFDIR "/conf.d", p->root, prefix);
    p->plugin_dir = rebase(EPH_PLUGINDIR, p->root, prefix);
    p->libexec_dir = rebase(EPH_LIBEXECDIR, p->root, prefix);
    p->data_dir = rebase(EPH_DATADIR, p->root, prefix);
    p->state_dir = rebase(EPH_LOCALSTATEDIR "/lib/ephemeral", p->root, NULL);
    free(prefix);
  }
  free(exe_dir);
}

int
eph_paths_init(eph_paths_t *p)
{
  memset(p, 0, sizeof *p);
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n < 0)
    return -errno;
  exe[n] = '\0';
  paths_init_exe(p, exe);
  return 0;
}

void
eph_paths_free(eph_paths_t *p)
{
  free(p->exe);
  free(p->config_file);
  free(p->confd_dir);
  free(p->plugin_dir);
  free(p->libexec_dir);
  free(p->data_dir);
  free(p->src_dir);
  free(p->root);
  free(p->state_dir);
  memset(p, 0, sizeof *p);
}

char *
eph_paths_default_state_dir(const eph_paths_t *p, bool daemon)
{
  const char *env = getenv("EPHEMERAL_STATE_DIR");
  if (env && *env)
    return eph_xstrdup(env);
  if (daemon)
    return eph_xstrdup(p && p->state_dir ? p->state_dir : EPH_LOCALSTATEDIR "/lib/ephemeral");
  const char *xdg = getenv("XDG_STATE_HOME");
  if (xdg && *xdg == '/')
    return eph_xasprintf("%s/ephemeral", xdg);
  const char *home = getenv("HOME");
  if (!home || !*home) {
    struct passwd *pw = getpwuid(getuid());
    home = pw ? pw->pw_dir : "/tmp";
  }
  return eph_xasprintf("%s/.local/state/ephemeral", home);
}
