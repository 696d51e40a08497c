// Unit tests for ext/heapscope/sampler.c: countdowns are >= 1, geometric with mean sample_every,
// reproducible for a seed, and sample_every 1 samples everything.
#include <math.h>
#include <stdlib.h>

#include "../../ext/heapscope/sampler.h"
#include "check.h"

static void test_every_allocation(void) {
  sampler s;
  sampler_init(&s, 1, 42);
  unsigned wrong = 0;
  for (int i = 0; i < 1000; i++) wrong += sampler_next_countdown(&s) != 1;
  CHECK_EQ_U64(wrong, 0);
  sampler_init(&s, 0, 42); // 0 is treated as 1
  CHECK_EQ_U64(s.sample_every, 1);
  CHECK_EQ_U64(sampler_next_countdown(&s), 1);
}

static void test_reproducible(void) {
  sampler a, b, c;
  sampler_init(&a, 100, 7);
  sampler_init(&b, 100, 7);
  sampler_init(&c, 100, 8);
  unsigned same = 0, same_other_seed = 0;
  for (int i = 0; i < 100; i++) {
    uint64_t x = sampler_next_countdown(&a), y = sampler_next_countdown(&b), z = sampler_next_countdown(&c);
    same += x == y;
    same_other_seed += x == z;
  }
  CHECK_EQ_U64(same, 100);
  CHECK(same_other_seed < 20);
  // Seed 0 still gives a working generator (the state is never all zero).
  sampler_init(&a, 10, 0);
  CHECK(a.rng[0] != 0 || a.rng[1] != 0);
  uint64_t r1 = sampler_random(&a), r2 = sampler_random(&a);
  CHECK(r1 != r2);
}

// For several rates: mean within 2% of sample_every over 200k draws, P(countdown == 1) ~ p, nothing
// below 1, and the distribution's memorylessness: P(X > 2k | X > k) ~ P(X > k).
static void test_distribution(void) {
  const uint32_t rates[] = {2, 10, 128, 1000, 100000};
  for (size_t r = 0; r < sizeof rates / sizeof rates[0]; r++) {
    uint32_t n = rates[r];
    sampler s;
    sampler_init(&s, n, 1234 + r);
    const int draws = 200000;
    double sum = 0;
    unsigned below_one = 0, ones = 0, over_k = 0, over_2k = 0;
    uint64_t k = n;
    for (int i = 0; i < draws; i++) {
      uint64_t c = sampler_next_countdown(&s);
      below_one += c < 1;
      ones += c == 1;
      over_k += c > k;
      over_2k += c > 2 * k;
      sum += (double)c;
    }
    double mean = sum / draws;
    CHECK_EQ_U64(below_one, 0);
    CHECK(fabs(mean - n) / n < 0.02);
    double p = 1.0 / n, p1 = (double)ones / draws;
    // Binomial standard deviation of the count of ones, 5 sigma.
    CHECK(fabs(p1 - p) <= 5 * sqrt(p * (1 - p) / draws) + 1e-9);
    double tail = (double)over_k / draws, cond = over_k ? (double)over_2k / over_k : 0;
    CHECK(fabs(tail - pow(1.0 - p, (double)n)) < 0.01); // P(X > n) = (1 - p)^n
    CHECK(fabs(cond - tail) < 0.02);
  }
}

// The aliasing the design warns about: with N = 2 and alternating allocations A, B, both are sampled
// about equally (a 1-in-2 counter would only ever see one of them).
static void test_no_aliasing(void) {
  sampler s;
  sampler_init(&s, 2, 99);
  uint64_t position = 0, hits[2] = {0, 0};
  for (int i = 0; i < 100000; i++) {
    position += sampler_next_countdown(&s);
    hits[position % 2]++;
  }
  double share = (double)hits[0] / (double)(hits[0] + hits[1]);
  CHECK(share > 0.48 && share < 0.52);
}

static void test_random_bits(void) {
  sampler s;
  sampler_init(&s, 10, 5);
  unsigned ones[64] = {0};
  for (int i = 0; i < 20000; i++) {
    uint64_t x = sampler_random(&s);
    for (int b = 0; b < 64; b++) ones[b] += (x >> b) & 1;
  }
  unsigned biased = 0;
  for (int b = 0; b < 64; b++) biased += ones[b] < 9500 || ones[b] > 10500;
  CHECK_EQ_U64(biased, 0);
  uint64_t a = sampler_seed_from_os(), b = sampler_seed_from_os();
  CHECK(a != 0 && a != b);
}

int main(void) {
  test_every_allocation();
  test_reproducible();
  test_distribution();
  test_no_aliasing();
  test_random_bits();
  return check_report("test_sampler");
}
