// capture.c: a run of capture from start to stop (capture.h): the lifecycle, the holder object through
// which the GC sees capture's state, the liveness pass (GC_END_MARK), the fail-safe, the Ractor
// switch-off, and the statistics. It decides nothing about sampling itself:
//
//   capture.c --> alloc_hook.h (the NEWOBJ hook: counts down, captures, records)
//             --> windows.h    (registers and removes the hooks at sync points)
//             --> ractors.h    (the Ractor probes and guard)
//   alloc_hook.c, windows.c --> sampling_plan.h (pure C: when the hook is on, what a sample weighs)
#include "capture.h"

#include <stdio.h>
#include <string.h>
#include <ruby/debug.h>

#include "alloc_hook.h"
#include "ractors.h"
#include "sampling_plan.h"
#include "windows.h"

static const char *const RACTOR_REASON = "a Ractor was started, and heapscope does not support Ractors";

static struct {
  bool running;
  capture_config config;
  recorder *recorder;
  names *names;
  VALUE holder, gc_hook;
  uint32_t last_gc_count; // rb_gc_count() at the last GC_END_MARK (or at start)
  uint32_t started_gc_count; // rb_gc_count() at start: a GC with this number began before the run
  const char *failure;    // set by capture_fail: sampling is off until the next start
  const char *off_reason; // set when capture switched itself off for a Ractor
  uint64_t invalid_seen;  // the recorder's invalid_records when last checked
  uint64_t gc_end_marks, gc_end_marks_missed;
} cap;
static sampling_plan *plan; // the process's one (alloc_hook_plan)
static VALUE sym_state, sym_marking;

// ---- The fail-safe ----

void capture_fail(const char *reason) {
  if (cap.failure != NULL) return;
  cap.failure = reason;
  plan_halt(plan); // the hook only counts down from now on; capture_stop removes it
  fprintf(stderr, "heapscope: internal error (%s); profiling is disabled, the application is unaffected\n", reason);
}

const char *capture_failure(void) { return cap.failure; }

// A record that points at no object means the liveness invariant broke: stop before anything reads it.
static void check_invariants(void) {
  recorder_stats stats;
  recorder_get_stats(cap.recorder, &stats);
  if (stats.invalid_records > cap.invalid_seen) capture_fail("a tracked record pointed at no object");
  cap.invalid_seen = stats.invalid_records;
}

void capture_check_invariants(void) {
  if (cap.running) check_invariants();
}

// ---- Liveness: GCs without our pass, suspects, the GC_END_MARK hook ----

// GCs up to number upto (rb_gc_count() values) that ran after our last liveness pass had none: the
// records of objects allocated before the last of them may point at swept slots on freed pages, so
// they become suspects (recorder.h). Counted, never silent. Reads no object; may run inside the GC.
static void account_unseen_gcs(uint32_t upto) {
  if ((int32_t)(upto - cap.last_gc_count) <= 0) return;
  cap.gc_end_marks_missed += upto - cap.last_gc_count;
  cap.last_gc_count = upto;
  recorder_distrust(cap.recorder, upto);
}

// Suspects are checked outside the GC, soon: a postponed job runs at the thread's next interrupt check.
// (Until then they are neither dropped when they die nor read; a profile checks them first anyway.)
static void settle_job(void *unused) {
  (void)unused;
  if (cap.running && cap.failure == NULL && ractors_guard()) capture_settle_records();
}
#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
static rb_postponed_job_handle_t settle_job_handle = POSTPONED_JOB_HANDLE_INVALID;
#endif

// Inside the GC: asks for settle_job. Async-signal-safe, allocates nothing.
static void schedule_settle(void) {
#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
  if (settle_job_handle != POSTPONED_JOB_HANDLE_INVALID) rb_postponed_job_trigger(settle_job_handle);
#else
  rb_postponed_job_register_one(0, settle_job, NULL);
#endif
}

static void on_gc_end_mark(VALUE tracepoint, void *unused) {
  (void)tracepoint;
  (void)unused;
  // Switched off soon (capture_settle_ractors); until then no record is read (this GC counts as missed).
  if (!ractors_guard()) return;
  uint64_t started = plan_monotonic_nanos();
  uint32_t gc_count = (uint32_t)rb_gc_count();
  // Counted as seen only if it began after the start: one whose incremental marking was under way then
  // is not among the GCs since start, and counting it made seen + missed one more than them.
  if ((int32_t)(gc_count - cap.started_gc_count) > 0) cap.gc_end_marks++;
  // Ruby runs no internal-event hook while another one runs, so a GC triggered by an allocation inside
  // someone else's NEWOBJ hook has no GC_END_MARK for us (nor has a GC Ruby 3.1's windowed mode could
  // not register in). This GC started as number gc_count, so those after our last pass and before it
  // were unseen: the records they could have invalidated become suspects, checked soon after.
  account_unseen_gcs(gc_count - 1);
  cap.last_gc_count = gc_count;
  recorder_on_gc_end_mark(cap.recorder);
  if (recorder_has_suspects(cap.recorder)) schedule_settle();
  check_invariants();
  plan_charge(plan, started, plan_monotonic_nanos());
  windows_gc_end_mark_done();
}

// The last GC that has finished marking: outside the GC every one has, except the current one while its
// incremental marking is under way (its pass is still to come).
static uint32_t last_marked_gc(void) {
  uint32_t gc = (uint32_t)rb_gc_count();
  return rb_gc_latest_gc_info(sym_state) == sym_marking ? gc - 1 : gc;
}

void capture_settle_records(void) {
  if (!cap.running) return;
  account_unseen_gcs(last_marked_gc());
  recorder_check_suspects(cap.recorder);
  // Checking suspects walks the heap's pages, and Ruby finishes a GC in progress before that walk: if
  // that GC had no pass either, the records it may have swept are suspects now, checked at once.
  account_unseen_gcs(last_marked_gc());
  recorder_check_suspects(cap.recorder);
}

void capture_poll_ruby(void) {
  int state = windows_poll_gc_stress();
  if (state != 0) rb_jump_tag(state); // what a trap handler raised: nothing is held here
}

void capture_prepare_snapshot(void) {
  if (!cap.running) return;
  // A profile is a sync point too (its moment does not depend on the chain). First: registering may
  // start a GC, which the settling after it accounts for.
  if (cap.config.windowed && cap.failure == NULL) windows_sync_outside_gc();
  capture_settle_records();
}

// ---- Ractors (ractors.h): switched off when one comes, paused on Ruby 3.1 while one may ----

const char *capture_off_reason(void) { return cap.off_reason; }

bool capture_switch_off_for_ractor(bool say) {
  bool was_running = cap.running;
  capture_stop();
  if (!was_running) return false;
  cap.off_reason = RACTOR_REASON;
  if (say) fprintf(stderr, "heapscope: a Ractor was started; profiling is off for now (heapscope does not support Ractors)\n");
  return true;
}

void capture_settle_ractors(void) {
  if (!cap.running || !ractors_in_main()) return;
#ifdef RACTORS_VM_CRASH
  if (windows_paused_for_ractor() && !ractors_multi_mode()) windows_resume_after_ractor();
#endif
  if (ractors_seen() || windows_paused_for_ractor() || ractors_multi_since_start() || ractors_count() > 1) capture_switch_off_for_ractor(true);
}

// The guard's callbacks: parks the countdown wherever it first sees another Ractor (allocates nothing);
// a sync job that finds one alive switches capture off at once.
static void park_for_ractor(void) { plan_park(plan); }
static void ractor_alive(void) { capture_switch_off_for_ractor(true); }

// Inside every GC's marking (main Ractor): if this GC may be Ractor.new's, asks the main Ractor to look
// (and on Ruby 3.1 pauses the hooks until then).
static void ractor_on_gc_marking(void) {
  if (windows_paused_for_ractor() || ractors_seen() || !ractors_gc_may_start_one()) return;
  // Ruby 3.3 does not say whether it left single-Ractor mode: Ractor.count, at the settle job right after
  // Ractor.new returns, finds the new one (unless it has already finished: then heapscope stays on).
  ractors_ask_to_settle();
#ifdef RACTORS_VM_CRASH
  windows_pause_for_ractor();
#endif
}

// ---- Threads and labels (the hook's) ----

bool capture_exclude_thread(VALUE thread) { return alloc_hook_exclude_thread(thread); }
void capture_include_thread(VALUE thread) { alloc_hook_include_thread(thread); }
labelsets *capture_labels(void) { return alloc_hook_labels(); }

// ---- The holder object: how the GC sees capture's state ----

static void holder_mark(void *unused) {
  (void)unused;
  alloc_hook_mark();
  rb_gc_mark(cap.gc_hook);
  names_mark(cap.names);
  // dmark also runs outside any GC (ObjectSpace.reachable_objects_from): only a GC is news.
  if (!cap.running || cap.failure != NULL || !rb_during_gc()) return;
  // Another Ractor's GC: registering from here would put the hooks in that Ractor (ractors.h).
  if (!ractors_guard()) return;
  ractor_on_gc_marking(); // before windows: this GC may be the last chance before a Ractor starts
  windows_on_gc_marking();
}

static void holder_compact(void *unused) {
  (void)unused;
  if (cap.recorder) recorder_on_compact(cap.recorder);
}

size_t capture_memory(void) {
  if (!cap.running) return 0;
  return sizeof(cap) + alloc_hook_memory() + names_memory(cap.names);
}

static size_t holder_size(const void *unused) {
  (void)unused;
  return capture_memory();
}

static const rb_data_type_t holder_type = {
  .wrap_struct_name = "heapscope_capture",
  .function = {.dmark = holder_mark, .dfree = NULL, .dsize = holder_size, .dcompact = holder_compact},
  .flags = RUBY_TYPED_FREE_IMMEDIATELY,
};

void capture_init(void) {
  // The GC calls dmark and dcompact only for a non-NULL data pointer.
  cap.holder = TypedData_Wrap_Struct(rb_cObject, &holder_type, &cap);
  rb_gc_register_mark_object(cap.holder);
  cap.gc_hook = rb_tracepoint_new(0, RUBY_INTERNAL_EVENT_GC_END_MARK, on_gc_end_mark, NULL);
  sym_state = ID2SYM(rb_intern("state"));
  sym_marking = ID2SYM(rb_intern("marking"));
  (void)rb_gc_latest_gc_info(sym_state); // interns its own keys on first use: here, not later
#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
  settle_job_handle = rb_postponed_job_preregister(0, settle_job, NULL);
#endif
  alloc_hook_init(CAPTURE_LABELS_LOCAL);
  plan = alloc_hook_plan();
  ractors_init(park_for_ractor, capture_settle_ractors);
  windows_init(plan, alloc_hook_tracepoint(), cap.gc_hook, ractor_alive);
}

// ---- Lifecycle ----

static void free_buffers(void) {
  recorder_free(cap.recorder);
  names_free(cap.names);
  alloc_hook_stop();
  cap.recorder = NULL;
  cap.names = NULL;
}

bool capture_start(const capture_config *config) {
  if (cap.running) return false;
  cap.config = *config;
  cap.config.recorder.windowed = config->windowed;
  cap.recorder = recorder_new(&cap.config.recorder);
  cap.names = names_new();
  if (!cap.recorder || !cap.names ||
      !alloc_hook_start(cap.recorder, cap.names, config->max_frames, config->label_threads, config->exact_threads, config->focus_classes,
                        config->focus_count)) {
    free_buffers();
    return false;
  }
  cap.gc_end_marks = cap.gc_end_marks_missed = 0;
  cap.started_gc_count = cap.last_gc_count = (uint32_t)rb_gc_count();
  cap.failure = NULL;
  ractors_guard_start();
  cap.off_reason = NULL;
  cap.invalid_seen = 0;
  plan_config pc = {
    .sample_every = config->sample_every, .max_overhead = config->max_overhead, .windowed = config->windowed,
    // The budget's share needs the ticker's sync points (its density checks; Ruby 3.3+): where windows
    // change at GCs only, windows are few and the share stays the default one.
    .window_share = config->window_share > 0.0 || windows_ticker() ? config->window_share : PLAN_DEFAULT_SHARE,
    .strata_every = config->focus_every, .strata_count = config->focus_count,
  };
  windows_start(cap.recorder, alloc_hook_tracepoint(), &pc, sampler_seed_from_os());
  cap.running = true; // last: a GC inside the registrations above must not see a half-started capture
  return true;
}

void capture_stop(void) {
  if (!cap.running) return;
  windows_stop();
  cap.running = false;
  free_buffers();
}

bool capture_running(void) { return cap.running; }

void capture_track_exact(VALUE obj, int skip) {
  if (!cap.running || cap.failure != NULL || !ractors_guard()) return;
  alloc_hook_track_exact(obj, skip);
}

void capture_focus_changed(void) {
  if (cap.running) windows_set_newobj_hook(alloc_hook_tracepoint());
}
const capture_config *capture_current_config(void) { return &cap.config; }
recorder *capture_recorder(void) { return cap.recorder; }
names *capture_names(void) { return cap.names; }

// ---- Statistics and the weight scale ----

bool capture_windowed_supported(void) { return windows_supported(); }
bool capture_windowed_ticker(void) { return windows_ticker(); }
void capture_gc_stress_changed(bool on) { windows_gc_stress_changed(on); }

// The VM's allocations since start (0 when stopped).
static uint64_t vm_allocations(void) { return cap.running ? plan_vm_allocations(plan, windows_vm_allocations()) : 0; }

void capture_get_stats(capture_stats *stats) {
  memset(stats, 0, sizeof *stats);
  alloc_hook_get_stats(&stats->hook);
  stats->gc_end_marks = cap.gc_end_marks;
  stats->gc_end_marks_missed = cap.gc_end_marks_missed;
  windows_stats ws;
  windows_get_stats(&ws);
  stats->gc_registrations_deferred = ws.gc_registrations_deferred;
  stats->ractor_pauses = ws.ractor_pauses;
  stats->windows_opened = ws.windows_opened;
  stats->sync_jobs = ws.sync_jobs;
  stats->sync_latency_nanos = ws.sync_latency_nanos;
  stats->sync_latency_max_nanos = ws.sync_latency_max_nanos;
  stats->ticker_failures = ws.ticker_failures;
  stats->current_every = plan->budget.current_every;
  stats->max_every = plan->budget.max_every;
  stats->vm_allocations = vm_allocations();
  stats->hook_allocations = plan_hook_allocations(plan, stats->vm_allocations);
  stats->window_every = plan->sampler.sample_every;
  stats->window_seen_share = plan->seen_share;
  stats->rate_adjustments = plan->budget.adjustments;
  stats->sampling_nanos = plan->budget.total_spent;
  stats->last_overhead = plan->budget.last_overhead;
  stats->own_nanos = __atomic_load_n(&plan->own_nanos, __ATOMIC_RELAXED);
  stats->hook_cost_nanos = plan->hook_cost_nanos;
  stats->window = plan->window;
  stats->realized_share = cap.running ? plan_realized_share(plan, windows_virtual_now()) : 1.0;
  windows_chain_stats(&stats->share, &stats->mean_window_nanos, &stats->schedule_flips, &stats->requested_share);
  stats->mean_share = cap.running ? plan_meant_share(plan, stats->vm_allocations) : stats->share;
  stats->min_share = plan->min_share;
  stats->share_auto = cap.running && plan->auto_share;
  stats->share_changes = plan->chain.share_changes;
  stats->share_changes_waited = plan->share_changes_waited;
  stats->hook_cost_share = plan->hook_cost_share;
  stats->stretches = plan->stretch_count;
  stats->stretch_scale_min = plan->stretch_scale_min;
  stats->stretch_scale_max = plan->stretch_scale_max;
  double last_scale;
  stats->open_stretch_scale = 1.0;
  if (cap.running) plan_tail_scales(plan, stats->vm_allocations, &last_scale, &stats->open_stretch_scale);
  stats->ticker_wakeups = ws.ticker_wakeups;
  stats->ticker_triggers = ws.ticker_triggers;
  stats->ticker_cpu_nanos = ws.ticker_cpu_nanos;
  stats->ticker_idle_spells = ws.ticker_idle_spells;
}

double capture_hook_on_share(const capture_stats *stats) {
  return stats->vm_allocations == 0 ? 1.0 : (double)stats->hook_allocations / (double)stats->vm_allocations;
}

double capture_weight_scale_wanted(void) { return cap.running ? plan_weight_scale_wanted(plan, vm_allocations()) : 1.0; }
double capture_weight_scale(void) { return cap.running ? plan_weight_scale(plan, vm_allocations()) : 1.0; }

void capture_estimate(recorder_estimate *e) {
  uint64_t vm = vm_allocations();
  // The finite-population correction (variance.h) assumes one share over the run and windows that are
  // sampled in full; with the budget's share neither holds, and none is made (the bars err wide).
  double fpc_share = plan->auto_share ? 0.0 : plan->chain.share;
  double last_scale = 1.0, open_scale = 1.0;
  if (cap.running) plan_tail_scales(plan, vm, &last_scale, &open_scale);
  // The last closed stretch's samples: the plan's scale for them (pooled with the open stretch while
  // that is young); with none closed in the plan, the recorder's own table (Testing.close_stretch).
  if (!cap.running || plan->stretch_count == 0) last_scale = -1.0;
  *e = (recorder_estimate){.scale = open_scale, .last_scale = last_scale, .windowed = cap.running && cap.config.windowed, .share = fpc_share};
  if (e->windowed && plan->window_open) {
    e->has_open_window = true;
    e->open_window = plan->window;
    e->open_allocations = (double)plan_open_window_allocations(plan, vm);
  }
}
