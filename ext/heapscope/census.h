// census: what the VM knows exactly. At a snapshot, one walk of the whole heap counts the live objects
// and their bytes (memsize_of, slot included, as samples are measured) per builtin type and per class,
// over the same population the sampler draws from (population.h: the VM's internal objects are left
// out). A profile knows only its samples; the census is what they must add up to: readers show per
// class the exact total, the sum of the sites' estimates and the remainder no site saw, and no sample
// may stand for more than its class holds (census_bound_samples).
//
// Cost: one pass over every heap slot with the GVL held (about 15 ms per million live objects on Ruby 3.1,
// bench/census_cost.rb); Ruby's own walk (rb_objspace_each_objects) cannot be paused and resumed, so
// the pause is not sliced. The census is optional per profile (Heapscope.start(census: false)).
//
// NOTE: census_take runs under the GVL, outside any GC. It allocates no Ruby object and runs no Ruby
//       code except the dsize functions of T_DATA objects (as ObjectSpace.memsize_of does). It interns
//       class names into the recorder's strings (malloc only). It never raises: short of memory it
//       returns false and the profile goes without a census.
// NOTE: ownership: a census owns its tables; census_free releases them. The klass VALUEs it holds are
//       only read during census_take (no GC can run in the walk) and never afterwards.
#ifndef HEAPSCOPE_CENSUS_H
#define HEAPSCOPE_CENSUS_H

#include <ruby.h>
#include <stdbool.h>
#include <stdint.h>

#include "snapshot.h"
#include "strtab.h"

typedef struct {
  uint64_t objects, bytes;
  // The sum of the objects' sizes squared: sampling each object with probability 1/w, the estimate of
  // the total bytes has variance (w - 1) x sq_bytes. That is the variance the samples cannot see when a
  // class's few big objects went unsampled (their squares dominate it): readers widen the error of what
  // no site saw with it (docs/reading-profiles.md).
  double sq_bytes;
} census_total;

// One class's exact total, keyed by the string id of its name (the samples' class label). Anonymous
// classes named after one ancestor share an id and one entry.
typedef struct {
  uint32_t class_id;
  uint8_t type; // the builtin type of its first object seen (ruby_value_type)
  bool whole;   // its objects are recorded whole, never sampled (census_whole_fn said so)
  census_total total;
} census_class;

// Whether the objects of obj's class are recorded whole by the sampler (a Thread or a Fiber under
// exact_threads: alloc_hook_records_whole), asked once per class the walk meets. Must not allocate or
// raise. NULL: none are.
typedef bool (*census_whole_fn)(VALUE obj);

typedef struct {
  census_total all;
  census_total types[RUBY_T_MASK + 1];
  census_class *classes; // sorted by class_id after census_take
  size_t class_count;
  uint64_t nanos;        // how long the walk held the GVL
  uint32_t bounded_samples;
} census;

// Walks the heap (see the NOTE above). fixed_size: the size of every object when the recorder does not
// measure them (track_sizes: false), else 0. whole: which classes are recorded whole (may be NULL).
// False when memory ran short (the census is then empty).
bool census_take(census *c, strtab *strings, uint32_t fixed_size, census_whole_fn whole);
void census_free(census *c);

// The exact total of the class named by class_id, or NULL when the census saw none of its objects.
const census_total *census_class_total(const census *c, uint32_t class_id);

// Phantoms: a sample whose inuse_objects or inuse_space is over CENSUS_PHANTOM_FACTOR times its class's
// exact total gets that total instead (its variance groups scaled to match): a sampled 1 MiB Thread
// standing for a thousand allocations would otherwise read 1000 MiB beside a heap of a few. Counts them in
// c->bounded_samples. Why not cap at the total itself: where one line holds nearly all of a class, its
// estimate is above the total half the time by sampling error alone, and capping those cuts the upper
// half of the estimates: the mean of 48 windowed runs read 42% low (test_windowed_accuracy). Over 4x
// the total an estimate is wrong by far more than its spread; the readers bound every site at its
// class's total themselves, and say so (lib/heapscope/report/census.rb).
#define CENSUS_PHANTOM_FACTOR 4.0
void census_bound_samples(census *c, hs_snapshot *snapshot);

// The census as profile comment lines (docs/reading-profiles.md, "Exact totals"): a summary, one line
// per type, one per class that has a sample in snapshot plus the biggest others (up to max_others), each
// class recorded whole followed by a line "heapscope exact class: name=NAME" (a Thread subclass:
// readers cannot tell it by name; the prefix is not the census's, so older readers skip it).
// Names are looked up in strings (the snapshot's). A malloc'd NUL-terminated text, or NULL when memory
// is short.
char *census_comments(const census *c, const hs_snapshot *snapshot, const strtab *strings, size_t max_others);

#endif
