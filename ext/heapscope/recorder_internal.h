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

typedef struct {
  alloc_key key;
  int64_t objects, bytes; // weighted
  group_sums groups;      // windowed: objects by variance group (variance.h)
  double bernoulli;       // always-on: the objects' Bernoulli variance
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
  // since the allocation counters were last reset (for them).
  group_design design, alloc_design;

  recorder_stats stats;
};

// The recorder's own allocations: malloc, calloc and realloc, which fault injection
// (recorder_testing_fail_allocations) can make fail.
void *recorder_malloc(size_t n);
void *recorder_calloc(size_t count, size_t n);
void *recorder_realloc(void *p, size_t n);
// Whether a record still points at an object (liveness makes it always true outside a bug).
bool recorder_record_is_valid(VALUE obj);
// (Re)measures a record's object unless it was seen frozen; the first measurement is its allocation size.
void recorder_measure_record(recorder *r, record *rec);

#endif
