// Unit tests for ext/heapscope/ticker.c, with a fake capture: the ticker asks for a sync when the
// schedule's state differs from the applied one, follows the chain's flips when syncs come, backs off
// when they do not, and stops promptly.
#include "../../ext/heapscope/ticker.h"
#include "check.h"

#include <time.h>

static schedule sched;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int applied;      // what the fake capture applied (atomic)
static int follow;       // whether a trigger applies the chain's state at once, as a sync job would
static unsigned triggers; // atomic

static uint64_t monotonic(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t virtual_now(void) { return monotonic(); }
static bool applied_state(void) { return __atomic_load_n(&applied, __ATOMIC_RELAXED) != 0; }

static void trigger(void) {
  __atomic_fetch_add(&triggers, 1, __ATOMIC_RELAXED);
  if (!__atomic_load_n(&follow, __ATOMIC_RELAXED)) return;
  pthread_mutex_lock(&lock);
  bool on = schedule_requested(&sched); // as a sync job applies it while the ticker runs (windows.c)
  pthread_mutex_unlock(&lock);
  __atomic_store_n(&applied, on ? 1 : 0, __ATOMIC_RELAXED);
  ticker_note_sync();
}

static void sleep_ms(long ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static const ticker_config config = {
  .schedule = &sched, .lock = &lock, .virtual_now = virtual_now, .applied = applied_state, .trigger = trigger,
};

// A fresh chain at `share`, nothing applied, and the ticker started; syncs come when `syncs_come`.
static void start_at(double share, uint32_t every, uint64_t seed, int syncs_come) {
  pthread_mutex_lock(&lock);
  schedule_init(&sched, share, every, virtual_now(), seed);
  pthread_mutex_unlock(&lock);
  applied = 0;
  follow = syncs_come;
  triggers = 0;
  CHECK(ticker_start(&config));
}

// Syncs that come: about one request per flip of the chain (a flip back before a sync needs none).
static void test_requests_follow_the_flips(void) {
  start_at(0.2, 1000, 11, 1);
  CHECK(ticker_running());
  sleep_ms(300);
  ticker_stop();
  CHECK(!ticker_running());
  pthread_mutex_lock(&lock);
  uint64_t flips = sched.flips;
  pthread_mutex_unlock(&lock);
  // 300 ms of 500 us cycles: about 1200 flips (a loaded machine wakes the thread late: fewer).
  CHECK(flips > 100);
  CHECK(triggers > 0 && triggers <= flips + 1);
  ticker_stats stats;
  ticker_get_stats(&stats);
  CHECK(stats.triggers == triggers);
  CHECK(stats.wakeups >= triggers);
}

// Syncs that never come (an idle process): requests back off, from 1 ms to 100 ms apart.
static void test_requests_back_off_while_unanswered(void) {
  start_at(1.0, 1, 5, 0); // always on: the state never flips back
  sleep_ms(400);
  ticker_stop();
  // At 0, 1, 3, 7, 15, 31, 63, 127, 227, 327 ms: about 10 (a late wake-up may lose one).
  CHECK(triggers >= 7 && triggers <= 12);
}

// An idle program (its syncs never come, at a share whose chain flips every few hundred microseconds):
// the ticker stops waking at the flips once a request has gone unanswered for TICKER_IDLE_NANOS, and
// follows them again as soon as a sync comes.
static void test_an_idle_program_is_not_woken_at_every_flip(void) {
  start_at(0.2, 1000, 13, 0);
  sleep_ms(300);
  ticker_stats idle;
  ticker_get_stats(&idle);
  pthread_mutex_lock(&lock);
  uint64_t flips = sched.flips;
  pthread_mutex_unlock(&lock);
  // About 1200 flips; wake-ups at the flips for 5 ms, then at 1, 2, 4, ... 100 ms apart: a few dozen.
  CHECK(flips > 100);
  CHECK(idle.wakeups < 60);
  CHECK(idle.idle_spells == 1);
  // Syncs come again: it follows the flips (hundreds of wake-ups in 100 ms, not one or two).
  follow = 1;
  ticker_note_sync();
  sleep_ms(100);
  ticker_stats busy;
  ticker_get_stats(&busy);
  ticker_stop();
  CHECK(busy.wakeups - idle.wakeups > 60);
}

// Stopping while the thread sleeps for long returns at once, and it can start again.
static void test_stop_is_prompt_and_restartable(void) {
  pthread_mutex_lock(&lock);
  schedule_init(&sched, 1.0, 1, virtual_now(), 5);
  pthread_mutex_unlock(&lock);
  applied = 1; // in sync: the thread sleeps up to its longest interval
  for (int i = 0; i < 3; i++) {
    CHECK(ticker_start(&config));
    sleep_ms(5);
    uint64_t before = monotonic();
    ticker_stop();
    CHECK(monotonic() - before < 50000000ull);
  }
  ticker_stop(); // stopped twice: a no-op
  CHECK(!ticker_running());
}

int main(void) {
  test_requests_follow_the_flips();
  test_requests_back_off_while_unanswered();
  test_an_idle_program_is_not_woken_at_every_flip();
  test_stop_is_prompt_and_restartable();
  return check_report("test_ticker");
}
