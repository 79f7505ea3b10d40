/* The fake host of the plugin unit tests; see mock-host.h. */
#include <config.h>

#include "mock-host.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <poll.h>

#include "conf.h"
#include "guest/protocol.h"
#include "log.h"
#include "util.h"

fh_record_t fh;
eph_host_t fh_host;
bool fh_log_to_stderr;
int (*fh_sandbox_write)(const char *, const void *, size_t, eph_error_t *);
int (*fh_sandbox_read)(const char *, size_t, void **, size_t *, int *, eph_error_t *);
int (*fh_sandbox_list)(const char *, eph_dirent_t **, size_t *, eph_error_t *);

static void
fake_log(eph_log_level_t level, const char *fmt, ...)
{
  char line[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (fh_log_to_stderr)
    fprintf(stderr, "# [plugin %d] %s\n", (int)level, line);
  /* A plugin logs from any of its threads (a backend's watchdog, creates from several
   * threads at once): two appends at once freed the same string twice. */
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&lock);
  char *joined = eph_xasprintf("%s%d: %s\n", fh.log ? fh.log : "", (int)level, line);
  free(fh.log);
  fh.log = joined;
  pthread_mutex_unlock(&lock);
}

static int
fake_emit(eph_run_t *run, const char *source, const char *kind, const char *text, json_object *data,
          eph_error_t *err)
{
  json_object *e = json_object_new_object();
  json_object_object_add(e, "source", json_object_new_string(source));
  json_object_object_add(e, "kind", json_object_new_string(kind));
  json_object_object_add(e, "text", json_object_new_string(text ? text : ""));
  if (data) {
    json_object *copy = NULL;
    json_object_deep_copy(data, &copy, NULL);
    json_object_object_add(e, "data", copy);
  }
  json_object_array_add(fh.events, e);
  return 0;
}

static int
fake_charge(eph_run_t *run, eph_cost_t category, int64_t micros, const char *memo, eph_error_t *err)
{
  if (fh.charged_micros + micros > fh.budget_micros)
    return eph_error_set(err, EPH_E_BUDGET, "budget exhausted: %lld + %lld > %lld",
                         (long long)fh.charged_micros, (long long)micros,
                         (long long)fh.budget_micros);
  fh.charged_micros += micros;
  json_object *c = json_object_new_object();
  json_object_object_add(c, "category", json_object_new_int(category));
  json_object_object_add(c, "micros", json_object_new_int64(micros));
  json_object_object_add(c, "memo", json_object_new_string(memo ? memo : ""));
  json_object_array_add(fh.charges, c);
  return 0;
}

static int
fake_write(eph_run_t *run, const char *path, const void *data, size_t bytes, eph_error_t *err)
{
  return fh_sandbox_write ? fh_sandbox_write(path, data, bytes, err)
                          : eph_error_set(err, ENOSYS, "no sandbox");
}

static int
fake_read(eph_run_t *run, const char *path, size_t max, void **data, size_t *bytes, int *trunc,
          eph_error_t *err)
{
  return fh_sandbox_read ? fh_sandbox_read(path, max, data, bytes, trunc, err)
                         : eph_error_set(err, ENOSYS, "no sandbox");
}

static int
fake_list(eph_run_t *run, const char *path, eph_dirent_t **entries, size_t *count, eph_error_t *err)
{
  return fh_sandbox_list ? fh_sandbox_list(path, entries, count, err)
                         : eph_error_set(err, ENOSYS, "no sandbox");
}

static void
fake_dirents_free(eph_dirent_t *entries, size_t count)
{
  for (size_t i = 0; i < count; i++)
    free(entries[i].name);
  free(entries);
}

void
fh_reset(int64_t budget_micros, const char *state_dir, const char *data_dir)
{
  fh_free();
  fh.events = json_object_new_array();
  fh.charges = json_object_new_array();
  fh.budget_micros = budget_micros;
  memset(&fh_host, 0, sizeof fh_host);
  fh_host.struct_size = sizeof fh_host;
  fh_host.abi_major = EPH_ABI_MAJOR;
  fh_host.abi_minor = EPH_ABI_MINOR;
  fh_host.log = fake_log;
  fh_host.cfg_int = eph_cfg_int;
  fh_host.cfg_bool = eph_cfg_bool;
  fh_host.cfg_string = eph_cfg_string;
  fh_host.state_dir = state_dir ? state_dir : "/nonexistent-state";
  fh_host.data_dir = data_dir ? data_dir : "/nonexistent-data";
  fh_host.libexec_dir = "/nonexistent-libexec";
  fh_host.emit = fake_emit;
  fh_host.charge = fake_charge;
  fh_host.sandbox_write = fake_write;
  fh_host.sandbox_read = fake_read;
  fh_host.sandbox_list = fake_list;
  fh_host.dirents_free = fake_dirents_free;
}

void
fh_free(void)
{
  if (fh.events)
    json_object_put(fh.events);
  if (fh.charges)
    json_object_put(fh.charges);
  free(fh.log);
  memset(&fh, 0, sizeof fh);
}

int
fh_backend_load(fh_backend_t *b, const char *path, const config_setting_t *block, eph_error_t *err)
{
  memset(b, 0, sizeof *b);
  if (!(b->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL)))
    return eph_error_set(err, ENOENT, "dlopen %s: %s", path, dlerror());
  b->p = dlsym(b->dl, EPH_PLUGIN_SYMBOL);
  if (!b->p || b->p->kind != EPH_KIND_BACKEND) {
    dlclose(b->dl);
    return eph_error_set(err, EINVAL, "%s: no backend descriptor", path);
  }
  b->ops = b->p->ops;
  int r = b->p->init(&fh_host, block, &b->state, err);
  if (r < 0) {
    eph_error_wrap(err, "init");
    dlclose(b->dl);
  }
  return r;
}

void
fh_backend_unload(fh_backend_t *b)
{
  b->p->fini(b->state);
  dlclose(b->dl);
}

json_object *
fh_first_frame(int fd, int64_t within_ms)
{
  eph_frame_reader_t rd = {0};
  json_object *o = NULL;
  int64_t end = eph_now_ms() + within_ms;
  while (!o && eph_now_ms() < end) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 1000) <= 0)
      continue;
    if (eph_frame_reader_feed(&rd, fd, &o) < 0)
      break;
  }
  eph_frame_reader_clear(&rd);
  return o;
}

char *
fh_everything(void)
{
  return eph_xasprintf(
      "%s\n%s\n%s", json_object_to_json_string_ext(fh.events, JSON_C_TO_STRING_PLAIN),
      json_object_to_json_string_ext(fh.charges, JSON_C_TO_STRING_PLAIN), fh.log ? fh.log : "");
}
