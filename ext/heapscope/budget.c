#include "budget.h"

void budget_init(budget *b, double max_overhead, uint32_t base_every, uint64_t now) {
  *b = (budget){
    .max_overhead = max_overhead,
    .base_every = base_every,
    .current_every = base_every,
    .max_every = base_every,
    .window_start = now,
  };
}

bool budget_spend(budget *b, uint64_t spent, uint64_t now) {
  b->window_spent += spent;
  b->total_spent += spent;
  if (now < b->window_start + BUDGET_WINDOW_NANOS) return false;
  b->last_overhead = (double)b->window_spent / (double)(now - b->window_start);
  b->window_start = now;
  b->window_spent = 0;
  if (b->max_overhead <= 0) return false;

  uint64_t every = b->current_every;
  uint64_t ceiling = (uint64_t)b->base_every * BUDGET_MAX_FACTOR;
  if (b->last_overhead > b->max_overhead && every * 2 <= ceiling && every * 2 <= UINT32_MAX) {
    every *= 2; // over budget: half as many samples
  } else if (b->last_overhead < b->max_overhead / 4 && every > b->base_every) {
    every /= 2; // well under (with doubled rate we would still be under half the budget)
    if (every < b->base_every) every = b->base_every;
  }
  if (every == b->current_every) return false;
  b->current_every = (uint32_t)every;
  if (b->current_every > b->max_every) b->max_every = b->current_every;
  b->adjustments++;
  return true;
}
