// ticker: the timer thread of windowed sampling. A native thread that never touches Ruby: it sleeps
// until the schedule's chain may flip (schedule.h), reads it there, which makes that the requested state
// (schedule_request), and, whenever that differs from the hook's state as capture last applied it, asks
// for a sync through the trigger callback (capture posts a postponed job: rb_postponed_job_trigger,
// which any thread may call). It asks again, at growing intervals, while the two still differ: the job
// runs at the next interrupt check of the thread Ruby flagged, and that thread may have gone to sleep
// meanwhile, with another one running.
//
// The ticker never decides anything itself: a sync applies the state requested at the ticker's last
// wake-up (windows.c), the state a sync at every interrupt check would have applied, so a job that
// comes late because the program checked no interrupts changes nothing an allocation sees (one flagged
// on a thread that went to sleep while another runs does, until a renewed request reaches the other).
// A late wake-up moves the requested state's flips (a window shorter than the delay is never
// requested), and the schedule measures the share of time that leaves (schedule_requested_share).
//
// Contract: the schedule is shared with capture under config.lock, which the ticker holds only to read
// the chain (never while sleeping). virtual_now is called with the lock held; applied and trigger
// without it, and must be async-signal-safe (an atomic load; a flag and a wake-up). One ticker per
// process; all functions are called with the GVL held (from capture) and never raise.
#ifndef HEAPSCOPE_TICKER_H
#define HEAPSCOPE_TICKER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "schedule.h"

// The first renewed request comes this long after the first one; each next one twice as long after,
// up to TICKER_MAX_RETRIGGER_NANOS (an idle process is woken rarely).
#define TICKER_RETRIGGER_NANOS 1000000ull      // 1 ms
#define TICKER_MAX_RETRIGGER_NANOS 100000000ull // 100 ms
// A request unanswered this long means the program checks no interrupts: it sleeps, waits on IO or a
// lock, or runs a long C call without a GC. The ticker then stops waking at the chain's flips (each
// wake-up costs 2-30 us of CPU: an idle process woke about 600 times a second, 1.75% of a core here)
// and reads the chain only at its renewed requests, until a sync comes or a thread takes the GVL
// (ticker_note_sync wakes it; windows.c calls it from both).
// The requested state it leaves is the chain's at moments the chain does not choose, on with the
// share's probability, as before.
#define TICKER_IDLE_NANOS 5000000ull // 5 ms

typedef struct {
  schedule *schedule;
  pthread_mutex_t *lock;
  uint64_t (*virtual_now)(void); // virtual nanoseconds (schedule.h), called with lock held
  bool (*applied)(void);         // whether the hook is on, as capture last applied it
  void (*trigger)(void);         // asks for a sync soon
} ticker_config;

typedef struct {
  uint64_t wakeups;  // times the thread woke
  uint64_t triggers; // sync requests made
  uint64_t last_trigger_nanos; // monotonic time of the last request
  uint64_t idle_spells;        // times it stopped following flips (TICKER_IDLE_NANOS)
} ticker_stats;

// Starts the thread (signals blocked in it). False when it could not be created (nothing started).
bool ticker_start(const ticker_config *config);
// A sync point ran (a job or a GC's), or a thread took the GVL (which a renewed request will flag):
// answers the requests made so far. Wakes a ticker that had stopped following the chain's flips
// (TICKER_IDLE_NANOS). Any thread, with the GVL or without, also inside a GC: no Ruby calls.
void ticker_note_sync(void);
// Stops the thread and waits for it. No-op when not running.
void ticker_stop(void);
bool ticker_running(void);
// The ticker wakes now instead of at the chain's next event as it last read it (the chain changed, as
// schedule_set_share does). Any thread that does not hold the chain's lock; a no-op when stopped.
void ticker_wake(void);
// In a forked child, where the thread does not exist: forgets it without joining (the lock is the
// caller's to reinitialise). ticker_start may then start a new one.
void ticker_forget_after_fork(void);
void ticker_get_stats(ticker_stats *stats);
// The CPU time the ticker thread has used since it started (its wake-ups: a timed wait that returns
// costs 2-30 us of CPU, most on virtual machines), 0 when it is not running. Any thread.
uint64_t ticker_cpu_nanos(void);

#endif
