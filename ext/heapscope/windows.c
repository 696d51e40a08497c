// windows.c: the sync points and hook registration (windows.h). Every decision is the plan's
// (sampling_plan.h): at a sync point it says whether the hook should be on, and this file opens or
// closes a window by enabling or disabling the NEWOBJ tracepoint.
//
// Registering a hook mallocs (Ruby's hook list entry), which inside a GC must not start another GC:
// Ruby 3.2+ aborts on any malloc during GC unless GC is disabled (rb_gc_disable_no_rest around it), and
// Ruby 3.1, which lacks that function, starts one past the malloc limit or under GC.stress
// (may_register_in_gc).
#include "windows.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <ruby/debug.h>
#include <ruby/thread.h>
#include <ruby/version.h>
#include <ruby/vm.h>

#include "ractors.h"
#include "ticker.h"

#ifdef HAVE_RB_GC_DISABLE_NO_REST
VALUE rb_gc_disable_no_rest(void); // exported, declared only in Ruby's internal headers
#endif
// Ruby 3.1 has no rb_gc_disable_no_rest: inside the GC a malloc must then stay this far below the
// malloc limit, or it would start a GC inside the GC (see may_register_in_gc).
#if !defined(HAVE_RB_GC_DISABLE_NO_REST) && RUBY_API_VERSION_CODE < 30200
#define MALLOC_LIMIT_GUARD 1
#define MALLOC_LIMIT_MARGIN (1u << 20)
#endif
// Ruby 3.3+ lets any thread ask for a postponed job (rb_postponed_job_trigger): the ticker can then open
// and close windows at interrupt checks. Ruby 3.1's registration reads the calling thread's execution
// context, which a native thread has none of, and is not safe against a flush on another thread: there,
// windows change at GCs (and profiles) only.
#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
#define TICKER_SYNC 1
#endif

static struct {
  sampling_plan *plan;
  VALUE newobj_hook, gc_hook;
  void (*ractor_alive)(void);
  recorder *recorder;     // the run's, NULL between runs
  bool active;            // between windows_start and windows_stop
  bool gc_hook_on;        // the GC_END_MARK hook is on
  bool gc_stress;         // GC.stress is on (Ruby 3.1: nothing is registered inside the GC then)
  bool gc_stress_polled;  // GC.stress was on when last asked (windows_poll_gc_stress)
  bool ticker_lost;       // a forked child: the ticker thread is to be started again
  bool syncing;           // inside sync_point (a GC it starts does not sync again)
  bool ractor_pause;      // Ruby 3.1: hooks off in a GC that may start a Ractor, until resumed
  uint32_t last_marking_gc; // rb_gc_count() of the last GC whose marking was handled
  windows_stats stats;
} win;

// The chain is shared with the ticker thread under this lock (ticker.h).
static pthread_mutex_t chain_lock = PTHREAD_MUTEX_INITIALIZER;
// Whether the NEWOBJ hook is on, for the ticker: atomic.
static int hook_applied;
// What an enabled NEWOBJ hook costs one allocation, measured once per process (calibrate_hook_cost).
static double hook_cost_nanos = -1.0;

_Static_assert(PLAN_MAX_STRETCHES <= RECORDER_MAX_STRETCHES, "the recorder keeps every stretch the plan closes");

static VALUE sym_total_allocated_objects;
#ifdef MALLOC_LIMIT_GUARD
static VALUE sym_malloc_increase_bytes, sym_malloc_increase_bytes_limit;
#endif
static ID id_stress;

uint64_t windows_vm_allocations(void) { return rb_gc_stat(sym_total_allocated_objects); }
uint64_t windows_virtual_now(void) { return plan_virtual_now(win.plan, plan_monotonic_nanos()); }

static void set_applied(bool on) { __atomic_store_n(&hook_applied, on ? 1 : 0, __ATOMIC_RELAXED); }

static void open_window(void) {
  plan_open_window(win.plan, windows_virtual_now());
  set_applied(true);
  win.stats.windows_opened++;
  rb_tracepoint_enable(win.newobj_hook);
}

// Ends the current window: the recorder counts its allocations into the window's variance group.
static void close_window(void) {
  uint64_t allocations = plan_close_window(win.plan, windows_virtual_now());
  recorder_close_window(win.recorder, win.plan->window, allocations);
  set_applied(false);
  rb_tracepoint_disable(win.newobj_hook);
  uint64_t started = plan_monotonic_nanos();
  plan_charge(win.plan, started, plan_monotonic_nanos()); // the hook's cost for the allocations it saw
}

// A sync point: sets the hook to what the plan wants now. Inside the GC the caller has made
// registering safe (it mallocs).
static void sync_point(void) {
  // Registering mallocs, which may start a GC whose marking is a sync point too: that one waits.
  if (win.syncing) return;
  win.syncing = true;
  ticker_note_sync(); // the ticker follows the flips again if it had stopped (ticker.h)
  // Under GC.stress (watched on Ruby 3.1 only) every allocation collects: a window would make every
  // one of them a sampled GC too. Windows stay shut then (a debugging mode: its allocations are missed),
  // and while a Ractor may be starting (Ruby 3.1, ractors.h).
  bool held_shut = win.gc_stress || win.gc_stress_polled || win.ractor_pause;
  pthread_mutex_lock(&chain_lock);
  bool on = plan_hook_wanted(win.plan, windows_virtual_now(), ticker_running(), held_shut);
  pthread_mutex_unlock(&chain_lock);
  if (on && !win.plan->window_open) open_window();
  else if (!on && win.plan->window_open) close_window();
  win.syncing = false;
}

#ifdef TICKER_SYNC
static VALUE call_gc_stress(VALUE unused) {
  (void)unused;
  return rb_funcall(rb_mGC, id_stress, 0);
}
#endif

int windows_poll_gc_stress(void) {
  // GC.stress makes every allocation collect (sync_point keeps windows shut then); Ruby 3.1's
  // lib/heapscope.rb reports it, later Rubies are asked here. (On 3.1 a polled value would go stale
  // between profiles, as GCs cannot poll.) The call checks interrupts: see windows.h. What a trap
  // handler raises there (Interrupt, at Ctrl-C) is caught, and handed to the caller to raise again.
  int state = 0;
#ifdef TICKER_SYNC
  VALUE stress = rb_protect(call_gc_stress, Qnil, &state);
  if (state == 0) win.gc_stress_polled = RTEST(stress);
#endif
  return state;
}

void windows_sync_outside_gc(void) {
  // A stopped run has nothing to sync (a caller may have seen it running before an interrupt).
  if (!win.active) return;
  // The density check (GC.stat is not read inside a GC); a failure keeps its countdown.
  if (win.active && !win.syncing && !win.plan->halted) {
    uint64_t now = windows_virtual_now();
    if (plan_density_due(win.plan, now)) {
      uint64_t vm = windows_vm_allocations();
      pthread_mutex_lock(&chain_lock);
      uint64_t changes = win.plan->chain.share_changes;
      plan_note_ticker_cpu(win.plan, ticker_cpu_nanos());
      plan_update_density(win.plan, now, vm);
      bool changed = win.plan->chain.share_changes != changes;
      pthread_mutex_unlock(&chain_lock);
      // A stretch due closes here, between windows, with its scale (final once the next has grown).
      uint32_t last_window;
      double scale;
      if (plan_close_stretch(win.plan, now, vm, &last_window, &scale)) recorder_close_stretch(win.recorder, last_window, scale);
      // The ticker sleeps until the old chain's next flip: the new chain's may come sooner.
      if (changed) ticker_wake();
    }
  }
  // Registering mallocs: a GC started in the middle would run its own sync and liveness pass while
  // the hook list is half changed. GC waits instead (where Ruby can disable it without finishing one).
#ifdef HAVE_RB_GC_DISABLE_NO_REST
  VALUE gc_was_disabled = rb_gc_disable_no_rest();
  sync_point();
  if (!RTEST(gc_was_disabled)) rb_gc_enable();
#else
  sync_point();
#endif
}

static bool may_act(void) { return win.active && !win.plan->halted && win.plan->windowed; }

// The postponed job the ticker asks for (sync_job, below): a sync point at an interrupt check. Its own
// cost is heapscope's time, and tells the chain how long windows must be for syncs to stay cheap.
static int sync_job_body(void) {
  // The ticker's jobs are where a Ractor started behind Ractor.new's back (a captured Method) shows
  // while it runs: without a call where the VM says it stayed single-Ractor, else Ractor.count at most
  // every 100 ms (ractors_others_alive says why).
  if (ractors_others_alive()) {
    win.ractor_alive();
    return 0;
  }
  int state = windows_poll_gc_stress();
  if (state != 0 || !may_act()) return state; // raised in, or stopped by, what ran inside the calls above
  uint64_t started = plan_monotonic_nanos();
  win.stats.sync_jobs++;
  ticker_stats ts;
  ticker_get_stats(&ts);
  if (ts.last_trigger_nanos != 0 && started > ts.last_trigger_nanos) {
    uint64_t latency = started - ts.last_trigger_nanos;
    win.stats.sync_latency_nanos += latency;
    if (latency > win.stats.sync_latency_max_nanos) win.stats.sync_latency_max_nanos = latency;
  }
  windows_sync_outside_gc();
  uint64_t spent = plan_monotonic_nanos() - started;
  plan_add_own_nanos(win.plan, spent);
  pthread_mutex_lock(&chain_lock);
  schedule_note_sync_cost(&win.plan->chain, (double)spent);
  pthread_mutex_unlock(&chain_lock);
  return 0;
}

static void sync_job(void *unused) {
  (void)unused;
  // Counting Ractors and polling GC.stress call methods. Their interrupt checks may run this job again
  // (the ticker asked meanwhile), other threads and trap handlers (which may stop or restart capture):
  // a nested job returns at once, and the body reads the run's state only after both calls.
  // What a trap handler raised inside them is raised again once the job is done with, never unwinding
  // through it (in_job would stay set, and no window would change again); Ruby's job runner decides
  // what becomes of it then, as it did before the poll caught it (not checked whether it drops it).
  static bool in_job;
  if (in_job || !may_act() || !ractors_guard()) return;
  in_job = true;
  int state = sync_job_body();
  in_job = false;
  if (state != 0) rb_jump_tag(state);
}

static void start_ticker(void);

// Starts the ticker again in a forked child (asked for from inside a GC, run at an interrupt check).
static void restart_job(void *unused) {
  (void)unused;
  if (may_act() && win.ticker_lost && ractors_guard()) start_ticker();
}

#ifdef TICKER_SYNC
static rb_postponed_job_handle_t sync_job_handle = POSTPONED_JOB_HANDLE_INVALID;
static rb_postponed_job_handle_t restart_job_handle = POSTPONED_JOB_HANDLE_INVALID;
static void trigger_sync(void) { rb_postponed_job_trigger(sync_job_handle); }
static bool applied_for_ticker(void) { return __atomic_load_n(&hook_applied, __ATOMIC_RELAXED) != 0; }

#ifdef HAVE_RB_INTERNAL_THREAD_ADD_EVENT_HOOK
// A thread took the GVL: a request left unanswered while every thread waited (flagged on one that may
// still sleep) can be answered now, so an idle ticker follows the chain again and asks anew, which
// flags the running thread. Called on the thread, GVL held or not: an atomic add, and a wake-up only
// when the ticker is idle.
static void thread_resumed(rb_event_flag_t event, const rb_internal_thread_event_data_t *data, void *unused) {
  (void)event, (void)data, (void)unused;
  ticker_note_sync();
}
#endif
#endif

static void start_ticker(void) {
  win.ticker_lost = false;
#ifdef TICKER_SYNC
  if (sync_job_handle == POSTPONED_JOB_HANDLE_INVALID) return;
  ticker_config tc = {
    .schedule = &win.plan->chain, .lock = &chain_lock, .virtual_now = windows_virtual_now, .applied = applied_for_ticker,
    .trigger = trigger_sync,
  };
  // Without the thread windows still change at GCs: fewer of them, the same probabilities.
  if (!ticker_start(&tc)) win.stats.ticker_failures++;
#ifdef HAVE_RB_INTERNAL_THREAD_ADD_EVENT_HOOK
  // Once per process, never removed (removing one while threads switch is racy on some Rubies).
  static bool resume_hook_added;
  if (!resume_hook_added) {
    resume_hook_added = rb_internal_thread_add_event_hook(thread_resumed, RUBY_INTERNAL_THREAD_EVENT_RESUMED, NULL) != NULL;
  }
#endif
#endif
}

bool windows_supported(void) {
#if defined(HAVE_RB_GC_DISABLE_NO_REST) || RUBY_API_VERSION_CODE < 30200
  return true;
#else
  return false; // Ruby 3.2+ aborts on a malloc inside the GC, and this one cannot disable GC without finishing it
#endif
}

bool windows_ticker(void) {
#ifdef TICKER_SYNC
  return true;
#else
  return false;
#endif
}

// Registering a hook mallocs (Ruby's hook list entry). Inside the GC that is safe only if the malloc
// cannot start another GC: Ruby 3.2+ aborts on it unless GC is disabled (windows_on_gc_marking disables
// it), and on Ruby 3.1 a malloc past the malloc limit, or any malloc under GC.stress, starts a GC, which
// inside a GC crashes ("during_gc != 0") when the GC is incremental.
static bool may_register_in_gc(void) {
#if defined(HAVE_RB_GC_DISABLE_NO_REST)
  return true;
#elif defined(MALLOC_LIMIT_GUARD)
  if (win.gc_stress) return false;
  size_t increase = rb_gc_stat(sym_malloc_increase_bytes), limit = rb_gc_stat(sym_malloc_increase_bytes_limit);
  return increase + MALLOC_LIMIT_MARGIN < limit;
#else
  return false; // windowed sampling is not supported here (windows_supported)
#endif
}

// Once per GC (the holder is marked by every GC, minor ones included, because it is not write-barrier
// protected). GC_END_MARK removes itself again (windows_gc_end_mark_done).
void windows_on_gc_marking(void) {
  if (!win.plan->windowed || win.ractor_pause) return;
  uint32_t gc = (uint32_t)rb_gc_count();
  if (gc == win.last_marking_gc) return; // marked again in the same GC (incremental marking's finish)
  win.last_marking_gc = gc;
#ifdef TICKER_SYNC
  if (win.ticker_lost && restart_job_handle != POSTPONED_JOB_HANDLE_INVALID) rb_postponed_job_trigger(restart_job_handle);
#endif
  if (!may_register_in_gc()) {
    // No sync here then: the hook stays as it is until the next sync point (a skipped sync point does
    // not depend on the chain, so probabilities stay as they are).
    win.stats.gc_registrations_deferred++;
    return;
  }
#ifdef HAVE_RB_GC_DISABLE_NO_REST
  VALUE gc_was_disabled = rb_gc_disable_no_rest();
#endif
  if (!win.gc_hook_on) {
    rb_tracepoint_enable(win.gc_hook);
    win.gc_hook_on = true;
  }
  sync_point();
#ifdef HAVE_RB_GC_DISABLE_NO_REST
  if (!RTEST(gc_was_disabled)) rb_gc_enable();
#endif
}

void windows_gc_end_mark_done(void) {
  // Windowed: registered for this GC only (windows_on_gc_marking). Ruby removes it once the hook returns.
  if (win.plan->windowed && !win.gc_stress) {
    rb_tracepoint_disable(win.gc_hook);
    win.gc_hook_on = false;
  }
}

// Registers GC_END_MARK from outside the GC, to stay until a GC_END_MARK after GC.stress is off.
static void keep_gc_hook_registered(void) {
  if (win.gc_hook_on) return;
  VALUE gc_was_disabled = rb_gc_disable(); // registering mallocs, and a GC in the middle would be missed
  rb_tracepoint_enable(win.gc_hook);
  win.gc_hook_on = true;
  if (!RTEST(gc_was_disabled)) rb_gc_enable();
}

void windows_gc_stress_changed(bool on) {
  win.gc_stress = on;
  // While GC.stress is on nothing is registered inside the GC, so GC_END_MARK stays registered (from
  // here, outside the GC) to keep liveness exact; windows_gc_end_mark_done removes it once it is off.
  if (on && win.active && win.plan->windowed) keep_gc_hook_registered();
}

static void disable_if_enabled(VALUE tracepoint) {
  if (RTEST(rb_tracepoint_enabled_p(tracepoint))) rb_tracepoint_disable(tracepoint);
}

// Removing hooks mallocs nothing (Ruby frees the entries), so it is safe inside the GC. A window open
// now stays accounted for: sync_point closes it (ractor_pause keeps it closed).
void windows_pause_for_ractor(void) {
  win.ractor_pause = true;
  if (win.plan->windowed) sync_point();
  disable_if_enabled(win.newobj_hook);
  disable_if_enabled(win.gc_hook);
  win.gc_hook_on = false;
  plan_stop(win.plan);
  set_applied(false);
  win.stats.ractor_pauses++;
}

// Outside the GC: no Ractor came after all (another C-API GC), so the hooks go back as they were.
void windows_resume_after_ractor(void) {
  win.ractor_pause = false;
  if (win.plan->windowed) {
    if (win.gc_stress) keep_gc_hook_registered();
    windows_sync_outside_gc();
    return;
  }
  VALUE gc_was_disabled = rb_gc_disable(); // a GC between the two would have half the hooks
  rb_tracepoint_enable(win.gc_hook);
  rb_tracepoint_enable(win.newobj_hook);
  win.gc_hook_on = true;
  if (!RTEST(gc_was_disabled)) rb_gc_enable();
}

bool windows_paused_for_ractor(void) { return win.ractor_pause; }

// Outside the GC. Swaps the hook in place: enabled now (a window open, or always mode), the new one is
// enabled before the old one goes, with the GC held off so that no GC sees neither.
void windows_set_newobj_hook(VALUE newobj_hook) {
  if (newobj_hook == win.newobj_hook) return;
  VALUE old = win.newobj_hook;
  win.newobj_hook = newobj_hook;
  if (!win.active || !RTEST(rb_tracepoint_enabled_p(old))) return;
  VALUE gc_was_disabled = rb_gc_disable();
  rb_tracepoint_enable(newobj_hook);
  rb_tracepoint_disable(old);
  if (!RTEST(gc_was_disabled)) rb_gc_enable();
}

void windows_start(recorder *r, VALUE newobj_hook, const plan_config *config, uint64_t seed) {
  win.newobj_hook = newobj_hook;
  pthread_mutex_lock(&chain_lock);
  plan_note_ticker_cpu(win.plan, ticker_cpu_nanos()); // 0 unless a ticker still runs
  plan_start(win.plan, config, plan_monotonic_nanos(), windows_vm_allocations(), seed);
  pthread_mutex_unlock(&chain_lock);
  win.recorder = r;
  win.ticker_lost = false;
  win.syncing = false;
  win.ractor_pause = false; // gc_stress_polled stays as polled just before (capture_poll_ruby)
  win.last_marking_gc = (uint32_t)rb_gc_count();
  memset(&win.stats, 0, sizeof win.stats);
  win.active = true;
  if (win.plan->windowed) {
    // Windows open and close at sync points: now, at GCs (which also register GC_END_MARK each time)
    // and at the ticker's jobs.
    win.gc_hook_on = false;
    if (win.gc_stress) keep_gc_hook_registered(); // see windows_gc_stress_changed
    windows_sync_outside_gc();
    start_ticker();
  } else {
    rb_tracepoint_enable(win.gc_hook);
    rb_tracepoint_enable(win.newobj_hook);
    win.gc_hook_on = true;
  }
}

void windows_stop(void) {
  if (!win.active) return;
  ticker_stop();
  disable_if_enabled(win.newobj_hook);
  disable_if_enabled(win.gc_hook);
  win.gc_hook_on = false;
  plan_stop(win.plan);
  set_applied(false);
  win.active = false;
  win.recorder = NULL;
}

void windows_get_stats(windows_stats *stats) {
  *stats = win.stats;
  ticker_stats ts;
  ticker_get_stats(&ts);
  stats->ticker_wakeups = ts.wakeups;
  stats->ticker_triggers = ts.triggers;
  stats->ticker_cpu_nanos = ticker_cpu_nanos();
  stats->ticker_idle_spells = ts.idle_spells;
}

void windows_chain_stats(double *share, double *mean_window_nanos, uint64_t *flips, double *requested_share) {
  pthread_mutex_lock(&chain_lock);
  *share = win.plan->chain.share;
  *requested_share = win.active && win.plan->windowed ? schedule_requested_share(&win.plan->chain, windows_virtual_now()) : 1.0;
  *mean_window_nanos = win.plan->chain.mean_on_nanos;
  *flips = win.plan->chain.flips;
  pthread_mutex_unlock(&chain_lock);
}

static void empty_hook(VALUE tracepoint, void *unused) {
  (void)tracepoint;
  (void)unused;
}

static uint64_t time_allocations(int n) {
  uint64_t started = plan_monotonic_nanos();
  for (int i = 0; i < n; i++) (void)rb_obj_alloc(rb_cObject);
  return plan_monotonic_nanos() - started;
}

// What an enabled NEWOBJ hook adds to one allocation (the VM's slow path and the call), measured once
// per process: the best of a few rounds with and without an empty hook. Virtual time leaves it out
// (sampling_plan.h). Under GC.stress every allocation collects, so a fixed estimate is used instead.
static void calibrate_hook_cost(void) {
  if (hook_cost_nanos >= 0.0) return;
  if (win.gc_stress || RTEST(rb_funcall(rb_mGC, rb_intern("stress"), 0))) {
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

// Around fork: the chain's lock must not be held by the ticker in the child, which has no ticker.
static void lock_before_fork(void) { pthread_mutex_lock(&chain_lock); }
static void unlock_in_parent(void) { pthread_mutex_unlock(&chain_lock); }
static void reset_in_child(void) {
  pthread_mutex_unlock(&chain_lock); // held by this thread, the only one left
  // The child keeps its records (those objects are alive in it too) but must not draw the same
  // sample positions as its parent. No I/O here: only async-signal-safe calls are allowed after fork.
  plan_reseed(win.plan, ((uint64_t)getpid() << 17) ^ plan_monotonic_nanos());
  if (ticker_running()) {
    ticker_forget_after_fork();
    win.ticker_lost = win.active;
  }
}

static void stop_ticker_at_exit(ruby_vm_t *vm) {
  (void)vm;
  ticker_stop();
}

void windows_init(sampling_plan *plan, VALUE newobj_hook, VALUE gc_hook, void (*ractor_alive)(void)) {
  win.plan = plan;
  win.newobj_hook = newobj_hook;
  win.gc_hook = gc_hook;
  win.ractor_alive = ractor_alive;
  sym_total_allocated_objects = ID2SYM(rb_intern("total_allocated_objects"));
  // The first GC.stat call interns Ruby's own key symbols (allocating): here, not inside the GC. (An
  // unknown key raises, here too: total_allocated_objects is in every GC.stat since 2.1.)
  (void)rb_gc_stat(sym_total_allocated_objects);
#ifdef MALLOC_LIMIT_GUARD
  // Only the Ruby 3.1 path reads these (may_register_in_gc).
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
  // Once per process, at load: it allocates (20,000 objects), which inside Heapscope.start would be GCs
  // the run did not see.
  calibrate_hook_cost();
  plan_set_hook_cost(plan, hook_cost_nanos);
  // The ticker must be gone before the VM it posts jobs to is.
  ruby_vm_at_exit(stop_ticker_at_exit);
  pthread_atfork(lock_before_fork, unlock_in_parent, reset_in_child);
}
