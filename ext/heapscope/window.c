#include "window.h"

#include <math.h>

// A uniform double in [0, 1) from the top 53 bits.
static double unit(uint64_t random) { return (double)(random >> 11) * (1.0 / 9007199254740992.0); }

bool window_plan_next(double share, uint64_t previous, uint32_t sample_every, uint64_t random0, uint64_t random1,
                      bool warm_up, window_plan *plan) {
  // The hook is on for the delay (on average WINDOW_DELAY_SPAN / 2 times the sampled part) plus the
  // sampled part; the stride is expected to be like the previous one.
  const double on_per_length = 1.0 + WINDOW_DELAY_SPAN / 2.0;
  double expected_stride = previous == 0 ? on_per_length * WINDOW_MIN_LENGTH / share : (double)previous;
  double length = floor(share * expected_stride / on_per_length);
  double probability = 1.0;
  if (length < WINDOW_MIN_LENGTH) {
    probability = length / WINDOW_MIN_LENGTH;
    length = WINDOW_MIN_LENGTH;
  }
  if (length > WINDOW_MAX_LENGTH) length = WINDOW_MAX_LENGTH;
  if (warm_up) probability = 1.0;
  plan->probability = probability;
  if (probability < 1.0 && unit(random1) >= probability) return false;
  // Samples wanted for the stride: expected_stride / sample_every, from `length` allocations of the
  // windows of a `probability` share of strides.
  double every = round((double)sample_every * length * probability / expected_stride);
  plan->length = (uint64_t)length;
  plan->delay = random0 % (plan->length * WINDOW_DELAY_SPAN + 1);
  plan->every = every < 1.0 ? 1u : every > 4294967295.0 ? UINT32_MAX : (uint32_t)every;
  return true;
}

void window_plan_first(double share, uint32_t sample_every, uint64_t gc_interval, uint64_t random, window_plan *plan) {
  window_plan_next(share, 0, sample_every, random, 0, true, plan);
  if (gc_interval < WINDOW_MIN_LENGTH) gc_interval = WINDOW_MIN_LENGTH;
  if (gc_interval > WINDOW_FIRST_DELAY_MAX) gc_interval = WINDOW_FIRST_DELAY_MAX;
  plan->delay = (random >> 8) % gc_interval;
}

double window_weight(const window_plan *plan, uint64_t sampled, uint64_t stride) {
  if (sampled == 0) return 0.0;
  return (double)plan->every * (double)stride / ((double)sampled * plan->probability);
}
