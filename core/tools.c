/* The tool index (which loaded plugin serves which tool, what a run's model is offered) and
 * one tool call through the gate. */
#include <config.h>

#include <errno.h>
#include <string.h>

#include "log.h"
#include "run_int.h"
#include "util.h"

/* The one walk over the tools: a plugin without call() offers none. */
bool
eph_tools_next(const eph_ctx_t *ctx, size_t *cursor, eph_tool_ref_t *out)
{
  /* The cursor packs (plugin index, tool index) so callers keep one size_t. */
  size_t i = *cursor >> 16, j = *cursor & 0xffff;
  for (; i < ctx->plugins.n; i++, j = 0) {
    const eph_plugin_slot_t *s = &ctx->plugins.slots[i];
    if (s->desc->kind != EPH_KIND_TOOL)
      continue;
    const eph_tool_ops_t *ops = s->desc->ops;
    if (!EPH_OPS_HAS(ops, eph_tool_ops_t, call) || j >= ops->n_tools)
      continue;
    out->slot = s;
    out->def = &ops->tools[j];
    *cursor = (i << 16) | (j + 1);
    return true;
  }
  *cursor = i << 16;
  return false;
}

/* True when a loaded tool plugin offers a tool of permission row p. */
static bool
tool_loaded_for(const eph_ctx_t *ctx, eph_permission_t p)
{
  eph_tool_ref_t ref;
  for (size_t c = 0; eph_tools_next(ctx, &c, &ref);)
    if (ref.def->permission == p)
      return true;
  return false;
}

/* A granted row no loaded plugin serves (its plugin disabled or refused at load) would
 * reserve, boot, report "shell on" and then deny every call as an unknown tool: refused
 * before anything is reserved instead. */
/* The permission rows and the plugin that serves each in the shipped conf.d. */
static const struct {
  eph_permission_t p;
  const char *field, *plugin;
} rows[] = {
    {EPH_PERM_SHELL, "shell", "tool-shell"},
    {EPH_PERM_WEB, "web", "tool-web"},
    {EPH_PERM_FILES, "files", "tool-file"},
    {EPH_PERM_CONNECTIONS, "connections", "tool-connection"},
};

static bool
row_granted(eph_permission_t p, bool shell, bool web, bool files, bool connections)
{
  return p == EPH_PERM_SHELL   ? shell
         : p == EPH_PERM_WEB   ? web
         : p == EPH_PERM_FILES ? files
                               : connections;
}

bool
eph_tools_block_wanted(const char *block, const eph_request_t *req)
{
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
    if (strcmp(block, rows[i].plugin) == 0)
      return row_granted(rows[i].p, req->shell, req->web, req->files_granted,
                         req->n_connections > 0);
  return true; /* not a shipped tool plugin: what it serves is only known once loaded */
}

int
eph_tools_load_blocks(eph_ctx_t *ctx, const eph_request_t *req)
{
  if (!ctx->lazy_plugins)
    return 0;
  int loaded = 0;
  for (size_t i = 0; i < ctx->config.n_blocks; i++) {
    const eph_config_block_t *b = &ctx->config.blocks[i];
    if (!b->enabled || strncmp(b->name, "tool-", 5) != 0 ||
        eph_plugins_find(&ctx->plugins, b->name) || (req && !eph_tools_block_wanted(b->name, req)))
      continue;
    loaded +=
        eph_plugins_load_logged(&ctx->plugins, &ctx->config, ctx->plugin_dir, &ctx->host, b->name);
  }
  return loaded;
}

int
eph_tools_check_grants(const eph_ctx_t *ctx, const eph_gate_t *g, eph_error_t *err)
{
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    bool granted = row_granted(rows[i].p, g->shell, g->web, g->files, g->n_connections > 0);
    if (granted && !tool_loaded_for(ctx, rows[i].p))
      return eph_error_set(err, EINVAL,
                           "field '%s': granted, but no loaded plugin provides "
                           "it (is %s enabled and loading? see `ephemeral plugins`)",
                           rows[i].field, rows[i].plugin);
  }
  return 0;
}

static const char *
perm_source(eph_permission_t p)
{
  switch (p) {
  case EPH_PERM_SHELL:
    return "Shell";
  case EPH_PERM_WEB:
    return "Web";
  case EPH_PERM_FILES:
    return "Files";
  case EPH_PERM_CONNECTIONS:
    return "Connection";
  }
  return "Tool";
}

static bool
find_tool(eph_run_t *run, const char *name, eph_tool_ref_t *out)
{
  for (size_t c = 0; eph_tools_next(run->ctx, &c, out);)
    if (strcmp(out->def->name, name) == 0)
      return true;
  /* A lazy context loaded the tool plugins of the granted rows only (eph_run_load_plugins):
   * a model asking for another tool gets the same answer as with all of them loaded (the
   * gate's denial naming the row, or "unknown tool"), so they load now, on this rare path.
   * (eph_tools_load_blocks lives here, below run.c: the run loads through it.) */
  if (eph_tools_load_blocks(run->ctx, NULL) > 0)
    for (size_t c = 0; eph_tools_next(run->ctx, &c, out);)
      if (strcmp(out->def->name, name) == 0)
        return true;
  return false;
}

/* Only the tools the permission table grants are offered to the model. */
json_object *
eph_tools_offered(eph_run_t *run)
{
  json_object *tools = json_object_new_array();
  eph_tool_ref_t ref;
  for (size_t c = 0; eph_tools_next(run->ctx, &c, &ref);) {
    const eph_tool_def_t *d = ref.def;
    if (!eph_gate_permits(&run->gate, d->permission))
      continue;
    json_object *params = json_tokener_parse(d->parameters_json);
    if (!params) {
      eph_warn("%s: tool '%s' has invalid parameters JSON; not offered", ref.slot->desc->name,
               d->name);
      continue;
    }
    json_object *fn = json_object_new_object();
    json_object_object_add(fn, "name", json_object_new_string(d->name));
    json_object_object_add(fn, "description", json_object_new_string(d->description));
    json_object_object_add(fn, "parameters", params);
    json_object *t = json_object_new_object();
    json_object_object_add(t, "type", json_object_new_string("function"));
    json_object_object_add(t, "function", fn);
    json_object_array_add(tools, t);
  }
  return tools;
}

static json_object *
tool_message(const char *call_id, json_object *result)
{
  json_object *m = json_object_new_object();
  json_object_object_add(m, "role", json_object_new_string("tool"));
  json_object_object_add(m, "tool_call_id", json_object_new_string(call_id ? call_id : ""));
  json_object_object_add(
      m, "content",
      json_object_new_string(json_object_to_json_string_ext(result, JSON_C_TO_STRING_PLAIN)));
  return m;
}

static json_object *
error_result(const char *msg)
{
  json_object *o = json_object_new_object();
  json_object_object_add(o, "error", json_object_new_string(msg));
  return o;
}

/* A one-line description of a call for the timeline: "$ cmd" for the shell. */
static char *
call_text(const char *name, json_object *args)
{
  json_object *cmd = NULL;
  if (strcmp(name, "shell") == 0 && json_object_object_get_ex(args, "command", &cmd) &&
      json_object_is_type(cmd, json_type_string))
    return eph_xasprintf("$ %s", json_object_get_string(cmd));
  const char *a = json_object_to_json_string_ext(args, JSON_C_TO_STRING_PLAIN);
  return eph_xasprintf("%s %.300s", name, a);
}

static char *
result_text(json_object *result)
{
  json_object *x;
  if (json_object_object_get_ex(result, "error", &x))
    return eph_xasprintf("error: %.200s", json_object_get_string(x));
  if (json_object_object_get_ex(result, "exit_code", &x)) {
    json_object *d = NULL, *reason = NULL;
    json_object_object_get_ex(result, "duration_ms", &d);
    json_object_object_get_ex(result, "reason", &reason);
    const char *why = reason ? json_object_get_string(reason) : "exited";
    if (strcmp(why, "exited") != 0)
      return eph_xasprintf("%s · %.2f s", why, d ? json_object_get_int64(d) / 1000.0 : 0.0);
    return eph_xasprintf("exit %d · %.2f s", json_object_get_int(x),
                         d ? json_object_get_int64(d) / 1000.0 : 0.0);
  }
  if (json_object_object_get_ex(result, "status", &x))
    return eph_xasprintf("HTTP %d", json_object_get_int(x));
  return eph_xstrdup("done");
}

/* Runs one tool call through the gate. Appends the tool message to `messages`. */
void
eph_tools_call(eph_run_t *run, json_object *tc, json_object *messages)
{
  json_object *id = NULL, *fn = NULL, *jname = NULL, *jargs = NULL;
  json_object_object_get_ex(tc, "id", &id);
  json_object_object_get_ex(tc, "function", &fn);
  if (fn) {
    json_object_object_get_ex(fn, "name", &jname);
    json_object_object_get_ex(fn, "arguments", &jargs);
  }
  const char *call_id = id ? json_object_get_string(id) : "";
  const char *name = jname ? json_object_get_string(jname) : "";
  cleanup_json json_object *args = NULL;
  if (jargs && json_object_is_type(jargs, json_type_string))
    args = json_tokener_parse(json_object_get_string(jargs));
  else if (jargs && json_object_is_type(jargs, json_type_object))
    args = json_object_get(jargs);

  eph_tool_ref_t ref = {0};
  if (!find_tool(run, name, &ref)) {
    cleanup_json json_object *res = error_result("unknown tool: no such tool is available");
    eph_run_emit(run, "Gate", "denied", true, NULL, "%.64s denied: unknown tool", name);
    json_object_array_add(messages, tool_message(call_id, res));
    return;
  }
  const char *source = perm_source(ref.def->permission);
  char why[256];
  if (eph_gate_check_tool(&run->gate, ref.def, args, why, sizeof why) < 0) {
    /* The plugin is never entered: the model gets a plain denial, the timeline an event. */
    cleanup_json json_object *res = error_result(why);
    json_object *d = json_object_new_object();
    json_object_object_add(d, "tool", json_object_new_string(name));
    json_object_object_add(d, "reason", json_object_new_string(why));
    eph_run_emit(run, source, "denied", false, d, "%s denied: %s", name, why);
    json_object_array_add(messages, tool_message(call_id, res));
    return;
  }
  if (!args || !json_object_is_type(args, json_type_object)) {
    cleanup_json json_object *res = error_result("arguments must be a JSON object");
    json_object_array_add(messages, tool_message(call_id, res));
    return;
  }
  cleanup_free char *text = call_text(name, args);
  json_object *d = json_object_new_object();
  json_object_object_add(d, "tool", json_object_new_string(name));
  json_object_object_add(d, "call_id", json_object_new_string(call_id));
  json_object_object_add(d, "arguments", json_object_get(args));
  eph_run_emit(run, source, "tool_call", true, d, "%s", text);

  eph_tool_call_t call = {
      .struct_size = sizeof call,
      .run_id = run->id,
      .tool = name,
      .args = args,
      .grants = run->grants,
      .zero_data_retention = run->req.zero_data_retention,
      .deadline_ms = run->deadline_ms,
      .run = run,
  };
  const eph_tool_ops_t *ops = ref.slot->desc->ops;
  json_object *result = NULL;
  eph_error_t err = {0};
  int64_t t0 = eph_now_ms();
  run->live_call_id = call_id;
  run->live_source = source;
  int r = EPH_WITH_PLUGIN(ref.slot, ops->call(ref.slot->state, &call, &result, &err));
  run->live_call_id = NULL;
  if (r < 0 || !result) {
    if (result)
      json_object_put(result);
    result = error_result(r < 0 ? err.message : "the tool returned nothing");
    eph_warn("run %s: tool %s failed: %s", run->id, name,
             run->req.zero_data_retention ? "(redacted)" : err.message);
  }
  cleanup_free char *rtext = result_text(result);
  json_object *rd = json_object_new_object();
  json_object_object_add(rd, "tool", json_object_new_string(name));
  json_object_object_add(rd, "call_id", json_object_new_string(call_id));
  /* The timeline keeps a run's results up to max_stored_results_bytes together: 64
   * file_reads of 1 MiB in one turn stored 67 MB in one record for $0.0008 (red-team
   * finding). Past it a result is kept as its size; the model is given it whole. */
  int64_t rbytes = (int64_t)strlen(json_object_to_json_string_ext(result, JSON_C_TO_STRING_PLAIN));
  if (rbytes > run->max_stored_results_bytes - run->stored_results_bytes) {
    json_object *kept = json_object_new_object();
    json_object_object_add(kept, "not_stored", json_object_new_boolean(1));
    json_object_object_add(kept, "bytes", json_object_new_int64(rbytes));
    json_object_object_add(
        kept, "reason",
        json_object_new_string("the run's stored tool results reached max_stored_results_bytes"));
    json_object_object_add(rd, "result", kept);
  } else {
    run->stored_results_bytes += rbytes;
    json_object_object_add(rd, "result", json_object_get(result));
  }
  json_object_object_add(rd, "duration_ms", json_object_new_int64(eph_now_ms() - t0));
  eph_run_emit(run, source, "tool_result", true, rd, "%s", rtext);
  json_object_array_add(messages, tool_message(call_id, result));
  json_object_put(result);
}
