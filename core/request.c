#include <config.h>

#include "request.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <strings.h>
#include <stdio.h>
#include <string.h>

#include "loader.h"
#include "log.h"
#include "util.h"

static _Thread_local char field_buf[128];

static int field_error(const char **field, eph_error_t *err, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int
field_error(const char **field, eph_error_t *err, const char *name, const char *fmt, ...)
{
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(field_buf, sizeof field_buf, "%s", name);
  if (field)
    *field = field_buf;
  return eph_error_set(err, EINVAL, "field '%s': %s", name, msg);
}

static const char *
type_word(json_type t)
{
  switch (t) {
  case json_type_null:
    return "null";
  case json_type_boolean:
    return "a boolean";
  case json_type_double:
    return "a number with a fraction";
  case json_type_int:
    return "an integer";
  case json_type_object:
    return "an object";
  case json_type_array:
    return "an array";
  case json_type_string:
    return "a string";
  }
  return "?";
}

/* What v is, for an error: json-c 0.16 takes NaN, Infinity and numbers past a double's
 * range (1e999) even in strict mode (json_strict.h), which RFC 8259 section 6 does not
 * permit; they are named as such rather than as "a number with a fraction". */
static const char *
value_word(json_object *v)
{
  if (json_object_is_type(v, json_type_double) && !isfinite(json_object_get_double(v)))
    return "NaN, Infinity or a number out of range (not JSON: RFC 8259 section 6)";
  return type_word(json_object_get_type(v));
}

static int
want_type(json_object *v, json_type t, const char *name, const char **field, eph_error_t *err)
{
  if (json_object_is_type(v, t))
    return 0;
  return field_error(field, err, name, "expected %s, got %s", type_word(t), value_word(v));
}

static int
get_int(json_object *v, const char *name, int64_t lo, int64_t hi, const char *hi_what, int64_t *out,
        const char **field, eph_error_t *err)
{
  int r = want_type(v, json_type_int, name, field, err);
  if (r < 0)
    return r;
  errno = 0;
  int64_t x = json_object_get_int64(v);
  if (errno == ERANGE)
    return field_error(field, err, name, "out of range");
  if (x < lo)
    return field_error(field, err, name, "must be at least %lld", (long long)lo);
  if (x > hi)
    return field_error(field, err, name, "%lld is above %s (%lld); it is refused, not clamped",
                       (long long)x, hi_what, (long long)hi);
  *out = x;
  return 0;
}

/* True when JSON string v holds no NUL: json-c keeps a "\u0000" inside a string, and a C
 * copy of it would silently end there, naming something other than what the client sent. */
static bool
no_nul(json_object *v)
{
  return strlen(json_object_get_string(v)) == (size_t)json_object_get_string_len(v);
}

/* A scratch-relative path: no absolute path, no "..", no empty or "." segments, no NUL. */
static bool
safe_relative_path(const char *p, size_t len)
{
  if (len == 0 || len > 1024 || p[0] == '/' || strlen(p) != len)
    return false;
  const char *seg = p;
  for (size_t i = 0; i <= len; i++) {
    if (i == len || p[i] == '/') {
      size_t n = (size_t)(p + i - seg);
      if (n == 0 || (n == 1 && seg[0] == '.') || (n == 2 && seg[0] == '.' && seg[1] == '.'))
        return false;
      seg = p + i + 1;
    }
  }
  return true;
}

static int
parse_files(json_object *v, const eph_request_limits_t *limits, eph_request_t *req,
            const char **field, eph_error_t *err)
{
  int r = want_type(v, json_type_array, "files", field, err);
  if (r < 0)
    return r;
  size_t n = json_object_array_length(v);
  if (n > EPH_FILES_MAX_COUNT)
    return field_error(field, err, "files", "at most %d files", EPH_FILES_MAX_COUNT);
  req->files_granted = true;
  req->files = eph_xcalloc(n, sizeof *req->files);
  char name[64];
  for (size_t i = 0; i < n; i++) {
    json_object *f = json_object_array_get_idx(v, i), *x;
    snprintf(name, sizeof name, "files[%zu]", i);
    if (!json_object_is_type(f, json_type_object))
      return field_error(field, err, name,
                         "expected an object {\"path\", \"content\"[, \"encoding\"]}: the file's "
                         "path inside scratch and its content, inline");
    const char *encoding = "utf-8";
    json_object_object_foreach(f, key, val) {
      snprintf(name, sizeof name, "files[%zu].%s", i, key);
      if (strcmp(key, "encoding") == 0) {
        if ((r = want_type(val, json_type_string, name, field, err)) < 0)
          return r;
        encoding = json_object_get_string(val);
        if (strcmp(encoding, "utf-8") != 0 && strcmp(encoding, "base64") != 0)
          return field_error(field, err, name, "must be \"utf-8\" or \"base64\"");
      } else if (strcmp(key, "path") != 0 && strcmp(key, "content") != 0) {
        return field_error(field, err, name, "unknown field (a file has path, content, encoding)");
      }
    }
    snprintf(name, sizeof name, "files[%zu].path", i);
    if (!json_object_object_get_ex(f, "path", &x))
      return field_error(field, err, name, "required");
    if ((r = want_type(x, json_type_string, name, field, err)) < 0)
      return r;
    if (!safe_relative_path(json_object_get_string(x), (size_t)json_object_get_string_len(x)))
      return field_error(field, err, name,
                         "must be a relative path inside scratch (no '..', not absolute)");
    for (size_t j = 0; j < i; j++)
      if (strcmp(req->files[j].path, json_object_get_string(x)) == 0)
        return field_error(field, err, name, "duplicate path");
    eph_inline_file_t *out = &req->files[req->n_files++];
    out->path = eph_xstrdup(json_object_get_string(x));
    snprintf(name, sizeof name, "files[%zu].content", i);
    if (!json_object_object_get_ex(f, "content", &x))
      return field_error(field, err, name, "required");
    if ((r = want_type(x, json_type_string, name, field, err)) < 0)
      return r;
    const char *content = json_object_get_string(x);
    size_t len = (size_t)json_object_get_string_len(x);
    if (strcmp(encoding, "base64") == 0) {
      if (eph_base64_decode(content, len, &out->data, &out->bytes) < 0)
        return field_error(field, err, name, "invalid base64");
    } else {
      out->data = eph_xmalloc(len + 1);
      memcpy(out->data, content, len);
      out->bytes = len;
    }
    req->files_total_bytes += out->bytes;
    if (req->files_total_bytes > limits->max_files_total_bytes)
      return field_error(field, err, name, "inline files exceed %zu bytes in total",
                         limits->max_files_total_bytes);
  }
  return 0;
}

static int
parse_connections(json_object *v, eph_request_t *req, const char **field, eph_error_t *err)
{
  int r = want_type(v, json_type_array, "connections", field, err);
  if (r < 0)
    return r;
  size_t n = json_object_array_length(v);
  req->connections = eph_xcalloc(n, sizeof *req->connections);
  char name[64];
  for (size_t i = 0; i < n; i++) {
    json_object *c = json_object_array_get_idx(v, i), *x;
    snprintf(name, sizeof name, "connections[%zu]", i);
    /* Counted before it is filled, so a failure half-way is still freed. */
    eph_connection_grant_t *g = &req->connections[req->n_connections++];
    if (json_object_is_type(c, json_type_string)) {
      if (!no_nul(c))
        return field_error(field, err, name, "connection name must not contain NUL");
      g->name = eph_xstrdup(json_object_get_string(c));
    } else {
      if ((r = want_type(c, json_type_object, name, field, err)) < 0)
        return r;
      json_object_object_foreach(c, key, val) {
        (void)val;
        if (strcmp(key, "name") != 0 && strcmp(key, "methods") != 0) {
          snprintf(name, sizeof name, "connections[%zu].%s", i, key);
          return field_error(field, err, name, "unknown field (a connection has name, methods)");
        }
      }
      snprintf(name, sizeof name, "connections[%zu].name", i);
      if (!json_object_object_get_ex(c, "name", &x))
        return field_error(field, err, name, "required");
      if ((r = want_type(x, json_type_string, name, field, err)) < 0)
        return r;
      if (!no_nul(x))
        return field_error(field, err, name, "connection name must not contain NUL");
      g->name = eph_xstrdup(json_object_get_string(x));
      if (json_object_object_get_ex(c, "methods", &x)) {
        snprintf(name, sizeof name, "connections[%zu].methods", i);
        if ((r = want_type(x, json_type_array, name, field, err)) < 0)
          return r;
        size_t m = json_object_array_length(x);
        g->methods = eph_xcalloc(m, sizeof *g->methods);
        for (size_t j = 0; j < m; j++) {
          json_object *meth = json_object_array_get_idx(x, j);
          snprintf(name, sizeof name, "connections[%zu].methods[%zu]", i, j);
          if ((r = want_type(meth, json_type_string, name, field, err)) < 0)
            return r;
          static const char *const known[] = {"GET",    "HEAD",  "POST",    "PUT",
                                              "DELETE", "PATCH", "OPTIONS", NULL};
          const char *s = json_object_get_string(meth);
          bool ok = false;
          for (const char *const *k = known; *k; k++)
            ok |= strcasecmp(*k, s) == 0;
          if (!ok || !no_nul(meth))
            return field_error(field, err, name, "unknown HTTP method '%.32s'", s);
          g->methods[g->n_methods] = eph_xstrdup(s);
          for (char *p = g->methods[g->n_methods]; *p; p++)
            *p = (char)toupper((unsigned char)*p);
          g->n_methods++;
        }
      }
    }
    if (!g->name[0] || strlen(g->name) > 64)
      return field_error(field, err, name, "connection name must be 1..64 characters");
  }
  return 0;
}

/* True when a loaded tool plugin says the operator defined connection `name`. */
static bool
connection_defined(const eph_plugins_t *ps, const char *name)
{
  for (size_t i = 0; i < ps->n; i++) {
    const eph_plugin_slot_t *s = &ps->slots[i];
    if (s->desc->kind != EPH_KIND_TOOL)
      continue;
    const eph_tool_ops_t *ops = s->desc->ops;
    if (EPH_OPS_HAS(ops, eph_tool_ops_t, connection_defined) &&
        EPH_WITH_PLUGIN(s, ops->connection_defined(s->state, name)) == 1)
      return true;
  }
  return false;
}

/* A grant of a connection nobody defined would be admitted, reserved and billed for a run
 * whose every call to it is refused: refused here instead, before anything exists. */
static int
check_connections(const eph_request_t *req, const eph_plugins_t *ps, const char **field,
                  eph_error_t *err)
{
  for (size_t i = 0; i < req->n_connections; i++) {
    if (connection_defined(ps, req->connections[i].name))
      continue;
    char name[64];
    snprintf(name, sizeof name, "connections[%zu].name", i);
    return field_error(field, err, name,
                       "no connection '%.64s' is defined on this server (the operator defines "
                       "connections in tool-connection's configuration)",
                       req->connections[i].name);
  }
  return 0;
}

static int
parse_outputs(json_object *v, eph_request_t *req, const char **field, eph_error_t *err)
{
  int r = want_type(v, json_type_array, "outputs", field, err);
  if (r < 0)
    return r;
  size_t n = json_object_array_length(v);
  if (n > EPH_OUTPUTS_MAX_COUNT)
    return field_error(field, err, "outputs", "at most %d paths", EPH_OUTPUTS_MAX_COUNT);
  req->outputs = eph_xcalloc(n, sizeof *req->outputs);
  char name[64];
  for (size_t i = 0; i < n; i++) {
    json_object *p = json_object_array_get_idx(v, i);
    snprintf(name, sizeof name, "outputs[%zu]", i);
    if ((r = want_type(p, json_type_string, name, field, err)) < 0)
      return r;
    if (!safe_relative_path(json_object_get_string(p), (size_t)json_object_get_string_len(p)))
      return field_error(field, err, name, "must be a relative path inside scratch");
    req->outputs[req->n_outputs++] = eph_xstrdup(json_object_get_string(p));
  }
  return 0;
}

static int
parse_metadata(json_object *v, eph_request_t *req, const char **field, eph_error_t *err)
{
  int r = want_type(v, json_type_object, "metadata", field, err);
  if (r < 0)
    return r;
  if (json_object_object_length(v) > EPH_METADATA_MAX_PAIRS)
    return field_error(field, err, "metadata", "at most %d keys", EPH_METADATA_MAX_PAIRS);
  char name[600];
  json_object_object_foreach(v, key, val) {
    snprintf(name, sizeof name, "metadata.%.64s", key);
    if ((r = want_type(val, json_type_string, name, field, err)) < 0)
      return r;
    if (strlen(key) > 64 || json_object_get_string_len(val) > EPH_METADATA_MAX_BYTES)
      return field_error(field, err, name, "keys are at most 64 bytes, values %d",
                         EPH_METADATA_MAX_BYTES);
  }
  req->metadata = json_object_get(v);
  return 0;
}

int
eph_request_parse(const char *json, size_t len, const eph_request_limits_t *limits,
                  eph_request_t *req, const char **field, eph_error_t *err)
{
  memset(req, 0, sizeof *req);
  if (field)
    *field = NULL;
  /* Invalid UTF-8 would reach the model API (which refuses it after the budget is
   * reserved and the sandbox booted), the store and every JSON client of the timeline. */
  json_object *root = eph_json_parse_strict(json, len, err);
  if (!root)
    return -EBADMSG;
  int r = 0;
  if (!json_object_is_type(root, json_type_object)) {
    r = eph_error_set(err, EINVAL, "the request must be a JSON object");
    goto out;
  }
  bool have_timeout = false, have_cost = false, have_prompt = false;
  json_object_object_foreach(root, key, v) {
    if (strcmp(key, "prompt") == 0) {
      if ((r = want_type(v, json_type_string, key, field, err)) < 0)
        goto out;
      size_t n = (size_t)json_object_get_string_len(v);
      if (n == 0 || n > EPH_PROMPT_MAX_BYTES || strlen(json_object_get_string(v)) != n) {
        r = field_error(field, err, key, "must be 1..%d bytes of text", EPH_PROMPT_MAX_BYTES);
        goto out;
      }
      req->prompt = eph_xstrdup(json_object_get_string(v));
      have_prompt = true;
    } else if (strcmp(key, "model") == 0) {
      if ((r = want_type(v, json_type_string, key, field, err)) < 0)
        goto out;
      if (json_object_get_string_len(v) == 0 || json_object_get_string_len(v) > 4096 ||
          !no_nul(v)) {
        r = field_error(field, err, key, "must be a non-empty model name without NUL");
        goto out;
      }
      req->model = eph_xstrdup(json_object_get_string(v));
    } else if (strcmp(key, "shell") == 0 || strcmp(key, "web") == 0 ||
               strcmp(key, "zero_data_retention") == 0) {
      if ((r = want_type(v, json_type_boolean, key, field, err)) < 0)
        goto out;
      bool b = json_object_get_boolean(v);
      if (key[0] == 's')
        req->shell = b;
      else if (key[0] == 'w')
        req->web = b;
      else
        req->zero_data_retention = b;
    } else if (strcmp(key, "timeout_seconds") == 0) {
      if ((r = get_int(v, key, 1, limits->max_timeout_seconds, "the operator's maximum",
                       &req->timeout_seconds, field, err)) < 0)
        goto out;
      have_timeout = true;
    } else if (strcmp(key, "max_cost_micros") == 0) {
      if ((r = get_int(v, key, 1, limits->max_cost_micros, "the operator's maximum",
                       &req->max_cost_micros, field, err)) < 0)
        goto out;
      have_cost = true;
    } else if (strcmp(key, "files") == 0) {
      if ((r = parse_files(v, limits, req, field, err)) < 0)
        goto out;
    } else if (strcmp(key, "connections") == 0) {
      if ((r = parse_connections(v, req, field, err)) < 0)
        goto out;
    } else if (strcmp(key, "outputs") == 0) {
      if ((r = parse_outputs(v, req, field, err)) < 0)
        goto out;
    } else if (strcmp(key, "metadata") == 0) {
      if ((r = parse_metadata(v, req, field, err)) < 0)
        goto out;
    } else if (strcmp(key, "webhook_url") == 0) {
      if ((r = want_type(v, json_type_string, key, field, err)) < 0)
        goto out;
      const char *u = json_object_get_string(v);
      size_t n = (size_t)json_object_get_string_len(v);
      if (n > 2048 || strlen(u) != n ||
          (strncmp(u, "http://", 7) != 0 && strncmp(u, "https://", 8) != 0)) {
        r = field_error(field, err, key,
                        "must be an http:// or https:// URL of at most 2048 "
                        "bytes");
        goto out;
      }
      req->webhook_url = eph_xstrdup(u);
    } else {
      r = field_error(field, err, key,
                      "unknown field (request v1 has prompt, model, shell, "
                      "web, files, connections, outputs, timeout_seconds, "
                      "max_cost_micros, zero_data_retention, metadata, "
                      "webhook_url)");
      goto out;
    }
  }
  if (!have_prompt)
    r = field_error(field, err, "prompt", "required");
  else if (!have_timeout)
    r = field_error(field, err, "timeout_seconds", "required");
  else if (!have_cost)
    r = field_error(field, err, "max_cost_micros", "required");
  if (r == 0 && !req->model)
    req->model = eph_xstrdup(limits->default_model ? limits->default_model : "openai/gpt-6-luna");
  if (r == 0 && limits->plugins)
    r = check_connections(req, limits->plugins, field, err);
out:
  json_object_put(root);
  if (r < 0)
    eph_request_free(req);
  return r;
}

void
eph_request_free(eph_request_t *req)
{
  free(req->prompt);
  free(req->model);
  for (size_t i = 0; i < req->n_files; i++) {
    free(req->files[i].path);
    free(req->files[i].data);
  }
  free(req->files);
  for (size_t i = 0; i < req->n_connections; i++) {
    free(req->connections[i].name);
    for (size_t j = 0; j < req->connections[i].n_methods; j++)
      free(req->connections[i].methods[j]);
    free(req->connections[i].methods);
  }
  free(req->connections);
  for (size_t i = 0; i < req->n_outputs; i++)
    free(req->outputs[i]);
  free(req->outputs);
  if (req->metadata)
    json_object_put(req->metadata);
  free(req->webhook_url);
  memset(req, 0, sizeof *req);
}

static json_object *
connections_json(const eph_request_t *req)
{
  json_object *a = json_object_new_array();
  for (size_t i = 0; i < req->n_connections; i++) {
    json_object *c = json_object_new_object();
    json_object_object_add(c, "name", json_object_new_string(req->connections[i].name));
    if (req->connections[i].methods) {
      json_object *m = json_object_new_array();
      for (size_t j = 0; j < req->connections[i].n_methods; j++)
        json_object_array_add(m, json_object_new_string(req->connections[i].methods[j]));
      json_object_object_add(c, "methods", m);
    }
    json_object_array_add(a, c);
  }
  return a;
}

json_object *
eph_request_to_json(const eph_request_t *req)
{
  json_object *o = json_object_new_object();
  if (!req->zero_data_retention)
    json_object_object_add(o, "prompt", json_object_new_string(req->prompt));
  json_object_object_add(o, "model", json_object_new_string(req->model));
  json_object_object_add(o, "shell", json_object_new_boolean(req->shell));
  json_object_object_add(o, "web", json_object_new_boolean(req->web));
  if (req->files_granted) {
    json_object *files = json_object_new_array();
    for (size_t i = 0; i < req->n_files; i++) {
      json_object *f = json_object_new_object();
      if (!req->zero_data_retention)
        json_object_object_add(f, "path", json_object_new_string(req->files[i].path));
      json_object_object_add(f, "bytes", json_object_new_int64((int64_t)req->files[i].bytes));
      json_object_array_add(files, f);
    }
    json_object_object_add(o, "files", files);
  }
  json_object_object_add(o, "connections", connections_json(req));
  if (req->n_outputs) {
    json_object *outs = json_object_new_array();
    for (size_t i = 0; i < req->n_outputs; i++)
      json_object_array_add(outs, json_object_new_string(req->outputs[i]));
    json_object_object_add(o, "outputs", outs);
  }
  json_object_object_add(o, "timeout_seconds", json_object_new_int64(req->timeout_seconds));
  json_object_object_add(o, "max_cost_micros", json_object_new_int64(req->max_cost_micros));
  json_object_object_add(o, "zero_data_retention",
                         json_object_new_boolean(req->zero_data_retention));
  if (req->metadata)
    json_object_object_add(o, "metadata", json_object_get(req->metadata));
  if (req->webhook_url)
    json_object_object_add(o, "webhook_url", json_object_new_string(req->webhook_url));
  return o;
}

json_object *
eph_request_grants(const eph_request_t *req)
{
  json_object *o = json_object_new_object();
  json_object_object_add(o, "shell", json_object_new_boolean(req->shell));
  json_object_object_add(o, "web", json_object_new_boolean(req->web));
  json_object_object_add(o, "files", json_object_new_boolean(req->files_granted));
  json_object_object_add(o, "connections", connections_json(req));
  return o;
}
