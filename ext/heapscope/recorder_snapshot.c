// Snapshots of the recorder: live records grouped by (stack, class, gc_age bucket, label set), the
// allocation counters, their variances, stacks resolved to locations and label sets to strings.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recorder_internal.h"

// The aggregation key of live objects in a snapshot.
typedef struct {
  uint32_t stack_id, class_id, age_bucket, labels;
  uint32_t exact; // 1: exact records (RECORD_EXACT), kept apart: not scaled, no variance
} live_key;

typedef struct {
  live_key key;
  double objects, bytes; // weighted, each sample times its stretch's scale
  // For the variance (variance.h): windowed, objects and bytes by variance group; always-on, their
  // Bernoulli variances.
  hs_group_totals groups;
  double bernoulli_objects, bernoulli_bytes;
} live_group;

typedef struct {
  live_group *groups; // room for one group per record
  uint32_t count;
  idindex index;
} live_groups;

static bool live_key_equals(const void *ctx, uint32_t id, const void *key) {
  const live_groups *g = ctx;
  return memcmp(&g->groups[id - 1].key, key, sizeof(live_key)) == 0;
}

// Measures every record, and sums those old enough for the profile per (stack, class, age bucket),
// each times its stretch's scale (the tail's: last_scale, open_scale). The walk always finishes (it also
// compacts out invalid records), even when memory runs short for the grouping: then it returns false.
static bool group_live_records(recorder *r, uint32_t min_age, uint32_t gc_now, double last_scale, double open_scale,
                               live_groups *groups) {
  bool grouping = true;
  size_t kept = 0;
  for (size_t i = 0; i < r->record_count; i++) {
    record *rec = &r->records[i];
    if (!recorder_record_is_valid(rec->obj)) {
      // A freed slot: its object died in a GC that ran without our hook (see recorder_on_gc_end_mark).
      // Not being an object at all cannot happen: that is a bug, and capture's fail-safe reacts to it.
      if (RB_SPECIAL_CONST_P(rec->obj)) r->stats.invalid_records++;
      else r->stats.stale_records++;
      stacktab_release(r->stacks, rec->stack_id);
      continue;
    }
    r->records[kept++] = *rec;
    rec = &r->records[kept - 1];
    uint32_t age = gc_now - rec->alloc_gc;
    if (age < min_age && !(rec->flags & RECORD_UNMEASURED)) continue;
    recorder_measure_record(r, rec);
    if (age < min_age || !grouping) continue;
    bool exact = (rec->flags & RECORD_EXACT) != 0;
    live_key key = {rec->stack_id, rec->class_id, recorder_age_bucket(age), rec->labels, exact ? 1u : 0u};
    uint32_t hash = idindex_hash_bytes(&key, sizeof key);
    uint32_t id = idindex_find(&groups->index, hash, live_key_equals, groups, &key);
    if (id == IDINDEX_NONE) {
      if (!idindex_insert(&groups->index, hash, groups->count + 1)) {
        grouping = false;
        continue;
      }
      id = ++groups->count;
      groups->groups[id - 1] = (live_group){.key = key};
    }
    live_group *g = &groups->groups[id - 1];
    double scale = exact ? 1.0 : recorder_window_scale(r, rec->window, last_scale, open_scale);
    double weight = scale * (double)rec->weight, bytes = weight * (double)rec->size;
    g->objects += weight;
    g->bytes += bytes;
    if (exact) {
      // Known, not estimated: no variance.
    } else if (r->config.windowed) {
      uint32_t group = variance_group(rec->window);
      g->groups[0][group] += (float)weight;
      g->groups[1][group] += (float)bytes;
    } else {
      // (Always-on: no stretches, the scale is 1.) A scaled sample's variance scales by its square.
      g->bernoulli_objects += scale * scale * bernoulli_variance((double)rec->weight, rec->weight);
      g->bernoulli_bytes += scale * scale * bernoulli_variance((double)rec->weight * (double)rec->size, rec->weight);
    }
  }
  r->record_count = kept;
  return grouping;
}

// Turns stacks into snapshot locations, once per stack: frames become {function, file, line}; C
// functions take the file and line of their nearest Ruby caller; Ruby frames that have not started
// (line 0, a script's outer <main>) are left out, as in Ruby's backtraces.
typedef struct {
  recorder *r;
  const names *code_names;
  hs_snapshot *snapshot;
  uint32_t (*stack_slices)[2]; // stack id -> {offset + 1, length} in the snapshot (0 = not yet)
  uint32_t stack_slice_count;
  uint32_t *scratch;
  uint32_t scratch_capacity;
  const labelsets *labels;
  uint32_t (*label_slices)[2]; // label set id -> {offset + 1, length} in the snapshot (0 = not yet)
  uint32_t label_slice_count;
} stack_resolver;

static bool resolve_stack(stack_resolver *sr, uint32_t stack_id, uint32_t *offset, uint32_t *len) {
  if (stack_id < sr->stack_slice_count && sr->stack_slices[stack_id][0] != 0) {
    *offset = sr->stack_slices[stack_id][0] - 1;
    *len = sr->stack_slices[stack_id][1];
    return true;
  }
  uint32_t n;
  const uint32_t *frame_ids = stacktab_stack(sr->r->stacks, stack_id, &n);
  if (n > sr->scratch_capacity) {
    uint32_t *scratch = recorder_realloc(sr->scratch, sizeof(uint32_t) * n);
    if (scratch == NULL) return false;
    sr->scratch = scratch;
    sr->scratch_capacity = n;
  }
  uint32_t caller_file = 0;
  int32_t caller_line = 0;
  uint32_t kept = 0;
  // Walk root to leaf, so a C frame knows its caller; write leaf-first order afterwards.
  for (uint32_t i = n; i-- > 0;) {
    const hs_frame *frame = stacktab_frame(sr->r->stacks, frame_ids[i]);
    hs_location location = {0, 0, 0};
    if (frame->code_id == 0) {
      char label[48];
      int label_len = snprintf(label, sizeof label, "%d frames omitted", frame->line);
      location.function_id = strtab_intern(sr->r->strings, label, (size_t)label_len);
      if (location.function_id == STRTAB_ERROR) return false;
    } else {
      bool is_c_function;
      names_code_info(sr->code_names, frame->code_id, &location.function_id, &location.file_id, &is_c_function);
      if (is_c_function) {
        location.file_id = caller_file;
        location.line = caller_line;
      } else if (frame->line == 0) {
        continue;
      } else {
        location.line = frame->line;
        caller_file = location.file_id;
        caller_line = frame->line;
      }
    }
    uint32_t id = snapshot_location_id(sr->snapshot, location);
    if (id == 0) return false;
    sr->scratch[kept++] = id;
  }
  for (uint32_t i = 0; i < kept / 2; i++) { // root-first -> leaf-first
    uint32_t t = sr->scratch[i];
    sr->scratch[i] = sr->scratch[kept - 1 - i];
    sr->scratch[kept - 1 - i] = t;
  }
  *offset = snapshot_add_stack(sr->snapshot, sr->scratch, kept);
  *len = kept;
  if (*offset == UINT32_MAX) return false;
  if (stack_id < sr->stack_slice_count) {
    sr->stack_slices[stack_id][0] = *offset + 1;
    sr->stack_slices[stack_id][1] = kept;
  }
  return true;
}

// Copies a label set's strings into the recorder's table (which the snapshot's is cloned from) and its
// pairs into the snapshot, once per set. A set the table does not know (or an id past the slices) has no
// labels.
static bool resolve_labels(stack_resolver *sr, uint32_t set, uint32_t *offset, uint32_t *len) {
  *offset = *len = 0;
  if (set == LABELSET_NONE || sr->labels == NULL || set >= sr->label_slice_count) return true;
  if (sr->label_slices[set][0] != 0) {
    *offset = sr->label_slices[set][0] - 1;
    *len = sr->label_slices[set][1];
    return true;
  }
  uint32_t n;
  const label_pair *pairs = labelsets_get(sr->labels, set, &n);
  uint32_t ids[2 * LABELS_MAX_PAIRS];
  for (uint32_t i = 0; i < n; i++) {
    size_t key_len, value_len;
    const char *key = labelsets_string(sr->labels, pairs[i].key, &key_len);
    const char *value = labelsets_string(sr->labels, pairs[i].value, &value_len);
    ids[2 * i] = strtab_intern(sr->r->strings, key, key_len);
    ids[2 * i + 1] = strtab_intern(sr->r->strings, value, value_len);
    if (ids[2 * i] == STRTAB_ERROR || ids[2 * i + 1] == STRTAB_ERROR) return false;
  }
  *offset = snapshot_add_labels(sr->snapshot, ids, 2 * n);
  if (*offset == UINT32_MAX) return false;
  *len = 2 * n;
  sr->label_slices[set][0] = *offset + 1;
  sr->label_slices[set][1] = *len;
  return true;
}

static bool add_sample(stack_resolver *sr, uint32_t stack_id, uint32_t class_id, uint32_t labels, int32_t gc_age,
                       const int64_t values[HS_VALUE_COUNT], const int64_t variances[HS_VALUE_COUNT],
                       const hs_group_totals *groups, int32_t group_types) {
  uint32_t offset, len, labels_offset, labels_len;
  if (!resolve_stack(sr, stack_id, &offset, &len) || !resolve_labels(sr, labels, &labels_offset, &labels_len) ||
      !snapshot_add_sample(sr->snapshot, offset, len, class_id, gc_age, values, variances, groups, group_types)) {
    return false;
  }
  snapshot_label_last_sample(sr->snapshot, labels_offset, labels_len);
  return true;
}

// A variance as a whole number (labels are integers), saturated.
static int64_t variance_value(double v) { return !(v > 0.0) ? 0 : v >= 9.2e18 ? INT64_MAX : llround(v); }

// A site's totals by group (objects, bytes) for the snapshot, already scaled, and the variance of each
// value: the groups' (variance.h).
static void group_variances(const hs_group_totals in, const group_design *design, hs_group_totals out, double variances[2]) {
  for (int t = 0; t < 2; t++) {
    group_sums sums;
    memcpy(sums.totals, in[t], sizeof sums.totals);
    variances[t] = group_sums_variance(&sums, design, 1.0);
    memcpy(out[t], in[t], sizeof sums.totals);
  }
}

// closed + last x last_scale + open x open_scale, by group.
static group_design scaled_design(const group_design *closed, const group_design *last, double last_scale,
                                  const group_design *open, double open_scale) {
  group_design d = *closed;
  for (int g = 0; g < VARIANCE_GROUPS; g++) d.allocations[g] += last->allocations[g] * last_scale + open->allocations[g] * open_scale;
  return d;
}

hs_snapshot *recorder_snapshot(recorder *r, const names *code_names, const labelsets *labels, bool allocs, uint32_t min_age,
                               const recorder_estimate *e) {
  const double open_scale = e->scale;
  // The last closed stretch's scale: the caller's, else the one it closed with.
  const double last_scale = e->last_scale >= 0.0 ? e->last_scale : r->stretch_count > 0 ? (double)r->stretch_scale[r->stretch_count - 1] : 1.0;
  const bool windowed = e->windowed;
  // The designs, scaled as the samples are (so a ratio of a value to them is one of like to like), the
  // window still open counted as if it closed now.
  group_design design = scaled_design(&r->design, &r->last_design, last_scale, &r->open_design, open_scale);
  group_design alloc_design = scaled_design(&r->alloc_design, &r->last_alloc_design, last_scale, &r->open_alloc_design, open_scale);
  design.share = alloc_design.share = e->share;
  if (windowed && e->has_open_window) {
    group_design_add_window(&design, e->open_window, e->open_allocations * open_scale);
    group_design_add_window(&alloc_design, e->open_window, e->open_allocations * open_scale);
  }
  recorder_check_suspects(r); // before sizing anything by record_count: it may finish a GC
  hs_snapshot *s = snapshot_new();
  if (s != NULL) s->gc_count = (uint32_t)rb_gc_count();
  live_groups groups = {.groups = recorder_malloc(sizeof(live_group) * (r->record_count ? r->record_count : 1))};
  stack_resolver sr = {.r = r, .code_names = code_names, .snapshot = s, .labels = labels};
  bool ok = s != NULL && groups.groups != NULL && idindex_init(&groups.index, 64) &&
            group_live_records(r, min_age, s->gc_count, last_scale, open_scale, &groups);
  if (s != NULL && windowed) {
    s->has_groups = true;
    s->design = design;
    s->alloc_design = alloc_design;
  }
  if (ok) {
    // Stack ids are dense (freed ids are reused), so a table of one slot per id up to the largest.
    uint32_t max_id = 0;
    for (uint32_t i = 0; i < r->alloc_count; i++) max_id = r->allocs[i].key.stack_id > max_id ? r->allocs[i].key.stack_id : max_id;
    for (uint32_t i = 0; i < groups.count; i++) max_id = groups.groups[i].key.stack_id > max_id ? groups.groups[i].key.stack_id : max_id;
    sr.stack_slice_count = max_id + 1;
    sr.stack_slices = recorder_calloc(sr.stack_slice_count, sizeof(uint32_t[2]));
    sr.label_slice_count = labels != NULL ? labelsets_id_limit(labels) : 0;
    sr.label_slices = sr.label_slice_count ? recorder_calloc(sr.label_slice_count, sizeof(uint32_t[2])) : NULL;
    ok = sr.stack_slices != NULL && (sr.label_slice_count == 0 || sr.label_slices != NULL);
  }
  // Allocation counters first (alloc_* values, no gc_age), then live groups (inuse_* values).
  for (uint32_t i = 0; ok && i < r->alloc_count; i++) {
    const alloc_counter *c = &r->allocs[i];
    if (c->objects == 0.0 && c->last_objects == 0 && c->open_objects == 0) continue;
    const double scale = c->key.exact ? 1.0 : open_scale; // exact counts are not estimates (kept open)
    double objects = c->objects + last_scale * (double)c->last_objects + scale * (double)c->open_objects;
    double bytes = c->bytes + last_scale * (double)c->last_bytes + scale * (double)c->open_bytes;
    int64_t values[HS_VALUE_COUNT] = {llround(objects), llround(bytes), 0, 0};
    // Bytes are measured after the fact, not per window: by group they are the objects at the
    // counter's mean size.
    double mean_size = objects > 0.0 ? bytes / objects : 0.0, variance[2];
    hs_group_totals in, out;
    if (windowed) {
      for (int g = 0; g < VARIANCE_GROUPS; g++) {
        in[0][g] = (float)((double)c->groups.totals[g] + last_scale * (double)c->last_groups.totals[g] +
                           scale * (double)c->open_groups.totals[g]);
        in[1][g] = (float)((double)in[0][g] * mean_size);
      }
      group_variances(in, &alloc_design, out, variance);
    } else {
      variance[0] = scale * scale * c->bernoulli;
      variance[1] = variance[0] * mean_size * mean_size;
    }
    int64_t variances[HS_VALUE_COUNT] = {variance_value(variance[0]), variance_value(variance[1]), 0, 0};
    ok = add_sample(&sr, c->key.stack_id, c->key.class_id, c->key.labels, HS_NO_AGE, values, variances, windowed ? &out : NULL, HS_ALLOC_OBJECTS);
  }
  for (uint32_t i = 0; ok && i < groups.count; i++) {
    const live_group *g = &groups.groups[i];
    int64_t values[HS_VALUE_COUNT] = {0, 0, llround(g->objects), llround(g->bytes)};
    double variance[2] = {g->bernoulli_objects, g->bernoulli_bytes};
    hs_group_totals out;
    if (windowed) group_variances(g->groups, &design, out, variance);
    int64_t variances[HS_VALUE_COUNT] = {0, 0, variance_value(variance[0]), variance_value(variance[1])};
    ok = add_sample(&sr, g->key.stack_id, g->key.class_id, g->key.labels, (int32_t)g->key.age_bucket, values, variances, windowed ? &out : NULL, HS_INUSE_OBJECTS);
  }
  free(groups.groups);
  idindex_free(&groups.index);
  free(sr.stack_slices);
  free(sr.label_slices);
  free(sr.scratch);
  if (ok) {
    s->strings = strtab_clone(r->strings);
    ok = s->strings != NULL;
  }
  if (!ok) {
    snapshot_free(s);
    return NULL;
  }
  s->allocs = allocs;
  return s;
}

