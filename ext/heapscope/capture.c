#include "capture.h"

#include <pthread.h>
#include <ruby/debug.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "names.h"
#include "sampler.h"

#ifdef HAVE_RB_OBJSPACE_MARKED_OBJECT_P
int rb_objspace_marked_object_p(VALUE obj);
#endif
#ifdef HAVE_RB_OBJ_MEMSIZE_OF
size_t rb_obj_memsize_of(VALUE obj);
#endif

// Samples waiting for the postponed job. The job normally runs at the next method call or loop
// iteration, so a handful of slots suffice; C code that allocates many objects without reaching a
// safe point (e.g. String#split at sample_every 1) can fill it, and those samples are counted as
// dropped_pending_full.
#define PENDING_CAPACITY 64
// Frames counted (not kept) per rb_profile_frames call when a stack is deeper than max_frames.
#define OMITTED_CHUNK 256

typedef struct {
  VALUE obj;          // weak, like a record; Qundef once the object died (see on_gc_end_mark)
  uint32_t alloc_gc;
  uint32_t weight;
  uint32_t frame_count;
  uint32_t omitted;   // frames past max_frames
  VALUE *frames;      // max_frames slots in frame_arena
  int *lines;
} pending_sample;

static struct {
  bool running;
  uint64_t countdown; // allocations left until the next sample
  sampler sampler;
  capture_config config;
  recorder *recorder;
  names *names;

  pending_sample ring[PENDING_CAPACITY];
  uint32_t pending_head, pending_count;
  bool commit_scheduled;
  VALUE *frame_arena, *scratch_frames; // PENDING_CAPACITY * max_frames, OMITTED_CHUNK
  int *line_arena, *scratch_lines;
  uint32_t *frame_ids;                 // max_frames + 1, for the commit

  VALUE holder, newobj_hook, gc_hook;
  capture_stats stats;
} cap;

static void commit_pending(void *unused);

#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
static rb_postponed_job_handle_t commit_job = POSTPONED_JOB_HANDLE_INVALID;
#endif

// Asks the VM to run commit_pending at its next safe point. Async-signal-safe, allocation-free.
static void schedule_commit(void) {
#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
  cap.commit_scheduled = true;
  rb_postponed_job_trigger(commit_job);
#else
  // register_one fails only when the VM's job table is full; the next sample tries again.
  cap.commit_scheduled = rb_postponed_job_register_one(0, commit_pending, NULL) != 0;
#endif
}

// ---- The hooks (inside the allocation or the GC: no Ruby allocation, no raise) ----

static void on_newobj(VALUE tracepoint, void *unused) {
  (void)unused;
  if (--cap.countdown != 0) return;
  cap.countdown = sampler_next_countdown(&cap.sampler);
  cap.stats.samples_taken++;
  if (cap.pending_count == PENDING_CAPACITY) {
    cap.stats.dropped_pending_full++;
    return;
  }
  pending_sample *p = &cap.ring[(cap.pending_head + cap.pending_count) % PENDING_CAPACITY];
  p->obj = rb_tracearg_object(rb_tracearg_from_tracepoint(tracepoint));
  p->alloc_gc = (uint32_t)rb_gc_count();
  p->weight = cap.sampler.sample_every;
  int n = rb_profile_frames(0, (int)cap.config.max_frames, p->frames, p->lines);
  p->frame_count = n > 0 ? (uint32_t)n : 0;
  p->omitted = 0;
  if (p->frame_count == cap.config.max_frames) {
    int more;
    while ((more = rb_profile_frames((int)(cap.config.max_frames + p->omitted), OMITTED_CHUNK, cap.scratch_frames, cap.scratch_lines)) > 0) {
      p->omitted += (uint32_t)more;
    }
    if (p->omitted > 0) cap.stats.frames_truncated++;
  }
  cap.pending_count++;
  if (!cap.commit_scheduled) schedule_commit();
}

static void on_gc_end_mark(VALUE tracepoint, void *unused) {
  (void)tracepoint;
  (void)unused;
  cap.stats.gc_end_marks++;
  recorder_on_gc_end_mark(cap.recorder);
  for (uint32_t i = 0; i < cap.pending_count; i++) {
    pending_sample *p = &cap.ring[(cap.pending_head + i) % PENDING_CAPACITY];
    if (p->obj != Qundef && !rb_objspace_marked_object_p(p->obj)) {
      p->obj = Qundef;
      cap.stats.died_before_commit++;
    }
  }
}

// ---- Committing (postponed job: may allocate) ----

static uint64_t now_nanos(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

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

static void commit_one(pending_sample *p) {
  if (p->obj == Qundef) return;
  if (is_internal(p->obj)) {
    cap.stats.skipped_internal++;
    return;
  }
  // A local reference keeps the object alive (and unmoved: the machine stack pins) if resolving
  // names allocates and so runs a GC.
  volatile VALUE obj = p->obj;
  strtab *strings = recorder_strings(cap.recorder);
  stacktab *stacks = recorder_stacks(cap.recorder);
  uint32_t n = names_resolve_frames(cap.names, strings, stacks, p->frames, p->lines, p->frame_count, p->omitted, cap.frame_ids);
  uint32_t class_id = names_class_id(strings, obj);
  if (n == NAMES_FAILED || class_id == STRTAB_ERROR) {
    cap.stats.dropped_no_memory++;
    return;
  }
  uint64_t size = cap.config.recorder.slot_size;
#ifdef HAVE_RB_OBJ_MEMSIZE_OF
  if (cap.config.recorder.track_sizes) size = rb_obj_memsize_of(obj);
#endif
  recorder_track(cap.recorder, obj, cap.frame_ids, n, class_id, p->alloc_gc, p->weight, size);
  RB_GC_GUARD(obj);
}

static void commit_pending(void *unused) {
  (void)unused;
  cap.commit_scheduled = false;
  if (!cap.running) return;
  uint64_t started = now_nanos();
  // Heapscope's own allocations (frame labels) are not the application's: park the countdown.
  uint64_t countdown = cap.countdown;
  cap.countdown = UINT64_MAX;
  while (cap.pending_count > 0) {
    commit_one(&cap.ring[cap.pending_head]);
    cap.pending_head = (cap.pending_head + 1) % PENDING_CAPACITY;
    cap.pending_count--;
  }
  cap.countdown = countdown;
  cap.stats.commit_nanos += now_nanos() - started;
}

void capture_flush(void) {
  if (cap.pending_count > 0) commit_pending(NULL);
}

// ---- The holder object: how the GC sees capture's state ----

static void holder_mark(void *unused) {
  (void)unused;
  rb_gc_mark(cap.newobj_hook);
  rb_gc_mark(cap.gc_hook);
  names_mark(cap.names);
  // Frames of samples not yet committed: their names are still to be read. The objects themselves
  // are not marked (a sample must not keep its object alive).
  for (uint32_t i = 0; i < cap.pending_count; i++) {
    const pending_sample *p = &cap.ring[(cap.pending_head + i) % PENDING_CAPACITY];
    for (uint32_t f = 0; f < p->frame_count; f++) rb_gc_mark(p->frames[f]);
  }
}

static void holder_compact(void *unused) {
  (void)unused;
  if (cap.recorder) recorder_on_compact(cap.recorder);
  for (uint32_t i = 0; i < cap.pending_count; i++) {
    pending_sample *p = &cap.ring[(cap.pending_head + i) % PENDING_CAPACITY];
    if (p->obj != Qundef) p->obj = rb_gc_location(p->obj);
  }
}

size_t capture_memory(void) {
  if (!cap.running) return 0;
  size_t ring = (sizeof(VALUE) + sizeof(int)) * ((size_t)PENDING_CAPACITY * cap.config.max_frames + OMITTED_CHUNK) +
                sizeof(uint32_t) * (cap.config.max_frames + 1);
  return sizeof(cap) + ring + names_memory(cap.names);
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
  // sample positions as its parent.
  sampler_init(&cap.sampler, cap.sampler.sample_every, sampler_seed_from_os());
}

void capture_init(void) {
  // The GC calls dmark and dcompact only for a non-NULL data pointer.
  cap.holder = TypedData_Wrap_Struct(rb_cObject, &holder_type, &cap);
  rb_gc_register_mark_object(cap.holder);
  cap.newobj_hook = rb_tracepoint_new(0, RUBY_INTERNAL_EVENT_NEWOBJ, on_newobj, NULL);
  cap.gc_hook = rb_tracepoint_new(0, RUBY_INTERNAL_EVENT_GC_END_MARK, on_gc_end_mark, NULL);
  pthread_atfork(NULL, NULL, reseed_after_fork);
#ifdef HAVE_RB_POSTPONED_JOB_PREREGISTER
  commit_job = rb_postponed_job_preregister(0, commit_pending, NULL);
#endif
}

// ---- Lifecycle ----

static void free_buffers(void) {
  recorder_free(cap.recorder);
  names_free(cap.names);
  free(cap.frame_arena);
  free(cap.line_arena);
  free(cap.scratch_frames);
  free(cap.scratch_lines);
  free(cap.frame_ids);
  cap.recorder = NULL;
  cap.names = NULL;
  cap.frame_arena = cap.scratch_frames = NULL;
  cap.line_arena = cap.scratch_lines = NULL;
  cap.frame_ids = NULL;
}

bool capture_start(const capture_config *config) {
  if (cap.running) return false;
  cap.config = *config;
  cap.recorder = recorder_new(&config->recorder);
  cap.names = names_new();
  size_t slots = (size_t)PENDING_CAPACITY * config->max_frames;
  cap.frame_arena = malloc(sizeof(VALUE) * slots);
  cap.line_arena = malloc(sizeof(int) * slots);
  cap.scratch_frames = malloc(sizeof(VALUE) * OMITTED_CHUNK);
  cap.scratch_lines = malloc(sizeof(int) * OMITTED_CHUNK);
  cap.frame_ids = malloc(sizeof(uint32_t) * (config->max_frames + 1));
  if (!cap.recorder || !cap.names || !cap.frame_arena || !cap.line_arena || !cap.scratch_frames || !cap.scratch_lines || !cap.frame_ids) {
    free_buffers();
    return false;
  }
  for (uint32_t i = 0; i < PENDING_CAPACITY; i++) {
    cap.ring[i].frames = cap.frame_arena + (size_t)i * config->max_frames;
    cap.ring[i].lines = cap.line_arena + (size_t)i * config->max_frames;
  }
  cap.pending_head = cap.pending_count = 0;
  memset(&cap.stats, 0, sizeof cap.stats);
  sampler_init(&cap.sampler, config->sample_every, sampler_seed_from_os());
  cap.countdown = sampler_next_countdown(&cap.sampler);
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
  cap.pending_count = 0;
  free_buffers();
}

bool capture_running(void) { return cap.running; }
const capture_config *capture_current_config(void) { return &cap.config; }
recorder *capture_recorder(void) { return cap.recorder; }
void capture_get_stats(capture_stats *stats) { *stats = cap.stats; }
uint32_t capture_pending_capacity(void) { return PENDING_CAPACITY; }
