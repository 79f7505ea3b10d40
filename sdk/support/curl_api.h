/* libcurl, bound on first use (lazylib.h): the few functions sdk/support/net.c and the
 * core's egress proxy call, so a program linking them (the `ephemeral` CLI) does not load
 * libcurl and its ~30 libraries at start-up, only when a URL is parsed or fetched.
 *
 * Include this instead of <curl/curl.h> in a file that calls libcurl through the table:
 * the calls keep their names (macros below) and their types (taken from curl.h). Every
 * function that starts such work calls eph_curl_load() first and fails with its error;
 * calling a function of the table before a successful load is a bug (NULL pointer).
 * A plugin or program that links libcurl itself may mix direct calls and these: dlopen()
 * returns the library already mapped, so both reach one copy. */
#ifndef EPH_SUPPORT_CURL_API_H
#define EPH_SUPPORT_CURL_API_H

#define CURL_DISABLE_TYPECHECK 1
#include <curl/curl.h>

#include <ephemeral/plugin.h>

#include "lazylib.h"

#define EPH_CURL_FUNCTIONS(X)                                                                      \
  X(curl_easy_cleanup)                                                                             \
  X(curl_easy_getinfo)                                                                             \
  X(curl_easy_init)                                                                                \
  X(curl_easy_perform)                                                                             \
  X(curl_easy_setopt)                                                                              \
  X(curl_easy_strerror)                                                                            \
  X(curl_free)                                                                                     \
  X(curl_slist_append)                                                                             \
  X(curl_slist_free_all)                                                                           \
  X(curl_url)                                                                                      \
  X(curl_url_cleanup)                                                                              \
  X(curl_url_get)                                                                                  \
  X(curl_url_set)

EPH_LAZYLIB_API(eph_curl_api_t, EPH_CURL_FUNCTIONS);

/* Filled by the first successful eph_curl_load(); read-only afterwards. */
extern eph_curl_api_t eph_curl_api;

/* 0 once libcurl (EPH_SONAME_CURL, e.g. libcurl.so.4) is loaded and bound; else -ELIBACC, err names
 * why. */
int eph_curl_load(eph_error_t *err);

#ifndef EPH_CURL_API_IMPLEMENTATION
#undef curl_easy_setopt
#undef curl_easy_getinfo
#define curl_easy_cleanup (eph_curl_api.curl_easy_cleanup)
#define curl_easy_getinfo (eph_curl_api.curl_easy_getinfo)
#define curl_easy_init (eph_curl_api.curl_easy_init)
#define curl_easy_perform (eph_curl_api.curl_easy_perform)
#define curl_easy_setopt (eph_curl_api.curl_easy_setopt)
#define curl_easy_strerror (eph_curl_api.curl_easy_strerror)
#define curl_free (eph_curl_api.curl_free)
#define curl_slist_append (eph_curl_api.curl_slist_append)
#define curl_slist_free_all (eph_curl_api.curl_slist_free_all)
#define curl_url (eph_curl_api.curl_url)
#define curl_url_cleanup (eph_curl_api.curl_url_cleanup)
#define curl_url_get (eph_curl_api.curl_url_get)
#define curl_url_set (eph_curl_api.curl_url_set)
#endif

#endif
