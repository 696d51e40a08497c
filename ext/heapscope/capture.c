#include "capture.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <ruby/debug.h>
#include <stdlib.h>
#include <string.h>
#ifdef HAVE_PRCTL
#include <sys/prctl.h>
#endif
#include <time.h>
#include <unistd.h>

#include <ruby/version.h>
#include <ruby/vm.h>

#include "capture_internal.h"
#include "population.h"
#include "ticker.h"

capture_state cap;
schedule sched;
pthread_mutex_t sched_lock = PTHREAD_MUTEX_INITIALIZER;
uint64_t own_nanos;
int hook_applied;
double hook_cost_nanos = -1.0;
static labelsets *label_table; // the process's label sets (capture_labels)
static ID id_labels_local;     // CAPTURE_LABELS_LOCAL

// ---- The fail-safe ----

void capture_fail(const char *reason) {
  if (cap.failure != NULL) return;
  cap.failure = reason;
  cap.countdown = UINT64_MAX; // the hook only counts down from now on; capture_stop removes it
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

// ---- The hooks (inside the allocation or the GC: no Ruby allocation, no raise) ----


// The frame id of {frame, line} (interning the frame's code and the frame if new); 0 when memory is short.
static uint32_t frame_id_of(VALUE frame, int line) {
  uint64_t key = (uint64_t)frame ^ ((uint64_t)(uint32_t)line * 0x9e3779b97f4a7c15ull);
  frame_cache_entry *entry = &cap.frame_cache[(key ^ (key >> 29)) & (FRAME_CACHE_SIZE - 1)];
  if (entry->frame == frame && entry->line == line && entry->frame_id != 0) return entry->frame_id;
  uint32_t code_id = names_code_id(cap.names, frame);
  if (code_id == 0) return 0;
  uint32_t frame_id = stacktab_intern_frame(recorder_stacks(cap.recorder), (hs_frame){code_id, line});
  if (frame_id != 0) *entry = (frame_cache_entry){frame, line, frame_id};
  return frame_id;
}

static bool thread_excluded(VALUE thread) {
  for (uint32_t i = 0; i < cap.excluded_count; i++) {
    if (cap.excluded_threads[i] == thread) return true;
  }
  return false;
}

// Captures the current stack and class of obj and hands them to the recorder, as standing for weight
// allocations.
// The label set in force in the allocating fiber: the id in its fiber-local (set by Heapscope.with_labels
// in Ruby), plus, with label_threads, the native thread's name (Ruby names the native thread after
// Thread#name, or file:line of its block; Linux keeps 15 bytes). rb_thread_local_aref reads the fiber's
// local table: no allocation, no Ruby code. Only on the sampled path.
// A small cache of {thread, set in force} -> set with its thread label: the kernel call and the set lookup
// cost about 2 us a sample where syscalls are slow. An entry is read again after THREAD_LABEL_REUSE uses,
// so a renamed thread (or a new one in a dead one's slot) carries a stale name for at most that many samples.
#define THREAD_LABEL_CACHE 16
#define THREAD_LABEL_REUSE 64
static struct {
  VALUE thread;
  uint32_t base, labelled, uses;
} thread_labels[THREAD_LABEL_CACHE];

static uint32_t with_thread_label(uint32_t set) {
  VALUE thread = rb_thread_current();
  size_t slot = ((size_t)thread >> 4) % THREAD_LABEL_CACHE;
  if (thread_labels[slot].thread == thread && thread_labels[slot].base == set && thread_labels[slot].uses < THREAD_LABEL_REUSE) {
    thread_labels[slot].uses++;
    return thread_labels[slot].labelled;
  }
  uint32_t labelled = set;
#ifdef HAVE_PRCTL
  char name[17] = {0};
  if (prctl(PR_GET_NAME, name, 0, 0, 0) == 0 && name[0] != '\0') labelled = labelsets_with(label_table, set, "thread", 6, name, strlen(name));
#endif
  thread_labels[slot].thread = thread;
  thread_labels[slot].base = set;
  thread_labels[slot].labelled = labelled;
  thread_labels[slot].uses = 0;
  return labelled;
}

static uint32_t current_labels(void) {
  if (label_table == NULL) return LABELSET_NONE;
  VALUE id = rb_thread_local_aref(rb_thread_current(), id_labels_local);
  uint32_t set = LABELSET_NONE;
  if (RB_FIXNUM_P(id) && FIX2LONG(id) > 0 && FIX2LONG(id) < (long)labelsets_id_limit(label_table)) set = (uint32_t)FIX2LONG(id);
  if (cap.config.label_threads) set = with_thread_label(set);
  return set;
}

static void sample(VALUE obj, uint32_t weight) {
  cap.stats.samples_taken++;
  if (population_is_internal(obj)) {
    cap.stats.skipped_internal++;
    return;
  }
  // heapscope's own threads are not part of the program profiled: their allocations are left out of
  // the population (every other allocation keeps its probability).
  if (cap.excluded_count != 0 && thread_excluded(rb_thread_current())) {
    cap.stats.skipped_own++;
    return;
  }
  int n = rb_profile_frames(0, (int)cap.config.max_frames, cap.frames, cap.lines);
  uint32_t count = 0;
  for (int i = 0; i < n; i++) {
    uint32_t frame_id = frame_id_of(cap.frames[i], cap.lines[i]);
    if (frame_id == 0) {
      cap.stats.dropped_no_memory++;
      return;
    }
    cap.frame_ids[count++] = frame_id;
  }
  if (n == (int)cap.config.max_frames) {
    // Count the rest with one more walk into scratch space. (rb_profile_frames' start argument
    // cannot be used for this: on Ruby 3.1 a start > 0 never advances, and the call never returns.)
    int total = rb_profile_frames(0, DEPTH_LIMIT, cap.scratch_frames, cap.scratch_lines);
    if (total > n) {
      hs_frame marker = {0, total - n}; // code 0: "N frames omitted"
      if ((cap.frame_ids[count++] = stacktab_intern_frame(recorder_stacks(cap.recorder), marker)) == 0) {
        cap.stats.dropped_no_memory++;
        return;
      }
      cap.stats.frames_truncated++;
    }
  }
  uint32_t class_id = names_class_id(recorder_strings(cap.recorder), obj);
  if (class_id == STRTAB_ERROR) {
    cap.stats.dropped_no_memory++;
    return;
  }
  // Always-on sampling draws every allocation independently: each sample is a cluster of its own.
  if (!cap.config.windowed) cap.window++;
  recorder_track(cap.recorder, obj, cap.frame_ids, count, class_id, (uint32_t)rb_gc_count(), weight, cap.window,
                 current_labels());
}

uint64_t capture_now_nanos(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

// A weight as a whole number: w itself when it is one, else floor(w) or floor(w) + 1 at random, with the
// mean w, so that estimates stay unbiased (a weight's rounding adds a variance of at most 1/4).
static uint32_t whole_weight(double w) {
  if (!(w < 4294967295.0)) return UINT32_MAX;
  double whole = round(w);
  if (fabs(w - whole) < 1e-6 * w) return whole < 1.0 ? 1u : (uint32_t)whole;
  double below = floor(w);
  uint32_t weight = (uint32_t)below + (sampler_uniform(&cap.sampler) < w - below ? 1u : 0u);
  return weight < 1u ? 1u : weight;
}

// Loads the countdown to the next sample, at the rate in force (the budget's). Windowed, the rate inside
// windows is 1 / share times that, and denser still where late sync points lost windows
// (schedule_window_every); a sample weighs what its in-window rate makes it (schedule_weight).
void capture_draw_countdown(void) {
  uint32_t every = cap.budget.current_every;
  if (!cap.config.windowed) {
    sampler_set_every(&cap.sampler, every);
    cap.draw_weight = every;
  } else {
    uint32_t in_window = schedule_window_every(&sched, every, cap.seen_share);
    sampler_set_every(&cap.sampler, in_window);
    cap.draw_weight = whole_weight(schedule_weight(&sched, in_window));
  }
  cap.step = cap.countdown = sampler_next_countdown(&cap.sampler);
}

// Charges heapscope's own time: work that started at started, plus what the hook itself cost the
// allocations it saw since the last charge. Both leave virtual time (schedule.h); sampling work also
// counts against the budget, which may change the rate (from the next countdown on).
//
// The hook's part is an estimate (allocations x the cost measured at load), and it is never charged
// more than half of the rest of the time since the last charge: an estimate too high (measured on a
// busy machine: 182 ns for about 40) would otherwise stop virtual time while the hook is on, so the
// chain could never flip off and the window stayed open for 97% of allocations.
void capture_charge(uint64_t started) {
  uint64_t now = capture_now_nanos();
  uint64_t work = now - started;
  double hook = cap.uncharged_allocations * (hook_cost_nanos > 0 ? hook_cost_nanos : 0.0);
  uint64_t since = cap.last_charged_nanos != 0 && now > cap.last_charged_nanos ? now - cap.last_charged_nanos : 0;
  double rest = since > work ? (double)(since - work) : 0.0;
  if (hook > 0.5 * rest) hook = 0.5 * rest;
  cap.uncharged_allocations = 0;
  cap.last_charged_nanos = now;
  add_own_nanos(work + (uint64_t)hook);
  budget_spend(&cap.budget, work, now);
}

// Kept out of line, so on_newobj's common path needs no stack frame or saved registers.
__attribute__((noinline, cold)) static void on_countdown(VALUE tracepoint) {
  // Only here, on the sampled path: the common path stays a decrement and a branch.
  if (!capture_ractor_guard()) return;
  cap.hook_allocations += cap.step;
  cap.uncharged_allocations += cap.step;
  uint64_t started = capture_now_nanos();
  sample(rb_tracearg_object(rb_tracearg_from_tracepoint(tracepoint)), cap.draw_weight);
  capture_charge(started);
  if (cap.failure != NULL) {
    cap.countdown = UINT64_MAX; // the fail-safe: count down forever until capture_stop
    return;
  }
  capture_draw_countdown();
}

static void on_newobj(VALUE tracepoint, void *unused) {
  (void)unused;
  if (__builtin_expect(--cap.countdown != 0, 1)) return;
  on_countdown(tracepoint);
}

// ---- Liveness: GCs without our pass, suspects, the GC_END_MARK hook ----

// GCs up to number upto (rb_gc_count() values) that ran after our last liveness pass had none: the
// records of objects allocated before the last of them may point at swept slots on freed pages, so
// they become suspects (recorder.h). Counted, never silent. Reads no object; may run inside the GC.
static void account_unseen_gcs(uint32_t upto) {
  if ((int32_t)(upto - cap.last_gc_count) <= 0) return;
  cap.stats.gc_end_marks_missed += upto - cap.last_gc_count;
  cap.last_gc_count = upto;
  recorder_distrust(cap.recorder, upto);
}

// Suspects are checked outside the GC, soon: a postponed job runs at the thread's next interrupt check.
// (Until then they are neither dropped when they die nor read; a profile checks them first anyway.)
static void settle_job(void *unused) {
  (void)unused;
  if (cap.running && cap.failure == NULL && capture_ractor_guard()) capture_settle_records();
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
  if (!capture_ractor_guard()) return;
  uint64_t started = capture_now_nanos();
  cap.stats.gc_end_marks++;
  // Ruby runs no internal-event hook while another one runs, so a GC triggered by an allocation inside
  // someone else's NEWOBJ hook has no GC_END_MARK for us (nor has a GC Ruby 3.1's windowed mode could
  // not register in). This GC started as number gc_count, so those after our last pass and before it
  // were unseen: the records they could have invalidated become suspects, checked soon after.
  uint32_t gc_count = (uint32_t)rb_gc_count();
  account_unseen_gcs(gc_count - 1);
  cap.last_gc_count = gc_count;
  recorder_on_gc_end_mark(cap.recorder);
  if (recorder_has_suspects(cap.recorder)) schedule_settle();
  check_invariants();
  capture_charge(started);
  // Windowed: registered for this GC only (windows_on_gc_marking). Ruby removes it once this returns.
  if (cap.config.windowed && !cap.gc_stress) {
    rb_tracepoint_disable(cap.gc_hook);
    cap.gc_hook_on = false;
  }
}
static VALUE sym_total_allocated_objects, sym_state, sym_marking;

size_t capture_vm_allocations(void) { return rb_gc_stat(sym_total_allocated_objects); }

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

void capture_prepare_snapshot(void) {
  if (!cap.running) return;
  // A profile is a sync point too (its moment does not depend on the schedule). First: registering may
  // start a GC, which the settling after it accounts for.
  if (cap.config.windowed && cap.failure == NULL) windows_sync_outside_gc();
  capture_settle_records();
}

bool capture_exclude_thread(VALUE thread) {
  if (thread_excluded(thread)) return true;
  if (cap.excluded_count == MAX_EXCLUDED_THREADS) return false;
  cap.excluded_threads[cap.excluded_count++] = thread;
  return true;
}

void capture_include_thread(VALUE thread) {
  for (uint32_t i = 0; i < cap.excluded_count; i++) {
    if (cap.excluded_threads[i] != thread) continue;
    cap.excluded_threads[i] = cap.excluded_threads[--cap.excluded_count];
    return;
  }
}

// ---- The holder object: how the GC sees capture's state ----

static void holder_mark(void *unused) {
  (void)unused;
  rb_gc_mark(cap.newobj_hook);
  rb_gc_mark(cap.gc_hook);
  // Pinned (rb_gc_mark): the hook compares thread VALUEs, so they must not move.
  for (uint32_t i = 0; i < cap.excluded_count; i++) rb_gc_mark(cap.excluded_threads[i]);
  names_mark(cap.names);
  // dmark also runs outside any GC (ObjectSpace.reachable_objects_from): only a GC is news.
  if (!cap.running || cap.failure != NULL || !rb_during_gc()) return;
  // Another Ractor's GC: registering from here would put the hooks in that Ractor (ractors.h).
  if (!capture_ractor_guard()) return;
  capture_ractor_on_gc_marking(); // before windows: this GC may be the last chance before a Ractor starts
  if (cap.config.windowed && !cap.ractor_pause) windows_on_gc_marking();
}

static void holder_compact(void *unused) {
  (void)unused;
  if (cap.recorder) recorder_on_compact(cap.recorder);
}

size_t capture_memory(void) {
  if (!cap.running) return 0;
  size_t buffers = (sizeof(VALUE) + sizeof(int)) * ((size_t)cap.config.max_frames + DEPTH_LIMIT) +
                   sizeof(uint32_t) * (cap.config.max_frames + 1) + sizeof(frame_cache_entry) * FRAME_CACHE_SIZE;
  return sizeof(cap) + buffers + names_memory(cap.names);
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

// Around fork: the schedule's lock must not be held by the ticker in the child, which has no ticker.
static void lock_before_fork(void) { pthread_mutex_lock(&sched_lock); }
static void unlock_in_parent(void) { pthread_mutex_unlock(&sched_lock); }
static void reset_in_child(void) {
  pthread_mutex_unlock(&sched_lock); // held by this thread, the only one left
  // The child keeps its records (those objects are alive in it too) but must not draw the same
  // sample positions as its parent. No I/O here: only async-signal-safe calls are allowed after fork.
  uint64_t seed = sampler_random(&cap.sampler) ^ ((uint64_t)getpid() << 17) ^ capture_now_nanos();
  uint32_t every = cap.sampler.sample_every;
  sampler_init(&cap.sampler, every, seed);
  sampler_init(&sched.random, 2, seed ^ 0x5851f42d4c957f2dull);
  if (ticker_running()) {
    ticker_forget_after_fork();
    cap.ticker_lost = cap.running;
  }
}

static void stop_ticker_at_exit(ruby_vm_t *vm) {
  (void)vm;
  ticker_stop();
}

void capture_init(void) {
  // The GC calls dmark and dcompact only for a non-NULL data pointer.
  cap.holder = TypedData_Wrap_Struct(rb_cObject, &holder_type, &cap);
  rb_gc_register_mark_object(cap.holder);
  cap.newobj_hook = rb_tracepoint_new(0, RUBY_INTERNAL_EVENT_NEWOBJ, on_newobj, NULL);
  cap.gc_hook = rb_tracepoint_new(0, RUBY_INTERNAL_EVENT_GC_END_MARK, on_gc_end_mark, NULL);
  sym_total_allocated_objects = ID2SYM(rb_intern("total_allocated_objects"));
  sym_state = ID2SYM(rb_intern("state"));
  sym_marking = ID2SYM(rb_intern("marking"));
  (void)rb_gc_latest_gc_info(sym_state); // interns its own keys on first use: here, not later
  // The first GC.stat call interns Ruby's own key symbols (allocating): here, not inside the GC. (An
  // unknown key raises, here too: total_allocated_objects is in every GC.stat since 2.1.)
  (void)rb_gc_stat(sym_total_allocated_objects);
#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
  settle_job_handle = rb_postponed_job_preregister(0, settle_job, NULL);
#endif
  windows_init();
  ractors_init();
  id_labels_local = rb_intern(CAPTURE_LABELS_LOCAL);
  label_table = labelsets_new(1000);
  // Once per process, at load: it allocates (20,000 objects), which inside Heapscope.start would be GCs
  // the run did not see.
  windows_calibrate_hook_cost();
  // The ticker must be gone before the VM it posts jobs to is.
  ruby_vm_at_exit(stop_ticker_at_exit);
  pthread_atfork(lock_before_fork, unlock_in_parent, reset_in_child);
}

// ---- Lifecycle ----

static void free_buffers(void) {
  recorder_free(cap.recorder);
  names_free(cap.names);
  free(cap.frames);
  free(cap.lines);
  free(cap.scratch_frames);
  free(cap.scratch_lines);
  free(cap.frame_ids);
  free(cap.frame_cache);
  cap.frame_cache = NULL;
  cap.recorder = NULL;
  cap.names = NULL;
  cap.frames = cap.scratch_frames = NULL;
  cap.lines = cap.scratch_lines = NULL;
  cap.frame_ids = NULL;
}

bool capture_start(const capture_config *config) {
  if (cap.running) return false;
  cap.config = *config;
  cap.config.recorder.windowed = config->windowed;
  cap.recorder = recorder_new(&cap.config.recorder);
  cap.names = names_new();
  cap.frames = malloc(sizeof(VALUE) * config->max_frames);
  cap.lines = malloc(sizeof(int) * config->max_frames);
  cap.scratch_frames = malloc(sizeof(VALUE) * DEPTH_LIMIT);
  cap.scratch_lines = malloc(sizeof(int) * DEPTH_LIMIT);
  cap.frame_ids = malloc(sizeof(uint32_t) * (config->max_frames + 1));
  cap.frame_cache = calloc(FRAME_CACHE_SIZE, sizeof(frame_cache_entry));
  if (!cap.recorder || !cap.names || !cap.frames || !cap.lines || !cap.scratch_frames || !cap.scratch_lines || !cap.frame_ids ||
      !cap.frame_cache) {
    free_buffers();
    return false;
  }
  memset(&cap.stats, 0, sizeof cap.stats);
  uint64_t seed = sampler_seed_from_os();
  sampler_init(&cap.sampler, config->sample_every, seed);
  budget_init(&cap.budget, config->max_overhead, config->sample_every, capture_now_nanos());
  pthread_mutex_lock(&sched_lock);
  schedule_init(&sched, config->windowed ? config->window_share : 1.0, config->sample_every, windows_virtual_now(), seed ^ 0x2545f4914f6cdd1dull);
  pthread_mutex_unlock(&sched_lock);
  cap.last_gc_count = (uint32_t)rb_gc_count();
  cap.failure = NULL;
  capture_ractors_start();
  cap.invalid_seen = 0;
  cap.window_open = false;
  cap.ticker_lost = false;
  cap.syncing = false;
  cap.gc_stress_polled = false;
  cap.hook_allocations = cap.uncharged_allocations = 0;
  cap.last_charged_nanos = capture_now_nanos();
  cap.last_marking_gc = cap.last_gc_count;
  cap.started_allocations = capture_vm_allocations();
  cap.started_virtual = windows_virtual_now();
  cap.closed_windows_virtual = 0;
  cap.seen_share = 0.0;
  cap.next_density_check = cap.started_virtual + SCHEDULE_FIRST_RETUNE_NANOS;
  capture_draw_countdown();
  if (config->windowed) {
    // Windows open and close at sync points: now, at GCs (which also register GC_END_MARK each time)
    // and at the ticker's jobs.
    cap.gc_hook_on = false;
    if (cap.gc_stress) windows_keep_gc_hook_registered(); // see capture_gc_stress_changed
    windows_sync_outside_gc();
    windows_start_ticker();
  } else {
    rb_tracepoint_enable(cap.gc_hook);
    rb_tracepoint_enable(cap.newobj_hook);
    cap.gc_hook_on = true;
    cap.window_open = true;
  }
  cap.running = true; // last: a GC inside the registrations above must not see a half-started capture
  return true;
}

static void disable_if_enabled(VALUE tracepoint) {
  if (RTEST(rb_tracepoint_enabled_p(tracepoint))) rb_tracepoint_disable(tracepoint);
}

void capture_stop(void) {
  if (!cap.running) return;
  ticker_stop();
  disable_if_enabled(cap.newobj_hook);
  disable_if_enabled(cap.gc_hook);
  cap.window_open = cap.gc_hook_on = false;
  __atomic_store_n(&hook_applied, 0, __ATOMIC_RELAXED);
  cap.running = false;
  free_buffers();
}

bool capture_running(void) { return cap.running; }
const capture_config *capture_current_config(void) { return &cap.config; }
recorder *capture_recorder(void) { return cap.recorder; }

void capture_check_invariants(void) {
  if (cap.running) check_invariants();
}
names *capture_names(void) { return cap.names; }
labelsets *capture_labels(void) { return label_table; }
void capture_get_stats(capture_stats *stats) {
  *stats = cap.stats;
  stats->current_every = cap.budget.current_every;
  stats->max_every = cap.budget.max_every;
  stats->vm_allocations = cap.running ? capture_vm_allocations() - cap.started_allocations : 0;
  stats->hook_allocations = !cap.config.windowed ? stats->vm_allocations
                            : cap.hook_allocations + (cap.window_open ? cap.step - cap.countdown : 0);
  stats->window_every = cap.sampler.sample_every;
  stats->window_seen_share = cap.seen_share;
  stats->rate_adjustments = cap.budget.adjustments;
  stats->sampling_nanos = cap.budget.total_spent;
  stats->last_overhead = cap.budget.last_overhead;
  stats->own_nanos = __atomic_load_n(&own_nanos, __ATOMIC_RELAXED);
  stats->hook_cost_nanos = hook_cost_nanos;
  stats->window = cap.window;
  stats->realized_share = 1.0;
  if (cap.running && cap.config.windowed) {
    uint64_t now = windows_virtual_now(), on = cap.closed_windows_virtual;
    if (cap.window_open && now > cap.window_opened_virtual) on += now - cap.window_opened_virtual;
    stats->realized_share = now > cap.started_virtual ? (double)on / (double)(now - cap.started_virtual) : 0.0;
  }
  pthread_mutex_lock(&sched_lock);
  stats->share = sched.share;
  stats->requested_share = cap.running && cap.config.windowed ? schedule_requested_share(&sched, windows_virtual_now()) : 1.0;
  stats->mean_window_nanos = sched.mean_on_nanos;
  stats->schedule_flips = sched.flips;
  pthread_mutex_unlock(&sched_lock);
  ticker_stats ts;
  ticker_get_stats(&ts);
  stats->ticker_wakeups = ts.wakeups;
  stats->ticker_triggers = ts.triggers;
}
