#include "schedule.h"

#include <math.h>

// A uniform number in [0, 1) for window w of stratum number `unit`: a hash, so that the path is a
// function of time (and seed), not of how often or in what order it is asked about.
static double uniform(uint64_t seed, uint64_t unit, unsigned w) {
  uint64_t z = seed + (2 * unit + w + 1) * 0x9e3779b97f4a7c15ull; // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

// The stratum length that makes two windows of length D cover a moment with probability share:
// 1 - (1 - D/L)^2 = share.
static double stratum_for(double window, double share) { return window / (1.0 - sqrt(1.0 - share)); }

static void enter_stratum(schedule *s, uint64_t stratum) {
  s->stratum = stratum;
  for (unsigned w = 0; w < 2; w++) s->offsets[w] = uniform(s->seed, s->first_unit + stratum, w) * s->stratum_nanos;
}

void schedule_init(schedule *s, double share, uint32_t sample_every, uint64_t now, uint64_t seed) {
  if (sample_every < 1) sample_every = 1;
  if (!(share > 0.0)) share = 1.0 / sample_every;
  if (share > 1.0) share = 1.0;
  double every = round(share * sample_every);
  if (every < 1.0) every = 1.0;
  *s = (schedule){
    .share = every / sample_every,
    .window_nanos = SCHEDULE_MIN_WINDOW_NANOS,
    .sample_every = sample_every,
    .window_every = (uint32_t)every,
    .seed = seed,
    .origin = now,
    .at = now,
    .next_retune = now + SCHEDULE_FIRST_RETUNE_NANOS,
  };
  if (s->share >= 1.0) {
    s->on = true; // always on, one window
    return;
  }
  s->stratum_nanos = stratum_for(s->window_nanos, s->share);
  enter_stratum(s, 0);
  (void)schedule_state_at(s, now);
}

void schedule_reseed(schedule *s, uint64_t seed) {
  s->seed = seed;
  if (s->share < 1.0) enter_stratum(s, s->stratum);
}

// The window length two sync jobs per window can afford.
static double affordable_window(const schedule *s) {
  double wanted = 2.0 * s->sync_nanos * s->share / SCHEDULE_SYNC_SHARE; // about share / D windows per unit of time
  if (wanted < SCHEDULE_MIN_WINDOW_NANOS) wanted = SCHEDULE_MIN_WINDOW_NANOS;
  if (wanted > SCHEDULE_MAX_WINDOW_NANOS) wanted = SCHEDULE_MAX_WINDOW_NANOS;
  return wanted;
}

// At a retune moment: only changes of a quarter or more, each starting a new grid of strata there.
static void retune(schedule *s) {
  uint64_t at = s->next_retune;
  s->next_retune = at + SCHEDULE_RETUNE_NANOS;
  double wanted = affordable_window(s);
  if (fabs(wanted - s->window_nanos) < 0.25 * s->window_nanos) return;
  uint64_t cut = (uint64_t)((double)(at - s->origin) / s->stratum_nanos); // the stratum cut short at `at`
  s->first_unit += cut + 1;
  s->origin = at;
  s->window_nanos = wanted;
  s->stratum_nanos = stratum_for(wanted, s->share);
  enter_stratum(s, 0);
}

// The position of virtual time t (>= origin) in its stratum, entering that stratum.
static double position(schedule *s, uint64_t t) {
  double since = (double)(t - s->origin);
  uint64_t stratum = (uint64_t)(since / s->stratum_nanos);
  double u = since - (double)stratum * s->stratum_nanos;
  if (u < 0.0) u = 0.0; // rounding at a boundary
  if (stratum != s->stratum) enter_stratum(s, stratum);
  return u;
}

bool schedule_state_at(schedule *s, uint64_t now) {
  if (now < s->at) now = s->at;
  s->at = now;
  if (s->share >= 1.0) return true;
  while (s->next_retune <= now) retune(s);
  double u = position(s, now);
  // Covered by window w when u lies within D after its start, around the stratum. If both cover it
  // (they overlap), it belongs to the one that started earlier.
  int covering = -1;
  double age = 0.0;
  for (int w = 0; w < 2; w++) {
    double since = u - s->offsets[w];
    if (since < 0.0) since += s->stratum_nanos;
    if (since < s->window_nanos && (covering < 0 || since > age)) {
      covering = w;
      age = since;
    }
  }
  bool on = covering >= 0;
  if (on != s->on) s->flips++;
  s->on = on;
  if (on) s->window = (uint32_t)(2 * (s->first_unit + s->stratum) + (uint64_t)covering);
  return on;
}

uint64_t schedule_next_event(const schedule *s) {
  if (s->share >= 1.0) return UINT64_MAX;
  double start = (double)s->stratum * s->stratum_nanos;
  double u = (double)(s->at - s->origin) - start;
  double next = s->stratum_nanos; // the stratum's end
  for (int w = 0; w < 2; w++) {
    double end = s->offsets[w] + s->window_nanos;
    double edges[3] = {s->offsets[w], end, end - s->stratum_nanos}; // start, end, end of the wrapped part
    for (int e = 0; e < 3; e++) {
      if (edges[e] > u && edges[e] < next) next = edges[e];
    }
  }
  uint64_t event = s->origin + (uint64_t)ceil(start + next);
  if (event <= s->at) event = s->at + 1;
  return s->next_retune < event ? s->next_retune : event;
}

void schedule_note_sync_cost(schedule *s, double nanos) {
  if (!(nanos >= 0.0)) return;
  s->sync_nanos = s->sync_nanos == 0.0 ? nanos : 0.9 * s->sync_nanos + 0.1 * nanos;
}

double schedule_weight(const schedule *s, uint32_t window_every) { return (double)window_every / s->share; }
