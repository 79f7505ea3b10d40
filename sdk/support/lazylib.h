/* A shared library bound on first use instead of at start-up (sdk/support/README.md).
 *
 * Why: every library in a program's DT_NEEDED is mapped, relocated and initialised before
 * main(), whether the command uses it or not. libcurl and libpq each pull about thirty
 * libraries (GnuTLS, Kerberos, LDAP, SASL, ...) whose loading cost `ephemeral exec -- true`
 * ~3 ms of its ~12 ms, for code that only a web fetch, the egress proxy or a PostgreSQL
 * store ever runs. The users (curl_api.h, core/pq_api.h) name the library by its soname
 * and the functions they call; the first call of eph_lazylib_load() dlopen()s it and
 * resolves every name, later calls return at once. A library or symbol that cannot be
 * found is an error naming it, returned by every later call too (never a crash).
 *
 * The soname is the one configure read from the library the linker picks (EPH_SONAME_* in
 * config.h, m4/eph.m4's EPH_SONAME), so a distribution's soname bump is followed at the
 * next build instead of failing at run time.
 *
 * One library's table, in three parts (curl_api.h/.c is the model):
 *   header:  #define EPH_FOO_FUNCTIONS(X) X(foo_open) X(foo_close) ...
 *            EPH_LAZYLIB_API(eph_foo_api_t, EPH_FOO_FUNCTIONS)
 *            extern eph_foo_api_t eph_foo_api; int eph_foo_load(eph_error_t *err);
 *            then, unless the implementation file is including it, one
 *            `#define foo_open (eph_foo_api.foo_open)` per function, so calls keep their
 *            names and their types (the field types are taken from the library's header);
 *   source:  EPH_LAZYLIB_DEFINE(eph_foo_api, eph_foo_load, EPH_SONAME_FOO, EPH_FOO_FUNCTIONS)
 *   callers: every entry point that starts work with the library calls eph_foo_load() first
 *            and fails with its error; a call through the table before a successful load
 *            is a bug (NULL pointer). A program that also links the library itself may
 *            mix direct calls and table calls: dlopen() returns the copy already mapped. */
#ifndef EPH_SUPPORT_LAZYLIB_H
#define EPH_SUPPORT_LAZYLIB_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include <ephemeral/plugin.h>

typedef struct eph_lazylib {
  const char *soname;       /* e.g. "libcurl.so.4" (EPH_SONAME_CURL): the runtime's soname */
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

/* The table type of FUNCTIONS(X): one pointer per function, typed as the library declares it. */
#define EPH_LAZYLIB_FIELD(f) __typeof__(f) *f;
#define EPH_LAZYLIB_API(api_t, FUNCTIONS)                                                          \
  typedef struct {                                                                                 \
    FUNCTIONS(EPH_LAZYLIB_FIELD)                                                                   \
  } api_t

/* Defines the table `api` (declared extern in the header) and `int load(eph_error_t *)`
 * that binds it from `soname` on its first call (eph_lazylib_load). Needs <string.h>. */
#define EPH_LAZYLIB_NAME(f) #f,
#define EPH_LAZYLIB_DEFINE(api, load, soname, FUNCTIONS)                                           \
  __typeof__(api) api;                                                                             \
  static const char *const api##_names[] = {FUNCTIONS(EPH_LAZYLIB_NAME)};                          \
  static void *api##_slots[sizeof api##_names / sizeof api##_names[0]];                            \
  _Static_assert(sizeof api == sizeof api##_slots, "one function pointer per name");               \
  static void api##_bind(void *const *slots)                                                       \
  {                                                                                                \
    memcpy(&api, slots, sizeof api);                                                               \
  }                                                                                                \
  static eph_lazylib_t api##_lib = EPH_LAZYLIB_INIT(                                               \
      soname, api##_names, api##_slots, sizeof api##_names / sizeof api##_names[0], api##_bind);   \
  int load(eph_error_t *err)                                                                       \
  {                                                                                                \
    return eph_lazylib_load(&api##_lib, err);                                                      \
  }

#endif
