/* Where things are: the same binary runs from the build tree (uninstalled: the tree's
 * plugins, conf.d, guest and data) and from an install under any --prefix, including a
 * DESTDIR staging copy (paths are rebased on the running executable's location). */
#ifndef EPH_PATHS_H
#define EPH_PATHS_H

#include <stdbool.h>

typedef struct eph_paths {
  bool build_tree;   /* running from the build tree */
  char *exe;         /* realpath of the running executable */
  char *config_file; /* ephemeral.conf */
  char *confd_dir;   /* conf.d */
  char *plugin_dir;  /* where <name>.so are looked up */
  char *libexec_dir; /* ephemeral-guest */
  char *data_dir;    /* playground, guest image sources, examples */
  char *src_dir;     /* source tree (build tree only), else NULL */
  char *root;        /* DESTDIR of a staging copy (exe is ROOT<prefix>/bin/...), else NULL */
  char *state_dir;   /* the daemon's default state directory (installed only), else NULL */
} eph_paths_t;

/* Fills p for the running executable. All strings owned by p; eph_paths_free() releases.
 * Returns 0 or -errno. */
int eph_paths_init(eph_paths_t *p);
void eph_paths_free(eph_paths_t *p);

/* The default state directory: $EPHEMERAL_STATE_DIR, else for the CLI
 * $XDG_STATE_HOME/ephemeral or ~/.local/state/ephemeral, for the daemon
 * <localstatedir>/lib/ephemeral (under p->root for a staging copy; p may be NULL). Heap
 * string owned by the caller. */
char *eph_paths_default_state_dir(const eph_paths_t *p, bool daemon);

#endif
