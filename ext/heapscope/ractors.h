// ractors: heapscope does not support Ractors, and this file keeps it out of their way.
//
// What the VM does with a second Ractor, as measured (docs/architecture.md, Ractors):
// - Hooks are per Ractor: the NEWOBJ and GC_END_MARK hooks registered from the main Ractor run only in
//   it. But GC callbacks (the holder's dmark) and postponed jobs run in whichever Ractor's thread hit
//   them, and a hook registered from there (a window opened in another Ractor's GC) would run in that
//   Ractor, in parallel with the main one, on the same tables.
// - Ruby 3.1 (and 3.2, unverified) crashes by itself: while any allocation or GC event hook is on, a new
//   Ractor's thread allocates before it has a frame and Ruby dereferences that missing frame
//   (gc_event_hook_body: ec->cfp->pc, a SEGV at 0x0). Ruby 3.3 checks for it (ruby/ruby#5990). So on 3.1
//   both hooks must be off before the thread starts, however the Ractor was made. What runs on the
//   creating thread before the thread starts, whatever the path (Ractor.new, a Method captured before
//   heapscope loaded, bind_call), is one full GC by the C API (ractor.c leaving single-Ractor mode):
//   ractors_gc_may_start_one() says this GC may be that one, and capture pauses its hooks in it.
//
// What capture does: in another Ractor's context it never registers or samples anything, only notes that
// it saw one (ractors_guard, here); on the main Ractor's next sync point, job or API call it switches
// itself off (capture.c: hooks removed, records freed, one line on stderr); Heapscope.start refuses while
// other Ractors run, and on Ruby 3.1 once any Ractor was started (the next one would have no GC before
// its thread). On Ruby 3.1, in a GC that may start one, the hooks are paused (windows.c) until the main
// Ractor has looked.
//
// NOTE: everything here runs with the GVL (of the Ractor it runs in) and never raises. Where a function
//       may run (a hook, inside the GC, or only in the main Ractor outside the GC) is said with each.
#ifndef HEAPSCOPE_RACTORS_H
#define HEAPSCOPE_RACTORS_H

#include <ruby.h>
#include <ruby/version.h>
#include <stdbool.h>

// Ruby 3.1's crash above (3.2 counted in: its fix is not verified there).
#if RUBY_API_VERSION_CODE < 30300
#define RACTORS_VM_CRASH 1
#endif

// Once, from Init, in the main Ractor. park is called where the guard first sees another Ractor, in
// any context (it must allocate nothing: capture parks its countdown); settle runs in the main Ractor at
// its next interrupt check after that, or after ractors_ask_to_settle (capture switches itself off).
void ractors_init(void (*park)(void), void (*settle)(void));

// Whether the running code is in the main Ractor. Any context; allocates nothing.
bool ractors_in_main(void);

// Whether the process has left single-Ractor mode (a Ractor was started at some time; the VM never goes
// back). Any context, allocates nothing. false where this Ruby does not say (3.3).
bool ractors_multi_mode(void);

// How many Ractors are alive (Ractor.count, asked of the method as Ruby defined it, not of a
// redefinition). Main Ractor, outside the GC and hooks. Never raises. Allocates (the Method call
// does): under GC.stress each call is a full GC, so frequent callers use ractors_others_alive.
long ractors_count(void);

// Whether another Ractor may be alive now, for callers that ask often (the windows' sync jobs, every ms
// or so): false without asking where the VM says it never left single-Ractor mode (3.1/3.2 where the
// symbol is exported, 3.4+); else ractors_count, whose answer "none" stands for RACTORS_COUNT_GAP_NANOS
// (until then, or the next ractors_guard_start). Main Ractor, outside the GC and hooks. Never raises.
#define RACTORS_COUNT_GAP_NANOS 100000000ull // 100 ms
bool ractors_others_alive(void);

// Inside the GC: whether this GC may be the one Ruby runs on the creating thread just before a new
// Ractor's thread starts (3.1, 3.3: a GC by the C API while the process is still single-Ractor; 3.4's
// is GC.start's, but 3.4 says it left single-Ractor mode).
bool ractors_gc_may_start_one(void);

// ---- The guard (capture's) ----

// In a hook, the GC or a job: whether capture may act here (the main Ractor, no Ractor came since
// ractors_guard_start). When not, notes it (park, then settle asked for) and returns false. Allocates
// nothing.
bool ractors_guard(void);
// From capture_start: nothing seen yet; whether the process had left single-Ractor mode before.
void ractors_guard_start(void);
// Whether the guard has seen another Ractor since start.
bool ractors_seen(void);
// Whether a Ractor came since start: the VM left single-Ractor mode since (where it says so).
bool ractors_multi_since_start(void);
// Any context: settle runs in the main Ractor at its next interrupt check (a job run by another Ractor
// does nothing: it checks where it runs).
void ractors_ask_to_settle(void);

#endif
