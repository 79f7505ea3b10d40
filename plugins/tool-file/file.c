/* tool-file: file_read, file_write and file_list in the sandbox's scratch directory.
 * The confinement itself lives in the guest (openat2 RESOLVE_BENEATH | NO_MAGICLINKS |
 * NO_SYMLINKS beneath scratch, inside the sandbox); this plugin refuses the obvious escapes
 * before they cross the wire (absolute paths, '..' segments), enforces the configured size
 * caps, and moves bytes exactly: text as UTF-8, anything else as base64. */
#include "config.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <ephemeral/plugin.h>

#include "support/base64.h"
#include "support/cleanup.h"
#include "support/text.h"

typedef struct files {
  const eph_host_t *host;
  int64_t max_read_bytes, max_write_bytes, max_list_entries;
} files_t;

static const eph_config_key_t file_keys[] = {
    {"max_read_bytes", EPH_CFG_INT, "1048576", "bytes",
     "Bytes file_read returns at most (a longer file is truncated and says so).",
     EPH_CFG_RANGE(1, INT64_MAX)},
    {"max_write_bytes", EPH_CFG_INT, "10485760", "bytes",
     "Bytes file_write accepts at most (after base64 decoding).", EPH_CFG_RANGE(1, INT64_MAX)},
    {"max_list_entries", EPH_CFG_INT, "1000", NULL, "Entries file_list returns at most.",
     EPH_CFG_RANGE(1, INT64_MAX)},
    {0},
};

static const eph_tool_def_t file_tools[] = {
    {"file_read",
     "Read a file in the scratch directory. Returns its content as UTF-8 text, or base64 "
     "when it is not text.",
     "{\"type\":\"object\",\"properties\":{"
     "\"path\":{\"type\":\"string\",\"description\":\"relative to scratch\"},"
     "\"max_bytes\":{\"type\":\"integer\",\"minimum\":1}},"
     "\"required\":[\"path\"],\"additionalProperties\":false}",
     EPH_PERM_FILES},
    {"file_write", "Write (create or replace) a file in the scratch directory.",
     "{\"type\":\"object\",\"properties\":{"
     "\"path\":{\"type\":\"string\",\"description\":\"relative to scratch\"},"
     "\"content\":{\"type\":\"string\"},"
     "\"encoding\":{\"type\":\"string\",\"enum\":[\"utf-8\",\"base64\"]}},"
     "\"required\":[\"path\",\"content\"],\"additionalProperties\":false}",
     EPH_PERM_FILES},
    {"file_list", "List a directory in the scratch directory (default: scratch itself).",
     "{\"type\":\"object\",\"properties\":{"
     "\"path\":{\"type\":\"string\",\"description\":\"relative to scratch\"}},"
     "\"additionalProperties\":false}",
     EPH_PERM_FILES},
};

/* NULL when path may be sent to the guest, else why not. The guest confines again (it is
 * the one that can see symlinks); this only stops what is plainly an escape. */
static const char *
path_refusal(const char *path, bool allow_empty)
{
  if (!*path)
    return allow_empty ? NULL : "path is empty";
  if (path[0] == '/')
    return "path must be relative to scratch (no leading '/')";
  if (strlen(path) > 4096)
    return "path is too long";
  for (const char *s = path; *s;) {
    size_t n = strcspn(s, "/");
    if (n == 2 && s[0] == '.' && s[1] == '.')
      return "path must not contain '..'";
    s += n;
    if (*s == '/')
      s++;
  }
  return NULL;
}

static json_object *
refused(files_t *f, const eph_tool_call_t *call, const char *tool, const char *why)
{
  eph_error_t ignore = {0};
  cleanup_json json_object *data = json_object_new_object();
  json_object_object_add(data, "tool", json_object_new_string(tool));
  json_object_object_add(data, "reason", json_object_new_string(why));
  f->host->emit(call->run, "Files", "file_refused", why, data, &ignore);
  return eph_error_result(why);
}

static void
emit_op(files_t *f, const eph_tool_call_t *call, const char *kind, const char *verb,
        const char *path, int64_t bytes)
{
  eph_error_t ignore = {0};
  cleanup_json json_object *data = json_object_new_object();
  cleanup_free char *text = NULL;
  if (bytes >= 0)
    json_object_object_add(data, "bytes", json_object_new_int64(bytes));
  if (call->zero_data_retention) {
    if (asprintf(&text, "%s (path withheld: zero data retention)", verb) < 0)
      return;
  } else {
    json_object_object_add(data, "path", json_object_new_string(path));
    if (asprintf(&text, "%s %s", verb, *path ? path : ".") < 0)
      return;
  }
  f->host->emit(call->run, "Files", kind, text, data, &ignore);
}

static int
do_read(files_t *f, const eph_tool_call_t *call, json_object **result, eph_error_t *err)
{
  const char *path = eph_json_get_string(call->args, "path"), *why;
  json_object *jm = NULL;
  int64_t max = f->max_read_bytes;
  if (!path) {
    *result = eph_error_result("argument 'path' (string) is required");
    return 0;
  }
  if ((why = path_refusal(path, false))) {
    *result = refused(f, call, "file_read", why);
    return 0;
  }
  if (json_object_object_get_ex(call->args, "max_bytes", &jm) && jm) {
    if (!json_object_is_type(jm, json_type_int) || json_object_get_int64(jm) <= 0) {
      *result = eph_error_result("argument 'max_bytes' must be a positive integer");
      return 0;
    }
    if (json_object_get_int64(jm) < max)
      max = json_object_get_int64(jm);
  }
  void *data = NULL;
  size_t bytes = 0;
  int truncated = 0;
  eph_error_t e = {0};
  if (f->host->sandbox_read(call->run, path, (size_t)max, &data, &bytes, &truncated, &e) < 0) {
    free(data);
    if (e.code == EPH_E_PROTOCOL)
      return eph_error_set(err, e.code, "%s", e.message);
    *result = eph_error_result(e.message[0] ? e.message : "read failed");
    return 0;
  }
  if (bytes > (size_t)max) { /* never trust the far side with the cap */
    bytes = (size_t)max;
    truncated = 1;
  }
  json_object *res = json_object_new_object();
  json_object_object_add(res, "path", json_object_new_string(path));
  json_object_object_add(res, "bytes", json_object_new_int64((int64_t)bytes));
  json_object_object_add(res, "truncated", json_object_new_boolean(truncated));
  if (eph_utf8_is_text(data, bytes)) {
    json_object_object_add(res, "encoding", json_object_new_string("utf-8"));
    json_object_object_add(res, "content",
                           json_object_new_string_len(data ? data : "", (int)bytes));
  } else {
    cleanup_free char *enc = eph_base64_encode(data, bytes);
    json_object_object_add(res, "encoding", json_object_new_string("base64"));
    json_object_object_add(res, "content", json_object_new_string(enc ? enc : ""));
  }
  free(data);
  emit_op(f, call, "file_read", "read", path, (int64_t)bytes);
  *result = res;
  return 0;
}

/* The written size, as the sandbox now reports it: a second look, independent of the write
 * reply, so a short write cannot be reported as a success. */
static int
confirm_size(files_t *f, const eph_tool_call_t *call, const char *path, uint64_t *size,
             eph_error_t *err)
{
  cleanup_free char *dir = strdup(path);
  if (!dir)
    return eph_error_set(err, ENOMEM, "out of memory");
  char *slash = strrchr(dir, '/');
  const char *base = path;
  if (slash) {
    *slash = 0;
    base = path + (slash - dir) + 1;
  } else
    dir[0] = 0;
  eph_dirent_t *ents = NULL;
  size_t n = 0;
  int r = f->host->sandbox_list(call->run, dir, &ents, &n, err);
  if (r < 0)
    return r;
  r = eph_error_set(err, ENOENT, "'%s' is not there after the write", path);
  for (size_t i = 0; i < n; i++)
    if (strcmp(ents[i].name, base) == 0 && ents[i].type == 'f') {
      *size = ents[i].size_bytes;
      r = 0;
    }
  f->host->dirents_free(ents, n);
  return r;
}

static int
do_write(files_t *f, const eph_tool_call_t *call, json_object **result, eph_error_t *err)
{
  const char *path = eph_json_get_string(call->args, "path"),
             *enc = eph_json_get_string(call->args, "encoding"), *why;
  json_object *jc = NULL;
  if (!path || !json_object_object_get_ex(call->args, "content", &jc) ||
      !json_object_is_type(jc, json_type_string)) {
    *result = eph_error_result("arguments 'path' and 'content' (strings) are required");
    return 0;
  }
  if ((why = path_refusal(path, false))) {
    *result = refused(f, call, "file_write", why);
    return 0;
  }
  if (path[strlen(path) - 1] == '/') {
    *result = eph_error_result("path names a directory");
    return 0;
  }
  const char *content = json_object_get_string(jc);
  size_t clen = (size_t)json_object_get_string_len(jc);
  cleanup_free unsigned char *decoded = NULL;
  const void *data = content;
  size_t bytes = clen;
  if (enc && strcmp(enc, "base64") == 0) {
    if (clen / 4 * 3 > (size_t)f->max_write_bytes + 3) {
      *result = refused(f, call, "file_write", "content is larger than max_write_bytes");
      return 0;
    }
    if (eph_base64_decode(content, clen, &decoded, &bytes) < 0) {
      *result = eph_error_result("content is not valid base64");
      return 0;
    }
    data = decoded;
  } else if (enc && strcmp(enc, "utf-8") != 0) {
    *result = eph_error_result("encoding must be \"utf-8\" or \"base64\"");
    return 0;
  }
  if (bytes > (size_t)f->max_write_bytes) {
    *result = refused(f, call, "file_write", "content is larger than max_write_bytes");
    return 0;
  }
  eph_error_t e = {0};
  uint64_t size = 0;
  if (f->host->sandbox_write(call->run, path, data, bytes, &e) < 0 ||
      confirm_size(f, call, path, &size, &e) < 0) {
    if (e.code == EPH_E_PROTOCOL)
      return eph_error_set(err, e.code, "%s", e.message);
    *result = eph_error_result(e.message[0] ? e.message : "write failed");
    return 0;
  }
  if (size != bytes) {
    char msg[160];
    snprintf(msg, sizeof msg, "short write: %zu bytes sent, %llu on disk", bytes,
             (unsigned long long)size);
    *result = eph_error_result(msg);
    return 0;
  }
  json_object *res = json_object_new_object();
  json_object_object_add(res, "path", json_object_new_string(path));
  json_object_object_add(res, "bytes_written", json_object_new_int64((int64_t)bytes));
  emit_op(f, call, "file_write", "wrote", path, (int64_t)bytes);
  *result = res;
  return 0;
}

static int
do_list(files_t *f, const eph_tool_call_t *call, json_object **result, eph_error_t *err)
{
  const char *path = eph_json_get_string(call->args, "path"), *why;
  if (!path)
    path = "";
  if ((why = path_refusal(path, true))) {
    *result = refused(f, call, "file_list", why);
    return 0;
  }
  eph_dirent_t *ents = NULL;
  size_t n = 0;
  eph_error_t e = {0};
  if (f->host->sandbox_list(call->run, path, &ents, &n, &e) < 0) {
    if (e.code == EPH_E_PROTOCOL)
      return eph_error_set(err, e.code, "%s", e.message);
    *result = eph_error_result(e.message[0] ? e.message : "list failed");
    return 0;
  }
  json_object *arr = json_object_new_array();
  for (size_t i = 0; i < n && (int64_t)i < f->max_list_entries; i++) {
    json_object *o = json_object_new_object();
    char t[2] = {ents[i].type, 0};
    json_object_object_add(o, "name", json_object_new_string(ents[i].name));
    json_object_object_add(o, "type", json_object_new_string(t));
    json_object_object_add(o, "size_bytes", json_object_new_int64((int64_t)ents[i].size_bytes));
    json_object_object_add(o, "mtime_s", json_object_new_int64(ents[i].mtime_s));
    json_object_array_add(arr, o);
  }
  json_object *res = json_object_new_object();
  json_object_object_add(res, "path", json_object_new_string(*path ? path : "."));
  json_object_object_add(res, "entries", arr);
  json_object_object_add(res, "truncated",
                         json_object_new_boolean((int64_t)n > f->max_list_entries));
  f->host->dirents_free(ents, n);
  emit_op(f, call, "file_list", "listed", path, -1);
  *result = res;
  return 0;
}

static int
file_call(void *state, const eph_tool_call_t *call, json_object **result, eph_error_t *err)
{
  files_t *f = state;
  if (strcmp(call->tool, "file_read") == 0)
    return do_read(f, call, result, err);
  if (strcmp(call->tool, "file_write") == 0)
    return do_write(f, call, result, err);
  if (strcmp(call->tool, "file_list") == 0)
    return do_list(f, call, result, err);
  return eph_error_set(err, EINVAL, "tool-file has no tool '%s'", call->tool);
}

static int
file_init(const eph_host_t *host, const config_setting_t *config, void **state, eph_error_t *err)
{
  files_t *f = calloc(1, sizeof *f);
  int r;
  if (!f)
    return eph_error_set(err, ENOMEM, "out of memory");
  f->host = host;
  if ((r = host->cfg_int(config, "max_read_bytes", 1048576, &f->max_read_bytes, err)) < 0 ||
      (r = host->cfg_int(config, "max_write_bytes", 10485760, &f->max_write_bytes, err)) < 0 ||
      (r = host->cfg_int(config, "max_list_entries", 1000, &f->max_list_entries, err)) < 0) {
    free(f);
    return r;
  }
  *state = f;
  return 0;
}

static void
file_fini(void *state)
{
  free(state);
}

static const eph_tool_ops_t file_ops = {
    .struct_size = sizeof(eph_tool_ops_t),
    .tools = file_tools,
    .n_tools = sizeof file_tools / sizeof file_tools[0],
    .call = file_call,
};

EPH_PLUGIN_EXPORT = {
    .abi_major = EPH_ABI_MAJOR,
    .abi_minor = EPH_ABI_MINOR,
    .struct_size = sizeof(eph_plugin_t),
    .name = "tool-file",
    .kind = EPH_KIND_TOOL,
    .version = PACKAGE_VERSION,
    .description = "file_read, file_write and file_list beneath the sandbox's scratch",
    .config_keys = file_keys,
    .init = file_init,
    .fini = file_fini,
    .ops = &file_ops,
};
