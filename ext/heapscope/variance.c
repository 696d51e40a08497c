#include "variance.h"

void cluster_sums_close(cluster_sums *s, double allocations) {
  if (!s->has_current) return;
  double w = s->current;
  s->total += w;
  s->squares += w * w;
  s->cross += w * allocations;
  if (s->weight > 1) s->bernoulli += w * w * (1.0 - 1.0 / (double)s->weight);
  s->has_current = false;
  s->current = 0.0;
}

void cluster_sums_finish(cluster_sums *s) { cluster_sums_close(s, s->allocations); }

void cluster_sums_add(cluster_sums *s, uint32_t window, double allocations, uint32_t weight, double value) {
  if (s->has_current && s->window != window) cluster_sums_finish(s);
  if (!s->has_current) {
    s->has_current = true;
    s->window = window;
    s->weight = weight;
  }
  s->allocations = allocations;
  s->current += value;
}

double cluster_sums_variance(const cluster_sums *s, const cluster_design *d) {
  double scale2 = d->scale * d->scale;
  if (!d->ratio) return scale2 * s->bernoulli;
  if (s->total == 0.0) return 0.0;
  // Fewer than two windows say nothing about the spread between windows: as uncertain as the estimate.
  if (d->windows < 2.0 || d->allocations <= 0.0) return scale2 * s->total * s->total;
  double r = s->total / d->allocations;
  double residuals = s->squares - 2.0 * r * s->cross + r * r * d->allocation_squares;
  if (residuals < 0.0) residuals = 0.0; // rounding: the sum of squares it stands for is >= 0
  double fpc = d->share < 1.0 ? 1.0 - d->share : 0.0;
  return scale2 * d->windows / (d->windows - 1.0) * fpc * residuals;
}
