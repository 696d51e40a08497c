#include "schedule.h"

#include <math.h>

// An exponential duration of the given mean, in nanoseconds, at least 1.
static uint64_t exponential(schedule *s, double mean) {
  // u uniform in (0, 1]: -log(u) is Exp(1).
  double u = (double)((sampler_random(&s->random) >> 11) + 1) * (1.0 / 9007199254740992.0);
  double d = -log(u) * mean;
  if (!(d < 1e17)) d = 1e17;
  return d < 1.0 ? 1u : (uint64_t)d;
}

static double shortest_mean_on(double share);
static double affordable_mean_on(const schedule *s);

static double mean_off(const schedule *s) { return s->mean_on_nanos * (1.0 - s->share) / s->share; }

static uint64_t draw_period(schedule *s) { return exponential(s, s->on ? s->mean_on_nanos : mean_off(s)); }

// The in-window rate for share at sample_every: round(share x sample_every), at least 1.
static double window_every_for(double share, uint32_t sample_every) {
  if (!(share > 0.0)) share = 1.0 / sample_every;
  if (share > 1.0) share = 1.0;
  double every = round(share * sample_every);
  return every < 1.0 ? 1.0 : every;
}

// A state drawn from the stationary distribution at `at` (on with probability share), and the time to
// its flip: a memoryless period has the same law from any point.
static void draw_stationary_state(schedule *s, uint64_t at) {
  if (s->share >= 1.0) {
    s->on = true;
    s->next_change = UINT64_MAX; // always on
    return;
  }
  s->on = sampler_uniform(&s->random) < s->share;
  s->next_change = at + draw_period(s);
}

void schedule_init(schedule *s, double share, uint32_t sample_every, uint64_t now, uint64_t seed) {
  if (sample_every < 1) sample_every = 1;
  double every = window_every_for(share, sample_every);
  *s = (schedule){
    .share = every / sample_every,
    .mean_on_nanos = shortest_mean_on(every / sample_every),
    .sample_every = sample_every,
    .window_every = (uint32_t)every,
    .at = now,
    .next_retune = now + SCHEDULE_FIRST_RETUNE_NANOS,
    .requested_since = now,
    .started = now,
  };
  sampler_init(&s->random, 2, seed);
  draw_stationary_state(s, now);
  s->requested = s->on;
}

bool schedule_set_share(schedule *s, double share, uint64_t now) {
  double every = window_every_for(share, s->sample_every);
  if ((uint32_t)every == s->window_every) return false;
  (void)schedule_state_at(s, now); // the old chain up to now (never backwards)
  s->share = every / s->sample_every;
  s->window_every = (uint32_t)every;
  s->share_changes++;
  s->mean_on_nanos = affordable_mean_on(s);
  draw_stationary_state(s, s->at);
  // Requested at once: the sync point making the change applies it, not the state the ticker asked for
  // under the old chain (that state, kept until the ticker's next wake-up, made windows the new chain
  // never drew, at moments the old chain's flips chose).
  (void)schedule_request(s, s->at);
  return true;
}

// The shortest mean window for the share: SCHEDULE_MIN_MEAN_ON_NANOS, and long enough that the gaps
// between windows last SCHEDULE_MIN_MEAN_OFF_NANOS on average.
static double shortest_mean_on(double share) {
  double for_gaps = share < 1.0 ? SCHEDULE_MIN_MEAN_OFF_NANOS * share / (1.0 - share) : 0.0;
  return for_gaps > SCHEDULE_MIN_MEAN_ON_NANOS ? for_gaps : SCHEDULE_MIN_MEAN_ON_NANOS;
}

// The mean window two sync jobs per window can afford.
static double affordable_mean_on(const schedule *s) {
  double wanted = 2.0 * s->sync_nanos * s->share / SCHEDULE_SYNC_SHARE; // a cycle lasts D / share
  if (wanted < shortest_mean_on(s->share)) wanted = shortest_mean_on(s->share);
  if (wanted > SCHEDULE_MAX_MEAN_ON_NANOS) wanted = SCHEDULE_MAX_MEAN_ON_NANOS;
  return wanted;
}

// At a retune moment: only changes of a quarter or more (each one redraws the pending period).
static void retune(schedule *s) {
  uint64_t at = s->next_retune;
  s->next_retune = at + SCHEDULE_RETUNE_NANOS;
  s->retunes++;
  if (s->share >= 1.0) return; // always on: no periods to lengthen
  double wanted = affordable_mean_on(s);
  if (fabs(wanted - s->mean_on_nanos) < 0.25 * s->mean_on_nanos) return;
  s->mean_on_nanos = wanted;
  s->next_change = at + draw_period(s);
}

bool schedule_state_at(schedule *s, uint64_t now) {
  if (now < s->at) now = s->at;
  for (;;) {
    if (s->next_retune <= now && s->next_retune <= s->next_change) {
      retune(s);
    } else if (s->next_change <= now) {
      s->on = !s->on;
      s->flips++;
      s->next_change += draw_period(s);
    } else {
      break;
    }
  }
  s->at = now;
  return s->on;
}

bool schedule_request(schedule *s, uint64_t now) {
  bool on = schedule_state_at(s, now);
  now = s->at; // never before an earlier request
  if (on != s->requested) {
    if (s->requested) s->requested_on_nanos += now - s->requested_since;
    s->requested = on;
    s->requested_since = now;
  }
  return on;
}

bool schedule_requested(const schedule *s) { return s->requested; }

double schedule_requested_share(const schedule *s, uint64_t now) {
  if (now < s->at) now = s->at;
  if (now <= s->started) return s->requested ? 1.0 : 0.0;
  uint64_t on = s->requested_on_nanos + (s->requested ? now - s->requested_since : 0);
  return (double)on / (double)(now - s->started);
}

uint64_t schedule_next_event(const schedule *s) {
  return s->next_retune < s->next_change ? s->next_retune : s->next_change;
}

void schedule_note_sync_cost(schedule *s, double nanos) {
  if (!(nanos >= 0.0)) return;
  s->sync_nanos = s->sync_nanos == 0.0 ? nanos : 0.9 * s->sync_nanos + 0.1 * nanos;
}

double schedule_weight(const schedule *s, uint32_t window_every) { return (double)window_every / s->share; }

uint32_t schedule_window_every(const schedule *s, uint32_t every, double seen) {
  double planned = (double)every * s->share;
  double in_window = planned;
  if (seen > 0.0 && seen < s->share) {
    double floor_rate = planned / SCHEDULE_MAX_DENSER;
    in_window = (double)every * seen < floor_rate ? floor_rate : (double)every * seen;
  }
  in_window = round(in_window);
  return in_window < 1.0 ? 1u : in_window > 4294967295.0 ? UINT32_MAX : (uint32_t)in_window;
}
