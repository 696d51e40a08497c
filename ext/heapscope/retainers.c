#include "retainers.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "capture.h"
#include "edge_names.h"
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
// The longest the walk holds the GVL at a stretch before letting other threads run (a slice).
#define SLICE_SECONDS 0.02
#define SLICE_QUANTUM 0.1
// Arrays longer than this are expanded this many elements at a time, with slices between.
#define ARRAY_CHUNK 65536
#define BYTES_PER_NODE (sizeof(VALUE) + sizeof(uint32_t) + 1 + 2 * sizeof(uint32_t))

// Nodes live in blocks that are never moved: growing adds a block instead of copying millions of
// entries in one step (a realloc of the node arrays took 17-40 ms at 1M and 2M nodes).
#define BLOCK_BITS 16
#define BLOCK_NODES ((size_t)1 << BLOCK_BITS)
typedef struct {
  VALUE objs[BLOCK_NODES];
  uint32_t parent[BLOCK_NODES];
  uint8_t category[BLOCK_NODES]; // roots: index into categories; others NOT_A_ROOT
} node_block;

#define OBJ(w, n) ((w)->blocks[(n) >> BLOCK_BITS]->objs[(n) & (BLOCK_NODES - 1)])
#define PARENT(w, n) ((w)->blocks[(n) >> BLOCK_BITS]->parent[(n) & (BLOCK_NODES - 1)])
#define CATEGORY(w, n) ((w)->blocks[(n) >> BLOCK_BITS]->category[(n) & (BLOCK_NODES - 1)])

// The walk's tables, all malloc'd. Nodes are numbered in the order they were reached (breadth
// first), so a node's parent always has a smaller number and following parents ends at a root.
typedef struct {
  node_block **blocks;
  size_t block_count, block_capacity;
  size_t count, max_nodes;
  uint32_t *slots; // open addressing over the nodes' objects: node number + 1, 0 = empty
  size_t slot_mask;
  // The table before the last growth, still being copied into slots a few entries per node added
  // (old_at: the next to copy), so no single step rehashes millions of entries. Lookups read both.
  uint32_t *old_slots;
  size_t old_mask, old_at;
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
  // Threads and Fibers reached: expanded after every other node (but before C-stack roots), since
  // what they hold includes their C stacks, scanned conservatively: a stale word on another thread's
  // stack may point at any object, even one allocated since in the same slot.
  uint32_t *stack_holders;
  size_t stack_holder_count, stack_holder_capacity;
  bool expanding_stack_holders;
  long array_at; // the next element of a big Array being expanded in chunks
  size_t leaves_seen; // objects reached but not kept (leaves: see is_leaf)
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
static uint32_t node_of(const walk *w, VALUE obj) {
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
  if (node_of(w, obj) != 0) return;
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
static bool is_leaf(VALUE obj) {
#ifdef FL_EXIVAR
  if (RB_FL_TEST_RAW(obj, FL_EXIVAR)) return false; // generic instance variables
  switch (RB_BUILTIN_TYPE(obj)) {
    case RUBY_T_STRING:
      // A heap String may share another's buffer and then references it (STR_SHARED, FL_USER2 in
      // internal/string.h on 3.1-3.4): only an embedded one, or a heap one without that flag.
      return RBASIC_CLASS(obj) == rb_cString && (!RB_FL_TEST_RAW(obj, RSTRING_NOEMBED) || !RB_FL_TEST_RAW(obj, RUBY_FL_USER2));
    case RUBY_T_FLOAT: return RBASIC_CLASS(obj) == rb_cFloat;
    case RUBY_T_BIGNUM: return RBASIC_CLASS(obj) == rb_cInteger;
    default: return false;
  }
#else
  (void)obj;
  return false;
#endif
}

static void on_child(VALUE obj, void *data) {
  walk *w = data;
  if (is_leaf(obj) && !is_target(w, obj)) {
    w->leaves_seen++;
    return;
  }
  add_node(w, obj, w->current_parent, NOT_A_ROOT);
}

static double seconds_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

// One walk's state. Held by a hidden TypedData object (walk_mark) while the walk lets other threads
// run: they may enable GC and run one (GC.start runs even while GC is disabled) or compact; every
// VALUE the walk holds is then marked and pinned, so none is freed or moved under it.
typedef struct {
  walk w;
  edge_names *names;
  VALUE file;
  int32_t line;
  double time_limit, started, slice_started, longest_slice, held;
  size_t slices;
  VALUE result;
  bool gc_was_disabled;
} retainers_job;

// An Array expanded by hand, a chunk at a time, so one huge Array does not hold the GVL for all its
// elements at once. Not one with generic instance variables (the GC's walk finds those). What the walk
// leaves out: a shared Array's hidden root buffer, whose elements are the ones read here anyway.
static bool is_big_array(VALUE obj) {
  if (!RB_TYPE_P(obj, RUBY_T_ARRAY) || RARRAY_LEN(obj) <= ARRAY_CHUNK) return false;
#ifdef FL_EXIVAR
  if (RB_FL_TEST_RAW(obj, FL_EXIVAR)) return false;
#endif
  return true;
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
static const char *pace(retainers_job *job) {
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

static bool is_internal(VALUE obj);

// Whether obj holds a C stack its marking scans conservatively (a Thread, a Fiber).
static bool holds_a_stack(VALUE obj) {
  if (!RB_TYPE_P(obj, RUBY_T_DATA) || is_internal(obj)) return false;
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
      const char *limit = pace(job);
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
      const char *limit = pace(job);
      if (limit) return limit;
    }
  }
  return walk_from(job, next);
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

// The chain of nodes from a root to node, root first. Longer chains keep their root and their last
// MAX_HOPS - 1 hops (*cut says hops were left out).
static int chain_of(const walk *w, uint32_t node, uint32_t *chain, bool *cut) {
  uint32_t reversed[MAX_HOPS];
  int len = 0;
  *cut = false;
  for (uint32_t n = node; n != NO_PARENT; n = PARENT(w, n)) {
    if (len < MAX_HOPS - 1 || PARENT(w, n) == NO_PARENT) {
      reversed[len++] = n;
    } else {
      *cut = true;
    }
  }
  for (int k = 0; k < len; k++) chain[k] = reversed[len - 1 - k];
  return len;
}

static bool is_module(VALUE obj) {
  return !is_internal(obj) && (RB_TYPE_P(obj, RUBY_T_CLASS) || RB_TYPE_P(obj, RUBY_T_MODULE));
}

// Whether obj runs code that captures variables: its children of VM-internal kinds are that code or
// those variables. (C checks: no method of obj is called.)
static bool runs_code(VALUE obj) {
  return RTEST(rb_obj_is_proc(obj)) || RTEST(rb_obj_is_method(obj)) || RTEST(rb_obj_is_kind_of(obj, rb_cBinding)) ||
         RTEST(rb_obj_is_kind_of(obj, rb_cThread));
}

// Asks edge_names for every edge the chain needs: between two ordinary objects, and from a module
// over the VM-internal table that holds its variables (Ruby 4.0) to the value, which the module names.
static bool want_edges(edge_names *names, const walk *w, const uint32_t *chain, int len, bool cut) {
  for (int k = cut ? 2 : 1; k < len; k++) {
    VALUE parent = OBJ(w, chain[k - 1]), child = OBJ(w, chain[k]);
    if (is_internal(parent)) continue;
    if (!is_internal(child)) {
      if (!edge_names_want(names, parent, child)) return false;
    } else if (is_module(parent) && k + 1 < len && !is_internal(OBJ(w, chain[k + 1]))) {
      if (!edge_names_want(names, parent, OBJ(w, chain[k + 1]))) return false;
    }
  }
  return true;
}

static void push_hop(VALUE objects, VALUE kinds, VALUE edges, VALUE obj, VALUE edge) {
  bool internal = is_internal(obj);
  rb_ary_push(objects, internal ? Qnil : obj);
  rb_ary_push(kinds, internal ? rb_str_new_cstr(internal_kind(obj)) : Qnil);
  rb_ary_push(edges, edge);
}

// [category, objects, kinds, edges] for a chain: objects holds each hop's object, or nil for a
// VM-internal one (kinds names it: such objects must never reach Ruby code); kinds holds nil for
// ordinary objects; edges[k] is what hop k - 1 holds hop k by (edge_names_get's description,
// [:captured], or nil). A module's VM-internal variable table is left out where the module names the
// value itself.
static VALUE path_of(const walk *w, const edge_names *names, const uint32_t *chain, int len, bool cut) {
  VALUE objects = rb_ary_new_capa(len + 1), kinds = rb_ary_new_capa(len + 1), edges = rb_ary_new_capa(len + 1);
  push_hop(objects, kinds, edges, OBJ(w, chain[0]), Qnil);
  if (cut) {
    rb_ary_push(objects, Qnil);
    rb_ary_push(kinds, rb_str_new_cstr("(hops left out)"));
    rb_ary_push(edges, Qnil);
  }
  for (int k = cut ? 2 : 1; k < len; k++) {
    VALUE parent = OBJ(w, chain[k - 1]), child = OBJ(w, chain[k]);
    if (cut && k == 2) parent = Qnil; // (the hop before was left out)
    VALUE edge = Qnil;
    if (parent == Qnil || is_internal(parent)) {
      edge = Qnil;
    } else if (!is_internal(child)) {
      edge = edge_names_get(names, parent, child);
    } else if (is_module(parent) && k + 1 < len && !is_internal(OBJ(w, chain[k + 1])) &&
               !NIL_P(edge = edge_names_get(names, parent, OBJ(w, chain[k + 1])))) {
      k++;
      push_hop(objects, kinds, edges, OBJ(w, chain[k]), edge);
      continue;
    } else if (runs_code(parent)) {
      edge = rb_ary_new_from_args(1, ID2SYM(rb_intern("captured")));
    }
    push_hop(objects, kinds, edges, child, edge);
  }
  uint8_t c = CATEGORY(w, chain[0]);
  VALUE category = rb_str_new_cstr(c < w->category_count ? w->categories[c] : "(root)");
  return rb_ary_new_from_args(4, category, objects, kinds, edges);
}

// Between two parents read for names: the time limit and the slices hold there too.
static bool between_parents(void *data) {
  return pace((retainers_job *)data) == NULL;
}

// Names the edges of the paths to the targets reached and builds them. Returns "time" or "memory"
// when the naming was cut short (some edges then stay unnamed), else NULL.
static const char *build_paths(retainers_job *job, VALUE paths) {
  walk *w = &job->w;
  size_t found = 0;
  uint32_t(*chains)[MAX_HOPS] = malloc((w->target_count ? w->target_count : 1) * sizeof(*chains));
  int *lengths = malloc((w->target_count ? w->target_count : 1) * sizeof(int));
  bool *cuts = malloc((w->target_count ? w->target_count : 1) * sizeof(bool));
  job->names = edge_names_new();
  const char *cut_short = NULL;
  if (chains == NULL || lengths == NULL || cuts == NULL || job->names == NULL) {
    cut_short = "memory";
  } else {
    for (size_t t = 0; t < w->target_count; t++) {
      uint32_t node = node_of(w, w->targets[t]);
      if (node == 0) continue;
      lengths[found] = chain_of(w, node - 1, chains[found], &cuts[found]);
      if (!want_edges(job->names, w, chains[found], lengths[found], cuts[found])) cut_short = "memory";
      found++;
    }
    if (!edge_names_resolve(job->names, between_parents, job)) cut_short = "time";
    // From here on nothing lets other threads run: the paths are read as the names were.
    for (size_t p = 0; p < found; p++) rb_ary_push(paths, path_of(w, job->names, chains[p], lengths[p], cuts[p]));
  }
  free(chains);
  free(lengths);
  free(cuts);
  return cut_short;
}

static VALUE run_walk(VALUE arg) {
  retainers_job *job = (retainers_job *)arg;
  walk *w = &job->w;
  job->started = job->slice_started = seconds_now();
  target_match m = {RSTRING_PTR(job->file), (size_t)RSTRING_LEN(job->file), job->line, w};
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
  const char *naming_cut = build_paths(job, paths);
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
  if (job == NULL) return;
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
