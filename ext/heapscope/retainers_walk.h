#ifndef HEAPSCOPE_RETAINERS_WALK_H
#define HEAPSCOPE_RETAINERS_WALK_H

// The retainers walk's state, shared by retainers.c (the walk) and retainers_paths.c (the result).
// Internal to those two files: retainers.h is the contract.
//
// NOTE: GVL held throughout. retainers_pace may let other threads run and may raise (Thread#raise).

#include <ruby.h>
#include <stdbool.h>
#include <stdint.h>

#include "edge_names.h"

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
  // retainers_build_paths's tables, one entry per target; kept here so finish_walk frees them when
  // building the paths raises (an interrupt between parents, NoMemoryError from a path's Array).
  uint32_t (*path_chains)[MAX_HOPS];
  int *path_lengths;
  bool *path_cuts;
} retainers_job;

// The node number + 1 of obj if the walk reached it, else 0.
uint32_t retainers_node_of(const walk *w, VALUE obj);
// "time" past the time limit, else NULL; past a slice, lets other threads run first.
const char *retainers_pace(retainers_job *job);
// Objects Ruby code must never hold (no class, or a VM type).
bool retainers_is_internal(VALUE obj);
// Names the edges of the paths to the targets reached and pushes the paths onto paths. "time" or
// "memory" when the naming was cut short (some edges unnamed), else NULL.
const char *retainers_build_paths(retainers_job *job, VALUE paths);

#endif
