/* Test harness of the tool plugins: a fake host (records events, charges and log lines,
 * enforces a budget like the ledger does), plugin loading through the real loader, and a
 * real HTTP server on 127.0.0.1 (libmicrohttpd) that logs every request it receives. */
#ifndef EPH_TESTS_TOOLS_HARNESS_H
#define EPH_TESTS_TOOLS_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include <ephemeral/plugin.h>

#include "loader.h"

/* What the fake host saw. Reset by th_reset(). */
typedef struct th_record {
  json_object *events;  /* array of {source, kind, text, data} */
  json_object *charges; /* array of {category, micros, memo} */
  char *log;            /* every log line, concatenated; heap */
  int64_t budget_micros, charged_micros; /* charge refused past budget_micros */
} th_record_t;

extern th_record_t th;
extern eph_host_t th_host;

/* Sandbox operations of the fake host: tests install their own (NULL: -ENOSYS). */
extern int (*th_sandbox_write)(const char *path, const void *data, size_t bytes, eph_error_t *err);
extern int (*th_sandbox_read)(const char *path, size_t max, void **data, size_t *bytes,
                              int *truncated, eph_error_t *err);
extern int (*th_sandbox_list)(const char *path, eph_dirent_t **entries, size_t *count,
                              eph_error_t *err);

void th_reset(int64_t budget_micros);
void th_free(void);

/* Loads plugins/.libs/<name>.so from $EPH_BUILDDIR through eph_plugin_load_file with the
 * block named `name` parsed from config_text (libconfig syntax). Aborts the test on failure
 * unless expect_fail; then returns NULL and fills err. */
const eph_plugin_slot_t *th_load(eph_plugins_t *ps, const char *name, const char *config_text,
                                 int expect_fail, eph_error_t *err);
void th_unload(eph_plugins_t *ps);

/* Calls a tool with args (JSON text) and grants (JSON text or NULL). Returns the result
 * object (owned by the caller) or NULL when the call returned negative (err filled). */
json_object *th_call(const eph_plugin_slot_t *slot, const char *tool, const char *args,
                     const char *grants, int zdr, eph_error_t *err);

/* Everything the fake host recorded (events, charges, log) as one string, to look for a
 * secret in. Heap, owned by the caller. */
char *th_everything(void);

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
