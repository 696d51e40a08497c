#include "alloc_hook.h"

#include <stdlib.h>
#include <string.h>
#ifdef HAVE_PRCTL
#include <sys/prctl.h>
#endif
#include <ruby/debug.h>

#include "population.h"
#include "ractors.h"

// The process's one plan: the hook's common path reads and decrements plan.countdown at a fixed address.
static sampling_plan plan;

// A direct-mapped cache from what rb_profile_frames returns, {frame VALUE, line}, to the frame id it
// was interned as: most samples repeat frames already seen, and a hit skips two hash-table lookups.
// Entries stay valid for the whole run (frames are never freed, frame VALUEs stay pinned by names).
#define FRAME_CACHE_SIZE 4096
typedef struct {
  VALUE frame;
  int32_t line;
  uint32_t frame_id; // 0 = empty
} frame_cache_entry;

// Focused classes (sampling_plan.h: strata): class VALUE -> stratum number, open addressing with linear
// probing in a table at most half full. Set at alloc_hook_start, read by the focused hook for every
// allocation it sees, so a lookup is a multiply, a shift and (mostly) one compare.
#define FOCUS_SLOTS (2 * PLAN_MAX_STRATA)
typedef struct {
  VALUE klass; // 0: empty
  uint32_t stratum;
} focus_slot;

// How deep a stack is counted when it is deeper than max_frames (Ruby raises SystemStackError before
// that with default stack sizes; deeper stacks are counted as this deep).
#define DEPTH_LIMIT 16384
// Threads whose allocations are never sampled (heapscope's own: alloc_hook_exclude_thread).
#define MAX_EXCLUDED_THREADS 32

static struct {
  VALUE tracepoint;
  VALUE focused_tracepoint; // the hook with the focus table: registered instead when a run has strata
  focus_slot focus[FOCUS_SLOTS];
  VALUE focus_classes[PLAN_MAX_STRATA]; // by stratum, for marking
  uint32_t focus_count;  // strata in this run (some may have no class yet)
  uint32_t focus_active; // strata with a class: the focused hook is needed only then
  recorder *recorder; // the run's (capture.c's), NULL between runs
  names *names;
  uint32_t max_frames;
  bool label_threads;
  VALUE *frames; // max_frames, filled by rb_profile_frames
  int *lines;
  VALUE *scratch_frames; // DEPTH_LIMIT, to count frames past max_frames
  int *scratch_lines;
  uint32_t *frame_ids;            // max_frames + 1 (room for the "frames omitted" marker)
  frame_cache_entry *frame_cache; // FRAME_CACHE_SIZE
  VALUE excluded_threads[MAX_EXCLUDED_THREADS];
  uint32_t excluded_count;
  labelsets *label_table; // the process's label sets (outlive runs: their ids sit in fiber-locals)
  ID id_labels_local;
  bool exact_threads; // Threads and Fibers are recorded by alloc_hook_track_exact, never sampled
  VALUE fiber_class;  // Fiber (no rb_cFiber in the C API), read once at init
  alloc_hook_stats stats;
} hook;

// The frame id of {frame, line} (interning the frame's code and the frame if new); 0 when memory is short.
static uint32_t frame_id_of(VALUE frame, int line) {
  uint64_t key = (uint64_t)frame ^ ((uint64_t)(uint32_t)line * 0x9e3779b97f4a7c15ull);
  frame_cache_entry *entry = &hook.frame_cache[(key ^ (key >> 29)) & (FRAME_CACHE_SIZE - 1)];
  if (entry->frame == frame && entry->line == line && entry->frame_id != 0) return entry->frame_id;
  uint32_t code_id = names_code_id(hook.names, frame);
  if (code_id == 0) return 0;
  uint32_t frame_id = stacktab_intern_frame(recorder_stacks(hook.recorder), (hs_frame){code_id, line});
  if (frame_id != 0) *entry = (frame_cache_entry){frame, line, frame_id};
  return frame_id;
}

static bool thread_excluded(VALUE thread) {
  for (uint32_t i = 0; i < hook.excluded_count; i++) {
    if (hook.excluded_threads[i] == thread) return true;
  }
  return false;
}

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
  if (prctl(PR_GET_NAME, name, 0, 0, 0) == 0 && name[0] != '\0') labelled = labelsets_with(hook.label_table, set, "thread", 6, name, strlen(name));
#endif
  thread_labels[slot].thread = thread;
  thread_labels[slot].base = set;
  thread_labels[slot].labelled = labelled;
  thread_labels[slot].uses = 0;
  return labelled;
}

static uint32_t current_labels(void) {
  if (hook.label_table == NULL) return LABELSET_NONE;
  VALUE id = rb_thread_local_aref(rb_thread_current(), hook.id_labels_local);
  uint32_t set = LABELSET_NONE;
  if (RB_FIXNUM_P(id) && FIX2LONG(id) > 0 && FIX2LONG(id) < (long)labelsets_id_limit(hook.label_table)) set = (uint32_t)FIX2LONG(id);
  if (hook.label_threads) set = with_thread_label(set);
  return set;
}

// Whether obj is a Thread or a Fiber (or of a subclass): a T_DATA whose class is set (it is before
// NEWOBJ fires). rb_class_inherited_p walks the superclasses without allocating. Only on sampled paths.
static bool thread_or_fiber(VALUE obj) {
  if (RB_BUILTIN_TYPE(obj) != RUBY_T_DATA) return false;
  VALUE klass = RBASIC(obj)->klass;
  if (klass == 0 || !RB_TYPE_P(klass, T_CLASS)) return false;
  if (klass == rb_cThread || klass == hook.fiber_class) return true;
  return RTEST(rb_class_inherited_p(klass, rb_cThread)) || (hook.fiber_class != 0 && RTEST(rb_class_inherited_p(klass, hook.fiber_class)));
}

// Captures the current stack, less its skip innermost frames, into hook.frame_ids; returns how many
// ids it wrote (a "frames omitted" marker last when the stack was deeper than max_frames), or -1 when
// interning ran out of memory (counted).
static int capture_frames(int skip) {
  int n = rb_profile_frames(0, (int)hook.max_frames, hook.frames, hook.lines);
  int count = 0;
  for (int i = skip; i < n; i++) {
    uint32_t frame_id = frame_id_of(hook.frames[i], hook.lines[i]);
    if (frame_id == 0) {
      hook.stats.dropped_no_memory++;
      return -1;
    }
    hook.frame_ids[count++] = frame_id;
  }
  if (n == (int)hook.max_frames) {
    // Count the rest with one more walk into scratch space. (rb_profile_frames' start argument
    // cannot be used for this: on Ruby 3.1 a start > 0 never advances, and the call never returns.)
    int total = rb_profile_frames(0, DEPTH_LIMIT, hook.scratch_frames, hook.scratch_lines);
    if (total > n) {
      hs_frame marker = {0, total - n}; // code 0: "N frames omitted"
      if ((hook.frame_ids[count++] = stacktab_intern_frame(recorder_stacks(hook.recorder), marker)) == 0) {
        hook.stats.dropped_no_memory++;
        return -1;
      }
      hook.stats.frames_truncated++;
    }
  }
  return count;
}

// Captures the current stack and class of obj and hands them to the recorder, as standing for weight
// allocations.
static void sample(VALUE obj, uint32_t weight) {
  hook.stats.samples_taken++;
  if (population_is_internal(obj)) {
    hook.stats.skipped_internal++;
    return;
  }
  // heapscope's own threads are not part of the program profiled: their allocations are left out of
  // the population (every other allocation keeps its probability).
  if (hook.excluded_count != 0 && thread_excluded(rb_thread_current())) {
    hook.stats.skipped_own++;
    return;
  }
  // Threads and Fibers made from Ruby are recorded whole by alloc_hook_track_exact: a sample of one
  // would stand for a thousand stacks (one Thread read as 1000 MiB). The rest of them (made by C
  // code) are at no site: the census counts them in the unsampled row, exactly.
  if (hook.exact_threads && thread_or_fiber(obj)) {
    hook.stats.skipped_exact++;
    return;
  }
  int count = capture_frames(0);
  if (count < 0) return;
  uint32_t class_id = names_class_id(recorder_strings(hook.recorder), obj);
  if (class_id == STRTAB_ERROR) {
    hook.stats.dropped_no_memory++;
    return;
  }
  recorder_track(hook.recorder, obj, hook.frame_ids, (uint32_t)count, class_id, (uint32_t)rb_gc_count(), weight,
                 plan_cluster(&plan), current_labels());
}

// The work of alloc_hook_track_exact, less the checks.
static void track_exact(VALUE obj, int skip) {
  int count = capture_frames(skip);
  if (count < 0) return;
  uint32_t class_id = names_class_id(recorder_strings(hook.recorder), obj);
  if (class_id == STRTAB_ERROR) {
    hook.stats.dropped_no_memory++;
    return;
  }
  if (recorder_track_exact(hook.recorder, obj, hook.frame_ids, (uint32_t)count, class_id, (uint32_t)rb_gc_count(), current_labels())) {
    hook.stats.exact_tracked++;
  }
}

void alloc_hook_track_exact(VALUE obj, int skip) {
  if (!hook.exact_threads || hook.recorder == NULL || plan.halted || RB_SPECIAL_CONST_P(obj) || !thread_or_fiber(obj)) return;
  if (hook.excluded_count != 0 && thread_excluded(rb_thread_current())) return; // heapscope's own thread
  // heapscope's work, as a sample's: charged to its own time and the overhead budget (a program that
  // makes fibers by the thousand pays for their records there).
  uint64_t started = plan_monotonic_nanos();
  track_exact(obj, skip);
  plan_charge(&plan, started, plan_monotonic_nanos());
}

bool alloc_hook_records_whole(VALUE obj) { return hook.exact_threads && !RB_SPECIAL_CONST_P(obj) && thread_or_fiber(obj); }

static inline uint32_t focus_slot_of(VALUE klass) { return (uint32_t)(((uint64_t)klass * 0x9e3779b97f4a7c15ull) >> 57) % FOCUS_SLOTS; }

// The stratum of klass, or UINT32_MAX when it is not focused.
// The empty test comes first: a hidden object's klass is 0, which must find no stratum, not the
// stratum field of the first empty slot.
static inline uint32_t focus_lookup(VALUE klass) {
  for (uint32_t i = focus_slot_of(klass);; i = (i + 1) % FOCUS_SLOTS) {
    if (hook.focus[i].klass == 0) return UINT32_MAX;
    if (hook.focus[i].klass == klass) return hook.focus[i].stratum;
  }
}

// Samples obj at weight and charges the work. False when the fail-safe halted the plan meanwhile: the
// countdowns are then parked (they count down forever until capture_stop) and none is drawn again.
static bool take_sample(VALUE obj, uint32_t weight) {
  uint64_t started = plan_monotonic_nanos();
  sample(obj, weight);
  plan_charge(&plan, started, plan_monotonic_nanos());
  if (!plan.halted) return true;
  plan_park(&plan);
  return false;
}

// Kept out of line, so on_newobj's common path needs no stack frame or saved registers.
__attribute__((noinline, cold)) static void on_countdown(VALUE tracepoint) {
  // Only here, on the sampled path: the common path stays a decrement and a branch.
  if (!ractors_guard()) return;
  uint32_t weight = plan_sampled(&plan);
  if (take_sample(rb_tracearg_object(rb_tracearg_from_tracepoint(tracepoint)), weight)) plan_draw(&plan);
}

static void on_newobj(VALUE tracepoint, void *unused) {
  (void)unused;
  if (__builtin_expect(--plan.countdown != 0, 1)) return;
  on_countdown(tracepoint);
}

// A focused class's countdown reached 0: as on_countdown, with the stratum's weight and countdown.
__attribute__((noinline, cold)) static void on_stratum_countdown(VALUE obj, uint32_t stratum) {
  if (!ractors_guard()) return;
  uint32_t weight = plan_sampled_stratum(&plan, stratum);
  if (take_sample(obj, weight)) plan_draw_stratum(&plan, stratum);
}

// With focused classes: the new object's class picks the countdown (its stratum's or the common one).
// The class is set before NEWOBJ fires (newobj_of fills klass and flags first); a hidden object's is 0,
// which is never focused. A T_IMEMO's klass slot holds other data (a method entry keeps its defined
// class there), so VM-internal objects always take the common countdown.
static void on_newobj_focused(VALUE tracepoint, void *unused) {
  (void)unused;
  VALUE obj = rb_tracearg_object(rb_tracearg_from_tracepoint(tracepoint));
  uint32_t stratum = RB_BUILTIN_TYPE(obj) == RUBY_T_IMEMO ? UINT32_MAX : focus_lookup(RBASIC(obj)->klass);
  if (__builtin_expect(stratum == UINT32_MAX, 1)) {
    if (__builtin_expect(--plan.countdown != 0, 1)) return;
    on_countdown(tracepoint);
    return;
  }
  if (--plan.strata[stratum].countdown != 0) return;
  on_stratum_countdown(obj, stratum);
}

// ---- Lifecycle ----

void alloc_hook_init(const char *labels_local) {
  plan.hook_cost_nanos = -1.0; // not measured yet (windows.c)
  hook.tracepoint = rb_tracepoint_new(0, RUBY_INTERNAL_EVENT_NEWOBJ, on_newobj, NULL);
  hook.focused_tracepoint = rb_tracepoint_new(0, RUBY_INTERNAL_EVENT_NEWOBJ, on_newobj_focused, NULL);
  hook.id_labels_local = rb_intern(labels_local);
  hook.label_table = labelsets_new(1000);
  hook.fiber_class = rb_const_defined(rb_cObject, rb_intern("Fiber")) ? rb_const_get(rb_cObject, rb_intern("Fiber")) : 0;
}

VALUE alloc_hook_tracepoint(void) { return hook.focus_active != 0 ? hook.focused_tracepoint : hook.tracepoint; }
sampling_plan *alloc_hook_plan(void) { return &plan; }
labelsets *alloc_hook_labels(void) { return hook.label_table; }

void alloc_hook_stop(void) {
  free(hook.frames);
  free(hook.lines);
  free(hook.scratch_frames);
  free(hook.scratch_lines);
  free(hook.frame_ids);
  free(hook.frame_cache);
  hook.frame_cache = NULL;
  hook.frames = hook.scratch_frames = NULL;
  hook.lines = hook.scratch_lines = NULL;
  hook.frame_ids = NULL;
  hook.recorder = NULL;
  hook.names = NULL;
  memset(hook.focus, 0, sizeof hook.focus);
  memset(hook.focus_classes, 0, sizeof hook.focus_classes);
  hook.focus_count = hook.focus_active = 0;
}

void alloc_hook_unfocus(uint32_t stratum) {
  if (stratum >= hook.focus_count || hook.focus_classes[stratum] == 0) return;
  hook.focus_classes[stratum] = 0;
  hook.focus_active--;
  // Open addressing without tombstones: the table is rebuilt from the strata's classes (at most 64).
  memset(hook.focus, 0, sizeof hook.focus);
  for (uint32_t k = 0; k < hook.focus_count; k++) {
    VALUE klass = hook.focus_classes[k];
    if (klass == 0) continue;
    uint32_t i = focus_slot_of(klass);
    while (hook.focus[i].klass != 0) i = (i + 1) % FOCUS_SLOTS;
    hook.focus[i] = (focus_slot){klass, k};
  }
}

bool alloc_hook_focus_class(uint32_t stratum, VALUE klass) {
  if (stratum >= hook.focus_count || hook.focus_classes[stratum] != 0 || klass == 0) return false;
  uint32_t i = focus_slot_of(klass);
  while (hook.focus[i].klass != 0) {
    if (hook.focus[i].klass == klass) return false; // focused already, as another stratum
    i = (i + 1) % FOCUS_SLOTS;
  }
  hook.focus[i] = (focus_slot){klass, stratum};
  hook.focus_classes[stratum] = klass;
  hook.focus_active++;
  return true;
}

bool alloc_hook_start(recorder *r, names *n, uint32_t max_frames, bool label_threads, bool exact_threads, const VALUE *focus,
                      uint32_t focus_count) {
  hook.focus_count = hook.focus_active = 0;
  memset(hook.focus, 0, sizeof hook.focus);
  memset(hook.focus_classes, 0, sizeof hook.focus_classes);
  for (uint32_t k = 0; k < focus_count && k < PLAN_MAX_STRATA; k++) {
    hook.focus_count++;
    if (focus[k] != 0) alloc_hook_focus_class(k, focus[k]);
  }
  hook.recorder = r;
  hook.names = n;
  hook.max_frames = max_frames;
  hook.label_threads = label_threads;
  hook.exact_threads = exact_threads;
  hook.frames = malloc(sizeof(VALUE) * max_frames);
  hook.lines = malloc(sizeof(int) * max_frames);
  hook.scratch_frames = malloc(sizeof(VALUE) * DEPTH_LIMIT);
  hook.scratch_lines = malloc(sizeof(int) * DEPTH_LIMIT);
  hook.frame_ids = malloc(sizeof(uint32_t) * (max_frames + 1));
  hook.frame_cache = calloc(FRAME_CACHE_SIZE, sizeof(frame_cache_entry));
  if (!hook.frames || !hook.lines || !hook.scratch_frames || !hook.scratch_lines || !hook.frame_ids || !hook.frame_cache) {
    alloc_hook_stop();
    return false;
  }
  memset(&hook.stats, 0, sizeof hook.stats);
  return true;
}

size_t alloc_hook_memory(void) {
  if (hook.frames == NULL) return 0;
  return sizeof(hook) + sizeof(plan) + (sizeof(VALUE) + sizeof(int)) * ((size_t)hook.max_frames + DEPTH_LIMIT) +
         sizeof(uint32_t) * (hook.max_frames + 1) + sizeof(frame_cache_entry) * FRAME_CACHE_SIZE;
}

void alloc_hook_get_stats(alloc_hook_stats *stats) { *stats = hook.stats; }

void alloc_hook_mark(void) {
  rb_gc_mark(hook.tracepoint);
  rb_gc_mark(hook.focused_tracepoint);
  if (hook.fiber_class != 0) rb_gc_mark(hook.fiber_class);
  // Pinned: the table is keyed by the classes' addresses.
  for (uint32_t i = 0; i < PLAN_MAX_STRATA; i++) {
    if (hook.focus_classes[i] != 0) rb_gc_mark(hook.focus_classes[i]);
  }
  // Pinned (rb_gc_mark): the hook compares thread VALUEs, so they must not move.
  for (uint32_t i = 0; i < hook.excluded_count; i++) rb_gc_mark(hook.excluded_threads[i]);
}

bool alloc_hook_exclude_thread(VALUE thread) {
  if (thread_excluded(thread)) return true;
  if (hook.excluded_count == MAX_EXCLUDED_THREADS) return false;
  hook.excluded_threads[hook.excluded_count++] = thread;
  return true;
}

void alloc_hook_include_thread(VALUE thread) {
  for (uint32_t i = 0; i < hook.excluded_count; i++) {
    if (hook.excluded_threads[i] != thread) continue;
    hook.excluded_threads[i] = hook.excluded_threads[--hook.excluded_count];
    return;
  }
}
