/* Which loaded model plugin serves a model name. Its own unit (like eph_ctx_backend in
 * sandbox.c) so that the run and the health check, which both call it, do not depend on
 * context.c, which depends on the run through the host services. */
#include <config.h>

#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "context.h"
#include "loader.h"
#include "log.h"

const eph_plugin_slot_t *
eph_ctx_model_plugin(eph_ctx_t *ctx, eph_error_t *err)
{
  const char *model_plugin = eph_config_values(&ctx->config)->model_plugin;
  const eph_plugin_slot_t *m = eph_plugins_find(&ctx->plugins, model_plugin);
  if (!m || m->desc->kind != EPH_KIND_MODEL) {
    eph_error_set(err, ENOENT,
                  "model_plugin: '%s' is not a loaded model plugin (enable it in conf.d)",
                  model_plugin);
    return NULL;
  }
  return m;
}

const eph_plugin_slot_t *
eph_ctx_model(eph_ctx_t *ctx, const char *model, eph_error_t *err)
{
  const char *model_plugin = NULL;
  if (strncmp(model, "replay:", 7) == 0)
    model_plugin = "model-replay";
  else
    model_plugin = eph_config_values(&ctx->config)->model_plugin; /* an S row: never NULL */
  /* Routing by the model's provider prefix ("openai/", "anthropic/", an operator's
   * "local/"): the model plugin serving the name with the most specific prefix takes the
   * run. An offline daemon (model-replay) replays every run; plugins without serves()
   * leave the choice to model_plugin. A name nobody serves is the client's error, refused
   * before anything is reserved. */
  if (strcmp(model_plugin, "model-replay") != 0) {
    bool default_declined = false;
    const eph_plugin_slot_t *routed = NULL;
    int best = 0;
    for (size_t i = 0; i < ctx->plugins.n; i++) {
      const eph_plugin_slot_t *s = &ctx->plugins.slots[i];
      const eph_model_ops_t *mo = s->desc->ops;
      if (s->desc->kind != EPH_KIND_MODEL || !EPH_OPS_HAS(mo, eph_model_ops_t, serves))
        continue;
      int score = EPH_WITH_PLUGIN(s, mo->serves(s->state, model));
      if (score > best) {
        best = score;
        routed = s;
      } else if (score <= 0 && strcmp(s->desc->name, model_plugin) == 0) {
        default_declined = true;
      }
    }
    if (routed)
      return routed;
    if (default_declined) {
      eph_error_set(err, EINVAL,
                    "field 'model': no loaded model provider serves '%s' (its prefix, such "
                    "as \"openai/\" or \"anthropic/\", names the provider)",
                    model);
      return NULL;
    }
  }
  const eph_plugin_slot_t *m = eph_plugins_find(&ctx->plugins, model_plugin);
  if (!m || m->desc->kind != EPH_KIND_MODEL) {
    eph_error_set(err, ENOENT, "model plugin '%s' is not loaded (enable it in conf.d)",
                  model_plugin);
    return NULL;
  }
  return m;
}
