// recorder: the heap recorder. One record per sampled object that is still alive, pointing at the
// object's interned stack and class; per-(stack, class) allocation counters; snapshots.
//
// Liveness (the design's decision 1): records hold their objects weakly (never marked). At the end of
// every GC's marking phase, before anything is swept, recorder_on_gc_end_mark drops each record whose
// object the GC did not mark: that slot is about to be freed and may be reused. Objects moved by
// compaction are followed in recorder_on_compact. So, outside a GC, every record's VALUE is a live
// object of the heap and may be dereferenced (memsize_of, frozen check). No object ids, no WeakMap.
// Mark bits are read through liveness.h, which knows what each Ruby exports.
//
// A GC that ran without our pass (Ruby runs no hook inside another tool's hook, so a GC started there
// has none; Ruby 3.1 windows can defer one) may have swept records' objects and freed whole pages.
// capture then calls recorder_distrust: those records become suspects, never read (not in the GC pass,
// not by compaction) until recorder_check_suspects, outside the GC, finds each one's slot on a live
// heap page holding an object. A slot freed and reused meanwhile by another object is then counted as
// the old record: wrong by one sample, never a crash.
//
// NOTE: every function runs with the GVL held. recorder_track runs inside the allocation hook and
//       recorder_on_gc_end_mark and recorder_on_compact inside the GC: they never allocate Ruby objects,
//       never raise, never call Ruby code (they may malloc and free).
// NOTE: no function raises; failures are counted in stats (nothing is dropped silently).
// NOTE: ownership: the recorder owns its string and stack tables; capture interns into them.
#ifndef HEAPSCOPE_RECORDER_H
#define HEAPSCOPE_RECORDER_H

#include <ruby.h>
#include <stdbool.h>
#include <stdint.h>

#include "labels.h"
#include "names.h"
#include "snapshot.h"
#include "stacktab.h"
#include "strtab.h"

typedef struct recorder recorder;

// At most this many closed stretches per run (recorder_close_stretch).
#define RECORDER_MAX_STRETCHES 1024

typedef struct {
  uint32_t max_tracked_objects; // records past this are refused (counted in dropped_tracked_cap)
  uint32_t max_stacks;          // distinct live stacks past this are refused (dropped_stack_cap)
  bool track_sizes;             // measure objects with memsize_of (else every object is slot_size)
  uint32_t slot_size;           // the size assumed when sizes are not tracked
  bool windowed;                // samples come in windows closed by recorder_close_window (variance.h)
} recorder_config;

typedef struct {
  uint64_t tracked_objects;     // records now
  uint64_t alloc_sites;         // (stack, class) allocation counters now
  uint64_t dead_removed;        // records dropped because their object died
  uint64_t dropped_tracked_cap; // samples not tracked: max_tracked_objects reached
  uint64_t dropped_stack_cap;   // samples dropped: max_stacks reached
  uint64_t dropped_no_memory;   // samples dropped: malloc failed
  uint64_t frozen_measured;     // records whose object was seen frozen (measured once, not again)
  uint64_t invalid_records;     // records found pointing at no object at all (a bug; dropped)
  uint64_t stale_records;       // records dropped after a GC our hook missed: slot or page freed
  uint64_t suspect_records;     // records now waiting for recorder_check_suspects
  uint64_t memory_bytes;        // bytes the recorder holds (records, counters, stacks, strings)
  uint64_t record_bytes;        // bytes per record (sizeof)
  uint64_t stack_table_bytes;   // bytes of the frame and stack tables (what unique stacks cost)
  uint64_t live_stacks, frames, strings;
} recorder_stats;

// A new recorder, or NULL when memory is short.
recorder *recorder_new(const recorder_config *config);
// Frees the recorder and everything it owns. NULL is a no-op.
void recorder_free(recorder *r);

strtab *recorder_strings(recorder *r);
stacktab *recorder_stacks(recorder *r);

// Starts tracking obj, allocated at the stack frame_ids[0..n) (leaf first), of class class_id (a
// string id), when rb_gc_count() was alloc_gc; it stands for weight (>= 1) allocations and was taken in
// sampling window number `window` (samples of one window are one cluster for the variance; a new number
// per sample when each is drawn on its own; numbers only ever grow), with the label set `labels` in force
// (labels.h; 0: none; records and counters of different sets are kept apart). Called from the
// allocation hook: never allocates Ruby objects, never raises (failures are counted). The object is
// not initialised yet, so it is measured later: at the end of the next GC's marking (its
// "allocation size", counted in alloc_space) or at the next snapshot, whichever comes first.
void recorder_track(recorder *r, VALUE obj, const uint32_t *frame_ids, uint32_t n, uint32_t class_id,
                    uint32_t alloc_gc, uint32_t weight, uint32_t window, uint32_t labels);

// Starts tracking obj as recorder_track does, but as itself only (weight 1), known rather than sampled:
// no variance, not multiplied by the weight scale, in allocation counters and snapshot groups of its own
// (so a snapshot may hold a sampled and an exact sample of one stack and class). For the objects the caller
// records whole (Threads and Fibers made from Ruby, alloc_hook.h) and never samples. Outside any hook;
// never allocates Ruby objects, never raises. False when refused (counted, as recorder_track's).
bool recorder_track_exact(recorder *r, VALUE obj, const uint32_t *frame_ids, uint32_t n, uint32_t class_id, uint32_t alloc_gc,
                          uint32_t labels);

// Inside GC, at RUBY_INTERNAL_EVENT_GC_END_MARK: measures records not yet measured (except T_DATA,
// whose dsize functions are extension code not to be run inside the GC) and drops records of objects
// that were not marked.
void recorder_on_gc_end_mark(recorder *r);
// Inside GC, while references are updated after compaction: follows moved objects.
void recorder_on_compact(recorder *r);
// A GC ran without recorder_on_gc_end_mark: every record allocated before GC number before_gc started
// (alloc_gc < before_gc, mod 2^32) becomes a suspect (see above). May run inside the GC; reads no
// object; never allocates.
void recorder_distrust(recorder *r, uint32_t before_gc);
// Outside the GC only: checks each suspect's slot against the heap's live pages and drops those not on
// one or holding no object (stale_records). May finish a GC in progress first (liveness.h). Never
// allocates Ruby objects; when memory is short for the page list, drops every suspect.
void recorder_check_suspects(recorder *r);
// Whether any record is a suspect. Never reads an object.
bool recorder_has_suspects(const recorder *r);

// Builds a snapshot (see snapshot.h): live objects that survived at least min_age GCs, grouped by
// (stack, class, gc_age bucket, label set; the sets' pairs read from labels, which may be NULL), plus the allocation counters, each with the variance of its values
// (the sum over windows of the window's weighted total squared, times 1 - 1/weight: windows are
// clusters, and a weight of 1 is exact); sizes are re-measured first (objects
// seen frozen keep their size). Frames are named through code_names, which the caller resolved just
// before (names_resolve). allocs marks it as an allocations profile. NULL when memory is short.
// How a snapshot turns samples into estimates (variance.h): the weight scales the open stretch's and the
// last closed stretch's samples are multiplied by (every sample's is 1 when always; earlier stretches
// have their own, recorder_close_stretch), and, windowed, the share and the window still open with the
// allocations it has seen so far.
typedef struct {
  double scale;      // the open stretch's samples
  double last_scale; // the last closed stretch's samples; < 0: the scale it closed with
  bool windowed;
  double share;
  bool has_open_window;
  uint32_t open_window;
  double open_allocations;
} recorder_estimate;
hs_snapshot *recorder_snapshot(recorder *r, const names *code_names, const labelsets *labels, bool allocs, uint32_t min_age,
                               const recorder_estimate *e);

// Windowed sampling: window number `window` closed after the hook saw `allocations` allocations in it.
// Its samples' clusters get those allocations (the ratio estimate's variance, variance.h). Reads no
// object; may run inside the GC; never allocates.
void recorder_close_window(recorder *r, uint32_t window, uint64_t allocations);

// Windowed sampling: the stretch of the run that ended with window number last_window closed (no
// window of it is still open) with scale (sampling_plan.h, "Stretches"). Its samples stay apart as the
// last closed stretch's, whose scale each snapshot is given (recorder_estimate: the plan may still pool
// it with the open stretch); the stretch closed before it is folded in for good, each of its samples
// multiplied by its scale. Later windows belong to the open stretch. Reads no object; never allocates; false when RECORDER_MAX_STRETCHES have
// closed (the caller's plan closes no more than that).
bool recorder_close_stretch(recorder *r, uint32_t last_window, double scale);

// Zeroes the allocation counters (and releases the stacks only they kept alive).
void recorder_reset_allocs(recorder *r);

void recorder_get_stats(const recorder *r, recorder_stats *stats);

// Calls fn(obj, stack_id, alloc_gc, data) for every record whose object may be read (not a suspect,
// still an object): outside the GC only, after capture_settle_records. alloc_gc is rb_gc_count() when
// it was allocated (mod 2^32). fn must not allocate Ruby objects (a GC could drop records while they are
// walked) and returns false to stop. Retainers (retainers.c) and previews (previews.c) pick a site's
// sampled objects with it.
void recorder_each_object(const recorder *r, bool (*fn)(VALUE obj, uint32_t stack_id, uint32_t alloc_gc, void *data), void *data);

// The gc_age bucket of an object that survived age GCs: 0, 1, 2, 4, 8, ... (powers of two), so
// samples stay aggregated as objects age.
uint32_t recorder_age_bucket(uint32_t age);

// ---- Test-only (Heapscope::Testing.fail_recorder_allocations) ----

// Fault injection: the recorder's next n allocations of its own (records, counters, snapshot
// scratch) fail as if memory were short; 0 turns it off. Process-wide.
void recorder_testing_fail_allocations(uint32_t n);
// The object of record i (i < tracked_objects), or Qundef if its slot holds no object (a record left
// stale by a GC that ran without our hook). Outside the GC every other record points at a live object:
// tests check that none is one they dropped.
VALUE recorder_testing_object(const recorder *r, size_t i);
// Fault injection: makes the first record point at no object, as a bug would.
void recorder_testing_corrupt_record(recorder *r);

#endif
