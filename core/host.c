#include <config.h>

#include "host.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "conf.h"
#include "context.h"
#include "log.h"
#include "run_int.h"
#include "sandbox.h"
#include "store.h"
#include "util.h"

/* ------------------------------------------------------------------ per-run services */

static int
host_emit(eph_run_t *run, const char *source, const char *kind, const char *text, json_object *data,
          eph_error_t *err)
{
  if (!run || !source || !kind || !text)
    return eph_error_set(err, EINVAL, "emit: run, source, kind and text are required");
  eph_run_emit_full(run, source, kind, text, data, true);
  return 0;
}

static int
host_charge(eph_run_t *run, eph_cost_t category, int64_t micros, const char *memo, eph_error_t *err)
{
  if (!run || micros < 0)
    return eph_error_set(err, EINVAL, "charge: invalid run or amount");
  return eph_meter_charge_exact(run, category, micros, memo ? memo : "plugin charge", err);
}

static int
need_sandbox(eph_run_t *run, eph_error_t *err)
{
  if (!run || !run->sbx)
    return eph_error_set(err, ENXIO, "no sandbox for this call");
  return 0;
}

/* ------------------------------------------------------------------ live output */

/* One coalesced `output` event of the running tool call (live.h); stream 0 is the
 * end-of-command marker counting what was not shown live. */
static void
live_emit(void *opaque, int stream, const char *text, size_t bytes, uint64_t dropped_bytes)
{
  eph_run_t *run = opaque;
  json_object *d = json_object_new_object();
  json_object_object_add(d, "call_id",
                         json_object_new_string(run->live_call_id ? run->live_call_id : ""));
  if (stream) {
    json_object_object_add(d, "stream", json_object_new_string(stream == 2 ? "stderr" : "stdout"));
    json_object_object_add(d, "bytes", json_object_new_int64((int64_t)bytes));
    eph_run_emit_full(run, run->live_source ? run->live_source : "Shell", "output", text, d, true);
  } else {
    json_object_object_add(d, "dropped_bytes", json_object_new_int64((int64_t)dropped_bytes));
    char marker[96];
    snprintf(marker, sizeof marker, "[... %" PRIu64 " bytes of output not shown live]",
             dropped_bytes);
    eph_run_emit_full(run, run->live_source ? run->live_source : "Shell", "output", marker, d,
                      true);
  }
  json_object_put(d);
}

/* host->output: a chunk of the running command's output. Content: under zero data
 * retention it is neither shown nor stored. */
static void
host_output(eph_run_t *run, int stream, const char *data, size_t bytes)
{
  if (!run || !data || run->req.zero_data_retention || !run->live_call_id)
    return;
  eph_live_add(&run->live, stream, data, bytes, live_emit, run);
}

static int
host_exec(eph_run_t *run, const eph_exec_request_t *req, eph_exec_result_t *result,
          eph_error_t *err)
{
  int r = need_sandbox(run, err);
  if (r < 0)
    return r;
  /* The run's deadline bounds every command. */
  eph_exec_request_t bounded = *req;
  int64_t left = run->deadline_ms - eph_now_ms();
  if (left <= 0)
    return eph_error_set(err, ETIMEDOUT, "the run's deadline has passed");
  if (bounded.timeout_ms == 0 || (int64_t)bounded.timeout_ms > left)
    bounded.timeout_ms = (uint32_t)left;
  eph_live_begin(&run->live, bounded.output_cap_bytes);
  r = eph_sbx_exec(run->sbx, &bounded, result, err);
  eph_live_end(&run->live, live_emit, run);
  return r;
}

static int
host_write(eph_run_t *run, const char *path, const void *data, size_t bytes, eph_error_t *err)
{
  int r = need_sandbox(run, err);
  return r < 0 ? r : eph_sbx_write(run->sbx, path, data, bytes, err);
}

static int
host_read(eph_run_t *run, const char *path, size_t max_bytes, void **data, size_t *bytes,
          int *truncated, eph_error_t *err)
{
  int r = need_sandbox(run, err);
  return r < 0 ? r : eph_sbx_read(run->sbx, path, max_bytes, data, bytes, truncated, err);
}

static int
host_list(eph_run_t *run, const char *path, eph_dirent_t **entries, size_t *count, eph_error_t *err)
{
  int r = need_sandbox(run, err);
  return r < 0 ? r : eph_sbx_list(run->sbx, path, entries, count, err);
}

static void
run_services(eph_host_t *host)
{
  host->emit = host_emit;
  host->charge = host_charge;
  host->sandbox_exec = host_exec;
  host->exec_result_clear = eph_exec_result_clear;
  host->sandbox_write = host_write;
  host->sandbox_read = host_read;
  host->sandbox_list = host_list;
  host->dirents_free = eph_dirents_free;
  host->output = host_output;
}

/* The host's name when the configuration names none: kept for the process (the table
 * borrows it until the plugins' fini; every context of a process has the same). */
static char default_node[256];
static pthread_once_t default_node_once = PTHREAD_ONCE_INIT;

static void
default_node_fill(void)
{
  if (gethostname(default_node, sizeof default_node - 1) < 0 || !default_node[0])
    snprintf(default_node, sizeof default_node, "node");
}

void
eph_host_init(eph_host_t *host, struct eph_ctx *ctx)
{
  memset(host, 0, sizeof *host);
  host->struct_size = sizeof *host;
  host->abi_major = EPH_ABI_MAJOR;
  host->abi_minor = EPH_ABI_MINOR;
  host->log = eph_log;
  host->cfg_int = eph_cfg_int;
  host->cfg_bool = eph_cfg_bool;
  host->cfg_string = eph_cfg_string;
  host->state_dir = ctx->state_dir;
  host->data_dir = ctx->paths.data_dir;
  host->libexec_dir = ctx->paths.libexec_dir;
  /* The store's target as core/cluster.c opens it: a PostgreSQL one only (anything else is
   * refused there, and a plugin must not take a file path for a database). */
  const char *db = eph_config_database(&ctx->config);
  host->database = db && eph_store_target_is_pg(db) ? db : NULL;
  host->node_name = eph_config_values(&ctx->config)->node_name;
  if (!host->node_name || !*host->node_name) {
    pthread_once(&default_node_once, default_node_fill);
    host->node_name = default_node;
  }
  run_services(host);
}
