/* Shared by the model plugin tests: starts tests/fake-openai, loads a model plugin through
 * the real loader with a config block given as libconfig text, captures stderr. */
#ifndef EPH_TEST_MODEL_HARNESS_H
#define EPH_TEST_MODEL_HARNESS_H

#include <stddef.h>
#include <sys/types.h>

#include <ephemeral/plugin.h>

#include "loader.h"

typedef struct fake {
  pid_t pid;
  int stdin_fd; /* closing it stops the server */
  int port;
  char record[256]; /* JSONL of the requests it received */
  char dir[128];
} fake_t;

/* Starts fake-openai expecting `key` (NULL: no check) with the NULL-terminated steps.
 * Fails the test on error. */
void fake_start(fake_t *f, const char *key, const char *const *steps);
void fake_stop(fake_t *f);
/* The requests received so far: a json array (owned by the caller) of the record lines. */
json_object *fake_requests(const fake_t *f);

/* A loaded plugin with the config it was given. */
typedef struct loaded {
  config_t cfg;
  eph_plugins_t ps;
  const eph_plugin_slot_t *slot;
  const eph_model_ops_t *ops;
} loaded_t;

/* Loads $EPH_BUILDDIR/plugins/.libs/<name>.so with the block `<name>: { conf };`.
 * Returns the loader's result; on success l->ops is the model table. */
int plugin_load(loaded_t *l, const char *name, const char *conf, eph_error_t *err);
void plugin_unload(loaded_t *l);
int model_call(loaded_t *l, const eph_model_request_t *req, eph_model_response_t *resp,
               eph_error_t *err);

/* Redirects fd 2 to a temporary file until capture_end(), which returns what was written
 * (heap string, caller frees). */
void capture_begin(void);
char *capture_end(void);

/* The host table the tests load plugins with (the core's own, from eph_host_init). */
extern eph_host_t test_host;
void harness_init(void);
const char *builddir(void);
const char *srcdir(void);

#endif
