// labels: interned label sets, the {key => value} pairs in force where a sample was taken (the request's
// endpoint, the job's class, the thread's name), so profiles can be sliced by them.
//
// A set is interned once and referred to by a 32-bit id, which each record and allocation counter
// keeps: a few bytes per record, and the allocation hook only reads an id and, for the thread label,
// extends one (labelsets_with: malloc only). Id 0 (LABELSET_NONE) is the empty set. Pairs are kept in
// a canonical order (by key id), so {a: 1, b: 2} and {b: 2, a: 1} are one set.
//
// The table is bounded: past max_sets distinct sets, a new set is mapped to its *overflow* set (the same
// keys, every value "(other)"), counted in overflowed, so a label fed unbounded values (a raw URL) costs
// bounded memory and its samples stay visible, together, in profiles. Overflow sets have a reserve of
// their own (LABELSETS_OVERFLOW_RESERVE); past that too, the set becomes LABELSET_NONE (also counted).
// Nothing is ever removed: ids stay valid for the life of the table, which outlives any one recorder
// (bindings keep one table per process, since ids sit in fiber-locals across Heapscope.stop/start).
//
// Pure C, no Ruby. Never raises. Not thread-safe: the owner holds the GVL.
#ifndef HEAPSCOPE_LABELS_H
#define HEAPSCOPE_LABELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LABELSET_NONE 0u
#define LABELS_MAX_PAIRS 16      // pairs per set
#define LABELS_MAX_LEN 256       // bytes per key or value; longer ones are cut
#define LABELSETS_OVERFLOW_RESERVE 64
#define LABELS_OTHER "(other)"

typedef struct labelsets labelsets;

typedef struct {
  uint32_t key, value; // string ids (labelsets_string)
} label_pair;

typedef struct {
  const char *key;
  size_t key_len;
  const char *value;
  size_t value_len;
} label_text;

typedef struct {
  uint64_t sets;         // distinct sets now (overflow sets included)
  uint64_t overflowed;   // interning calls answered with an overflow set (the cap was reached)
  uint64_t dropped;      // interning calls answered with LABELSET_NONE: overflow reserve full or memory short
  uint64_t memory_bytes;
  uint32_t max_sets;
} labelsets_stats;

// A new table allowing max_sets distinct sets (at least 1), or NULL when memory is short.
labelsets *labelsets_new(uint32_t max_sets);
// Frees the table. NULL is a no-op.
void labelsets_free(labelsets *t);
// Changes the cap (at least 1). Sets already interned stay, even past a lowered cap.
void labelsets_set_max(labelsets *t, uint32_t max_sets);

// The id of the set of pairs[0..n): LABELSET_NONE for n == 0. A key given twice keeps its last value.
// n > LABELS_MAX_PAIRS keeps the first LABELS_MAX_PAIRS distinct keys. Keys and values are byte strings
// (cut at LABELS_MAX_LEN); an empty key is skipped.
uint32_t labelsets_intern(labelsets *t, const label_text *pairs, uint32_t n);
// The id of set with one more pair (key, value), unless set already has key (its value then wins).
// Runs in the allocation hook: mallocs at most, never allocates Ruby objects.
uint32_t labelsets_with(labelsets *t, uint32_t set, const char *key, size_t key_len, const char *value, size_t value_len);

// The pairs of set (in canonical order) and their count; an unknown id reads as the empty set.
const label_pair *labelsets_get(const labelsets *t, uint32_t set, uint32_t *n);
// The bytes of a string id from labelsets_get (not NUL-terminated).
const char *labelsets_string(const labelsets *t, uint32_t id, size_t *len);
// The number of ids handed out so far plus one: every id is below it.
uint32_t labelsets_id_limit(const labelsets *t);

void labelsets_get_stats(const labelsets *t, labelsets_stats *stats);

#endif
