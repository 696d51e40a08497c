// schedule: when the allocation hook is on in windowed sampling (the default), and what a sample weighs.
//
// An enabled NEWOBJ hook costs every allocation about 380 instructions, sampled or not (the VM leaves its
// fast allocation path), so in windowed mode it is on only a small share c of the time, in many short
// windows. Whether it should be on is a two-state Markov chain in time: on-periods last Exp(D), off-periods
// Exp(D (1 - c) / c), and the chain starts in its stationary distribution (on with probability c). So at
// any moment chosen without looking at the chain, it is on with probability exactly c.
//
// The hook's actual state can only change where heapscope gets control: at an interrupt check (a
// postponed job a timer thread asks for when the chain flips, ticker.h) and inside a GC. At each such
// sync point capture sets the hook to the *requested* state: the chain's state as the ticker read it at
// its last wake-up (schedule_request, below). An allocation is therefore sampled-from iff the requested
// state was on at the program's last interrupt check before it, a moment the program chooses, not the
// chain: that happens with the requested state's share of the time (about c, measured), wherever the
// allocation falls: between GCs, after an idle phase, inside a long C call that checks no interrupts
// (its allocations all see the state of the last interrupt check before the call), in any thread.
// Inside a window each allocation is sampled with probability 1 / window_every (a geometric countdown,
// sampler.h). An allocation's inclusion probability is c / window_every = 1 / sample_every, the same for
// all: every sample weighs sample_every (Horvitz-Thompson), a fixed number, never more.
//
// The ticker wakes late (tens of microseconds), so windows shorter than that are never requested, and
// the program runs slower while the hook is on than virtual time charges for: the hook sees fewer
// allocations than c (on an idle machine about 60-75% as many). Left so, a profile would rest on that
// share of the samples sample_every asks for. So windows are sampled more densely, by the share of
// allocations the hook has been seen to miss (schedule_window_every, measured by the sampling plan at fixed
// moments, from the past only), and each sample weighs window_every / c, less than sample_every; the
// weight scale (capture.h) corrects for the allocations missed.
//
// Time is *virtual*: monotonic time minus heapscope's own work (sampling, the hook's cost per hook-on
// allocation, sync jobs), which happens only while the hook is on and would otherwise stretch on-periods
// over less of the program's own work: allocation-dense code would be under-sampled.
//
// Windows are clusters: the samples of one window come from one stretch of the program, and their
// survival is correlated. Variance is estimated per window (recorder.c), so error bars count that.
//
// Pure C, no Ruby: unit-tested on its own (test/c/test_schedule.c). Not thread-safe: the sampling plan
// (sampling_plan.h) and the ticker share one schedule under a mutex (windows.c's).
#ifndef HEAPSCOPE_SCHEDULE_H
#define HEAPSCOPE_SCHEDULE_H

#include <stdbool.h>
#include <stdint.h>

#include "sampler.h"

// The shortest mean window: timer wake-ups are not much finer than this.
#ifndef SCHEDULE_MIN_MEAN_ON_NANOS
#define SCHEDULE_MIN_MEAN_ON_NANOS 100000.0 // 100 us
#endif
// The shortest mean gap between windows: the ticker's wake-ups come tens of microseconds late, and a
// high share with 100 us gaps would lose many of its flips to them. Longer windows keep the gaps at
// least this long; at shares up to 1/6 the 100 us window already does (the budget's share goes up to 1/2).
#ifndef SCHEDULE_MIN_MEAN_OFF_NANOS
#define SCHEDULE_MIN_MEAN_OFF_NANOS 500000.0 // 500 us
#endif
// The longest mean window (reached only when sync jobs are very slow, as under valgrind).
#define SCHEDULE_MAX_MEAN_ON_NANOS 50000000.0 // 50 ms
// Sync jobs (two per window) may take about this share of time; the mean window is lengthened until
// they do (schedule_note_sync_cost).
#ifndef SCHEDULE_SYNC_SHARE
#define SCHEDULE_SYNC_SHARE 0.002
#endif
// When (virtual time) the mean window is retuned to the sync jobs' cost: first at
// SCHEDULE_FIRST_RETUNE_NANOS (short runs matter too), then every SCHEDULE_RETUNE_NANOS; at fixed
// moments, so that when the rates change does not depend on the chain's state (which would break its
// stationarity).
#define SCHEDULE_FIRST_RETUNE_NANOS 50000000ull // 50 ms
#define SCHEDULE_RETUNE_NANOS 500000000ull      // 0.5 s

typedef struct {
  double share;          // c: the chain's stationary probability of being on (adjusted, see schedule_init)
  double mean_on_nanos;  // D
  uint32_t sample_every; // the rate sought overall (1 in N)
  uint32_t window_every; // the rate inside a window: 1 in window_every = share * sample_every
  bool on;               // the chain's state at `at`
  uint64_t at;           // virtual nanoseconds up to which the chain has been drawn
  uint64_t next_change;  // virtual nanoseconds at which it flips next
  uint64_t next_retune;  // virtual nanoseconds at which the mean window is retuned next
  double sync_nanos;     // a moving average of a sync job's cost (0: none measured yet)
  uint64_t flips;        // changes drawn so far
  uint64_t retunes;      // retune moments passed so far
  uint64_t share_changes; // schedule_set_share calls that changed the share
  // The requested state (schedule_request): what the ticker last asked sync points to apply, and how
  // long it has asked for "on" (virtual nanoseconds, closed periods only).
  bool requested;
  uint64_t requested_since; // virtual nanoseconds of the last request that changed it
  uint64_t requested_on_nanos;
  uint64_t started;         // virtual nanoseconds of schedule_init
  sampler random;        // the chain's own random numbers (not the allocation countdown's)
} schedule;

// Prepares s to run from virtual time now, on about `share` of the time (0 < share <= 1), for a rate of 1
// in sample_every (>= 1). The share is adjusted so that share * sample_every is a whole number, the
// in-window rate (at least 1: a sample_every below 1 / share raises the share to 1 / sample_every; it is
// never lowered). The first state is drawn from the stationary distribution.
void schedule_init(schedule *s, double share, uint32_t sample_every, uint64_t now, uint64_t seed);

// [chain] The share becomes `share` (rounded as schedule_init rounds it) at virtual time now (or the
// chain's last drawn moment, if later): the chain is drawn up to then at the old share, then its state is
// drawn afresh from the new stationary distribution, independent of the past, so from then on it is on
// with probability exactly the new share whenever that moment came. The caller picks the moment from the
// past only. The new state is requested at once (schedule_request), so the sync point making the change
// applies it. Returns whether the share changed (then the in-window rate did too: draw countdowns anew).
bool schedule_set_share(schedule *s, double share, uint64_t now);

// The chain's state at virtual time now, drawing its flips up to now. A now before the last one asked
// counts as the last one (the chain never runs backwards).
bool schedule_state_at(schedule *s, uint64_t now);

// The requested state: the chain's state as the ticker read it at its last wake-up, which is what every
// sync point applies while a ticker runs (schedule_requested), not the chain's state at the sync's own
// moment. Why: a sync job runs at the first interrupt check after the ticker's request, so its moment
// follows the chain's flips, and applying the chain's state *then* makes where the hook changes depend on
// the chain (a window that ended before its job ran is lost; a flip the ticker has not woken for yet is
// applied early). Applying the requested state instead makes every sync point behave as if one ran at
// every interrupt check (test_schedule.c checks it allocation by allocation on a simulated program): the
// hook's state at an allocation is the requested state at the program's last interrupt check before it,
// a moment the program sets and the chain does not, so it is on with the requested state's share of the
// time. That share is the chain's with its flips moved by the ticker's wake-up delays; windows shorter
// than a delay are never requested (in Ruby processes here 55-93% of the share was), and it is measured
// exactly (schedule_requested_share). On an idle machine the difference from the first rule did not show
// in bench/accuracy (docs/architecture.md): the jobs' delays are short there.
//
// schedule_request reads the chain at now (as schedule_state_at) and makes that the requested state;
// the ticker calls it at every wake-up, and so do sync points where no ticker runs (there every sync
// point is its own wake-up). Returns the state.
bool schedule_request(schedule *s, uint64_t now);
// The state last requested (the chain's first state before any request).
bool schedule_requested(const schedule *s);
// The share of virtual time from schedule_init to now during which "on" was requested.
double schedule_requested_share(const schedule *s, uint64_t now);

// When the chain may flip next (virtual nanoseconds), as drawn so far: its next flip, or the next retune
// moment if that comes first (it may redraw the flip; at a share of 1, the retune moments only).
uint64_t schedule_next_event(const schedule *s);

// Takes a sync job's measured cost into a moving average. At the next retune moment, where two jobs per
// window would take more than SCHEDULE_SYNC_SHARE of the time, the mean window is lengthened (or
// shortened back, never under SCHEDULE_MIN_MEAN_ON_NANOS). Both periods are rescaled alike, so the
// share and the stationary distribution stay as they are; the time to the next flip is drawn anew at
// that moment (the periods are memoryless).
void schedule_note_sync_cost(schedule *s, double nanos);
// (Sync jobs run late on a busy machine, and a window that ends before its job runs never opens: the
// weight scale corrects for the lost ones. Windows of twice the jobs' mean delay lost fewer, but were
// so few that estimates spread more, their error bars covered the truth less often, and a run's share
// of hook-on allocations swung past twice the share: docs/architecture.md. So delay does not lengthen
// windows.)

// How much denser than share * sample_every windows may be sampled (schedule_window_every).
#define SCHEDULE_MAX_DENSER 4.0

// The in-window rate, 1 in the result, for a rate of 1 in `every` overall (sample_every, or the overhead
// budget's lower rate), given `seen`, the share of all allocations the hook has seen so far: round(every *
// seen) while seen is below the share (at most SCHEDULE_MAX_DENSER times denser than every * share), else
// every * share as schedule_init chose it; at least 1. seen <= 0 (nothing measured yet): every * share.
uint32_t schedule_window_every(const schedule *s, uint32_t every, double seen);

// What one sample taken inside a window at the in-window rate 1 in window_every stands for:
// window_every / share (sample_every when window_every is the one schedule_init chose).
double schedule_weight(const schedule *s, uint32_t window_every);

#endif
