#include "snapshot.h"

#include <stdlib.h>
#include <string.h>

hs_snapshot *snapshot_new(void) {
  hs_snapshot *s = calloc(1, sizeof(hs_snapshot));
  if (s == NULL) return NULL;
  if (!idindex_init(&s->location_index, 1024)) {
    free(s);
    return NULL;
  }
  return s;
}

void snapshot_free(hs_snapshot *snapshot) {
  if (snapshot == NULL) return;
  free(snapshot->samples);
  free(snapshot->location_ids);
  free(snapshot->label_ids);
  free(snapshot->locations);
  idindex_free(&snapshot->location_index);
  strtab_free(snapshot->strings);
  free(snapshot->comments);
  free(snapshot->group_totals);
  free(snapshot);
}

// Grows *array (of element size elem) to hold at least need elements; false when memory is short.
static bool ensure(void **array, size_t *capacity, size_t need, size_t elem) {
  if (need <= *capacity) return true;
  size_t grown_capacity = *capacity ? *capacity : 64;
  while (grown_capacity < need) grown_capacity *= 2;
  void *grown = realloc(*array, grown_capacity * elem);
  if (grown == NULL) return false;
  *array = grown;
  *capacity = grown_capacity;
  return true;
}

static bool location_equals(const void *ctx, uint32_t id, const void *key) {
  const hs_snapshot *s = ctx;
  return memcmp(&s->locations[id - 1], key, sizeof(hs_location)) == 0;
}

uint32_t snapshot_location_id(hs_snapshot *s, hs_location location) {
  uint32_t hash = idindex_hash_bytes(&location, sizeof location);
  uint32_t id = idindex_find(&s->location_index, hash, location_equals, s, &location);
  if (id != IDINDEX_NONE) return id;
  size_t capacity = s->location_capacity;
  if (!ensure((void **)&s->locations, &capacity, (size_t)s->location_count + 1, sizeof(hs_location))) return 0;
  s->location_capacity = (uint32_t)capacity;
  id = s->location_count + 1;
  if (!idindex_insert(&s->location_index, hash, id)) return 0;
  s->locations[id - 1] = location;
  s->location_count++;
  return id;
}

uint32_t snapshot_add_stack(hs_snapshot *s, const uint32_t *location_ids, uint32_t n) {
  if (!ensure((void **)&s->location_ids, &s->location_id_capacity, s->location_id_count + n, sizeof(uint32_t))) {
    return UINT32_MAX;
  }
  uint32_t offset = (uint32_t)s->location_id_count;
  // An empty stack may come first, while location_ids is still NULL: no pointer arithmetic on it then.
  if (n > 0) memcpy(s->location_ids + offset, location_ids, sizeof(uint32_t) * n);
  s->location_id_count += n;
  return offset;
}

uint32_t snapshot_add_labels(hs_snapshot *s, const uint32_t *string_ids, uint32_t n) {
  if (!ensure((void **)&s->label_ids, &s->label_id_capacity, s->label_id_count + n, sizeof(uint32_t))) return UINT32_MAX;
  uint32_t offset = (uint32_t)s->label_id_count;
  if (n > 0) memcpy(s->label_ids + offset, string_ids, sizeof(uint32_t) * n);
  s->label_id_count += n;
  return offset;
}

void snapshot_label_last_sample(hs_snapshot *s, uint32_t offset, uint32_t n) {
  if (s->sample_count == 0) return;
  s->samples[s->sample_count - 1].labels_offset = offset;
  s->samples[s->sample_count - 1].labels_len = n;
}

bool snapshot_add_sample(hs_snapshot *s, uint32_t offset, uint32_t n, uint32_t class_id, int32_t gc_age,
                         const int64_t values[HS_VALUE_COUNT], const int64_t variances[HS_VALUE_COUNT],
                         const hs_group_totals *groups, int32_t group_types) {
  if (!ensure((void **)&s->samples, &s->sample_capacity, s->sample_count + 1, sizeof(hs_sample))) return false;
  uint32_t groups_id = 0;
  if (groups != NULL) {
    if (!ensure((void **)&s->group_totals, &s->group_total_capacity, s->group_total_count + 1, sizeof(hs_group_totals))) return false;
    memcpy(s->group_totals[s->group_total_count++], groups, sizeof(hs_group_totals));
    groups_id = (uint32_t)s->group_total_count;
  }
  hs_sample *sample = &s->samples[s->sample_count++];
  sample->groups = groups_id;
  sample->group_types = group_types;
  sample->locations_offset = offset;
  sample->locations_len = n;
  sample->class_id = class_id;
  sample->gc_age = gc_age;
  sample->labels_offset = sample->labels_len = 0;
  memcpy(sample->values, values, sizeof(sample->values));
  if (variances != NULL) memcpy(sample->variances, variances, sizeof(sample->variances));
  else memset(sample->variances, 0, sizeof(sample->variances));
  return true;
}
