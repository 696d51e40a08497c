#include "capture.h"

#include <pthread.h>
#include <stdio.h>
#include <ruby/debug.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "budget.h"
#include "sampler.h"

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
  uint64_t countdown; // allocations left until the next sample
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
  recorder_track(cap.recorder, obj, cap.frame_ids, count, class_id, (uint32_t)rb_gc_count(), cap.sampler.sample_every);
}

static uint64_t now_nanos(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

// Charges sampling work that started at started to the budget, which may change the rate.
static void charge(uint64_t started) {
  uint64_t now = now_nanos();
  if (budget_spend(&cap.budget, now - started, now)) sampler_set_every(&cap.sampler, cap.budget.current_every);
}

// Kept out of line, so on_newobj's common path needs no stack frame or saved registers.
__attribute__((noinline, cold)) static void take_sample(VALUE tracepoint) {
  uint64_t started = now_nanos();
  sample(rb_tracearg_object(rb_tracearg_from_tracepoint(tracepoint)));
  charge(started);
  cap.countdown = sampler_next_countdown(&cap.sampler);
}

static void on_newobj(VALUE tracepoint, void *unused) {
  (void)unused;
  if (__builtin_expect(--cap.countdown != 0, 1)) return;
  take_sample(tracepoint);
}

static void on_gc_end_mark(VALUE tracepoint, void *unused) {
  (void)tracepoint;
  (void)unused;
  uint64_t started = now_nanos();
  cap.stats.gc_end_marks++;
  // Ruby runs no internal-event hook while another one runs, so a GC triggered by an allocation inside
  // someone else's NEWOBJ hook has no GC_END_MARK for us: the records of objects it swept were not
  // dropped (recorder_on_gc_end_mark copes with their free slots). Counted, never silent.
  uint32_t gc_count = (uint32_t)rb_gc_count();
  if (gc_count - cap.last_gc_count > 1) cap.stats.gc_end_marks_missed += gc_count - cap.last_gc_count - 1;
  cap.last_gc_count = gc_count;
  recorder_on_gc_end_mark(cap.recorder);
  check_invariants();
  charge(started);
}

// ---- The holder object: how the GC sees capture's state ----

static void holder_mark(void *unused) {
  (void)unused;
  rb_gc_mark(cap.newobj_hook);
  rb_gc_mark(cap.gc_hook);
  names_mark(cap.names);
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
  cap.countdown = sampler_next_countdown(&cap.sampler);
  cap.last_gc_count = (uint32_t)rb_gc_count();
  cap.failure = NULL;
  cap.invalid_seen = 0;
  cap.running = true;
  rb_tracepoint_enable(cap.gc_hook);
  rb_tracepoint_enable(cap.newobj_hook);
  return true;
}

void capture_stop(void) {
  if (!cap.running) return;
  rb_tracepoint_disable(cap.newobj_hook);
  rb_tracepoint_disable(cap.gc_hook);
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
  stats->current_every = cap.sampler.sample_every;
  stats->rate_adjustments = cap.budget.adjustments;
  stats->sampling_nanos = cap.budget.total_spent;
  stats->last_overhead = cap.budget.last_overhead;
}
