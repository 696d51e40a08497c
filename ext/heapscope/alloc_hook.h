// alloc_hook: the NEWOBJ hook. It counts down, and where the countdown reaches 0 it captures the
// allocation and hands it to the recorder:
//
//   allocation --NEWOBJ hook--> --countdown != 0? --yes--> return (a decrement and a branch)
//                                   | 0: a sample (weight and cluster from the plan)
//                                   v
//     rb_profile_frames into a preallocated buffer -> code ids (names.h) -> frame and stack ids
//     (stacktab) -> class name id -> label set -> recorder_track. No Ruby allocation, no raise, no
//     object id, no Ruby code run.
//
// It decides nothing about when it is on or what a sample weighs: the countdown and the weights are
// the sampling plan's (sampling_plan.h), whose one instance lives here so that the hook reads it without
// an indirection; windows.c registers and removes the tracepoint; capture.c owns the recorder and names.
//
// NOTE: every function runs with the GVL held, in the main Ractor, and none raises. alloc_hook_start
//       mallocs (false when memory is short); the hook itself mallocs only through the tables it interns
//       into, and drops the sample when they cannot grow.
#ifndef HEAPSCOPE_ALLOC_HOOK_H
#define HEAPSCOPE_ALLOC_HOOK_H

#include <ruby.h>
#include <stdbool.h>
#include <stdint.h>

#include "labels.h"
#include "names.h"
#include "recorder.h"
#include "sampling_plan.h"

typedef struct {
  uint64_t samples_taken;     // allocations the countdown picked
  uint64_t skipped_internal;  // picked, but VM-internal (T_IMEMO and the like): not a Ruby object
  uint64_t skipped_own;       // picked, but allocated by one of heapscope's own threads
  uint64_t skipped_exact;     // picked, but a Thread or Fiber: recorded exactly instead (alloc_hook_track_exact)
  uint64_t exact_tracked;     // Threads and Fibers recorded exactly
  uint64_t dropped_no_memory; // picked, but interning its frames or class ran out of memory
  uint64_t frames_truncated;  // samples whose stack was deeper than max_frames
} alloc_hook_stats;

// Once, from Init: the tracepoint (not enabled), the label table. A sample's label set is the id in the
// allocating fiber's local labels_local (capture.h says whose).
void alloc_hook_init(const char *labels_local);
// The NEWOBJ tracepoint, for windows.c to enable and disable: the focused one while a stratum of the run
// has a class (it reads each new object's class), else the plain one (a decrement and a branch). It
// changes when the first class is focused or the last one let go: the caller hands the new one to
// windows_set_newobj_hook.
VALUE alloc_hook_tracepoint(void);
// The process's one sampling plan.
sampling_plan *alloc_hook_plan(void);

// Allocates the frame buffers for a run that records into r with names n (both the caller's) and clears
// the statistics. exact_threads: Threads and Fibers are never sampled, alloc_hook_track_exact records
// those made from Ruby. focus: the focused classes, stratum k's class at focus[k] (distinct, at most
// PLAN_MAX_STRATA; kept pinned until alloc_hook_stop), 0 for one not defined yet (alloc_hook_focus_class
// fills it in later). False when memory is short (nothing kept then).
bool alloc_hook_start(recorder *r, names *n, uint32_t max_frames, bool label_threads, bool exact_threads, const VALUE *focus,
                      uint32_t focus_count);
// Exact tracking (Heapscope's wrapper of Thread.new, .start, .fork and Fiber.new calls it with the new
// object, outside any hook): when the run has exact_threads and obj is a Thread or a Fiber, records it
// with weight 1 and no variance (recorder_track_exact) at the current stack less its skip innermost
// frames (the wrapper's own), with the label set in force. Nothing for heapscope's own threads or after
// the fail-safe. Never raises, allocates no Ruby object.
void alloc_hook_track_exact(VALUE obj, int skip);
// Whether objects of obj's class are recorded whole in this run (exact_threads and a Thread or Fiber, or
// of a subclass): the census marks their classes exact (census_whole_fn). Allocates nothing.
bool alloc_hook_records_whole(VALUE obj);
// A focused class defined after the run started (its stratum's class was 0): from now on its
// allocations count down the stratum's countdown. False (nothing changed) when the stratum has a class
// already, or klass is focused as another stratum.
bool alloc_hook_focus_class(uint32_t stratum, VALUE klass);
// The stratum's class is no longer focused (its allocations go back to the common countdown); the
// stratum can take another class with alloc_hook_focus_class.
void alloc_hook_unfocus(uint32_t stratum);
// Frees the buffers. The caller has removed the tracepoint first.
void alloc_hook_stop(void);
// Bytes held by the buffers.
size_t alloc_hook_memory(void);
void alloc_hook_get_stats(alloc_hook_stats *stats);

// From the capture's holder, inside the GC's marking: the tracepoint and the excluded threads (pinned:
// the hook compares thread VALUEs).
void alloc_hook_mark(void);

// heapscope's own threads: allocations made while one of these is current are never sampled (at most
// 32; exclude returns false when full).
bool alloc_hook_exclude_thread(VALUE thread);
void alloc_hook_include_thread(VALUE thread);

// The process's label sets (capture.h: CAPTURE_LABELS_LOCAL), or NULL when memory was short at load.
labelsets *alloc_hook_labels(void);

#endif
