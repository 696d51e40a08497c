#ifndef HEAPSCOPE_MEMSTATS_H
#define HEAPSCOPE_MEMSTATS_H

// memstats: the C allocator's own figures, for the memory breakdown beside each profile
// (lib/heapscope/memory.rb). Pure C: no Ruby, allocates nothing, raises nothing; callable with or
// without the GVL.

#include <stdbool.h>
#include <stdint.h>

typedef struct {
  uint64_t arena;      // bytes the allocator holds from the system outside mmap'd chunks (all arenas)
  uint64_t mmapped;    // bytes in chunks it mmap'd one by one (large allocations), all in use
  uint64_t in_use;     // bytes handed out to callers: arena chunks in use plus mmapped
  uint64_t free;       // bytes free inside arenas (held, maybe resident: fragmentation)
  uint64_t releasable; // of free, the top chunk the allocator could give back with malloc_trim
} memstats_malloc;

// Fills out and returns true where the allocator is glibc's (mallinfo2, probed by extconf.rb);
// returns false, out untouched, elsewhere, and where glibc's arenas are empty because another
// allocator was preloaded. mallinfo2 walks every arena's free lists under their
// locks: its cost grows with fragmentation (bench/memory_cost.rb measures it).
bool memstats_read_malloc(memstats_malloc *out);

#endif
