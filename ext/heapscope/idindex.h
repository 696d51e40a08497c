// idindex: a small open-addressing index from a 32-bit hash to a 32-bit id.
//
// The interning tables (strings, frames, stacks, the frame-name cache, the allocation counters) keep
// their entries in plain arrays addressed by id; this index only answers "which id holds this key?".
// Equality is the caller's business (a callback comparing the stored entry with the probe key), so one
// index serves every table. Linear probing with backward-shift deletion: no tombstones, so a table that
// churns (stacks die and are reborn) never degrades.
//
// Pure C: no Ruby headers, no raising. Not thread-safe: callers hold the GVL or own the table.
#ifndef HEAPSCOPE_IDINDEX_H
#define HEAPSCOPE_IDINDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Id 0 means "no entry" everywhere in heapscope; indexes never store it.
#define IDINDEX_NONE 0u

typedef struct {
  uint32_t hash;
  uint32_t id; // IDINDEX_NONE = empty slot
} idindex_slot;

typedef struct {
  idindex_slot *slots;
  uint32_t mask; // capacity - 1 (capacity is a power of two)
  uint32_t count;
} idindex;

// Compares the entry stored under id with key; ctx is the owning table.
typedef bool (*idindex_equal_fn)(const void *ctx, uint32_t id, const void *key);

// Initialises an empty index. Returns false when memory is short (the index is then empty but usable:
// the first insert tries again).
bool idindex_init(idindex *index, uint32_t initial_capacity);
void idindex_free(idindex *index);

// Returns the id whose entry equals key, or IDINDEX_NONE. Never allocates.
uint32_t idindex_find(const idindex *index, uint32_t hash, idindex_equal_fn equal, const void *ctx, const void *key);

// Adds id under hash (the caller checked it is absent). Grows the index at 3/4 load.
// Returns false, leaving the index unchanged, when growing needs memory that is not there.
bool idindex_insert(idindex *index, uint32_t hash, uint32_t id) __attribute__((warn_unused_result));

// Removes id (stored under hash). Returns false when it was not there. Never allocates.
bool idindex_remove(idindex *index, uint32_t hash, uint32_t id);

size_t idindex_memory(const idindex *index);

// A fast, well-mixed hash of a byte string (8 bytes a step). Used by every interning table so the
// same key always lands in the same place.
uint32_t idindex_hash_bytes(const void *bytes, size_t len);

#endif
