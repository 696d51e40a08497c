// Unit tests for ext/heapscope/idindex.c: find/insert/remove against a model, collisions, growth,
// backward-shift deletion, hashing.
#include <stdlib.h>
#include <string.h>

#include "../../ext/heapscope/idindex.h"
#include "check.h"

// The "table" the index points into: keys[id] is the key stored under id.
typedef struct {
  uint64_t keys[4096];
} model;

static bool key_equals(const void *ctx, uint32_t id, const void *key) {
  const model *m = ctx;
  return m->keys[id] == *(const uint64_t *)key;
}

static uint32_t find(const idindex *index, const model *m, uint32_t hash, uint64_t key) {
  return idindex_find(index, hash, key_equals, m, &key);
}

static void test_empty_and_basic(void) {
  idindex index;
  model m = {{0}};
  CHECK(idindex_init(&index, 0));
  CHECK_EQ_U64(idindex_memory(&index), 16 * sizeof(idindex_slot)); // minimum capacity 16
  CHECK_EQ_U64(find(&index, &m, 7, 1), IDINDEX_NONE);
  m.keys[1] = 100;
  CHECK(idindex_insert(&index, 5, 1));
  CHECK_EQ_U64(find(&index, &m, 5, 100), 1);
  CHECK_EQ_U64(find(&index, &m, 6, 100), IDINDEX_NONE); // another hash: not probed as equal
  CHECK_EQ_U64(find(&index, &m, 5, 101), IDINDEX_NONE); // same hash, other key
  CHECK(!idindex_remove(&index, 5, 2));                 // absent id
  CHECK(idindex_remove(&index, 5, 1));
  CHECK(!idindex_remove(&index, 5, 1));
  CHECK_EQ_U64(index.count, 0);
  CHECK_EQ_U64(find(&index, &m, 5, 100), IDINDEX_NONE);
  idindex_free(&index);
  CHECK(index.slots == NULL);
  idindex_free(&index); // twice is harmless
  // A freed (or never-initialised-for-lack-of-memory) index is usable: the first insert allocates.
  CHECK_EQ_U64(find(&index, &m, 5, 100), IDINDEX_NONE);
  CHECK(!idindex_remove(&index, 5, 1));
  CHECK(idindex_insert(&index, 5, 1));
  CHECK_EQ_U64(find(&index, &m, 5, 100), 1);
  idindex_free(&index);
}

// Every id lands on the same home slot: one long probe run, removed from the middle.
static void test_collisions(void) {
  idindex index;
  model m = {{0}};
  CHECK(idindex_init(&index, 64));
  for (uint32_t id = 1; id <= 20; id++) {
    m.keys[id] = id * 11;
    CHECK(idindex_insert(&index, 42, id));
  }
  for (uint32_t id = 1; id <= 20; id += 3) CHECK(idindex_remove(&index, 42, id));
  for (uint32_t id = 1; id <= 20; id++) {
    uint32_t want = (id - 1) % 3 == 0 ? IDINDEX_NONE : id;
    CHECK_EQ_U64(find(&index, &m, 42, id * 11), want);
  }
  idindex_free(&index);
}

// Probe runs that wrap around the end of the slot array.
static void test_wraparound(void) {
  idindex index;
  model m = {{0}};
  CHECK(idindex_init(&index, 16));
  uint32_t mask = index.mask;
  for (uint32_t id = 1; id <= 6; id++) {
    m.keys[id] = id;
    // homes: mask, mask, 0, mask-1, 0, 1
    uint32_t homes[] = {0, mask, mask, 0, mask - 1, 0, 1};
    CHECK(idindex_insert(&index, homes[id], id));
  }
  CHECK(idindex_remove(&index, mask, 1));
  CHECK(idindex_remove(&index, 0, 3));
  uint32_t homes[] = {0, mask, mask, 0, mask - 1, 0, 1};
  for (uint32_t id = 1; id <= 6; id++) {
    uint32_t want = (id == 1 || id == 3) ? IDINDEX_NONE : id;
    CHECK_EQ_U64(find(&index, &m, homes[id], id), want);
  }
  idindex_free(&index);
}

static uint64_t rng_state = 0x12345678abcdefull;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

// Random inserts and removes with few distinct hashes (long runs, wraparound), against a model.
static void test_random_against_model(void) {
  idindex index;
  static model m;
  bool present[4096] = {false};
  uint32_t hashes[4096];
  CHECK(idindex_init(&index, 16));
  unsigned mismatches = 0;
  uint32_t live = 0;
  for (int step = 0; step < 200000; step++) {
    uint32_t id = 1 + (uint32_t)(rnd() % 4095);
    if (!present[id]) {
      m.keys[id] = rnd();
      hashes[id] = (uint32_t)(rnd() % 97) * 0x9e3779b1u; // 97 distinct hashes over every bit
      if (!idindex_insert(&index, hashes[id], id)) mismatches++;
      present[id] = true;
      live++;
    } else if (rnd() % 2) {
      if (!idindex_remove(&index, hashes[id], id)) mismatches++;
      present[id] = false;
      live--;
    }
    if (step % 997 == 0) {
      for (uint32_t j = 1; j < 4096; j++) {
        if (present[j] && find(&index, &m, hashes[j], m.keys[j]) != j) mismatches++;
        if (!present[j] && hashes[j] && find(&index, &m, hashes[j], m.keys[j]) != IDINDEX_NONE) mismatches++;
      }
      if (index.count != live) mismatches++;
      // Load stays at most 3/4.
      if ((uint64_t)index.count * 4 > (uint64_t)(index.mask + 1) * 3) mismatches++;
    }
  }
  CHECK_EQ_U64(mismatches, 0);
  idindex_free(&index);
}

static void test_hash(void) {
  const char a[] = "hello, world: a string longer than eight bytes";
  char b[sizeof a];
  memcpy(b, a, sizeof a);
  CHECK_EQ_U64(idindex_hash_bytes(a, sizeof a - 1), idindex_hash_bytes(b, sizeof b - 1));
  CHECK(idindex_hash_bytes(a, 5) != idindex_hash_bytes(a, 6));
  CHECK(idindex_hash_bytes("", 0) == idindex_hash_bytes(b, 0));
  // The length is mixed in: zero bytes of different lengths differ.
  static const char zeros[16] = {0};
  CHECK(idindex_hash_bytes(zeros, 3) != idindex_hash_bytes(zeros, 4));
  CHECK(idindex_hash_bytes(zeros, 8) != idindex_hash_bytes(zeros, 16));
  // Every length up to 16 from an unaligned start (the tail is read with memcpy).
  unsigned distinct = 0;
  for (size_t len = 1; len <= 16; len++) distinct += idindex_hash_bytes(a + 1, len) != idindex_hash_bytes(a + 1, len - 1);
  CHECK_EQ_U64(distinct, 16);
  // Low bits spread: 4096 small integers hit most of 256 buckets.
  unsigned hit[256] = {0}, used = 0;
  for (uint32_t i = 0; i < 4096; i++) hit[idindex_hash_bytes(&i, sizeof i) & 255]++;
  for (int i = 0; i < 256; i++) used += hit[i] != 0;
  CHECK(used >= 250);
}

int main(void) {
  test_empty_and_basic();
  test_collisions();
  test_wraparound();
  test_random_against_model();
  test_hash();
  return check_report("test_idindex");
}
