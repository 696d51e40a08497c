#ifndef HEAPSCOPE_RETAINERS_H
#define HEAPSCOPE_RETAINERS_H

// retainers: who keeps a site's sampled objects alive. A breadth-first walk of the object graph from
// the VM's roots (rb_objspace_reachable_objects_from_root, then rb_objspace_reachable_objects_from
// for each object reached) records each object's parent, so the shortest path from a root to each
// target is read back by following parents; edge_names.c names the edges of the paths found, and
// lib/heapscope/retainers.rb renders them.
//
// NOTE: GVL held, never inside a GC. The walk allocates no Ruby object (its tables are malloc'd) and
//       calls no Ruby method. It runs in slices (about 20 ms; 100 ms while the application's threads
//       keep the GVL for long) and lets other threads run between them, never in the middle of one
//       object's children or one container's reading. Meanwhile a hidden object marks and pins every
//       VALUE the walk holds, so a GC or a compaction other threads run frees or moves none of them.
//       VM-internal objects (no class: environments, instruction sequences, hidden strings) never
//       reach Ruby code: a path shows them by type only.
// NOTE: may raise between slices (Thread#raise, Thread#kill reach the walking thread there); its
//       tables are freed whatever happens.
// NOTE: bounded: it stops at a time limit (wall time, naming included) or a node limit and says so;
//       memory is about 21-29 bytes per object kept (Strings, Floats and Bignums holding nothing else
//       are not kept).

#include <ruby.h>

// Defines Heapscope::Native._retainers (see retainers.c) under mNative, where this Ruby exports the
// walk's functions (extconf.rb probes them); elsewhere defines nothing (Heapscope.retainers says so).
void retainers_define(VALUE mNative);

#endif
