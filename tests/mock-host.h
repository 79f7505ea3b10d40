/* One fake host for every plugin unit test (collectd's plugin_mock.c is the model): the
 * host services table a plugin gets, with the core's own config getters (so a plugin's key
 * errors read as they do in production), a log, emit and charge that record what the plugin
 * did, a budget enforced as the ledger does (a charge that does not fit is refused whole),
 * and sandbox operations a test installs. Used by the tool, ledger and backend tests; the
 * run's own services are tested with the real core (tests/test-run-machine.c). */
#ifndef EPH_TESTS_MOCK_HOST_H
#define EPH_TESTS_MOCK_HOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ephemeral/plugin.h>

/* What the fake host saw. Reset by fh_reset(). */
typedef struct fh_record {
  json_object *events;  /* array of {source, kind, text, data} */
  json_object *charges; /* array of {category, micros, memo} */
  char *log;            /* every log line ("<level>: <text>\n"), concatenated; heap */
  int64_t budget_micros, charged_micros; /* charge refused past budget_micros */
} fh_record_t;

extern fh_record_t fh;
extern eph_host_t fh_host;
/* Log lines also go to stderr as TAP comments ("# [plugin LEVEL] ...") when set. */
extern bool fh_log_to_stderr;

/* Sandbox operations of the fake host: tests install their own (NULL: -ENOSYS). */
extern int (*fh_sandbox_write)(const char *path, const void *data, size_t bytes, eph_error_t *err);
extern int (*fh_sandbox_read)(const char *path, size_t max, void **data, size_t *bytes,
                              int *truncated, eph_error_t *err);
extern int (*fh_sandbox_list)(const char *path, eph_dirent_t **entries, size_t *count,
                              eph_error_t *err);

/* Forgets what was recorded and fills fh_host afresh. state_dir and data_dir are borrowed
 * (NULL: a path that does not exist). */
void fh_reset(int64_t budget_micros, const char *state_dir, const char *data_dir);
void fh_free(void);

/* A backend plugin as the backend tests hold it: dlopen()ed, its descriptor, initialised
 * with fh_host. */
typedef struct fh_backend {
  void *dl;
  const eph_plugin_t *p;
  const eph_backend_ops_t *ops;
  void *state;
} fh_backend_t;
/* Opens the plugin file path (RTLD_LOCAL), checks it is a backend and runs its init with
 * fh_host and block. 0, or negative with err saying which step failed ("dlopen PATH: ...",
 * "init: ..."; nothing left open). */
int fh_backend_load(fh_backend_t *b, const char *path, const config_setting_t *block,
                    eph_error_t *err);
void fh_backend_unload(fh_backend_t *b);
/* The first frame the guest on fd sends (its hello), waited for within_ms at most; NULL
 * when none came whole by then or the stream failed. Owned by the caller. */
json_object *fh_first_frame(int fd, int64_t within_ms);

/* Everything recorded (events, charges, log) as one string, to look for a secret in. Heap,
 * owned by the caller. */
char *fh_everything(void);

#endif
