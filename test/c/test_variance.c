// Unit tests for ext/heapscope/variance.c: the Bernoulli variance for independent samples (0 when
// exact), the ratio estimate's variance by windows (0 for a site that is a fixed share of every
// window, large for one that comes in a few windows), and a simulated check that it matches the real
// spread of a ratio estimate.
#include "../../ext/heapscope/variance.h"
#include "check.h"

#include <math.h>

static uint64_t xorshift(uint64_t *x) {
  *x ^= *x << 13;
  *x ^= *x >> 7;
  *x ^= *x << 17;
  return *x;
}
static double unit(uint64_t *x) { return (double)(xorshift(x) >> 11) * (1.0 / 9007199254740992.0); }

static void test_bernoulli_when_each_sample_is_a_cluster(void) {
  cluster_sums s = {0};
  for (uint32_t i = 1; i <= 100; i++) cluster_sums_add(&s, i, 0, 1000, 1000.0);
  cluster_sums_finish(&s);
  cluster_design d = {.ratio = false, .scale = 1.0};
  // 100 samples of weight 1000: 100 x 1000 x 999
  CHECK(fabs(cluster_sums_variance(&s, &d) - 100.0 * 1000.0 * 999.0) < 1e-3);
  cluster_sums exact = {0};
  for (uint32_t i = 1; i <= 100; i++) cluster_sums_add(&exact, i, 0, 1, 1.0);
  cluster_sums_finish(&exact);
  CHECK(cluster_sums_variance(&exact, &d) == 0.0);
  d.scale = 2.0; // scaled estimates: scale^2
  CHECK(fabs(cluster_sums_variance(&s, &d) - 4.0 * 100.0 * 1000.0 * 999.0) < 1e-2);
}

// A site that is exactly a tenth of every window's allocations has no spread between windows.
static void test_ratio_of_a_fixed_share_has_no_variance(void) {
  cluster_sums s = {0};
  cluster_design d = {.ratio = true, .scale = 1.0, .share = 0.04};
  for (uint32_t k = 1; k <= 50; k++) {
    double a = 100.0 * k;
    cluster_sums_add(&s, k, a, 10, a / 10.0);
    d.windows += 1;
    d.allocations += a;
    d.allocation_squares += a * a;
  }
  cluster_sums_finish(&s);
  CHECK(cluster_sums_variance(&s, &d) < 1e-6 * s.total * s.total);
  // One window alone says nothing: as uncertain as the estimate.
  cluster_sums one = {0};
  cluster_sums_add(&one, 1, 100, 10, 5.0);
  cluster_sums_finish(&one);
  cluster_design single = {.ratio = true, .scale = 3.0, .share = 0.04, .windows = 1, .allocations = 100, .allocation_squares = 1e4};
  CHECK(fabs(cluster_sums_variance(&one, &single) - 225.0) < 1e-9);
}

// Close with the true a_k later (the counters' path) equals adding with it (the records' path).
static void test_close_with_allocations_later(void) {
  cluster_sums a = {0}, b = {0};
  cluster_sums_add(&a, 7, 0, 10, 10.0);
  cluster_sums_add(&a, 7, 0, 10, 10.0);
  cluster_sums_close(&a, 500.0);
  cluster_sums_add(&b, 7, 500.0, 10, 10.0);
  cluster_sums_add(&b, 7, 500.0, 10, 10.0);
  cluster_sums_finish(&b);
  CHECK(a.total == b.total && a.squares == b.squares && a.cross == b.cross);
  CHECK(a.squares == 400.0 && a.cross == 20.0 * 500.0);
}

// Simulated ratio estimates: windows of exponential size, each allocation a site's with probability
// 0.3 and sampled with probability 1/20; the estimate scale x T over many trials has the spread the
// formula predicts (within 15%: 400 trials estimate a standard deviation to about 3.5%).
static void test_ratio_variance_matches_the_spread(void) {
  uint64_t x = 88172645463325252ull;
  const int trials = 400, windows = 200;
  const double every = 20.0, p_site = 0.3, total_allocations = 1e7;
  double sum = 0, sum2 = 0, predicted = 0;
  for (int t = 0; t < trials; t++) {
    cluster_sums s = {0};
    cluster_design d = {.ratio = true, .share = 0.04};
    for (int k = 0; k < windows; k++) {
      double a = floor(-log(unit(&x) + 1e-12) * 300.0) + 1;
      double w = 0;
      for (int i = 0; i < (int)a; i++) {
        if (unit(&x) < p_site && unit(&x) < 1.0 / every) w += every;
      }
      cluster_sums_add(&s, (uint32_t)k + 1, a, 20, w);
      d.windows += 1;
      d.allocations += a;
      d.allocation_squares += a * a;
    }
    cluster_sums_finish(&s);
    d.scale = total_allocations / d.allocations;
    double estimate = d.scale * s.total;
    sum += estimate;
    sum2 += estimate * estimate;
    predicted += cluster_sums_variance(&s, &d);
  }
  double mean = sum / trials, observed = sum2 / trials - mean * mean;
  predicted /= trials;
  CHECK(fabs(mean / (p_site * total_allocations) - 1.0) < 0.01);
  CHECK(sqrt(predicted / observed) > 0.85 && sqrt(predicted / observed) < 1.15);
}

int main(void) {
  test_bernoulli_when_each_sample_is_a_cluster();
  test_ratio_of_a_fixed_share_has_no_variance();
  test_close_with_allocations_later();
  test_ratio_variance_matches_the_spread();
  return check_report("test_variance");
}
