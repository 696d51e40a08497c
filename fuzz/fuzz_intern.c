// fuzz_intern: the interning tables against simple models. The input is a sequence of operations on
// one strtab, one stacktab (with a small max_stacks, so the cap is hit) and one bare idindex; after
// each operation the table must agree with a model that is just an array searched linearly.
//   strtab:   intern (small alphabet, so duplicates are common) -> same bytes, same id; ids 1..N.
//   stacktab: intern_frame; acquire / retain / release stacks with reference counts; ids of freed
//             stacks reused; STACKTAB_FULL exactly when max_stacks distinct stacks are alive.
//   idindex:  insert / remove / find with few distinct hashes (long probe runs, wraparound).
#include "../ext/heapscope/idindex.h"
#include "../ext/heapscope/stacktab.h"
#include "../ext/heapscope/strtab.h"
#include "fuzz_input.h"

#define MAX_STRINGS 512
#define MAX_FRAMES 64
#define MAX_STACK_SLOTS 64 // model slots (stack ids handed out stay below max_stacks + a few)
#define MAX_STACK_LEN 12
#define MAX_KEYS 256

typedef struct {
  uint8_t bytes[16];
  size_t len;
} model_string;

typedef struct {
  uint32_t frames[MAX_STACK_LEN];
  uint32_t n, refs; // refs == 0: not alive
} model_stack;

static bool key_equals(const void *ctx, uint32_t id, const void *key) {
  const uint64_t *keys = ctx;
  return keys[id] == *(const uint64_t *)key;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_input in = {data, size};
  static model_string strings[MAX_STRINGS];
  static hs_frame frames[MAX_FRAMES];
  static model_stack stacks[MAX_STACK_SLOTS + 1]; // by stack id
  static uint64_t keys[MAX_KEYS + 1];             // idindex model: keys[id], 0 = absent
  static uint32_t key_hashes[MAX_KEYS + 1];
  uint32_t string_count = 1, frame_count = 1;     // id 0 is "" / unused
  memset(stacks, 0, sizeof stacks);
  memset(keys, 0, sizeof keys);

  uint32_t max_stacks = 1 + fz_below(&in, 16);
  strtab *st = strtab_new();
  stacktab *tt = stacktab_new(max_stacks);
  idindex index;
  FZ_ASSERT(st != NULL && tt != NULL && idindex_init(&index, fz_below(&in, 64)));

  for (int step = 0; step < 2000 && in.left > 0; step++) {
    switch (fz_below(&in, 7)) {
      case 0: { // strtab_intern
        uint8_t bytes[16];
        size_t len = fz_bytes(&in, bytes, 4);
        for (size_t i = 0; i < len; i++) bytes[i] = (uint8_t)("ab\0c"[bytes[i] & 3]);
        uint32_t id = strtab_intern(st, (const char *)bytes, len);
        uint32_t want = len == 0 ? 0 : UINT32_MAX;
        for (uint32_t i = 1; i < string_count && want == UINT32_MAX; i++) {
          if (strings[i].len == len && memcmp(strings[i].bytes, bytes, len) == 0) want = i;
        }
        if (want == UINT32_MAX) {
          FZ_ASSERT(string_count < MAX_STRINGS); // 4 symbols, length <= 4: at most 340 strings
          want = string_count++;
          memcpy(strings[want].bytes, bytes, len);
          strings[want].len = len;
        }
        FZ_ASSERT(id == want);
        FZ_ASSERT(strtab_count(st) == string_count);
        break;
      }
      case 1: { // strtab_get of any id (unknown ids read as "")
        uint32_t id = fz_below(&in, MAX_STRINGS);
        size_t len;
        const char *bytes = strtab_get(st, id, &len);
        if (id < string_count) FZ_ASSERT(len == strings[id].len && memcmp(bytes, strings[id].bytes, len) == 0);
        else FZ_ASSERT(len == 0);
        break;
      }
      case 2: { // stacktab_intern_frame
        hs_frame f = {fz_below(&in, 4), (int32_t)fz_below(&in, 4) - 1};
        uint32_t id = stacktab_intern_frame(tt, f);
        uint32_t want = 0;
        for (uint32_t i = 1; i < frame_count && want == 0; i++) {
          if (frames[i].code_id == f.code_id && frames[i].line == f.line) want = i;
        }
        if (want == 0) {
          want = frame_count++;
          frames[want] = f;
        }
        FZ_ASSERT(id == want && stacktab_frame_count(tt) == frame_count);
        const hs_frame *got = stacktab_frame(tt, id);
        FZ_ASSERT(got->code_id == f.code_id && got->line == f.line);
        break;
      }
      case 3: { // stacktab_acquire
        uint32_t ids[MAX_STACK_LEN], n = fz_below(&in, 4); // short stacks from few frames: many repeats
        for (uint32_t i = 0; i < n; i++) ids[i] = 1 + fz_below(&in, 3);
        uint32_t live = 0, match = 0;
        for (uint32_t id = 1; id <= MAX_STACK_SLOTS; id++) {
          if (stacks[id].refs == 0) continue;
          live++;
          if (stacks[id].n == n && memcmp(stacks[id].frames, ids, sizeof(uint32_t) * n) == 0) match = id;
        }
        uint32_t got = 0;
        stacktab_status status = stacktab_acquire(tt, ids, n, &got);
        if (match) {
          FZ_ASSERT(status == STACKTAB_OK && got == match);
          stacks[match].refs++;
        } else if (live >= max_stacks) {
          FZ_ASSERT(status == STACKTAB_FULL);
        } else {
          FZ_ASSERT(status == STACKTAB_OK && got >= 1 && got <= MAX_STACK_SLOTS && stacks[got].refs == 0);
          // Ids stay dense: never above the most stacks ever alive at once.
          FZ_ASSERT(got <= max_stacks);
          memcpy(stacks[got].frames, ids, sizeof(uint32_t) * n);
          stacks[got].n = n;
          stacks[got].refs = 1;
        }
        break;
      }
      case 4: { // stacktab_retain or stacktab_release of a live stack
        uint32_t id = 1 + fz_below(&in, MAX_STACK_SLOTS);
        if (stacks[id].refs == 0) break;
        if (fz_below(&in, 3) == 0) {
          stacktab_retain(tt, id);
          stacks[id].refs++;
        } else {
          stacktab_release(tt, id);
          stacks[id].refs--;
        }
        break;
      }
      case 5: { // idindex insert (absent id) or remove (present id)
        uint32_t id = 1 + fz_below(&in, MAX_KEYS);
        if (keys[id] == 0) {
          keys[id] = id; // keys are unique: the caller of idindex_insert checks absence first
          key_hashes[id] = fz_below(&in, 8) * 0x01010101u; // 8 hashes: long runs in every capacity
          FZ_ASSERT(idindex_insert(&index, key_hashes[id], id));
        } else {
          FZ_ASSERT(idindex_remove(&index, key_hashes[id], id));
          FZ_ASSERT(!idindex_remove(&index, key_hashes[id], id));
          keys[id] = 0;
        }
        break;
      }
      case 6: { // idindex find of every key, present or not
        uint32_t count = 0;
        for (uint32_t id = 1; id <= MAX_KEYS; id++) {
          if (keys[id] == 0) continue;
          count++;
          FZ_ASSERT(idindex_find(&index, key_hashes[id], key_equals, keys, &keys[id]) == id);
        }
        uint64_t absent = MAX_KEYS + 1; // never a stored key
        FZ_ASSERT(idindex_find(&index, fz_below(&in, 8) * 0x01010101u, key_equals, keys, &absent) == IDINDEX_NONE);
        FZ_ASSERT(index.count == count);
        break;
      }
    }
    // The stack table agrees with the model after every step.
    uint32_t live = 0;
    for (uint32_t id = 1; id <= MAX_STACK_SLOTS; id++) {
      if (stacks[id].refs == 0) continue;
      live++;
      uint32_t n;
      const uint32_t *got = stacktab_stack(tt, id, &n);
      FZ_ASSERT(n == stacks[id].n && (n == 0 || memcmp(got, stacks[id].frames, sizeof(uint32_t) * n) == 0));
    }
    FZ_ASSERT(stacktab_live_stacks(tt) == live);
  }

  strtab_free(st);
  stacktab_free(tt);
  idindex_free(&index);
  return 0;
}
