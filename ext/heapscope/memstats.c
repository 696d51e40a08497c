#include "memstats.h"

#ifdef HAVE_MALLINFO2
#include <malloc.h>
#endif

bool memstats_read_malloc(memstats_malloc *out) {
#ifdef HAVE_MALLINFO2
  struct mallinfo2 info = mallinfo2();
  // Another allocator preloaded (jemalloc, ASan's) leaves glibc's arenas empty: its figures would
  // read as zero, which is not the truth but "unknown".
  if (info.arena == 0 && info.hblkhd == 0) return false;
  out->arena = (uint64_t)info.arena;
  out->mmapped = (uint64_t)info.hblkhd;
  out->in_use = (uint64_t)info.uordblks + (uint64_t)info.hblkhd;
  out->free = (uint64_t)info.fordblks;
  out->releasable = (uint64_t)info.keepcost;
  return true;
#else
  (void)out;
  return false;
#endif
}
