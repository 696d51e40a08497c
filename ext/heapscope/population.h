// population: which heap objects heapscope counts. The sampler draws from them (alloc_hook.c) and the
// census counts them (census.c), so a profile's samples and its exact totals cover the same objects.
//
// Header-only; needs the GVL only to be meaningful (it reads the object's header). Never allocates.
#ifndef HEAPSCOPE_POPULATION_H
#define HEAPSCOPE_POPULATION_H

#include <ruby.h>
#include <stdbool.h>

// The VM's own objects: no class (Ruby 4.0 allocates method-cache tables on the heap), instruction
// memos, include classes, parse nodes, and slots that hold no object.
static inline bool population_is_internal(VALUE obj) {
  if (RBASIC_CLASS(obj) == 0) return true;
  switch (RB_BUILTIN_TYPE(obj)) {
    case RUBY_T_IMEMO: case RUBY_T_ICLASS: case RUBY_T_NONE: case RUBY_T_ZOMBIE: case RUBY_T_MOVED:
#ifdef T_NODE
    case T_NODE:
#endif
      return true;
    default:
      return false;
  }
}

#endif
