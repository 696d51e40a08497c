// Unit tests for ext/heapscope/labels.c: sets are interned in canonical order, the last value of a
// repeated key wins, labelsets_with adds a pair unless the key is there, the cap maps new sets to their
// overflow set ("(other)" values) and past its reserve to the empty set, and nothing grows once full.
#include <stdlib.h>
#include <string.h>

#include "../../ext/heapscope/labels.h"
#include "check.h"

static label_text text(const char *key, const char *value) { return (label_text){key, strlen(key), value, strlen(value)}; }

// Whether set holds exactly the pairs "k=v" given, in any order.
static bool holds(const labelsets *t, uint32_t set, const char *const *expected, uint32_t count) {
  uint32_t n;
  const label_pair *pairs = labelsets_get(t, set, &n);
  if (n != count) return false;
  for (uint32_t e = 0; e < count; e++) {
    bool found = false;
    for (uint32_t i = 0; i < n && !found; i++) {
      size_t kl, vl;
      const char *k = labelsets_string(t, pairs[i].key, &kl);
      const char *v = labelsets_string(t, pairs[i].value, &vl);
      char buf[600];
      snprintf(buf, sizeof buf, "%.*s=%.*s", (int)kl, k, (int)vl, v);
      found = strcmp(buf, expected[e]) == 0;
    }
    if (!found) return false;
  }
  return true;
}

static void test_interning(void) {
  labelsets *t = labelsets_new(100);
  CHECK(t != NULL);
  CHECK_EQ_U64(labelsets_intern(t, NULL, 0), LABELSET_NONE);
  label_text ab[] = {text("endpoint", "GET /a"), text("job", "J")};
  label_text ba[] = {text("job", "J"), text("endpoint", "GET /a")};
  uint32_t s1 = labelsets_intern(t, ab, 2);
  CHECK(s1 != LABELSET_NONE);
  CHECK_EQ_U64(labelsets_intern(t, ba, 2), s1); // order does not matter
  const char *const want[] = {"endpoint=GET /a", "job=J"};
  CHECK(holds(t, s1, want, 2));
  label_text other[] = {text("endpoint", "GET /b")};
  uint32_t s2 = labelsets_intern(t, other, 1);
  CHECK(s2 != s1 && s2 != LABELSET_NONE);
  // A repeated key keeps its last value; an empty key is skipped.
  label_text repeated[] = {text("endpoint", "GET /a"), text("", "x"), text("endpoint", "GET /b")};
  CHECK_EQ_U64(labelsets_intern(t, repeated, 3), s2);
  // Only empty keys: the empty set.
  label_text empty_key[] = {text("", "x")};
  CHECK_EQ_U64(labelsets_intern(t, empty_key, 1), LABELSET_NONE);
  // Unknown ids read as empty.
  uint32_t n = 7;
  labelsets_get(t, 9999, &n);
  CHECK_EQ_U64(n, 0);
  labelsets_stats stats;
  labelsets_get_stats(t, &stats);
  CHECK_EQ_U64(stats.sets, 2);
  CHECK_EQ_U64(stats.overflowed, 0);
  CHECK(labelsets_id_limit(t) == 3);
  labelsets_free(t);
  labelsets_free(NULL);
}

static void test_limits(void) {
  labelsets *t = labelsets_new(100);
  // More than LABELS_MAX_PAIRS keys: the first 16 distinct.
  char keys[20][16];
  label_text many[20];
  for (int i = 0; i < 20; i++) {
    snprintf(keys[i], sizeof keys[i], "k%02d", i);
    many[i] = text(keys[i], "v");
  }
  uint32_t n;
  labelsets_get(t, labelsets_intern(t, many, 20), &n);
  CHECK_EQ_U64(n, LABELS_MAX_PAIRS);
  // Long values are cut at LABELS_MAX_LEN: two that differ only past it are one set.
  char long_a[400], long_b[400];
  memset(long_a, 'x', sizeof long_a);
  memcpy(long_b, long_a, sizeof long_b);
  long_b[399] = 'y';
  label_text la = {"path", 4, long_a, sizeof long_a}, lb = {"path", 4, long_b, sizeof long_b};
  uint32_t sa = labelsets_intern(t, &la, 1);
  CHECK_EQ_U64(labelsets_intern(t, &lb, 1), sa);
  const label_pair *p = labelsets_get(t, sa, &n);
  size_t len;
  labelsets_string(t, p[0].value, &len);
  CHECK_EQ_U64(len, LABELS_MAX_LEN);
  labelsets_free(t);
}

static void test_with(void) {
  labelsets *t = labelsets_new(100);
  label_text e[] = {text("endpoint", "GET /a")};
  uint32_t s = labelsets_intern(t, e, 1);
  uint32_t st = labelsets_with(t, s, "thread", 6, "worker-1", 8);
  const char *const want[] = {"endpoint=GET /a", "thread=worker-1"};
  CHECK(holds(t, st, want, 2));
  CHECK_EQ_U64(labelsets_with(t, s, "thread", 6, "worker-1", 8), st); // the same set again
  // The key is there already: its value wins.
  CHECK_EQ_U64(labelsets_with(t, st, "thread", 6, "main", 4), st);
  // From the empty set.
  uint32_t only = labelsets_with(t, LABELSET_NONE, "thread", 6, "main", 4);
  const char *const want_main[] = {"thread=main"};
  CHECK(holds(t, only, want_main, 1));
  // An empty key adds nothing.
  CHECK_EQ_U64(labelsets_with(t, s, "", 0, "x", 1), s);
  labelsets_free(t);
}

static void test_cap(void) {
  labelsets *t = labelsets_new(3);
  char values[200][24];
  uint32_t ids[200];
  for (int i = 0; i < 200; i++) {
    snprintf(values[i], sizeof values[i], "/item/%d", i);
    label_text one[] = {text("endpoint", values[i])};
    ids[i] = labelsets_intern(t, one, 1);
  }
  // The first three are their own sets; every later one is the overflow set {endpoint => "(other)"}.
  CHECK(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2]);
  const char *const other[] = {"endpoint=(other)"};
  CHECK(holds(t, ids[3], other, 1));
  for (int i = 4; i < 200; i++) CHECK_EQ_U64(ids[i], ids[3]);
  // A known set is still found after the cap.
  label_text first[] = {text("endpoint", values[1])};
  CHECK_EQ_U64(labelsets_intern(t, first, 1), ids[1]);
  labelsets_stats stats;
  labelsets_get_stats(t, &stats);
  CHECK_EQ_U64(stats.sets, 4);
  CHECK_EQ_U64(stats.overflowed, 197);
  uint64_t memory = stats.memory_bytes;
  // Keys never seen before the cap are dropped (their strings would grow the table).
  label_text unseen[] = {text("k1", "v")};
  CHECK_EQ_U64(labelsets_intern(t, unseen, 1), LABELSET_NONE);
  labelsets_get_stats(t, &stats);
  CHECK_EQ_U64(stats.dropped, 1);
  CHECK_EQ_U64(stats.memory_bytes, memory); // nothing grew
  // labelsets_with past the cap: a new value maps to "(other)".
  uint32_t w = labelsets_with(t, ids[0], "endpoint", 8, "x", 1); // key present: unchanged
  CHECK_EQ_U64(w, ids[0]);
  labelsets_free(t);
}

static void test_overflow_reserve(void) {
  // Keys interned while room remained, then combined in new ways past the cap: one overflow set per
  // combination of keys, up to the reserve; then the empty set.
  labelsets *t = labelsets_new(1000);
  char keys[LABELSETS_OVERFLOW_RESERVE + 8][16];
  label_text all[2];
  for (int i = 0; i < LABELSETS_OVERFLOW_RESERVE + 8; i++) {
    snprintf(keys[i], sizeof keys[i], "k%d", i);
    label_text one[] = {text(keys[i], "v")};
    CHECK(labelsets_intern(t, one, 1) != LABELSET_NONE);
  }
  labelsets_set_max(t, 1); // lowered below what exists: existing sets stay, new ones overflow
  uint32_t none = 0, overflow = 0;
  for (int i = 0; i + 1 < LABELSETS_OVERFLOW_RESERVE + 8; i++) {
    all[0] = text(keys[i], "w");
    all[1] = text(keys[i + 1], "w");
    uint32_t id = labelsets_intern(t, all, 2);
    if (id == LABELSET_NONE) none++;
    else overflow++;
  }
  CHECK_EQ_U64(overflow, LABELSETS_OVERFLOW_RESERVE);
  CHECK_EQ_U64(none, 7);
  labelsets_free(t);
}

int main(void) {
  test_interning();
  test_limits();
  test_with();
  test_cap();
  test_overflow_reserve();
  return check_report("labels");
}
