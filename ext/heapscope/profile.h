// profile: builds one profile (Native._profile) from the running capture. Under the GVL: the frames'
// names (names.h), the census (census.h, optional), the snapshot (recorder.h) with the census bounding
// its samples; then the comments (the settings, every drop counter, the caller's extra lines, the
// census's lines) and, without the GVL, the pprof encoding and gzip (pprof.h) into a Ruby String.
//
// Two steps, so that the bindings' fail-safe (heapscope.c) runs between them: profile_take ends with the
// recorder's invariant check (capture_check_invariants), and the caller settles a failure it reports
// before profile_finish, or gives the job up with profile_discard.
//
// NOTE: every function runs with the GVL held, in the main Ractor, outside the GC, while capture runs.
//       profile_take allocates Ruby strings (names) and runs T_DATA dsize functions (the census);
//       profile_finish releases the GVL to encode and allocates the result String. Both raise
//       (NoMemError when memory is short, or what the String allocation raises), always after freeing
//       what the job owns. profile_discard and profile_get_timings never raise.
// NOTE: ownership: from profile_take on, the job owns extra (malloc'd by the caller) and everything it
//       builds; profile_finish and profile_discard free it all, and so does a raise in either step.
#ifndef HEAPSCOPE_PROFILE_H
#define HEAPSCOPE_PROFILE_H

#include <ruby.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "snapshot.h"

// One profile between the two steps: the caller holds it (on its stack) and reads none of its fields.
typedef struct {
  hs_snapshot *snapshot;
  char *extra;       // the caller's comment lines (NUL-free, each ending in \n), extra_len bytes; or NULL
  size_t extra_len;
  char *census_text; // the census's comment lines, or NULL
  uint32_t min_age;
  uint64_t gvl_started;
} profile_job;

// How long the last profile held the GVL (naming, census, snapshot, copying) and encoded and gzipped
// without it; how long its census walked the heap (0 without one). For Native._stats.
typedef struct {
  uint64_t gvl_nanos, encode_nanos, census_nanos;
  uint64_t abandoned; // profiles given up because capture stopped or restarted while one was taken
} profile_timings;

// Heapscope.start began a run: profiles' durations count from now.
void profile_run_started(void);

// Names the frames, takes the census when with_census, the snapshot (allocs: an allocations profile;
// live objects that survived at least min_age GCs) and checks the recorder's invariants. Takes
// ownership of extra (NULL when extra_len is 0). Runs no Ruby code and checks no interrupts. Returns
// false, having freed what the job owns, when capture is not the run it began with (then the caller
// says it is not running); that cannot happen while the note above holds, and is counted.
bool profile_take(profile_job *job, bool allocs, uint32_t min_age, bool with_census, char *extra, size_t extra_len);
// Frees what job owns, for a caller that gives it up between the steps.
void profile_discard(profile_job *job);
// Writes the comments, encodes and gzips without the GVL: the gzipped pprof String. Frees what job owns.
VALUE profile_finish(profile_job *job);

void profile_get_timings(profile_timings *timings);

// The census comment lines of the last profile taken with a census (NUL-terminated, owned by profile.c,
// valid until the next profile or profile_forget_census), or NULL. Automatic focus reads which classes
// grow from them (lib/heapscope/auto_focus.rb).
const char *profile_last_census(void);
// Frees them (a run stopped: its censuses say nothing of the next run).
void profile_forget_census(void);

#endif
