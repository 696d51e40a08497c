// The heap recorder. Records live in one dense array: the GC hook walks it front to back and compacts
// it in place (no hashing, no pointer chasing), and nothing ever looks a record up by object, because
// liveness comes from the GC's mark bits rather than from a free hook.
#include "recorder.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idindex.h"
#include "liveness.h"
#include "variance.h"

// Exported by libruby (ext/objspace uses it) but declared only in Ruby's internal headers.
#ifdef HAVE_RB_OBJ_MEMSIZE_OF
size_t rb_obj_memsize_of(VALUE obj);
#endif

enum {
  RECORD_UNMEASURED = 1,      // allocated, not yet measured (it was not initialised in the hook)
  RECORD_FROZEN_MEASURED = 2, // seen frozen: its size can no longer change
  RECORD_SUSPECT = 8,         // a GC we did not see may have freed its slot, even its page: never read it
                              // until recorder_check_suspects has found the slot on a live page
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
} record;
_Static_assert(sizeof(record) <= 48, "the design budget is 48 bytes per tracked object");

typedef struct {
  uint32_t stack_id; // the counter holds one reference to the stack
  uint32_t class_id;
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

static bool record_is_valid(VALUE obj);

// ---- Test-only fault injection (recorder_testing_fail_allocations) ----

static uint32_t failing_allocations; // the next this many recorder allocations fail

static bool injected_failure(void) {
  if (__builtin_expect(failing_allocations == 0, 1)) return false;
  failing_allocations--;
  return true;
}
static void *rec_malloc(size_t n) { return injected_failure() ? NULL : malloc(n); }
static void *rec_calloc(size_t count, size_t n) { return injected_failure() ? NULL : calloc(count, n); }
static void *rec_realloc(void *p, size_t n) { return injected_failure() ? NULL : realloc(p, n); }

void recorder_testing_fail_allocations(uint32_t n) { failing_allocations = n; }

VALUE recorder_testing_object(const recorder *r, size_t i) {
  if (r->records[i].flags & RECORD_SUSPECT) return Qundef;
  return record_is_valid(r->records[i].obj) ? r->records[i].obj : Qundef;
}

void recorder_testing_corrupt_record(recorder *r) {
  if (r != NULL && r->record_count > 0) r->records[0].obj = Qnil;
}

recorder *recorder_new(const recorder_config *config) {
  recorder *r = calloc(1, sizeof(recorder));
  if (r == NULL) return NULL;
  r->config = *config;
  r->strings = strtab_new();
  r->stacks = stacktab_new(config->max_stacks);
  if (r->strings == NULL || r->stacks == NULL || !idindex_init(&r->alloc_index, 256)) {
    recorder_free(r);
    return NULL;
  }
  return r;
}

void recorder_free(recorder *r) {
  if (r == NULL) return;
  free(r->records);
  free(r->allocs);
  idindex_free(&r->alloc_index);
  stacktab_free(r->stacks);
  strtab_free(r->strings);
  free(r);
}

strtab *recorder_strings(recorder *r) { return r->strings; }
stacktab *recorder_stacks(recorder *r) { return r->stacks; }

// ---- Allocation counters ----

static bool alloc_key_equals(const void *ctx, uint32_t id, const void *key) {
  const recorder *r = ctx;
  return memcmp(&r->allocs[id - 1].key, key, sizeof(alloc_key)) == 0;
}

static uint32_t find_counter(const recorder *r, uint32_t stack_id, uint32_t class_id, uint32_t *hash) {
  alloc_key key = {stack_id, class_id};
  *hash = idindex_hash_bytes(&key, sizeof key);
  return idindex_find(&r->alloc_index, *hash, alloc_key_equals, r, &key);
}

// Makes room for one more item in a growable array of count items (doubling from initial): returns the
// array to use from now on (items itself when there was room), or NULL when memory is short (items is
// then left as it was, capacity too).
static void *room_for_one(void *items, uint32_t *capacity, uint32_t count, size_t item_size, uint32_t initial) {
  if (count < *capacity) return items;
  uint32_t grown = *capacity ? *capacity * 2 : initial;
  void *bigger = rec_realloc(items, item_size * grown);
  if (bigger != NULL) *capacity = grown;
  return bigger;
}

// Adds weight allocations taken in window to the counter of (stack_id, class_id), creating it (and
// taking a reference to the stack) if new. Returns false when memory is short.
static bool count_allocation(recorder *r, uint32_t stack_id, uint32_t class_id, uint32_t weight, uint32_t window) {
  uint32_t hash;
  uint32_t id = find_counter(r, stack_id, class_id, &hash);
  if (id == IDINDEX_NONE) {
    alloc_counter *allocs = room_for_one(r->allocs, &r->alloc_capacity, r->alloc_count, sizeof *allocs, 256);
    if (allocs == NULL) return false;
    r->allocs = allocs;
    id = r->alloc_count + 1;
    if (!idindex_insert(&r->alloc_index, hash, id)) return false;
    r->allocs[id - 1] = (alloc_counter){.key = {stack_id, class_id}};
    r->alloc_count++;
    stacktab_retain(r->stacks, stack_id);
  }
  alloc_counter *counter = &r->allocs[id - 1];
  if (r->config.windowed) group_sums_add(&counter->groups, window, (double)weight);
  else counter->bernoulli += bernoulli_variance((double)weight, weight);
  counter->objects += weight;
  return true;
}

// Adds the bytes of a sampled allocation, once it has been measured. A counter that was reset since
// the allocation no longer wants them.
static void count_allocated_bytes(recorder *r, const record *rec, uint64_t size) {
  uint32_t hash;
  uint32_t id = find_counter(r, rec->stack_id, rec->class_id, &hash);
  if (id == IDINDEX_NONE) return;
  r->allocs[id - 1].bytes += (int64_t)((uint64_t)rec->weight * size);
}

void recorder_close_window(recorder *r, uint32_t window, uint64_t allocations) {
  group_design_add_window(&r->design, window, (double)allocations);
  group_design_add_window(&r->alloc_design, window, (double)allocations);
}

// ---- Records ----

void recorder_track(recorder *r, VALUE obj, const uint32_t *frame_ids, uint32_t n, uint32_t class_id,
                    uint32_t alloc_gc, uint32_t weight, uint32_t window) {
  uint32_t stack_id;
  switch (stacktab_acquire(r->stacks, frame_ids, n, &stack_id)) {
    case STACKTAB_OK: break;
    case STACKTAB_FULL: r->stats.dropped_stack_cap++; return;
    case STACKTAB_NOMEM: r->stats.dropped_no_memory++; return;
  }
  if (!count_allocation(r, stack_id, class_id, weight, window)) {
    r->stats.dropped_no_memory++;
    stacktab_release(r->stacks, stack_id);
    return;
  }
  if (r->record_count >= r->config.max_tracked_objects) {
    r->stats.dropped_tracked_cap++;
    stacktab_release(r->stacks, stack_id);
    return;
  }
  if (r->record_count == r->record_capacity) {
    size_t capacity = r->record_capacity ? r->record_capacity * 2 : 1024;
    record *records = rec_realloc(r->records, sizeof(record) * capacity);
    if (records == NULL) {
      r->stats.dropped_no_memory++;
      stacktab_release(r->stacks, stack_id);
      return;
    }
    r->records = records;
    r->record_capacity = capacity;
  }
  r->records[r->record_count++] = (record){
    .obj = obj, .size = r->config.slot_size, .stack_id = stack_id, .class_id = class_id, .alloc_gc = alloc_gc,
    .weight = weight, .flags = RECORD_UNMEASURED, .window = window,
  };
}

static uint64_t measure(const recorder *r, VALUE obj) {
#ifdef HAVE_RB_OBJ_MEMSIZE_OF
  if (r->config.track_sizes) return rb_obj_memsize_of(obj);
#endif
  return r->config.slot_size;
}

// (Re)measures a record's object, unless it was seen frozen before. The first measurement is the
// allocation's size, added to its counter.
static void measure_record(recorder *r, record *rec) {
  if (rec->flags & RECORD_FROZEN_MEASURED) return;
  rec->size = measure(r, rec->obj);
  if (rec->flags & RECORD_UNMEASURED) {
    rec->flags &= ~RECORD_UNMEASURED;
    count_allocated_bytes(r, rec, rec->size);
  }
  if (RB_OBJ_FROZEN(rec->obj)) {
    rec->flags |= RECORD_FROZEN_MEASURED;
    r->stats.frozen_measured++;
  }
}

// Checks that a record still points at an object. Liveness makes this always true; the check turns a
// bug into a counted, dropped record instead of a crash in memsize_of.
static bool record_is_valid(VALUE obj) {
  if (RB_SPECIAL_CONST_P(obj)) return false;
  switch (RB_BUILTIN_TYPE(obj)) {
    case RUBY_T_NONE: case RUBY_T_MOVED: case RUBY_T_ZOMBIE: case RUBY_T_IMEMO: return false;
    default: return true;
  }
}

void recorder_on_gc_end_mark(recorder *r) {
  size_t kept = 0;
  for (size_t i = 0; i < r->record_count; i++) {
    record *rec = &r->records[i];
    if (RB_SPECIAL_CONST_P(rec->obj)) { // never stored by recorder_track: a bug (the mark bitmap lookup would crash)
      stacktab_release(r->stacks, rec->stack_id);
      r->stats.invalid_records++;
      continue;
    }
    // A suspect's slot may be on a page a GC we did not see has freed: reading it could crash. It
    // waits, unread, for recorder_check_suspects outside the GC.
    if (rec->flags & RECORD_SUSPECT) {
      r->records[kept++] = *rec;
      continue;
    }
    // Every other record held a live object when this GC started (the previous liveness pass kept it,
    // or it was allocated since), so its header is readable. T_DATA objects are not measured here:
    // their dsize functions are extension code, not to be run inside the GC.
    if ((rec->flags & RECORD_UNMEASURED) && record_is_valid(rec->obj) && !RB_TYPE_P(rec->obj, T_DATA)) {
      measure_record(r, rec);
    }
    // An unmarked object is garbage: it will be swept (its slot freed, maybe reused) before the
    // mutator runs again, so the record must go now. Old objects keep their mark bits through minor
    // GCs, so this is right for minor and major GCs alike.
    if (liveness_marked(rec->obj)) {
      r->records[kept++] = *rec;
      continue;
    }
    if (rec->flags & RECORD_UNMEASURED) count_allocated_bytes(r, rec, r->config.slot_size);
    stacktab_release(r->stacks, rec->stack_id);
    r->stats.dead_removed++;
  }
  r->record_count = kept;
}

void recorder_on_compact(recorder *r) {
  for (size_t i = 0; i < r->record_count; i++) {
    // rb_gc_location reads the slot: a suspect's may be gone. One that moved is found T_MOVED or reused
    // by recorder_check_suspects, and dropped or miscounted (recorder.h).
    if (r->records[i].flags & RECORD_SUSPECT) continue;
    r->records[i].obj = rb_gc_location(r->records[i].obj);
  }
}

void recorder_distrust(recorder *r, uint32_t before_gc) {
  for (size_t i = 0; i < r->record_count; i++) {
    record *rec = &r->records[i];
    if ((rec->flags & RECORD_SUSPECT) || (int32_t)(rec->alloc_gc - before_gc) >= 0) continue;
    rec->flags |= RECORD_SUSPECT;
    r->suspect_count++;
  }
}

// Drops a record: its object is gone (or cannot be known to be there).
static void drop_stale(recorder *r, const record *rec) {
  if (rec->flags & RECORD_UNMEASURED) count_allocated_bytes(r, rec, r->config.slot_size);
  stacktab_release(r->stacks, rec->stack_id);
  r->stats.stale_records++;
}

bool recorder_has_suspects(const recorder *r) { return r->suspect_count != 0; }

void recorder_check_suspects(recorder *r) {
  if (r->suspect_count == 0) return;
  // First: collecting may finish a GC in progress (Ruby completes marking and sweeping before it walks
  // the pages), which runs recorder_on_gc_end_mark on these records. Nothing here allocates after it,
  // so no GC can free a page between the walk and the checks below.
  liveness_pages *pages = liveness_pages_collect();
  size_t kept = 0;
  for (size_t i = 0; i < r->record_count; i++) {
    record *rec = &r->records[i];
    if (rec->flags & RECORD_SUSPECT) {
      // Without the page list (memory short) nothing can be checked: unusable, so dropped.
      if (pages == NULL || !liveness_pages_has_slot(pages, rec->obj) || !record_is_valid(rec->obj)) {
        drop_stale(r, rec);
        continue;
      }
      rec->flags &= ~RECORD_SUSPECT;
    }
    r->records[kept++] = *rec;
  }
  r->record_count = kept;
  r->suspect_count = 0;
  liveness_pages_free(pages);
}

uint32_t recorder_age_bucket(uint32_t age) {
  if (age < 2) return age;
  uint32_t bucket = 1;
  while (age >>= 1) bucket <<= 1;
  return bucket;
}

// ---- Snapshots ----

// The aggregation key of live objects in a snapshot.
typedef struct {
  uint32_t stack_id, class_id, age_bucket;
} live_key;

typedef struct {
  live_key key;
  int64_t objects, bytes;
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

// Measures every record, and sums those old enough for the profile per (stack, class, age bucket).
// The walk always finishes (it also compacts out invalid records), even when memory runs short for
// the grouping: then it returns false.
static bool group_live_records(recorder *r, uint32_t min_age, live_groups *groups) {
  uint32_t gc_now = (uint32_t)rb_gc_count();
  bool grouping = true;
  size_t kept = 0;
  for (size_t i = 0; i < r->record_count; i++) {
    record *rec = &r->records[i];
    if (!record_is_valid(rec->obj)) {
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
    measure_record(r, rec);
    if (age < min_age || !grouping) continue;
    live_key key = {rec->stack_id, rec->class_id, recorder_age_bucket(age)};
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
    double weight = (double)rec->weight, bytes = weight * (double)rec->size;
    g->objects += rec->weight;
    g->bytes += llround(bytes);
    if (r->config.windowed) {
      uint32_t group = variance_group(rec->window);
      g->groups[0][group] += (float)weight;
      g->groups[1][group] += (float)bytes;
    } else {
      g->bernoulli_objects += bernoulli_variance(weight, rec->weight);
      g->bernoulli_bytes += bernoulli_variance(bytes, rec->weight);
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
    uint32_t *scratch = rec_realloc(sr->scratch, sizeof(uint32_t) * n);
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

static bool add_sample(stack_resolver *sr, uint32_t stack_id, uint32_t class_id, int32_t gc_age, const int64_t values[HS_VALUE_COUNT],
                       const int64_t variances[HS_VALUE_COUNT], const hs_group_totals *groups, int32_t group_types) {
  uint32_t offset, len;
  return resolve_stack(sr, stack_id, &offset, &len) &&
         snapshot_add_sample(sr->snapshot, offset, len, class_id, gc_age, values, variances, groups, group_types);
}

// A variance as a whole number (labels are integers), saturated.
static int64_t variance_value(double v) { return !(v > 0.0) ? 0 : v >= 9.2e18 ? INT64_MAX : llround(v); }

// Scales a site's totals by group (objects, bytes) for the snapshot, and returns the variance of each
// value: the groups' (variance.h).
static void scaled_groups(const hs_group_totals in, double scale, const group_design *design, hs_group_totals out, double variances[2]) {
  for (int t = 0; t < 2; t++) {
    group_sums sums;
    memcpy(sums.totals, in[t], sizeof sums.totals);
    variances[t] = group_sums_variance(&sums, design, scale);
    for (int g = 0; g < VARIANCE_GROUPS; g++) out[t][g] = (float)((double)in[t][g] * scale);
  }
}

hs_snapshot *recorder_snapshot(recorder *r, const names *code_names, bool allocs, uint32_t min_age, const recorder_estimate *e) {
  const double scale = e->scale;
  const bool windowed = e->windowed;
  // The designs, the window still open counted as if it closed now.
  group_design design = r->design, alloc_design = r->alloc_design;
  design.share = alloc_design.share = e->share;
  if (windowed && e->has_open_window) {
    group_design_add_window(&design, e->open_window, e->open_allocations);
    group_design_add_window(&alloc_design, e->open_window, e->open_allocations);
  }
  recorder_check_suspects(r); // before sizing anything by record_count: it may finish a GC
  hs_snapshot *s = snapshot_new();
  live_groups groups = {.groups = rec_malloc(sizeof(live_group) * (r->record_count ? r->record_count : 1))};
  stack_resolver sr = {.r = r, .code_names = code_names, .snapshot = s};
  bool ok = s != NULL && groups.groups != NULL && idindex_init(&groups.index, 64) &&
            group_live_records(r, min_age, &groups);
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
    sr.stack_slices = rec_calloc(sr.stack_slice_count, sizeof(uint32_t[2]));
    ok = sr.stack_slices != NULL;
  }
  // Allocation counters first (alloc_* values, no gc_age), then live groups (inuse_* values).
  for (uint32_t i = 0; ok && i < r->alloc_count; i++) {
    const alloc_counter *c = &r->allocs[i];
    if (c->objects == 0) continue;
    int64_t values[HS_VALUE_COUNT] = {llround((double)c->objects * scale), llround((double)c->bytes * scale), 0, 0};
    // Bytes are measured after the fact, not per window: by group they are the objects at the
    // counter's mean size.
    double mean_size = (double)c->bytes / (double)c->objects, variance[2];
    hs_group_totals in, out;
    if (windowed) {
      for (int g = 0; g < VARIANCE_GROUPS; g++) {
        in[0][g] = c->groups.totals[g];
        in[1][g] = (float)((double)c->groups.totals[g] * mean_size);
      }
      scaled_groups(in, scale, &alloc_design, out, variance);
    } else {
      variance[0] = scale * scale * c->bernoulli;
      variance[1] = variance[0] * mean_size * mean_size;
    }
    int64_t variances[HS_VALUE_COUNT] = {variance_value(variance[0]), variance_value(variance[1]), 0, 0};
    ok = add_sample(&sr, c->key.stack_id, c->key.class_id, HS_NO_AGE, values, variances, windowed ? &out : NULL, HS_ALLOC_OBJECTS);
  }
  for (uint32_t i = 0; ok && i < groups.count; i++) {
    const live_group *g = &groups.groups[i];
    int64_t values[HS_VALUE_COUNT] = {0, 0, llround((double)g->objects * scale), llround((double)g->bytes * scale)};
    double variance[2] = {scale * scale * g->bernoulli_objects, scale * scale * g->bernoulli_bytes};
    hs_group_totals out;
    if (windowed) scaled_groups(g->groups, scale, &design, out, variance);
    int64_t variances[HS_VALUE_COUNT] = {0, 0, variance_value(variance[0]), variance_value(variance[1])};
    ok = add_sample(&sr, g->key.stack_id, g->key.class_id, (int32_t)g->key.age_bucket, values, variances, windowed ? &out : NULL, HS_INUSE_OBJECTS);
  }
  free(groups.groups);
  idindex_free(&groups.index);
  free(sr.stack_slices);
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

void recorder_reset_allocs(recorder *r) {
  for (uint32_t i = 0; i < r->alloc_count; i++) stacktab_release(r->stacks, r->allocs[i].key.stack_id);
  r->alloc_count = 0;
  memset(&r->alloc_design, 0, sizeof r->alloc_design);
  idindex_free(&r->alloc_index);
  // If this fails the index is empty with no slots, which still works: the next insert allocates.
  (void)idindex_init(&r->alloc_index, 256);
}

void recorder_each_object(const recorder *r, bool (*fn)(VALUE obj, uint32_t stack_id, void *data), void *data) {
  for (size_t i = 0; i < r->record_count; i++) {
    const record *rec = &r->records[i];
    if ((rec->flags & RECORD_SUSPECT) || !record_is_valid(rec->obj)) continue;
    if (!fn(rec->obj, rec->stack_id, data)) return;
  }
}

void recorder_get_stats(const recorder *r, recorder_stats *stats) {
  *stats = r->stats;
  stats->tracked_objects = r->record_count;
  stats->suspect_records = r->suspect_count;
  stats->alloc_sites = r->alloc_count;
  stats->record_bytes = sizeof(record);
  stats->live_stacks = stacktab_live_stacks(r->stacks);
  stats->stack_table_bytes = stacktab_memory(r->stacks);
  stats->frames = stacktab_frame_count(r->stacks) - 1;
  stats->strings = strtab_count(r->strings) - 1;
  stats->memory_bytes = sizeof(recorder) + sizeof(record) * r->record_capacity +
                        sizeof(alloc_counter) * r->alloc_capacity + idindex_memory(&r->alloc_index) +
                        stacktab_memory(r->stacks) + strtab_memory(r->strings);
}
