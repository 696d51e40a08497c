// schedule: when the allocation hook is on in windowed sampling (the default), and what a sample weighs.
//
// An enabled NEWOBJ hook costs every allocation about 380 instructions, sampled or not (the VM leaves its
// fast allocation path), so in windowed mode it is on only a small share c of the time, in many short
// windows of a fixed length D.
//
// Where the windows fall is a *stratified* design in (virtual) time: time is cut into strata of length
// L, and each stratum holds two windows, each starting at its own uniformly random point of the stratum
// and wrapping around to the stratum's start if it runs past the end. A moment is inside one window with
// probability D / L, whatever its position, so inside either with probability exactly
// c = 1 - (1 - D/L)^2 (L is chosen for that). The draws are independent from stratum to stratum and of
// the program, so no periodic program can line up with them.
//
// Why strata and not windows at random (Poisson) moments, the previous design: a stratum always holds
// its two windows, so any stretch of the program several strata long is covered for very nearly c of its
// time. With windows at random moments the covered share of a stretch is itself random: for objects that
// live 10 ms at 100 us windows and c = 4% its relative spread is about 70%, against the 13% that
// independent sampling at the same rate has. Measured in a simulation of the estimator (live spans of
// 2 ms to 1 s): the stratified spread matches independent sampling from about two strata on.
// Why two windows: with one per stratum there is no unbiased estimate of the variance (neighbouring
// strata differ by what the program did in them). Two windows of one stratum are independent draws of
// the same thing, so the difference of their totals estimates the variance exactly (variance.h: windows
// are numbered 2 x stratum + 0 or 1, and that number is what a sample keeps).
//
// The hook's actual state can only change where heapscope gets control: at an interrupt check (a
// postponed job a timer thread asks for at each window's edges, ticker.h) and inside a GC. At each such
// sync point capture sets the hook to the schedule's state *at that moment*. An allocation is therefore
// sampled-from iff a window covered the last sync point before it; sync points come from the program
// (its interrupt checks, its GCs), not from the schedule, so that happens with probability c, wherever
// the allocation falls: between GCs, after an idle phase, inside a long C call that checks no interrupts
// (its allocations all see the state of the last sync before the call), in any thread. Inside a window
// each allocation is sampled with probability 1 / window_every (a geometric countdown, sampler.h). An
// allocation's inclusion probability is c / window_every = 1 / sample_every, the same for all: every
// sample weighs sample_every (Horvitz-Thompson), a fixed number, never more.
//
// Time is *virtual*: monotonic time minus heapscope's own work (sampling, the hook's cost per hook-on
// allocation, sync jobs), which happens only while the hook is on and would otherwise stretch windows
// over less of the program's own work: allocation-dense code would be under-sampled.
//
// Pure C, no Ruby: unit-tested on its own (test/c/test_schedule.c). Not thread-safe: capture.c and the
// ticker share one schedule under a mutex.
#ifndef HEAPSCOPE_SCHEDULE_H
#define HEAPSCOPE_SCHEDULE_H

#include <stdbool.h>
#include <stdint.h>

// The shortest window: timer wake-ups are not much finer than this.
#ifndef SCHEDULE_MIN_WINDOW_NANOS
#define SCHEDULE_MIN_WINDOW_NANOS 100000.0 // 100 us
#endif
// The longest window (reached only when sync jobs are very slow, as under valgrind).
#define SCHEDULE_MAX_WINDOW_NANOS 50000000.0 // 50 ms
// Sync jobs (two per window) may take about this share of time; windows are lengthened until they do
// (schedule_note_sync_cost).
#ifndef SCHEDULE_SYNC_SHARE
#define SCHEDULE_SYNC_SHARE 0.002
#endif
// When (virtual time) the window length is retuned to the sync jobs' cost: first at
// SCHEDULE_FIRST_RETUNE_NANOS (short runs matter too), then every SCHEDULE_RETUNE_NANOS. A retune that
// changes the length starts a new grid of strata at that moment; the old stratum is cut short there.
// The moments are fixed, so every moment is still covered with probability c.
#define SCHEDULE_FIRST_RETUNE_NANOS 50000000ull // 50 ms
#define SCHEDULE_RETUNE_NANOS 500000000ull      // 0.5 s

typedef struct {
  double share;          // c: the probability that a window covers a given moment (adjusted, see schedule_init)
  double window_nanos;   // D: each window's length
  double stratum_nanos;  // L: each stratum's length; it holds two windows
  uint32_t sample_every; // the rate sought overall (1 in N)
  uint32_t window_every; // the rate inside a window: 1 in window_every = share * sample_every
  uint64_t seed;         // the windows' positions are a hash of the seed and the stratum's number
  uint64_t origin;       // virtual time at which the current grid's stratum 0 starts
  uint64_t first_unit;   // the number of the current grid's stratum 0 (numbers go on across grids)
  uint64_t stratum;      // the stratum (in the current grid) whose offsets are below
  double offsets[2];     // the two windows' starts within that stratum, in [0, L)
  bool on;               // the state at `at`
  uint32_t window;       // at `at`, if on: the covering window's number, 2 x stratum number + 0 or 1
  uint64_t at;           // the latest virtual time asked about
  uint64_t next_retune;  // virtual nanoseconds at which the window length is retuned next
  double sync_nanos;     // a moving average of a sync job's cost (0: none measured yet)
  uint64_t flips;        // changes of state seen by the askers so far
} schedule;

// Prepares s to run from virtual time now, on about `share` of the time (0 < share <= 1), for a rate of 1
// in sample_every (>= 1). The share is adjusted so that share * sample_every is a whole number, the
// in-window rate (at least 1: a sample_every below 1 / share raises the share to 1 / sample_every; it is
// never lowered).
void schedule_init(schedule *s, double share, uint32_t sample_every, uint64_t now, uint64_t seed);

// Draws the windows from now on anew from another seed (a forked child must not repeat its parent's).
void schedule_reseed(schedule *s, uint64_t seed);

// The state at virtual time now: true when a window covers it (s->window then says which). A now before
// the last one asked counts as the last one (the schedule never runs backwards). The path is a function
// of time: asking often or rarely sees the same states.
bool schedule_state_at(schedule *s, uint64_t now);

// When the state may change next after the last time asked (virtual nanoseconds): a window's edge, the
// stratum's end, or the next retune moment, whichever comes first. UINT64_MAX: never (a share of 1).
uint64_t schedule_next_event(const schedule *s);

// Takes a sync job's measured cost into a moving average. At the next retune moment, where two jobs per
// window would take more than SCHEDULE_SYNC_SHARE of the time, windows are lengthened (or shortened
// back, never under SCHEDULE_MIN_WINDOW_NANOS), strata with them, so the share stays as it is.
void schedule_note_sync_cost(schedule *s, double nanos);
// (Sync jobs run late on a busy machine, and a window that ends before its job runs never opens: the
// weight scale corrects for the lost ones. Windows of twice the jobs' mean delay lost fewer, but were
// so few that estimates spread more: docs/architecture.md. So delay does not lengthen windows.)

// What one sample taken inside a window at the in-window rate 1 in window_every stands for:
// window_every / share (sample_every when window_every is the one schedule_init chose).
double schedule_weight(const schedule *s, uint32_t window_every);

#endif
