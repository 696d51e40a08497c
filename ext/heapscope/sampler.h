// sampler: which allocations to sample.
//
// Every allocation is sampled independently with probability p = 1 / sample_every (a Bernoulli
// trial), so an object sampled at that moment stands for sample_every allocations and its weight is
// exactly sample_every: estimates are unbiased. Drawing one trial per allocation would need a random
// number per allocation; instead the number of allocations until the next sample is drawn from the
// geometric distribution, once per *sample*, and the allocation hook only counts down. A fixed 1-in-N
// counter would be cheaper still but aliases with periodic code (allocate A, B, A, B with N = 2 and
// only B is ever seen), which is why it is not used.
//
// Pure C, no Ruby headers: unit-tested on its own (test/c/test_sampler.c).
#ifndef HEAPSCOPE_SAMPLER_H
#define HEAPSCOPE_SAMPLER_H

#include <stdint.h>

typedef struct {
  uint64_t rng[2];       // xorshift128+ state; never all zero
  uint32_t sample_every; // 1 = every allocation
  double log_keep;       // log(1 - p), cached; 0 when sample_every == 1
} sampler;

// Prepares s for 1-in-sample_every sampling (sample_every >= 1), seeded with seed.
void sampler_init(sampler *s, uint32_t sample_every, uint64_t seed);

// Changes the rate to 1-in-sample_every (>= 1), keeping the random state. Takes effect at the next
// sampler_next_countdown.
void sampler_set_every(sampler *s, uint32_t sample_every);

// Returns how many allocations to count down before the next sample: the next sample is the
// allocation that brings the count to zero, so the result is >= 1 (exactly 1 when sample_every is 1).
uint64_t sampler_next_countdown(sampler *s);

// A uniformly distributed 64-bit number (exposed for tests and for seeding after fork).
uint64_t sampler_random(sampler *s);

// A uniformly distributed double in [0, 1), from the top 53 bits of sampler_random.
double sampler_uniform(sampler *s);

// A seed from the OS's random source, falling back to time and pid.
uint64_t sampler_seed_from_os(void);

#endif
