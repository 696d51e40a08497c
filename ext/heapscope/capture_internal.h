// capture_internal.h: what capture.c (the hook, liveness glue, lifecycle) and windows.c (when the hook
// is on in windowed mode) share. Not a contract for anyone else: only those two include it.
//
// NOTE: all of it is used with the GVL held, except what is marked atomic (read by the ticker thread)
//       and sched, which the ticker reads under sched_lock.
#ifndef HEAPSCOPE_CAPTURE_INTERNAL_H
#define HEAPSCOPE_CAPTURE_INTERNAL_H

#include <pthread.h>
#include <ruby.h>
#include <ruby/debug.h>
#include <ruby/version.h>

#include "budget.h"
#include "capture.h"
#include "ractors.h"
#include "sampler.h"
#include "schedule.h"

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
// Threads whose allocations are never sampled (heapscope's own: capture_exclude_thread).
#define MAX_EXCLUDED_THREADS 32

typedef struct {
  bool running;
  uint64_t countdown;    // allocations left until the next sample: the hook's only work is a decrement
  uint64_t step;         // what countdown was last loaded with
  uint32_t draw_weight;  // what the sample at the end of this countdown stands for
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
  VALUE excluded_threads[MAX_EXCLUDED_THREADS];
  uint32_t excluded_count;

  // Windowed sampling (schedule.h)
  bool window_open;        // the NEWOBJ hook is on
  bool gc_hook_on;         // the GC_END_MARK hook is on
  bool gc_stress;          // GC.stress is on (Ruby 3.1: nothing is registered inside the GC then)
  bool ticker_lost;        // a forked child: the ticker thread is to be started again
  bool syncing;            // inside windows_sync (a GC it starts does not sync again)
  bool gc_stress_polled;   // GC.stress was on when last asked (windows_sync_outside_gc)
  uint32_t last_marking_gc; // rb_gc_count() of the last GC whose marking was handled
  uint32_t window;         // the current window's number: a sample's cluster (each sample's own when always)
  uint64_t hook_allocations;   // allocations the hook has seen, up to the last countdown load or close
  uint64_t uncharged_allocations; // of which not yet charged to heapscope's own time
  uint64_t last_charged_nanos;    // monotonic time of the last charge (capture_charge)
  uint64_t started_allocations;   // the VM's allocation count at start
  uint64_t started_virtual;       // virtual time at start
  uint64_t window_opened_virtual; // virtual time the current window opened
  uint64_t window_opened_allocations; // hook_allocations when it opened
  uint64_t closed_windows_virtual; // virtual time the closed windows were open for
  double seen_share;              // the share of allocations the hook had seen at the last density check
  uint64_t next_density_check;    // virtual time of the next (windows.c: update_density)
  const char *failure;    // set by capture_fail: sampling is off until the next start
  bool ractor_seen;       // another Ractor reached capture: nothing more is sampled (ractors.h)
  bool ractor_pause;      // Ruby 3.1: hooks off in a GC that may start a Ractor, until the settle job
  bool multi_at_start;    // the process had left single-Ractor mode before start (3.3+ may restart)
  uint64_t invalid_seen;  // the recorder's invalid_records when last checked
  capture_stats stats;
} capture_state;

extern capture_state cap;

// The chain that says when the hook should be on, shared with the ticker thread under sched_lock.
extern schedule sched;
extern pthread_mutex_t sched_lock;
// heapscope's own time so far (nanoseconds), which virtual time leaves out (schedule.h). Written under
// the GVL, read by the ticker: atomic.
extern uint64_t own_nanos;
// Whether the NEWOBJ hook is on, for the ticker: atomic.
extern int hook_applied;
// What an enabled NEWOBJ hook costs one allocation, measured once per process (calibrate_hook_cost).
extern double hook_cost_nanos;

static inline void add_own_nanos(uint64_t nanos) { __atomic_fetch_add(&own_nanos, nanos, __ATOMIC_RELAXED); }

// capture.c
uint64_t capture_now_nanos(void);    // monotonic nanoseconds
size_t capture_vm_allocations(void); // the VM's allocation count (GC.stat's total_allocated_objects)
// Charges heapscope's own time since started (and the hook's cost for the allocations it saw) to
// virtual time and to the budget.
void capture_charge(uint64_t started);
// Loads the countdown to the next sample at the rate in force (a new rate takes effect here).
void capture_draw_countdown(void);

// windows.c
void windows_init(void);                    // from capture_init: job handles, interned keys
uint64_t windows_virtual_now(void);         // virtual nanoseconds (schedule.h)
void windows_calibrate_hook_cost(void);     // once per process, before anything is registered
void windows_sync(void);                    // a sync point; inside a GC only where registering is safe
void windows_sync_outside_gc(void);         // a sync point outside the GC (may call Ruby: GC.stress)
void windows_start_ticker(void);
void windows_on_gc_marking(void);           // inside every GC's marking (the holder's dmark)
void windows_keep_gc_hook_registered(void); // outside the GC, while GC.stress is on

// ractors.c (ractors.h says why)
// In a hook, the GC or a job: whether capture may act here (the main Ractor, no Ractor came since
// start). When not, notes it (countdown parked, the main Ractor asked to settle) and returns false.
bool capture_ractor_guard(void);
void capture_ractors_start(void);           // from capture_start
// Inside every GC's marking (main Ractor): if this GC may be Ractor.new's, asks the main Ractor to look
// (and on Ruby 3.1 pauses the hooks until then).
void capture_ractor_on_gc_marking(void);

#endif
