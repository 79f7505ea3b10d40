/*
 * ephemeral plugin SDK: the public ABI between the ephemeral core and its plugins.
 *
 * A plugin is a shared object that exports exactly one symbol, `eph_plugin` (see
 * EPH_PLUGIN_EXPORT), a const eph_plugin_t descriptor. The core dlopen()s it with
 * RTLD_NOW | RTLD_LOCAL, checks the ABI major, calls init() with the plugin's own
 * libconfig block and a table of host services, and from then on calls the kind-specific
 * operations table with the state init() returned.
 *
 * Versioning: EPH_ABI_MAJOR changes on any incompatible change (a field moved, a meaning
 * changed); the loader refuses a different major. EPH_ABI_MINOR grows when an operation is
 * appended to the end of a table; every table starts with its own struct_size so each side
 * reads only the common prefix; a missing tail entry means "unsupported".
 *
 * Conventions used throughout:
 *  - Fallible functions return 0 (or a non-negative count) on success and a negative value on
 *    failure, and fill the eph_error_t * passed last: `err->code` is an errno value or one of
 *    the EPH_E_* codes below, `err->message` a human sentence. The return value is
 *    -err->code. Plugins never call exit().
 *  - Units are in names: _micros (integer micro-dollars, 1 USD = 1,000,000), _ms
 *    (milliseconds), _bytes, _tokens. Deadlines (`deadline_ms`) are absolute CLOCK_MONOTONIC
 *    milliseconds as returned by eph_now_ms().
 *  - Strings are UTF-8, NUL-terminated. "borrowed" means the callee must not free it and must
 *    not keep it past the call; "owned by the caller" means the receiver frees it with the
 *    function named.
 *  - JSON values cross the ABI as json-c `json_object *`; a borrowed one must not be put;
 *    an owned one is released with json_object_put().
 */
#ifndef EPHEMERAL_PLUGIN_H
#define EPHEMERAL_PLUGIN_H

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <json-c/json.h>
#include <libconfig.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EPH_ABI_MAJOR 1
#define EPH_ABI_MINOR 2

/* Name of the one symbol every plugin exports. */
#define EPH_PLUGIN_SYMBOL "eph_plugin"

/* Declares the descriptor with default visibility; build plugins with
 * -fvisibility=hidden so nothing else leaks. Usage:
 *   EPH_PLUGIN_EXPORT = { .abi_major = EPH_ABI_MAJOR, ... };                          */
#define EPH_PLUGIN_EXPORT                                                                          \
  __attribute__((visibility("default"))) extern const eph_plugin_t eph_plugin;                     \
  const eph_plugin_t eph_plugin

/* ---------------------------------------------------------------- errors */

/* Error codes beyond errno. */
enum {
  EPH_E_BASE = 1000,
  EPH_E_DENIED = 1001,       /* the gate refused the call */
  EPH_E_INSUFFICIENT = 1002, /* organisation balance below the requested reservation */
  EPH_E_BUDGET = 1003,       /* a charge would pass the reservation (budget exhausted) */
  EPH_E_DIVERGED = 1004,     /* a replayed transcript does not match the live run */
  EPH_E_PROTOCOL = 1005,     /* a peer broke the guest or model protocol */
  EPH_E_CONFIG = 1006,       /* invalid configuration */
  EPH_E_UPSTREAM = 1007,     /* a remote service (model API, web) answered with an error */
};

#define EPH_ERROR_MESSAGE_BYTES 1024

/* An error: code (errno or EPH_E_*) and message. Caller-allocated, usually on the stack,
 * zero-initialised ({0}). Holds no heap memory: nothing to free. */
typedef struct eph_error {
  int code;
  char message[EPH_ERROR_MESSAGE_BYTES];
} eph_error_t;

/* Fills err (if non-NULL) and returns -code, so a failing path is one line:
 *   return eph_error_set(err, EINVAL, "field 'x': must be positive");
 * code <= 0 is stored as EIO. */
__attribute__((format(printf, 3, 4))) static inline int
eph_error_set(eph_error_t *err, int code, const char *fmt, ...)
{
  if (code <= 0)
    code = EIO;
  if (err) {
    va_list ap;
    err->code = code;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
  }
  return -code;
}

/* Prefixes context to an existing error ("loading x.so: <old message>"); keeps the code.
 * Returns -err->code (or -EIO when err is NULL or was never set). */
__attribute__((format(printf, 2, 3))) static inline int
eph_error_wrap(eph_error_t *err, const char *fmt, ...)
{
  if (!err)
    return -EIO;
  char prefix[EPH_ERROR_MESSAGE_BYTES], old[EPH_ERROR_MESSAGE_BYTES];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, err->message, sizeof old);
  old[sizeof old - 1] = '\0';
  /* Built piecewise: the message is cut at its buffer's end, never overflows. */
  size_t used = strnlen(prefix, sizeof err->message - 3);
  memcpy(err->message, prefix, used);
  err->message[used++] = ':';
  err->message[used++] = ' ';
  size_t rest = strnlen(old, sizeof err->message - used - 1);
  memcpy(err->message + used, old, rest);
  err->message[used + rest] = '\0';
  if (err->code <= 0)
    err->code = EIO;
  return -err->code;
}

/* Absolute CLOCK_MONOTONIC time in milliseconds: the clock of every deadline_ms. */
static inline int64_t
eph_now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---------------------------------------------------------------- kinds */

typedef enum eph_kind {
  EPH_KIND_TOOL = 1,    /* ops: eph_tool_ops_t */
  EPH_KIND_BACKEND = 2, /* ops: eph_backend_ops_t */
  EPH_KIND_MODEL = 3,   /* ops: eph_model_ops_t */
  EPH_KIND_LEDGER = 4,  /* ops: eph_ledger_ops_t */
} eph_kind_t;

typedef enum eph_log_level {
  EPH_LOG_ERROR = 0,
  EPH_LOG_WARN = 1,
  EPH_LOG_INFO = 2,
  EPH_LOG_DEBUG = 3,
} eph_log_level_t;

/* ---------------------------------------------------------------- config keys */

typedef enum eph_config_type {
  EPH_CFG_BOOL = 1,
  EPH_CFG_INT = 2, /* 64-bit integer */
  EPH_CFG_STRING = 3,
  EPH_CFG_LIST = 4,  /* list or array of strings */
  EPH_CFG_GROUP = 5, /* a nested group; its keys: see eph_config_key_t.keys */
} eph_config_type_t;

/* One documented configuration key. A plugin lists every key its block accepts in a table
 * ending with {0}; the core reports unknown keys (warning, file:line) and wrong types (error,
 * file:line) the same way for every plugin, and generates ephemeral.conf(5) from the same
 * table, so an undocumented key cannot ship. All strings are static. */
typedef struct eph_config_key {
  const char *name;
  eph_config_type_t type;
  const char *default_text; /* default as written in conf.d, e.g. "512" or "\"tcg\"" */
  const char *unit;         /* e.g. "MiB", "seconds", "micros", or NULL */
  const char *doc;          /* one or two sentences; required */
  /* ABI 1.2 (rows grew before 1.2 was released; the loader reads a 1.0/1.1 plugin's shorter
   * rows as they were). Optional: a row written with designated initializers needs no
   * change (a positional row compiles, and warns under -Wextra's
   * -Wmissing-field-initializers). */
  /* EPH_CFG_INT: with has_range true the host refuses a value outside min..max (inclusive,
   * in unit) with "file:line: key 'k': V is outside MIN..MAX UNIT (block.k)" (with max
   * INT64_MAX: "is not positive", "is negative" or "is below MIN UNIT"), when the block is
   * loaded (so `ephemeral config check` says it) and again in cfg_int. has_range false
   * means unchecked: 0 is a legitimate bound, so the flag and not a zero range decides.
   * Write EPH_CFG_RANGE(lo, hi) in the row. */
  bool has_range;
  int64_t min, max;
  /* EPH_CFG_GROUP: the group's own keys; EPH_CFG_LIST: the keys of every element that is a
   * group. Checked like the block's (unknown key: warning, file:line; wrong type or range:
   * error, file:line). NULL: the plugin checks what is inside itself. */
  const struct eph_config_key *keys;
} eph_config_key_t;

/* In a key row: `{"slots", EPH_CFG_INT, "1024", NULL, "...", EPH_CFG_RANGE(1, 65536)}`. */
#define EPH_CFG_RANGE(lo, hi) .has_range = true, .min = (lo), .max = (hi)

/* ---------------------------------------------------------------- host services */

typedef struct eph_run eph_run_t; /* opaque: one run, owned by the core */

/* Cost categories of the ledger; their sum is the billed amount. */
typedef enum eph_cost {
  EPH_COST_MODEL = 1,
  EPH_COST_WEB = 2,
  EPH_COST_COMPUTE = 3,
} eph_cost_t;

/* End of one command (exec) or of a sandbox. Strings: see eph_end_reason_name(). */
typedef enum eph_end_reason {
  EPH_END_EXITED = 0,         /* exited by itself (exit code or signal below) */
  EPH_END_TIMEOUT = 1,        /* per-command timeout or run deadline */
  EPH_END_OOM = 2,            /* memory limit reached, killed by the OOM killer */
  EPH_END_PIDS_EXHAUSTED = 3, /* process limit reached (fork failed) */
  EPH_END_DISK_FULL = 4,      /* scratch/tmp full (ENOSPC) */
  EPH_END_KILLED = 5,         /* killed by the host (kill op, cancel, destroy) */
} eph_end_reason_t;

static inline const char *
eph_end_reason_name(eph_end_reason_t r)
{
  static const char *const names[] = {"exited",         "timeout",   "oom",
                                      "pids_exhausted", "disk_full", "killed"};
  return (unsigned)r < sizeof names / sizeof names[0] ? names[r] : "unknown";
}

/* A command to run inside the sandbox as the worker, in scratch unless cwd is set.
 * Exactly one of `command` (run as `sh -c command`) or `argv` (NULL-terminated) is set.
 * All pointers borrowed for the duration of the call. */
typedef struct eph_exec_request {
  uint32_t struct_size;
  const char *command;
  const char *const *argv;
  const char *const *env; /* "K=V" strings added to the worker's base env, or NULL */
  const char *cwd;        /* absolute path inside the sandbox, or NULL for scratch */
  const void *stdin_data; /* bytes fed to stdin then closed; NULL = /dev/null */
  size_t stdin_bytes;
  uint32_t timeout_ms;     /* per-command timeout; 0 = the backend default */
  size_t output_cap_bytes; /* per stream head+tail kept; 0 = the default */
  /* Optional streaming callback, called on the caller's thread as chunks arrive (before
   * capping). stream is 1 for stdout, 2 for stderr. May be NULL. */
  void (*on_output)(void *opaque, int stream, const char *data, size_t bytes);
  void *opaque;
} eph_exec_request_t;

/* Result of one command. stdout_text/stderr_text are heap strings owned by the result and
 * released with host->exec_result_clear(); when a stream exceeded the cap they hold the head,
 * a marker line "[... N bytes dropped ...]" and the tail, and *_truncated is set. */
typedef struct eph_exec_result {
  uint32_t struct_size;
  int exit_code; /* valid when signal == 0 */
  int signal;    /* terminating signal, or 0 */
  eph_end_reason_t reason;
  char *stdout_text;
  size_t stdout_bytes; /* bytes of stdout_text */
  int stdout_truncated;
  uint64_t stdout_dropped_bytes;
  char *stderr_text;
  size_t stderr_bytes;
  int stderr_truncated;
  uint64_t stderr_dropped_bytes;
  int64_t duration_ms;
} eph_exec_result_t;

/* A directory entry from host->sandbox_list(). */
typedef struct eph_dirent {
  char *name; /* owned by the array */
  char type;  /* 'f' file, 'd' directory, 'l' symlink, '?' other */
  uint64_t size_bytes;
  int64_t mtime_s;
} eph_dirent_t;

/* Services the core offers to every plugin. Passed to init(); valid until fini() returns.
 * Functions taking `eph_run_t *` must only be called during an operation that received
 * that run (a tool call, a model call). Thread-safe unless stated. */
typedef struct eph_host {
  uint32_t struct_size;
  uint32_t abi_major, abi_minor;

  /* Logs to the core's log (stderr for the CLI), prefixed with the calling plugin's name.
   * Never pass secrets or (under zero data retention) run content. */
  void (*log)(eph_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

  /* Typed getters on the plugin's own config block (may be NULL: then *out = def).
   * Return 0, or -EPH_E_CONFIG with a "file:line: key 'k': ..." message on a wrong type,
   * or (cfg_int) a value outside its key row's EPH_CFG_RANGE. The default is not checked. */
  int (*cfg_int)(const config_setting_t *block, const char *key, int64_t def, int64_t *out,
                 eph_error_t *err);
  int (*cfg_bool)(const config_setting_t *block, const char *key, int def, int *out,
                  eph_error_t *err);
  /* *out is borrowed from the config tree (valid until fini) or is def. */
  int (*cfg_string)(const config_setting_t *block, const char *key, const char *def,
                    const char **out, eph_error_t *err);

  /* The state directory (absolute path; exists, mode 0700). Borrowed, valid until fini. */
  const char *state_dir;
  /* The installed or build-tree data directory (guest image, playground). Borrowed. */
  const char *data_dir;
  /* The directory holding helper executables such as ephemeral-guest. Borrowed. */
  const char *libexec_dir;

  /* Appends an event to the run's timeline. source: the timeline's source column
   * ("Shell", "Web", ...); kind: machine word ("tool_call", "denied", ...); text: one line
   * for people; data: optional JSON object, borrowed (the core copies it). */
  int (*emit)(eph_run_t *run, const char *source, const char *kind, const char *text,
              json_object *data, eph_error_t *err);

  /* Charges the run's reservation. Refused (-EPH_E_BUDGET, nothing charged) when the
   * charge would pass the reservation. memo: short text for the ledger entry. */
  int (*charge)(eph_run_t *run, eph_cost_t category, int64_t micros, const char *memo,
                eph_error_t *err);

  /* Guest operations on the run's sandbox (tools only; the gate has already passed).
   * exec fills *result (clear it with exec_result_clear) and returns 0 when the command ran
   * to any end (non-zero exit, timeout and oom included); negative only when the sandbox
   * could not be reached. */
  int (*sandbox_exec)(eph_run_t *run, const eph_exec_request_t *req, eph_exec_result_t *result,
                      eph_error_t *err);
  void (*exec_result_clear)(eph_exec_result_t *result);
  /* Writes bytes to path (relative to scratch, confined beneath it), mode 0644, as the
   * worker; returns 0 only once the guest confirmed `bytes` were written. */
  int (*sandbox_write)(eph_run_t *run, const char *path, const void *data, size_t bytes,
                       eph_error_t *err);
  /* Reads at most max_bytes of path (relative to scratch, confined). *data is heap memory
   * owned by the caller (free()); *truncated set when the file was longer. */
  int (*sandbox_read)(eph_run_t *run, const char *path, size_t max_bytes, void **data,
                      size_t *bytes, int *truncated, eph_error_t *err);
  /* Lists a directory relative to scratch ("" = scratch). *entries is owned by the caller
   * and released with dirents_free(*entries, *count). */
  int (*sandbox_list)(eph_run_t *run, const char *path, eph_dirent_t **entries, size_t *count,
                      eph_error_t *err);
  void (*dirents_free)(eph_dirent_t *entries, size_t count);

  /* ABI 1.2 addition, appended (check struct_size; the minor stays 2 because 1.2 is not yet
   * released): shows a chunk of a running command's output live in the run's timeline.
   * Called from an exec request's on_output (same thread, during sandbox_exec) with the
   * chunk as received: stream 1 stdout, 2 stderr; data borrowed. The core coalesces chunks
   * into `output` events (about every 100 ms or 4 KiB), bounds them per command and per
   * run (a marker says what was dropped), and drops them under zero data retention. A tool
   * whose commands are not the model's (internal plumbing) simply does not call it. */
  void (*output)(eph_run_t *run, int stream, const char *data, size_t bytes);

  /* ABI 1.2 addition, appended (read them only when struct_size covers them, see
   * EPH_HOST_HAS_DATABASE; the minor stays 2 because 1.2 is not yet released): what the core
   * itself is configured with, so a plugin that keeps its data beside the core's (the
   * ledger-postgres plugin) needs no second copy of the setting.
   * database: the PostgreSQL database of the core's store (core key `database`, overridden
   * by --database and EPHEMERAL_DATABASE, docs/cluster.md): a libpq URI or key=value
   * string, which may hold a password (never log it). NULL when the core keeps its store
   * in local SQLite. Borrowed, valid until fini.
   * node_name: this host's name in a cluster (core key `node_name`, default the hostname).
   * Never NULL. Borrowed, valid until fini. */
  const char *database;
  const char *node_name;
} eph_host_t;

/* True when host (sized by the core) carries database and node_name. */
#define EPH_HOST_HAS_DATABASE(host)                                                                \
  ((host)->struct_size >= offsetof(eph_host_t, node_name) + sizeof(const char *))

/* ---------------------------------------------------------------- the descriptor */

typedef struct eph_plugin {
  uint32_t abi_major;   /* EPH_ABI_MAJOR the plugin was built with */
  uint32_t abi_minor;   /* EPH_ABI_MINOR the plugin was built with */
  uint32_t struct_size; /* sizeof(eph_plugin_t) at build time */
  const char *name;     /* unique, [a-z0-9-]+, e.g. "backend-jail" */
  eph_kind_t kind;
  const char *version; /* the plugin's own version, e.g. "0.1.0" */
  const char *description;
  const eph_config_key_t *config_keys; /* keys of its block, {0}-terminated; NULL = none */

  /* Creates the plugin's state from its config block (NULL when the block is empty).
   * host is valid until fini. Returns 0 and sets *state (may be NULL), or negative + err;
   * on failure the plugin must have released everything and fini is not called. */
  int (*init)(const eph_host_t *host, const config_setting_t *config, void **state,
              eph_error_t *err);
  /* Releases the state. Called once, after every other call has returned. May be NULL. */
  void (*fini)(void *state);

  const void *ops; /* the kind's table: eph_tool_ops_t, eph_backend_ops_t, ... */
} eph_plugin_t;

/* ---------------------------------------------------------------- tools */

/* The permission-table row a tool belongs to. The gate refuses a call whose row the run's
 * permission table does not grant; a tool is only offered to the model when granted. */
typedef enum eph_permission {
  EPH_PERM_SHELL = 1,
  EPH_PERM_WEB = 2,
  EPH_PERM_FILES = 3,
  EPH_PERM_CONNECTIONS = 4,
} eph_permission_t;

/* One tool a plugin offers. parameters_json: the JSON Schema of its arguments, as OpenAI's
 * function-calling "parameters" object. All static strings. */
typedef struct eph_tool_def {
  const char *name; /* [a-z_]+, unique across plugins */
  const char *description;
  const char *parameters_json;
  eph_permission_t permission;
} eph_tool_def_t;

/* One tool call, as the gate passed it. All borrowed for the duration of the call. */
typedef struct eph_tool_call {
  uint32_t struct_size;
  const char *run_id;      /* "run_" + 32 hex */
  const char *tool;        /* which of the plugin's tools */
  json_object *args;       /* the arguments object the model sent (validated as an object) */
  json_object *grants;     /* the run's permission table: {"shell":bool,"web":bool,
                              "files":bool,"connections":[{"name":..,"methods":[..]}]} */
  int zero_data_retention; /* when set, never log or emit argument or result content */
  int64_t deadline_ms;     /* run deadline, CLOCK_MONOTONIC ms */
  eph_run_t *run;          /* for host services */
} eph_tool_call_t;

typedef struct eph_tool_ops {
  uint32_t struct_size;
  const eph_tool_def_t *tools; /* the tools offered */
  size_t n_tools;
  /* Executes one call. On success *result is a JSON object owned by the caller (sent to
   * the model as the tool result). A failure the model should see (bad argument, non-zero
   * exit, refused path) is a success with {"error": "..."} in *result; a negative return
   * means the tool itself broke (host_error). */
  int (*call)(void *state, const eph_tool_call_t *call, json_object **result, eph_error_t *err);
  /* ABI 1.2. Whether the operator defined the connection `name` (borrowed) for this plugin's
   * tools: 1 = defined, 0 = not. Asked before a run that grants the connection is admitted,
   * so a grant of something that does not exist is refused (400) before anything is
   * reserved. NULL (or a table from 1.1): the plugin defines no connections; a grant no
   * loaded plugin confirms is refused. Called from several threads at once: read only. */
  int (*connection_defined)(void *state, const char *name);
} eph_tool_ops_t;

/* ---------------------------------------------------------------- backends */

/* Resource limits of one sandbox. 0 = the backend's configured default. */
typedef struct eph_sandbox_limits {
  uint64_t memory_bytes;  /* RAM, swap off */
  uint32_t pids;          /* processes and threads */
  uint32_t cpu_percent;   /* CPU quota, 100 = one core */
  uint32_t nofile;        /* open files per process */
  uint64_t scratch_bytes; /* size of the writable /tmp holding scratch */
} eph_sandbox_limits_t;

/* What the core asks of a backend. Borrowed for the duration of create(). */
typedef struct eph_sandbox_spec {
  uint32_t struct_size;
  const char *run_id; /* names the sandbox; unique per host */
  eph_sandbox_limits_t limits;
  int64_t deadline_ms;   /* CLOCK_MONOTONIC ms: the backend kills everything by then */
  int network;           /* 0: loopback only; 1: one egress route to proxy_url */
  const char *proxy_url; /* "http://ADDR:PORT" the sandbox may reach when network=1 */
  /* (minor 1) No longer provided: always -1. It was the network namespace of the proxy's
   * listening socket, which only a daemon holding CAP_SYS_ADMIN could make and enter; a
   * backend built for minor 1 reads -1 and refuses network=1 (fail closed). */
  int proxy_netns_fd;
  /* (minor 2, appended while 1.2 is unreleased) With network=1: how the backend hands the
   * core's egress proxy the one socket the sandbox may reach. The backend makes, in a network
   * namespace the sandbox reaches and the host's processes do not (the sandbox's own, or
   * one whose only other interface is the sandbox's link), an AF_INET TCP socket bound to
   * proxy_url's address and port, listening, and passes it to
   * proxy_attach(proxy_ctx, fd, err) before create() returns. The core checks it (IPv4
   * TCP, listening, bound to exactly that address and port, not in the host's network
   * namespace), keeps a dup and accepts the sandbox's connections on it; its connections
   * to the world are its own, made from the host's namespace. fd is borrowed (the backend
   * closes its copy). Returns 0, or negative with err: then create() fails and leaves
   * nothing. May be called once per spec. A backend reading a smaller spec (or NULL here)
   * must refuse network=1. */
  int (*proxy_attach)(void *proxy_ctx, int listen_fd, eph_error_t *err);
  void *proxy_ctx;
} eph_sandbox_spec_t;

typedef struct eph_sandbox eph_sandbox_t; /* opaque: the backend's sandbox */

/* What destroy() verified. */
typedef struct eph_sandbox_report {
  uint32_t struct_size;
  int processes_left;  /* processes of the sandbox still alive after destroy (want 0) */
  int files_left;      /* files of the sandbox still on disk after destroy (want 0) */
  int64_t lifetime_ms; /* from create() to destroyed */
  uint64_t memory_peak_bytes;
  uint64_t oom_kills;    /* OOM kills seen during the sandbox's life */
  uint64_t pids_refused; /* forks refused by the process limit */
} eph_sandbox_report_t;

/* One entry of a backend's cache: what it keeps between sandboxes to start them faster (a
 * saved microVM snapshot). Passed to an eph_cache_each_fn; every pointer is borrowed for
 * the duration of that call. */
typedef struct eph_cache_entry {
  uint32_t struct_size;
  const char *name;     /* unique within the backend, e.g. a file name */
  uint64_t size_bytes;  /* disk space it takes */
  int64_t used_unix_s;  /* when it was made or last used (wall clock, seconds) */
  const char *identity; /* hex digest of what it was made from; "" when unknown */
  const char *detail;   /* one line: what the identity covers; "" when unknown */
  int in_use;           /* 1: a sandbox is being started from it now (never pruned) */
} eph_cache_entry_t;

typedef void (*eph_cache_each_fn)(void *ctx, const eph_cache_entry_t *entry);

typedef struct eph_backend_ops {
  uint32_t struct_size;
  const char *source; /* the timeline's source column: "Sandbox", "MicroVM" */
  const char *noun;   /* "sandbox", "microVM": events read "<noun> ready" */
  /* Boots a sandbox whose PID 1 is ephemeral-guest and returns the host end of the byte
   * stream to it in *guest_fd (owned by the caller, close()d after destroy). Blocks until
   * the guest process exists, not until its hello (the core reads that). On failure
   * nothing of the sandbox is left. */
  int (*create)(void *state, const eph_sandbox_spec_t *spec, eph_sandbox_t **sandbox, int *guest_fd,
                eph_error_t *err);
  /* Counters so far (oom kills, refused forks, memory peak): lets the core name why a
   * command was killed. May be NULL. */
  int (*stats)(void *state, eph_sandbox_t *sandbox, eph_sandbox_report_t *out, eph_error_t *err);
  /* Kills every process, removes every file and frees the handle (even on failure), then
   * checks and reports what is left. Returns negative if anything is left. */
  int (*destroy)(void *state, eph_sandbox_t *sandbox, eph_sandbox_report_t *report,
                 eph_error_t *err);
  /* Reaps sandboxes a dead host process left behind (kill -9). Returns how many were
   * reaped, or negative. Called once at start. May be NULL. */
  int (*sweep)(void *state, eph_error_t *err);
  /* (ABI 1.2 addition, appended like the others: 1.2 is not yet released; both optional,
   * NULL: the backend keeps no cache) `ephemeral snapshots list`:
   * calls each(ctx, entry) once per entry, least recently used first. Returns how many, or
   * negative. */
  int (*cache_list)(void *state, eph_cache_each_fn each, void *ctx, eph_error_t *err);
  /* `ephemeral snapshots prune`: removes entries, least recently used first, until the cache
   * takes at most max_bytes (< 0: the backend's configured limit); never one in use. each
   * (may be NULL) is called once per removed entry. Returns how many were removed, or
   * negative. */
  int (*cache_prune)(void *state, int64_t max_bytes, eph_cache_each_fn each, void *ctx,
                     eph_error_t *err);
  /* (ABI 1.2 addition, appended) Non-zero: destroy alone ends the guest and all it made, as
   * a jail's does (SIGKILL of its PID 1 empties the pid namespace; its run directory lives in
   * the sandbox's own tmpfs), so the core skips asking the guest to shut down first (a round
   * trip, and the guest's kill and removal of its run directory, for nothing). 0, and a
   * plugin whose struct_size stops before this field: the core asks the guest to shut down
   * (a microVM's guest powers its machine off), then calls destroy. */
  int destroy_ends_guest;
} eph_backend_ops_t;

/* True when ops (sized by the plugin) carries destroy_ends_guest and sets it. */
#define EPH_BACKEND_DESTROY_ENDS_GUEST(ops)                                                        \
  ((ops)->struct_size >= offsetof(eph_backend_ops_t, destroy_ends_guest) + sizeof(int) &&          \
   (ops)->destroy_ends_guest)

/* ---------------------------------------------------------------- models */

/* One model call. All borrowed for the duration of the call. */
typedef struct eph_model_request {
  uint32_t struct_size;
  const char *model;          /* e.g. "openai/gpt-6-luna" */
  json_object *messages;      /* OpenAI Chat Completions "messages" array */
  json_object *tools;         /* OpenAI "tools" array (only the permitted ones), or NULL */
  uint32_t max_output_tokens; /* the core pre-authorised the call at this many tokens */
  int64_t deadline_ms;        /* the call must return by then (CLOCK_MONOTONIC ms) */
  /* ABI 1.2 addition, appended (read it only when struct_size covers it, see
   * EPH_MODEL_REQUEST_HAS_DELTA; the minor stays 2 because 1.2 is not yet released):
   * optional, called on the calling thread with each piece of the answer's text as a
   * streaming provider delivers it (text borrowed, not NUL-terminated); the core shows them
   * as `model_delta` events. Before a retried attempt the plugin calls it once with text
   * NULL (bytes 0): the text delivered so far is discarded and the retry's pieces come
   * again from its start. The response is still the whole answer. */
  void (*on_delta)(void *opaque, const char *text, size_t bytes);
  void *delta_opaque;
} eph_model_request_t;

/* True when req (sized by the caller) carries on_delta. */
#define EPH_MODEL_REQUEST_HAS_DELTA(req)                                                           \
  ((req)->struct_size >= offsetof(eph_model_request_t, delta_opaque) + sizeof(void *))

/* One model answer. Filled by the plugin; owned by the caller, released with
 * eph_model_response_clear(). */
typedef struct eph_model_response {
  uint32_t struct_size;
  json_object *message; /* the assistant message: {"role":"assistant","content":..,
                           "tool_calls":[{"id","type":"function","function":{"name",
                           "arguments"}}]} */
  json_object *raw;     /* the whole response body as received (for --record), or NULL */
  char finish_reason[32];
  uint64_t input_tokens; /* every prompt token, the cached ones included */
  uint64_t output_tokens;
  /* ABI 1.x addition (a plugin writes them only when struct_size covers them): of
   * input_tokens, those read from the provider's prompt cache and those written to it,
   * priced separately (cached_input_micros_per_mtok, cache_write_micros_per_mtok). */
  uint64_t cache_read_tokens;
  uint64_t cache_write_tokens;
  /* ABI 1.2 addition, appended (a plugin writes them only when struct_size covers them,
   * see EPH_MODEL_RESPONSE_HAS_REPLAY; the minor stays 2 because 1.2 is not yet released):
   * set by a plugin that answered from a recording instead of calling a model
   * (model-replay). replayed_from names the transcript and line ("PATH:LINE");
   * recorded_model is the model the recording names (its "model" field), or "". Both stay
   * "" for a real model call. The core then reports the run as replayed. */
  char replayed_from[4096];
  char recorded_model[128];
} eph_model_response_t;

/* True when resp (sized by the caller) has room for the replay provenance. */
#define EPH_MODEL_RESPONSE_HAS_REPLAY(resp)                                                        \
  ((resp)->struct_size >= offsetof(eph_model_response_t, recorded_model) +                         \
                              sizeof(((eph_model_response_t *)0)->recorded_model))

/* True when resp (sized by the caller) has room for the cache token counts. */
#define EPH_MODEL_RESPONSE_HAS_CACHE(resp)                                                         \
  ((resp)->struct_size >= offsetof(eph_model_response_t, cache_write_tokens) + sizeof(uint64_t))

static inline void
eph_model_response_clear(eph_model_response_t *r)
{
  if (!r)
    return;
  if (r->message)
    json_object_put(r->message);
  if (r->raw)
    json_object_put(r->raw);
  r->message = r->raw = NULL;
}

typedef struct eph_model_ops {
  uint32_t struct_size;
  /* Runs one chat completion. Errors: -ETIMEDOUT (deadline), -EPH_E_UPSTREAM (API error
   * after retries), -EPH_E_PROTOCOL (malformed answer), -EPH_E_DIVERGED (replay). */
  int (*complete)(void *state, const eph_model_request_t *req, eph_model_response_t *resp,
                  eph_error_t *err);
  /* ABI 1.2 addition, may be absent (check struct_size): whether this plugin serves the
   * model name (by its provider prefix, e.g. "anthropic/"): 0 when not, else 1 + the length
   * of the prefix that matched (so "" matching everything is 1). The core routes a run to
   * the loaded model plugin with the highest answer (the most specific prefix; the first
   * loaded on a tie) and refuses the request (400 naming `model`) when none serves it. A
   * plugin without it gets the core's model_plugin. */
  int (*serves)(void *state, const char *model);
  /* ABI 1.2 addition, appended (check struct_size; the minor stays 2 because 1.2 is not yet
   * released), may be NULL (then taken as ready): whether a call for model (the full name,
   * "openai/gpt-6-luna"; the health check passes the core's default_model) could be made
   * now without talking to the provider: its API key is there, its transcript readable.
   * Returns 0, or negative with err saying what the operator must do ("model-openai: no
   * API key: environment variable OPENAI_API_KEY is not set and api_key_file is empty").
   * `ephemeral doctor` and GET /v1/health report the model component degraded with that
   * reason. Cheap and non-blocking: no network. */
  int (*ready)(void *state, const char *model, eph_error_t *err);
} eph_model_ops_t;

/* ---------------------------------------------------------------- ledger */

/* Per-run totals. */
typedef struct eph_ledger_totals {
  int64_t reserved_micros;
  int64_t billed_micros;   /* model + web + compute */
  int64_t released_micros; /* 0 until settled */
  int64_t model_micros, web_micros, compute_micros;
  int settled;
} eph_ledger_totals_t;

/* Room for a ledger identity: a UUID, 36 characters, and its NUL. */
#define EPH_LEDGER_IDENTITY_BYTES 37

/* One open reservation, as open_reservations reports it. Strings borrowed for the
 * duration of the callback. */
typedef struct eph_ledger_open {
  uint32_t struct_size;
  const char *run_id;
  const char *org;
  const char *node; /* the node that reserved it, or "" when the ledger does not record it */
  int64_t reserved_micros;
  int64_t reserved_unix_us; /* when it was reserved, unix micros by the ledger's clock (see
                             * open_reservations) */
} eph_ledger_open_t;

typedef struct eph_ledger_ops {
  uint32_t struct_size;
  /* Adds credit to an organisation (created if new). micros > 0. An organisation's name
   * (org of credit, balance, reserve) is 1..64 bytes of ASCII letters, digits, '_', '.' and
   * '-': the core passes no other, and a ledger refuses any other with -EINVAL (the shipped
   * ones through sdk/support/org_name.h, the core's own rule). */
  int (*credit)(void *state, const char *org, int64_t micros, eph_error_t *err);
  /* The organisation's available balance (credits - open reservations - billed). */
  int (*balance)(void *state, const char *org, int64_t *micros, eph_error_t *err);
  /* Reserves micros for run_id against org, atomically with the balance check.
   * -EPH_E_INSUFFICIENT when the balance is lower; -EEXIST when run_id already has one. */
  int (*reserve)(void *state, const char *org, const char *run_id, int64_t micros,
                 eph_error_t *err);
  /* Appends a charge. -EPH_E_BUDGET (nothing charged) when billed + micros would pass the
   * reservation; -EALREADY when the run is settled. */
  int (*charge)(void *state, const char *run_id, eph_cost_t category, int64_t micros,
                const char *memo, eph_error_t *err);
  /* Closes the reservation: released = reserved - billed. Idempotent. */
  int (*settle)(void *state, const char *run_id, eph_ledger_totals_t *totals, eph_error_t *err);
  int (*totals)(void *state, const char *run_id, eph_ledger_totals_t *totals, eph_error_t *err);
  /* Settles every open reservation (after a crash). Returns how many it settled. */
  int (*settle_open)(void *state, eph_error_t *err);
  /* (minor 2) Health probe: proves the ledger can still commit a write (one tiny
   * transaction outside the journal) right now. 0, or the error a charge would get
   * (-ENOSPC on a full disk, -EIO, -EBUSY) naming the file. Optional. */
  int (*probe)(void *state, eph_error_t *err);
  /* ABI 1.2 additions, appended (check struct_size; the minor stays 2 because 1.2 is not yet
   * released). Both optional.
   * identity: the ledger's identity, a UUID made when its storage was created and kept in
   * it, written as 36 lowercase characters + NUL into out (size >= EPH_LEDGER_IDENTITY_BYTES).
   * Two processes whose ledgers answer the same identity keep their money in one place;
   * nodes of a cluster refuse to start when theirs differs from the one the cluster
   * recorded (docs/cluster.md). NULL: the ledger cannot be identified, and a cluster node
   * refuses it. 0 or negative. */
  int (*identity)(void *state, char *out, size_t size, eph_error_t *err);
  /* open_reservations: calls each(ctx, r) for every reservation not yet settled that has
   * been open for more than open_for_us (micros, >= 0), oldest first, at most limit of
   * them (limit > 0). The age is measured by ONE clock, the ledger's own: the time a
   * reservation is stamped with and the "now" it is compared with come from the same
   * place (ledger-postgres: its database server's now(); ledger-sqlite: this host's
   * CLOCK_REALTIME), never from the clocks of the nodes that reserve and sweep, which may
   * disagree. each must not call the ledger (it may run under the ledger's lock). Returns
   * how many, or negative. A cluster node uses it to release the reservations of runs
   * whose node died before recording them. */
  int (*open_reservations)(void *state, int64_t open_for_us, int limit,
                           void (*each)(void *ctx, const eph_ledger_open_t *r), void *ctx,
                           eph_error_t *err);
} eph_ledger_ops_t;

#ifdef __cplusplus
}
#endif
#endif /* EPHEMERAL_PLUGIN_H */
