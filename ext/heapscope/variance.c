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
  double r = total / allocations, residuals = 0.0;
  for (int g = 0; g < VARIANCE_GROUPS; g++) {
    double e = s->totals[g] - r * d->allocations[g];
    residuals += e * e;
  }
  double fpc = d->share < 1.0 ? 1.0 - d->share : 0.0;
  return scale * scale * (double)groups / (double)(groups - 1) * fpc * residuals;
}
