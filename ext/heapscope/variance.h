// variance: the sampling variance of an estimate whose samples come in windows (clusters).
//
// The samples of one window come from one stretch of the program and live or die together, so a
// site's variance is computed from its per-window totals, not from its sample count:
// - windowed sampling is a ratio estimate (capture.h's weight scale): a site's estimate is
//   scale x T, T = sum over windows of W_k (the site's weighted samples in window k), and its variance
//   scale^2 x n/(n-1) x (1 - share) x sum over all n windows of (W_k - R a_k)^2, R = T / sum a_k, a_k the
//   allocations the hook saw in window k (a window without the site has W_k = 0 and still counts);
// - always-on sampling draws each allocation on its own: each sample is its own cluster, and the
//   Horvitz-Thompson (Bernoulli) variance is the sum of w^2 (1 - 1/w) per sample, 0 when w is 1.
// A site's accumulators need the windows' a_k only for windows it has samples in; the design's sums
// cover every window.
//
// Pure C, no Ruby: unit-tested on its own (test/c/test_variance.c). Never allocates.
#ifndef HEAPSCOPE_VARIANCE_H
#define HEAPSCOPE_VARIANCE_H

#include <stdbool.h>
#include <stdint.h>

// One site's sums, by window. Zero-initialised = empty.
typedef struct {
  uint32_t window;       // the window `current` belongs to (valid when has_current)
  bool has_current;
  uint32_t weight;       // the current window's sample weight (for the Bernoulli term)
  double allocations;    // the current window's a_k, as known
  double current;        // the site's weighted total in the current window so far
  double total;          // sum of W_k over closed windows
  double squares;        // sum of W_k^2
  double cross;          // sum of W_k a_k
  double bernoulli;      // sum of W_k^2 (1 - 1/weight)
} cluster_sums;

// The sampling design's totals over every window (what all sites share).
typedef struct {
  bool ratio;         // windowed: a ratio estimate; else each sample is its own cluster
  double scale;       // the weight scale every estimate was multiplied by
  double share;       // the share of windows sampled (the finite-population correction), < 1
  double windows;     // n
  double allocations; // sum of a_k
  double allocation_squares; // sum of a_k^2
} cluster_design;

// Adds value (a sample's weight, or weight x size) taken in window, whose a_k is allocations (as known
// when added: the last one added for a window wins), at weight. A new window closes the current one.
void cluster_sums_add(cluster_sums *s, uint32_t window, double allocations, uint32_t weight, double value);
// Closes the current window, if any, with a_k = allocations.
void cluster_sums_close(cluster_sums *s, double allocations);
// Closes the current window, if any, at the a_k it was added with.
void cluster_sums_finish(cluster_sums *s);
// The variance of scale x (the site's total), from finished sums. >= 0.
double cluster_sums_variance(const cluster_sums *s, const cluster_design *design);

#endif
