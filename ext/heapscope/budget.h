// budget: the adaptive overhead budget. It keeps the time heapscope spends sampling (capturing stacks,
// interning, recording, and its GC hook's work) under a fraction of wall time by lowering the sampling
// probability when over budget and raising it again, never above the configured rate, when well under.
//
// Estimates stay unbiased: each sample carries the weight in force when it was taken (the sampler's
// sample_every at that moment), and every allocation at that moment had the same probability.
// The rate moves by factors of two, at most once per window, so it settles instead of oscillating.
//
// Pure C, no Ruby; the caller supplies times (unit-tested with a fake clock).
#ifndef HEAPSCOPE_BUDGET_H
#define HEAPSCOPE_BUDGET_H

#include <stdbool.h>
#include <stdint.h>

// Decisions are made over windows at least this long.
#define BUDGET_WINDOW_NANOS 100000000ull // 100 ms
// The rate never drops below 1 in (base * BUDGET_MAX_FACTOR).
#define BUDGET_MAX_FACTOR 1024u

typedef struct {
  double max_overhead;     // fraction of wall time, e.g. 0.01; <= 0 disables the budget
  uint32_t base_every;     // the configured sample_every: the highest rate allowed
  uint32_t current_every;  // the rate in force
  uint64_t window_start;   // nanoseconds
  uint64_t window_spent;   // sampling nanoseconds in the current window
  double last_overhead;    // the overhead measured over the last complete window
  uint64_t total_spent;    // all sampling nanoseconds
  uint64_t adjustments;    // how many times the rate changed
  uint32_t max_every;      // the lowest rate in force since init (its largest every): a rate restored
                           // to base_every was still lowered for a while, and its samples weigh more
} budget;

void budget_init(budget *b, double max_overhead, uint32_t base_every, uint64_t now);

// Adds spent nanoseconds of sampling work at time now. Returns true when the window closed and the rate
// changed: the caller then samples at b->current_every from its next draw.
bool budget_spend(budget *b, uint64_t spent, uint64_t now);

#endif
