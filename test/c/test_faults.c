// Fault injection for the pure-C modules: every allocation a scenario makes is made to fail in turn
// (the 1st, then the 2nd, ...). Each time the module must report the failure through its return value,
// stay consistent (what was interned before is still there; the next call, with memory back, works) and
// leak nothing (ASan's leak check runs at exit). Built by `rake test_c` with -include fault_alloc.h.
#undef malloc
#undef calloc
#undef realloc
#include <stdlib.h>
#include <string.h>

#include "../../ext/heapscope/pprof.h"
#include "../../ext/heapscope/stacktab.h"
#include "../../ext/heapscope/strtab.h"
#include "check.h"

static long fail_at = -1; // the allocation (0-based, counted from arm()) that fails; -1 = none
static long allocations;

static void arm(long n) {
  fail_at = n;
  allocations = 0;
}
static bool should_fail(void) { return fail_at >= 0 && allocations++ == fail_at; }
void *fault_malloc(size_t n) { return should_fail() ? NULL : malloc(n); }
void *fault_calloc(size_t c, size_t n) { return should_fail() ? NULL : calloc(c, n); }
void *fault_realloc(void *p, size_t n) { return should_fail() ? NULL : realloc(p, n); }

// Runs scenario with the k-th allocation failing, for every k until a run makes fewer than k + 1
// allocations (no failure happened). Returns how many failure points were tried.
static long every_failure_point(bool (*scenario)(void)) {
  long k = 0;
  for (;; k++) {
    arm(k);
    bool failed_gracefully = scenario();
    bool injected = allocations > k;
    fail_at = -1;
    CHECK(failed_gracefully);
    if (!injected) break;
  }
  return k;
}

static char *name_of(int i, char *buf) {
  // %.14s: the longest result (an 11-character int) still fits the 32 bytes, so nothing is cut.
  snprintf(buf, 32, "name_%d_%.14s", i, i % 3 ? "x" : "a longer name to grow the byte buffer faster");
  return buf;
}

// strtab: growth of entries, bytes and index may fail; earlier strings survive, ids stay dense.
static bool strtab_scenario(void) {
  strtab *t = strtab_new();
  if (t == NULL) return true; // failing here is a clean failure
  char buf[64];
  int interned = 0;
  bool ok = true;
  for (int i = 0; i < 300; i++) {
    name_of(i, buf); // first: the order in which arguments are evaluated is unspecified (gcc takes strlen first)
    uint32_t id = strtab_intern(t, buf, strlen(buf));
    if (id == STRTAB_ERROR) {
      ok = ok && strtab_count(t) == (uint32_t)interned + 1; // nothing half-added
      break;
    }
    ok = ok && id == (uint32_t)i + 1;
    interned++;
  }
  fail_at = -1; // memory is back
  for (int i = 0; i < interned; i++) {
    size_t len;
    const char *got = strtab_get(t, (uint32_t)i + 1, &len);
    ok = ok && len == strlen(name_of(i, buf)) && memcmp(got, buf, len) == 0;
    ok = ok && strtab_intern(t, buf, len) == (uint32_t)i + 1;
  }
  ok = ok && strtab_intern(t, "after", 5) == (uint32_t)interned + 1;
  strtab *copy = strtab_clone(t);
  ok = ok && copy != NULL && strtab_count(copy) == strtab_count(t);
  strtab_free(copy);
  strtab_free(t);
  return ok;
}

static bool strtab_clone_scenario(void) {
  fail_at = -1;
  strtab *t = strtab_new();
  (void)strtab_intern(t, "x", 1);
  long armed_at = 0;
  arm(armed_at);
  strtab *copy = strtab_clone(t); // fails at its first or second allocation, or not at all
  fail_at = -1;
  bool ok = copy == NULL || strtab_count(copy) == 2;
  strtab_free(copy);
  strtab_free(t);
  return ok;
}

// stacktab: frames and stacks; a refused stack leaves no reference, no id and no index entry behind.
static bool stacktab_scenario(void) {
  stacktab *t = stacktab_new(1000);
  if (t == NULL) return true;
  bool ok = true;
  uint32_t ids[400] = {0};
  int acquired = 0;
  for (int i = 0; i < 400; i++) {
    uint32_t frame = stacktab_intern_frame(t, (hs_frame){(uint32_t)i + 1, i});
    if (frame == 0) break;
    uint32_t frames[3] = {frame, frame, (uint32_t)(i % 7) + 1};
    stacktab_status status = stacktab_acquire(t, frames, 3, &ids[i]);
    if (status != STACKTAB_OK) {
      ok = ok && status == STACKTAB_NOMEM && stacktab_live_stacks(t) == (uint32_t)acquired;
      break;
    }
    acquired++;
    if (i % 5 == 0) {
      stacktab_release(t, ids[i]); // churn: freed ids get reused
      ids[i] = 0;
      acquired--;
    }
  }
  fail_at = -1;
  for (int i = 0; i < 400; i++) {
    if (ids[i] == 0) continue;
    uint32_t n;
    const uint32_t *frames = stacktab_stack(t, ids[i], &n);
    ok = ok && n == 3 && stacktab_frame(t, frames[0])->code_id == (uint32_t)i + 1;
  }
  uint32_t again, frames[1] = {1};
  ok = ok && stacktab_acquire(t, frames, 1, &again) == STACKTAB_OK;
  ok = ok && stacktab_live_stacks(t) == (uint32_t)acquired + 1;
  stacktab_free(t);
  return ok;
}

// snapshot + pprof_encode + pprof_gzip: any failure is reported, the output buffer stays freeable.
static bool pprof_scenario(void) {
  hs_snapshot *s = snapshot_new();
  if (s == NULL) return true;
  bool ok = true, built = true;
  s->strings = strtab_new();
  char buf[64];
  uint32_t locations[120];
  for (int i = 0; i < 120 && built && s->strings; i++) {
    name_of(i % 40, buf);
    uint32_t f = strtab_intern(s->strings, buf, strlen(buf));
    built = f != STRTAB_ERROR && (locations[i] = snapshot_location_id(s, (hs_location){f, 0, i})) != 0;
  }
  int64_t values[HS_VALUE_COUNT] = {1, 2, 3, 4};
  for (int i = 0; i < 200 && built && s->strings; i++) {
    uint32_t offset = snapshot_add_stack(s, locations + i % 100, 20);
    built = offset != UINT32_MAX && snapshot_add_sample(s, offset, 20, 1, i % 4 ? i : HS_NO_AGE, values, NULL, NULL, 0);
  }
  if (built && s->strings) {
    s->comments = strdup("a comment\nanother");
    pb_buffer raw, gz;
    pb_init(&raw);
    pb_init(&gz);
    bool encoded = pprof_encode(s, &raw);
    bool gzipped = encoded && pprof_gzip(&raw, &gz);
    ok = ok && (!encoded || !raw.failed);
    (void)gzipped;
    pb_free(&raw);
    pb_free(&gz);
  }
  snapshot_free(s);
  return ok;
}

int main(void) {
  long points = 0;
  points += every_failure_point(strtab_scenario);
  points += every_failure_point(strtab_clone_scenario);
  points += every_failure_point(stacktab_scenario);
  points += every_failure_point(pprof_scenario);
  CHECK(points > 50); // the scenarios really allocate (the hook is wired)
  printf("allocation failure points tried: %ld\n", points);
  return check_report("test_faults");
}
