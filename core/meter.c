/* Money for a run: prices, charges to the ledger capped at the reservation, and the compute
 * meter that charges while the sandbox lives. */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "run_int.h"
#include "util.h"

int
eph_meter_prices(eph_run_t *run, eph_error_t *err)
{
  const eph_pricing_conf_t *p = &eph_config_values(&run->ctx->config)->pricing;
  run->compute_price_s = p->compute_micros_per_second;
  run->in_price_mtok = run->cache_read_price_mtok = run->cache_write_price_mtok =
      EPH_PRICE_DEFAULT_INPUT_MTOK;
  run->out_price_mtok = EPH_PRICE_DEFAULT_OUTPUT_MTOK;
  if (p->models) {
    bool found = false;
    for (size_t i = 0; i < p->n_models; i++) {
      const eph_price_model_t *m = &p->models[i];
      if (!m->name || strcmp(m->name, run->req.model) != 0)
        continue;
      run->in_price_mtok = m->input_micros_per_mtok;
      run->out_price_mtok = m->output_micros_per_mtok;
      run->cache_read_price_mtok = m->cached_input_micros_per_mtok;
      run->cache_write_price_mtok = m->cache_write_micros_per_mtok;
      found = true;
    }
    if (!found && strncmp(run->model_call_name, "replay:", 7) != 0) {
      /* Say where prices live and, for a typo, which priced name was meant. */
      const char *names[64];
      size_t n = 0;
      for (size_t i = 0; i < p->n_models && n < 64; i++)
        if (p->models[i].name)
          names[n++] = p->models[i].name;
      const char *near = eph_closest(run->req.model, names, n);
      const char *file = run->ctx->config.main_path;
      return eph_error_set(err, EINVAL,
                           "field 'model': no price configured for model '%s'%s%s%s (every model "
                           "needs a row in pricing.models of %s)",
                           run->req.model, near ? ": did you mean '" : "", near ? near : "",
                           near ? "'?" : "", file ? file : "ephemeral.conf");
    }
  }
  return 0;
}

/* Flags the budget as exhausted and stops the sandbox. The pointer is read under the run's
 * lock: eph_run_execute unpublishes it under the lock before destroying it, so a charge from
 * another thread (the compute meter, the egress proxy) never cancels a freed sandbox. */
static void
budget_cut(eph_run_t *run)
{
  atomic_store(&run->budget_exhausted, true);
  pthread_mutex_lock(&run->lock);
  if (run->sbx)
    eph_sbx_cancel(run->sbx);
  pthread_mutex_unlock(&run->lock);
}

/* eph_meter_charge with money_lock held. The ledger is written without the run's lock (an
 * fsync must not stall the HTTP threads reading the run); money_lock keeps this run's
 * charges one at a time, so what is left cannot change between the check and the write. */
static int64_t
charge_held(eph_run_t *run, eph_cost_t cat, int64_t micros, const char *memo)
{
  pthread_mutex_lock(&run->lock);
  int64_t left = run->reserved - run->billed;
  pthread_mutex_unlock(&run->lock);
  int64_t amount = micros > left ? left : micros;
  bool short_of_budget = micros > left;
  int64_t charged = 0;
  if (amount > 0) {
    eph_error_t err = {0};
    int r = EPH_WITH_PLUGIN(run->ledger, eph_run_ledger_ops(run)->charge(
                                             run->ledger->state, run->id, cat, amount, memo, &err));
    if (r < 0 && err.code == EPH_E_BUDGET) {
      short_of_budget = true;
    } else if (r < 0) {
      /* Not the budget: the ledger could not record the charge (full disk, I/O error).
       * The run stops as failed/storage_error; what was not recorded is not billed. */
      eph_error("run %s: ledger charge of %" PRId64 " micros failed: %s", run->id, amount,
                err.message);
      eph_run_storage_failed(run, err.message);
    } else {
      charged = amount;
      pthread_mutex_lock(&run->lock);
      run->billed += amount;
      if (cat == EPH_COST_MODEL)
        run->model_micros += amount;
      else if (cat == EPH_COST_WEB)
        run->web_micros += amount;
      else
        run->compute_micros += amount;
      pthread_cond_signal(&run->meter_cond); /* the cap is closer: the meter re-plans */
      pthread_mutex_unlock(&run->lock);
    }
  }
  if (short_of_budget)
    budget_cut(run);
  return charged;
}

/* Charges up to `micros`; when that would pass the reservation, charges what is left and
 * flags the budget as exhausted. Returns the micros actually charged. */
int64_t
eph_meter_charge(eph_run_t *run, eph_cost_t cat, int64_t micros, const char *memo)
{
  if (micros <= 0)
    return 0;
  pthread_mutex_lock(&run->money_lock);
  int64_t charged = charge_held(run, cat, micros, memo);
  pthread_mutex_unlock(&run->money_lock);
  return charged;
}

int64_t
eph_meter_remaining(eph_run_t *run)
{
  pthread_mutex_lock(&run->lock);
  int64_t left = run->reserved - run->billed;
  pthread_mutex_unlock(&run->lock);
  return left;
}

/* Micros of one model call, rounded up. The token counts come from the model's answer
 * (or a transcript): absurd counts must not overflow int64 into a negative, free call, so
 * the cost saturates at INT64_MAX and eph_meter_charge() bills what the reservation has left. */
int64_t
eph_meter_model_cost(const eph_run_t *run, const eph_model_response_t *resp)
{
  uint64_t input_tokens = resp->input_tokens, output_tokens = resp->output_tokens;
  /* Cached prompt tokens are part of input_tokens and priced at their own rates; counts
   * that claim more cached tokens than prompt tokens are billed as if all were uncached. */
  uint64_t cr = resp->cache_read_tokens, cw = resp->cache_write_tokens;
  if (cr > input_tokens || cw > input_tokens - cr)
    cr = cw = 0;
  int64_t in_x, out_x, cr_x, cw_x, sum;
  if (input_tokens > INT64_MAX || output_tokens > INT64_MAX ||
      __builtin_mul_overflow((int64_t)(input_tokens - cr - cw), run->in_price_mtok, &in_x) ||
      __builtin_mul_overflow((int64_t)cr, run->cache_read_price_mtok, &cr_x) ||
      __builtin_mul_overflow((int64_t)cw, run->cache_write_price_mtok, &cw_x) ||
      __builtin_mul_overflow((int64_t)output_tokens, run->out_price_mtok, &out_x) ||
      __builtin_add_overflow(in_x, out_x, &sum) || __builtin_add_overflow(sum, cr_x, &sum) ||
      __builtin_add_overflow(sum, cw_x, &sum) || __builtin_add_overflow(sum, 999999, &sum))
    return INT64_MAX;
  return sum / 1000000;
}

/* Compute is charged continuously so a crash loses at most one interval, and the meter
 * wakes early enough to stop the sandbox before compute could pass the cap. */
static void
meter_tick(eph_run_t *run, int64_t now)
{
  /* Never past the deadline the client bought: a daemon stopped (SIGSTOP, a frozen host)
   * and continued later finds its run over, not a bill for the time it was away. */
  if (now > run->deadline_ms)
    now = run->deadline_ms;
  int64_t elapsed = now - run->sandbox_start_ms;
  /* Charged per started millisecond-priced micro: due = ceil(ms * price / 1000). */
  int64_t due = (elapsed * run->compute_price_s + 999) / 1000;
  int64_t delta = due - run->compute_due_charged;
  if (delta > 0) {
    int64_t charged = eph_meter_charge(run, EPH_COST_COMPUTE, delta, "sandbox compute");
    run->compute_due_charged += charged;
  }
}

/* The absolute CLOCK_MONOTONIC time `ms` milliseconds after `from`. */
static struct timespec
ts_after(struct timespec from, int64_t ms)
{
  from.tv_sec += ms / 1000;
  from.tv_nsec += (ms % 1000) * 1000000;
  if (from.tv_nsec >= 1000000000) {
    from.tv_sec++;
    from.tv_nsec -= 1000000000;
  }
  return from;
}

static int64_t
ms_until(const struct timespec *when, const struct timespec *now)
{
  return (int64_t)(when->tv_sec - now->tv_sec) * 1000 + (when->tv_nsec - now->tv_nsec) / 1000000;
}

/* Ticks once per meter_ms, or earlier when the reservation left would run out before then
 * (so the sandbox stops at the cap). run->meter_cond is signalled by every charge: such a
 * wake-up only re-plans the wait (a model charge may have brought the cap closer); it never
 * charges. Timeline events do not wake it (they used to, through run->cond: a wake-up and
 * a context switch per event; before that, a compute charge per event). */
static void *
meter_main(void *arg)
{
  eph_run_t *run = arg;
  struct timespec last;
  clock_gettime(CLOCK_MONOTONIC, &last);
  pthread_mutex_lock(&run->lock);
  while (!run->meter_stop) {
    int64_t left = run->reserved - run->billed;
    int64_t wait_ms = run->meter_ms;
    if (run->compute_price_s > 0) {
      int64_t until_cap = left * 1000 / run->compute_price_s;
      if (until_cap < wait_ms)
        wait_ms = until_cap > 5 ? until_cap : 5;
    }
    struct timespec due = ts_after(last, wait_ms), now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (ms_until(&due, &now) > 0) {
      pthread_cond_timedwait(&run->meter_cond, &run->lock, &due);
      continue; /* woken by a charge or the stop, or due: re-plan, tick when due */
    }
    last = now;
    pthread_mutex_unlock(&run->lock);
    meter_tick(run, eph_now_ms());
    pthread_mutex_lock(&run->lock);
  }
  pthread_mutex_unlock(&run->lock);
  return NULL;
}

void
eph_meter_start(eph_run_t *run)
{
  run->sandbox_start_ms = eph_now_ms();
  pthread_condattr_t attr;
  (void)attr;
  if (pthread_create(&run->meter, NULL, meter_main, run) == 0)
    run->meter_running = true;
}

void
eph_meter_stop(eph_run_t *run)
{
  if (!run->meter_running)
    return;
  pthread_mutex_lock(&run->lock);
  run->meter_stop = true;
  pthread_cond_signal(&run->meter_cond);
  pthread_mutex_unlock(&run->lock);
  pthread_join(run->meter, NULL);
  run->meter_running = false;
  meter_tick(run, eph_now_ms());
}

int
eph_meter_charge_exact(eph_run_t *run, eph_cost_t category, int64_t micros, const char *memo,
                       eph_error_t *err)
{
  /* A plugin's charge is all or nothing: it is refused when it does not fit. The check and
   * the charge are one step under money_lock (no other charge of the run in between), so
   * a charge that passed the check is never cut to what another one left. */
  pthread_mutex_lock(&run->money_lock);
  if (micros > eph_meter_remaining(run)) {
    pthread_mutex_unlock(&run->money_lock);
    atomic_store(&run->budget_exhausted, true);
    return eph_error_set(err, EPH_E_BUDGET, "the run's budget cannot pay %" PRId64 " micros",
                         micros);
  }
  int64_t charged = micros > 0 ? charge_held(run, category, micros, memo) : 0;
  pthread_mutex_unlock(&run->money_lock);
  if (micros > 0 && charged == 0)
    return eph_error_set(err, EIO, "the charge could not be recorded: the ledger is failing");
  return 0;
}
