#ifndef HEAPSCOPE_RETAINERS_H
#define HEAPSCOPE_RETAINERS_H

// retainers: who keeps a site's sampled objects alive. A breadth-first walk of the object graph from
// the VM's roots (rb_objspace_reachable_objects_from_root, then rb_objspace_reachable_objects_from
// for each object reached) records each object's parent, so the shortest path from a root to each
// target is read back by following parents. lib/heapscope/retainers.rb names the edges.
//
// NOTE: GVL held, never inside a GC. The walk allocates no Ruby object (its tables are malloc'd) and
//       runs with GC disabled, as does building the result, so no object on a path can be freed or
//       moved while it is read. VM-internal objects (no class: environments, instruction sequences,
//       hidden strings) never reach Ruby code: a path shows them by type only.
// NOTE: bounded: it stops at a time limit or a node limit and says so; memory is about 16 bytes
//       per object reached.

#include <ruby.h>

// Defines Heapscope::Native._retainers (see retainers.c) under mNative, where this Ruby exports the
// walk's functions (extconf.rb probes them); elsewhere defines nothing (Heapscope.retainers says so).
void retainers_define(VALUE mNative);

#endif
