// ractors: the probes (in which Ractor code runs, whether others exist) and capture's guard against
// them (ractors.h says why). The guard's state machine (the pause is windows.c's, the switch-off
// capture.c's):
//
//   running --another Ractor's GC, job or hook reaches capture, or a new one shows in a hook-->
//     seen: countdown parked, nothing registered or sampled, the settle job asked for
//   running --Ruby 3.1: a full C-API GC while single-Ractor (maybe Ractor.new's)--> paused: both hooks
//     off in that GC, before any new thread can start; the settle job then looks: a Ractor -> off,
//     none -> running again (hooks back as they were)
//   seen / a Ractor alive at a job or API call (main Ractor) --> off: capture_stop, reason kept
#include "ractors.h"

#include <stdio.h>
#include <ruby/debug.h>
#include <ruby/ractor.h>

#include "clock.h"

#ifdef RACTORS_VM_CRASH
#include <dlfcn.h>
// Ruby 3.1 and 3.2's ruby_single_main_ractor (declared only in their internal headers): non-NULL while
// the process has only ever had its main Ractor. Looked up when the extension loads, not linked: a
// Ruby linked statically keeps it in libruby-static.a (so a link test finds it) without exporting it
// (so a linked reference fails the load: Ruby 4.0.5 built by hand said "undefined symbol"). NULL
// where this Ruby does not export it; then only Ractor.count and the guard's other probes remain.
static struct rb_ractor_struct *const *single_main_ractor;
#endif
#ifdef HAVE_RB_GC_MULTI_RACTOR_P
bool rb_gc_multi_ractor_p(void); // Ruby 3.4+, for GC implementations; declared in internal headers only
#endif

static rb_ractor_local_key_t main_marker; // set (to a non-NULL pointer) in the main Ractor only
static VALUE count_method;                // Ractor.method(:count), taken at load
static VALUE sym_gc_by, sym_capi;

// ---- Probes ----

bool ractors_in_main(void) { return rb_ractor_local_storage_ptr(main_marker) != NULL; }

bool ractors_multi_mode(void) {
#if defined(HAVE_RB_GC_MULTI_RACTOR_P)
  return rb_gc_multi_ractor_p();
#elif defined(RACTORS_VM_CRASH)
  return single_main_ractor != NULL && *single_main_ractor == NULL;
#else
  return false;
#endif
}

static VALUE call_count(VALUE unused) {
  (void)unused;
  return rb_method_call(0, NULL, count_method);
}

long ractors_count(void) {
  VALUE errinfo = rb_errinfo(); // put back on failure: the caller may be inside a rescue clause
  int state = 0;
  VALUE count = rb_protect(call_count, Qnil, &state);
  if (state) {
    rb_set_errinfo(errinfo);
    return 1;
  }
  return FIXNUM_P(count) ? FIX2LONG(count) : 1;
}

// Whether ractors_multi_mode answers on this Ruby (not on 3.3, nor where 3.1/3.2 hide the symbol).
static bool multi_mode_known(void) {
#if defined(HAVE_RB_GC_MULTI_RACTOR_P)
  return true;
#elif defined(RACTORS_VM_CRASH)
  return single_main_ractor != NULL;
#else
  return false;
#endif
}

// Asked at every sync job, the count allocated an object each millisecond or so: under GC.stress a full
// GC each, which took longer than the next job's wait, so the application got no time between them (a
// test hung for 20 minutes on Ruby 3.4). Only an answer of "none" stands for the gap (measured from the
// end of that count, so the application always runs in between, whatever a count costs); a run's start
// asks afresh (ractors_guard_start): a stale answer from before a restart switched the new run off.
static uint64_t none_until; // monotonic nanoseconds: the last count found no other Ractor, this recently

bool ractors_others_alive(void) {
  if (multi_mode_known() && !ractors_multi_mode()) return false;
  if (clock_monotonic_nanos() < none_until) return false;
  if (ractors_count() > 1) return true;
  none_until = clock_monotonic_nanos() + RACTORS_COUNT_GAP_NANOS;
  return false;
}

bool ractors_gc_may_start_one(void) {
  return !ractors_multi_mode() && rb_gc_latest_gc_info(sym_gc_by) == sym_capi;
}

// ---- capture's guard ----

static struct {
  bool seen;           // another Ractor reached capture since start: nothing more is sampled
  bool multi_at_start; // the process had left single-Ractor mode before start (3.3+ may restart)
  void (*park)(void);
  void (*settle)(void);
} guard;

bool ractors_multi_since_start(void) { return !guard.multi_at_start && ractors_multi_mode(); }
bool ractors_seen(void) { return guard.seen; }

static void settle_job(void *unused) {
  (void)unused;
  if (guard.settle != NULL) guard.settle();
}
#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
static rb_postponed_job_handle_t settle_handle = POSTPONED_JOB_HANDLE_INVALID;
#endif

void ractors_ask_to_settle(void) {
#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
  if (settle_handle != POSTPONED_JOB_HANDLE_INVALID) rb_postponed_job_trigger(settle_handle);
#else
  rb_postponed_job_register_one(0, settle_job, NULL);
#endif
}

bool ractors_guard(void) {
  if (__builtin_expect(!guard.seen && ractors_in_main() && !ractors_multi_since_start(), 1)) return true;
  if (!guard.seen) {
    guard.seen = true;
    guard.park(); // the hook only counts down from now on (as capture_fail)
    ractors_ask_to_settle();
  }
  return false;
}

void ractors_guard_start(void) {
  none_until = 0;
  guard.seen = false;
  guard.multi_at_start = ractors_multi_mode();
}

void ractors_init(void (*park)(void), void (*settle)(void)) {
  guard.park = park;
  guard.settle = settle;
#ifdef RACTORS_VM_CRASH
  single_main_ractor = (struct rb_ractor_struct *const *)dlsym(RTLD_DEFAULT, "ruby_single_main_ractor");
#endif
  main_marker = rb_ractor_local_storage_ptr_newkey(NULL);
  rb_ractor_local_storage_ptr_set(main_marker, (void *)&main_marker);
  count_method = rb_obj_method(rb_cRactor, ID2SYM(rb_intern("count")));
  rb_gc_register_mark_object(count_method);
  sym_gc_by = ID2SYM(rb_intern("gc_by"));
  sym_capi = ID2SYM(rb_intern("capi"));
#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
  settle_handle = rb_postponed_job_preregister(0, settle_job, NULL);
#endif
}
