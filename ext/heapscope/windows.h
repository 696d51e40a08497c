// windows: the Ruby-side mechanics of when the allocation hook is on. The sampling plan
// (sampling_plan.h) decides; this file applies its decisions where heapscope has control with the GVL,
// the sync points: the ticker thread's postponed jobs (Ruby 3.3+, ticker.h), every GC's marking (the
// capture's holder calls windows_on_gc_marking, which also registers the GC_END_MARK hook for that GC),
// and every profile. Windowed, it enables and disables the NEWOBJ tracepoint there; always, it enables
// both hooks at windows_start and removes them at windows_stop. It also owns what must be Ruby to
// decide: GC.stress, the malloc limit inside the GC on Ruby 3.1, the VM's allocation count, the hook's
// measured cost (calibrated once per process), the ticker's lock and fork handling, and the Ruby 3.1
// pause for a Ractor that may be starting (ractors.h).
//
// NOTE: every function runs with the GVL held, in the main Ractor (callers check ractors_guard), and
//       never raises. Those marked [GC] run inside the GC's marking: they allocate no Ruby object and
//       malloc only where registering is safe (windows.c says when). Others may call Ruby (GC.stress,
//       GC.stat) but run no application code.
#ifndef HEAPSCOPE_WINDOWS_H
#define HEAPSCOPE_WINDOWS_H

#include <ruby.h>
#include <stdbool.h>
#include <stdint.h>

#include "recorder.h"
#include "sampling_plan.h"

typedef struct {
  uint64_t windows_opened;   // windowed: windows opened
  uint64_t sync_jobs;        // windowed: sync jobs run (the ticker's requests)
  uint64_t sync_latency_nanos, sync_latency_max_nanos; // windowed: from the ticker's last request to its job
  uint64_t ticker_failures;  // windowed: the ticker thread could not be started
  uint64_t gc_registrations_deferred; // windowed: GCs inside which no hook could be registered
  uint64_t ractor_pauses;    // Ruby 3.1: GCs that might have started a Ractor, hooks paused
  uint64_t ticker_wakeups, ticker_triggers; // windowed: the ticker's work (ticker.h)
  uint64_t ticker_cpu_nanos;                // its thread's CPU time (ticker_cpu_nanos)
  uint64_t ticker_idle_spells;              // times it stopped following flips (TICKER_IDLE_NANOS)
} windows_stats;

// Once, from Init: the plan it applies, the two tracepoints it registers (the NEWOBJ one and the
// GC_END_MARK one, both created and marked by their owners), and what to call when a sync job finds a
// Ractor alive (switch capture off; main Ractor, outside the GC). Measures the hook's cost (allocates
// 20,000 objects: at load, not inside a run), prepares the sync jobs, and stops the ticker at VM exit.
void windows_init(sampling_plan *plan, VALUE newobj_hook, VALUE gc_hook, void (*ractor_alive)(void));

// Whether windowed sampling is possible on this Ruby (registering inside the GC: windows.c).
bool windows_supported(void);
// Whether windows can change at interrupt checks (the ticker: Ruby 3.3+), not only at GCs and profiles.
bool windows_ticker(void);

// A run starts: the plan is started (its first countdown drawn, under the ticker's lock), then, windowed,
// a first sync point and the ticker; always, both hooks on. Its windows are reported to r
// (recorder_close_window). newobj_hook: this run's allocation hook (alloc_hook_tracepoint: the focused
// one when the run has focused classes), used until windows_stop.
void windows_start(recorder *r, VALUE newobj_hook, const plan_config *config, uint64_t seed);
// The run's allocation hook changes (a first focused class came or the last went: alloc_hook.h), from
// now on; one enabled now is swapped at once. Outside the GC, with the GVL.
void windows_set_newobj_hook(VALUE newobj_hook);
// The run ends: ticker stopped, both hooks off. No-op when not started.
void windows_stop(void);
void windows_get_stats(windows_stats *stats);

// The VM's allocation count (GC.stat's total_allocated_objects; interned at init, so no allocation).
uint64_t windows_vm_allocations(void);
// Virtual nanoseconds now (sampling_plan.h).
uint64_t windows_virtual_now(void);
// The chain's share, mean window and flips, and the requested share now, read under the ticker's lock.
void windows_chain_stats(double *share, double *mean_window_nanos, uint64_t *flips, double *requested_share);

// Ruby 3.3+: asks GC.stress (3.1 is told, windows_gc_stress_changed). A method call: its interrupt
// checks may run postponed jobs, other threads and trap handlers, any of which may stop or restart
// capture. So it is called first, before a start, a profile or a sync job reads any state, and never
// between their steps. Outside the GC. Never raises: returns 0, or the tag of what was raised inside
// the call (a trap handler's Interrupt), for the caller to raise again with rb_jump_tag.
int windows_poll_gc_stress(void);
// A sync point outside the GC (a profile): also the density check. Runs no Ruby code and checks no
// interrupts (nothing can stop capture in the middle); does nothing once stopped.
void windows_sync_outside_gc(void);
// [GC] Inside every GC's marking, once per GC: registers GC_END_MARK for this GC and syncs (windowed).
void windows_on_gc_marking(void);
// [GC] From the GC_END_MARK hook, at its end: windowed, it removes itself (registered for this GC only).
void windows_gc_end_mark_done(void);
// GC.stress was switched (lib/heapscope.rb reports it on Ruby 3.1). Outside the GC.
void windows_gc_stress_changed(bool on);

// [GC] Ruby 3.1: this GC may start a Ractor, so both hooks go off (the open window closed and counted)
// until windows_resume_after_ractor, outside the GC, when none came.
void windows_pause_for_ractor(void);
void windows_resume_after_ractor(void);
bool windows_paused_for_ractor(void);

#endif
