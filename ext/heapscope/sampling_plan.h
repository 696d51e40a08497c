// sampling_plan: the one place that decides when the allocation hook is on and what a sample weighs.
//
// Two questions make an estimate unbiased, and both are answered here, from numbers the caller hands in
// (times, allocation counts), never from Ruby:
// - When is the hook on? Always (sampling: :always), or in windows (the default): the chain
//   (schedule.h) says when a window should be open; plan_hook_wanted turns that, at a sync point, into
//   "open", "close" or "leave"; plan_open_window / plan_close_window keep the windows' accounting
//   (numbers, virtual time open, allocations seen).
// - What does a sample weigh? Inside the hook a countdown (sampler.h, geometric) picks the allocations
//   sampled; plan_draw loads it at the rate in force (the budget's, budget.h; windowed: denser by 1 /
//   share, denser still where windows were lost, plan_update_density) and fixes the weight of the sample
//   at its end. The weight scale corrects every value of a profile for the share of allocations the
//   hook really saw, one scale per stretch of the run (plan_close_stretch).
//
// Focused classes (strata): a class given its own rate (Heapscope.start(focus:)) is counted down by a
// countdown of its own, never by the common one, so its allocations are sampled at their own rate and
// each sample weighs 1 / that rate (stratified sampling: every estimate stays unbiased, and a denser
// rate narrows that class's error). Windowed, a stratum's rate inside windows follows the same rule as
// the common one (denser by 1 / share), so it can be no denser than 1 in 1 / share overall; the budget
// lowers every stratum's rate by the factor it lowers the common one. Strata count toward the
// allocations the hook has seen (the weight scale needs them all). Which allocations belong to a
// stratum is the hook's business (alloc_hook.c: a table of classes); here a stratum is a number.
//
// Virtual time is monotonic time minus heapscope's own work (own_nanos, plan_charge), which happens
// mostly while the hook is on and would otherwise stretch windows over less of the program
// (schedule.h); recording a Thread or Fiber whole (alloc_hook_track_exact) is charged too, at any time.
//
// Who calls what: the NEWOBJ hook (alloc_hook.c) decrements `countdown` and, at 0, calls plan_sampled,
// plan_charge and plan_draw (alloc_hook_track_exact calls plan_charge); windows.c calls the rest at sync
// points and registers or removes the hook as told; capture.c starts the plan and reads its statistics.
//
// Pure C, no Ruby: unit-tested on its own (test/c/test_sampling_plan.c). Not thread-safe: every function
// runs with the GVL held (one plan per process), except that the ticker thread shares `chain` under the
// caller's lock (functions marked [chain] must be called with that lock held) and reads own_nanos
// (atomic). Nothing here allocates or fails.
#ifndef HEAPSCOPE_SAMPLING_PLAN_H
#define HEAPSCOPE_SAMPLING_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "budget.h"
#include "clock.h"
#include "sampler.h"
#include "schedule.h"

// At most this many focused classes (strata) in a run.
#define PLAN_MAX_STRATA 72 // 64 named by the caller, 8 for automatic focus (lib/heapscope/auto_focus.rb)

// The budget's window share (window_share 0 with a budget: plan_update_density): the bounds it moves
// within (a run starts at PLAN_DEFAULT_SHARE). It changes only where a stretch closes (below), so each
// stretch holds one share and its own scale: above 1/6 windows lengthen (the gaps between them keep
// their 500 us mean, schedule.h SCHEDULE_MIN_MEAN_OFF_NANOS), and longer windows are seen more fully
// (the ticker wakes late by about the same time at either end), so a share's samples need their own
// stretch's scale. Not above 1 / 2: windows are the clusters the variance is estimated over and the unit
// a stretch counts, and at 1 / 2 they last 500 us and a thousand still open each second of allocating
// time; nearer 1 they would last up to 50 ms and be too few to close a stretch when the budget must
// lower the share (at 1 none would: the hook would simply stay on). Above PLAN_DEFAULT_SHARE the
// budget also pays for the ticker's wake-ups (plan_budget_share). docs/accuracy.md ("A light program")
// has what a high share bought and cost. Not below 1 / 200: a window then opens every 20 ms, still a
// few hundred clusters in a run of a few seconds.
#define PLAN_AUTO_SHARE_MAX 0.5
#define PLAN_AUTO_SHARE_MIN 0.005
// The budget's share does not move in a run's first second (virtual time): a change begins a young
// stretch, which a profile scales together with the last one, drawn at the other share (plan_tail_scales),
// and a run that ends a few tenths of a second after a change ends with that tail. Measured (bench/accuracy,
// Ruby 3.3, 40 runs): runs of 0.75 s whose share changed at 0.55 s read 1.7x `:always`'s spread, against
// 1.0x at the fixed share.
#define PLAN_SHARE_HOLD_NANOS 1000000000ull
// The share the hook's measured cost is given of what the budget leaves (plan_budget_share).
#define PLAN_AUTO_SHARE_AIM 0.8
// The share used where the caller gives none and no budget can choose one (sample_every given alone),
// and where the budget's share starts. Not at the top of its range: one weight scale serves a whole
// stretch (a run's first second or so holds one), so a share that moves far leaves samples drawn before
// the move weighted by how fully the hook saw the windows after it, and vice versa. Measured before
// stretches, with one scale per run: started at 0.15 and checked after 10 ms, the budget's share fell
// to 0.03-0.05 within the first checks, and allocation counts came out 2-5% low (bench/accuracy,
// lifetimes and phased cases, Ruby 3.3, 12 runs: z down to -5.2; started at 0.15 and moving to about 0.1,
// they did not).
#define PLAN_DEFAULT_SHARE 0.04

// The weight scale's bounds (each stretch's, plan_close_stretch).
#define PLAN_WEIGHT_SCALE_MIN 0.5
#define PLAN_WEIGHT_SCALE_MAX 5.0

// Stretches. The hook does not see the same part of its windows all through a run: a phase that makes
// its allocations in long C calls, or GCs often, or runs while the machine is busy loses more of them
// than another, and the budget's share moves. One weight scale for the run weighed one phase's samples
// by the other's losses (docs/windowed-sampling.md: a build phase 3-5% low and the work after it 6-20%
// high). So the run is cut into stretches at density checks, and when one closes its scale (what the
// hook was meant to see in it over what it saw) is for every sample of its windows (the recorder keeps
// the table: recorder_close_stretch), fixed once the next stretch has grown (plan_tail_scales). A stretch closes only between windows (a window's samples
// share one scale), and only once it has held PLAN_STRETCH_MIN_WINDOWS windows, since a ratio over n
// windows is biased by about its squared relative error, which shrinks as 1 / n (at 100, bench/accuracy's
// lifetimes rows stayed within 1.5 standard errors over 40 runs, Ruby 3.3; phases shorter than a
// stretch still share its scale). It lasts at least
// PLAN_STRETCH_MIN_NANOS of virtual time, or 1 / PLAN_STRETCH_AGE_DIVISOR of the run so far, so a
// process that runs for days closes a few hundred (about 64 x ln(age / 32 s)), never more than
// PLAN_MAX_STRETCHES (then the last one stays open).
#define PLAN_MAX_STRETCHES 1024
#define PLAN_STRETCH_MIN_WINDOWS 100
#define PLAN_STRETCH_MIN_NANOS 500000000ull
#define PLAN_STRETCH_AGE_DIVISOR 64

typedef struct {
  uint32_t sample_every; // the rate sought overall (1 in N)
  double max_overhead;   // the adaptive budget (budget.h); <= 0: always sample_every
  bool windowed;         // windows (schedule.h); else the hook is on for every allocation
  double window_share;   // windowed: the share of time the hook is on, e.g. 0.04; <= 0: the budget's
                         // (starts at PLAN_DEFAULT_SHARE), or PLAN_DEFAULT_SHARE without a budget
  const uint32_t *strata_every; // each focused class's rate (1 in N, >= 1), strata_count of them
  uint32_t strata_count;        // <= PLAN_MAX_STRATA
} plan_config;

// A focused class's countdown, as the common one: allocations left until its next sample, what that
// sample weighs, and what the countdown was loaded with.
typedef struct {
  uint64_t countdown;
  uint64_t step;
  uint32_t draw_weight;
  uint32_t every;   // the rate asked for (1 in N), before the budget's factor
  uint64_t samples; // samples this stratum drew since plan_start
} plan_stratum;

typedef struct {
  // The hook's: allocations left until the next sample (its only work is a decrement), and what that
  // sample weighs. UINT64_MAX: parked (plan_park), the hook does nothing more.
  uint64_t countdown;
  uint32_t draw_weight;
  bool halted;     // plan_halt: parked for good, until the next plan_start
  uint64_t step;   // what countdown was last loaded with: step - countdown have been counted down since
  uint32_t window; // the current window's number: a sample's cluster (each sample's own when always)
  bool windowed;
  bool window_open; // windowed: the hook is on (as last applied by plan_open_window / plan_close_window)
  sampler sampler;  // the countdowns' random numbers (and weights' rounding)
  budget budget;
  schedule chain;   // [chain] when a window should be open; shared with the ticker under the caller's lock

  uint64_t own_nanos;       // heapscope's own time, left out of virtual time: atomic (the ticker reads it)
  double hook_cost_nanos;   // an enabled hook's cost per allocation (measured once per process; < 0: not yet)
  uint64_t hook_allocations;      // allocations the hook has seen, up to the last countdown load or close
  uint64_t uncharged_allocations; // of which not yet charged to own_nanos
  uint64_t last_charged_nanos;    // monotonic time of the last charge
  uint64_t started_allocations;   // the VM's allocation count at plan_start
  uint64_t started_virtual;       // virtual time at plan_start
  uint64_t window_opened_virtual; // virtual time the current window opened
  uint64_t window_opened_allocations; // hook_allocations when it opened
  uint64_t closed_windows_virtual;    // virtual time the closed windows were open for
  double seen_share;              // the share of allocations the hook had seen at the last density check
  uint64_t next_density_check;    // virtual time of the next (plan_density_due)
  uint32_t strata_count;          // focused classes in this run
  plan_stratum strata[PLAN_MAX_STRATA];
  // The budget's share (auto_share): the chain's share moves at density checks, each weight is that of
  // the share it was drawn at, and the hook is meant to see sum(share x allocations) of them.
  bool auto_share;
  double meant_allocations;       // sum over past shares of share x the VM's allocations while it held
  uint64_t share_since_allocations; // the VM's allocations (since start) when the current share began
  uint64_t checked_virtual;       // virtual time of the last density check (or start)
  uint64_t checked_allocations;   // the VM's allocations (since start) then
  uint64_t checked_own;           // own_nanos then
  uint64_t checked_hook;          // hook_allocations then
  double work_share;              // heapscope's own work but the hook's, over the last check's period
  uint64_t ticker_cpu_nanos;      // the ticker's CPU time, as last noted (plan_note_ticker_cpu)
  uint64_t checked_ticker;        // ticker_cpu_nanos at the last check
  double ticker_share;            // the ticker's CPU over the last check's period, as a share of its time
  double min_share;               // the lowest share in force since start
  double hook_cost_share;         // the last measured hook cost at full share (allocations x cost / time)
  uint64_t share_changes_waited;  // density checks at which a change waited (its stretch, or the hold)
  uint64_t share_hold_until;      // virtual time before which the share does not move (PLAN_SHARE_HOLD_NANOS)
  bool stretch_close_owed;        // the share changed at this check: the stretch closes with it
  // Stretches (plan_close_stretch): where the open one began, and what the closed ones add up to.
  uint32_t stretch_count;          // closed this run
  uint32_t stretch_first_window;   // the open stretch's first window number
  uint64_t stretch_started_virtual;
  double stretch_meant_start;      // meant allocations (since start) when the open stretch began
  uint64_t stretch_hook_start;     // hook_allocations then
  double last_stretch_meant;       // the last closed stretch's meant and seen allocations (0: none yet),
  uint64_t last_stretch_hook;      // and its scale
  double last_stretch_scale;
  double scaled_hook_allocations;  // over the closed stretches: each one's scale x the allocations it saw
  double stretch_scale_min, stretch_scale_max; // over the closed stretches (0 when none)
} sampling_plan;

// ---- Lifecycle ----

// [chain] Prepares p for a run from monotonic time now, with the VM's allocation count vm_allocations,
// and draws the first countdown. Keeps own_nanos and hook_cost_nanos (process-wide, they outlive runs).
void plan_start(sampling_plan *p, const plan_config *config, uint64_t now, uint64_t vm_allocations, uint64_t seed);
// The run ends: a window still open is dropped with it (not counted as closed).
void plan_stop(sampling_plan *p);
// Once per process: what an enabled NEWOBJ hook costs one allocation (charged to own time).
void plan_set_hook_cost(sampling_plan *p, double nanos);
// The hook does nothing more (countdown parked) until the next plan_start or plan_draw.
void plan_park(sampling_plan *p);
// The fail-safe (capture.h): parked, and plan_draw leaves it parked, until the next plan_start.
void plan_halt(sampling_plan *p);
// [chain] In a forked child: new random numbers for the countdowns and the chain, from the parent's
// next one mixed with mix (the child must not sample where its parent does). Async-signal-safe.
void plan_reseed(sampling_plan *p, uint64_t mix);

// ---- Time ----

// Monotonic nanoseconds: the clock own time and virtual time are measured on. Any thread.
static inline uint64_t plan_monotonic_nanos(void) { return clock_monotonic_nanos(); }

// Virtual nanoseconds at monotonic time now. Any thread (atomic).
uint64_t plan_virtual_now(const sampling_plan *p, uint64_t now);
// Adds heapscope's own work to own_nanos (left out of virtual time). Only under the GVL.
void plan_add_own_nanos(sampling_plan *p, uint64_t nanos);
// Charges heapscope's own time: work from started to now, plus what the hook cost the allocations it saw
// since the last charge (the measured cost, never more than half the rest of the time since the last
// charge: an estimate too high would stop virtual time with the window open). Work also counts against
// the budget, which may change the rate (from the next plan_draw on).
void plan_charge(sampling_plan *p, uint64_t started, uint64_t now);

// ---- The hook: countdowns and weights ----

// Loads the countdown to the next sample at the rate in force and fixes that sample's weight (none
// after plan_halt).
void plan_draw(sampling_plan *p);
// The countdown reached 0: its allocations count as seen (and uncharged). Returns the sample's weight.
uint32_t plan_sampled(sampling_plan *p);
// A focused class's countdown (stratum i < strata_count) reached 0: as plan_sampled, for its own
// countdown. Then plan_draw_stratum.
uint32_t plan_sampled_stratum(sampling_plan *p, uint32_t i);
// Loads stratum i's countdown at its rate (times the budget's factor; windowed, denser inside windows as
// the common rate) and fixes its next sample's weight (none after plan_halt).
void plan_draw_stratum(sampling_plan *p, uint32_t i);
// Stratum i samples 1 in every (>= 1) from now on: its countdown is drawn anew at that rate (a sample
// drawn at the old rate would weigh the old rate; memoryless, so nothing else changes).
void plan_set_stratum_every(sampling_plan *p, uint32_t i, uint32_t every);
// The rate stratum i draws at now, overall (1 in N): its own times the budget's factor.
uint32_t plan_stratum_every(const sampling_plan *p, uint32_t i);
// A sample is recorded: its cluster (always: a new one per sample; windowed: the open window).
uint32_t plan_cluster(sampling_plan *p);

// ---- Windows (sync points) ----

// [chain] At a sync point: whether the hook should be on. ticker_runs: apply the state the ticker
// requested at its last wake-up (schedule.h says why), else read the chain now. held_shut: the caller
// must keep the hook off here whatever the chain says (GC.stress, a Ractor may be starting).
bool plan_hook_wanted(sampling_plan *p, uint64_t virtual_now, bool ticker_runs, bool held_shut);
// A window opens at virtual time now: a new number (cluster).
void plan_open_window(sampling_plan *p, uint64_t virtual_now);
// The open window ends at virtual time now; returns the allocations the hook saw in it (the recorder's
// variance group needs them). The countdown keeps what is left for the next window (memoryless).
uint64_t plan_close_window(sampling_plan *p, uint64_t virtual_now);
// Whether a density check is due at virtual time now: at fixed moments (as the chain's retunes, so when
// it happens does not depend on the chain), then plan_update_density with the VM's allocation count.
bool plan_density_due(const sampling_plan *p, uint64_t virtual_now);
// [chain] The share of allocations the hook has seen so far sets how densely windows are sampled from now
// on (schedule_window_every). With the budget's share, the density of allocations since the last check
// (times the hook's measured cost) first sets the share: PLAN_AUTO_SHARE_AIM of (max_overhead less what
// heapscope's own work took) over what the hook would cost on all the time, within the bounds, moved
// only by a quarter or more, up at most 2x a check, not in the run's first PLAN_SHARE_HOLD_NANOS, and
// only where the open stretch closes at this check (plan_close_stretch, called next, closes it): up,
// once it is due; down, once it has held PLAN_STRETCH_MIN_WINDOWS windows. A change that waits is
// counted (share_changes_waited). A changed rate draws the countdowns anew.
void plan_update_density(sampling_plan *p, uint64_t virtual_now, uint64_t vm_allocations);
// What the chain's share would be now for this density of allocations (allocations per virtual
// nanosecond), share of time heapscope's own work took (sampling, sync jobs: not the hook) and CPU the
// ticker's wake-ups took per unit of share (0: not measured), before the bounds on change: the rule
// plan_update_density applies. Above PLAN_DEFAULT_SHARE the budget also pays for the ticker's wake-ups,
// which grow with the share (two a window): a share above the default must fit the hook and them.
double plan_budget_share(const sampling_plan *p, double allocations_per_nano, double work_share, double ticker_per_share);
// The ticker thread's CPU time so far (ticker_cpu_nanos), noted before each density check. It runs
// beside the program, so it is no part of virtual time; it counts against the budget when the budget
// would raise the share above the default (plan_budget_share).
void plan_note_ticker_cpu(sampling_plan *p, uint64_t cpu_nanos);

// ---- What the profile reads ----

// Allocations the VM made since plan_start, given its count now.
uint64_t plan_vm_allocations(const sampling_plan *p, uint64_t vm_allocations);
// Allocations the hook saw since plan_start (all of vm when not windowed), the open window's included.
uint64_t plan_hook_allocations(const sampling_plan *p, uint64_t vm);
// The share the hook was meant to see of the VM's vm allocations since plan_start (the allocation-weighted
// mean of the chain's shares; its share when it never moved; 1 when always).
double plan_meant_share(const sampling_plan *p, uint64_t vm);
// The share of virtual time a window was open since plan_start (1 when always).
double plan_realized_share(const sampling_plan *p, uint64_t virtual_now);
// Allocations the hook saw in the window still open (0 when none).
uint64_t plan_open_window_allocations(const sampling_plan *p, uint64_t vm);
// The share of time meant for the hook over the share of allocations it really saw, over the whole run
// (capture.h says why it multiplies every weight). 1 when always, or before any window. Unbounded.
double plan_weight_scale_wanted(const sampling_plan *p, uint64_t vm);
// The scale the run's samples were given on average (each stretch's scale, weighted by the allocations
// the hook saw in it; the tail's as plan_tail_scales): plan_weight_scale_wanted where no bound held.
double plan_weight_scale(const sampling_plan *p, uint64_t vm);

// ---- Stretches ----

// At a density check, after plan_update_density (vm_allocations: the VM's count, as there): closes the
// open stretch if it is due (see PLAN_STRETCH_MIN_WINDOWS). Then *last_window is the number of its last
// window, *scale its scale (its meant over its seen allocations, within the bounds; fixed for its
// samples once the next stretch has grown: plan_tail_scales), and true is returned; the next stretch
// begins with the next window.
bool plan_close_stretch(sampling_plan *p, uint64_t virtual_now, uint64_t vm_allocations, uint32_t *last_window, double *scale);
// The scales of the run's tail, given the VM's allocations since start: *last for the samples of the
// last closed stretch, *open for those of the open one. Each its own ratio within the bounds, except
// while the open stretch has held fewer than PLAN_STRETCH_MIN_WINDOWS windows: then both are one ratio
// over the two, as if the last had not closed (a young stretch's own ratio is noisy, and a scale pooled
// for its samples alone would not cancel their luck as a ratio over their own windows does). With no
// closed stretch, *open is the whole run's ratio. 1 when always.
void plan_tail_scales(const sampling_plan *p, uint64_t vm, double *last, double *open);

#endif
