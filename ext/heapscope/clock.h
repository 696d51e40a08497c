// clock: monotonic nanoseconds, the one clock heapscope measures its own work, gaps and deadlines on
// (it never jumps with the wall clock). Any thread, any context: no Ruby, nothing allocated.
#ifndef HEAPSCOPE_CLOCK_H
#define HEAPSCOPE_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t clock_monotonic_nanos(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif
