// variance: the sampling variance of estimates whose samples come in windows (clusters), in a form
// that stays right when a reader sums samples.
//
// The samples of one window come from one stretch of the program and live or die together: what
// matters is how a total varies from window to window, and two samples of one window (two classes
// made by one line, two gc_age buckets of one stack) are correlated, so their variances do not add.
// The schedule (schedule.h) puts two windows, drawn independently and alike, into every stratum of
// time, and numbers them 2 x stratum + 0 or 1. Groups pair them: window 0 of stratum k goes to group
// k mod 8, window 1 to group 8 + k mod 8. So groups g and g + 8 hold the same strata, each through one
// of two independent draws of the same design, and their difference has mean zero whatever the program
// does (differences between strata cancel). Every estimate is kept as its totals by group; totals add
// when samples are summed (a line, a function, a flame graph node, a delta of two snapshots of one
// process), and the variance of any such sum comes from its own totals (the paired-replicates
// estimate of a ratio estimator's variance):
//
//   estimate Y = sum over groups of Y_g;  R = Y / A;  A = sum of A_g, A_g the allocations the hook saw
//   in group g's windows;  e_g = Y_g - R A_g;
//   var(Y) = sum over pairs g = 0..7 of (e_g - e_(g+8))^2,  and Y^2 when fewer than two groups saw
//   allocations.
//
// (Two independent estimates a and b of one total, used as (a + b) / 2, have the variance var(a) / 2,
// which (a/2 - b/2)^2 estimates without bias. A simulation of the design, live spans of 5 ms to 1 s,
// put its root mean square within 5% of the true spread.) Windows that open at GCs only (Ruby 3.1)
// keep the number of the schedule's window they opened in, so the pairing holds there too.
//
// Always-on sampling draws every allocation on its own: each sample is its own cluster, and the
// Horvitz-Thompson (Bernoulli) variance w^2 (1 - 1/w) per sample adds (0 when w is 1: exact).
//
// Pure C, no Ruby: unit-tested on its own (test/c/test_variance.c). Never allocates.
#ifndef HEAPSCOPE_VARIANCE_H
#define HEAPSCOPE_VARIANCE_H

#include <stdint.h>

enum { VARIANCE_GROUPS = 16 };

enum { VARIANCE_PAIRS = VARIANCE_GROUPS / 2 };

// The group of window number `window` (0..VARIANCE_GROUPS-1): its stratum's number mod 8, plus 8 for a
// stratum's second window. Fixed, so a window keeps its group in every snapshot.
static inline uint32_t variance_group(uint32_t window) {
  return ((window >> 1) % VARIANCE_PAIRS) + (window & 1u) * VARIANCE_PAIRS;
}

// A value's weighted totals by group. Zero-initialised = empty. (float: a total is read only to
// about 1e-7 of itself, far below any sampling error, and sums are kept for every site and group.)
typedef struct {
  float totals[VARIANCE_GROUPS];
} group_sums;

static inline void group_sums_add(group_sums *s, uint32_t window, double value) {
  s->totals[variance_group(window)] += (float)value;
}

// The sampling design: the allocations the hook saw in each group's windows. (Paired independent
// replicates need no finite-population correction, so the share is not part of it.)
typedef struct {
  double allocations[VARIANCE_GROUPS];
} group_design;

// Counts a window in which the hook saw `allocations` allocations.
static inline void group_design_add_window(group_design *d, uint32_t window, double allocations) {
  d->allocations[variance_group(window)] += allocations;
}

// The variance of scale x (the sum of s's totals), by the formula above. >= 0.
double group_sums_variance(const group_sums *s, const group_design *d, double scale);

// The Bernoulli variance of one always-on sample of `value` (weight, or weight x size) at weight.
static inline double bernoulli_variance(double value, uint32_t weight) {
  return weight > 1 ? value * value * (1.0 - 1.0 / (double)weight) : 0.0;
}

#endif
