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

/* Rebases an install path from the compiled prefix onto the prefix we actually run from. */
static char *
rebase(const char *compiled, const char *actual_prefix)
{
  size_t n = strlen(EPH_PREFIX);
  if (actual_prefix && strncmp(compiled, EPH_PREFIX, n) == 0 &&
      (compiled[n] == '/' || compiled[n] == '\0'))
    return eph_xasprintf("%s%s", actual_prefix, compiled + n);
  return eph_xstrdup(compiled);
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
    p->config_file = rebase(EPH_CONFDIR "/ephemeral.conf", prefix);
    p->confd_dir = rebase(EPH_CONFDIR "/conf.d", prefix);
    p->plugin_dir = rebase(EPH_PLUGINDIR, prefix);
    p->libexec_dir = rebase(EPH_LIBEXECDIR, prefix);
    p->data_dir = rebase(EPH_DATADIR, prefix);
    free(prefix);
  }
  free(exe_dir);
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
  memset(p, 0, sizeof *p);
}

char *
eph_paths_default_state_dir(bool daemon)
{
  const char *env = getenv("EPHEMERAL_STATE_DIR");
  if (env && *env)
    return eph_xstrdup(env);
  if (daemon)
    return eph_xstrdup(EPH_LOCALSTATEDIR "/lib/ephemeral");
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
