// recorder_internal.h: what recorder.c (records, counters, liveness) and recorder_snapshot.c (turning
// them into a snapshot) share. Not a contract for anyone else: only those two include it.
#ifndef HEAPSCOPE_RECORDER_INTERNAL_H
#define HEAPSCOPE_RECORDER_INTERNAL_H

#include <stdlib.h>

#include "idindex.h"
#include "recorder.h"
#include "variance.h"

enum {
  RECORD_UNMEASURED = 1,      // allocated, not yet measured (it was not initialised in the hook)
  RECORD_FROZEN_MEASURED = 2, // seen frozen: its size can no longer change
  RECORD_SUSPECT = 8,         // a GC we did not see may have freed its slot, even its page: never read it
                              // until recorder_check_suspects has found the slot on a live page
  RECORD_EXACT = 16,          // recorded whole (recorder_track_exact): weight 1, no variance, not scaled
};

typedef struct {
  VALUE obj;         // weak: never marked; dropped at GC_END_MARK when unmarked, moved by compaction
  uint64_t size;     // bytes, as last measured
  uint32_t stack_id; // one reference to the stack is held by the record
  uint32_t class_id;
  uint32_t alloc_gc; // rb_gc_count() when allocated (mod 2^32)
  uint32_t weight;   // allocations this sample stands for
  uint32_t flags;
  uint32_t window;   // the sampling window it was taken in: records of one window are one cluster
  uint32_t labels;   // the label set in force where it was allocated (labels.h; 0: none)
} record;
_Static_assert(sizeof(record) <= 48, "the design budget is 48 bytes per tracked object");

typedef struct {
  uint32_t stack_id; // the counter holds one reference to the stack
  uint32_t class_id;
  uint32_t labels;
  uint32_t exact; // 1: counts exact records only (recorder_track_exact), kept apart from the sampled
} alloc_key;

// A counter's samples of the stretches closed before the last one are kept scaled (each by its stretch's
// scale: recorder_close_stretch), those of the last closed stretch and of the open one as drawn; a
// snapshot scales those by the scales it is given. Exact counters are never scaled.
typedef struct {
  alloc_key key;
  double objects, bytes;            // stretches before the last closed one: weighted and scaled
  group_sums groups;                // windowed: those objects by variance group (variance.h)
  int64_t last_objects, last_bytes; // the last closed stretch: weighted
  group_sums last_groups;
  int64_t open_objects, open_bytes; // the open stretch: weighted
  group_sums open_groups;
  double bernoulli;                 // always-on: the objects' Bernoulli variance (no stretches)
} alloc_counter;

struct recorder {
  recorder_config config;
  strtab *strings;
  stacktab *stacks;

  record *records;
  size_t record_count, record_capacity;

  alloc_counter *allocs; // allocs[id - 1]
  uint32_t alloc_count, alloc_capacity;
  idindex alloc_index;

  size_t suspect_count;       // records flagged RECORD_SUSPECT

  // Windowed: the closed windows' allocations by variance group, since start (for live objects) and
  // since the allocation counters were last reset (for them): those of closed stretches scaled, as the
  // samples are, those of the open stretch as seen.
  group_design design, alloc_design;
  group_design last_design, last_alloc_design;
  group_design open_design, open_alloc_design;
  // Windowed: the closed stretches, oldest first: the last window of each and its scale.
  uint32_t stretch_count;
  uint32_t stretch_last_window[RECORDER_MAX_STRETCHES];
  float stretch_scale[RECORDER_MAX_STRETCHES];

  recorder_stats stats;
};

// The recorder's own allocations: malloc, calloc and realloc, which fault injection
// (recorder_testing_fail_allocations) can make fail.
void *recorder_malloc(size_t n);
void *recorder_calloc(size_t count, size_t n);
void *recorder_realloc(void *p, size_t n);
// Whether a record still points at an object (liveness makes it always true outside a bug).
bool recorder_record_is_valid(VALUE obj);
// The scale of a sample taken in window: its stretch's from the table when it closed before the last one,
// else last_scale (the last closed stretch; < 0: the table's) or open_scale (the open stretch).
double recorder_window_scale(const recorder *r, uint32_t window, double last_scale, double open_scale);
// (Re)measures a record's object unless it was seen frozen; the first measurement is its allocation size.
void recorder_measure_record(recorder *r, record *rec);

#endif
