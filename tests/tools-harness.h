/* Test harness of the tool plugins: the shared fake host (mock-host.h), plugin loading
 * through the real loader, and a real HTTP server on 127.0.0.1 (libmicrohttpd) that logs every
 * request it receives. */
#ifndef EPH_TESTS_TOOLS_HARNESS_H
#define EPH_TESTS_TOOLS_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include <ephemeral/plugin.h>

#include "mock-host.h"
#include "loader.h"

/* The fake host is the shared one (mock-host.h), under the names these tests use. */
typedef fh_record_t th_record_t;
#define th fh
#define th_host fh_host
#define th_sandbox_write fh_sandbox_write
#define th_sandbox_read fh_sandbox_read
#define th_sandbox_list fh_sandbox_list
#define th_reset(budget_micros) fh_reset((budget_micros), NULL, NULL)
#define th_free fh_free
#define th_everything fh_everything

/* Loads plugins/.libs/<name>.so from $EPH_BUILDDIR through eph_plugin_load_file with the
 * block named `name` parsed from config_text (libconfig syntax). Aborts the test on failure
 * unless expect_fail; then returns NULL and fills err. */
const eph_plugin_slot_t *th_load(eph_plugins_t *ps, const char *name, const char *config_text,
                                 int expect_fail, eph_error_t *err);
void th_unload(eph_plugins_t *ps);

/* The plugins a test loaded (th_load(&th_plugins, ...)), and the cmocka fixtures most
 * tool tests use: th_setup resets the fake host with a budget of $1 (1000000 micros),
 * th_teardown unloads th_plugins and frees the fake host's records. */
extern eph_plugins_t th_plugins;
int th_setup(void **state);
int th_teardown(void **state);

/* Calls a tool with args (JSON text) and grants (JSON text or NULL). Returns the result
 * object (owned by the caller) or NULL when the call returned negative (err filled). */
json_object *th_call(const eph_plugin_slot_t *slot, const char *tool, const char *args,
                     const char *grants, int zdr, eph_error_t *err);

/* A result's member key as text (json_object_get_string: a number or boolean as its JSON
 * text), NULL when absent. Borrowed from o. */
const char *str_of(json_object *o, const char *key);

/* ---- the outside world: an HTTP server on 127.0.0.1 */

typedef struct th_httpd th_httpd_t;
/* Starts the server on ipv4 (NULL: 127.0.0.1; port chosen by the kernel). Routes:
 *   /page.html          an HTML page with a script and a style
 *   /text               text/plain "plain text body"
 *   /big                text/plain, 1 MiB of 'x'
 *   /redirect?to=URL    302 to URL (without to: to itself, a loop)
 *   /search?q=..        SearXNG-shaped JSON with 3 results echoing q
 *   anything else       200 application/json echo: {"method","url","query","headers":{..},
 *                       "body"} (header names lower case), and the request's Authorization
 *                       header repeated in the response header X-Echo-Authorization */
th_httpd_t *th_httpd_start(const char *ipv4);
int th_httpd_port(const th_httpd_t *h);
/* Requests received so far (each "METHOD /path?query"). */
size_t th_httpd_count(th_httpd_t *h);
/* A JSON array of the requests received (copy, owned by the caller). */
json_object *th_httpd_requests(th_httpd_t *h);
void th_httpd_stop(th_httpd_t *h);

#endif
