// variance: the sampling variance of estimates whose samples come in windows (clusters), in a form
// that stays right when a reader sums samples.
//
// The samples of one window come from one stretch of the program and live or die together: what
// matters is how a total varies from window to window, and two samples of one window (two classes
// made by one line, two gc_age buckets of one stack) are correlated, so their variances do not add.
// So windows are put into VARIANCE_GROUPS random groups (a fixed hash of the window's number), and
// every estimate is kept as its totals by group. Totals by group add when samples are summed (a line,
// a function, a flame graph node, a delta of two snapshots of one process), and the variance of any
// such sum comes from its own totals (the random-groups estimate of a ratio estimator's variance):
//
//   estimate Y = sum over groups of Y_g;  R = Y / A;  A = sum of A_g, A_g the allocations the hook saw
//   in group g's windows;  G = groups with A_g > 0;
//   var(Y) = G / (G - 1) x (1 - share) x sum over groups of (Y_g - R A_g)^2,  and Y^2 when G < 2.
//
// Always-on sampling draws every allocation on its own: each sample is its own cluster, and the
// Horvitz-Thompson (Bernoulli) variance w^2 (1 - 1/w) per sample adds (0 when w is 1: exact).
//
// Pure C, no Ruby: unit-tested on its own (test/c/test_variance.c). Never allocates.
#ifndef HEAPSCOPE_VARIANCE_H
#define HEAPSCOPE_VARIANCE_H

#include <stdint.h>

enum { VARIANCE_GROUPS = 16 };

// The group of a window (0..VARIANCE_GROUPS-1): a fixed hash, so a window keeps its group in every
// snapshot, and consecutive windows (one phase of the program) spread over all groups.
static inline uint32_t variance_group(uint32_t window) { return (window * 2654435761u) >> 28; }
_Static_assert(VARIANCE_GROUPS == 16, "variance_group keeps the top 4 bits");

// A value's weighted totals by group. Zero-initialised = empty. (float: a total is read only to
// about 1e-7 of itself, far below any sampling error, and sums are kept for every site and group.)
typedef struct {
  float totals[VARIANCE_GROUPS];
} group_sums;

static inline void group_sums_add(group_sums *s, uint32_t window, double value) {
  s->totals[variance_group(window)] += (float)value;
}

// The sampling design: the allocations the hook saw in each group's windows, and the share of the
// time the hook was on (the finite-population correction).
typedef struct {
  double allocations[VARIANCE_GROUPS];
  double share;
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
