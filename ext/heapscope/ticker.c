#include "ticker.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "clock.h"

static struct {
  bool running;
  bool stopping;     // guarded by wake_lock
  bool poked;        // guarded by wake_lock: ticker_wake asked for an early wake-up
  uint64_t syncs;    // atomic: sync points so far (ticker_note_sync)
  bool idle;         // atomic: the thread follows only its renewed requests (TICKER_IDLE_NANOS)
  ticker_config config;
  pthread_t thread;
  pthread_mutex_t wake_lock; // guards stopping; the condition the thread sleeps on
  pthread_cond_t wake;
  ticker_stats stats;
} t = {.wake_lock = PTHREAD_MUTEX_INITIALIZER};

// Sleeps until monotonic time `until` or a stop. Returns false when stopping.
static bool sleep_until(uint64_t until) {
  struct timespec ts = {.tv_sec = (time_t)(until / 1000000000u), .tv_nsec = (long)(until % 1000000000u)};
  pthread_mutex_lock(&t.wake_lock);
  while (!t.stopping && !t.poked && clock_monotonic_nanos() < until) {
    if (pthread_cond_timedwait(&t.wake, &t.wake_lock, &ts) == ETIMEDOUT) break;
  }
  t.poked = false;
  bool go_on = !t.stopping;
  pthread_mutex_unlock(&t.wake_lock);
  return go_on;
}

// The next renewed request's distance: twice the last, at most TICKER_MAX_RETRIGGER_NANOS.
static uint64_t backed_off(uint64_t interval) {
  return interval * 2 > TICKER_MAX_RETRIGGER_NANOS ? TICKER_MAX_RETRIGGER_NANOS : interval * 2;
}

static void *run(void *unused) {
  (void)unused;
#ifdef __linux__
  // The default 50 us timer slack would lengthen every period: windows are about 100 us.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
#endif
  const ticker_config *c = &t.config;
  bool requested = false;       // a request is out for `requested_state`
  bool requested_state = false;
  bool unanswered = false;      // a request is out and no sync point has run since
  uint64_t asked_syncs = 0, unanswered_since = 0;
  uint64_t next_request = 0, interval = TICKER_RETRIGGER_NANOS;
  do {
    t.stats.wakeups++;
    pthread_mutex_lock(c->lock);
    uint64_t now_virtual = c->virtual_now();
    bool on = schedule_request(c->schedule, now_virtual);
    uint64_t next_event = schedule_next_event(c->schedule);
    pthread_mutex_unlock(c->lock);

    uint64_t now = clock_monotonic_nanos();
    if (unanswered && __atomic_load_n(&t.syncs, __ATOMIC_SEQ_CST) != asked_syncs) unanswered = false;
    bool idle = unanswered && now - unanswered_since >= TICKER_IDLE_NANOS;
    bool was_idle = __atomic_load_n(&t.idle, __ATOMIC_RELAXED);
    __atomic_store_n(&t.idle, idle, __ATOMIC_SEQ_CST);
    // A sync that came just before the store saw no idle ticker to wake: look again after it (with
    // ticker_note_sync's increment-then-load, one of the two sees the other).
    if (idle && __atomic_load_n(&t.syncs, __ATOMIC_SEQ_CST) != asked_syncs) {
      idle = unanswered = false;
      __atomic_store_n(&t.idle, false, __ATOMIC_SEQ_CST);
    }
    if (idle && !was_idle) t.stats.idle_spells++;
    // Virtual time runs no faster than monotonic time, so this sleep never passes the next event.
    uint64_t wait = next_event == UINT64_MAX ? TICKER_MAX_RETRIGGER_NANOS : next_event - now_virtual;
    if (on != c->applied()) {
      if (!idle && (!requested || requested_state != on)) {
        interval = TICKER_RETRIGGER_NANOS;
        next_request = now;
      }
      if (now >= next_request) {
        if (!unanswered) {
          unanswered = true;
          unanswered_since = now;
          asked_syncs = __atomic_load_n(&t.syncs, __ATOMIC_SEQ_CST);
        }
        __atomic_store_n(&t.stats.last_trigger_nanos, clock_monotonic_nanos(), __ATOMIC_RELAXED);
        c->trigger();
        t.stats.triggers++;
        requested = true;
        requested_state = on;
        next_request = now + interval;
        interval = backed_off(interval);
      }
      if (next_request - now < wait) wait = next_request - now;
    } else {
      requested = false;
    }
    if (idle) {
      // Not at the flips: at the renewed requests' moments only, reading the chain there.
      if (now >= next_request) {
        next_request = now + interval;
        interval = backed_off(interval);
      }
      wait = next_request - now;
    }
    if (wait > TICKER_MAX_RETRIGGER_NANOS) wait = TICKER_MAX_RETRIGGER_NANOS;
    if (!sleep_until(now + wait)) break;
  } while (true);
  return NULL;
}

bool ticker_start(const ticker_config *config) {
  if (t.running) return true;
  t.config = *config;
  t.stopping = false;
  t.poked = false;
  __atomic_store_n(&t.idle, false, __ATOMIC_RELAXED);
  memset(&t.stats, 0, sizeof t.stats);
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&t.wake, &attr);
  pthread_condattr_destroy(&attr);
  // Process-directed signals must go to Ruby's threads, never to this one: blocked here, inherited.
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  int err = pthread_create(&t.thread, NULL, run, NULL);
  pthread_sigmask(SIG_SETMASK, &previous, NULL);
  if (err != 0) {
    pthread_cond_destroy(&t.wake);
    return false;
  }
  t.running = true;
  return true;
}

void ticker_stop(void) {
  if (!t.running) return;
  pthread_mutex_lock(&t.wake_lock);
  t.stopping = true;
  pthread_cond_signal(&t.wake);
  pthread_mutex_unlock(&t.wake_lock);
  pthread_join(t.thread, NULL);
  pthread_cond_destroy(&t.wake);
  t.running = false;
}

bool ticker_running(void) { return t.running; }

void ticker_note_sync(void) {
  __atomic_fetch_add(&t.syncs, 1, __ATOMIC_SEQ_CST);
  if (t.running && __atomic_load_n(&t.idle, __ATOMIC_SEQ_CST)) {
    __atomic_store_n(&t.idle, false, __ATOMIC_RELAXED); // one wake-up per spell
    ticker_wake();
  }
}

void ticker_wake(void) {
  if (!t.running) return;
  pthread_mutex_lock(&t.wake_lock);
  t.poked = true;
  pthread_cond_signal(&t.wake);
  pthread_mutex_unlock(&t.wake_lock);
}

void ticker_forget_after_fork(void) {
  t.running = false;
  t.stopping = false;
  pthread_mutex_init(&t.wake_lock, NULL);
  pthread_cond_init(&t.wake, NULL);
}

void ticker_get_stats(ticker_stats *stats) { *stats = t.stats; }

uint64_t ticker_cpu_nanos(void) {
  if (!t.running) return 0;
  clockid_t clock;
  struct timespec ts;
  if (pthread_getcpuclockid(t.thread, &clock) != 0 || clock_gettime(clock, &ts) != 0) return 0;
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
