/* plugin-hello: the smallest out-of-tree ephemeral plugin, built against the installed SDK:
 *   cc $(pkg-config --cflags ephemeral-plugin) $(pkg-config --variable=plugin_cflags \
 *      ephemeral-plugin) -shared -o hello.so hello.c $(pkg-config --libs ephemeral-plugin)
 * It offers one tool, `hello`, that greets whoever the model names. */
#include <ephemeral/plugin.h>
#include <stdlib.h>

typedef struct hello {
  const char *greeting; /* borrowed from the config tree */
} hello_t;

static const eph_config_key_t hello_keys[] = {
    {.name = "greeting",
     .type = EPH_CFG_STRING,
     .default_text = "\"Hello\"",
     .doc = "Word the tool greets with."},
    {0},
};

static const eph_tool_def_t hello_tools[] = {
    {"hello", "Greets someone by name.",
     "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"}},"
     "\"required\":[\"name\"]}",
     EPH_PERM_SHELL},
};

static int
hello_call(void *state, const eph_tool_call_t *call, json_object **result, eph_error_t *err)
{
  hello_t *h = state;
  json_object *name = NULL;
  if (!json_object_object_get_ex(call->args, "name", &name) ||
      !json_object_is_type(name, json_type_string)) {
    *result = json_object_new_object();
    json_object_object_add(*result, "error", json_object_new_string("'name' must be a string"));
    return 0;
  }
  char text[256];
  snprintf(text, sizeof text, "%s, %s!", h->greeting, json_object_get_string(name));
  *result = json_object_new_object();
  json_object_object_add(*result, "greeting", json_object_new_string(text));
  (void)err;
  return 0;
}

static const eph_tool_ops_t hello_ops = {
    .struct_size = sizeof hello_ops,
    .tools = hello_tools,
    .n_tools = sizeof hello_tools / sizeof hello_tools[0],
    .call = hello_call,
};

static int
hello_init(const eph_host_t *host, const config_setting_t *config, void **state, eph_error_t *err)
{
  hello_t *h = calloc(1, sizeof *h);
  if (!h)
    return eph_error_set(err, ENOMEM, "out of memory");
  int r = host->cfg_string(config, "greeting", "Hello", &h->greeting, err);
  if (r < 0) {
    free(h);
    return r;
  }
  *state = h;
  return 0;
}

static void
hello_fini(void *state)
{
  free(state);
}

EPH_PLUGIN_EXPORT = {
    .abi_major = EPH_ABI_MAJOR,
    .abi_minor = EPH_ABI_MINOR,
    .struct_size = sizeof(eph_plugin_t),
    .name = "hello",
    .kind = EPH_KIND_TOOL,
    .version = "1.0.0",
    .description = "out-of-tree example tool",
    .config_keys = hello_keys,
    .init = hello_init,
    .fini = hello_fini,
    .ops = &hello_ops,
};
