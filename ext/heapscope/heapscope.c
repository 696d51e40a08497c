// heapscope's Ruby bindings: Heapscope::Native (used by lib/heapscope.rb, which validates every
// argument first) and Heapscope::Testing (test-only entry points). Nothing else lives here: a profile
// is built by profile.c, between whose two steps the fail-safe below is settled.
#include <ruby.h>
#include <ruby/thread.h>
#include <ruby/version.h>
#include <stdlib.h>
#include <string.h>

#include "capture.h"
#include "dirhandle.h"
#include "exact_threads.h"
#include "liveness.h"
#include "memstats.h"
#include "previews.h"
#include "profile.h"
#include "retainers.h"
#include "ractors.h"
#include "sampler.h"

static VALUE eHeapscopeError;
// The fail-safe (capture_fail): why profiling was disabled, and how often that happened.
static const char *disabled_reason;
static uint64_t internal_errors;
// Why liveness cannot work in this process (liveness_init), or NULL.
static const char *liveness_unsupported;

// Finishes what capture_fail started, from outside any hook: stops capture, keeps the reason.
// Returns true when profiling is (now) disabled by a failure.
static bool settle_failure(void) {
  const char *reason = capture_failure();
  if (reason != NULL && capture_running()) {
    capture_stop();
    disabled_reason = reason;
    internal_errors++;
  }
  return reason != NULL || disabled_reason != NULL;
}

// Settles what happened since the last call: a failure (settle_failure), a Ractor (ractors.h).
static bool settle(void) {
  bool failed = settle_failure();
  capture_settle_ractors();
  return failed;
}

static void raise_not_running(void) {
  // Why profiling was switched off on purpose (a Ractor: ractors.h), or NULL.
  const char *off_reason = capture_off_reason();
  if (off_reason != NULL) {
#ifdef RACTORS_VM_CRASH
    rb_raise(eHeapscopeError, "heapscope switched itself off: %s. On Ruby %s it cannot start again in this process "
             "(a Ractor started later would crash Ruby itself while heapscope's hooks are on)", off_reason, ruby_version);
#else
    rb_raise(eHeapscopeError, "heapscope switched itself off: %s. Heapscope.start starts it again once that is over",
             off_reason);
#endif
  }
  if (disabled_reason != NULL) {
    rb_raise(eHeapscopeError, "heapscope disabled itself after an internal error (%s); the message on stderr "
             "has the details. Heapscope.start starts it again", disabled_reason);
  }
  rb_raise(eHeapscopeError, "heapscope is not running: call Heapscope.start first");
}

static uint32_t to_u32(VALUE value) { return (uint32_t)NUM2ULONG(value); }

// The focused classes for capture_config from [[Class, every], ...] (lib/heapscope/focus.rb checked it;
// this checks again what the C core relies on: distinct Classes, rates from 1, at most PLAN_MAX_STRATA).
static void read_focus(VALUE focus, capture_config *config) {
  if (NIL_P(focus)) return;
  Check_Type(focus, T_ARRAY);
  long n = RARRAY_LEN(focus);
  if (n > PLAN_MAX_STRATA) rb_raise(rb_eArgError, "heapscope: at most %d focus entries, got %ld", PLAN_MAX_STRATA, n);
  for (long i = 0; i < n; i++) {
    VALUE pair = rb_ary_entry(focus, i);
    Check_Type(pair, T_ARRAY);
    if (RARRAY_LEN(pair) != 2) rb_raise(rb_eArgError, "heapscope: a focus entry is [Class, rate]");
    VALUE klass = rb_ary_entry(pair, 0); // nil: not defined yet (Native._focus_class sets it later)
    if (!NIL_P(klass) && !RB_TYPE_P(klass, T_CLASS)) rb_raise(rb_eTypeError, "heapscope: a focused class must be a Class");
    unsigned long every = NUM2ULONG(rb_ary_entry(pair, 1));
    if (every < 1 || every > UINT32_MAX) rb_raise(rb_eArgError, "heapscope: a focus rate must be from 1 to %u", UINT32_MAX);
    for (uint32_t k = 0; k < config->focus_count && !NIL_P(klass); k++) {
      if (config->focus_classes[k] == klass) rb_raise(rb_eArgError, "heapscope: a class is focused twice");
    }
    config->focus_classes[config->focus_count] = NIL_P(klass) ? 0 : klass;
    config->focus_every[config->focus_count] = (uint32_t)every;
    config->focus_count++;
  }
}

// Native._start(sample_every, max_frames, min_age, track_sizes, max_tracked_objects, max_stacks, slot_size,
//               max_overhead, windowed, window_share, label_threads, max_label_sets, focus, exact_threads)
static VALUE native_start(int argc, VALUE *argv, VALUE self) {
  (void)self;
  if (argc != 14) rb_raise(rb_eArgError, "heapscope: Native._start takes 14 arguments, got %d", argc);
  VALUE sample_every = argv[0], max_frames = argv[1], min_age = argv[2], track_sizes = argv[3];
  VALUE max_tracked_objects = argv[4], max_stacks = argv[5], slot_size = argv[6], max_overhead = argv[7];
  VALUE windowed = argv[8], window_share = argv[9], label_threads = argv[10], max_label_sets = argv[11];
  // Everything that calls a method comes first: its interrupt checks may run code that starts capture
  // (capture.h, capture_poll_ruby), and the start itself checks none.
  capture_poll_ruby();
  settle();
  long ractors = ractors_count();
  if (capture_running()) rb_raise(eHeapscopeError, "heapscope is already running (call Heapscope.stop first)");
  if (ractors > 1) {
    rb_raise(eHeapscopeError, "heapscope cannot start while other Ractors run (%ld): it does not support Ractors", ractors - 1);
  }
#ifdef RACTORS_VM_CRASH
  if (ractors_multi_mode()) {
    rb_raise(eHeapscopeError, "heapscope cannot start on Ruby %s once a Ractor was started in this process: a Ractor "
             "started while its hooks are on crashes Ruby itself, and after the first one Ruby gives no warning "
             "(docs/architecture.md, Ractors)", ruby_version);
  }
#endif
  if (liveness_unsupported != NULL) {
    rb_raise(eHeapscopeError, "heapscope cannot run here: %s, and it needs the GC's mark bits to know which sampled "
             "objects are alive", liveness_unsupported);
  }
  if (RTEST(windowed) && !capture_windowed_supported()) {
    rb_raise(eHeapscopeError, "windowed sampling is not supported on Ruby %s (it must register hooks inside the GC, "
             "which needs rb_gc_disable_no_rest); use sampling: :always", ruby_version);
  }
  capture_config config = {
    .sample_every = to_u32(sample_every),
    .max_frames = to_u32(max_frames),
    .min_age = to_u32(min_age),
    .max_overhead = NIL_P(max_overhead) ? 0.0 : NUM2DBL(max_overhead),
    .windowed = RTEST(windowed),
    .window_share = NUM2DBL(window_share),
    .label_threads = RTEST(label_threads),
    .exact_threads = RTEST(argv[13]),
    .recorder = {
      .max_tracked_objects = to_u32(max_tracked_objects),
      .max_stacks = to_u32(max_stacks),
      .track_sizes = RTEST(track_sizes),
      .slot_size = to_u32(slot_size),
    },
  };
  read_focus(argv[12], &config);
  uint32_t label_cap = to_u32(max_label_sets);
  if (!capture_start(&config)) rb_raise(rb_eNoMemError, "heapscope: not enough memory to start");
  if (capture_labels() != NULL) labelsets_set_max(capture_labels(), label_cap);
  disabled_reason = NULL;
  profile_run_started();
  return Qtrue;
}

// Native._label_set([[key, value], ...]): the id of that label set (labels.h), for the fiber-local
// CAPTURE_LABELS_LOCAL; 0 for none; -id for the overflow set it was mapped to. Keys and values are Strings the caller checked (lib/heapscope/labels.rb).
// Works whether or not heapscope runs: the table outlives start and stop.
static VALUE native_label_set(VALUE self, VALUE pairs) {
  (void)self;
  Check_Type(pairs, T_ARRAY);
  labelsets *table = capture_labels();
  long n = RARRAY_LEN(pairs);
  if (table == NULL || n == 0) return INT2FIX(0);
  if (n > LABELS_MAX_PAIRS) rb_raise(rb_eArgError, "heapscope: at most %d labels, got %ld", LABELS_MAX_PAIRS, n);
  label_text texts[LABELS_MAX_PAIRS];
  for (long i = 0; i < n; i++) {
    VALUE pair = RARRAY_AREF(pairs, i);
    Check_Type(pair, T_ARRAY);
    if (RARRAY_LEN(pair) != 2) rb_raise(rb_eArgError, "heapscope: a label is a [key, value] pair");
    VALUE key = RARRAY_AREF(pair, 0), value = RARRAY_AREF(pair, 1);
    Check_Type(key, T_STRING);
    Check_Type(value, T_STRING);
    texts[i] = (label_text){RSTRING_PTR(key), (size_t)RSTRING_LEN(key), RSTRING_PTR(value), (size_t)RSTRING_LEN(value)};
  }
  // Nothing above allocates after the pointers are taken, and interning only mallocs.
  labelsets_stats before, after;
  labelsets_get_stats(table, &before);
  uint32_t id = labelsets_intern(table, texts, (uint32_t)n);
  labelsets_get_stats(table, &after);
  RB_GC_GUARD(pairs);
  // An overflow set (the cap was reached) comes back negated: its values are "(other)", not the ones given.
  return after.overflowed != before.overflowed ? LONG2NUM(-(long)id) : UINT2NUM(id);
}

static VALUE native_stop(VALUE self) {
  (void)self;
  bool was_running = capture_running();
  capture_stop();
  profile_forget_census();
  return was_running ? Qtrue : Qfalse;
}

// Native._disable_for_ractor: the main Ractor starts a Ractor (lib/heapscope.rb watches Ractor.new), so
// every hook goes before it runs (ractors.h). Returns whether it was running (the caller then warns).
static VALUE native_disable_for_ractor(VALUE self) {
  (void)self;
  return capture_switch_off_for_ractor(false) ? Qtrue : Qfalse;
}

// Native._exclude_thread(thread) -> true, or false when the table is full: thread's allocations are
// never sampled (heapscope's own threads). Native._include_thread(thread) undoes it.
static VALUE native_exclude_thread(VALUE self, VALUE thread) {
  (void)self;
  if (!rb_obj_is_kind_of(thread, rb_cThread)) rb_raise(rb_eTypeError, "expected a Thread");
  return capture_exclude_thread(thread) ? Qtrue : Qfalse;
}

static VALUE native_include_thread(VALUE self, VALUE thread) {
  (void)self;
  capture_include_thread(thread);
  return Qnil;
}

// Native._focus_stats -> [[sample_every, current_sample_every, samples], ...], one per focused class in
// the order Native._start was given them; [] when not running or nothing is focused.
static VALUE native_focus_stats(VALUE self) {
  (void)self;
  settle();
  VALUE out = rb_ary_new();
  if (!capture_running()) return out;
  const sampling_plan *plan = alloc_hook_plan();
  for (uint32_t i = 0; i < plan->strata_count; i++) {
    rb_ary_push(out, rb_ary_new_from_args(3, ULONG2NUM(plan->strata[i].every), ULONG2NUM(plan_stratum_every(plan, i)),
                                          ULL2NUM(plan->strata[i].samples)));
  }
  return out;
}

// Native._focus_class(index, klass): the focused class at index (given as nil to Native._start: not
// defined then) is klass from now on. false when not running, or it had a class, or klass is focused.
static VALUE native_focus_class(VALUE self, VALUE index, VALUE klass) {
  (void)self;
  settle();
  if (!RB_TYPE_P(klass, T_CLASS)) rb_raise(rb_eTypeError, "heapscope: a focused class must be a Class");
  if (!capture_running()) return Qfalse;
  bool focused = alloc_hook_focus_class(NUM2UINT(index), klass);
  capture_focus_changed();
  return focused ? Qtrue : Qfalse;
}

// Native._focus_change(index, klass, rate): the stratum at index (one of Native._start's focus entries)
// focuses klass at 1 in rate from now on, or nothing when klass is nil (automatic focus moves its
// strata so: lib/heapscope/auto_focus.rb). false when not running, index is out of range, or klass is
// focused by another stratum.
static VALUE native_focus_change(VALUE self, VALUE index, VALUE klass, VALUE rate) {
  (void)self;
  settle();
  if (!NIL_P(klass) && !RB_TYPE_P(klass, T_CLASS)) rb_raise(rb_eTypeError, "heapscope: a focused class must be a Class");
  unsigned long every = NUM2ULONG(rate);
  if (every < 1 || every > UINT32_MAX) rb_raise(rb_eArgError, "heapscope: a focus rate must be from 1 to %u", UINT32_MAX);
  uint32_t i = NUM2UINT(index);
  sampling_plan *plan = alloc_hook_plan();
  if (!capture_running() || i >= plan->strata_count) return Qfalse;
  alloc_hook_unfocus(i);
  plan_set_stratum_every(plan, i, (uint32_t)every);
  bool focused = !NIL_P(klass) && alloc_hook_focus_class(i, klass);
  capture_focus_changed();
  return NIL_P(klass) || focused ? Qtrue : Qfalse;
}

// Native._last_census -> the last profile's census comment lines (a String), or nil.
static VALUE native_last_census(VALUE self) {
  (void)self;
  const char *text = profile_last_census();
  return text == NULL ? Qnil : rb_str_new_cstr(text);
}

static VALUE native_running_p(VALUE self) {
  (void)self;
  settle();
  return capture_running() ? Qtrue : Qfalse;
}


// Native._profile(allocs, min_age, extra_comments, census) -> gzipped pprof String (profile.h). extra_comments:
// nil or a String of more comment lines (the memory breakdown, lib/heapscope/memory.rb), copied in as is.
// census: true to count the live heap exactly first (census.h), bounding samples and adding its lines.
static VALUE native_profile(VALUE self, VALUE allocs, VALUE min_age, VALUE extra_comments, VALUE with_census) {
  (void)self;
  capture_poll_ruby(); // first: what runs inside it may stop or restart capture (capture.h)
  settle();
  if (!capture_running()) raise_not_running();
  // Checked before the snapshot, so nothing below raises for it; the bytes are copied before any
  // allocation could move or free the String.
  if (!NIL_P(extra_comments)) {
    Check_Type(extra_comments, T_STRING);
    if (memchr(RSTRING_PTR(extra_comments), '\0', (size_t)RSTRING_LEN(extra_comments)) != NULL) {
      rb_raise(rb_eArgError, "heapscope: profile comments must not contain NUL bytes");
    }
  }
  size_t extra_len = NIL_P(extra_comments) ? 0 : (size_t)RSTRING_LEN(extra_comments);
  char *extra = extra_len ? malloc(extra_len) : NULL;
  if (extra_len && extra == NULL) rb_raise(rb_eNoMemError, "heapscope: not enough memory for the profile's comments");
  if (extra_len) memcpy(extra, RSTRING_PTR(extra_comments), extra_len);
  profile_job job;
  if (!profile_take(&job, RTEST(allocs), to_u32(min_age), RTEST(with_census), extra, extra_len)) raise_not_running();
  // The fail-safe: the snapshot's invariant check (or a hook meanwhile) may have failed capture.
  if (settle_failure()) {
    profile_discard(&job);
    raise_not_running();
  }
  return profile_finish(&job);
}

// Native._malloc_stats -> [arena, mmapped, in_use, free, releasable] bytes (memstats.h), or nil where
// the allocator is not glibc's.
typedef struct {
  memstats_malloc figures;
  bool ok;
} malloc_stats_job;

static void *read_malloc_without_gvl(void *arg) {
  malloc_stats_job *job = arg;
  job->ok = memstats_read_malloc(&job->figures);
  return NULL;
}

// mallinfo2 walks every free list (tens of ms in a fragmented heap: bench/memory_cost.rb), so it runs
// without the GVL: the application's threads go on meanwhile.
static VALUE native_malloc_stats(VALUE self) {
  (void)self;
  malloc_stats_job job = {0};
  rb_thread_call_without_gvl(read_malloc_without_gvl, &job, NULL, NULL);
  if (!job.ok) return Qnil;
  const memstats_malloc m = job.figures;
  return rb_ary_new_from_args(5, ULL2NUM(m.arena), ULL2NUM(m.mmapped), ULL2NUM(m.in_use), ULL2NUM(m.free),
                              ULL2NUM(m.releasable));
}

// Native._gc_stress_changed(flag): GC.stress was switched (lib/heapscope.rb watches it where needed).
static VALUE native_gc_stress_changed(VALUE self, VALUE flag) {
  (void)self;
  capture_gc_stress_changed(RTEST(flag));
  return Qnil;
}

static VALUE native_reset(VALUE self) {
  (void)self;
  settle();
  if (capture_running()) recorder_reset_allocs(capture_recorder());
  return Qnil;
}

static void set(VALUE hash, const char *key, VALUE value) { rb_hash_aset(hash, ID2SYM(rb_intern(key)), value); }
static void set_u64(VALUE hash, const char *key, uint64_t value) { set(hash, key, ULL2NUM(value)); }

static VALUE native_stats(VALUE self) {
  (void)self;
  settle();
  VALUE h = rb_hash_new();
  set(h, "running", capture_running() ? Qtrue : Qfalse);
  if (disabled_reason != NULL) set(h, "disabled_reason", rb_str_new_cstr(disabled_reason));
  if (capture_off_reason() != NULL) set(h, "off_reason", rb_str_new_cstr(capture_off_reason()));
  if (internal_errors > 0) set_u64(h, "internal_errors", internal_errors);
  if (!capture_running()) return h;
  capture_settle_records(); // GCs without our pass are counted as missed by now, suspects checked
  capture_stats cs;
  recorder_stats rs;
  capture_get_stats(&cs);
  recorder_get_stats(capture_recorder(), &rs);
  set_u64(h, "sample_every", capture_current_config()->sample_every);
  set_u64(h, "current_sample_every", cs.current_every);
  set(h, "max_overhead", capture_current_config()->max_overhead > 0 ? DBL2NUM(capture_current_config()->max_overhead) : Qnil);
  set(h, "sampling_overhead", DBL2NUM(cs.last_overhead));
  set_u64(h, "sampling_ns", cs.sampling_nanos);
  set_u64(h, "rate_adjustments", cs.rate_adjustments);
  set(h, "sampling", ID2SYM(rb_intern(capture_current_config()->windowed ? "windowed" : "always")));
  set(h, "window_share", capture_current_config()->windowed ? DBL2NUM(cs.share) : Qnil);
  set(h, "window_share_auto", cs.share_auto ? Qtrue : Qfalse);
  set(h, "mean_window_share", capture_current_config()->windowed ? DBL2NUM(cs.mean_share) : Qnil);
  set(h, "min_window_share", capture_current_config()->windowed ? DBL2NUM(cs.min_share) : Qnil);
  set_u64(h, "window_share_changes", cs.share_changes);
  set_u64(h, "window_share_changes_waited", cs.share_changes_waited);
  set(h, "hook_cost_full_share", DBL2NUM(cs.hook_cost_share));
  set(h, "rate_lowered", cs.current_every > capture_current_config()->sample_every ? Qtrue : Qfalse); // now, not once
  set_u64(h, "max_sample_every", cs.max_every);
  set(h, "hook_on_share", DBL2NUM(capture_hook_on_share(&cs)));
  set(h, "realized_share", DBL2NUM(cs.realized_share));
  set(h, "requested_share", DBL2NUM(cs.requested_share));
  set(h, "weight_scale", DBL2NUM(capture_weight_scale()));
  set(h, "weight_scale_wanted", DBL2NUM(capture_weight_scale_wanted()));
  set_u64(h, "weight_stretches", cs.stretches);
  set(h, "stretch_scale_min", DBL2NUM(cs.stretch_scale_min));
  set(h, "stretch_scale_max", DBL2NUM(cs.stretch_scale_max));
  set(h, "open_stretch_scale", DBL2NUM(cs.open_stretch_scale));
  set_u64(h, "allocations", cs.vm_allocations);
  set_u64(h, "hook_allocations", cs.hook_allocations);
  set_u64(h, "windows_opened", cs.windows_opened);
  set_u64(h, "sync_jobs", cs.sync_jobs);
  set_u64(h, "sync_latency_ns", cs.sync_latency_nanos);
  set_u64(h, "sync_latency_max_ns", cs.sync_latency_max_nanos);
  set_u64(h, "ticker_wakeups", cs.ticker_wakeups);
  set_u64(h, "ticker_triggers", cs.ticker_triggers);
  set_u64(h, "ticker_cpu_ns", cs.ticker_cpu_nanos);
  set_u64(h, "ticker_idle_spells", cs.ticker_idle_spells);
  set_u64(h, "ticker_failures", cs.ticker_failures);
  set_u64(h, "schedule_flips", cs.schedule_flips);
  set(h, "mean_window_ns", DBL2NUM(cs.mean_window_nanos));
  set(h, "hook_cost_ns", DBL2NUM(cs.hook_cost_nanos));
  set_u64(h, "own_ns", cs.own_nanos);
  set_u64(h, "skipped_own", cs.hook.skipped_own);
  set_u64(h, "exact_tracked", cs.hook.exact_tracked);
  set_u64(h, "skipped_exact", cs.hook.skipped_exact);
  set_u64(h, "window_sample_every", cs.window_every);
  set(h, "window_seen_share", DBL2NUM(cs.window_seen_share));
  set_u64(h, "gc_registrations_deferred", cs.gc_registrations_deferred);
  set_u64(h, "ractor_pauses", cs.ractor_pauses);
  set_u64(h, "samples_taken", cs.hook.samples_taken);
  set_u64(h, "tracked_objects", rs.tracked_objects);
  labelsets_stats ls = {0};
  if (capture_labels() != NULL) labelsets_get_stats(capture_labels(), &ls);
  set_u64(h, "label_sets", ls.sets);
  set_u64(h, "label_sets_overflowed", ls.overflowed);
  set_u64(h, "label_sets_dropped", ls.dropped);
  set_u64(h, "label_memory_bytes", ls.memory_bytes);
  set_u64(h, "stacks", rs.live_stacks);
  set_u64(h, "frames", rs.frames);
  set_u64(h, "strings", rs.strings);
  set_u64(h, "alloc_sites", rs.alloc_sites);
  set_u64(h, "dead_removed", rs.dead_removed);
  set_u64(h, "frozen", rs.frozen_measured);
  set_u64(h, "skipped_internal", cs.hook.skipped_internal);
  set_u64(h, "frames_truncated", cs.hook.frames_truncated);
  set_u64(h, "dropped", cs.hook.dropped_no_memory + rs.dropped_tracked_cap + rs.dropped_stack_cap + rs.dropped_no_memory);
  set_u64(h, "dropped_tracked_cap", rs.dropped_tracked_cap);
  set_u64(h, "dropped_stack_cap", rs.dropped_stack_cap);
  set_u64(h, "dropped_no_memory", cs.hook.dropped_no_memory + rs.dropped_no_memory);
  set_u64(h, "invalid_records", rs.invalid_records);
  set_u64(h, "stale_records", rs.stale_records);
  set_u64(h, "suspect_records", rs.suspect_records);
  set_u64(h, "gc_runs_seen", cs.gc_end_marks);
  set_u64(h, "gc_runs_missed", cs.gc_end_marks_missed);
  profile_timings pt;
  profile_get_timings(&pt);
  set_u64(h, "last_profile_gvl_ns", pt.gvl_nanos);
  set_u64(h, "last_profile_encode_ns", pt.encode_nanos);
  set_u64(h, "last_census_ns", pt.census_nanos);
  set_u64(h, "profiles_abandoned", pt.abandoned);
  set_u64(h, "record_bytes", rs.record_bytes);
  set_u64(h, "stack_table_bytes", rs.stack_table_bytes);
  set_u64(h, "recorder_bytes", rs.memory_bytes + capture_memory());
  return h;
}

// ---- Test-only entry points (Heapscope::Testing) ----

// Testing.sampler_countdowns(sample_every, count, seed) -> Array of the sampler's first countdowns.
static VALUE testing_sampler_countdowns(VALUE self, VALUE sample_every, VALUE count, VALUE seed) {
  (void)self;
  sampler s;
  sampler_init(&s, to_u32(sample_every), NUM2ULL(seed));
  long n = NUM2LONG(count);
  VALUE result = rb_ary_new_capa(n);
  for (long i = 0; i < n; i++) rb_ary_push(result, ULL2NUM(sampler_next_countdown(&s)));
  return result;
}

static VALUE testing_age_bucket(VALUE self, VALUE age) {
  (void)self;
  return UINT2NUM(recorder_age_bucket(to_u32(age)));
}

// Testing.fail_recorder_allocations(n): the recorder's next n allocations fail (fault injection).
static VALUE testing_fail_recorder_allocations(VALUE self, VALUE n) {
  (void)self;
  recorder_testing_fail_allocations(to_u32(n));
  return Qnil;
}

// Testing.corrupt_record: the first record now points at no object, as a bug would make it.
static VALUE testing_corrupt_record(VALUE self) {
  (void)self;
  recorder_testing_corrupt_record(capture_recorder());
  return Qnil;
}

// Testing.hook_allocations -> the allocations the NEWOBJ hook has seen since start (stats' count, read
// without building the stats Hash, so reading it around a stretch of code allocates one Integer at most).
static VALUE testing_hook_allocations(VALUE self) {
  (void)self;
  capture_stats cs;
  capture_get_stats(&cs);
  return ULL2NUM(cs.hook_allocations);
}

// Testing.close_stretch(scale): closes a stretch of the recorder at the last window (or sample, always),
// as a density check does, with the given scale: every sample so far is multiplied by it from now on.
// The plan does not know (its open scale stays): for checking the recorder's side only.
static VALUE testing_close_stretch(VALUE self, VALUE scale) {
  (void)self;
  double s = NUM2DBL(scale);
  if (!capture_running()) rb_raise(rb_eRuntimeError, "heapscope is not running");
  if (!(s > 0.0)) rb_raise(rb_eArgError, "scale must be positive");
  capture_stats cs;
  capture_get_stats(&cs);
  return recorder_close_stretch(capture_recorder(), cs.window, s) ? Qtrue : Qfalse;
}

// Testing.tracked_objects -> Array of every object a record points at (for liveness tests); records on
// a free slot (stale after a GC our hook missed) and hidden objects are left out.
static VALUE testing_tracked_objects(VALUE self) {
  (void)self;
  if (!capture_running()) return rb_ary_new();
  capture_settle_records();
  recorder_stats rs;
  recorder_get_stats(capture_recorder(), &rs);
  // The Array is made first, with room for all: filling it then allocates nothing, so no GC can drop
  // records (or free their objects, which records do not keep alive) while they are copied.
  VALUE result = rb_ary_new_capa((long)rs.tracked_objects);
  for (size_t i = 0; i < rs.tracked_objects; i++) {
    VALUE obj = recorder_testing_object(capture_recorder(), i);
    // Hidden objects (no class: the VM's internal strings, arrays, hashes) must never reach Ruby code.
    if (obj != Qundef && RBASIC_CLASS(obj) != 0) rb_ary_push(result, obj);
  }
  return result;
}

RUBY_FUNC_EXPORTED void Init_heapscope(void) {
  VALUE mHeapscope = rb_define_module("Heapscope");
  eHeapscopeError = rb_define_class_under(mHeapscope, "Error", rb_eStandardError);
  rb_global_variable(&eHeapscopeError);

  VALUE mNative = rb_define_module_under(mHeapscope, "Native");
  exact_threads_init(mHeapscope);
  rb_define_singleton_method(mNative, "_start", native_start, -1);
  rb_define_singleton_method(mNative, "_focus_stats", native_focus_stats, 0);
  rb_define_singleton_method(mNative, "_focus_class", native_focus_class, 2);
  rb_define_singleton_method(mNative, "_focus_change", native_focus_change, 3);
  rb_define_singleton_method(mNative, "_last_census", native_last_census, 0);
  rb_define_singleton_method(mNative, "_label_set", native_label_set, 1);
  rb_define_singleton_method(mNative, "_gc_stress_changed", native_gc_stress_changed, 1);
  // Windowed sampling is possible on this Ruby (capture_windowed_supported).
  rb_define_const(mNative, "WINDOWED_SUPPORTED", capture_windowed_supported() ? Qtrue : Qfalse);
  // Windowed sampling with a ticker (Ruby 3.3+); without one windows change at GCs only (windows.c).
  rb_define_const(mNative, "WINDOWED_TICKER", capture_windowed_ticker() ? Qtrue : Qfalse);
  // How this build reads mark bits (liveness.h): which exported function, for docs and tests.
  rb_define_const(mNative, "LIVENESS", rb_str_freeze(rb_str_new_cstr(liveness_mechanism())));
#if !defined(HAVE_RB_GC_DISABLE_NO_REST) && RUBY_API_VERSION_CODE < 30200
  // Ruby 3.1: without rb_gc_disable_no_rest nothing may be registered inside the GC while GC.stress is on.
  rb_define_const(mNative, "WATCH_GC_STRESS", Qtrue);
#else
  rb_define_const(mNative, "WATCH_GC_STRESS", Qfalse);
#endif
  rb_define_singleton_method(mNative, "_stop", native_stop, 0);
  rb_define_singleton_method(mNative, "_disable_for_ractor", native_disable_for_ractor, 0);
  rb_define_singleton_method(mNative, "_running?", native_running_p, 0);
  rb_define_singleton_method(mNative, "_exclude_thread", native_exclude_thread, 1);
  rb_define_singleton_method(mNative, "_include_thread", native_include_thread, 1);
  rb_define_singleton_method(mNative, "_profile", native_profile, 4);
  rb_define_singleton_method(mNative, "_malloc_stats", native_malloc_stats, 0);
  retainers_define(mNative);
  previews_define(mNative);
  dirhandle_define(mNative);
  rb_define_singleton_method(mNative, "_stats", native_stats, 0);
  rb_define_singleton_method(mNative, "_reset", native_reset, 0);

  VALUE mTesting = rb_define_module_under(mHeapscope, "Testing");
  rb_define_singleton_method(mTesting, "sampler_countdowns", testing_sampler_countdowns, 3);
  rb_define_singleton_method(mTesting, "age_bucket", testing_age_bucket, 1);
  rb_define_singleton_method(mTesting, "fail_recorder_allocations", testing_fail_recorder_allocations, 1);
  rb_define_singleton_method(mTesting, "corrupt_record", testing_corrupt_record, 0);
  rb_define_singleton_method(mTesting, "close_stretch", testing_close_stretch, 1);
  rb_define_singleton_method(mTesting, "tracked_objects", testing_tracked_objects, 0);
  rb_define_singleton_method(mTesting, "hook_allocations", testing_hook_allocations, 0);

  liveness_unsupported = liveness_init();
  capture_init();
}
