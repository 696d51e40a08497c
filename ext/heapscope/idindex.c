#include "idindex.h"

#include <stdlib.h>
#include <string.h>

bool idindex_init(idindex *index, uint32_t initial_capacity) {
  uint32_t capacity = 16;
  while (capacity < initial_capacity && capacity < (1u << 30)) capacity <<= 1;
  index->slots = calloc(capacity, sizeof(idindex_slot));
  index->mask = index->slots ? capacity - 1 : 0;
  index->count = 0;
  return index->slots != NULL;
}

void idindex_free(idindex *index) {
  free(index->slots);
  index->slots = NULL;
  index->mask = 0;
  index->count = 0;
}

uint32_t idindex_find(const idindex *index, uint32_t hash, idindex_equal_fn equal, const void *ctx, const void *key) {
  if (index->slots == NULL) return IDINDEX_NONE;
  for (uint32_t i = hash & index->mask;; i = (i + 1) & index->mask) {
    const idindex_slot *slot = &index->slots[i];
    if (slot->id == IDINDEX_NONE) return IDINDEX_NONE;
    if (slot->hash == hash && equal(ctx, slot->id, key)) return slot->id;
  }
}

static void place(idindex_slot *slots, uint32_t mask, uint32_t hash, uint32_t id) {
  uint32_t i = hash & mask;
  while (slots[i].id != IDINDEX_NONE) i = (i + 1) & mask;
  slots[i].hash = hash;
  slots[i].id = id;
}

// Doubles the slot array (or creates it). Keeps the old one if memory is short.
static bool grow(idindex *index) {
  uint32_t old_capacity = index->slots ? index->mask + 1 : 0;
  uint32_t capacity = old_capacity ? old_capacity * 2 : 16;
  if (capacity == 0 || capacity > (1u << 31)) return false;
  idindex_slot *slots = calloc(capacity, sizeof(idindex_slot));
  if (slots == NULL) return false;
  for (uint32_t i = 0; i < old_capacity; i++) {
    if (index->slots[i].id != IDINDEX_NONE) place(slots, capacity - 1, index->slots[i].hash, index->slots[i].id);
  }
  free(index->slots);
  index->slots = slots;
  index->mask = capacity - 1;
  return true;
}

bool idindex_insert(idindex *index, uint32_t hash, uint32_t id) {
  if (index->slots == NULL || (uint64_t)(index->count + 1) * 4 > (uint64_t)(index->mask + 1) * 3) {
    if (!grow(index)) return false;
  }
  place(index->slots, index->mask, hash, id);
  index->count++;
  return true;
}

bool idindex_remove(idindex *index, uint32_t hash, uint32_t id) {
  if (index->slots == NULL) return false;
  uint32_t mask = index->mask;
  uint32_t i = hash & mask;
  while (index->slots[i].id != id) {
    if (index->slots[i].id == IDINDEX_NONE) return false;
    i = (i + 1) & mask;
  }
  // Backward-shift: pull later members of the probe run into the hole, so lookups never need
  // tombstones. A slot j may move to the hole i only if its home position is not in (i, j].
  for (uint32_t j = (i + 1) & mask;; j = (j + 1) & mask) {
    idindex_slot *slot = &index->slots[j];
    if (slot->id == IDINDEX_NONE) break;
    uint32_t home = slot->hash & mask;
    bool home_between = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
    if (!home_between) {
      index->slots[i] = *slot;
      i = j;
    }
  }
  index->slots[i].id = IDINDEX_NONE;
  index->slots[i].hash = 0;
  index->count--;
  return true;
}

size_t idindex_memory(const idindex *index) {
  return index->slots ? (size_t)(index->mask + 1) * sizeof(idindex_slot) : 0;
}

static inline uint64_t mix64(uint64_t x) {
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  return x;
}

uint32_t idindex_hash_bytes(const void *bytes, size_t len) {
  // One multiply per 8-byte word, then a full avalanche at the end: keys here are short (8-byte frames,
  // a few dozen frame ids, names), and linear probing only needs well-mixed low bits.
  const unsigned char *p = bytes;
  uint64_t h = 0x9e3779b97f4a7c15ull ^ ((uint64_t)len * 0xc2b2ae3d27d4eb4full);
  while (len >= 8) {
    uint64_t word;
    memcpy(&word, p, 8);
    h = (h ^ word) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
    p += 8;
    len -= 8;
  }
  if (len > 0) {
    uint64_t tail = 0;
    memcpy(&tail, p, len);
    h = (h ^ tail) * 0xff51afd7ed558ccdull;
  }
  return (uint32_t)mix64(h);
}
