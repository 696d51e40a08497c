#include "capture.h"

#include <pthread.h>
#include <stdio.h>
#include <ruby/debug.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ruby/version.h>

#include "budget.h"
#include "sampler.h"
#include "window.h"

#ifdef HAVE_RB_GC_DISABLE_NO_REST
VALUE rb_gc_disable_no_rest(void); // exported, declared only in Ruby's internal headers
#endif
// Ruby 3.1 has no rb_gc_disable_no_rest: inside the GC a malloc must then stay this far below the
// malloc limit, or it would start a GC inside the GC (see may_register_in_gc).
#if !defined(HAVE_RB_GC_DISABLE_NO_REST) && RUBY_API_VERSION_CODE < 30200
#define MALLOC_LIMIT_GUARD 1
#define MALLOC_LIMIT_MARGIN (1u << 20)
#endif

// A direct-mapped cache from what rb_profile_frames returns, {frame VALUE, line}, to the frame id it
// was interned as: most samples repeat frames already seen, and a hit skips two hash-table lookups.
// Entries stay valid for the whole run (frames are never freed, frame VALUEs stay pinned by names).
#define FRAME_CACHE_SIZE 4096
typedef struct {
  VALUE frame;
  int32_t line;
  uint32_t frame_id; // 0 = empty
} frame_cache_entry;

// How deep a stack is counted when it is deeper than max_frames (Ruby raises SystemStackError before
// that with default stack sizes; deeper stacks are counted as this deep).
#define DEPTH_LIMIT 16384

static struct {
  bool running;
  uint64_t countdown; // allocations left until the hook's next event: a sample or the window's end
  uint64_t step;      // what countdown was last loaded with
  uint64_t to_sample; // allocations until the next sample, as of the last load
  uint64_t to_close;  // allocations until the window closes, as of the last load (UINT64_MAX: never)
  sampler sampler;
  budget budget;
  capture_config config;
  recorder *recorder;
  names *names;

  VALUE *frames;                // max_frames, filled by rb_profile_frames
  int *lines;
  VALUE *scratch_frames;        // DEPTH_LIMIT, to count frames past max_frames
  int *scratch_lines;
  uint32_t *frame_ids;          // max_frames + 1 (room for the "frames omitted" marker)
  frame_cache_entry *frame_cache; // FRAME_CACHE_SIZE

  VALUE holder, newobj_hook, gc_hook;
  uint32_t last_gc_count; // rb_gc_count() at the last GC_END_MARK (or at start)

  // Windowed sampling (window.h)
  bool window_open;        // the NEWOBJ hook is on
  bool strides_started;    // the first stride started (stride_started_at is set)
  bool stride_has_window;  // the current stride got a window (window is its plan)
  bool gc_hook_on;         // the GC_END_MARK hook is on
  bool gc_stress;          // GC.stress is on (Ruby 3.1: nothing is registered inside the GC then)
  uint32_t last_marking_gc; // rb_gc_count() of the last GC whose marking was handled
  window_plan window;      // the current stride's window
  uint64_t stride_started_at; // the VM's allocation count when the current stride started
  double expected_stride;  // a moving average of stride lengths
  uint64_t window_sampled; // allocations the closed window's sampled part saw (its length, unless cut short)
  uint64_t closed_window_allocations; // allocations seen with the hook on, in windows closed so far
  uint64_t started_allocations;       // the VM's allocation count at start
  const char *failure;    // set by capture_fail: sampling is off until the next start
  uint64_t invalid_seen;  // the recorder's invalid_records when last checked
  capture_stats stats;
} cap;

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

static bool is_internal(VALUE obj) {
  // Hidden objects (no class) are the VM's own: Ruby 4.0 allocates method-cache tables on the heap.
  if (RBASIC_CLASS(obj) == 0) return true;
  switch (RB_BUILTIN_TYPE(obj)) {
    case RUBY_T_IMEMO: case RUBY_T_ICLASS: case RUBY_T_NONE: case RUBY_T_ZOMBIE: case RUBY_T_MOVED:
#ifdef T_NODE
    case T_NODE:
#endif
      return true;
    default:
      return false;
  }
}

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

// Captures the current stack and class of obj and hands them to the recorder.
static void sample(VALUE obj) {
  cap.stats.samples_taken++;
  if (is_internal(obj)) {
    cap.stats.skipped_internal++;
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
  // In a window the weight is known only once the window's stride ends: 0 makes the sample pending.
  uint32_t weight = cap.config.windowed ? 0 : cap.sampler.sample_every;
  recorder_track(cap.recorder, obj, cap.frame_ids, count, class_id, (uint32_t)rb_gc_count(), weight);
}

static uint64_t now_nanos(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

// Charges sampling work that started at started to the budget, which may change the rate (in windowed
// mode, from the next window on: window plans read the budget's rate).
static void charge(uint64_t started) {
  uint64_t now = now_nanos();
  if (budget_spend(&cap.budget, now - started, now) && !cap.config.windowed) {
    sampler_set_every(&cap.sampler, cap.budget.current_every);
  }
}

static size_t vm_allocations(void);

static void load_countdown(void) {
  cap.step = cap.to_sample < cap.to_close ? cap.to_sample : cap.to_close;
  cap.countdown = cap.step;
}

// Allocations the hook has seen in the current window (0 when none is open).
static uint64_t window_seen(void) {
  if (!cap.window_open) return 0;
  return cap.window.delay + cap.window.length - cap.to_close + (cap.step - cap.countdown);
}

// Ends the current window: from inside the hook when its length is done (Ruby removes a hook disabled
// while it runs once it returns), or inside a GC that ends its stride first (cut short). Then
// allocations are back on the VM's fast path.
static void close_window(void) {
  uint64_t seen = window_seen();
  cap.closed_window_allocations += seen;
  cap.window_sampled = seen > cap.window.delay ? seen - cap.window.delay : 0;
  cap.window_open = false;
  cap.countdown = UINT64_MAX;
  rb_tracepoint_disable(cap.newobj_hook);
}

// Ends the current stride and starts the next one (window.h), at start (outside the GC) and at every GC
// (inside it): the ending stride's samples get their weight, and the new stride gets a window if its
// coin says so. The caller makes registering the hook safe (it mallocs).
static void next_stride(uint64_t allocations) {
  uint64_t stride = allocations - cap.stride_started_at;
  window_plan plan;
  bool open;
  if (!cap.strides_started) {
    size_t gcs = rb_gc_count();
    uint64_t gc_interval = gcs ? allocations / gcs : allocations; // the VM's average so far
    window_plan_first(cap.config.window_share, cap.budget.current_every, gc_interval, sampler_random(&cap.sampler), &plan);
    open = true;
  } else {
    if (cap.stride_has_window) {
      recorder_commit_pending(cap.recorder, window_weight(&cap.window, cap.window_sampled, stride), sampler_random(&cap.sampler));
    }
    // The next stride is expected to be like the recent ones: the smoother the guess, the steadier the
    // weights of windows that a coin let through (window.h).
    cap.expected_stride = cap.expected_stride == 0 ? (double)stride : 0.75 * cap.expected_stride + 0.25 * (double)stride;
    open = window_plan_next(cap.config.window_share, (uint64_t)cap.expected_stride, cap.budget.current_every,
                            sampler_random(&cap.sampler), sampler_random(&cap.sampler),
                            cap.stats.windows_opened < WINDOW_WARM_UP, &plan);
  }
  cap.strides_started = true;
  cap.stride_started_at = allocations;
  cap.stride_has_window = open;
  if (!open) {
    cap.stats.windows_skipped++;
    return;
  }
  cap.window = plan;
  sampler_set_every(&cap.sampler, plan.every);
  cap.to_sample = plan.delay + sampler_next_countdown(&cap.sampler);
  cap.to_close = plan.delay + plan.length;
  load_countdown();
  cap.window_open = true;
  cap.stats.windows_opened++;
  rb_tracepoint_enable(cap.newobj_hook);
}

// Kept out of line, so on_newobj's common path needs no stack frame or saved registers.
__attribute__((noinline, cold)) static void on_countdown(VALUE tracepoint) {
  cap.to_sample -= cap.step;
  if (cap.to_close != UINT64_MAX) cap.to_close -= cap.step;
  cap.step = 0; // countdown is 0 too: to_close alone says how far the window has come
  if (cap.to_sample == 0) {
    uint64_t started = now_nanos();
    sample(rb_tracearg_object(rb_tracearg_from_tracepoint(tracepoint)));
    charge(started);
    cap.to_sample = sampler_next_countdown(&cap.sampler);
  }
  if (cap.failure != NULL) {
    cap.countdown = UINT64_MAX; // the fail-safe: count down forever until capture_stop
  } else if (cap.to_close == 0) {
    close_window();
  } else {
    load_countdown();
  }
}

static void on_newobj(VALUE tracepoint, void *unused) {
  (void)unused;
  if (__builtin_expect(--cap.countdown != 0, 1)) return;
  on_countdown(tracepoint);
}

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
  if (cap.running && cap.failure == NULL) capture_settle_records();
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
  uint64_t started = now_nanos();
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
  charge(started);
  // Windowed: registered for this GC only (see on_gc_marking). Ruby removes it once this returns.
  if (cap.config.windowed && !cap.gc_stress) {
    rb_tracepoint_disable(cap.gc_hook);
    cap.gc_hook_on = false;
  }
}

// ---- Windowed mode: registering hooks inside the GC ----

static VALUE sym_total_allocated_objects, sym_state, sym_marking;
#ifdef MALLOC_LIMIT_GUARD
static VALUE sym_malloc_increase_bytes, sym_malloc_increase_bytes_limit;
#endif

static size_t vm_allocations(void) { return rb_gc_stat(sym_total_allocated_objects); }

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
// opens a window unless one is open. Both hooks are removed again by themselves (on_gc_end_mark,
// close_window), so between windows no hook is registered at all.
static void on_gc_marking(void) {
  uint32_t gc = (uint32_t)rb_gc_count();
  if (gc == cap.last_marking_gc) return; // marked again in the same GC (incremental marking's finish)
  cap.last_marking_gc = gc;
  if (!may_register_in_gc()) {
    // No stride ends here then: the stride goes on to the next GC, window or not.
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
  // Every GC ends a stride, whether its window is done or not (a window still open is cut short here):
  // were a stride with a window to run on past a GC, windows would stand for longer strides than the
  // coins that let them through were drawn for, and estimates would come out high.
  if (cap.window_open) close_window();
  next_stride(vm_allocations());
#ifdef HAVE_RB_GC_DISABLE_NO_REST
  if (!RTEST(gc_was_disabled)) rb_gc_enable();
#endif
}

// Registers GC_END_MARK from outside the GC, to stay until a GC_END_MARK after GC.stress is off.
static void keep_gc_hook_registered(void) {
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
  if (on && cap.running && cap.config.windowed) keep_gc_hook_registered();
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

void capture_prepare_snapshot(void) {
  if (!cap.running) return;
  capture_settle_records();
  if (!cap.config.windowed || !cap.stride_has_window) return;
  uint64_t sampled = cap.window_sampled;
  if (cap.window_open) {
    uint64_t seen = window_seen();
    sampled = seen > cap.window.delay ? seen - cap.window.delay : 0;
  }
  recorder_set_pending_weight(cap.recorder, window_weight(&cap.window, sampled, vm_allocations() - cap.stride_started_at));
}

// ---- The holder object: how the GC sees capture's state ----

static void holder_mark(void *unused) {
  (void)unused;
  rb_gc_mark(cap.newobj_hook);
  rb_gc_mark(cap.gc_hook);
  names_mark(cap.names);
  // dmark also runs outside any GC (ObjectSpace.reachable_objects_from): only a GC is news.
  if (cap.running && cap.config.windowed && cap.failure == NULL && rb_during_gc()) on_gc_marking();
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

static void reseed_after_fork(void) {
  // The child keeps its records (those objects are alive in it too) but must not draw the same
  // sample positions as its parent. No I/O here: only async-signal-safe calls are allowed after fork.
  sampler_init(&cap.sampler, cap.sampler.sample_every, sampler_random(&cap.sampler) ^ ((uint64_t)getpid() << 17) ^ now_nanos());
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
#ifdef MALLOC_LIMIT_GUARD
  // Only the Ruby 3.1 path reads these (may_register_in_gc).
  sym_malloc_increase_bytes = ID2SYM(rb_intern("malloc_increase_bytes"));
  sym_malloc_increase_bytes_limit = ID2SYM(rb_intern("malloc_increase_bytes_limit"));
  (void)rb_gc_stat(sym_malloc_increase_bytes);
  (void)rb_gc_stat(sym_malloc_increase_bytes_limit);
#endif
#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
  settle_job_handle = rb_postponed_job_preregister(0, settle_job, NULL);
#endif
  pthread_atfork(NULL, NULL, reseed_after_fork);
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
  cap.recorder = recorder_new(&config->recorder);
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
  sampler_init(&cap.sampler, config->sample_every, sampler_seed_from_os());
  budget_init(&cap.budget, config->max_overhead, config->sample_every, now_nanos());
  cap.last_gc_count = (uint32_t)rb_gc_count();
  cap.failure = NULL;
  cap.invalid_seen = 0;
  cap.window_open = cap.strides_started = cap.stride_has_window = false;
  cap.expected_stride = 0;
  cap.closed_window_allocations = 0;
  cap.last_marking_gc = cap.last_gc_count;
  cap.started_allocations = vm_allocations();
  if (config->windowed) {
    // The first window opens now; the next ones inside GCs, which also register GC_END_MARK each time.
    cap.gc_hook_on = false;
    if (cap.gc_stress) keep_gc_hook_registered(); // see capture_gc_stress_changed
    next_stride(cap.started_allocations);
  } else {
    cap.to_close = UINT64_MAX;
    cap.to_sample = sampler_next_countdown(&cap.sampler);
    load_countdown();
    rb_tracepoint_enable(cap.gc_hook);
    rb_tracepoint_enable(cap.newobj_hook);
    cap.gc_hook_on = true;
  }
  cap.running = true; // last: a GC inside the registrations above must not see a half-started capture
  return true;
}

static void disable_if_enabled(VALUE tracepoint) {
  if (RTEST(rb_tracepoint_enabled_p(tracepoint))) rb_tracepoint_disable(tracepoint);
}

void capture_stop(void) {
  if (!cap.running) return;
  disable_if_enabled(cap.newobj_hook);
  disable_if_enabled(cap.gc_hook);
  cap.window_open = cap.gc_hook_on = false;
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
void capture_get_stats(capture_stats *stats) {
  *stats = cap.stats;
  stats->current_every = cap.config.windowed ? cap.budget.current_every : cap.sampler.sample_every;
  stats->vm_allocations = cap.running ? vm_allocations() - cap.started_allocations : 0;
  stats->hook_allocations = cap.config.windowed ? cap.closed_window_allocations + window_seen() : stats->vm_allocations;
  stats->window_every = cap.config.windowed ? cap.window.every : cap.sampler.sample_every;
  stats->rate_adjustments = cap.budget.adjustments;
  stats->sampling_nanos = cap.budget.total_spent;
  stats->last_overhead = cap.budget.last_overhead;
}
