#include "sampling_plan.h"

#include <math.h>

void plan_start(sampling_plan *p, const plan_config *config, uint64_t now, uint64_t vm_allocations, uint64_t seed) {
  p->windowed = config->windowed;
  p->halted = false;
  p->window_open = false;
  sampler_init(&p->sampler, config->sample_every, seed);
  budget_init(&p->budget, config->max_overhead, config->sample_every, now);
  uint64_t virtual_now = plan_virtual_now(p, now);
  p->auto_share = config->windowed && !(config->window_share > 0.0) && config->max_overhead > 0.0;
  double share = !config->windowed ? 1.0 : config->window_share > 0.0 ? config->window_share
               : PLAN_DEFAULT_SHARE; // the budget's share starts there too (sampling_plan.h)
  schedule_init(&p->chain, share, config->sample_every, virtual_now, seed ^ 0x2545f4914f6cdd1dull);
  p->meant_allocations = 0.0;
  p->share_since_allocations = 0;
  p->checked_virtual = virtual_now;
  p->checked_allocations = 0;
  p->checked_own = __atomic_load_n(&p->own_nanos, __ATOMIC_RELAXED);
  p->checked_hook = 0;
  p->work_share = 0.0;
  p->checked_ticker = p->ticker_cpu_nanos; // as last noted: a ticker still running counts from here
  p->ticker_share = 0.0;
  p->min_share = p->chain.share;
  p->hook_cost_share = 0.0;
  p->share_changes_waited = 0;
  p->share_hold_until = virtual_now + PLAN_SHARE_HOLD_NANOS;
  p->stretch_close_owed = false;
  p->hook_allocations = p->uncharged_allocations = 0;
  p->last_charged_nanos = now;
  p->started_allocations = vm_allocations;
  p->started_virtual = virtual_now;
  p->closed_windows_virtual = 0;
  p->seen_share = 0.0;
  p->stretch_count = 0;
  p->stretch_first_window = p->window + 1;
  p->stretch_started_virtual = virtual_now;
  p->stretch_meant_start = 0.0;
  p->stretch_hook_start = 0;
  p->last_stretch_meant = 0.0;
  p->last_stretch_hook = 0;
  p->last_stretch_scale = 1.0;
  p->scaled_hook_allocations = 0.0;
  p->stretch_scale_min = p->stretch_scale_max = 0.0;
  p->next_density_check = virtual_now + SCHEDULE_FIRST_RETUNE_NANOS;
  p->strata_count = config->strata_count < PLAN_MAX_STRATA ? config->strata_count : PLAN_MAX_STRATA;
  for (uint32_t i = 0; i < p->strata_count; i++) {
    p->strata[i] = (plan_stratum){.every = config->strata_every[i] < 1 ? 1 : config->strata_every[i]};
    plan_draw_stratum(p, i);
  }
  plan_draw(p);
}

void plan_stop(sampling_plan *p) { p->window_open = false; }

void plan_set_hook_cost(sampling_plan *p, double nanos) { p->hook_cost_nanos = nanos; }

void plan_park(sampling_plan *p) {
  p->countdown = UINT64_MAX;
  for (uint32_t i = 0; i < p->strata_count; i++) p->strata[i].countdown = UINT64_MAX;
}

void plan_halt(sampling_plan *p) {
  p->halted = true;
  plan_park(p);
}

void plan_reseed(sampling_plan *p, uint64_t mix) {
  uint64_t seed = sampler_random(&p->sampler) ^ mix;
  sampler_init(&p->sampler, p->sampler.sample_every, seed);
  sampler_init(&p->chain.random, 2, seed ^ 0x5851f42d4c957f2dull);
}

// ---- Time ----

// The enabled hook's measured cost per allocation, 0 until measured.
static double hook_cost(const sampling_plan *p) { return p->hook_cost_nanos > 0.0 ? p->hook_cost_nanos : 0.0; }

uint64_t plan_virtual_now(const sampling_plan *p, uint64_t now) { return now - __atomic_load_n(&p->own_nanos, __ATOMIC_RELAXED); }

void plan_add_own_nanos(sampling_plan *p, uint64_t nanos) { __atomic_fetch_add(&p->own_nanos, nanos, __ATOMIC_RELAXED); }

// The hook's part is an estimate (allocations x the cost measured at load), and it is never charged more
// than half of the rest of the time since the last charge: an estimate too high (measured on a busy
// machine: 182 ns for about 40) would otherwise stop virtual time while the hook is on, so the chain
// could never flip off and the window stayed open for 97% of allocations.
void plan_charge(sampling_plan *p, uint64_t started, uint64_t now) {
  uint64_t work = now - started;
  double hook = p->uncharged_allocations * hook_cost(p);
  uint64_t since = p->last_charged_nanos != 0 && now > p->last_charged_nanos ? now - p->last_charged_nanos : 0;
  double rest = since > work ? (double)(since - work) : 0.0;
  if (hook > 0.5 * rest) hook = 0.5 * rest;
  p->uncharged_allocations = 0;
  p->last_charged_nanos = now;
  plan_add_own_nanos(p, work + (uint64_t)hook);
  budget_spend(&p->budget, work, now);
}

// ---- The hook: countdowns and weights ----

// A weight as a whole number: w itself when it is one, else floor(w) or floor(w) + 1 at random, with the
// mean w, so that estimates stay unbiased (a weight's rounding adds a variance of at most 1/4).
static uint32_t whole_weight(sampling_plan *p, double w) {
  if (!(w < 4294967295.0)) return UINT32_MAX;
  double whole = round(w);
  if (fabs(w - whole) < 1e-6 * w) return whole < 1.0 ? 1u : (uint32_t)whole;
  double below = floor(w);
  uint32_t weight = (uint32_t)below + (sampler_uniform(&p->sampler) < w - below ? 1u : 0u);
  return weight < 1u ? 1u : weight;
}

// Always: 1 in the budget's rate, each sample weighing that. Windowed: the rate inside windows is 1 /
// share times that, and denser still where late sync points lost windows (schedule_window_every); a
// sample weighs what its in-window rate makes it (schedule_weight). The chain's share changes only in
// plan_update_density, on this thread: it is read here without the ticker's lock.
// A countdown at the overall rate every: loads *countdown and *step, returns the sample's weight.
static uint32_t draw_at(sampling_plan *p, uint32_t every, uint64_t *countdown, uint64_t *step) {
  uint32_t weight = every;
  if (!p->windowed) {
    sampler_set_every(&p->sampler, every);
  } else {
    uint32_t in_window = schedule_window_every(&p->chain, every, p->seen_share);
    sampler_set_every(&p->sampler, in_window);
    weight = whole_weight(p, schedule_weight(&p->chain, in_window));
  }
  *step = *countdown = sampler_next_countdown(&p->sampler);
  return weight;
}

void plan_draw(sampling_plan *p) {
  if (p->halted) return;
  p->draw_weight = draw_at(p, p->budget.current_every, &p->countdown, &p->step);
}

// The budget lowers a stratum's rate by the factor it lowered the common one (its cost is sampling
// work too); a rate asked for below the common one stays below it by the same factor.
uint32_t plan_stratum_every(const sampling_plan *p, uint32_t i) {
  uint64_t base = p->budget.base_every ? p->budget.base_every : 1;
  uint64_t every = (uint64_t)p->strata[i].every * p->budget.current_every / base;
  return every < 1 ? 1u : every > UINT32_MAX ? UINT32_MAX : (uint32_t)every;
}

void plan_draw_stratum(sampling_plan *p, uint32_t i) {
  if (p->halted) return;
  plan_stratum *s = &p->strata[i];
  s->draw_weight = draw_at(p, plan_stratum_every(p, i), &s->countdown, &s->step);
}

void plan_set_stratum_every(sampling_plan *p, uint32_t i, uint32_t every) {
  if (i >= p->strata_count) return;
  // What the old countdown counted down, the hook saw (0 outside windows: closing one counted it).
  plan_stratum *s = &p->strata[i];
  p->hook_allocations += s->step - s->countdown;
  p->uncharged_allocations += s->step - s->countdown;
  s->every = every < 1 ? 1 : every;
  plan_draw_stratum(p, i);
}

uint32_t plan_sampled_stratum(sampling_plan *p, uint32_t i) {
  plan_stratum *s = &p->strata[i];
  p->hook_allocations += s->step;
  p->uncharged_allocations += s->step;
  s->samples++;
  return s->draw_weight;
}

uint32_t plan_sampled(sampling_plan *p) {
  p->hook_allocations += p->step;
  p->uncharged_allocations += p->step;
  return p->draw_weight;
}

// Always-on sampling draws every allocation independently: each sample is a cluster of its own.
uint32_t plan_cluster(sampling_plan *p) {
  if (!p->windowed) p->window++;
  return p->window;
}

// ---- Windows ----

// Adds the allocations the hook has counted down since the countdown was last loaded to those it saw
// (and to those not yet charged), so the countdown left can be kept or replaced.
static void count_seen_allocations(sampling_plan *p) {
  uint64_t seen = p->step - p->countdown;
  p->step = p->countdown;
  for (uint32_t i = 0; i < p->strata_count; i++) {
    seen += p->strata[i].step - p->strata[i].countdown;
    p->strata[i].step = p->strata[i].countdown;
  }
  p->hook_allocations += seen;
  p->uncharged_allocations += seen;
}

// What the countdowns have counted down since they were last loaded (the open window's allocations not
// yet added to hook_allocations).
static uint64_t counted_down(const sampling_plan *p) {
  uint64_t seen = p->step - p->countdown;
  for (uint32_t i = 0; i < p->strata_count; i++) seen += p->strata[i].step - p->strata[i].countdown;
  return seen;
}

bool plan_hook_wanted(sampling_plan *p, uint64_t virtual_now, bool ticker_runs, bool held_shut) {
  // While the ticker runs, the state it requested at its last wake-up (applying the chain's state at this
  // moment would make the moments the hook changes at depend on the chain); without it (Ruby 3.1, a
  // forked child before its ticker restarts) each sync point reads the chain itself.
  bool on = ticker_runs ? schedule_requested(&p->chain) : schedule_request(&p->chain, virtual_now);
  return on && !held_shut;
}

void plan_open_window(sampling_plan *p, uint64_t virtual_now) {
  p->window_opened_virtual = virtual_now;
  p->window_opened_allocations = p->hook_allocations;
  p->window++;
  p->window_open = true;
}

uint64_t plan_close_window(sampling_plan *p, uint64_t virtual_now) {
  count_seen_allocations(p);
  p->closed_windows_virtual += virtual_now > p->window_opened_virtual ? virtual_now - p->window_opened_virtual : 0;
  p->window_open = false;
  return p->hook_allocations - p->window_opened_allocations;
}

bool plan_density_due(const sampling_plan *p, uint64_t virtual_now) { return virtual_now >= p->next_density_check; }

void plan_note_ticker_cpu(sampling_plan *p, uint64_t cpu_nanos) { p->ticker_cpu_nanos = cpu_nanos; }

double plan_budget_share(const sampling_plan *p, double allocations_per_nano, double work_share, double ticker_per_share) {
  double full = allocations_per_nano * hook_cost(p);
  // What heapscope's own work took (sampling, sync jobs) is spent already; the hook gets at least a
  // quarter of the budget (beyond that the budget lowers the rate, budget.h), and aims at
  // PLAN_AUTO_SHARE_AIM of what is left: the enabled hook also costs what no clock here sees (the GC's
  // work on the objects it makes slower, the jobs' dispatch: 0.005-0.02x an empty hook, bench/run).
  double left = p->budget.max_overhead - work_share;
  if (left < 0.25 * p->budget.max_overhead) left = 0.25 * p->budget.max_overhead;
  double share = full > 0.0 ? PLAN_AUTO_SHARE_AIM * left / full : PLAN_AUTO_SHARE_MAX;
  // The ticker wakes about twice a window, and a wake-up costs 2-30 us of CPU (most on virtual
  // machines: 29 us on the 2-core machine of docs/benchmarks.md, where 0.04 makes it 2.2% of a core).
  // Lowering the share for that would cost accuracy everywhere, so it only stops the share rising:
  // above the default, the hook and the wake-ups together must fit.
  if (ticker_per_share > 0.0 && share > PLAN_DEFAULT_SHARE) {
    double with_ticker = PLAN_AUTO_SHARE_AIM * left / (full + ticker_per_share);
    share = with_ticker > PLAN_DEFAULT_SHARE ? (with_ticker < share ? with_ticker : share) : PLAN_DEFAULT_SHARE;
  }
  return share < PLAN_AUTO_SHARE_MIN ? PLAN_AUTO_SHARE_MIN : share > PLAN_AUTO_SHARE_MAX ? PLAN_AUTO_SHARE_MAX : share;
}

// The allocations the hook was meant to see of vm (since start): each share times the allocations it held for.
static double meant_allocations(const sampling_plan *p, uint64_t vm) {
  uint64_t since = vm > p->share_since_allocations ? vm - p->share_since_allocations : 0;
  return p->meant_allocations + p->chain.share * (double)since;
}

static bool stretch_closable(const sampling_plan *p, uint64_t virtual_now, bool lowering);

// The budget's share from the density since the last check. Only the past decides it: the share in
// force until now is accounted for, then the chain changes at this moment (schedule_set_share).
// A stretch holds one share: a change waits until the open stretch can close at this check, and then
// makes it close (plan_close_stretch), so each share's samples are scaled by its own windows' losses
// (the hook sees a different part of its windows at different shares). Lowering, which the budget may
// need soon, waits only for the stretch's windows, not its length. Once PLAN_MAX_STRETCHES have closed
// the share moves freely and the last stretch holds them all.
static bool choose_share(sampling_plan *p, uint64_t virtual_now, uint64_t vm) {
  uint64_t elapsed = virtual_now > p->checked_virtual ? virtual_now - p->checked_virtual : 0;
  uint64_t allocations = vm > p->checked_allocations ? vm - p->checked_allocations : 0;
  p->checked_virtual = virtual_now;
  p->checked_allocations = vm;
  if (elapsed == 0) return false;
  // Heapscope's own time since the last check, less the hook's part of it (plan_charge), over the
  // period's monotonic time (virtual time plus own time).
  uint64_t own = __atomic_load_n(&p->own_nanos, __ATOMIC_RELAXED);
  double own_work = (double)(own - p->checked_own);
  double hook_seen = (double)(p->hook_allocations - p->checked_hook);
  p->checked_own = own;
  p->checked_hook = p->hook_allocations;
  double work = own_work - hook_seen * hook_cost(p);
  p->work_share = work > 0.0 ? work / ((double)elapsed + own_work) : 0.0;
  double density = (double)allocations / (double)elapsed;
  p->hook_cost_share = density * hook_cost(p);
  // The ticker's CPU over the period (a restarted ticker, in a forked child, counts from 0 again).
  uint64_t ticker = p->ticker_cpu_nanos >= p->checked_ticker ? p->ticker_cpu_nanos - p->checked_ticker : p->ticker_cpu_nanos;
  p->checked_ticker = p->ticker_cpu_nanos;
  p->ticker_share = (double)ticker / ((double)elapsed + own_work);
  double share = p->chain.share;
  double wanted = plan_budget_share(p, density, p->work_share, p->ticker_share / share);
  if (wanted > share / 1.25 && wanted < share * 1.25) return false;
  if (wanted > 2.0 * share) wanted = 2.0 * share;
  bool stretches_left = p->stretch_count < PLAN_MAX_STRETCHES;
  bool held = virtual_now < p->share_hold_until;
  if (held || (stretches_left && !stretch_closable(p, virtual_now, wanted < share))) {
    p->share_changes_waited++;
    return false;
  }
  double meant = meant_allocations(p, vm);
  if (!schedule_set_share(&p->chain, wanted, virtual_now)) return false;
  p->stretch_close_owed = stretches_left;
  p->meant_allocations = meant;
  p->share_since_allocations = vm;
  if (p->chain.share < p->min_share) p->min_share = p->chain.share;
  return true;
}

// Only the past decides a rate, and each sample carries the weight of the rate it was drawn at, so
// estimates stay unbiased.
void plan_update_density(sampling_plan *p, uint64_t virtual_now, uint64_t vm_allocations) {
  while (p->next_density_check <= virtual_now) p->next_density_check += SCHEDULE_RETUNE_NANOS;
  // What the open window has seen so far counts now, so the countdown can be drawn anew.
  if (p->window_open) count_seen_allocations(p);
  uint64_t vm = vm_allocations - p->started_allocations;
  uint32_t every = p->budget.current_every;
  uint32_t old_window_every = schedule_window_every(&p->chain, every, p->seen_share);
  uint32_t old_strata_every[PLAN_MAX_STRATA];
  for (uint32_t i = 0; i < p->strata_count; i++) old_strata_every[i] = schedule_window_every(&p->chain, plan_stratum_every(p, i), p->seen_share);
  bool share_changed = p->auto_share && choose_share(p, virtual_now, vm); // (auto_share: windowed)
  if (vm > 0 && p->hook_allocations > 0) {
    // The share of the VM's allocations the hook saw, against the share it was meant to see (the same
    // when the share never moved): the chain's share times how much of its due the hook saw.
    double meant = meant_allocations(p, vm);
    p->seen_share = meant > 0.0 ? p->chain.share * (double)p->hook_allocations / meant : 0.0;
  }
  // A countdown left was drawn at the old rate; a new one is drawn at the new rate (memoryless: for a
  // rate that did not change, the same law as going on). A new share always redraws: the weight changed.
  if (share_changed || old_window_every != schedule_window_every(&p->chain, every, p->seen_share)) plan_draw(p);
  for (uint32_t i = 0; i < p->strata_count; i++) {
    if (share_changed || old_strata_every[i] != schedule_window_every(&p->chain, plan_stratum_every(p, i), p->seen_share)) {
      plan_draw_stratum(p, i);
    }
  }
}

// ---- What the profile reads ----

uint64_t plan_vm_allocations(const sampling_plan *p, uint64_t vm_allocations) { return vm_allocations - p->started_allocations; }

uint64_t plan_hook_allocations(const sampling_plan *p, uint64_t vm) {
  if (!p->windowed) return vm;
  return p->hook_allocations + (p->window_open ? counted_down(p) : 0);
}

double plan_realized_share(const sampling_plan *p, uint64_t virtual_now) {
  if (!p->windowed) return 1.0;
  uint64_t on = p->closed_windows_virtual;
  if (p->window_open && virtual_now > p->window_opened_virtual) on += virtual_now - p->window_opened_virtual;
  return virtual_now > p->started_virtual ? (double)on / (double)(virtual_now - p->started_virtual) : 0.0;
}

uint64_t plan_open_window_allocations(const sampling_plan *p, uint64_t vm) {
  if (!p->windowed || !p->window_open) return 0;
  return plan_hook_allocations(p, vm) - p->window_opened_allocations;
}

double plan_meant_share(const sampling_plan *p, uint64_t vm) {
  if (!p->windowed) return 1.0;
  return vm > 0 ? meant_allocations(p, vm) / (double)vm : p->chain.share;
}

double plan_weight_scale_wanted(const sampling_plan *p, uint64_t vm) {
  if (!p->windowed) return 1.0;
  uint64_t hook = plan_hook_allocations(p, vm);
  // Before any window has been open, nothing was sampled: any scale will do.
  if (hook == 0 || vm == 0) return 1.0;
  // Each stretch at its ratio before the bounds gives the whole run's (its meant allocations over seen).
  return meant_allocations(p, vm) / (double)hook;
}

// Bounded, so that no sample stands for more than a few times sample_every: a run with very few windows
// measures its realized share badly (one window at start, then none, made one Hash a third of a profile).
// Seen in practice: 0.8-2.2 on a loaded machine, 3.2-4.7 in one-second runs on a busy one (late sync
// jobs lose windows); beyond the bounds profiles say so (weight_scale_wanted).
static double bounded_scale(double meant, double seen) {
  if (!(seen > 0.0) || !(meant > 0.0)) return 1.0; // nothing seen: nothing sampled, any scale will do
  double scale = meant / seen;
  return scale < PLAN_WEIGHT_SCALE_MIN ? PLAN_WEIGHT_SCALE_MIN : scale > PLAN_WEIGHT_SCALE_MAX ? PLAN_WEIGHT_SCALE_MAX : scale;
}

double plan_weight_scale(const sampling_plan *p, uint64_t vm) {
  if (!p->windowed) return 1.0;
  uint64_t hook = plan_hook_allocations(p, vm);
  if (hook == 0 || vm == 0) return 1.0;
  double last, open;
  plan_tail_scales(p, vm, &last, &open);
  double open_seen = (double)(hook - p->stretch_hook_start), last_seen = (double)p->last_stretch_hook;
  double before_last = p->scaled_hook_allocations - last_seen * p->last_stretch_scale;
  return (before_last + last_seen * last + open_seen * open) / (double)hook;
}

// ---- Stretches ----

// Windows the open stretch has held (the one open now included).
static uint32_t stretch_windows(const sampling_plan *p) { return p->window + 1 - p->stretch_first_window; }

void plan_tail_scales(const sampling_plan *p, uint64_t vm, double *last, double *open) {
  if (!p->windowed) {
    *last = *open = 1.0;
    return;
  }
  double meant = meant_allocations(p, vm) - p->stretch_meant_start;
  double seen = (double)(plan_hook_allocations(p, vm) - p->stretch_hook_start);
  if (p->stretch_count > 0 && stretch_windows(p) < PLAN_STRETCH_MIN_WINDOWS) {
    // Young: one ratio over the last closed stretch and the open one, as if the last had not closed.
    *last = *open = bounded_scale(meant + p->last_stretch_meant, seen + (double)p->last_stretch_hook);
    return;
  }
  *last = p->last_stretch_scale;
  *open = bounded_scale(meant, seen);
}

// Whether the open stretch may close at virtual time now: between windows, once it has held
// PLAN_STRETCH_MIN_WINDOWS windows in which the hook saw something, and (unless a lowered share is owed
// a stretch of its own) once it has lasted long enough.
static bool stretch_closable(const sampling_plan *p, uint64_t virtual_now, bool lowering) {
  if (!p->windowed || p->window_open || p->stretch_count >= PLAN_MAX_STRETCHES) return false;
  if (stretch_windows(p) < PLAN_STRETCH_MIN_WINDOWS) return false;
  if (p->hook_allocations == p->stretch_hook_start) return false; // nothing seen: nothing to scale
  if (lowering) return true;
  uint64_t age = virtual_now > p->started_virtual ? virtual_now - p->started_virtual : 0;
  uint64_t length = virtual_now > p->stretch_started_virtual ? virtual_now - p->stretch_started_virtual : 0;
  uint64_t min_length = age / PLAN_STRETCH_AGE_DIVISOR;
  return length >= (min_length > PLAN_STRETCH_MIN_NANOS ? min_length : PLAN_STRETCH_MIN_NANOS);
}

bool plan_close_stretch(sampling_plan *p, uint64_t virtual_now, uint64_t vm_allocations, uint32_t *last_window, double *scale) {
  // A share that changed at this check (choose_share) found the stretch closable, lowering or not.
  bool owed = p->stretch_close_owed;
  p->stretch_close_owed = false;
  if (!stretch_closable(p, virtual_now, owed)) return false;
  uint64_t vm = plan_vm_allocations(p, vm_allocations);
  double meant = meant_allocations(p, vm);
  uint64_t seen = p->hook_allocations - p->stretch_hook_start; // no window is open: every one counted
  double stretch_meant = meant - p->stretch_meant_start;
  *scale = bounded_scale(stretch_meant, (double)seen);
  *last_window = p->window;
  p->scaled_hook_allocations += *scale * (double)seen;
  if (p->stretch_count == 0 || *scale < p->stretch_scale_min) p->stretch_scale_min = *scale;
  if (p->stretch_count == 0 || *scale > p->stretch_scale_max) p->stretch_scale_max = *scale;
  p->stretch_count++;
  p->last_stretch_meant = stretch_meant;
  p->last_stretch_hook = seen;
  p->last_stretch_scale = *scale;
  p->stretch_first_window = p->window + 1;
  p->stretch_started_virtual = virtual_now;
  p->stretch_meant_start = meant;
  p->stretch_hook_start = p->hook_allocations;
  return true;
}
