// profile.c: one profile from the running capture, taken under the GVL and encoded without it (profile.h).
#include "profile.h"

#include <ruby/thread.h>
#include <ruby/version.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "alloc_hook.h"
#include "capture.h"
#include "census.h"
#include "clock.h"
#include "pprof.h"

// Classes listed in a profile's census beside those with samples: the biggest others by bytes.
#define CENSUS_OTHER_CLASSES 32

// When the run began (Heapscope.start): a profile's duration counts from it.
static uint64_t started_at_nanos;
// The last profile's timings (profile_get_timings).
static profile_timings last;

static uint64_t wall_nanos(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void profile_run_started(void) { started_at_nanos = wall_nanos(); }

void profile_get_timings(profile_timings *timings) { *timings = last; }

// The profile's comments: the settings and every counter of what was dropped, so a reader of the
// profile alone can tell how complete it is; windowed, the variance groups' allocations (variance.h).
// "run_id=PID-START gc_count=N" lets a reader tell snapshots of one run (the same recorder: a sampled
// object stays the same sample from one to the next) and which of a site's samples were already alive
// at an earlier snapshot of it (gc_age >= the GCs between them + min_age): lib/heapscope/report/persistence.rb.
static char *profile_comments(uint32_t min_age, const hs_snapshot *snapshot) {
  const capture_config *c = capture_current_config();
  capture_stats cs;
  recorder_stats rs;
  capture_get_stats(&cs);
  recorder_get_stats(capture_recorder(), &rs);
  labelsets_stats ls = {0};
  if (capture_labels() != NULL) labelsets_get_stats(capture_labels(), &ls);
  size_t size = 2048 + 2 * 24 * VARIANCE_GROUPS;
  char *text = malloc(size);
  if (text == NULL) return NULL;
  int used = snprintf(text, size,
           "heapscope %s ruby %s pid %ld\n"
           "sample_every=%u current_sample_every=%u max_overhead=%g max_frames=%u min_age=%u track_sizes=%s max_tracked_objects=%u max_stacks=%u\n"
           "samples_taken=%llu tracked_objects=%llu dead_removed=%llu skipped_internal=%llu frames_truncated=%llu\n"
           "dropped_tracked_cap=%llu dropped_stack_cap=%llu dropped_no_memory=%llu gc_runs_missed=%llu\n"
           "sampling=%s share=%g realized_share=%.5f weight_scale=%.4f weight_scale_wanted=%.4f sample_every=%u current_sample_every=%u max_sample_every=%u rate_lowered=%s "
           "windows=%llu hook_on_share=%.5f allocations=%llu skipped_own=%llu variance=%s\n"
           "label_sets=%llu max_label_sets=%u label_sets_overflowed=%llu label_sets_dropped=%llu label_threads=%s\n"
           "share_auto=%s current_share=%g min_share=%g share_changes=%llu share_changes_waited=%llu hook_cost_full_share=%.4f fpc_share=%g\n"
           "stretches=%u stretch_scale_min=%.4f stretch_scale_max=%.4f open_stretch_scale=%.4f\n"
           "alloc_space: sizes measured at the first GC or profile after allocation; inuse_space: when this profile was taken\n"
           "run_id=%ld-%llu gc_count=%u\n"
           "exact_threads=%s exact_tracked=%llu skipped_exact=%llu\n",
           HEAPSCOPE_VERSION, ruby_version, (long)getpid(), c->sample_every, cs.current_every, c->max_overhead, c->max_frames, min_age,
           c->recorder.track_sizes ? "true" : "false", c->recorder.max_tracked_objects, c->recorder.max_stacks,
           (unsigned long long)cs.hook.samples_taken, (unsigned long long)rs.tracked_objects,
           (unsigned long long)rs.dead_removed, (unsigned long long)cs.hook.skipped_internal,
           (unsigned long long)cs.hook.frames_truncated,
           (unsigned long long)rs.dropped_tracked_cap, (unsigned long long)rs.dropped_stack_cap,
           (unsigned long long)(rs.dropped_no_memory + cs.hook.dropped_no_memory),
           (unsigned long long)cs.gc_end_marks_missed,
           c->windowed ? "windowed" : "always", cs.mean_share, cs.realized_share, capture_weight_scale(), capture_weight_scale_wanted(), c->sample_every, cs.current_every,
           cs.max_every, cs.current_every > c->sample_every ? "true" : "false",
           (unsigned long long)cs.windows_opened, capture_hook_on_share(&cs), (unsigned long long)cs.vm_allocations,
           (unsigned long long)cs.hook.skipped_own, snapshot->has_groups ? "groups" : "labels",
           (unsigned long long)ls.sets, ls.max_sets, (unsigned long long)ls.overflowed, (unsigned long long)ls.dropped,
           c->label_threads ? "true" : "false",
           cs.share_auto ? "true" : "false", cs.share, cs.min_share, (unsigned long long)cs.share_changes,
           (unsigned long long)cs.share_changes_waited, cs.hook_cost_share,
           cs.share_auto ? 0.0 : cs.share, cs.stretches, cs.stretch_scale_min, cs.stretch_scale_max, cs.open_stretch_scale, (long)getpid(), (unsigned long long)started_at_nanos, snapshot->gc_count,
           c->exact_threads ? "true" : "false", (unsigned long long)cs.hook.exact_tracked, (unsigned long long)cs.hook.skipped_exact);
  if (snapshot->has_groups && used > 0 && (size_t)used < size) {
    // Live objects' design (every window), then the allocation counters' (since Heapscope.reset).
    const group_design *designs[2] = {&snapshot->design, &snapshot->alloc_design};
    for (int d = 0; d < 2; d++) {
      used += snprintf(text + used, size - (size_t)used, "%svariance_groups=%d group_allocations=", d ? "alloc_" : "", VARIANCE_GROUPS);
      for (int g = 0; g < VARIANCE_GROUPS && used > 0 && (size_t)used < size; g++) {
        used += snprintf(text + used, size - (size_t)used, g ? ",%.0f" : "%.0f", designs[d]->allocations[g]);
      }
      if (used <= 0 || (size_t)used >= size) break;
      used += snprintf(text + used, size - (size_t)used, "\n");
      if (used <= 0 || (size_t)used >= size) break;
    }
  }
  return text;
}

typedef struct {
  hs_snapshot *snapshot;
  pb_buffer raw, gzipped;
  bool ok;
} encode_job;

// Runs without the GVL: the snapshot shares nothing with live recorder state.
static void *encode_without_gvl(void *arg) {
  encode_job *job = arg;
  job->ok = pprof_encode(job->snapshot, &job->raw) && pprof_gzip(&job->raw, &job->gzipped);
  snapshot_free(job->snapshot);
  job->snapshot = NULL;
  pb_free(&job->raw);
  return NULL;
}

static VALUE new_binary_string(VALUE job_ptr) {
  encode_job *job = (encode_job *)job_ptr;
  return rb_str_new((const char *)job->gzipped.data, (long)job->gzipped.len);
}

// Appends extra (NUL-free text, lines ending in \n) to the comments profile_comments made. Returns
// the new text, or the old one unchanged when memory runs out (the comment is then left out).
static char *append_comments(char *text, const char *extra, size_t extra_len) {
  if (text == NULL || extra_len == 0) return text;
  size_t len = strlen(text);
  char *grown = realloc(text, len + extra_len + 1);
  if (grown == NULL) return text;
  memcpy(grown + len, extra, extra_len);
  grown[len + extra_len] = '\0';
  return grown;
}

bool profile_take(profile_job *job, bool allocs, uint32_t min_age, bool with_census, char *extra, size_t extra_len) {
  *job = (profile_job){.extra = extra, .extra_len = extra_len, .min_age = min_age};
  job->gvl_started = clock_monotonic_nanos();
  // Nothing below runs Ruby code or checks interrupts (capture_poll_ruby ran before), so no thread, trap
  // handler or postponed job can stop or restart capture between the steps. Checked all the same: a
  // step that came to check interrupts would otherwise read a freed recorder.
  recorder *at_start = capture_recorder();
  // Names need Ruby strings, so they are read here, before the snapshot (which allocates none).
  if (!names_resolve(capture_names(), recorder_strings(capture_recorder()))) {
    profile_discard(job);
    rb_raise(rb_eNoMemError, "heapscope: not enough memory to name frames");
  }
  // The census walks the heap after the names (which allocate) and before the snapshot (which does
  // not), so no GC runs between the exact totals and the samples they bound.
  census exact;
  bool have_census = false;
  if (with_census) {
    const capture_config *config = capture_current_config();
    have_census = census_take(&exact, recorder_strings(capture_recorder()),
                              config->recorder.track_sizes ? 0 : config->recorder.slot_size, alloc_hook_records_whole);
    last.census_nanos = have_census ? exact.nanos : 0;
  }
  capture_prepare_snapshot();
  if (!capture_running() || capture_recorder() != at_start) {
    last.abandoned++;
    profile_discard(job);
    if (have_census) census_free(&exact);
    return false;
  }
  recorder_estimate estimate;
  capture_estimate(&estimate);
  job->snapshot = recorder_snapshot(capture_recorder(), capture_names(), capture_labels(), allocs, min_age, &estimate);
  if (job->snapshot == NULL) {
    profile_discard(job);
    if (have_census) census_free(&exact);
    rb_raise(rb_eNoMemError, "heapscope: not enough memory for a snapshot");
  }
  if (have_census) {
    census_bound_samples(&exact, job->snapshot);
    job->census_text = census_comments(&exact, job->snapshot, job->snapshot->strings, CENSUS_OTHER_CLASSES);
    census_free(&exact);
  }
  capture_check_invariants();
  return true;
}

void profile_discard(profile_job *job) {
  free(job->extra);
  job->extra = NULL;
  free(job->census_text);
  job->census_text = NULL;
  snapshot_free(job->snapshot);
  job->snapshot = NULL;
}

// The census lines of the last profile that had a census (owned here; replaced by the next one).
static char *last_census_text;

const char *profile_last_census(void) { return last_census_text; }

void profile_forget_census(void) {
  free(last_census_text);
  last_census_text = NULL;
}

VALUE profile_finish(profile_job *job) {
  encode_job encode = {.snapshot = job->snapshot};
  job->snapshot = NULL;
  uint64_t now = wall_nanos();
  encode.snapshot->period = capture_current_config()->sample_every;
  encode.snapshot->time_nanos = (int64_t)now;
  encode.snapshot->duration_nanos = (int64_t)(now - started_at_nanos);
  encode.snapshot->comments = append_comments(profile_comments(job->min_age, encode.snapshot), job->extra, job->extra_len);
  if (job->census_text != NULL) {
    encode.snapshot->comments = append_comments(encode.snapshot->comments, job->census_text, strlen(job->census_text));
    // Kept for automatic focus (profile_last_census), in place of the previous profile's.
    free(last_census_text);
    last_census_text = job->census_text;
    job->census_text = NULL;
  }
  profile_discard(job);
  uint64_t encode_started = clock_monotonic_nanos();
  last.gvl_nanos = encode_started - job->gvl_started;
  rb_thread_call_without_gvl(encode_without_gvl, &encode, NULL, NULL);
  last.encode_nanos = clock_monotonic_nanos() - encode_started;
  if (!encode.ok) {
    pb_free(&encode.gzipped);
    rb_raise(rb_eNoMemError, "heapscope: not enough memory to encode the profile");
  }
  int state = 0;
  VALUE result = rb_protect(new_binary_string, (VALUE)&encode, &state);
  pb_free(&encode.gzipped);
  if (state) rb_jump_tag(state);
  return result;
}
