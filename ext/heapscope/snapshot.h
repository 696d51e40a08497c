// snapshot: a self-contained copy of what one profile shows, made under the GVL by the recorder and
// encoded without it by pprof.c. Nothing in it points into live recorder state, so the application may
// allocate (and the recorder change) while it is being encoded.
#ifndef HEAPSCOPE_SNAPSHOT_H
#define HEAPSCOPE_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "stacktab.h"
#include "strtab.h"

// Values per sample, in profile order: alloc_objects, alloc_space, inuse_objects, inuse_space.
enum { HS_ALLOC_OBJECTS, HS_ALLOC_SPACE, HS_INUSE_OBJECTS, HS_INUSE_SPACE, HS_VALUE_COUNT };

#define HS_NO_AGE (-1)

typedef struct {
  uint32_t frames_offset; // into hs_snapshot.frame_ids; frames_len ids, leaf first
  uint32_t frames_len;
  uint32_t class_id;      // strtab id of the class name; 0 = no class label
  int32_t gc_age;         // lower bound of the gc_age bucket; HS_NO_AGE = no gc_age label
  int64_t values[HS_VALUE_COUNT];
} hs_sample;

typedef struct {
  hs_sample *samples;
  size_t sample_count, sample_capacity;
  uint32_t *frame_ids;
  size_t frame_id_count, frame_id_capacity;
  hs_frame *frames; // copy of the frame table, indexed by frame id
  uint32_t frame_count;
  strtab *strings;  // copy of the string table
  bool allocs;      // an allocations profile: default_sample_type is alloc_space
  int64_t period;   // sample_every
  int64_t time_nanos, duration_nanos;
  char *comments;   // NUL-terminated lines separated by '\n' (may be NULL)
} hs_snapshot;

// Frees everything the snapshot owns (the struct itself too). NULL is a no-op.
void snapshot_free(hs_snapshot *snapshot);

// Appends a sample with a copy of frame_ids[0..n). Returns false when memory is short.
bool snapshot_add_sample(hs_snapshot *snapshot, const uint32_t *frame_ids, uint32_t n, uint32_t class_id,
                         int32_t gc_age, const int64_t values[HS_VALUE_COUNT]) __attribute__((warn_unused_result));

#endif
