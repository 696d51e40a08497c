// Unit tests for ext/heapscope/sampling_plan.c: the countdown's weights (always, windowed, denser where
// windows were lost, rounded at random with the right mean), the windows' accounting (allocations seen,
// virtual time open, clusters), the weight scale and its bounds, own time and its cap, the density
// check's moments, and the fail-safe's park. All times are handed in: no clock, no Ruby.
//
// The statistical check allows 5 standard errors: it fails by chance with probability below 1e-6.
#include "../../ext/heapscope/sampling_plan.h"
#include "check.h"

#include <math.h>
#include <string.h>

static const uint64_t MS = 1000000ull;

static void start(sampling_plan *p, uint32_t every, bool windowed, uint64_t now, uint64_t vm) {
  memset(p, 0, sizeof *p);
  p->hook_cost_nanos = -1.0;
  plan_config c = {.sample_every = every, .max_overhead = 0.0, .windowed = windowed, .window_share = 0.04};
  plan_start(p, &c, now, vm, 42);
}

// Counts n allocations down in the hook (as alloc_hook.c does), sampling where the countdown hits 0.
// Returns the sum of the samples' weights.
static uint64_t allocate(sampling_plan *p, uint64_t n, uint64_t *samples) {
  uint64_t weights = 0;
  for (uint64_t i = 0; i < n; i++) {
    if (--p->countdown != 0) continue;
    weights += plan_sampled(p);
    (void)plan_cluster(p);
    if (samples) (*samples)++;
    plan_draw(p);
  }
  return weights;
}

static void test_always_weighs_sample_every_and_clusters_each_sample(void) {
  sampling_plan p;
  start(&p, 100, false, 1000, 5000);
  CHECK_EQ_U64(p.draw_weight, 100);
  CHECK_EQ_U64(p.step, p.countdown);
  CHECK(p.countdown >= 1);
  uint32_t before = p.window;
  uint64_t samples = 0;
  uint64_t weights = allocate(&p, 1000000, &samples);
  CHECK_EQ_U64(weights, samples * 100);
  CHECK_EQ_U64(p.window - before, samples); // each sample a cluster of its own
  // About 10,000 samples: within 5 standard errors of the expected count.
  CHECK(fabs((double)samples - 10000.0) < 5 * sqrt(10000.0));
  // Always on: the hook saw every allocation, nothing to scale, the whole time open.
  CHECK_EQ_U64(plan_hook_allocations(&p, 777), 777);
  CHECK(plan_weight_scale(&p, 777) == 1.0);
  CHECK(plan_realized_share(&p, 9999) == 1.0);
  CHECK_EQ_U64(plan_vm_allocations(&p, 6000), 1000);
}

static void test_sample_every_one_samples_everything(void) {
  sampling_plan p;
  start(&p, 1, false, 0, 0);
  uint64_t samples = 0;
  CHECK_EQ_U64(allocate(&p, 1000, &samples), 1000);
  CHECK_EQ_U64(samples, 1000);
}

// Windowed: the in-window rate is share * sample_every, each sample weighs sample_every, and a window's
// allocations are what the hook counted down while it was open, the countdown carrying over.
static void test_windows_count_what_the_hook_saw(void) {
  sampling_plan p;
  start(&p, 1000, true, 0, 0);
  CHECK_EQ_U64(p.sampler.sample_every, 40);
  CHECK_EQ_U64(p.draw_weight, 1000);
  CHECK(!p.window_open);
  CHECK(plan_weight_scale(&p, 100) == 1.0); // nothing seen yet: any scale will do
  plan_open_window(&p, 10 * MS);
  uint32_t first = p.window;
  CHECK(p.window_open);
  uint64_t samples = 0;
  uint64_t weights = allocate(&p, 5000, &samples);
  CHECK_EQ_U64(weights, samples * 1000);
  CHECK_EQ_U64(plan_hook_allocations(&p, 0), 5000);          // the open window's part counts
  CHECK_EQ_U64(plan_open_window_allocations(&p, 0), 5000);
  uint64_t left = p.countdown;
  CHECK_EQ_U64(plan_close_window(&p, 14 * MS), 5000);
  CHECK(!p.window_open);
  CHECK_EQ_U64(p.countdown, left); // memoryless: the next window goes on with what is left
  CHECK_EQ_U64(plan_open_window_allocations(&p, 0), 0);
  // Open 4 ms of the 20 since start.
  CHECK(fabs(plan_realized_share(&p, 20 * MS) - 0.2) < 1e-12);
  plan_open_window(&p, 30 * MS);
  CHECK_EQ_U64(p.window, first + 1);
  allocate(&p, 300, NULL);
  CHECK(plan_cluster(&p) == first + 1); // windowed: the samples of one window share its number
  CHECK_EQ_U64(plan_close_window(&p, 31 * MS), 300);
  CHECK_EQ_U64(plan_hook_allocations(&p, 0), 5300);
}

// The weight scale: share x (VM's allocations) / (hook's), bounded to [0.5, 5]; the wanted one not.
static void test_weight_scale(void) {
  sampling_plan p;
  start(&p, 1000, true, 0, 1000);
  plan_open_window(&p, 0);
  allocate(&p, 2000, NULL);
  plan_close_window(&p, MS);
  CHECK(fabs(plan_weight_scale_wanted(&p, 100000) - 2.0) < 1e-12); // 0.04 x 100000 / 2000
  CHECK(fabs(plan_weight_scale(&p, 100000) - 2.0) < 1e-12);
  CHECK(fabs(plan_weight_scale_wanted(&p, 1000000) - 20.0) < 1e-12);
  CHECK(plan_weight_scale(&p, 1000000) == PLAN_WEIGHT_SCALE_MAX);
  CHECK(fabs(plan_weight_scale_wanted(&p, 10000) - 0.2) < 1e-12);
  CHECK(plan_weight_scale(&p, 10000) == PLAN_WEIGHT_SCALE_MIN);
}

// At fixed moments (50 ms after start, then every 0.5 s) the share of allocations seen sets a denser
// in-window rate; its samples weigh less, at random around their exact weight, with that mean.
static void test_density_check_makes_windows_denser(void) {
  sampling_plan p;
  start(&p, 333, true, 0, 0); // in-window 1 in 13, share 13/333
  CHECK(!plan_density_due(&p, 49 * MS));
  CHECK(plan_density_due(&p, 50 * MS));
  plan_open_window(&p, 0);
  allocate(&p, 300, NULL);
  plan_update_density(&p, 50 * MS, 10000); // the hook saw 3% of 10,000
  CHECK(fabs(p.seen_share - 0.03) < 1e-12);
  CHECK(!plan_density_due(&p, 549 * MS));
  CHECK(plan_density_due(&p, 550 * MS));
  CHECK_EQ_U64(p.sampler.sample_every, 10); // round(333 x 0.03)
  double exact = 10.0 / p.chain.share;      // 256.15...
  uint64_t n = 0;
  double sum = 0.0;
  for (int i = 0; i < 200000; i++) {
    plan_draw(&p);
    CHECK(p.draw_weight == (uint32_t)floor(exact) || p.draw_weight == (uint32_t)floor(exact) + 1);
    sum += p.draw_weight;
    n++;
  }
  // A Bernoulli rounding of variance at most 1/4 per draw.
  CHECK(fabs(sum / n - exact) < 5 * 0.5 / sqrt((double)n));
}

// Own time leaves virtual time; the hook's estimated part is capped at half the rest of the time since
// the last charge; work also goes to the budget.
static void test_charges_leave_virtual_time(void) {
  sampling_plan p;
  start(&p, 100, true, 1000, 0);
  plan_set_hook_cost(&p, 50.0);
  uint64_t own = p.own_nanos;
  p.uncharged_allocations = 100; // 5,000 ns of hook cost
  plan_charge(&p, 1000 + 20000, 1000 + 21000); // 1,000 ns of work, 20,000 ns of the rest
  CHECK_EQ_U64(p.own_nanos - own, 6000);
  CHECK_EQ_U64(p.uncharged_allocations, 0);
  CHECK_EQ_U64(p.budget.total_spent, 1000);
  p.uncharged_allocations = 1000; // 50,000 ns, but only 4,000 ns passed since: at most 2,000
  plan_charge(&p, 1000 + 25000, 1000 + 25000);
  CHECK_EQ_U64(p.own_nanos - own, 8000);
  CHECK_EQ_U64(plan_virtual_now(&p, 100000), 100000 - p.own_nanos);
  // own time and the hook's cost outlive a run.
  plan_config c = {.sample_every = 100, .windowed = true, .window_share = 0.04};
  plan_start(&p, &c, 200000, 0, 1);
  CHECK_EQ_U64(p.own_nanos - own, 8000);
  CHECK(p.hook_cost_nanos == 50.0);
}

// At a sync point: the requested state while a ticker runs, the chain's own otherwise, never when held
// shut.
static void test_hook_wanted(void) {
  sampling_plan p;
  start(&p, 1000, true, 0, 0);
  bool requested = schedule_requested(&p.chain);
  CHECK(plan_hook_wanted(&p, 0, true, false) == requested);
  CHECK(!plan_hook_wanted(&p, 0, true, true));
  int on = 0;
  for (uint64_t t = 0; t < 2000 * MS; t += MS / 10) {
    bool chain = schedule_state_at(&p.chain, t);
    CHECK(plan_hook_wanted(&p, t, false, false) == chain);
    CHECK(schedule_requested(&p.chain) == chain); // read without a ticker: a request of its own
    on += chain;
  }
  CHECK(on > 0); // 4% of 20,000 moments: on at some
  start(&p, 1000, false, 0, 0);
  CHECK(plan_hook_wanted(&p, 5, false, false)); // always: a share of 1
}

// The fail-safe: parked for good (draws leave it parked) until the next start; a park alone is undone
// by the next draw.
static void test_halt_and_park(void) {
  sampling_plan p;
  start(&p, 100, false, 0, 0);
  plan_park(&p);
  CHECK(p.countdown == UINT64_MAX);
  plan_draw(&p);
  CHECK(p.countdown < UINT64_MAX);
  plan_halt(&p);
  plan_draw(&p);
  CHECK(p.countdown == UINT64_MAX);
  CHECK(p.halted);
  plan_config c = {.sample_every = 100};
  plan_start(&p, &c, 0, 0, 3);
  CHECK(!p.halted);
  CHECK(p.countdown < UINT64_MAX);
}

// Focused classes (strata): a stratum's allocations count down its own countdown, never the common one.
// Interleaves n allocations, every `stride`-th one of stratum 0, the rest common; returns the strata's
// and the common samples' weights in *focused and *common.
static void allocate_mixed(sampling_plan *p, uint64_t n, uint64_t stride, uint64_t *focused, uint64_t *common) {
  for (uint64_t i = 0; i < n; i++) {
    if (i % stride == 0) {
      if (--p->strata[0].countdown != 0) continue;
      *focused += plan_sampled_stratum(p, 0);
      (void)plan_cluster(p);
      plan_draw_stratum(p, 0);
    } else {
      if (--p->countdown != 0) continue;
      *common += plan_sampled(p);
      (void)plan_cluster(p);
      plan_draw(p);
    }
  }
}

static void start_focused(sampling_plan *p, uint32_t every, bool windowed, uint32_t stratum_every) {
  memset(p, 0, sizeof *p);
  p->hook_cost_nanos = -1.0;
  uint32_t strata[1] = {stratum_every};
  plan_config c = {.sample_every = every, .windowed = windowed, .window_share = 0.04, .strata_every = strata, .strata_count = 1};
  plan_start(p, &c, 0, 0, 7);
}

// Always: each stratum's sample weighs its own rate and the weights add up to its allocations (within
// 5 standard errors: sqrt(n (w - 1)) for n allocations at weight w); the common rate's likewise.
static void test_strata_weigh_their_own_rate(void) {
  sampling_plan p;
  start_focused(&p, 1000, false, 10);
  CHECK_EQ_U64(p.strata_count, 1);
  CHECK_EQ_U64(p.strata[0].draw_weight, 10);
  CHECK_EQ_U64(p.draw_weight, 1000);
  uint64_t focused = 0, common = 0;
  allocate_mixed(&p, 4000000, 4, &focused, &common); // 1,000,000 focused, 3,000,000 common
  CHECK(fabs((double)focused - 1e6) < 5 * sqrt(1e6 * 9));
  CHECK(fabs((double)common - 3e6) < 5 * sqrt(3e6 * 999));
  CHECK_EQ_U64(focused % 10, 0);
  CHECK(p.strata[0].samples > 90000 && p.strata[0].samples < 110000);
  CHECK_EQ_U64(plan_hook_allocations(&p, 4000000), 4000000); // always: all of them
}

// Windowed: a stratum's allocations count among those the hook saw (the weight scale needs them all:
// left out, focusing a quarter of the allocations would scale every weight up by 4/3); its in-window
// rate is denser by 1 / share as the common one's, and no denser than every allocation.
static void test_strata_count_toward_the_hook_and_windows(void) {
  sampling_plan p;
  start_focused(&p, 1000, true, 100);
  plan_open_window(&p, 0);
  uint64_t focused = 0, common = 0;
  allocate_mixed(&p, 100000, 4, &focused, &common);
  CHECK_EQ_U64(plan_hook_allocations(&p, 0), 100000);
  CHECK_EQ_U64(plan_open_window_allocations(&p, 0), 100000);
  CHECK_EQ_U64(plan_close_window(&p, MS), 100000);
  CHECK(fabs(plan_weight_scale_wanted(&p, 2500000) - 1.0) < 1e-12); // 0.04 x 2,500,000 / 100,000
  CHECK_EQ_U64(p.strata[0].draw_weight, 100); // 4 / 0.04
  // A rate denser than 1 / share: every allocation inside windows, each weighing 1 / share.
  start_focused(&p, 1000, true, 10);
  CHECK_EQ_U64(p.strata[0].draw_weight, 25);
  CHECK_EQ_U64(p.strata[0].step, 1);
}

// The budget lowers a stratum's rate by the factor it lowered the common one; park and halt stop the
// strata's countdowns too.
static void test_strata_follow_the_budget_and_park(void) {
  sampling_plan p;
  start_focused(&p, 1000, false, 10);
  CHECK_EQ_U64(plan_stratum_every(&p, 0), 10);
  p.budget.current_every = 4000;
  CHECK_EQ_U64(plan_stratum_every(&p, 0), 40);
  plan_draw_stratum(&p, 0);
  CHECK_EQ_U64(p.strata[0].draw_weight, 40);
  plan_park(&p);
  CHECK(p.strata[0].countdown == UINT64_MAX);
  plan_halt(&p);
  plan_draw_stratum(&p, 0);
  CHECK(p.strata[0].countdown == UINT64_MAX);
}

// Automatic focus moves a stratum to another rate mid-run: what its countdown had counted down inside
// the open window counts as seen, and the next sample weighs the new rate.
static void test_stratum_rate_changes_keep_the_count(void) {
  sampling_plan p;
  start_focused(&p, 1000, true, 1000);
  plan_open_window(&p, 0);
  uint64_t focused = 0, common = 0;
  allocate_mixed(&p, 1000, 2, &focused, &common); // 500 of the stratum's, 500 common
  CHECK_EQ_U64(plan_hook_allocations(&p, 0), 1000);
  plan_set_stratum_every(&p, 0, 100);
  CHECK_EQ_U64(p.strata[0].every, 100);
  CHECK_EQ_U64(p.strata[0].draw_weight, 100);
  CHECK_EQ_U64(plan_hook_allocations(&p, 0), 1000); // nothing lost, nothing counted twice
  allocate_mixed(&p, 1000, 2, &focused, &common);
  CHECK_EQ_U64(plan_close_window(&p, MS), 2000);
  plan_set_stratum_every(&p, 0, 0); // a rate below 1 is 1
  CHECK_EQ_U64(p.strata[0].every, 1);
}

// A forked child draws other countdowns than its parent.
static void test_reseed_changes_the_draws(void) {
  sampling_plan a, b;
  start(&a, 1000, true, 0, 0);
  b = a;
  plan_reseed(&b, 12345);
  int same = 0;
  for (int i = 0; i < 20; i++) {
    plan_draw(&a);
    plan_draw(&b);
    same += a.countdown == b.countdown;
  }
  CHECK(same < 20);
  CHECK_EQ_U64(b.sampler.sample_every, a.sampler.sample_every);
}

// Opens and closes n windows from virtual time t on, `gap` apart and 0.1 ms long each, the hook seeing
// `each` allocations in every one. Returns the time after them.
static uint64_t windows_apart(sampling_plan *p, uint32_t n, uint64_t each, uint64_t t, uint64_t gap) {
  for (uint32_t i = 0; i < n; i++, t += gap) {
    plan_open_window(p, t);
    allocate(p, each, NULL);
    plan_close_window(p, t + MS / 10);
  }
  return t;
}

// A stretch's worth of windows in a short time: 0.4 ms apart.
static void fill_stretch(sampling_plan *p, uint64_t t, uint32_t n, uint64_t each) { windows_apart(p, n, each, t, 4 * MS / 10); }

// A windowed run whose share the 1% budget sets, with an enabled hook costing 50 ns an allocation.
static void start_budget(sampling_plan *p) {
  memset(p, 0, sizeof *p);
  plan_set_hook_cost(p, 50.0);
  plan_config c = {.sample_every = 1000, .max_overhead = 0.01, .windowed = true, .window_share = 0.0};
  plan_start(p, &c, 0, 0, 5);
}

// The budget's share (window_share 0 with a budget): starts at the default share, follows the
// measured density of allocations times the hook's cost at the density checks (down as soon as a
// stretch can close with it, up at most 2x a check), redraws the countdown at the new share's weight,
// and the weight scale counts each share for the allocations it held.
static void test_the_budget_sets_the_share(void) {
  sampling_plan p;
  start_budget(&p);
  CHECK(p.auto_share);
  CHECK(p.chain.share == PLAN_DEFAULT_SHARE);
  p.share_hold_until = 0; // (the first second's hold: test_a_stretch_holds_one_share)
  CHECK_EQ_U64(p.chain.window_every, 40);
  CHECK(!plan_density_due(&p, 49 * MS)); // checks at 50 ms, then every 0.5 s
  CHECK(plan_density_due(&p, 50 * MS));
  // 1,000,000 allocations in 50 ms (20 per us) x 50 ns: on all the time the hook would cost 100%, so
  // 1% buys a share of 0.008 (the hook aims at 0.8 of the budget). The hook saw its 4% of them, in a
  // stretch's worth of windows (a share changes only as its stretch closes: test_a_stretch_holds_one_share).
  fill_stretch(&p, 0, PLAN_STRETCH_MIN_WINDOWS, 40000 / PLAN_STRETCH_MIN_WINDOWS);
  uint32_t last = 0;
  double scale = 0.0;
  plan_update_density(&p, 50 * MS, 1000000);
  CHECK(plan_close_stretch(&p, 50 * MS, 1000000, &last, &scale)); // lowering: it need not last 0.5 s
  CHECK(fabs(scale - 1.0) < 1e-12); // scaled at the share its windows were drawn at
  CHECK(fabs(p.hook_cost_share - 1.0) < 1e-9);
  CHECK(fabs(p.chain.share - 0.008) < 1e-12);
  CHECK_EQ_U64(p.chain.window_every, 8);
  CHECK_EQ_U64(p.chain.share_changes, 1);
  CHECK(fabs(p.min_share - 0.008) < 1e-12);
  CHECK(p.draw_weight == 1000); // 8 / 0.008: the countdown was drawn anew at the new share
  CHECK(!plan_density_due(&p, 549 * MS));
  CHECK(plan_density_due(&p, 550 * MS));
  CHECK(fabs(plan_weight_scale_wanted(&p, 1000000) - 1.0) < 1e-9);
  // The next 1,000,000 at 0.008: the hook sees 8,000 of them. Each share counts for its own allocations.
  plan_open_window(&p, 60 * MS);
  allocate(&p, 8000, NULL);
  plan_close_window(&p, 70 * MS);
  CHECK(fabs(plan_weight_scale_wanted(&p, 2000000) - 1.0) < 1e-9); // (40,000 + 8,000) / 48,000
  CHECK(fabs(plan_meant_share(&p, 2000000) - 0.024) < 1e-12);
  // Had the hook seen half of what the second share meant, every value would be scaled by 56/48.
  CHECK(fabs(plan_weight_scale_wanted(&p, 3000000) - 56000.0 / 48000.0) < 1e-9);
  // Then the program nearly stops allocating: the share goes up, at most 2x a check, to its top.
  fill_stretch(&p, 100 * MS, PLAN_STRETCH_MIN_WINDOWS, 1);
  plan_update_density(&p, 550 * MS, 2000100);
  CHECK(fabs(p.chain.share - 0.016) < 1e-12);
  CHECK(plan_close_stretch(&p, 550 * MS, 2000100, &last, &scale));
  fill_stretch(&p, 600 * MS, PLAN_STRETCH_MIN_WINDOWS, 1);
  plan_update_density(&p, 1050 * MS, 2000200);
  CHECK(fabs(p.chain.share - 0.032) < 1e-12);
  CHECK(plan_close_stretch(&p, 1050 * MS, 2000200, &last, &scale));
  CHECK_EQ_U64(p.chain.share_changes, 3);
  CHECK_EQ_U64(p.stretch_count, 3);
  CHECK_EQ_U64(p.share_changes_waited, 0);
  // A change under a quarter is left alone: 5,400,000 allocations in 0.5 s (10.8 per us) buy 0.0148,
  // then 0.0136 is too close to move to.
  fill_stretch(&p, 1100 * MS, PLAN_STRETCH_MIN_WINDOWS, 1);
  plan_update_density(&p, 1550 * MS, 2000200 + 5400000);
  CHECK(fabs(p.chain.share - 0.015) < 1e-12); // 0.0148 rounded to a whole in-window rate (15)
  CHECK(plan_close_stretch(&p, 1550 * MS, 2000200 + 5400000, &last, &scale));
  plan_update_density(&p, 2050 * MS, 2000200 + 5400000 + 5880000);
  CHECK(fabs(p.chain.share - 0.015) < 1e-12);
  CHECK_EQ_U64(p.share_changes_waited, 0); // too close to move is not a change that waited
  // Heapscope's own work takes from the budget first; the hook keeps at least a quarter of it.
  CHECK(plan_budget_share(&p, 0.0, 0.0, 0.0) == PLAN_AUTO_SHARE_MAX);
  CHECK(plan_budget_share(&p, 1.0, 0.0, 0.0) == PLAN_AUTO_SHARE_MIN);
  CHECK(fabs(plan_budget_share(&p, 0.002, 0.004, 0.0) - 0.8 * 0.006 / 0.1) < 1e-12);
  CHECK(fabs(plan_budget_share(&p, 0.002, 0.02, 0.0) - 0.8 * 0.0025 / 0.1) < 1e-12);
  // Above the default the ticker's wake-ups count too (here the hook alone would cost 0.4%): at 2% of
  // the time per 0.04 (50% per unit of share) the share stays at the default, at 2% per unit it rises
  // to a third; they never lower it (a dense program's share is the hook's alone).
  CHECK(plan_budget_share(&p, 0.00008, 0.0, 0.5) == PLAN_DEFAULT_SHARE);
  CHECK(fabs(plan_budget_share(&p, 0.00008, 0.0, 0.02) - 0.8 * 0.01 / 0.024) < 1e-12);
  CHECK(fabs(plan_budget_share(&p, 0.02, 0.0, 0.5) - 0.008) < 1e-12);
  // A share given, or no budget: fixed, never moved.
  plan_config fixed = {.sample_every = 1000, .max_overhead = 0.01, .windowed = true, .window_share = 0.04};
  plan_start(&p, &fixed, 0, 0, 5);
  CHECK(!p.auto_share);
  plan_update_density(&p, 50 * MS, 1000000);
  CHECK(fabs(p.chain.share - 0.04) < 1e-12);
  plan_config no_budget = {.sample_every = 1000, .windowed = true, .window_share = 0.0};
  plan_start(&p, &no_budget, 0, 0, 5);
  CHECK(!p.auto_share);
  CHECK(fabs(p.chain.share - PLAN_DEFAULT_SHARE) < 1e-12);
}

// windows_apart, 1 ms apart.
static uint64_t windows_seeing(sampling_plan *p, uint32_t n, uint64_t each, uint64_t t) { return windows_apart(p, n, each, t, MS); }

// A stretch closes at a density check between windows, once it has held enough windows and lasted long
// enough; its scale is its own meant over seen allocations (bounded), and the run's scale is each
// stretch's weighted by what the hook saw in it.
static void test_stretches_scale_each_part_of_the_run(void) {
  const uint64_t n = PLAN_STRETCH_MIN_WINDOWS;
  sampling_plan p;
  start(&p, 1000, true, 0, 0); // share 0.04
  uint32_t last = 0;
  double scale = 0.0;
  // n windows of 50 allocations: 50 n seen where 0.04 of 2,500 n (100 n) were meant, a scale of 2.
  uint64_t t = windows_seeing(&p, (uint32_t)n - 1, 50, 0);
  uint64_t vm1 = 2500 * (n - 1);
  CHECK(!plan_close_stretch(&p, 600 * MS, vm1, &last, &scale)); // one window short
  t = windows_seeing(&p, 1, 50, t);
  vm1 += 2500;
  CHECK(!plan_close_stretch(&p, 400 * MS, vm1, &last, &scale)); // not half a second yet
  plan_open_window(&p, 600 * MS);
  CHECK(!plan_close_stretch(&p, 600 * MS, vm1, &last, &scale)); // a window is open
  plan_close_window(&p, 600 * MS);
  CHECK(plan_close_stretch(&p, 600 * MS, vm1, &last, &scale));
  CHECK_EQ_U64(p.stretch_count, 1);
  CHECK_EQ_U64(last, p.window);
  CHECK(fabs(scale - 2.0) < 1e-12);
  CHECK(fabs(plan_weight_scale(&p, vm1) - 2.0) < 1e-12);
  // The open stretch, young, pools with the last closed one: 5 windows seeing all they were meant to.
  t = windows_seeing(&p, 5, 40, 700 * MS);
  uint64_t vm2 = vm1 + 5000; // 0.04 x 5,000 = 200 meant, 200 seen
  double pooled = (100.0 * n + 200.0) / (50.0 * n + 200.0);
  double last_scale, open_scale;
  plan_tail_scales(&p, vm2, &last_scale, &open_scale);
  CHECK(fabs(last_scale - pooled) < 1e-12 && fabs(open_scale - pooled) < 1e-12); // one ratio over the two
  // No bound held, so the run's scale is what it wanted: pooling is no reason for a report to warn.
  CHECK(fabs(plan_weight_scale(&p, vm2) - plan_weight_scale_wanted(&p, vm2)) < 1e-12);
  CHECK(fabs(plan_weight_scale(&p, vm2) - pooled) < 1e-12);
  // Grown, it has its own: n windows in all, seeing all of theirs (scale 1). The run's scale weighs each.
  t = windows_seeing(&p, (uint32_t)n - 5, 40, t);
  vm2 = vm1 + 1000 * n; // 40 n seen, 40 n meant
  plan_tail_scales(&p, vm2, &last_scale, &open_scale);
  CHECK(fabs(last_scale - 2.0) < 1e-12 && fabs(open_scale - 1.0) < 1e-12); // each its own
  CHECK(fabs(plan_weight_scale(&p, vm2) - (2.0 * 50 * n + 1.0 * 40 * n) / (90.0 * n)) < 1e-12);
  CHECK(fabs(plan_weight_scale_wanted(&p, vm2) - 0.04 * (double)vm2 / (90.0 * n)) < 1e-12);
  uint32_t first_last = last;
  CHECK(plan_close_stretch(&p, 1200 * MS, vm2, &last, &scale));
  CHECK(fabs(scale - 1.0) < 1e-12);
  CHECK_EQ_U64(last - first_last, n);
  CHECK(p.stretch_scale_min == 1.0 && p.stretch_scale_max == 2.0);
  // A stretch that saw a twentieth of its due is held at the bound, and the run's scale says so.
  t = windows_seeing(&p, (uint32_t)n, 1, t);
  uint64_t vm3 = vm2 + 500 * n; // 20 n meant, n seen
  CHECK(plan_close_stretch(&p, 1800 * MS, vm3, &last, &scale));
  CHECK(scale == PLAN_WEIGHT_SCALE_MAX);
  CHECK(plan_weight_scale(&p, vm3) < plan_weight_scale_wanted(&p, vm3));
  // Late in a long run a stretch lasts at least 1 / 64 of the run so far: about 2 s at 128 s.
  windows_seeing(&p, (uint32_t)n, 40, 125000 * MS);
  CHECK(plan_close_stretch(&p, 126000 * MS, vm3 + 1000 * n, &last, &scale));
  windows_seeing(&p, (uint32_t)n, 40, 126000 * MS);
  CHECK(!plan_close_stretch(&p, 127000 * MS, vm3 + 2000 * n, &last, &scale));
  CHECK(plan_close_stretch(&p, 128100 * MS, vm3 + 2000 * n, &last, &scale));
  CHECK_EQ_U64(p.stretch_count, 5);
  // Always on: no stretches.
  start(&p, 1000, false, 0, 0);
  allocate(&p, 100000, NULL);
  CHECK(!plan_close_stretch(&p, 10000 * MS, 100000, &last, &scale));
  plan_tail_scales(&p, 100000, &last_scale, &open_scale);
  CHECK(last_scale == 1.0 && open_scale == 1.0);
}

// The budget's share changes only where the open stretch closes with it, so every stretch holds one
// share and its samples are scaled by its own windows' losses: a change waits in the run's first second
// (PLAN_SHARE_HOLD_NANOS), while a window is open,
// while the stretch has held too few windows, and (going up) until it has lasted long enough; going
// down waits for the windows only. Once no stretch is left to close, the share moves freely.
static void test_a_stretch_holds_one_share(void) {
  sampling_plan p;
  start_budget(&p);
  uint32_t last = 0;
  double scale = 0.0;
  // Dense (the budget wants 0.008), but it is the run's first second, and the stretch has held one
  // window: the change waits.
  fill_stretch(&p, 0, 1, 400);
  plan_update_density(&p, 50 * MS, 1000000);
  CHECK(p.chain.share == PLAN_DEFAULT_SHARE);
  CHECK_EQ_U64(p.share_changes_waited, 1);
  CHECK(!plan_close_stretch(&p, 50 * MS, 1000000, &last, &scale));
  // Enough windows and no window open, but still the first second: it waits.
  fill_stretch(&p, MS, PLAN_STRETCH_MIN_WINDOWS, 4000);
  plan_update_density(&p, 300 * MS, 6000000);
  CHECK(p.chain.share == PLAN_DEFAULT_SHARE);
  CHECK_EQ_U64(p.share_changes_waited, 2);
  CHECK(!plan_close_stretch(&p, 300 * MS, 6000000, &last, &scale)); // (the stretch's own rule: 0.5 s)
  // Past it, one window is open at the check: it waits again.
  plan_open_window(&p, 100 * MS);
  plan_update_density(&p, 1050 * MS, 21000000);
  CHECK(p.chain.share == PLAN_DEFAULT_SHARE);
  CHECK_EQ_U64(p.share_changes_waited, 3);
  CHECK(!plan_close_stretch(&p, 1050 * MS, 21000000, &last, &scale));
  plan_close_window(&p, 101 * MS);
  // Between windows, going down: the share changes and the stretch closes with it; its scale is the
  // old share's ratio alone.
  plan_update_density(&p, 1550 * MS, 31000000);
  CHECK(fabs(p.chain.share - 0.008) < 1e-12);
  uint64_t seen = p.hook_allocations;
  CHECK(plan_close_stretch(&p, 1550 * MS, 31000000, &last, &scale));
  CHECK(fabs(scale - 0.04 * 31000000.0 / (double)seen) < 1e-9);
  CHECK_EQ_U64(p.stretch_count, 1);
  // Going up waits for the stretch's length too: 100 windows in 0.25 s are not enough.
  fill_stretch(&p, 1600 * MS, PLAN_STRETCH_MIN_WINDOWS, 10);
  plan_update_density(&p, 1800 * MS, 31000000 + 100);
  CHECK(fabs(p.chain.share - 0.008) < 1e-12);
  CHECK_EQ_U64(p.share_changes_waited, 4);
  CHECK(!plan_close_stretch(&p, 1800 * MS, 31000000 + 100, &last, &scale));
  plan_update_density(&p, 2050 * MS, 31000000 + 200);
  CHECK(fabs(p.chain.share - 0.016) < 1e-12);
  CHECK(plan_close_stretch(&p, 2050 * MS, 31000000 + 200, &last, &scale));
  CHECK_EQ_U64(p.stretch_count, 2);
  // A stretch due closes whether or not the share moves (plan_close_stretch's own rule).
  fill_stretch(&p, 2100 * MS, PLAN_STRETCH_MIN_WINDOWS, 10);
  const uint64_t vm = 31000000 + 200 + 5000000; // 10 per us x 50 ns: 0.016 is what it buys
  plan_update_density(&p, 2550 * MS, vm);
  CHECK(fabs(p.chain.share - 0.016) < 1e-12);
  CHECK(plan_close_stretch(&p, 2550 * MS, vm, &last, &scale));
  // No stretch left to close: the share moves at once, window open or not.
  p.stretch_count = PLAN_MAX_STRETCHES;
  uint64_t waited = p.share_changes_waited;
  plan_open_window(&p, 2600 * MS);
  plan_update_density(&p, 3050 * MS, vm + 100);
  CHECK(fabs(p.chain.share - 0.032) < 1e-12);
  CHECK_EQ_U64(p.share_changes_waited, waited);
  CHECK(!plan_close_stretch(&p, 3050 * MS, vm + 100, &last, &scale));
}

// A program that allocates little: the share doubles at each stretch that closes, up to its top of 1 / 2,
// where windows last 500 us (the gaps between them keep their 500 us mean) and a sample still weighs
// sample_every; when the program turns dense, the share comes down at the next check that can close a
// stretch, in one step.
static void test_a_light_program_gets_half_the_time(void) {
  sampling_plan p;
  start_budget(&p);
  p.share_hold_until = 0;
  uint64_t t = 0, vm = 0;
  uint32_t last = 0;
  double scale = 0.0;
  const double expected[] = {0.08, 0.16, 0.32, PLAN_AUTO_SHARE_MAX, PLAN_AUTO_SHARE_MAX};
  for (int i = 0; i < 5; i++, t += 500 * MS) {
    // The hook sees the 100 allocations its share meant of a few thousand a second (0.01-0.03% of the time).
    fill_stretch(&p, t + MS, PLAN_STRETCH_MIN_WINDOWS, 1);
    vm += (uint64_t)llround(PLAN_STRETCH_MIN_WINDOWS / p.chain.share);
    plan_update_density(&p, t + 550 * MS, vm);
    CHECK(fabs(p.chain.share - expected[i]) < 1e-12);
    CHECK(plan_close_stretch(&p, t + 550 * MS, vm, &last, &scale)); // due also where the share held
    CHECK(fabs(scale - 1.0) < 1e-2);
  }
  CHECK_EQ_U64(p.chain.window_every, 500);
  CHECK(p.draw_weight == 1000);
  CHECK(p.chain.mean_on_nanos >= SCHEDULE_MIN_MEAN_OFF_NANOS);
  // 10 million allocations in the next 0.5 s (20 per us, the hook 100% of the time): down to 0.008 at once.
  fill_stretch(&p, t + MS, PLAN_STRETCH_MIN_WINDOWS, 1);
  plan_update_density(&p, t + 550 * MS, vm + 10000000);
  CHECK(fabs(p.chain.share - 0.008) < 1e-12);
  CHECK(plan_close_stretch(&p, t + 550 * MS, vm + 10000000, &last, &scale));
}

int main(void) {
  test_always_weighs_sample_every_and_clusters_each_sample();
  test_sample_every_one_samples_everything();
  test_windows_count_what_the_hook_saw();
  test_weight_scale();
  test_density_check_makes_windows_denser();
  test_charges_leave_virtual_time();
  test_hook_wanted();
  test_halt_and_park();
  test_reseed_changes_the_draws();
  test_strata_weigh_their_own_rate();
  test_strata_count_toward_the_hook_and_windows();
  test_strata_follow_the_budget_and_park();
  test_stratum_rate_changes_keep_the_count();
  test_the_budget_sets_the_share();
  test_stretches_scale_each_part_of_the_run();
  test_a_stretch_holds_one_share();
  test_a_light_program_gets_half_the_time();
  return check_report("test_sampling_plan");
}
