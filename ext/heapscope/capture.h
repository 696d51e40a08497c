// capture: the allocation hook and everything between an allocation and the recorder.
//
//   allocation --NEWOBJ hook--> countdown hits 0? --no--> return (a decrement and a branch)
//                                   | yes: rb_profile_frames into a preallocated ring slot, the GC
//                                   v      count and the weight; no Ruby allocation, no raise
//                       postponed job (next safe point) --> names: frame ids, class id --> recorder
//
// A GC_END_MARK hook keeps the recorder's records (and samples still in the ring) pointing only at
// live objects; the holder object's dcompact follows objects moved by compaction. One capture per
// process (the VM has one heap); all state is static.
//
// NOTE: every function runs with the GVL held and none raises; capture_start reports failure by
//       returning false (memory short).
// NOTE: heapscope's own allocations while committing samples are not sampled.
#ifndef HEAPSCOPE_CAPTURE_H
#define HEAPSCOPE_CAPTURE_H

#include <ruby.h>
#include <stdbool.h>
#include <stdint.h>

#include "recorder.h"

typedef struct {
  uint32_t sample_every;
  uint32_t max_frames;
  uint32_t min_age; // kept for the profile's comments; snapshots take it as an argument
  recorder_config recorder;
} capture_config;

typedef struct {
  uint64_t samples_taken;        // allocations the sampler picked
  uint64_t dropped_pending_full; // picked, but the ring was full (the commit job had not run yet)
  uint64_t died_before_commit;   // picked, but the object died before its sample was committed
  uint64_t skipped_internal;     // picked, but VM-internal (T_IMEMO and the like): not a Ruby object
  uint64_t dropped_no_memory;    // picked, but naming its frames or class ran out of memory
  uint64_t frames_truncated;     // samples whose stack was deeper than max_frames
  uint64_t gc_end_marks;         // GCs observed
  uint64_t commit_nanos;         // time spent committing samples (names, interning, recording)
} capture_stats;

// Once, from Init: creates the object through which the GC marks and compacts capture's state.
void capture_init(void);

// Starts sampling with config. Returns false when memory is short (nothing started then).
bool capture_start(const capture_config *config);
// Stops sampling and frees the recorder (every tracked object is forgotten). No-op when stopped.
void capture_stop(void);
bool capture_running(void);
const capture_config *capture_current_config(void);

// Commits samples still waiting in the ring, so a snapshot sees every allocation made so far.
void capture_flush(void);
// The running recorder, or NULL when stopped.
recorder *capture_recorder(void);
void capture_get_stats(capture_stats *stats);
// Bytes held by capture itself (ring and name cache), excluding the recorder.
size_t capture_memory(void);

// ---- Test-only entry points (Heapscope::Testing) ----
uint32_t capture_pending_capacity(void);

#endif
