// Unit tests for ext/heapscope/stacktab.c: frame interning, stack interning with reference counts,
// id reuse, the max_stacks cap, memory accounting.
#include <stdlib.h>
#include <string.h>

#include "../../ext/heapscope/stacktab.h"
#include "check.h"

static bool stack_is(const stacktab *t, uint32_t id, const uint32_t *frames, uint32_t n) {
  uint32_t got_n;
  const uint32_t *got = stacktab_stack(t, id, &got_n);
  return got_n == n && (n == 0 || memcmp(got, frames, sizeof(uint32_t) * n) == 0);
}

static void test_frames(void) {
  stacktab *t = stacktab_new(10);
  CHECK(t != NULL);
  CHECK_EQ_U64(stacktab_frame_count(t), 1); // frame 0 is unused
  uint32_t a = stacktab_intern_frame(t, (hs_frame){7, 10});
  uint32_t b = stacktab_intern_frame(t, (hs_frame){7, 11});
  uint32_t c = stacktab_intern_frame(t, (hs_frame){0, 3}); // the "frames omitted" marker
  CHECK_EQ_U64(a, 1);
  CHECK_EQ_U64(b, 2);
  CHECK_EQ_U64(c, 3);
  CHECK_EQ_U64(stacktab_intern_frame(t, (hs_frame){7, 10}), a);
  CHECK_EQ_U64(stacktab_intern_frame(t, (hs_frame){7, -1}), 4); // negative lines are frames too
  CHECK(stacktab_frame(t, b)->code_id == 7 && stacktab_frame(t, b)->line == 11);
  CHECK(stacktab_frame(t, 999)->code_id == 0); // unknown ids read as frame 0
  // Growth past the initial 256 frames keeps ids.
  unsigned wrong = 0;
  for (uint32_t i = 0; i < 5000; i++) {
    uint32_t id = stacktab_intern_frame(t, (hs_frame){100 + i, (int32_t)i});
    if (id != 5 + i) wrong++;
  }
  for (uint32_t i = 0; i < 5000; i++) {
    const hs_frame *f = stacktab_frame(t, 5 + i);
    if (f->code_id != 100 + i || f->line != (int32_t)i) wrong++;
  }
  CHECK_EQ_U64(wrong, 0);
  stacktab_free(t);
}

static void test_stacks(void) {
  stacktab *t = stacktab_new(3);
  uint32_t s1[] = {1, 2, 3}, s2[] = {1, 2}, s3[] = {3, 2, 1}, s4[] = {9};
  uint32_t id1, id2, id3, id, id4;
  CHECK(stacktab_acquire(t, s1, 3, &id1) == STACKTAB_OK);
  CHECK(stacktab_acquire(t, s2, 2, &id2) == STACKTAB_OK);
  CHECK(stacktab_acquire(t, s1, 3, &id) == STACKTAB_OK);
  CHECK_EQ_U64(id, id1);
  CHECK(id1 != id2);
  CHECK_EQ_U64(stacktab_live_stacks(t), 2);
  CHECK(stack_is(t, id1, s1, 3));
  CHECK(stack_is(t, id2, s2, 2));
  // An empty stack (a sample with no Ruby frames) is a stack. (frame_ids must point somewhere even
  // when n is 0: it reaches memcpy/memcmp, for which NULL is undefined even with length 0.)
  uint32_t id_empty, none[1] = {0};
  CHECK(stacktab_acquire(t, none, 0, &id_empty) == STACKTAB_OK);
  CHECK(stack_is(t, id_empty, none, 0));
  // The cap: a fourth distinct stack is refused, but existing ones can still be acquired.
  CHECK(stacktab_acquire(t, s3, 3, &id3) == STACKTAB_FULL);
  CHECK(stacktab_acquire(t, s2, 2, &id) == STACKTAB_OK && id == id2);
  CHECK_EQ_U64(stacktab_live_stacks(t), 3);
  size_t memory_full = stacktab_memory(t);
  // Releases: id1 has two references, id2 two, empty one.
  stacktab_release(t, id_empty);
  CHECK_EQ_U64(stacktab_live_stacks(t), 2);
  CHECK(stacktab_memory(t) < memory_full);
  stacktab_release(t, id1);
  CHECK_EQ_U64(stacktab_live_stacks(t), 2);
  stacktab_retain(t, id1);
  stacktab_release(t, id1);
  stacktab_release(t, id1);
  CHECK_EQ_U64(stacktab_live_stacks(t), 1);
  // Freed ids are reused; a freed stack is gone from the index.
  CHECK(stacktab_acquire(t, s3, 3, &id3) == STACKTAB_OK);
  CHECK(id3 == id1 || id3 == id_empty);
  CHECK(stack_is(t, id3, s3, 3));
  CHECK(stacktab_acquire(t, s4, 1, &id4) == STACKTAB_OK);
  CHECK(id4 == id1 || id4 == id_empty);
  CHECK(id4 != id3);
  CHECK(stacktab_acquire(t, s1, 3, &id) == STACKTAB_FULL);
  stacktab_release(t, id2);
  stacktab_release(t, id2);
  stacktab_release(t, id3);
  stacktab_release(t, id4);
  CHECK_EQ_U64(stacktab_live_stacks(t), 0);
  stacktab_free(t);
  stacktab_free(NULL);
}

// Many distinct stacks: ids stay dense (1..N), contents survive growth of every array.
static void test_many(void) {
  stacktab *t = stacktab_new(100000);
  unsigned wrong = 0;
  uint32_t frames[40];
  for (uint32_t i = 0; i < 3000; i++) {
    uint32_t n = 1 + i % 40, id;
    for (uint32_t f = 0; f < n; f++) frames[f] = i * 7 + f;
    if (stacktab_acquire(t, frames, n, &id) != STACKTAB_OK || id != i + 1) wrong++;
  }
  for (uint32_t i = 0; i < 3000; i++) {
    uint32_t n = 1 + i % 40;
    for (uint32_t f = 0; f < n; f++) frames[f] = i * 7 + f;
    if (!stack_is(t, i + 1, frames, n)) wrong++;
  }
  for (uint32_t i = 1; i <= 3000; i++) stacktab_release(t, i);
  CHECK_EQ_U64(stacktab_live_stacks(t), 0);
  // After everything died, new stacks reuse ids 1..3000 rather than growing.
  size_t memory = stacktab_memory(t);
  for (uint32_t i = 0; i < 3000; i++) {
    uint32_t id;
    frames[0] = 1000000 + i;
    if (stacktab_acquire(t, frames, 1, &id) != STACKTAB_OK || id == 0 || id > 3000) wrong++;
  }
  CHECK(stacktab_memory(t) >= memory);
  CHECK_EQ_U64(wrong, 0);
  CHECK_EQ_U64(stacktab_live_stacks(t), 3000);
  stacktab_free(t); // frees live stacks too (ASan checks for leaks)
}

int main(void) {
  test_frames();
  test_stacks();
  test_many();
  return check_report("test_stacktab");
}
