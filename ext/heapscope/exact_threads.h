// exact_threads: the wrappers that hand every Thread and Fiber made from Ruby to the core, which records
// each one whole (alloc_hook_track_exact; the exact_threads start option).
//
// Why: a Thread's size is its VM stack (about 1 MiB), so a sample of one, standing for a thousand
// allocations, read as a thousand stacks (one Puma thread became 1000 MiB beside an RSS of 114 MiB).
// The allocation hook never samples Threads and Fibers when the run has exact_threads; these wrappers
// record the ones made by Thread.new, Thread.start, Thread.fork and Fiber.new (and their subclasses'),
// at the caller's stack, with weight 1 and no error. The rest (made by C code: an Enumerator's external
// iteration, an extension's threads) are at no site, and the census counts them in the unsampled row.
//
// The wrappers are C methods of Heapscope::ThreadWatch and Heapscope::FiberWatch, which lib/heapscope.rb
// prepends to Thread's and Fiber's singleton classes. In C, not Ruby, so that they add no Ruby frame: a
// sampled allocation inside Thread.new (exact_threads off) still takes its caller's line, not the
// wrapper's. They call super with the arguments, keywords and block as given, and record only in the
// main Ractor; they are marked Ractor-safe, so a Ractor may call Thread.new through them (heapscope is
// off then anyway: ractors.h).
//
// NOTE: Init only; the methods run with the GVL, raise only what super raises, allocate nothing of
//       their own.
#ifndef HEAPSCOPE_EXACT_THREADS_H
#define HEAPSCOPE_EXACT_THREADS_H

#include <ruby.h>

// Defines Heapscope::ThreadWatch (new, start, fork) and Heapscope::FiberWatch (new) under mHeapscope.
void exact_threads_init(VALUE mHeapscope);

#endif
