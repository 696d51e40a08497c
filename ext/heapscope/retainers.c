#include "retainers.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "capture.h"
#include "names.h"
#include "recorder.h"
#include "stacktab.h"
#include "strtab.h"

#ifdef HAVE_RB_OBJSPACE_REACHABLE_OBJECTS_FROM_ROOT
// Exported for ext/objspace (3.1.2, 3.3.8 and 3.4.11 checked with nm; upstream's internal/gc.h still
// declares both), declared only in internal headers; extconf.rb probes them.
void rb_objspace_reachable_objects_from(VALUE obj, void (*func)(VALUE, void *), void *data);
void rb_objspace_reachable_objects_from_root(void (*func)(const char *category, VALUE, void *), void *data);

#define NO_PARENT UINT32_MAX
#define NOT_A_ROOT 0xff
#define MAX_CATEGORIES 32
#define MAX_HOPS 64
#define BYTES_PER_NODE (sizeof(VALUE) + sizeof(uint32_t) + 1 + 2 * sizeof(uint32_t))

// The walk's tables, all malloc'd. Nodes are numbered in the order they were reached (breadth
// first), so a node's parent always has a smaller number and following parents ends at a root.
typedef struct {
  VALUE *objs;
  uint32_t *parent;
  uint8_t *category; // roots: index into categories; others NOT_A_ROOT
  size_t count, capacity, max_nodes;
  uint32_t *slots; // open addressing over objs: node number + 1, 0 = empty
  size_t slot_mask;
  const char *categories[MAX_CATEGORIES];
  int category_count;
  uint32_t current_parent;
  VALUE *targets;
  size_t target_count, target_capacity, targets_found;
  uint32_t *target_slots; // set of targets: index + 1
  size_t target_mask;
  // Roots found by scanning C stacks conservatively: walked after every other root, so a path names
  // the variable, constant or thread that holds an object, not a stale word left on a C stack.
  VALUE *deferred;
  size_t deferred_count, deferred_capacity;
  uint8_t deferred_category;
  bool stopped, over_nodes, out_of_memory;
} walk;

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

static bool is_target(const walk *w, VALUE obj) {
  if (w->target_slots == NULL) return false;
  return w->target_slots[find_slot(w->target_slots, w->target_mask, w->targets, obj)] != 0;
}

// Doubles the visited set. False when memory is short (the set is unchanged).
static bool grow_slots(walk *w) {
  size_t size = (w->slot_mask + 1) * 2;
  uint32_t *slots = calloc(size, sizeof(uint32_t));
  if (slots == NULL) return false;
  for (size_t n = 0; n < w->count; n++) slots[find_slot(slots, size - 1, w->objs, w->objs[n])] = (uint32_t)n + 1;
  free(w->slots);
  w->slots = slots;
  w->slot_mask = size - 1;
  return true;
}

static bool grow_nodes(walk *w) {
  size_t capacity = w->capacity * 2;
  if (capacity > w->max_nodes) capacity = w->max_nodes;
  VALUE *objs = realloc(w->objs, capacity * sizeof(VALUE));
  if (objs == NULL) return false;
  w->objs = objs;
  uint32_t *parent = realloc(w->parent, capacity * sizeof(uint32_t));
  if (parent == NULL) return false;
  w->parent = parent;
  uint8_t *category = realloc(w->category, capacity);
  if (category == NULL) return false;
  w->category = category;
  w->capacity = capacity;
  return true;
}

// Adds obj as reached from parent, unless it was reached before. Runs inside Ruby's marking
// functions (called back for each reference): allocates no Ruby object, never raises.
static void add_node(walk *w, VALUE obj, uint32_t parent, uint8_t category) {
  if (w->stopped) return;
  size_t i = find_slot(w->slots, w->slot_mask, w->objs, obj);
  if (w->slots[i] != 0) return;
  if (w->count == w->max_nodes) {
    w->over_nodes = w->stopped = true;
    return;
  }
  if ((w->count == w->capacity && !grow_nodes(w)) || ((w->count + 1) * 2 > w->slot_mask + 1 && !grow_slots(w))) {
    w->out_of_memory = w->stopped = true;
    return;
  }
  i = find_slot(w->slots, w->slot_mask, w->objs, obj);
  w->objs[w->count] = obj;
  w->parent[w->count] = parent;
  w->category[w->count] = category;
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

static void on_child(VALUE obj, void *data) {
  walk *w = data;
  add_node(w, obj, w->current_parent, NOT_A_ROOT);
}

static double seconds_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

// Walks breadth first from node *next on, until every target is reached, a limit is hit or no node is
// left. Returns the limit hit ("time"), or NULL.
static const char *walk_from(walk *w, size_t *next, double started, double time_limit) {
  for (size_t i = *next; i < w->count && !w->stopped && w->targets_found < w->target_count; i++, *next = i) {
    if ((i & 1023) == 0 && seconds_now() - started > time_limit) return "time";
    w->current_parent = (uint32_t)i;
    rb_objspace_reachable_objects_from(w->objs[i], on_child, w);
  }
  *next = w->count;
  return NULL;
}

// ---- Targets: the sampled objects whose allocation stack passes through file:line ----

typedef struct {
  const char *file;
  size_t file_len;
  int32_t line;
  walk *w;
} target_match;

// Whether path ends with suffix at a path component boundary ("app/cache.rb" matches
// "/srv/app/cache.rb", not "/srv/myapp/cache.rb").
static bool path_ends_with(const char *path, size_t len, const char *suffix, size_t suffix_len) {
  if (suffix_len > len || memcmp(path + len - suffix_len, suffix, suffix_len) != 0) return false;
  return suffix_len == len || path[len - suffix_len - 1] == '/' || suffix[0] == '/';
}

static bool stack_passes(uint32_t stack_id, const target_match *m) {
  recorder *r = capture_recorder();
  uint32_t n = 0;
  const uint32_t *frame_ids = stacktab_stack(recorder_stacks(r), stack_id, &n);
  for (uint32_t k = 0; frame_ids != NULL && k < n; k++) {
    const hs_frame *frame = stacktab_frame(recorder_stacks(r), frame_ids[k]);
    if (frame == NULL || frame->line != m->line || frame->code_id == 0) continue;
    uint32_t function_id = 0, file_id = 0;
    bool is_c = false;
    names_code_info(capture_names(), frame->code_id, &function_id, &file_id, &is_c);
    size_t len = 0;
    const char *file = file_id ? strtab_get(recorder_strings(r), file_id, &len) : NULL;
    if (file != NULL && path_ends_with(file, len, m->file, m->file_len)) return true;
  }
  return false;
}

static bool collect_target(VALUE obj, uint32_t stack_id, void *data) {
  target_match *m = data;
  if (RBASIC_CLASS(obj) == 0 || !stack_passes(stack_id, m)) return true;
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

// ---- The result ----

// Objects Ruby code must never hold: those without a class (hidden strings, arrays, hashes of the VM)
// and the VM's own types. (Ours, not rb_objspace_internal_object_p, which newer Rubies may not export.)
static bool is_internal(VALUE obj) {
  if (RB_SPECIAL_CONST_P(obj)) return false;
  if (RBASIC_CLASS(obj) == 0) return true;
  switch (RB_BUILTIN_TYPE(obj)) {
    case RUBY_T_IMEMO: case RUBY_T_ICLASS: case RUBY_T_ZOMBIE: case RUBY_T_MOVED: case RUBY_T_NONE:
#ifdef T_NODE
    case RUBY_T_NODE: // (a macro guards it: newer Rubies may drop the type)
#endif
      return true;
    default:
      return false;
  }
}

static const char *internal_kind(VALUE obj) {
  switch (RB_BUILTIN_TYPE(obj)) {
    case RUBY_T_IMEMO: return "VM-internal (imemo: environment, instruction sequence, method entry...)";
    case RUBY_T_ICLASS: return "VM-internal (included module)";
    case RUBY_T_CLASS: return "VM-internal (class)";
    case RUBY_T_STRING: return "VM-internal (hidden String)";
    case RUBY_T_ARRAY: return "VM-internal (hidden Array)";
    case RUBY_T_HASH: return "VM-internal (hidden Hash)";
    default: return "VM-internal (object)";
  }
}

// [category, objects, kinds] for the path from a root to node: objects holds each hop's object, or
// nil for a VM-internal one (kinds names it: such objects must never reach Ruby code); kinds holds nil
// for ordinary objects. Longer paths keep their root and their last MAX_HOPS - 1 hops (kinds says
// where hops were left out).
static VALUE path_of(const walk *w, uint32_t node) {
  uint32_t chain[MAX_HOPS];
  int len = 0;
  bool cut = false;
  for (uint32_t n = node; n != NO_PARENT; n = w->parent[n]) {
    if (len < MAX_HOPS - 1) {
      chain[len++] = n;
    } else if (w->parent[n] == NO_PARENT) {
      chain[len++] = n;
    } else {
      cut = true;
    }
  }
  uint32_t root = chain[len - 1];
  VALUE objects = rb_ary_new_capa(len);
  VALUE kinds = rb_ary_new_capa(len);
  for (int k = len - 1; k >= 0; k--) {
    VALUE obj = w->objs[chain[k]];
    bool internal = is_internal(obj);
    rb_ary_push(objects, internal ? Qnil : obj);
    rb_ary_push(kinds, internal ? rb_str_new_cstr(internal_kind(obj)) : Qnil);
    if (cut && k == len - 1) {
      rb_ary_push(objects, Qnil);
      rb_ary_push(kinds, rb_str_new_cstr("(hops left out)"));
    }
  }
  uint8_t c = w->category[root];
  VALUE category = rb_str_new_cstr(c < w->category_count ? w->categories[c] : "(root)");
  return rb_ary_new_from_args(3, category, objects, kinds);
}

typedef struct {
  walk w;
  VALUE file, limits;
  int32_t line;
  double time_limit;
  VALUE result;
  bool gc_was_disabled;
} retainers_job;

static VALUE run_walk(VALUE arg) {
  retainers_job *job = (retainers_job *)arg;
  walk *w = &job->w;
  double started = seconds_now();
  target_match m = {RSTRING_PTR(job->file), (size_t)RSTRING_LEN(job->file), job->line, w};
  recorder_each_object(capture_recorder(), collect_target, &m);
  const char *cut_short = NULL;
  if (w->target_count > 0) {
    if (!index_targets(w)) {
      cut_short = "memory";
    } else {
      rb_objspace_reachable_objects_from_root(on_root, w);
      size_t next = 0;
      cut_short = walk_from(w, &next, started, job->time_limit);
      if (cut_short == NULL && !w->stopped && w->targets_found < w->target_count) {
        for (size_t d = 0; d < w->deferred_count; d++) add_node(w, w->deferred[d], NO_PARENT, w->deferred_category);
        cut_short = walk_from(w, &next, started, job->time_limit);
      }
      if (w->over_nodes) cut_short = "objects";
      if (w->out_of_memory) cut_short = "memory";
    }
  }
  double walked = seconds_now() - started;
  // GC stays disabled: every object on a path is held by a Ruby array before the next one is read.
  VALUE paths = rb_ary_new();
  for (size_t t = 0; t < w->target_count; t++) {
    size_t i = find_slot(w->slots, w->slot_mask, w->objs, w->targets[t]);
    if (w->slots[i] != 0) rb_ary_push(paths, path_of(w, w->slots[i] - 1));
  }
  VALUE result = rb_hash_new();
  rb_hash_aset(result, ID2SYM(rb_intern("paths")), paths);
  rb_hash_aset(result, ID2SYM(rb_intern("targets")), SIZET2NUM(w->target_count));
  rb_hash_aset(result, ID2SYM(rb_intern("visited")), SIZET2NUM(w->count));
  rb_hash_aset(result, ID2SYM(rb_intern("seconds")), DBL2NUM(walked));
  rb_hash_aset(result, ID2SYM(rb_intern("cut_short")), cut_short ? ID2SYM(rb_intern(cut_short)) : Qnil);
  rb_hash_aset(result, ID2SYM(rb_intern("table_bytes")), SIZET2NUM(w->capacity * BYTES_PER_NODE));
  job->result = result;
  return Qnil;
}

static VALUE finish_walk(VALUE arg) {
  retainers_job *job = (retainers_job *)arg;
  free(job->w.objs);
  free(job->w.parent);
  free(job->w.category);
  free(job->w.slots);
  free(job->w.targets);
  free(job->w.target_slots);
  free(job->w.deferred);
  if (!job->gc_was_disabled) rb_gc_enable();
  return Qnil;
}

// Native._retainers(file, line, max_targets, time_limit, max_bytes) -> {paths:, targets:, visited:,
// seconds:, cut_short:, table_bytes:}. Raises Heapscope::Error-free: NoMemoryError only when not even
// the first tables fit.
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
  w->capacity = 4096;
  w->slot_mask = 8192 - 1;
  w->target_capacity = NUM2SIZET(max_targets);
  if (w->target_capacity == 0) w->target_capacity = 1;
  w->objs = malloc(w->capacity * sizeof(VALUE));
  w->parent = malloc(w->capacity * sizeof(uint32_t));
  w->category = malloc(w->capacity);
  w->slots = calloc(w->slot_mask + 1, sizeof(uint32_t));
  w->targets = malloc(w->target_capacity * sizeof(VALUE));
  if (!w->objs || !w->parent || !w->category || !w->slots || !w->targets) {
    job.gc_was_disabled = true; // nothing to re-enable yet
    finish_walk((VALUE)&job);
    rb_raise(rb_eNoMemError, "heapscope: not enough memory to walk the heap");
  }
  // Disabling finishes a GC in progress first; from here no GC runs until finish_walk.
  job.gc_was_disabled = RTEST(rb_gc_disable());
  rb_ensure(run_walk, (VALUE)&job, finish_walk, (VALUE)&job);
  return job.result;
}

void retainers_define(VALUE mNative) {
  rb_define_singleton_method(mNative, "_retainers", native_retainers, 5);
}
#else
void retainers_define(VALUE mNative) { (void)mNative; }
#endif
