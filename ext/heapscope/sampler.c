#include "sampler.h"

#include <math.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void sampler_init(sampler *s, uint32_t sample_every, uint64_t seed) {
  s->rng[0] = splitmix64(&seed);
  s->rng[1] = splitmix64(&seed);
  if ((s->rng[0] | s->rng[1]) == 0) s->rng[1] = 1;
  sampler_set_every(s, sample_every);
}

void sampler_set_every(sampler *s, uint32_t sample_every) {
  if (sample_every < 1) sample_every = 1;
  s->sample_every = sample_every;
  s->log_keep = sample_every == 1 ? 0.0 : log1p(-1.0 / (double)sample_every);
}

uint64_t sampler_random(sampler *s) {
  uint64_t x = s->rng[0];
  uint64_t const y = s->rng[1];
  s->rng[0] = y;
  x ^= x << 23;
  s->rng[1] = x ^ y ^ (x >> 17) ^ (y >> 26);
  return s->rng[1] + y;
}

uint64_t sampler_next_countdown(sampler *s) {
  if (s->sample_every == 1) return 1;
  // u is uniform in (0, 1]: the top 53 bits, plus one, over 2^53.
  double u = (double)((sampler_random(s) >> 11) + 1) * (1.0 / 9007199254740992.0);
  // Failures before the first success of a Bernoulli(p) sequence: floor(log(u) / log(1 - p)).
  double skipped = floor(log(u) / s->log_keep);
  if (!(skipped < 1e18)) skipped = 1e18; // u so small the wait is effectively forever
  return (uint64_t)skipped + 1;
}

uint64_t sampler_seed_from_os(void) {
  uint64_t seed = 0;
  FILE *f = fopen("/dev/urandom", "rb");
  if (f != NULL) {
    if (fread(&seed, sizeof seed, 1, f) != 1) seed = 0;
    fclose(f);
  }
  if (seed == 0) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    seed = ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
  }
  return seed;
}

double sampler_uniform(sampler *s) { return (double)(sampler_random(s) >> 11) * (1.0 / 9007199254740992.0); }
