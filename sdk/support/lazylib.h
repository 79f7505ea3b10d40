/* A shared library bound on first use instead of at start-up (sdk/support/README.md).
 *
 * Why: every library in a program's DT_NEEDED is mapped, relocated and initialised before
 * main(), whether the command uses it or not. libcurl and libpq each pull about thirty
 * libraries (GnuTLS, Kerberos, LDAP, SASL, ...) whose loading cost `ephemeral exec -- true`
 * ~3 ms of its ~12 ms, for code that only a web fetch, the egress proxy or a PostgreSQL
 * store ever runs. The users (curl_api.h, core/pq_api.h) name the library by its soname
 * and the functions they call; the first call of eph_lazylib_load() dlopen()s it and
 * resolves every name, later calls return at once. A library or symbol that cannot be
 * found is an error naming it, returned by every later call too (never a crash). */
#ifndef EPH_SUPPORT_LAZYLIB_H
#define EPH_SUPPORT_LAZYLIB_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include <ephemeral/plugin.h>

typedef struct eph_lazylib {
  const char *soname;       /* e.g. "libcurl.so.4": the runtime package's soname */
  const char *const *names; /* `count` function names, resolved into `slots` in order */
  void **slots;             /* `count` entries, filled by the first load */
  size_t count;
  /* Optional: called once, under the lock, after every name resolved, before any caller
   * sees the library ready (copies the slots into a typed table). */
  void (*bind)(void *const *slots);
  /* Private: initialise with EPH_LAZYLIB_INIT. */
  pthread_mutex_t lock;
  atomic_bool ready;
  bool tried;
  char error[256];
} eph_lazylib_t;

#define EPH_LAZYLIB_INIT(so, n, s, c, b)                                                           \
  {                                                                                                \
    .soname = (so), .names = (n), .slots = (s), .count = (c), .bind = (b),                         \
    .lock = PTHREAD_MUTEX_INITIALIZER                                                              \
  }

/* 0 once the library is loaded and every name resolved (thread-safe; the handle is kept
 * for the process's life); else -ELIBACC with "<soname>: <dlerror>" in err. */
int eph_lazylib_load(eph_lazylib_t *lib, eph_error_t *err);

#endif
