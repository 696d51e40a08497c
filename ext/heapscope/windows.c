// windows: when the allocation hook is on in windowed sampling. The schedule (schedule.h) says when it
// should be; this file applies that at the sync points it can reach: the ticker thread's postponed jobs
// (Ruby 3.3+), every GC's marking (where it also registers the GC_END_MARK hook, for that GC only), and
// every profile. It also measures what an enabled hook costs an allocation, which virtual time leaves
// out, and turns the hook-on share into the profile's weight scale (capture.h).
#include <stdio.h>
#include <stdlib.h>

#include "capture_internal.h"
#include "ticker.h"

// The weight scale's bounds (capture_weight_scale).
#define WEIGHT_SCALE_MIN 0.5
#define WEIGHT_SCALE_MAX 5.0

#ifdef MALLOC_LIMIT_GUARD
static VALUE sym_malloc_increase_bytes, sym_malloc_increase_bytes_limit;
#endif

uint64_t windows_virtual_now(void) { return capture_now_nanos() - __atomic_load_n(&own_nanos, __ATOMIC_RELAXED); }

// Adds the allocations the hook has counted down since the countdown was last loaded to those it saw
// (and to those not yet charged), so the countdown left can be kept or replaced.
static void count_seen_allocations(void) {
  uint64_t seen = cap.step - cap.countdown;
  cap.hook_allocations += seen;
  cap.uncharged_allocations += seen;
  cap.step = cap.countdown;
}

// At fixed moments of virtual time (as the schedule's retunes, so when it happens does not depend on
// the chain), at a sync point outside the GC (GC.stat is not read inside one): the share of allocations
// the hook has seen so far sets how densely windows are sampled from now on (schedule_window_every).
// Only the past decides a rate, and each sample carries the weight of the rate it was drawn at, so
// estimates stay unbiased.
static void update_density(void) {
  uint64_t now = windows_virtual_now();
  if (now < cap.next_density_check) return;
  while (cap.next_density_check <= now) cap.next_density_check += SCHEDULE_RETUNE_NANOS;
  // What the open window has seen so far counts now, so the countdown can be drawn anew.
  if (cap.window_open) count_seen_allocations();
  size_t vm = capture_vm_allocations() - cap.started_allocations;
  if (vm == 0 || cap.hook_allocations == 0) return;
  uint32_t every = cap.budget.current_every;
  uint32_t before = schedule_window_every(&sched, every, cap.seen_share);
  cap.seen_share = (double)cap.hook_allocations / (double)vm;
  // The countdown left was drawn at the old rate; a new one is drawn at the new rate (memoryless: for a
  // rate that did not change, the same law as going on).
  if (schedule_window_every(&sched, every, cap.seen_share) != before) capture_draw_countdown();
}

static void open_window(void) {
  cap.window_opened_virtual = windows_virtual_now();
  cap.window_opened_allocations = cap.hook_allocations;
  cap.window++;
  cap.window_open = true;
  __atomic_store_n(&hook_applied, 1, __ATOMIC_RELAXED);
  cap.stats.windows_opened++;
  rb_tracepoint_enable(cap.newobj_hook);
}

// Ends the current window. The countdown keeps what is left of it for the next window: its law is
// memoryless, so the next window's allocations are sampled as if this one had gone on.
static void close_window(void) {
  count_seen_allocations();
  recorder_close_window(cap.recorder, cap.window, cap.hook_allocations - cap.window_opened_allocations);
  uint64_t now = windows_virtual_now();
  cap.closed_windows_virtual += now > cap.window_opened_virtual ? now - cap.window_opened_virtual : 0;
  cap.window_open = false;
  __atomic_store_n(&hook_applied, 0, __ATOMIC_RELAXED);
  rb_tracepoint_disable(cap.newobj_hook);
  capture_charge(capture_now_nanos());
}

// A sync point: sets the hook to the schedule's requested state (schedule.h). Inside the GC the
// caller has made registering safe (it mallocs).
void windows_sync(void) {
  // Registering mallocs, which may start a GC whose marking is a sync point too: that one waits.
  if (cap.syncing) return;
  cap.syncing = true;
  // While the ticker runs, the state it requested at its last wake-up (schedule.h says why: applying the
  // chain's state at this moment would make the moments the hook changes at depend on the chain); without
  // it (Ruby 3.1, a forked child before its ticker restarts) each sync point reads the chain itself.
  pthread_mutex_lock(&sched_lock);
  bool on = ticker_running() ? schedule_requested(&sched) : schedule_request(&sched, windows_virtual_now());
  pthread_mutex_unlock(&sched_lock);
  // Under GC.stress (watched on Ruby 3.1 only) every allocation collects: a window would make every
  // one of them a sampled GC too. Windows stay shut then (a debugging mode: its allocations are missed).
  if (cap.gc_stress || cap.gc_stress_polled) on = false;
  if (cap.ractor_pause) on = false; // Ruby 3.1: a Ractor may be starting (ractors.h)
  if (on && !cap.window_open) open_window();
  else if (!on && cap.window_open) close_window();
  cap.syncing = false;
}

static ID id_stress;

void windows_sync_outside_gc(void) {
  // GC.stress makes every allocation collect (windows_sync keeps windows shut then); Ruby 3.1's
  // lib/heapscope.rb reports it, later Rubies are asked here, outside the GC.
#ifdef TICKER_SYNC
  // (Ruby 3.1 is told by lib/heapscope.rb instead; a polled value there would go stale between
  // profiles, as GCs cannot poll.)
  cap.gc_stress_polled = RTEST(rb_funcall(rb_mGC, id_stress, 0));
#endif
  if (cap.running && !cap.syncing && cap.failure == NULL) update_density(); // (a failure keeps its countdown)
  // Registering mallocs: a GC started in the middle would run its own sync and liveness pass while
  // the hook list is half changed. GC waits instead (where Ruby can disable it without finishing one).
#ifdef HAVE_RB_GC_DISABLE_NO_REST
  VALUE gc_was_disabled = rb_gc_disable_no_rest();
  windows_sync();
  if (!RTEST(gc_was_disabled)) rb_gc_enable();
#else
  windows_sync();
#endif
}

// The postponed job the ticker asks for: a sync point at an interrupt check. Its own cost is heapscope's
// time, and tells the schedule how long windows must be for syncs to stay cheap.
static void sync_job(void *unused) {
  (void)unused;
  if (!cap.running || cap.failure != NULL || !cap.config.windowed || !capture_ractor_guard()) return;
  // The ticker's jobs are where a Ractor started behind Ractor.new's back (a captured Method) shows
  // while it runs: Ractor.count, about 0.2 us, at most every ms or so.
  if (ractors_count() > 1) {
    capture_switch_off_for_ractor(true);
    return;
  }
  uint64_t started = capture_now_nanos();
  cap.stats.sync_jobs++;
  ticker_stats ts;
  ticker_get_stats(&ts);
  if (ts.last_trigger_nanos != 0 && started > ts.last_trigger_nanos) {
    uint64_t latency = started - ts.last_trigger_nanos;
    cap.stats.sync_latency_nanos += latency;
    if (latency > cap.stats.sync_latency_max_nanos) cap.stats.sync_latency_max_nanos = latency;
  }
  windows_sync_outside_gc();
  uint64_t spent = capture_now_nanos() - started;
  add_own_nanos(spent);
  pthread_mutex_lock(&sched_lock);
  schedule_note_sync_cost(&sched, (double)spent);
  pthread_mutex_unlock(&sched_lock);
}

// Starts the ticker again in a forked child (asked for from inside a GC, run at an interrupt check).
static void restart_job(void *unused) {
  (void)unused;
  if (cap.running && cap.failure == NULL && cap.config.windowed && cap.ticker_lost && capture_ractor_guard()) windows_start_ticker();
}

#ifdef TICKER_SYNC
static rb_postponed_job_handle_t sync_job_handle = POSTPONED_JOB_HANDLE_INVALID;
static rb_postponed_job_handle_t restart_job_handle = POSTPONED_JOB_HANDLE_INVALID;
static void trigger_sync(void) { rb_postponed_job_trigger(sync_job_handle); }
static bool applied_for_ticker(void) { return __atomic_load_n(&hook_applied, __ATOMIC_RELAXED) != 0; }
#endif

void windows_start_ticker(void) {
  cap.ticker_lost = false;
#ifdef TICKER_SYNC
  if (sync_job_handle == POSTPONED_JOB_HANDLE_INVALID) return;
  ticker_config tc = {
    .schedule = &sched, .lock = &sched_lock, .virtual_now = windows_virtual_now, .applied = applied_for_ticker,
    .trigger = trigger_sync,
  };
  // Without the thread windows still change at GCs: fewer of them, the same probabilities.
  if (!ticker_start(&tc)) cap.stats.ticker_failures++;
#endif
}

bool capture_windowed_supported(void) {
#if defined(HAVE_RB_GC_DISABLE_NO_REST) || RUBY_API_VERSION_CODE < 30200
  return true;
#else
  return false; // Ruby 3.2+ aborts on a malloc inside the GC, and this one cannot disable GC without finishing it
#endif
}

// Registering a hook mallocs (Ruby's hook list entry). Inside the GC that is safe only if the malloc
// cannot start another GC: Ruby 3.2+ aborts on it unless GC is disabled (register_in_gc disables it),
// and on Ruby 3.1 a malloc past the malloc limit, or any malloc under GC.stress, starts a GC, which
// inside a GC crashes ("during_gc != 0") when the GC is incremental.
static bool may_register_in_gc(void) {
#if defined(HAVE_RB_GC_DISABLE_NO_REST)
  return true;
#elif defined(MALLOC_LIMIT_GUARD)
  if (cap.gc_stress) return false;
  size_t increase = rb_gc_stat(sym_malloc_increase_bytes), limit = rb_gc_stat(sym_malloc_increase_bytes_limit);
  return increase + MALLOC_LIMIT_MARGIN < limit;
#else
  return false; // windowed sampling is not supported here (capture_windowed_supported)
#endif
}

// Inside the GC's marking, once per GC (the holder is marked by every GC, minor ones included, because
// it is not write-barrier protected): registers the GC_END_MARK hook for this GC's liveness pass, and
// is a sync point for the allocation hook. GC_END_MARK removes itself again (on_gc_end_mark).
void windows_on_gc_marking(void) {
  uint32_t gc = (uint32_t)rb_gc_count();
  if (gc == cap.last_marking_gc) return; // marked again in the same GC (incremental marking's finish)
  cap.last_marking_gc = gc;
#ifdef TICKER_SYNC
  if (cap.ticker_lost && restart_job_handle != POSTPONED_JOB_HANDLE_INVALID) rb_postponed_job_trigger(restart_job_handle);
#endif
  if (!may_register_in_gc()) {
    // No sync here then: the hook stays as it is until the next sync point (a skipped sync point does
    // not depend on the schedule, so probabilities stay as they are).
    cap.stats.gc_registrations_deferred++;
    return;
  }
#ifdef HAVE_RB_GC_DISABLE_NO_REST
  VALUE gc_was_disabled = rb_gc_disable_no_rest();
#endif
  if (!cap.gc_hook_on) {
    rb_tracepoint_enable(cap.gc_hook);
    cap.gc_hook_on = true;
  }
  windows_sync();
#ifdef HAVE_RB_GC_DISABLE_NO_REST
  if (!RTEST(gc_was_disabled)) rb_gc_enable();
#endif
}

// Registers GC_END_MARK from outside the GC, to stay until a GC_END_MARK after GC.stress is off.
void windows_keep_gc_hook_registered(void) {
  if (cap.gc_hook_on) return;
  VALUE gc_was_disabled = rb_gc_disable(); // registering mallocs, and a GC in the middle would be missed
  rb_tracepoint_enable(cap.gc_hook);
  cap.gc_hook_on = true;
  if (!RTEST(gc_was_disabled)) rb_gc_enable();
}

void capture_gc_stress_changed(bool on) {
  cap.gc_stress = on;
  // While GC.stress is on nothing is registered inside the GC, so GC_END_MARK stays registered (from
  // here, outside the GC) to keep liveness exact; on_gc_end_mark removes it once GC.stress is off.
  if (on && cap.running && cap.config.windowed) windows_keep_gc_hook_registered();
}

double capture_weight_scale_wanted(void) {
  if (!cap.running || !cap.config.windowed) return 1.0;
  capture_stats stats;
  capture_get_stats(&stats);
  // Before any window has been open, nothing was sampled: any scale will do.
  if (stats.hook_allocations == 0 || stats.vm_allocations == 0) return 1.0;
  return stats.share * (double)stats.vm_allocations / (double)stats.hook_allocations;
}

double capture_weight_scale(void) {
  double scale = capture_weight_scale_wanted();
  // Bounded, so that no sample stands for more than a few times sample_every: a run with very few
  // windows measures its realized share badly (one window at start, then none, made one Hash a third
  // of a profile). Seen in practice: 0.8-2.2 on a loaded machine, 3.2-4.7 in one-second runs on a busy
  // one (late sync jobs lose windows); beyond the bounds profiles say so (weight_scale_wanted).
  return scale < WEIGHT_SCALE_MIN ? WEIGHT_SCALE_MIN : scale > WEIGHT_SCALE_MAX ? WEIGHT_SCALE_MAX : scale;
}
static void empty_hook(VALUE tracepoint, void *unused) {
  (void)tracepoint;
  (void)unused;
}

static uint64_t time_allocations(int n) {
  uint64_t started = capture_now_nanos();
  for (int i = 0; i < n; i++) (void)rb_obj_alloc(rb_cObject);
  return capture_now_nanos() - started;
}

// What an enabled NEWOBJ hook adds to one allocation (the VM's slow path and the call), measured once
// per process: the best of a few rounds with and without an empty hook. Virtual time leaves it out
// (schedule.h). Under GC.stress every allocation collects, so a fixed estimate is used instead.
void windows_calibrate_hook_cost(void) {
  if (hook_cost_nanos >= 0.0) return;
  if (cap.gc_stress || RTEST(rb_funcall(rb_mGC, rb_intern("stress"), 0))) {
    hook_cost_nanos = 100.0;
    return;
  }
  enum { ROUNDS = 5, PER_ROUND = 2000 };
  VALUE probe = rb_tracepoint_new(0, RUBY_INTERNAL_EVENT_NEWOBJ, empty_hook, NULL);
  uint64_t off = UINT64_MAX, on = UINT64_MAX;
  for (int round = 0; round < ROUNDS; round++) {
    uint64_t t = time_allocations(PER_ROUND);
    off = t < off ? t : off;
    rb_tracepoint_enable(probe);
    t = time_allocations(PER_ROUND);
    rb_tracepoint_disable(probe);
    on = t < on ? t : on;
  }
  RB_GC_GUARD(probe);
  double cost = on > off ? (double)(on - off) / PER_ROUND : 0.0;
  hook_cost_nanos = cost > 5000.0 ? 5000.0 : cost;
}

void capture_estimate(recorder_estimate *e) {
  capture_stats stats;
  capture_get_stats(&stats);
  *e = (recorder_estimate){.scale = capture_weight_scale(), .windowed = cap.running && cap.config.windowed, .share = stats.share};
  if (e->windowed && cap.window_open) {
    e->has_open_window = true;
    e->open_window = cap.window;
    e->open_allocations = (double)(stats.hook_allocations - cap.window_opened_allocations);
  }
}

bool capture_windowed_ticker(void) {
#ifdef TICKER_SYNC
  return true;
#else
  return false;
#endif
}

void windows_init(void) {
#ifdef MALLOC_LIMIT_GUARD
  // Only the Ruby 3.1 path reads these (may_register_in_gc). The first GC.stat call with a key interns
  // Ruby's own symbols (allocating): here, not inside the GC.
  sym_malloc_increase_bytes = ID2SYM(rb_intern("malloc_increase_bytes"));
  sym_malloc_increase_bytes_limit = ID2SYM(rb_intern("malloc_increase_bytes_limit"));
  (void)rb_gc_stat(sym_malloc_increase_bytes);
  (void)rb_gc_stat(sym_malloc_increase_bytes_limit);
#endif
  id_stress = rb_intern("stress");
#ifdef TICKER_SYNC
  sync_job_handle = rb_postponed_job_preregister(0, sync_job, NULL);
  restart_job_handle = rb_postponed_job_preregister(0, restart_job, NULL);
#else
  (void)sync_job;
  (void)restart_job;
#endif
}
