/* The `shell` tool: runs one command as the worker inside the run's sandbox and returns
 * its exit status and (capped) output to the model.
 *
 * The gate has already checked the permission table (EPH_PERM_SHELL) before call() runs;
 * the core emits the timeline events around the call, so the tool itself emits nothing and
 * logs no argument or output (zero data retention holds without a special case). */
#include <ephemeral/plugin.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "support/text.h"

#define DEFAULT_TIMEOUT_S 60
#define MAX_TIMEOUT_S 600
#define DEFAULT_OUTPUT_CAP 16384

typedef struct shell_state {
  const eph_host_t *host;
  int64_t default_timeout_s;
  int64_t max_timeout_s;
  int64_t output_cap_bytes;
} shell_state_t;

static const eph_config_key_t shell_keys[] = {
    {"default_timeout_seconds", EPH_CFG_INT, "60", "seconds",
     "Per-command timeout when the model gives no timeout_seconds. The command's whole "
     "process group is killed when it passes."},
    {"max_timeout_seconds", EPH_CFG_INT, "600", "seconds",
     "Largest timeout_seconds a model may ask for; larger requests are lowered to it. The "
     "run's own deadline still cuts every command short.",
     EPH_CFG_RANGE(1, 86400)},
    {"output_cap_bytes", EPH_CFG_INT, "16384", "bytes",
     "Output returned to the model per stream: the first and last halves are kept and the "
     "middle is replaced by a line \"[... N bytes dropped ...]\".",
     EPH_CFG_RANGE(64, 16777216)},
    {0},
};

static const eph_tool_def_t shell_tools[] = {
    {
        "shell",
        "Run a shell command (/bin/sh -c) inside the isolated sandbox as the unprivileged user "
        "`worker`, in its scratch directory. Returns exit_code, stdout, stderr (long output "
        "keeps its beginning and end), duration_ms and a reason (exited, timeout, oom, "
        "pids_exhausted, disk_full, killed). Nothing written survives the run.",
        "{\"type\":\"object\",\"properties\":{"
        "\"command\":{\"type\":\"string\",\"description\":\"The command line, run with /bin/sh "
        "-c.\"},"
        "\"timeout_seconds\":{\"type\":\"integer\",\"minimum\":1,\"description\":\"Kill the "
        "command after this many seconds (default set by the operator).\"}},"
        "\"required\":[\"command\"],\"additionalProperties\":false}",
        EPH_PERM_SHELL,
    },
};

static int
shell_init(const eph_host_t *host, const config_setting_t *config, void **state, eph_error_t *err)
{
  shell_state_t s = {.host = host};
  int r;
  if ((r = host->cfg_int(config, "default_timeout_seconds", DEFAULT_TIMEOUT_S, &s.default_timeout_s,
                         err)) < 0 ||
      (r = host->cfg_int(config, "max_timeout_seconds", MAX_TIMEOUT_S, &s.max_timeout_s, err)) <
          0 ||
      (r = host->cfg_int(config, "output_cap_bytes", DEFAULT_OUTPUT_CAP, &s.output_cap_bytes,
                         err)) < 0)
    return r;
  if (s.default_timeout_s < 1 || s.default_timeout_s > s.max_timeout_s)
    return eph_error_set(
        err, EPH_E_CONFIG,
        "tool-shell: default_timeout_seconds must be within 1..max_timeout_seconds");
  shell_state_t *p = malloc(sizeof *p);
  if (!p)
    return eph_error_set(err, ENOMEM, "tool-shell: out of memory");
  *p = s;
  *state = p;
  return 0;
}

static void
shell_fini(void *state)
{
  free(state);
}

/* Output is bytes; the model API wants valid UTF-8. Invalid bytes (binary output, or a
 * character cut by the head/tail split) become U+FFFD. Returns a new json string. */
static json_object *
utf8_string(const char *text, size_t bytes)
{
  size_t n = 0;
  char *out = eph_utf8_repair(text, bytes, &n);
  if (!out)
    return NULL;
  json_object *s = json_object_new_string_len(out, (int)n);
  free(out);
  return s;
}

static json_object *
tool_error(const char *message)
{
  json_object *o = json_object_new_object();
  json_object_object_add(o, "error", json_object_new_string(message));
  return o;
}

/* The command's output goes live to the run's timeline through the host (ABI 1.2
 * host->output; an older core without it shows the output only in the result). */
typedef struct live_sink {
  const eph_host_t *host;
  eph_run_t *run;
} live_sink_t;

static void
live_output(void *opaque, int stream, const char *data, size_t bytes)
{
  live_sink_t *sink = opaque;
  sink->host->output(sink->run, stream, data, bytes);
}

static bool
host_has_output(const eph_host_t *host)
{
  return host->struct_size >= offsetof(eph_host_t, output) + sizeof host->output && host->output;
}

static int
shell_call(void *state, const eph_tool_call_t *call, json_object **result, eph_error_t *err)
{
  shell_state_t *s = state;
  json_object *v;
  if (!json_object_object_get_ex(call->args, "command", &v) ||
      !json_object_is_type(v, json_type_string) || json_object_get_string_len(v) == 0) {
    *result = tool_error("'command' is required and must be a non-empty string");
    return 0;
  }
  const char *command = json_object_get_string(v);
  /* A NUL ends the C string the guest runs: "echo SHOWN\u0000; echo HIDDEN" ran the first
   * part while the record kept the whole (red-team finding). What runs is what was asked. */
  if (strlen(command) != (size_t)json_object_get_string_len(v)) {
    *result = tool_error("'command' must not contain a NUL character (\\u0000)");
    return 0;
  }
  int64_t timeout_s = s->default_timeout_s;
  if (json_object_object_get_ex(call->args, "timeout_seconds", &v) &&
      !json_object_is_type(v, json_type_null)) {
    if (!json_object_is_type(v, json_type_int) || json_object_get_int64(v) < 1) {
      *result = tool_error("'timeout_seconds' must be a positive integer");
      return 0;
    }
    timeout_s = json_object_get_int64(v);
  }
  if (timeout_s > s->max_timeout_s)
    timeout_s = s->max_timeout_s;
  int64_t timeout_ms = timeout_s * 1000;
  if (call->deadline_ms > 0) {
    int64_t left = call->deadline_ms - eph_now_ms();
    if (left <= 0) {
      *result = tool_error("the run's deadline has passed");
      return 0;
    }
    if (left < timeout_ms)
      timeout_ms = left;
  }

  eph_exec_request_t req = {
      .struct_size = sizeof req,
      .command = command,
      .timeout_ms = (uint32_t)timeout_ms,
      .output_cap_bytes = (size_t)s->output_cap_bytes,
  };
  live_sink_t sink = {.host = s->host, .run = call->run};
  if (host_has_output(s->host)) {
    req.on_output = live_output;
    req.opaque = &sink;
  }
  eph_exec_result_t res = {.struct_size = sizeof res};
  int r = s->host->sandbox_exec(call->run, &req, &res, err);
  if (r < 0)
    return r;
  json_object *o = json_object_new_object();
  json_object_object_add(o, "exit_code",
                         json_object_new_int(res.signal ? 128 + res.signal : res.exit_code));
  if (res.signal)
    json_object_object_add(o, "signal", json_object_new_int(res.signal));
  json_object_object_add(o, "reason", json_object_new_string(eph_end_reason_name(res.reason)));
  json_object_object_add(o, "stdout",
                         utf8_string(res.stdout_text ? res.stdout_text : "", res.stdout_bytes));
  json_object_object_add(o, "stderr",
                         utf8_string(res.stderr_text ? res.stderr_text : "", res.stderr_bytes));
  json_object_object_add(o, "stdout_truncated", json_object_new_boolean(res.stdout_truncated));
  json_object_object_add(o, "stderr_truncated", json_object_new_boolean(res.stderr_truncated));
  json_object_object_add(o, "duration_ms", json_object_new_int64(res.duration_ms));
  s->host->exec_result_clear(&res);
  *result = o;
  return 0;
}

static const eph_tool_ops_t shell_ops = {
    .struct_size = sizeof shell_ops,
    .tools = shell_tools,
    .n_tools = sizeof shell_tools / sizeof shell_tools[0],
    .call = shell_call,
};

EPH_PLUGIN_EXPORT = {
    .abi_major = EPH_ABI_MAJOR,
    .abi_minor = EPH_ABI_MINOR,
    .struct_size = sizeof(eph_plugin_t),
    .name = "tool-shell",
    .kind = EPH_KIND_TOOL,
    .version = "0.1.0",
    .description = "shell: run a command as the worker inside the sandbox",
    .config_keys = shell_keys,
    .init = shell_init,
    .fini = shell_fini,
    .ops = &shell_ops,
};
