#include "retainers.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "capture.h"
#include "clock.h"
#include "edge_names.h"
#include "names.h"
#include "recorder.h"
#include "site_match.h"
#include "stacktab.h"
#include "strtab.h"

#ifdef HAVE_RB_OBJSPACE_REACHABLE_OBJECTS_FROM_ROOT
// Exported for ext/objspace (3.1.2, 3.3.8 and 3.4.11 checked with nm; upstream's internal/gc.h still
// declares both), declared only in internal headers; extconf.rb probes them.
void rb_objspace_reachable_objects_from(VALUE obj, void (*func)(VALUE, void *), void *data);
void rb_objspace_reachable_objects_from_root(void (*func)(const char *category, VALUE, void *), void *data);

#include "retainers_walk.h"

static size_t hash_value(VALUE v) {
  uint64_t x = (uint64_t)v >> 3;
  x *= 0x9E3779B97F4A7C15ull;
  return (size_t)(x >> 21);
}

static size_t find_slot(const uint32_t *slots, size_t mask, const VALUE *objs, VALUE obj) {
  size_t i = hash_value(obj) & mask;
  while (slots[i] != 0 && objs[slots[i] - 1] != obj) i = (i + 1) & mask;
  return i;
}

static size_t find_node_slot(const walk *w, const uint32_t *slots, size_t mask, VALUE obj) {
  size_t i = hash_value(obj) & mask;
  while (slots[i] != 0 && OBJ(w, slots[i] - 1) != obj) i = (i + 1) & mask;
  return i;
}

static bool is_target(const walk *w, VALUE obj) {
  if (w->target_slots == NULL) return false;
  return w->target_slots[find_slot(w->target_slots, w->target_mask, w->targets, obj)] != 0;
}

// The node number + 1 of obj if it was reached, else 0.
uint32_t retainers_node_of(const walk *w, VALUE obj) {
  uint32_t n = w->slots[find_node_slot(w, w->slots, w->slot_mask, obj)];
  if (n == 0 && w->old_slots != NULL) n = w->old_slots[find_node_slot(w, w->old_slots, w->old_mask, obj)];
  return n;
}

// Copies up to count entries of the old table into the current one (entries stay in the old one
// too, so its probe chains hold until it is freed).
static void copy_old_slots(walk *w, size_t count) {
  for (; w->old_slots != NULL && count > 0; count--) {
    uint32_t n = w->old_slots[w->old_at];
    if (n != 0) {
      size_t i = find_node_slot(w, w->slots, w->slot_mask, OBJ(w, n - 1));
      if (w->slots[i] == 0) w->slots[i] = n;
    }
    if (++w->old_at > w->old_mask) {
      free(w->old_slots);
      w->old_slots = NULL;
    }
  }
}

// Doubles the visited set: the current table becomes the old one, copied over as nodes are added
// (4 entries per node: done long before the new table is half full). False when memory is short.
static bool grow_slots(walk *w) {
  copy_old_slots(w, SIZE_MAX); // (only if the previous copy is not done: never, at 4 per node)
  size_t size = (w->slot_mask + 1) * 2;
  uint32_t *slots = calloc(size, sizeof(uint32_t));
  if (slots == NULL) return false;
  w->old_slots = w->slots;
  w->old_mask = w->slot_mask;
  w->old_at = 0;
  w->slots = slots;
  w->slot_mask = size - 1;
  return true;
}

// Adds a block of nodes. False when memory is short.
static bool grow_nodes(walk *w) {
  if (w->block_count == w->block_capacity) {
    size_t capacity = w->block_capacity ? w->block_capacity * 2 : 16;
    node_block **blocks = realloc(w->blocks, capacity * sizeof(node_block *));
    if (blocks == NULL) return false;
    w->blocks = blocks;
    w->block_capacity = capacity;
  }
  node_block *block = malloc(sizeof(node_block));
  if (block == NULL) return false;
  w->blocks[w->block_count++] = block;
  return true;
}

// Adds obj as reached from parent, unless it was reached before. Runs inside Ruby's marking
// functions (called back for each reference): allocates no Ruby object, never raises.
static void add_node(walk *w, VALUE obj, uint32_t parent, uint8_t category) {
  if (w->stopped) return;
  if (retainers_node_of(w, obj) != 0) return;
  if (w->count == w->max_nodes) {
    w->over_nodes = w->stopped = true;
    return;
  }
  if ((w->count == w->block_count * BLOCK_NODES && !grow_nodes(w)) || ((w->count + 1) * 2 > w->slot_mask + 1 && !grow_slots(w))) {
    w->out_of_memory = w->stopped = true;
    return;
  }
  copy_old_slots(w, 4);
  size_t i = find_node_slot(w, w->slots, w->slot_mask, obj);
  OBJ(w, w->count) = obj;
  PARENT(w, w->count) = parent;
  CATEGORY(w, w->count) = category;
  w->slots[i] = (uint32_t)++w->count;
  if (is_target(w, obj)) w->targets_found++;
}

static void on_root(const char *category, VALUE obj, void *data) {
  walk *w = data;
  int c = 0;
  while (c < w->category_count && strcmp(w->categories[c], category) != 0) c++;
  if (c == w->category_count && c < MAX_CATEGORIES) w->categories[w->category_count++] = category;
  uint8_t index = (uint8_t)(c < MAX_CATEGORIES ? c : MAX_CATEGORIES - 1);
  if (strcmp(category, "machine_context") == 0) {
    if (w->deferred_count == w->deferred_capacity) {
      size_t capacity = w->deferred_capacity ? w->deferred_capacity * 2 : 1024;
      VALUE *grown = realloc(w->deferred, capacity * sizeof(VALUE));
      if (grown == NULL) {
        w->out_of_memory = w->stopped = true;
        return;
      }
      w->deferred = grown;
      w->deferred_capacity = capacity;
    }
    w->deferred[w->deferred_count++] = obj;
    w->deferred_category = index;
    return;
  }
  add_node(w, obj, NO_PARENT, index);
}

// Whether obj references nothing but its class, which is a core class reached from its constant
// anyway: no path goes through it, so the walk need not keep it (unless it is a target). This is what
// keeps a walk over 3M Strings small: ~21 bytes kept per object otherwise. Conservative: anything
// unsure is not a leaf.
// Generic instance variables (on a String, an Array...) are asked of rb_ivar_count: FL_EXIVAR, which
// said so on 3.1-3.4, is deprecated in 4.0 as "an outdated implementation detail".
static bool is_leaf(VALUE obj) {
  switch (RB_BUILTIN_TYPE(obj)) {
    case RUBY_T_STRING:
      // A heap String may share another's buffer and then references it (STR_SHARED, FL_USER2 in
      // internal/string.h on 3.1-3.4): only an embedded one, or a heap one without that flag.
      return RBASIC_CLASS(obj) == rb_cString && (!RB_FL_TEST_RAW(obj, RSTRING_NOEMBED) || !RB_FL_TEST_RAW(obj, RUBY_FL_USER2)) &&
             rb_ivar_count(obj) == 0;
    case RUBY_T_FLOAT: return RBASIC_CLASS(obj) == rb_cFloat && rb_ivar_count(obj) == 0;
    case RUBY_T_BIGNUM: return RBASIC_CLASS(obj) == rb_cInteger && rb_ivar_count(obj) == 0;
    default: return false;
  }
}

static void on_child(VALUE obj, void *data) {
  walk *w = data;
  if (is_leaf(obj) && !is_target(w, obj)) {
    w->leaves_seen++;
    return;
  }
  add_node(w, obj, w->current_parent, NOT_A_ROOT);
}

static double seconds_now(void) { return (double)clock_monotonic_nanos() / 1e9; }

// An Array expanded by hand, a chunk at a time, so one huge Array does not hold the GVL for all its
// elements at once. Not one with generic instance variables (the GC's walk finds those). What the walk
// leaves out: a shared Array's hidden root buffer, whose elements are the ones read here anyway.
static bool is_big_array(VALUE obj) {
  return RB_TYPE_P(obj, RUBY_T_ARRAY) && RARRAY_LEN(obj) > ARRAY_CHUNK && rb_ivar_count(obj) == 0;
}

// Reads the next chunk of a big Array (its length and elements read afresh: other threads may have
// changed it between slices). True when the Array is done.
static bool expand_array_chunk(walk *w, VALUE ary) {
  if (w->array_at == 0 && RBASIC_CLASS(ary) != 0) on_child(RBASIC_CLASS(ary), w);
  long len = RARRAY_LEN(ary);
  long end = w->array_at + ARRAY_CHUNK < len ? w->array_at + ARRAY_CHUNK : len;
  for (long i = w->array_at; i < end && !w->stopped; i++) {
    VALUE element = RARRAY_AREF(ary, i);
    if (!RB_SPECIAL_CONST_P(element)) on_child(element, w);
  }
  w->array_at = end;
  if (end < len) return false;
  w->array_at = 0;
  return true;
}

// Paces the walk: past the time limit says so; past a slice lets other threads run (they may change
// anything, free nothing we hold: see walk_mark). A slice is SLICE_SECONDS, or Ruby's own thread
// quantum (100 ms) while the walk has held the GVL for less than half the time since it began: a
// thread that runs Ruby code without pause keeps the GVL a whole quantum each time, and 20 ms slices
// would then leave the walk a sixth of its time limit. May raise (Thread#raise, Thread#kill).
const char *retainers_pace(retainers_job *job) {
  double now = seconds_now();
  if (now - job->started > job->time_limit) return "time";
  double slice = now - job->slice_started;
  double limit = (job->held + slice) * 2 < now - job->started ? SLICE_QUANTUM : SLICE_SECONDS;
  if (slice > limit) {
    if (slice > job->longest_slice) job->longest_slice = slice;
    job->held += slice;
    job->slices++;
    rb_thread_schedule();
    job->slice_started = seconds_now();
  }
  return NULL;
}

// Whether obj holds a C stack its marking scans conservatively (a Thread, a Fiber).
static bool holds_a_stack(VALUE obj) {
  if (!RB_TYPE_P(obj, RUBY_T_DATA) || retainers_is_internal(obj)) return false;
  return RTEST(rb_obj_is_fiber(obj)) || RTEST(rb_obj_is_kind_of(obj, rb_cThread));
}

// Notes node as a stack holder to expand later. False when memory is short.
static bool defer_stack_holder(walk *w, size_t node) {
  if (w->stack_holder_count == w->stack_holder_capacity) {
    size_t capacity = w->stack_holder_capacity ? w->stack_holder_capacity * 2 : 64;
    uint32_t *grown = realloc(w->stack_holders, capacity * sizeof(uint32_t));
    if (grown == NULL) return false;
    w->stack_holders = grown;
    w->stack_holder_capacity = capacity;
  }
  w->stack_holders[w->stack_holder_count++] = (uint32_t)node;
  return true;
}

// Walks breadth first from node *next on, until every target is reached, a limit is hit or no node is
// left. Returns the limit hit ("time"), or NULL.
static const char *walk_from(retainers_job *job, size_t *next) {
  walk *w = &job->w;
  unsigned steps = 0;
  while (*next < w->count && !w->stopped && w->targets_found < w->target_count) {
    VALUE obj = OBJ(w, *next);
    w->current_parent = (uint32_t)*next;
    bool chunked = w->array_at > 0 || is_big_array(obj);
    if (!chunked && !w->expanding_stack_holders && holds_a_stack(obj)) {
      if (!defer_stack_holder(w, *next)) w->out_of_memory = w->stopped = true;
      (*next)++;
    } else if (!chunked) {
      rb_objspace_reachable_objects_from(obj, on_child, w);
      (*next)++;
    } else if (expand_array_chunk(w, obj)) {
      (*next)++;
    }
    if (chunked || (++steps & 63) == 0) {
      const char *limit = retainers_pace(job);
      if (limit) return limit;
    }
  }
  return NULL;
}

// Expands the Threads and Fibers deferred so far, the walking thread's own last (its stacks hold the
// caller's frames and temporaries, the least telling holder), then walks on from what they hold
// (Threads and Fibers met from then on are expanded in order).
static const char *walk_stack_holders(retainers_job *job, size_t *next) {
  walk *w = &job->w;
  w->expanding_stack_holders = true;
  VALUE own_thread = rb_thread_current(), own_fiber = rb_fiber_current();
  for (int own = 0; own < 2; own++) {
    for (size_t k = 0; k < w->stack_holder_count && !w->stopped && w->targets_found < w->target_count; k++) {
      VALUE holder = OBJ(w, w->stack_holders[k]);
      if ((holder == own_thread || holder == own_fiber) != (own == 1)) continue;
      w->current_parent = w->stack_holders[k];
      rb_objspace_reachable_objects_from(holder, on_child, w);
      const char *limit = retainers_pace(job);
      if (limit) return limit;
    }
  }
  return walk_from(job, next);
}

// ---- Targets: the sampled objects whose allocation stack passes through file:line ----

typedef struct {
  site_match site;
  walk *w;
} target_match;

static bool collect_target(VALUE obj, uint32_t stack_id, uint32_t alloc_gc, void *data) {
  (void)alloc_gc;
  target_match *m = data;
  if (RBASIC_CLASS(obj) == 0 || !site_match_stack(&m->site, stack_id)) return true;
  m->w->targets[m->w->target_count++] = obj;
  return m->w->target_count < m->w->target_capacity;
}

static bool index_targets(walk *w) {
  size_t size = 16;
  while (size < w->target_count * 2) size *= 2;
  w->target_slots = calloc(size, sizeof(uint32_t));
  if (w->target_slots == NULL) return false;
  w->target_mask = size - 1;
  for (size_t t = 0; t < w->target_count; t++) {
    size_t i = find_slot(w->target_slots, w->target_mask, w->targets, w->targets[t]);
    if (w->target_slots[i] == 0) w->target_slots[i] = (uint32_t)t + 1;
  }
  return true;
}

static VALUE run_walk(VALUE arg) {
  retainers_job *job = (retainers_job *)arg;
  walk *w = &job->w;
  job->started = job->slice_started = seconds_now();
  target_match m;
  site_match_init(&m.site, RSTRING_PTR(job->file), (size_t)RSTRING_LEN(job->file), job->line);
  m.w = w;
  recorder_each_object(capture_recorder(), collect_target, &m);
  const char *cut_short = NULL;
  if (w->target_count > 0) {
    if (!index_targets(w)) {
      cut_short = "memory";
    } else {
      rb_objspace_reachable_objects_from_root(on_root, w);
      size_t next = 0;
      cut_short = walk_from(job, &next);
      if (cut_short == NULL && !w->stopped && w->targets_found < w->target_count) cut_short = walk_stack_holders(job, &next);
      if (cut_short == NULL && !w->stopped && w->targets_found < w->target_count) {
        for (size_t d = 0; d < w->deferred_count; d++) add_node(w, w->deferred[d], NO_PARENT, w->deferred_category);
        cut_short = walk_from(job, &next);
      }
      if (w->over_nodes) cut_short = "objects";
      if (w->out_of_memory) cut_short = "memory";
    }
  }
  double walked = seconds_now() - job->started;
  VALUE paths = rb_ary_new();
  const char *naming_cut = retainers_build_paths(job, paths);
  if (cut_short == NULL) cut_short = naming_cut;
  double now = seconds_now();
  if (now - job->slice_started > job->longest_slice) job->longest_slice = now - job->slice_started;
  VALUE result = rb_hash_new();
  rb_hash_aset(result, ID2SYM(rb_intern("paths")), paths);
  rb_hash_aset(result, ID2SYM(rb_intern("targets")), SIZET2NUM(w->target_count));
  rb_hash_aset(result, ID2SYM(rb_intern("visited")), SIZET2NUM(w->count + w->leaves_seen));
  rb_hash_aset(result, ID2SYM(rb_intern("kept")), SIZET2NUM(w->count));
  rb_hash_aset(result, ID2SYM(rb_intern("seconds")), DBL2NUM(walked));
  rb_hash_aset(result, ID2SYM(rb_intern("total_seconds")), DBL2NUM(now - job->started));
  rb_hash_aset(result, ID2SYM(rb_intern("longest_pause")), DBL2NUM(job->longest_slice));
  rb_hash_aset(result, ID2SYM(rb_intern("slices")), SIZET2NUM(job->slices + 1));
  rb_hash_aset(result, ID2SYM(rb_intern("cut_short")), cut_short ? ID2SYM(rb_intern(cut_short)) : Qnil);
  rb_hash_aset(result, ID2SYM(rb_intern("table_bytes")), SIZET2NUM(w->block_count * sizeof(node_block) + (w->slot_mask + 1) * sizeof(uint32_t)));
  job->result = result;
  return Qnil;
}

// Marks (and so pins) every VALUE the walk holds, while it lets other threads run.
static void walk_mark(void *data) {
  const retainers_job *job = data;
  // Only in a GC: the walk itself can reach its holder (it sits on this thread's C stack, a conservative
  // root) and asks for its references with rb_objspace_reachable_objects_from, outside any GC; handing
  // it the targets then gave every garbage target a path through the holder.
  if (job == NULL || !rb_during_gc()) return;
  const walk *w = &job->w;
  for (size_t b = 0; b < w->block_count; b++) {
    size_t in_block = w->count - b * BLOCK_NODES < BLOCK_NODES ? w->count - b * BLOCK_NODES : BLOCK_NODES;
    rb_gc_mark_locations(w->blocks[b]->objs, w->blocks[b]->objs + in_block);
  }
  if (w->targets) rb_gc_mark_locations(w->targets, w->targets + w->target_count);
  if (w->deferred) rb_gc_mark_locations(w->deferred, w->deferred + w->deferred_count);
  edge_names_mark(job->names);
  rb_gc_mark(job->file);
}

static const rb_data_type_t walk_type = {
  .wrap_struct_name = "heapscope_retainers_walk",
  .function = {.dmark = walk_mark, .dfree = NULL, .dsize = NULL},
  .flags = RUBY_TYPED_FREE_IMMEDIATELY,
};

typedef struct {
  retainers_job *job;
  VALUE holder;
} walk_run;

static VALUE finish_walk(VALUE arg) {
  walk_run *run = (walk_run *)arg;
  retainers_job *job = run->job;
  DATA_PTR(run->holder) = NULL; // (the holder may be found on a stack later: it must not mark freed tables)
  for (size_t b = 0; b < job->w.block_count; b++) free(job->w.blocks[b]);
  free(job->w.blocks);
  free(job->w.slots);
  free(job->w.old_slots);
  free(job->w.targets);
  free(job->w.target_slots);
  free(job->w.deferred);
  free(job->w.stack_holders);
  edge_names_free(job->names);
  free(job->path_chains);
  free(job->path_lengths);
  free(job->path_cuts);
  job->path_chains = NULL;
  job->path_lengths = NULL;
  job->path_cuts = NULL;
  return Qnil;
}

static VALUE run_walk_of(VALUE arg) {
  return run_walk((VALUE)((walk_run *)arg)->job);
}

// Native._retainers(file, line, max_targets, time_limit, max_bytes) -> {paths:, targets:, visited:,
// kept:, seconds:, total_seconds:, longest_pause:, slices:, cut_short:, table_bytes:}. Raises
// NoMemoryError only when not even the first tables fit.
static VALUE native_retainers(VALUE self, VALUE file, VALUE line, VALUE max_targets, VALUE time_limit, VALUE max_bytes) {
  (void)self;
  StringValue(file);
  if (!capture_running()) rb_raise(rb_eRuntimeError, "heapscope is not running");
  capture_settle_records();
  if (!names_resolve(capture_names(), recorder_strings(capture_recorder()))) {
    rb_raise(rb_eNoMemError, "heapscope: not enough memory to name frames");
  }
  retainers_job job = {0};
  job.file = file;
  job.line = (int32_t)NUM2INT(line);
  job.time_limit = NUM2DBL(time_limit);
  size_t max_nodes = NUM2SIZET(max_bytes) / BYTES_PER_NODE;
  if (max_nodes > UINT32_MAX - 1) max_nodes = UINT32_MAX - 1;
  if (max_nodes < 1024) max_nodes = 1024;
  walk *w = &job.w;
  w->max_nodes = max_nodes;
  w->slot_mask = 8192 - 1;
  w->target_capacity = NUM2SIZET(max_targets);
  if (w->target_capacity == 0) w->target_capacity = 1;
  // The holder is made before any table: its allocation may run a GC, which marks nothing yet.
  walk_run run = {&job, TypedData_Wrap_Struct(0, &walk_type, NULL)};
  bool first_block = grow_nodes(w);
  w->slots = calloc(w->slot_mask + 1, sizeof(uint32_t));
  w->targets = malloc(w->target_capacity * sizeof(VALUE));
  if (!first_block || !w->slots || !w->targets) {
    finish_walk((VALUE)&run);
    rb_raise(rb_eNoMemError, "heapscope: not enough memory to walk the heap");
  }
  DATA_PTR(run.holder) = &job;
  // Disabling finishes a GC in progress (its lazy sweep included): the walk then starts from a heap
  // where every object it can reach is allocated. GC is turned back on at once: a slice allocates no
  // Ruby object, so no GC starts inside one, and the GCs the application's threads run between slices
  // (which, with GC off, would let their allocations pile up for the whole walk) mark and pin all the
  // walk holds (walk_mark). The holder is not write-barrier protected, so an incremental marking ends
  // by marking it again, with the nodes added since it began.
  job.gc_was_disabled = RTEST(rb_gc_disable());
  if (!job.gc_was_disabled) rb_gc_enable();
  rb_ensure(run_walk_of, (VALUE)&run, finish_walk, (VALUE)&run);
  RB_GC_GUARD(run.holder);
  return job.result;
}

void retainers_define(VALUE mNative) {
  rb_define_singleton_method(mNative, "_retainers", native_retainers, 5);
}
#else
void retainers_define(VALUE mNative) { (void)mNative; }
#endif
