#include "snapshot.h"

#include <stdlib.h>
#include <string.h>

void snapshot_free(hs_snapshot *snapshot) {
  if (snapshot == NULL) return;
  free(snapshot->samples);
  free(snapshot->frame_ids);
  free(snapshot->frames);
  strtab_free(snapshot->strings);
  free(snapshot->comments);
  free(snapshot);
}

// Grows *array (of element size elem) to hold at least need elements; false when memory is short.
static bool ensure(void **array, size_t *capacity, size_t need, size_t elem) {
  if (need <= *capacity) return true;
  size_t capacity_new = *capacity ? *capacity : 64;
  while (capacity_new < need) capacity_new *= 2;
  void *grown = realloc(*array, capacity_new * elem);
  if (grown == NULL) return false;
  *array = grown;
  *capacity = capacity_new;
  return true;
}

bool snapshot_add_sample(hs_snapshot *snapshot, const uint32_t *frame_ids, uint32_t n, uint32_t class_id,
                         int32_t gc_age, const int64_t values[HS_VALUE_COUNT]) {
  if (!ensure((void **)&snapshot->samples, &snapshot->sample_capacity, snapshot->sample_count + 1, sizeof(hs_sample)) ||
      !ensure((void **)&snapshot->frame_ids, &snapshot->frame_id_capacity, snapshot->frame_id_count + n, sizeof(uint32_t))) {
    return false;
  }
  hs_sample *sample = &snapshot->samples[snapshot->sample_count++];
  sample->frames_offset = (uint32_t)snapshot->frame_id_count;
  sample->frames_len = n;
  sample->class_id = class_id;
  sample->gc_age = gc_age;
  memcpy(sample->values, values, sizeof(sample->values));
  memcpy(snapshot->frame_ids + snapshot->frame_id_count, frame_ids, sizeof(uint32_t) * n);
  snapshot->frame_id_count += n;
  return true;
}
