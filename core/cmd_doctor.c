/* `ephemeral doctor`: the daemon's health checks, offline. One line per component, exit 0
 * when every one is ok, 1 otherwise. Opening the context already settled and recorded
 * what dead processes left (eph_runstore_recover); what could not be is counted here. */
#include <config.h>

#include <stdio.h>

#include "cli.h"
#include "health.h"
#include "log.h"
#include "runstore.h"
#include "store.h"
#include "cluster.h"
#include "util.h"

int
eph_cmd_doctor_check(int argc, char **argv)
{
  if (eph_cli_operands("doctor", argc, argv, 0) < 0) {
    fputs("usage: ephemeral doctor\n", stderr);
    return 2;
  }
  return -1;
}

int
eph_cmd_doctor(eph_ctx_t *ctx, int argc, char **argv)
{
  int bad = eph_cmd_doctor_check(argc, argv);
  if (bad >= 0)
    return bad;
  eph_store_t *store = NULL;
  eph_error_t err = {0};
  if (eph_store_open_ctx(ctx, &(eph_store_options_t){.check_whole = true}, false, &store, &err) < 0)
    store = NULL;
  bool healthy = false;
  cleanup_json json_object *report =
      eph_health_check(ctx, store, store ? NULL : err.message, &healthy, NULL);
  int pending = 0;
  if (store)
    eph_runstore_recover(ctx, store, true, &pending);
  for (size_t i = 0; i < 4; i++) {
    json_object *c = NULL, *v = NULL;
    json_object_object_get_ex(report, eph_health_components[i], &c);
    const char *status =
        json_object_object_get_ex(c, "status", &v) ? json_object_get_string(v) : "degraded";
    if (json_object_object_get_ex(c, "reason", &v))
      printf("%s: %s: %s\n", eph_health_components[i], status, json_object_get_string(v));
    else
      printf("%s: %s\n", eph_health_components[i], status);
  }
  if (pending > 0) {
    printf("recovery: degraded: %d run(s) left by a dead process or a storage failure could "
           "not be settled and recorded yet\n",
           pending);
    healthy = false;
  }
  if (store)
    eph_store_close(store);
  return healthy ? 0 : 1;
}
