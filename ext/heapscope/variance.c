#include "variance.h"

double group_sums_variance(const group_sums *s, const group_design *d, double scale) {
  double total = 0.0, allocations = 0.0;
  int groups = 0;
  for (int g = 0; g < VARIANCE_GROUPS; g++) {
    total += s->totals[g];
    allocations += d->allocations[g];
    if (d->allocations[g] > 0.0) groups++;
  }
  if (total == 0.0) return 0.0;
  // Fewer than two groups say nothing about the spread between windows: as uncertain as the estimate.
  if (groups < 2 || allocations <= 0.0) return scale * scale * total * total;
  double r = total / allocations, sum = 0.0;
  for (int g = 0; g < VARIANCE_PAIRS; g++) {
    double e0 = s->totals[g] - r * d->allocations[g];
    double e1 = s->totals[g + VARIANCE_PAIRS] - r * d->allocations[g + VARIANCE_PAIRS];
    sum += (e0 - e1) * (e0 - e1);
  }
  return scale * scale * sum;
}
