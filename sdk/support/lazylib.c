/* A shared library bound on first use; see lazylib.h for the why. */
#include "config.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>

#include "lazylib.h"

int
eph_lazylib_load(eph_lazylib_t *lib, eph_error_t *err)
{
  if (atomic_load_explicit(&lib->ready, memory_order_acquire))
    return 0;
  pthread_mutex_lock(&lib->lock);
  if (!lib->tried) {
    lib->tried = true;
    void *h = dlopen(lib->soname, RTLD_NOW | RTLD_LOCAL);
    if (!h)
      snprintf(lib->error, sizeof lib->error, "%s", dlerror());
    for (size_t i = 0; h && i < lib->count; i++) {
      dlerror();
      lib->slots[i] = dlsym(h, lib->names[i]);
      if (!lib->slots[i]) {
        snprintf(lib->error, sizeof lib->error, "%s: no symbol %s", lib->soname, lib->names[i]);
        h = NULL; /* the handle stays open: a partly bound table is never used */
      }
    }
    if (h && lib->bind)
      lib->bind(lib->slots);
    if (h)
      atomic_store_explicit(&lib->ready, true, memory_order_release);
  }
  bool ok = atomic_load_explicit(&lib->ready, memory_order_acquire);
  pthread_mutex_unlock(&lib->lock);
  if (ok)
    return 0;
  return eph_error_set(err, ELIBACC, "loading %s: %s", lib->soname, lib->error);
}
