// Unit tests for ext/heapscope/budget.c, with a fake clock: the rate halves when sampling work exceeds
// the budget over a window, doubles back when well under it, stays within [base, base * 1024], moves at
// most once per window, and never moves without a budget.
#include "../../ext/heapscope/budget.h"
#include "check.h"

static const uint64_t ms = 1000000ull;

static void test_over_budget_halves_the_rate_once_per_window(void) {
  budget b;
  budget_init(&b, 0.01, 100, 0);
  // 5% of a window spent, in small pieces: no decision before the window ends.
  for (int i = 1; i < 50; i++) CHECK(!budget_spend(&b, 100000, (uint64_t)i * ms));
  CHECK_EQ_U64(b.current_every, 100);
  CHECK(budget_spend(&b, 100000, 100 * ms));
  CHECK_EQ_U64(b.current_every, 200);
  CHECK(b.last_overhead > 0.049 && b.last_overhead < 0.051);
  // Still over budget in the next window: one more halving, not more.
  CHECK(!budget_spend(&b, 5 * ms, 150 * ms));
  CHECK(budget_spend(&b, 1 * ms, 200 * ms));
  CHECK_EQ_U64(b.current_every, 400);
  CHECK_EQ_U64(b.adjustments, 2);
  CHECK_EQ_U64(b.max_every, 400);
}

// A rate restored to the base still says how low it went: its samples weigh more, and a profile must
// not call it "lowered from 1 in 100 to 1 in 100" nor hide that it was lowered.
static void test_the_lowest_rate_is_remembered_after_the_rate_is_restored(void) {
  budget b;
  budget_init(&b, 0.01, 100, 0);
  CHECK_EQ_U64(b.max_every, 100);
  uint64_t now = 0;
  for (int w = 0; w < 3; w++) { // 5% of each window: halved three times
    now += 100 * ms;
    budget_spend(&b, 5 * ms, now);
  }
  CHECK_EQ_U64(b.current_every, 800);
  for (int w = 0; w < 6; w++) { // far under: back to the base
    now += 100 * ms;
    budget_spend(&b, 1000, now);
  }
  CHECK_EQ_U64(b.current_every, 100);
  CHECK_EQ_U64(b.max_every, 800);
}

static void test_under_budget_returns_to_the_base_rate_and_no_further(void) {
  budget b;
  budget_init(&b, 0.01, 10, 0);
  b.current_every = 80;
  uint64_t now = 0;
  for (int w = 0; w < 6; w++) {
    now += 200 * ms;
    budget_spend(&b, 1000, now); // 0.0005% of the window
  }
  CHECK_EQ_U64(b.current_every, 10);
  // Between a quarter of the budget and the budget: no change either way.
  b.current_every = 20;
  now += 100 * ms;
  CHECK(!budget_spend(&b, 500000, now)); // 0.5%
  CHECK_EQ_U64(b.current_every, 20);
}

static void test_the_rate_is_bounded(void) {
  budget b;
  budget_init(&b, 0.001, 1000, 0);
  uint64_t now = 0;
  for (int w = 0; w < 40; w++) {
    now += 100 * ms;
    budget_spend(&b, 50 * ms, now); // 50%: always over budget
  }
  CHECK_EQ_U64(b.current_every, 1000 * BUDGET_MAX_FACTOR);
  // A base near UINT32_MAX cannot overflow.
  budget_init(&b, 0.001, 3000000000u, 0);
  CHECK(!budget_spend(&b, 90 * ms, 100 * ms));
  CHECK_EQ_U64(b.current_every, 3000000000u);
}

static void test_without_a_budget_nothing_moves_but_time_is_counted(void) {
  budget b;
  budget_init(&b, 0, 1, 0);
  CHECK(!budget_spend(&b, 90 * ms, 100 * ms));
  CHECK_EQ_U64(b.current_every, 1);
  CHECK_EQ_U64(b.total_spent, 90 * ms);
  CHECK(b.last_overhead > 0.89);
}

int main(void) {
  test_over_budget_halves_the_rate_once_per_window();
  test_under_budget_returns_to_the_base_rate_and_no_further();
  test_the_rate_is_bounded();
  test_without_a_budget_nothing_moves_but_time_is_counted();
  test_the_lowest_rate_is_remembered_after_the_rate_is_restored();
  return check_report("test_budget");
}
