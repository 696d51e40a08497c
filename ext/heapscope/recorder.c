// The heap recorder. Records live in one dense array: the GC hook walks it front to back and compacts
// it in place (no hashing, no pointer chasing), and nothing ever looks a record up by object, because
// liveness comes from the GC's mark bits rather than from a free hook. Snapshots: recorder_snapshot.c.
#include "recorder.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idindex.h"
#include "liveness.h"
#include "recorder_internal.h"
#include "variance.h"

// Exported by libruby (ext/objspace uses it) but declared only in Ruby's internal headers.
#ifdef HAVE_RB_OBJ_MEMSIZE_OF
size_t rb_obj_memsize_of(VALUE obj);
#endif


// ---- Test-only fault injection (recorder_testing_fail_allocations) ----

static uint32_t failing_allocations; // the next this many recorder allocations fail

static bool injected_failure(void) {
  if (__builtin_expect(failing_allocations == 0, 1)) return false;
  failing_allocations--;
  return true;
}
void *recorder_malloc(size_t n) { return injected_failure() ? NULL : malloc(n); }
void *recorder_calloc(size_t count, size_t n) { return injected_failure() ? NULL : calloc(count, n); }
void *recorder_realloc(void *p, size_t n) { return injected_failure() ? NULL : realloc(p, n); }

void recorder_testing_fail_allocations(uint32_t n) { failing_allocations = n; }

VALUE recorder_testing_object(const recorder *r, size_t i) {
  if (r->records[i].flags & RECORD_SUSPECT) return Qundef;
  return recorder_record_is_valid(r->records[i].obj) ? r->records[i].obj : Qundef;
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

static uint32_t find_counter(const recorder *r, uint32_t stack_id, uint32_t class_id, uint32_t labels, bool exact, uint32_t *hash) {
  alloc_key key = {stack_id, class_id, labels, exact ? 1u : 0u};
  *hash = idindex_hash_bytes(&key, sizeof key);
  return idindex_find(&r->alloc_index, *hash, alloc_key_equals, r, &key);
}

// Makes room for one more item in a growable array of count items (doubling from initial): returns the
// array to use from now on (items itself when there was room), or NULL when memory is short (items is
// then left as it was, capacity too).
static void *room_for_one(void *items, uint32_t *capacity, uint32_t count, size_t item_size, uint32_t initial) {
  if (count < *capacity) return items;
  uint32_t grown = *capacity ? *capacity * 2 : initial;
  void *bigger = recorder_realloc(items, item_size * grown);
  if (bigger != NULL) *capacity = grown;
  return bigger;
}

// Adds weight allocations taken in window to the counter of (stack_id, class_id, labels, exact), creating
// it (and taking a reference to the stack) if new. An exact counter has no variance. Returns false when
// memory is short.
static bool count_allocation(recorder *r, uint32_t stack_id, uint32_t class_id, uint32_t labels, uint32_t weight, uint32_t window,
                             bool exact) {
  uint32_t hash;
  uint32_t id = find_counter(r, stack_id, class_id, labels, exact, &hash);
  if (id == IDINDEX_NONE) {
    alloc_counter *allocs = room_for_one(r->allocs, &r->alloc_capacity, r->alloc_count, sizeof *allocs, 256);
    if (allocs == NULL) return false;
    r->allocs = allocs;
    id = r->alloc_count + 1;
    if (!idindex_insert(&r->alloc_index, hash, id)) return false;
    r->allocs[id - 1] = (alloc_counter){.key = {stack_id, class_id, labels, exact ? 1u : 0u}};
    r->alloc_count++;
    stacktab_retain(r->stacks, stack_id);
  }
  alloc_counter *counter = &r->allocs[id - 1];
  // Stretches close between windows, so a sample is always of the open stretch.
  if (exact) {
    // Known, not estimated: no variance.
  } else if (r->config.windowed) group_sums_add(&counter->open_groups, window, (double)weight);
  else counter->bernoulli += bernoulli_variance((double)weight, weight);
  counter->open_objects += weight;
  return true;
}

// Which stretch window belongs to: the index of its closed stretch, or stretch_count when open.
static uint32_t stretch_of(const recorder *r, uint32_t window) {
  // The first closed stretch whose last window is at or after window (numbers compared as distances,
  // so a wrap of the window count between two stretches changes nothing).
  uint32_t low = 0, high = r->stretch_count;
  while (low < high) {
    uint32_t mid = low + (high - low) / 2;
    if ((int32_t)(window - r->stretch_last_window[mid]) <= 0) high = mid;
    else low = mid + 1;
  }
  return low;
}

double recorder_window_scale(const recorder *r, uint32_t window, double last_scale, double open_scale) {
  uint32_t k = stretch_of(r, window);
  if (k == r->stretch_count) return open_scale;
  if (k + 1 == r->stretch_count && last_scale >= 0.0) return last_scale;
  return (double)r->stretch_scale[k];
}

// Adds the bytes of a sampled allocation, once it has been measured (maybe after its stretch closed):
// to the part of its counter its stretch is in. A counter that was reset since the allocation no longer
// wants them.
static void count_allocated_bytes(recorder *r, const record *rec, uint64_t size) {
  uint32_t hash;
  bool exact = (rec->flags & RECORD_EXACT) != 0;
  uint32_t id = find_counter(r, rec->stack_id, rec->class_id, rec->labels, exact, &hash);
  if (id == IDINDEX_NONE) return;
  alloc_counter *counter = &r->allocs[id - 1];
  int64_t bytes = (int64_t)((uint64_t)rec->weight * size);
  uint32_t k = exact ? r->stretch_count : stretch_of(r, rec->window); // exact: never scaled, kept open
  if (k == r->stretch_count) counter->open_bytes += bytes;
  else if (k + 1 == r->stretch_count) counter->last_bytes += bytes;
  else counter->bytes += (double)r->stretch_scale[k] * (double)bytes;
}

void recorder_close_window(recorder *r, uint32_t window, uint64_t allocations) {
  group_design_add_window(&r->open_design, window, (double)allocations);
  group_design_add_window(&r->open_alloc_design, window, (double)allocations);
}

// closed += last x scale; last = open; open = nothing.
static void shift_design(group_design *closed, group_design *last, group_design *open, double scale) {
  for (int g = 0; g < VARIANCE_GROUPS; g++) closed->allocations[g] += last->allocations[g] * scale;
  *last = *open;
  memset(open, 0, sizeof *open);
}

bool recorder_close_stretch(recorder *r, uint32_t last_window, double scale) {
  if (r->stretch_count >= RECORDER_MAX_STRETCHES) return false;
  // The stretch that was the last closed one is folded in for good, at the scale it closed with.
  double folded = r->stretch_count > 0 ? (double)r->stretch_scale[r->stretch_count - 1] : 1.0;
  for (uint32_t i = 0; i < r->alloc_count; i++) {
    alloc_counter *c = &r->allocs[i];
    if (c->key.exact) continue; // never scaled: kept whole in the open part
    c->objects += folded * (double)c->last_objects;
    c->bytes += folded * (double)c->last_bytes;
    for (int g = 0; g < VARIANCE_GROUPS; g++) c->groups.totals[g] += (float)(folded * (double)c->last_groups.totals[g]);
    c->last_objects = c->open_objects;
    c->last_bytes = c->open_bytes;
    c->last_groups = c->open_groups;
    c->open_objects = c->open_bytes = 0;
    memset(&c->open_groups, 0, sizeof c->open_groups);
  }
  shift_design(&r->design, &r->last_design, &r->open_design, folded);
  shift_design(&r->alloc_design, &r->last_alloc_design, &r->open_alloc_design, folded);
  r->stretch_last_window[r->stretch_count] = last_window;
  r->stretch_scale[r->stretch_count] = (float)scale;
  r->stretch_count++;
  return true;
}

// ---- Records ----

// recorder_track and recorder_track_exact: exact records carry RECORD_EXACT. False when the record was
// refused (counted).
static bool track(recorder *r, VALUE obj, const uint32_t *frame_ids, uint32_t n, uint32_t class_id, uint32_t alloc_gc,
                  uint32_t weight, uint32_t window, uint32_t labels, bool exact) {
  uint32_t stack_id;
  switch (stacktab_acquire(r->stacks, frame_ids, n, &stack_id)) {
    case STACKTAB_OK: break;
    case STACKTAB_FULL: r->stats.dropped_stack_cap++; return false;
    case STACKTAB_NOMEM: r->stats.dropped_no_memory++; return false;
  }
  if (!count_allocation(r, stack_id, class_id, labels, weight, window, exact)) {
    r->stats.dropped_no_memory++;
    stacktab_release(r->stacks, stack_id);
    return false;
  }
  if (r->record_count >= r->config.max_tracked_objects) {
    r->stats.dropped_tracked_cap++;
    stacktab_release(r->stacks, stack_id);
    return false;
  }
  if (r->record_count == r->record_capacity) {
    size_t capacity = r->record_capacity ? r->record_capacity * 2 : 1024;
    record *records = recorder_realloc(r->records, sizeof(record) * capacity);
    if (records == NULL) {
      r->stats.dropped_no_memory++;
      stacktab_release(r->stacks, stack_id);
      return false;
    }
    r->records = records;
    r->record_capacity = capacity;
  }
  r->records[r->record_count++] = (record){
    .obj = obj, .size = r->config.slot_size, .stack_id = stack_id, .class_id = class_id, .alloc_gc = alloc_gc,
    .weight = weight, .flags = RECORD_UNMEASURED | (exact ? RECORD_EXACT : 0), .window = window, .labels = labels,
  };
  return true;
}

void recorder_track(recorder *r, VALUE obj, const uint32_t *frame_ids, uint32_t n, uint32_t class_id,
                    uint32_t alloc_gc, uint32_t weight, uint32_t window, uint32_t labels) {
  track(r, obj, frame_ids, n, class_id, alloc_gc, weight, window, labels, false);
}

bool recorder_track_exact(recorder *r, VALUE obj, const uint32_t *frame_ids, uint32_t n, uint32_t class_id, uint32_t alloc_gc,
                          uint32_t labels) {
  return track(r, obj, frame_ids, n, class_id, alloc_gc, 1, 0, labels, true);
}

static uint64_t measure(const recorder *r, VALUE obj) {
#ifdef HAVE_RB_OBJ_MEMSIZE_OF
  if (r->config.track_sizes) return rb_obj_memsize_of(obj);
#endif
  return r->config.slot_size;
}

// (Re)measures a record's object, unless it was seen frozen before. The first measurement is the
// allocation's size, added to its counter.
void recorder_measure_record(recorder *r, record *rec) {
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
bool recorder_record_is_valid(VALUE obj) {
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
    if ((rec->flags & RECORD_UNMEASURED) && recorder_record_is_valid(rec->obj) && !RB_TYPE_P(rec->obj, T_DATA)) {
      recorder_measure_record(r, rec);
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
      if (pages == NULL || !liveness_pages_has_slot(pages, rec->obj) || !recorder_record_is_valid(rec->obj)) {
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

void recorder_reset_allocs(recorder *r) {
  for (uint32_t i = 0; i < r->alloc_count; i++) stacktab_release(r->stacks, r->allocs[i].key.stack_id);
  r->alloc_count = 0;
  memset(&r->alloc_design, 0, sizeof r->alloc_design);
  memset(&r->last_alloc_design, 0, sizeof r->last_alloc_design);
  memset(&r->open_alloc_design, 0, sizeof r->open_alloc_design);
  idindex_free(&r->alloc_index);
  // If this fails the index is empty with no slots, which still works: the next insert allocates.
  (void)idindex_init(&r->alloc_index, 256);
}

void recorder_each_object(const recorder *r, bool (*fn)(VALUE obj, uint32_t stack_id, uint32_t alloc_gc, void *data), void *data) {
  for (size_t i = 0; i < r->record_count; i++) {
    const record *rec = &r->records[i];
    if ((rec->flags & RECORD_SUSPECT) || !recorder_record_is_valid(rec->obj)) continue;
    if (!fn(rec->obj, rec->stack_id, rec->alloc_gc, data)) return;
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
