// Unit tests for ext/heapscope/variance.c: the Bernoulli variance of independent samples (0 when
// exact), the random-groups variance (0 for a site that is a fixed share of every window, the whole
// estimate squared with one group), and simulated checks that it matches the real spread of a ratio
// estimate, for one site and for the sum of two correlated sites (one window makes both), where adding
// the two sites' own variances would be wrong.
#include "../../ext/heapscope/variance.h"
#include "check.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

static uint64_t xorshift(uint64_t *x) {
  *x ^= *x << 13;
  *x ^= *x >> 7;
  *x ^= *x << 17;
  return *x;
}
static double unit(uint64_t *x) { return (double)(xorshift(x) >> 11) * (1.0 / 9007199254740992.0); }

static void test_bernoulli(void) {
  double v = 0;
  for (int i = 0; i < 100; i++) v += bernoulli_variance(1000.0, 1000);
  CHECK(fabs(v - 100.0 * 1000.0 * 999.0) < 1e-3); // 100 samples of weight 1000: 100 x 1000 x 999
  CHECK(bernoulli_variance(1.0, 1) == 0.0);      // weight 1: exact
  CHECK(bernoulli_variance(5.0 * 64.0, 5) == 320.0 * 320.0 * 0.8);
}

static void test_groups_spread_consecutive_windows(void) {
  int seen[VARIANCE_GROUPS] = {0};
  for (uint32_t w = 1; w <= 64; w++) seen[variance_group(w)]++;
  for (int g = 0; g < VARIANCE_GROUPS; g++) CHECK(seen[g] >= 2 && seen[g] <= 6);
  CHECK(variance_group(UINT32_MAX) < VARIANCE_GROUPS);
}

// A site that is exactly a tenth of every window's allocations has no spread between windows.
static void test_fixed_share_has_no_variance(void) {
  group_sums s = {0};
  group_design d = {.share = 0.04};
  for (uint32_t k = 1; k <= 50; k++) {
    double a = 100.0 * k;
    group_sums_add(&s, k, a / 10.0);
    group_design_add_window(&d, k, a);
  }
  double total = 0;
  for (int g = 0; g < VARIANCE_GROUPS; g++) total += s.totals[g];
  CHECK(group_sums_variance(&s, &d, 1.0) < 1e-6 * total * total);
  // One group alone says nothing: as uncertain as the estimate (scale 3: 3 x 5, squared).
  group_sums one = {0};
  group_design single = {.share = 0.04};
  group_sums_add(&one, 1, 5.0);
  group_design_add_window(&single, 1, 100);
  CHECK(fabs(group_sums_variance(&one, &single, 3.0) - 225.0) < 1e-9);
  group_sums none = {0};
  CHECK(group_sums_variance(&none, &d, 1.0) == 0.0);
}

// Simulated ratio estimates: windows of exponential size; site A is each allocation's with probability
// 0.3, site B comes in bursts (a window holds B with probability 0.2, and then 40% of its allocations
// are B's), and each is sampled with probability 1/20. Over many trials the estimates' spread is what
// the formula predicts from one trial's groups, for A, for B, and for A + B from the summed groups
// (within 15%: 600 trials estimate a standard deviation to about 3%).
static void test_variance_matches_the_spread(void) {
  uint64_t x = 88172645463325252ull;
  enum { TRIALS = 600, WINDOWS = 300 };
  const double every = 20.0, total_allocations = 1e7;
  double sum[3] = {0}, sum2[3] = {0}, predicted[3] = {0};
  for (int t = 0; t < TRIALS; t++) {
    group_sums a = {0}, b = {0}, both;
    group_design d = {.share = 0.04};
    double allocations = 0;
    for (uint32_t k = 1; k <= WINDOWS; k++) {
      double n = floor(-log(unit(&x) + 1e-12) * 300.0) + 1;
      bool burst = unit(&x) < 0.2;
      double wa = 0, wb = 0;
      for (int i = 0; i < (int)n; i++) {
        bool is_b = burst && unit(&x) < 0.4;
        bool is_a = !is_b && unit(&x) < 0.3;
        if ((is_a || is_b) && unit(&x) < 1.0 / every) {
          if (is_a) wa += every;
          else wb += every;
        }
      }
      group_sums_add(&a, k, wa);
      group_sums_add(&b, k, wb);
      group_design_add_window(&d, k, n);
      allocations += n;
    }
    for (int g = 0; g < VARIANCE_GROUPS; g++) both.totals[g] = a.totals[g] + b.totals[g];
    double scale = total_allocations / allocations;
    const group_sums *sites[3] = {&a, &b, &both};
    for (int s = 0; s < 3; s++) {
      double estimate = 0;
      for (int g = 0; g < VARIANCE_GROUPS; g++) estimate += scale * sites[s]->totals[g];
      sum[s] += estimate;
      sum2[s] += estimate * estimate;
      predicted[s] += group_sums_variance(sites[s], &d, scale);
    }
  }
  for (int s = 0; s < 3; s++) {
    double mean = sum[s] / TRIALS, observed = sum2[s] / TRIALS - mean * mean;
    double ratio = sqrt(predicted[s] / TRIALS / observed);
    CHECK(ratio > 0.85 && ratio < 1.15);
  }
  CHECK(fabs(sum[0] / TRIALS / (0.3 * 0.92 * total_allocations) - 1.0) < 0.02); // A: 0.3 of what is not B
}

int main(void) {
  test_bernoulli();
  test_groups_spread_consecutive_windows();
  test_fixed_share_has_no_variance();
  test_variance_matches_the_spread();
  return check_report("test_variance");
}
