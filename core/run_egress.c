/* A run's web egress: the proxy that is its sandbox's one way out, a charge and an event
 * for every connection. */
#include <config.h>

#include <inttypes.h>

#include "run_int.h"
#include "util.h"

/* Whether an uncharged connection still gets an event of its own. A refusal costs the run
 * nothing and each one was an event in memory and a row in the store: the red team's
 * sandbox made 29,483 of them in 20 s (138 MB of store, a 125 MB run record), a rate any
 * workload can keep up for its whole deadline, filling the daemon's memory and disk for
 * every run. */
static bool
uncharged_event_shown(eph_run_egress_t *eg)
{
  return atomic_fetch_add(&eg->uncharged, 1) < EPH_EGRESS_UNCHARGED_EVENTS;
}

/* The refusal as the announce's error (a failed charge's reason is in err already: no
 * formatting of a buffer into itself). */
static int
denied(eph_error_t *err, const char *refusal)
{
  if (refusal != err->message)
    return eph_error_set(err, EPH_E_DENIED, "%s", refusal);
  err->code = EPH_E_DENIED;
  return -EPH_E_DENIED;
}

/* Every connection through the proxy: an event (see uncharged_event_shown), and for an
 * allowed one a web charge first; a refused charge refuses the connection. */
static int
egress_announce(void *opaque, const char *method, const char *target, const char *refusal,
                eph_error_t *err)
{
  eph_run_egress_t *eg = opaque;
  eph_run_t *run = eg->run;
  if (!refusal && (atomic_load(&run->cancel) || eph_now_ms() >= run->deadline_ms))
    refusal = "the run is ending";
  if (!refusal && eg->price_micros > 0 &&
      eph_meter_charge_exact(run, EPH_COST_WEB, eg->price_micros, "egress connection", err) < 0)
    refusal = err->message;
  if ((refusal || eg->price_micros == 0) && !uncharged_event_shown(eg))
    return refusal ? denied(err, refusal) : 0;
  json_object *d = json_object_new_object();
  json_object_object_add(d, "method", json_object_new_string(method));
  json_object_object_add(d, "target", json_object_new_string(target));
  json_object_object_add(d, "allowed", json_object_new_boolean(!refusal));
  if (refusal) {
    json_object_object_add(d, "reason", json_object_new_string(refusal));
    eph_run_emit(run, "Web", "egress", true, d, "%s %s · refused: %s", method, target, refusal);
    return denied(err, refusal);
  }
  json_object_object_add(d, "charged_micros", json_object_new_int64(eg->price_micros));
  eph_run_emit(run, "Web", "egress", true, d, "%s %s", method, target);
  return 0;
}

/* Starts the run's proxy and points the spec at it. On failure the sandbox gets no network
 * (fail closed) and the timeline says why. */
void
eph_run_egress_start(eph_run_egress_t *eg, eph_sandbox_spec_t *spec, const char *source)
{
  eph_error_t err = {0};
  eph_egress_options_t opt;
  /* The price and the policy are the core's `egress` block's (no plugin's). */
  int r =
      eph_egress_load_config(&eg->run->ctx->config, &eg->run->ctx->host, &opt, &eg->policy, &err);
  if (r == 0) {
    eg->price_micros = opt.price_micros;
    opt.policy = &eg->policy;
    opt.announce = egress_announce;
    opt.opaque = eg;
    r = eph_egress_start(&opt, &eg->proxy, &err);
  }
  if (r < 0) {
    eph_run_emit(eg->run, source, "egress_error", false, NULL,
                 "web egress could not be set up: %s · the sandbox has no network", err.message);
    eph_net_policy_free(&eg->policy);
    return;
  }
  /* The backend makes the proxy's listening socket in its sandbox's reach and hands it
   * over (eph_egress_attach checks it); a refused one fails the create, closed. */
  eph_egress_spec(eg->proxy, spec);
}

void
eph_run_egress_stop(eph_run_egress_t *eg)
{
  eph_egress_stop(eg->proxy); /* no connection thread is left to count */
  eg->proxy = NULL;
  int64_t n = atomic_load(&eg->uncharged), hidden = n - EPH_EGRESS_UNCHARGED_EVENTS;
  if (hidden > 0) {
    json_object *d = json_object_new_object();
    json_object_object_add(d, "connections", json_object_new_int64(hidden));
    json_object_object_add(d, "uncharged", json_object_new_int64(n));
    eph_run_emit(eg->run, "Web", "egress_dropped", false, d,
                 "%" PRId64 " more uncharged egress connections (refused, or free) not shown: "
                 "%" PRId64 " in all, the first %d shown",
                 hidden, n, EPH_EGRESS_UNCHARGED_EVENTS);
  }
  eph_net_policy_free(&eg->policy);
}
