// snapshot: a self-contained copy of what one profile shows, made under the GVL by the recorder and
// encoded without it by pprof.c. Nothing in it points into live recorder state, so the application may
// allocate (and the recorder change) while it is being encoded.
//
// Pure C, no Ruby. Locations are resolved frames ({function, file, line}), deduplicated, numbered
// 1..N in first-use order; samples list location ids leaf first.
#ifndef HEAPSCOPE_SNAPSHOT_H
#define HEAPSCOPE_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "idindex.h"
#include "strtab.h"
#include "variance.h"

// Values per sample, in profile order: alloc_objects, alloc_space, inuse_objects, inuse_space.
enum { HS_ALLOC_OBJECTS, HS_ALLOC_SPACE, HS_INUSE_OBJECTS, HS_INUSE_SPACE, HS_VALUE_COUNT };

#define HS_NO_AGE (-1)

typedef struct {
  uint32_t function_id; // ids in the snapshot's strings
  uint32_t file_id;
  int32_t line;
} hs_location;
_Static_assert(sizeof(hs_location) == 12, "hs_location is hashed as bytes: no padding");

typedef struct {
  uint32_t locations_offset; // into hs_snapshot.location_ids; locations_len ids, leaf first
  uint32_t locations_len;
  uint32_t class_id;         // string id of the class name; 0 = no class label
  int32_t gc_age;            // lower bound of the gc_age bucket; HS_NO_AGE = no gc_age label
  int64_t values[HS_VALUE_COUNT];
  int64_t variances[HS_VALUE_COUNT]; // the estimated sampling variance of each value (0: exact or unknown)
  // Windowed sampling: 1 + the index of this sample's totals by variance group in
  // hs_snapshot.group_totals (0: none); they belong to values group_types and group_types + 1.
  uint32_t groups;
  int32_t group_types;
  // Its labels (labels.h): labels_len string ids from hs_snapshot.label_ids at labels_offset, key and
  // value alternating (0: none).
  uint32_t labels_offset, labels_len;
} hs_sample;

// A sample's two values (objects, then bytes) by variance group (variance.h), scaled like the values.
typedef float hs_group_totals[2][VARIANCE_GROUPS];

typedef struct {
  hs_sample *samples;
  size_t sample_count, sample_capacity;
  uint32_t *location_ids;
  size_t location_id_count, location_id_capacity;
  uint32_t *label_ids;    // samples' labels: string ids, key then value, shared by samples of one set
  size_t label_id_count, label_id_capacity;
  hs_location *locations; // locations[id - 1]
  uint32_t location_count, location_capacity;
  idindex location_index;
  strtab *strings;  // a copy of the recorder's strings, owned
  bool allocs;      // an allocations profile: default_sample_type is alloc_space
  int64_t period;   // sample_every
  int64_t time_nanos, duration_nanos;
  uint32_t gc_count; // rb_gc_count() when the live records were grouped: their gc_age labels count from it
  char *comments;   // NUL-terminated lines separated by '\n' (may be NULL), owned
  hs_group_totals *group_totals; // the samples' totals by variance group, owned
  size_t group_total_count, group_total_capacity;
  bool has_groups;               // windowed: the designs below are the samples' groups'
  group_design design;           // inuse_* samples': every window since start
  group_design alloc_design;     // alloc_* samples': the windows since the counters were reset
} hs_snapshot;

// A new, empty snapshot, or NULL when memory is short.
hs_snapshot *snapshot_new(void);
// Frees everything the snapshot owns (the struct itself too). NULL is a no-op.
void snapshot_free(hs_snapshot *snapshot);

// The id of location (1..N), added if new; 0 when memory is short.
uint32_t snapshot_location_id(hs_snapshot *snapshot, hs_location location);

// Appends a copy of location_ids[0..n) and returns its offset, for samples to share. Returns
// UINT32_MAX when memory is short.
uint32_t snapshot_add_stack(hs_snapshot *snapshot, const uint32_t *location_ids, uint32_t n);

// Appends a copy of string_ids[0..n) (key, value, key, value, ...) and returns its offset, for samples
// to share with snapshot_label_last_sample. UINT32_MAX when memory is short.
uint32_t snapshot_add_labels(hs_snapshot *snapshot, const uint32_t *string_ids, uint32_t n);
// Gives the last sample added the labels at offset (from snapshot_add_labels), n string ids long.
void snapshot_label_last_sample(hs_snapshot *snapshot, uint32_t offset, uint32_t n);

// Appends a sample over the stack at offset (from snapshot_add_stack), with its values' variances
// (NULL: all 0) and, windowed, the totals by variance group of values group_types and group_types + 1
// (groups NULL: none). False when memory is short.
bool snapshot_add_sample(hs_snapshot *snapshot, uint32_t offset, uint32_t n, uint32_t class_id, int32_t gc_age,
                         const int64_t values[HS_VALUE_COUNT], const int64_t variances[HS_VALUE_COUNT],
                         const hs_group_totals *groups, int32_t group_types) __attribute__((warn_unused_result));

#endif
