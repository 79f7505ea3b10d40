/* Scope-bound release, as in systemd/crun: `cleanup_free char *p = ...;` frees p when it
 * goes out of scope; steal_pointer() hands ownership on and leaves NULL behind. Header
 * only; shared by the core and every plugin (sdk/support/README.md). */
#ifndef EPH_SUPPORT_CLEANUP_H
#define EPH_SUPPORT_CLEANUP_H

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <json-c/json.h>

static inline void
eph_freep(void *p)
{
  free(*(void **)p);
}
static inline void
eph_closep(int *fd)
{
  if (*fd >= 0)
    close(*fd);
}
static inline void
eph_json_putp(json_object **o)
{
  if (*o)
    json_object_put(*o);
}
/* Frees a NUL-terminated secret (a key, a credential, a header carrying one) after
 * overwriting it, so no copy lingers in freed memory. NULL is a no-op. */
static inline void
eph_free_secret(char *s)
{
  if (!s)
    return;
  explicit_bzero(s, strlen(s));
  free(s);
}
#define cleanup_free __attribute__((cleanup(eph_freep)))
#define cleanup_close __attribute__((cleanup(eph_closep)))
#define cleanup_json __attribute__((cleanup(eph_json_putp)))
#define steal_pointer(pp)                                                                          \
  ({                                                                                               \
    __typeof__(*(pp)) _p = *(pp);                                                                  \
    *(pp) = NULL;                                                                                  \
    _p;                                                                                            \
  })
#define steal_fd(fdp)                                                                              \
  ({                                                                                               \
    int _fd = *(fdp);                                                                              \
    *(fdp) = -1;                                                                                   \
    _fd;                                                                                           \
  })

#endif
