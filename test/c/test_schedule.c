// Unit tests for ext/heapscope/schedule.c: the schedule is on for its share of the time, at any moment
// chosen without looking at it (the property every estimate rests on), also at a stratum's edges and
// after a retune; each stratum holds two windows of length D drawn alike; its path does not depend on
// how often it is asked; weights are exactly sample_every.
//
// The statistical checks allow 5 standard errors: each fails by chance with probability below 1e-6.
#include "../../ext/heapscope/schedule.h"
#include "check.h"

#include <math.h>

static const double D = SCHEDULE_MIN_WINDOW_NANOS;

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

static void test_sample_every_one_is_always_on(void) {
  schedule s;
  schedule_init(&s, 0.04, 1, 0, 7);
  CHECK(s.share == 1.0);
  CHECK_EQ_U64(s.window_every, 1);
  for (uint64_t t = 0; t < 1000000000ull; t += 12345677) CHECK(schedule_state_at(&s, t));
  CHECK(schedule_next_event(&s) == UINT64_MAX);
}

// Over many schedules (seeds), the share of those on at one fixed moment: at the start, within a
// window's length, at a stratum's edge, long after, and past a retune.
static void test_on_with_probability_share_at_any_moment(void) {
  schedule probe;
  schedule_init(&probe, 0.04, 1000, 1000, 1);
  const double L = probe.stratum_nanos;
  const double moments[] = {0, D / 3, L - 1, L, L + D / 2, 50 * D, 1.7e9};
  const int schedules = 40000;
  for (size_t m = 0; m < sizeof moments / sizeof moments[0]; m++) {
    int on = 0;
    for (int i = 0; i < schedules; i++) {
      schedule s;
      schedule_init(&s, 0.04, 1000, 1000, 0x1234567ull + (uint64_t)i * 7919 + m * 104729);
      on += schedule_state_at(&s, 1000 + (uint64_t)moments[m]);
    }
    CHECK(near_share((double)on / schedules, 0.04, schedules));
  }
}

// Walks one schedule from event to event, calling visit(on-interval start, end, window) for each
// on-interval (a run of one window number), up to virtual time `until`.
typedef void (*interval_visitor)(uint64_t from, uint64_t to, uint32_t window, void *data);
static void walk(schedule *s, uint64_t until, interval_visitor visit, void *data) {
  uint64_t t = s->at;
  bool on = schedule_state_at(s, t);
  uint32_t window = s->window;
  uint64_t since = t;
  while (t < until) {
    uint64_t next = schedule_next_event(s);
    CHECK(next > t);
    bool now_on = schedule_state_at(s, next);
    if (on && (!now_on || s->window != window)) visit(since, next, window, data);
    if (now_on && (!on || s->window != window)) since = next;
    on = now_on;
    window = s->window;
    t = next;
  }
}

typedef struct {
  double L;
  uint64_t origin;
  double on_time;
  double per_stratum[64][2]; // on-time by stratum (the first 64) and window
  uint64_t bad_windows;      // an interval outside its window's stratum, or of the wrong length
} tally;

static void add_interval(uint64_t from, uint64_t to, uint32_t window, void *data) {
  tally *t = data;
  t->on_time += (double)(to - from);
  uint64_t stratum = window >> 1;
  double start = (double)t->origin + (double)stratum * t->L;
  if ((double)from < start - 1 || (double)to > start + t->L + 1) t->bad_windows++;
  if (stratum < 64) t->per_stratum[stratum][window & 1] += (double)(to - from);
}

// One long schedule: the time it spends on; every stratum holds its two windows, each of length D
// (less only where the two overlap), numbered 2 x stratum + 0 or 1, inside their stratum.
static void test_strata_hold_two_windows_of_length_d(void) {
  schedule s;
  schedule_init(&s, 0.05, 1000, 0, 99);
  tally t = {.L = s.stratum_nanos, .origin = 0};
  // 70 strata (about 280 ms); no sync cost is noted, so retunes change nothing.
  const uint64_t until = (uint64_t)(70 * t.L);
  walk(&s, until, add_interval, &t);
  double strata = (double)until / t.L;
  // The on-time is 2 D per stratum less the overlaps, which are rare (the share is 1 - (1 - D/L)^2).
  CHECK(fabs(t.on_time / (double)until - 0.05) < 0.05 * 3.0 / sqrt(strata));
  CHECK_EQ_U64(t.bad_windows, 0);
  int full = 0;
  for (int k = 0; k < 64 && (k + 1) * t.L < (double)until; k++) {
    double sum = t.per_stratum[k][0] + t.per_stratum[k][1];
    CHECK(sum <= 2 * D + 2 && sum >= D - 2);
    full += fabs(t.per_stratum[k][0] - D) < 2 && fabs(t.per_stratum[k][1] - D) < 2;
  }
  // Overlapping windows share their time: two windows overlap in about 2 D / L = 5% of strata.
  CHECK(full >= 55);
}

// The two windows of a stratum are drawn alike: over many strata, window 0 and window 1 start at
// uniform positions (their mean position is L/2, within 5 standard errors).
static void test_windows_are_uniform_in_their_stratum(void) {
  schedule s;
  schedule_init(&s, 0.04, 1000, 0, 2024);
  const int strata = 5000;
  double sum[2] = {0};
  for (int k = 0; k < strata; k++) {
    schedule_state_at(&s, (uint64_t)((k + 0.5) * s.stratum_nanos));
    for (int w = 0; w < 2; w++) sum[w] += s.offsets[w] / s.stratum_nanos;
  }
  for (int w = 0; w < 2; w++) CHECK(fabs(sum[w] / strata - 0.5) < 5 * sqrt(1.0 / 12 / strata));
}

// The path is a function of time: asking often or rarely sees the same states at the same moments,
// and asking about the past sees the present.
static void test_path_does_not_depend_on_asking(void) {
  schedule often, rarely;
  schedule_init(&often, 0.04, 1000, 0, 424242);
  schedule_init(&rarely, 0.04, 1000, 0, 424242);
  int differ = 0, on = 0;
  for (uint64_t t = 0; t < 2000000000ull; t += 1000) {
    bool a = schedule_state_at(&often, t);
    if (t % 1000000 == 0) {
      bool b = schedule_state_at(&rarely, t);
      differ += a != b || (a && often.window != rarely.window);
      on += a;
    }
  }
  CHECK(differ == 0);
  CHECK(on > 20); // about 80 of the 2000 moments
  bool now = schedule_state_at(&often, 3000000000ull);
  CHECK(schedule_state_at(&often, 5) == now);
}

// A costly sync lengthens windows at the next retune moment, keeping the share at every moment.
static void test_retune_keeps_the_share(void) {
  schedule s;
  schedule_init(&s, 0.04, 1000, 0, 5);
  schedule_note_sync_cost(&s, 50000.0); // 50 us per job: 2 * 50 us * 0.04 / 0.002 = 2 ms windows
  CHECK(s.window_nanos == D);
  schedule_state_at(&s, SCHEDULE_FIRST_RETUNE_NANOS - 1);
  CHECK(s.window_nanos == D);
  uint32_t before = s.window;
  schedule_state_at(&s, SCHEDULE_FIRST_RETUNE_NANOS);
  CHECK(fabs(s.window_nanos - 2000000.0) < 1.0);
  CHECK(fabs(s.stratum_nanos / s.window_nanos - 1.0 / (1.0 - sqrt(0.96))) < 1e-9);
  // Window numbers go on increasing across the new grid.
  schedule_state_at(&s, SCHEDULE_FIRST_RETUNE_NANOS + (uint64_t)s.stratum_nanos * 3);
  CHECK(s.first_unit > before / 2);
  // Cheap again: shortened back, never below the minimum (the next moment: SCHEDULE_RETUNE_NANOS later).
  for (int i = 0; i < 200; i++) schedule_note_sync_cost(&s, 10.0);
  schedule_state_at(&s, SCHEDULE_FIRST_RETUNE_NANOS + SCHEDULE_RETUNE_NANOS - 1);
  CHECK(fabs(s.window_nanos - 2000000.0) < 1.0);
  schedule_state_at(&s, SCHEDULE_FIRST_RETUNE_NANOS + SCHEDULE_RETUNE_NANOS);
  CHECK(s.window_nanos == D);
  // Stationary across the retune: many schedules, costly from the start, asked just after it.
  const int schedules = 40000;
  int on = 0;
  for (int i = 0; i < schedules; i++) {
    schedule c;
    schedule_init(&c, 0.04, 1000, 0, 777 + (uint64_t)i * 31);
    schedule_note_sync_cost(&c, 50000.0);
    on += schedule_state_at(&c, SCHEDULE_FIRST_RETUNE_NANOS + 1000);
  }
  CHECK(near_share((double)on / schedules, 0.04, schedules));
  // The next event never lies beyond the next retune moment.
  schedule_init(&s, 0.001, 1000, 0, 3);
  CHECK(schedule_next_event(&s) <= SCHEDULE_FIRST_RETUNE_NANOS);
}

// A forked child reseeds: its windows from then on differ from its parent's.
static void test_reseed_changes_the_windows(void) {
  schedule a, b;
  schedule_init(&a, 0.04, 1000, 0, 9);
  schedule_init(&b, 0.04, 1000, 0, 9);
  schedule_reseed(&b, 10);
  int differ = 0;
  for (uint64_t t = 0; t < 40000000ull; t += 10000) differ += schedule_state_at(&a, t) != schedule_state_at(&b, t);
  CHECK(differ > 50);
}

int main(void) {
  test_share_is_adjusted_to_whole_rates();
  test_sample_every_one_is_always_on();
  test_on_with_probability_share_at_any_moment();
  test_strata_hold_two_windows_of_length_d();
  test_windows_are_uniform_in_their_stratum();
  test_path_does_not_depend_on_asking();
  test_retune_keeps_the_share();
  test_reseed_changes_the_windows();
  return check_report("test_schedule");
}
