// Unit tests for ext/heapscope/window.c: window plans respect the hook-on share, skip when the stride is
// too short, draw the delay uniformly in [0, length], aim at the requested overall rate; weights make a
// window's samples add up to its stride.
#include "../../ext/heapscope/window.h"
#include "check.h"

#include <stdbool.h>

// Hook-on allocations per window, on average, per allocation of its sampled part.
static const double on_per_length = 1.0 + WINDOW_DELAY_SPAN / 2.0;

static uint64_t xorshift(uint64_t *x) {
  *x ^= *x << 13;
  *x ^= *x >> 7;
  *x ^= *x << 17;
  return *x;
}

static void test_first_window_has_the_minimum_length(void) {
  window_plan p;
  CHECK(window_plan_next(0.02, 0, 1000, 12345, 0, false, &p));
  CHECK_EQ_U64(p.length, WINDOW_MIN_LENGTH);
  CHECK(p.delay <= WINDOW_DELAY_SPAN * p.length);
  CHECK(p.probability == 1.0);
  // samples per window ~ expected stride / 1000, the stride being the share's worth of hook-on
  double stride = on_per_length * WINDOW_MIN_LENGTH / 0.02;
  CHECK_EQ_U64(p.every, (uint64_t)(1000.0 * WINDOW_MIN_LENGTH / stride + 0.5));
}

static void test_first_window_delay_spans_a_gc_interval(void) {
  window_plan p;
  uint64_t x = 99, max = 0;
  for (int i = 0; i < 10000; i++) {
    window_plan_first(0.02, 1000, 50000, xorshift(&x), &p);
    CHECK(p.delay < 50000);
    max = p.delay > max ? p.delay : max;
  }
  CHECK(max > 45000);
  window_plan_first(0.02, 1000, 1u << 30, 7, &p);
  CHECK(p.delay < WINDOW_FIRST_DELAY_MAX);
}

static void test_short_strides_get_a_window_by_coin(void) {
  // A stride worth a quarter of the minimum window: a window one time in four, at the minimum length,
  // and a weight that makes up for the three strides without one.
  double stride = on_per_length * WINDOW_MIN_LENGTH / 0.02 / 4;
  uint64_t x = 12345, opened = 0, n = 40000;
  window_plan p;
  for (uint64_t i = 0; i < n; i++) {
    bool open = window_plan_next(0.02, (uint64_t)stride, 1000, xorshift(&x), xorshift(&x), false, &p);
    CHECK(p.probability > 0.2499 && p.probability < 0.2501);
    if (open) {
      opened++;
      CHECK_EQ_U64(p.length, WINDOW_MIN_LENGTH);
    }
  }
  CHECK(opened > n / 4 - 600 && opened < n / 4 + 600);
  // Warming up, the coin is not thrown: always a window, weighed as such.
  CHECK(window_plan_next(0.02, (uint64_t)stride, 1000, 1, UINT64_MAX, true, &p));
  CHECK(p.probability == 1.0);
  // Over the coin, a stride's expected weight sum is the stride: P(open) * samples * weight.
  CHECK(window_plan_next(0.02, (uint64_t)stride, 1000, 1, 0, false, &p)); // random1 = 0: heads
  double expected = p.probability * ((double)p.length / p.every) * window_weight(&p, p.length, (uint64_t)stride);
  CHECK(expected > stride * 0.9999 && expected < stride * 1.0001);
}

static void test_length_follows_the_stride_within_the_share(void) {
  window_plan p;
  for (uint64_t stride = 70000; stride < 100000000; stride *= 3) {
    CHECK(window_plan_next(0.02, stride, 1000, stride * 7919, 0, false, &p));
    CHECK(p.probability == 1.0);
    // mean hook-on = delay mean + length, within the share of the stride
    CHECK(on_per_length * (double)p.length <= 0.02 * (double)stride + 1e-9);
    CHECK(p.length >= WINDOW_MIN_LENGTH && p.length <= WINDOW_MAX_LENGTH);
    // samples expected over the stride: length / every ~ stride / 1000
    double samples = (double)p.length / p.every;
    double wanted = (double)stride / 1000;
    CHECK(samples > wanted * 0.9 && samples < wanted * 1.1);
  }
}

static void test_rate_never_drops_below_every_allocation(void) {
  window_plan p;
  CHECK(window_plan_next(0.02, 1000000, 1, 3, 0, false, &p));
  CHECK_EQ_U64(p.every, 1);
  CHECK(window_plan_next(1.0, 1000000, 1, 3, 0, false, &p));
  CHECK_EQ_U64(p.length, (uint64_t)(1000000 / on_per_length));
}

static void test_delay_is_uniform_over_its_span(void) {
  window_plan p;
  uint64_t span = WINDOW_DELAY_SPAN * WINDOW_MIN_LENGTH;
  uint64_t seen_zero = 0, seen_max = 0, sum = 0, n = 200000;
  uint64_t x = 88172645463325252ull;
  for (uint64_t i = 0; i < n; i++) {
    window_plan_next(0.02, 0, 1000, xorshift(&x), 0, false, &p);
    CHECK(p.delay <= span);
    seen_zero += p.delay == 0;
    seen_max += p.delay == span;
    sum += p.delay;
  }
  CHECK(seen_zero > 0 && seen_max > 0);
  double mean = (double)sum / n;
  CHECK(mean > span / 2.0 * 0.98 && mean < span / 2.0 * 1.02);
}

static void test_weights_add_up_to_the_stride(void) {
  // 2000 allocations sampled 1 in 10 -> ~200 samples standing for a stride of 500000
  window_plan p = {.every = 10, .length = 2000, .probability = 1.0};
  double w = window_weight(&p, 2000, 500000);
  CHECK(w > 2499.99 && w < 2500.01);
  CHECK(window_weight(&p, 0, 100) == 0.0);
  p.probability = 0.5; // a window every other stride weighs twice
  CHECK(window_weight(&p, 2000, 500000) > 4999.99);
}

int main(void) {
  test_first_window_has_the_minimum_length();
  test_first_window_delay_spans_a_gc_interval();
  test_short_strides_get_a_window_by_coin();
  test_length_follows_the_stride_within_the_share();
  test_rate_never_drops_below_every_allocation();
  test_delay_is_uniform_over_its_span();
  test_weights_add_up_to_the_stride();
  return check_report("window");
}
