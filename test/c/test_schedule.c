// Unit tests for ext/heapscope/schedule.c: the chain is on for its share of the time, at any moment
// chosen without looking at it (the property every estimate rests on), also after a retune; its path
// does not depend on how often it is asked; weights are exactly sample_every, or exactly what a denser
// in-window rate makes them.
//
// The statistical checks allow 5 standard errors: each fails by chance with probability below 1e-6.
#include "../../ext/heapscope/schedule.h"
#include "check.h"

#include <math.h>

static const double D = SCHEDULE_MIN_MEAN_ON_NANOS;

// |observed - expected| within 5 standard errors of a proportion p over n trials.
static bool near_share(double observed, double p, double n) { return fabs(observed - p) <= 5.0 * sqrt(p * (1.0 - p) / n); }

static void test_share_is_adjusted_to_whole_rates(void) {
  schedule s;
  schedule_init(&s, 0.04, 1000, 0, 1);
  CHECK_EQ_U64(s.window_every, 40);
  CHECK(s.share == 0.04);
  CHECK(schedule_weight(&s, s.window_every) == 1000.0);
  // 0.04 * 333 = 13.32: 13 in the window, so the share is 13/333, and a sample still weighs 333.
  schedule_init(&s, 0.04, 333, 0, 1);
  CHECK_EQ_U64(s.window_every, 13);
  CHECK(fabs(schedule_weight(&s, s.window_every) - 333.0) < 1e-9);
  // A rate too high for the share: the share goes up, the rate never down.
  schedule_init(&s, 0.04, 10, 0, 1);
  CHECK_EQ_U64(s.window_every, 1);
  CHECK(fabs(s.share - 0.1) < 1e-12);
  CHECK(fabs(schedule_weight(&s, 1) - 10.0) < 1e-9);
  // The budget doubling the in-window rate doubles the weight.
  schedule_init(&s, 0.04, 1000, 0, 1);
  CHECK(schedule_weight(&s, 80) == 2000.0);
}

// Windows lost to late sync points are made up for by sampling the others more densely, within bounds,
// and a sample's weight is what its in-window rate makes it.
static void test_window_every_follows_the_share_seen(void) {
  schedule s;
  schedule_init(&s, 0.04, 1000, 0, 1);
  CHECK_EQ_U64(schedule_window_every(&s, 1000, 0.0), 40);   // nothing measured yet
  CHECK_EQ_U64(schedule_window_every(&s, 1000, 0.04), 40);  // no window lost
  CHECK_EQ_U64(schedule_window_every(&s, 1000, 0.07), 40);  // more seen than planned: never sparser
  CHECK_EQ_U64(schedule_window_every(&s, 1000, 0.025), 25); // 5/8 seen: 8/5 as dense
  CHECK(schedule_weight(&s, 25) == 625.0);                  // 25 / 0.04: the sample stands for fewer
  CHECK_EQ_U64(schedule_window_every(&s, 1000, 0.001), 10); // at most SCHEDULE_MAX_DENSER times denser
  CHECK_EQ_U64(schedule_window_every(&s, 2000, 0.025), 50); // the budget's lower rate, alike
  CHECK(schedule_weight(&s, 50) == 1250.0);
  schedule_init(&s, 0.04, 10, 0, 1); // in-window rate already 1: it cannot go denser
  CHECK_EQ_U64(schedule_window_every(&s, 10, 0.01), 1);
  schedule_init(&s, 0.04, 1, 0, 1); // always on
  CHECK_EQ_U64(schedule_window_every(&s, 1, 0.5), 1);
}

static void test_sample_every_one_is_always_on(void) {
  schedule s;
  schedule_init(&s, 0.04, 1, 0, 7);
  CHECK(s.share == 1.0);
  CHECK_EQ_U64(s.window_every, 1);
  for (uint64_t t = 0; t < 1000000000ull; t += 12345677) CHECK(schedule_state_at(&s, t));
  // Always on: the only events are the retune moments (a ticker wakes for those alone).
  CHECK(s.next_change == UINT64_MAX);
  CHECK_EQ_U64(schedule_next_event(&s), s.next_retune);
}

// A share changed at a moment the chain itself chose (its first flip after 3 ms, the worst case: a sync
// job runs at such a flip): at fixed moments after it, the chain is on with the new share's probability,
// going down (0.5 to 0.04) and up (0.04 to 0.25); the in-window rate follows, and so does the weight.
static void test_a_changed_share_holds_from_the_change_on(void) {
  const double from[] = {0.5, 0.04}, to[] = {0.04, 0.25};
  const int chains = 40000;
  for (int k = 0; k < 2; k++) {
    int on_soon = 0, on_later = 0;
    for (int i = 0; i < chains; i++) {
      schedule s;
      schedule_init(&s, from[k], 1000, 0, 0x9e3779b9ull + (uint64_t)i * 6151 + (uint64_t)k * 193);
      uint64_t flips = s.flips;
      uint64_t t = 3000000;
      while (schedule_state_at(&s, t), s.flips == flips) t += 1000;
      CHECK(schedule_set_share(&s, to[k], t));
      on_soon += schedule_state_at(&s, t + 50000000ull);
      on_later += schedule_state_at(&s, t + 900000000ull); // past retunes
    }
    CHECK(near_share((double)on_soon / chains, to[k], chains));
    CHECK(near_share((double)on_later / chains, to[k], chains));
  }
  schedule s;
  schedule_init(&s, 1.0, 1000, 0, 3);
  CHECK_EQ_U64(s.window_every, 1000);
  CHECK(schedule_set_share(&s, 0.15, 100));
  CHECK(s.share == 0.15);
  CHECK_EQ_U64(s.window_every, 150);
  CHECK(schedule_weight(&s, 150) == 1000.0);
  CHECK(!schedule_set_share(&s, 0.1502, 200)); // the same whole in-window rate: no change
  CHECK_EQ_U64(s.share_changes, 1);
  CHECK(schedule_set_share(&s, 1.0, 300)); // back to always on
  CHECK(s.on);
  CHECK(s.next_change == UINT64_MAX);
}

// Over many chains, the share of those on at one fixed moment: at the start, within a window's length,
// long after, and past retunes.
static void test_on_with_probability_share_at_any_moment(void) {
  const double moments[] = {0, D / 3, 2 * D, 50 * D, 1.7e9};
  const int chains = 40000;
  for (size_t m = 0; m < sizeof moments / sizeof moments[0]; m++) {
    int on = 0;
    for (int i = 0; i < chains; i++) {
      schedule s;
      schedule_init(&s, 0.04, 1000, 1000, 0x1234567ull + (uint64_t)i * 7919 + m * 104729);
      on += schedule_state_at(&s, 1000 + (uint64_t)moments[m]);
    }
    CHECK(near_share((double)on / chains, 0.04, chains));
  }
}

// One long chain: the time it spends on, and the mean length of its windows.
static void test_long_run_share_and_window_length(void) {
  schedule s;
  schedule_init(&s, 0.05, 1000, 0, 99);
  uint64_t t = 0, on_time = 0, windows = 0;
  bool on = schedule_state_at(&s, 0);
  while (windows < 200000) {
    uint64_t next = schedule_next_event(&s);
    bool now_on = schedule_state_at(&s, next);
    if (on) on_time += next - t;
    if (!on && now_on) windows++;
    on = now_on;
    t = next;
  }
  double share = (double)on_time / (double)t;
  // On-periods are exponential: mean and sd D, so the share's error is about share * sqrt(2 / windows).
  CHECK(fabs(share - 0.05) < 5 * 0.05 * sqrt(2.0 / windows));
  double mean_on = (double)on_time / (double)windows;
  CHECK(fabs(mean_on - D) < 5 * D / sqrt((double)windows));
}

// The path is drawn once: asking often or rarely sees the same states at the same moments, and asking
// about the past sees the present.
static void test_path_does_not_depend_on_asking(void) {
  schedule often, rarely;
  schedule_init(&often, 0.04, 1000, 0, 424242);
  schedule_init(&rarely, 0.04, 1000, 0, 424242);
  int differ = 0;
  for (uint64_t t = 0; t < 200000000ull; t += 1000) {
    bool a = schedule_state_at(&often, t);
    if (t % 1000000 == 0) differ += a != schedule_state_at(&rarely, t);
  }
  CHECK(differ == 0);
  bool now = schedule_state_at(&often, 300000000ull);
  CHECK(schedule_state_at(&often, 5) == now);
}

// A costly sync lengthens windows at the next retune moment, keeping the share at every moment.
static void test_retune_keeps_the_share(void) {
  schedule s;
  schedule_init(&s, 0.04, 1000, 0, 5);
  schedule_note_sync_cost(&s, 50000.0); // 50 us per job: 2 * 50 us * 0.04 / 0.002 = 2 ms windows
  CHECK(s.mean_on_nanos == D);
  schedule_state_at(&s, SCHEDULE_FIRST_RETUNE_NANOS - 1);
  CHECK(s.mean_on_nanos == D);
  schedule_state_at(&s, SCHEDULE_FIRST_RETUNE_NANOS);
  CHECK(fabs(s.mean_on_nanos - 2000000.0) < 1.0);
  // Cheap again: shortened back, never below the minimum (the next moment: SCHEDULE_RETUNE_NANOS later).
  for (int i = 0; i < 200; i++) schedule_note_sync_cost(&s, 10.0);
  schedule_state_at(&s, SCHEDULE_FIRST_RETUNE_NANOS + SCHEDULE_RETUNE_NANOS - 1);
  CHECK(fabs(s.mean_on_nanos - 2000000.0) < 1.0);
  schedule_state_at(&s, SCHEDULE_FIRST_RETUNE_NANOS + SCHEDULE_RETUNE_NANOS);
  CHECK(s.mean_on_nanos == D);
  // Stationary across the retune: many chains, costly from the start, asked just after it.
  const int chains = 40000;
  int on = 0;
  for (int i = 0; i < chains; i++) {
    schedule c;
    schedule_init(&c, 0.04, 1000, 0, 777 + (uint64_t)i * 31);
    schedule_note_sync_cost(&c, 50000.0);
    on += schedule_state_at(&c, SCHEDULE_FIRST_RETUNE_NANOS + 1000);
  }
  CHECK(near_share((double)on / chains, 0.04, chains));
  // The next event never lies beyond the next retune moment.
  schedule_init(&s, 0.001, 1000, 0, 3);
  CHECK(schedule_next_event(&s) <= SCHEDULE_FIRST_RETUNE_NANOS);
}

// The property sync points rest on (schedule_request): a simulated program whose interrupt checks come
// every 60 us, except in a 3 ms C call every 10 ms (none inside), allocating every microsecond
// throughout; a ticker that wakes at the chain's flips 0-40 us late and requests a sync when the
// requested state differs from the applied one; a sync job at the first interrupt check after that.
// Applying the requested state, the hook's state at every allocation is exactly the requested state at
// the program's last interrupt check before it, as if a sync ran at every interrupt check: a moment the
// program chooses, not the chain, so allocations are seen with the requested share of the time, which
// is measured. Applying the chain's state at the job's own moment instead (the first design) differs
// from that wherever a window ended before its job ran.
typedef struct {
  uint64_t allocations, mismatches;
  double requested_share;
} simulation;

static simulation simulate_syncs(bool apply_requested, uint64_t seed) {
  schedule s;
  const uint64_t us = 1000, total = 20000000ull * us; // 20 s
  schedule_init(&s, 0.04, 1000, 0, seed);
  sampler lag;
  sampler_init(&lag, 2, seed ^ 0x9e3779b97f4a7c15ull);
  bool applied = schedule_request(&s, 0), pending = false, at_last_check = applied;
  uint64_t next_wake = schedule_next_event(&s);
  simulation sim = {0};
  for (uint64_t t = 0; t < total; t += us) {
    if (t >= next_wake) {
      if (schedule_request(&s, t) != applied) pending = true;
      next_wake = schedule_next_event(&s) + (uint64_t)(sampler_uniform(&lag) * 40.0) * us;
    }
    bool in_c_call = t % (10000 * us) >= 7000 * us;
    if (!in_c_call && t % (60 * us) == 0) {
      at_last_check = schedule_requested(&s);
      if (pending) {
        applied = apply_requested ? schedule_requested(&s) : schedule_state_at(&s, t);
        pending = applied != schedule_requested(&s);
      }
    }
    sim.allocations++;
    sim.mismatches += applied != at_last_check;
  }
  sim.requested_share = schedule_requested_share(&s, total);
  return sim;
}

static void test_sync_points_apply_the_requested_state_of_the_last_interrupt_check(void) {
  for (uint64_t seed = 1; seed <= 3; seed++) {
    simulation sim = simulate_syncs(true, seed);
    CHECK_EQ_U64(sim.mismatches, 0);
    // About 8000 windows of 100 us (plus 40 us of wake-up delay at most on either end): the requested
    // share is the chain's, within 5 standard errors (relative error about sqrt(2 / 8000) = 1.6%).
    CHECK(fabs(sim.requested_share - 0.04) < 5 * 0.04 * 0.016);
    simulation old = simulate_syncs(false, seed);
    CHECK(old.mismatches > old.allocations / 1000);
  }
}

int main(void) {
  test_share_is_adjusted_to_whole_rates();
  test_window_every_follows_the_share_seen();
  test_sample_every_one_is_always_on();
  test_a_changed_share_holds_from_the_change_on();
  test_on_with_probability_share_at_any_moment();
  test_long_run_share_and_window_length();
  test_path_does_not_depend_on_asking();
  test_retune_keeps_the_share();
  test_sync_points_apply_the_requested_state_of_the_last_interrupt_check();
  return check_report("test_schedule");
}
