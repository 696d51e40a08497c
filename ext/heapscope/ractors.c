// ractors: the probes (in which Ractor code runs, whether others exist) and capture's guard against
// them (ractors.h says why). The guard's state machine:
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

#include "capture_internal.h"

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

static const char *const RACTOR_REASON = "a Ractor was started, and heapscope does not support Ractors";
static rb_ractor_local_key_t main_marker; // set (to a non-NULL pointer) in the main Ractor only
static VALUE count_method;                // Ractor.method(:count), taken at load
static const char *off_reason;
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

bool ractors_gc_may_start_one(void) {
  return !ractors_multi_mode() && rb_gc_latest_gc_info(sym_gc_by) == sym_capi;
}

// ---- capture's guard ----

const char *capture_off_reason(void) { return off_reason; }

// Whether a Ractor came since start: the VM left single-Ractor mode since (where it says so).
static bool multi_since_start(void) { return !cap.multi_at_start && ractors_multi_mode(); }

static void settle_job(void *unused);
#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
static rb_postponed_job_handle_t settle_handle = POSTPONED_JOB_HANDLE_INVALID;
#endif

// Any context: the main Ractor settles at its next interrupt check (a job run by another Ractor does
// nothing: settle_job checks where it runs).
static void ask_to_settle(void) {
#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
  if (settle_handle != POSTPONED_JOB_HANDLE_INVALID) rb_postponed_job_trigger(settle_handle);
#else
  rb_postponed_job_register_one(0, settle_job, NULL);
#endif
}

bool capture_ractor_guard(void) {
  if (__builtin_expect(!cap.ractor_seen && ractors_in_main() && !multi_since_start(), 1)) return true;
  if (!cap.ractor_seen) {
    cap.ractor_seen = true;
    cap.countdown = UINT64_MAX; // the hook only counts down from now on (as capture_fail)
    ask_to_settle();
  }
  return false;
}

#ifdef RACTORS_VM_CRASH
static void disable_if_enabled(VALUE tracepoint) {
  if (RTEST(rb_tracepoint_enabled_p(tracepoint))) rb_tracepoint_disable(tracepoint);
}
#endif

void capture_ractor_on_gc_marking(void) {
  if (cap.ractor_pause || cap.ractor_seen || !ractors_gc_may_start_one()) return;
  // Ruby 3.3 does not say whether it left single-Ractor mode: Ractor.count, at the settle job right after
  // Ractor.new returns, finds the new one (unless it has already finished: then heapscope stays on).
  ask_to_settle();
#ifdef RACTORS_VM_CRASH
  // Removing hooks mallocs nothing (Ruby frees the entries), so it is safe inside the GC. A window open
  // now stays accounted for: windows_sync closes it (ractor_pause keeps it closed).
  cap.ractor_pause = true;
  if (cap.config.windowed) windows_sync();
  disable_if_enabled(cap.newobj_hook);
  disable_if_enabled(cap.gc_hook);
  cap.gc_hook_on = cap.window_open = false;
  __atomic_store_n(&hook_applied, 0, __ATOMIC_RELAXED);
  cap.stats.ractor_pauses++;
#endif
}

#ifdef RACTORS_VM_CRASH
// Outside the GC: no Ractor came after all (another C-API GC), so the hooks go back as they were.
static void resume(void) {
  cap.ractor_pause = false;
  if (cap.config.windowed) {
    if (cap.gc_stress) windows_keep_gc_hook_registered();
    windows_sync_outside_gc();
    return;
  }
  VALUE gc_was_disabled = rb_gc_disable(); // a GC between the two would have half the hooks
  rb_tracepoint_enable(cap.gc_hook);
  rb_tracepoint_enable(cap.newobj_hook);
  cap.gc_hook_on = cap.window_open = true;
  if (!RTEST(gc_was_disabled)) rb_gc_enable();
}
#endif

bool capture_switch_off_for_ractor(bool say) {
  bool was_running = cap.running;
  capture_stop();
  if (!was_running) return false;
  off_reason = RACTOR_REASON;
  if (say) fprintf(stderr, "heapscope: a Ractor was started; profiling is off for now (heapscope does not support Ractors)\n");
  return true;
}

void capture_settle_ractors(void) {
  if (!cap.running || !ractors_in_main()) return;
#ifdef RACTORS_VM_CRASH
  if (cap.ractor_pause && !ractors_multi_mode()) resume();
#endif
  if (cap.ractor_seen || cap.ractor_pause || multi_since_start() || ractors_count() > 1) capture_switch_off_for_ractor(true);
}

static void settle_job(void *unused) {
  (void)unused;
  capture_settle_ractors();
}

void capture_ractors_start(void) {
  cap.ractor_seen = cap.ractor_pause = false;
  cap.multi_at_start = ractors_multi_mode();
  off_reason = NULL;
}

void ractors_init(void) {
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
