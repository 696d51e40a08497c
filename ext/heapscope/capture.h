// capture: a run of the sampler, from Heapscope.start to Heapscope.stop: the facade the bindings use.
//
//   allocation --NEWOBJ hook (alloc_hook.h)--> countdown hits 0? --no--> return (a decrement and a branch)
//                                   | yes: a sample
//                                   v
//     rb_profile_frames into a preallocated buffer -> code ids (names.h) -> frame and stack ids
//     (stacktab) -> class name id -> recorder_track. No Ruby allocation, no raise, no object id.
//
// Sampling modes: always (both hooks registered from start to stop) or windowed: the NEWOBJ hook
// follows a random on/off schedule in time, set at sync points: the ticker thread's postponed jobs
// (Ruby 3.3+), every GC (inside the holder's dmark, which also registers the GC_END_MARK hook for that
// GC), and every profile. Between windows no hook is registered at all. When the hook is on and what a
// sample weighs is decided by the sampling plan (sampling_plan.h, pure C); windows.h applies it.
//
// Sampling happens in the allocating thread; threads registered with capture_exclude_thread (heapscope's
// own) are left out. Names that need Ruby allocation are read when a profile is built. The GC_END_MARK
// hook keeps the records pointing only at live objects; the holder's dcompact follows objects moved by
// compaction. One capture per process (the VM has one heap); all state is static.
//
// NOTE: every function runs with the GVL held and none raises; capture_start reports failure by
//       returning false (memory short).
#ifndef HEAPSCOPE_CAPTURE_H
#define HEAPSCOPE_CAPTURE_H

#include <ruby.h>
#include <stdbool.h>
#include <stdint.h>

#include "alloc_hook.h"
#include "names.h"
#include "recorder.h"

typedef struct {
  uint32_t sample_every;
  uint32_t max_frames;
  uint32_t min_age; // kept for the profile's comments; snapshots take it as an argument
  double max_overhead; // the adaptive budget (budget.h); <= 0: always sample_every
  bool windowed;       // windowed sampling (schedule.h); else the hook is on for every allocation
  double window_share; // windowed: the share of time the hook is on, e.g. 0.04 (schedule.h)
  bool label_threads;  // every sample also gets a "thread" label: its native thread's name (labels.h)
  bool exact_threads;  // Threads and Fibers made from Ruby are recorded whole, never sampled (alloc_hook.h)
  // Focused classes (sampling_plan.h: strata): focus_classes[k] is sampled 1 in focus_every[k], by a
  // countdown of its own. The caller's arrays are copied at capture_start (classes pinned while running).
  VALUE focus_classes[PLAN_MAX_STRATA];
  uint32_t focus_every[PLAN_MAX_STRATA];
  uint32_t focus_count;
  recorder_config recorder;
} capture_config;

typedef struct {
  alloc_hook_stats hook;      // what the allocation hook picked, skipped and dropped (alloc_hook.h)
  uint64_t gc_end_marks;      // GCs observed
  uint64_t gc_end_marks_missed; // GCs that ran without our GC_END_MARK hook (see capture.c): counts may be off
  uint64_t gc_registrations_deferred; // windowed: GCs inside which no hook could be registered
  uint64_t ractor_pauses;     // Ruby 3.1: GCs that might have started a Ractor, hooks paused (ractors.h)
  uint64_t windows_opened;    // windowed: windows opened
  uint64_t sync_jobs;         // windowed: sync jobs run (the ticker's requests)
  uint64_t sync_latency_nanos, sync_latency_max_nanos; // windowed: from the ticker's last request to its job (sum, max)
  uint64_t ticker_failures;   // windowed: the ticker thread could not be started (windows change at GCs only)
  uint64_t ticker_wakeups, ticker_triggers; // windowed: the ticker's work
  uint64_t ticker_cpu_nanos;                // its thread's CPU time
  uint64_t ticker_idle_spells;              // times it stopped following flips (the program checked no interrupts)
  uint64_t schedule_flips;    // windowed: changes of the schedule's state drawn
  double share;               // windowed: the share of (virtual) time the hook is meant to be on now (1 when always)
  double mean_share;          // windowed: the allocation-weighted mean of the shares since start (plan_meant_share)
  double min_share;           // windowed: the lowest share since start
  bool share_auto;            // windowed: the budget sets the share (sampling_plan.h)
  uint64_t share_changes;     // how often it did
  uint64_t share_changes_waited; // density checks at which a change waited (its stretch, the first second)
  double hook_cost_share;     // the hook's cost at full share at the last density check (a fraction of time)
  uint32_t stretches;         // windowed: stretches closed this run, each with its own weight scale
  double stretch_scale_min, stretch_scale_max; // over them (0 when none)
  double open_stretch_scale;  // the open stretch's scale (every sample's when none closed)
  double realized_share;      // windowed: the share of virtual time it was on since start (see capture_weight_scale)
  double requested_share;     // windowed: the share of virtual time "on" was requested since start (schedule.h)
  double mean_window_nanos;   // windowed: the schedule's mean window
  double hook_cost_nanos;     // windowed: an enabled hook's cost per allocation, as measured
  uint64_t own_nanos;         // heapscope's own time, left out of virtual time
  uint32_t window;            // the current window's number (samples' clusters)
  uint64_t vm_allocations;    // allocations the VM made since start
  uint64_t hook_allocations;  // of which the allocation hook was on for (all of them when not windowed)
  uint32_t window_every;      // the sampling rate inside the current window (the rate when not windowed)
  double window_seen_share;   // windowed: the share of allocations the hook had seen when the in-window
                              // rate was last set (0: not yet; schedule_window_every)
  uint32_t current_every;     // the sampling rate in force (the budget may have lowered it)
  uint32_t max_every;         // the lowest rate the budget used since start (budget.h)
  uint64_t rate_adjustments;  // times the budget changed the rate
  uint64_t sampling_nanos;    // time spent in sampling work and the GC hook
  double last_overhead;       // sampling time / wall time over the budget's last window
} capture_stats;

// The fail-safe: after an internal error (a broken invariant, such as a record that points at no
// object) capture stops sampling at once (the hook's countdown is parked, so it does nothing more),
// prints one line to stderr (no Ruby allocation: it may be called inside a hook) and remembers why.
// The caller of the next API function finishes the job with capture_stop. Returns nothing, never raises.
void capture_fail(const char *reason);
// Why capture failed, or NULL.
const char *capture_failure(void);

// Ractors (ractors.h): the reason capture gives when it switched itself off for a Ractor, or NULL.
// Cleared by capture_start.
const char *capture_off_reason(void);
// Switches capture off for a Ractor (capture_stop, the reason kept). Main Ractor, outside the GC.
// Returns whether it was running. say: print the one line on stderr (the Ruby layer warns itself).
bool capture_switch_off_for_ractor(bool say);
// Main Ractor, outside the GC (API calls): switches capture off if a Ractor was seen or is alive (and on
// Ruby 3.1 resumes the hooks paused for one that did not come).
void capture_settle_ractors(void);
// Checks the recorder's invariants (after a snapshot) and fails capture if one broke.
void capture_check_invariants(void);

// A focused class was added or let go (alloc_hook_focus_class, alloc_hook_unfocus): the run's allocation
// hook follows (the focused one only while a class is focused). Outside the GC.
void capture_focus_changed(void);

// A Thread or Fiber was made from Ruby (lib/heapscope.rb wraps Thread.new, .start, .fork and Fiber.new):
// alloc_hook_track_exact, when running, in the main Ractor, not failed. Outside hooks and the GC.
void capture_track_exact(VALUE obj, int skip);

// Windowed sampling needs to register hooks inside the GC, which this Ruby may not allow (windows.c).
bool capture_windowed_supported(void);
// Whether windows can change at interrupt checks (the ticker: Ruby 3.3+), not only at GCs and profiles.
bool capture_windowed_ticker(void);
// GC.stress was switched (lib/heapscope.rb watches it on Ruby 3.1, see windows.c). Outside the GC.
void capture_gc_stress_changed(bool on);
// Outside the GC: counts the GCs that ran without our liveness pass (they make records suspects) and
// has the recorder check its suspects, so that afterwards every record may be read. Never raises.
void capture_settle_records(void);
// Before a snapshot: capture_settle_records, then (windowed) a sync point. Never raises, runs no Ruby
// code and checks no interrupts.
void capture_prepare_snapshot(void);
// Asks Ruby what it tells only through a method call (GC.stress on 3.3+, windows.h). Interrupts run
// inside it (other threads, trap handlers, postponed jobs: any may stop or restart capture), so an API
// entry calls it first, before it reads whether capture runs. Outside the GC. Raises what a trap handler
// raised inside it.
void capture_poll_ruby(void);

// What every weight is multiplied by in a profile (a ratio estimate): the share of time the schedule
// meant the hook to be on for, over the share of allocations it really was on for (both counted exactly).
// They differ because the ticker wakes late (a window shorter than its delay is never requested: the
// requested share, measured, is below the share), GC pauses hold windows without allocations, and
// hook-on code runs slower than virtual time charges for. Windows are still placed independently of
// the program, so every allocation had the same probability of being in one, which the ratio measures.
// 1 when always sampling, and before any window. Bounded to [0.5, 5]. Never raises.
double capture_weight_scale(void);
// The same ratio before the bounds: where it is beyond them, estimates are biased (too low above 3).
double capture_weight_scale_wanted(void);

// How the next snapshot turns samples into estimates: the weight scale and, windowed, the window still
// open (recorder.h). Never raises.
void capture_estimate(recorder_estimate *e);

// heapscope's own threads: allocations made while one of these is current are never sampled. The table
// holds MAX 32 threads (marked and pinned by capture); exclude returns false when it is full.
bool capture_exclude_thread(VALUE thread);
void capture_include_thread(VALUE thread);

// Once, from Init: creates the object through which the GC marks and compacts capture's state, and the
// process's label-set table.
void capture_init(void);

// Labels (labels.h). The table of label sets outlives Heapscope.stop/start: the ids it hands out sit in
// fiber-locals. NULL only when memory was short at load (then no sample is labelled). A sample gets the
// set whose id the allocating fiber holds in its fiber-local CAPTURE_LABELS_LOCAL (an Integer: Thread#[]
// is fiber-local), read in the hook without calling Ruby; an id the table does not know counts as none.
#define CAPTURE_LABELS_LOCAL "__heapscope_labels"
labelsets *capture_labels(void);

// Starts sampling with config. Returns false when memory is short (nothing started then).
bool capture_start(const capture_config *config);
// Stops sampling and frees the recorder (every tracked object is forgotten). No-op when stopped.
void capture_stop(void);
bool capture_running(void);
const capture_config *capture_current_config(void);

// The running recorder and code names, or NULL when stopped.
recorder *capture_recorder(void);
names *capture_names(void);
void capture_get_stats(capture_stats *stats);
// The share of allocations the allocation hook was on for, from stats (1 when not windowed).
double capture_hook_on_share(const capture_stats *stats);
// Bytes held by capture itself (frame buffers and code names), excluding the recorder.
size_t capture_memory(void);

#endif
