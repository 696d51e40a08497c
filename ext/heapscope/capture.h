// capture: the allocation hook, from an allocation to a record, and when the hooks are on.
//
//   allocation --NEWOBJ hook--> countdown hits 0? --no--> return (a decrement and a branch)
//                                   | yes: a sample, or (windowed) the window's end: the hook removes itself
//                                   v
//     rb_profile_frames into a preallocated buffer -> code ids (names.h) -> frame and stack ids
//     (stacktab) -> class name id -> recorder_track. No Ruby allocation, no raise, no object id.
//
// Sampling modes: always (both hooks registered from start to stop) or windowed (window.h): the holder
// object's dmark, run inside every GC's marking, registers the GC_END_MARK hook for that GC and ends a
// stride; the next stride may get a window (the NEWOBJ hook with a delay and a length). Between windows
// no hook is registered at all. Registering mallocs, which inside a GC needs care (capture.c).
//
// Everything happens in the allocating thread or the GC. (A postponed job would have been the natural
// place for the rest, but it runs only at the next interrupt check, which a long C call never reaches.)
// Names that need Ruby allocation are read when a profile is built. The GC_END_MARK hook keeps the
// records pointing only at live objects; the holder's dcompact follows objects moved by compaction. One
// capture per process (the VM has one heap); all state is static.
//
// NOTE: every function runs with the GVL held and none raises; capture_start reports failure by
//       returning false (memory short).
#ifndef HEAPSCOPE_CAPTURE_H
#define HEAPSCOPE_CAPTURE_H

#include <ruby.h>
#include <stdbool.h>
#include <stdint.h>

#include "names.h"
#include "recorder.h"

typedef struct {
  uint32_t sample_every;
  uint32_t max_frames;
  uint32_t min_age; // kept for the profile's comments; snapshots take it as an argument
  double max_overhead; // the adaptive budget (budget.h); <= 0: always sample_every
  bool windowed;       // windowed sampling (window.h); else the hook is on for every allocation
  double window_share; // windowed: the most allocations the hook may be on for, e.g. 0.02
  recorder_config recorder;
} capture_config;

typedef struct {
  uint64_t samples_taken;     // allocations the sampler picked
  uint64_t skipped_internal;  // picked, but VM-internal (T_IMEMO and the like): not a Ruby object
  uint64_t dropped_no_memory; // picked, but interning its frames or class ran out of memory
  uint64_t frames_truncated;  // samples whose stack was deeper than max_frames
  uint64_t gc_end_marks;      // GCs observed
  uint64_t gc_end_marks_missed; // GCs that ran without our GC_END_MARK hook (see capture.c): counts may be off
  uint64_t gc_registrations_deferred; // windowed: GCs inside which no hook could be registered
  uint64_t windows_opened, windows_skipped; // windowed: windows opened; GCs without one (hook-on share cap)
  uint64_t vm_allocations;    // allocations the VM made since start
  uint64_t hook_allocations;  // of which the allocation hook was on for (all of them when not windowed)
  uint32_t window_every;      // the sampling rate inside the current window (the rate when not windowed)
  uint32_t current_every;     // the sampling rate in force (the budget may have lowered it)
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
// Checks the recorder's invariants (after a snapshot) and fails capture if one broke.
void capture_check_invariants(void);

// Windowed sampling needs to register hooks inside the GC, which this Ruby may not allow (capture.c).
bool capture_windowed_supported(void);
// GC.stress was switched (lib/heapscope.rb watches it on Ruby 3.1, see capture.c). Outside the GC.
void capture_gc_stress_changed(bool on);
// Outside the GC: counts the GCs that ran without our liveness pass (they make records suspects) and
// has the recorder check its suspects, so that afterwards every record may be read. Never raises.
void capture_settle_records(void);
// Before a snapshot: capture_settle_records, then, in windowed mode, tells the recorder what the current
// window's samples stand for so far. Never raises.
void capture_prepare_snapshot(void);

// Once, from Init: creates the object through which the GC marks and compacts capture's state.
void capture_init(void);

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
// Bytes held by capture itself (frame buffers and code names), excluding the recorder.
size_t capture_memory(void);

#endif
