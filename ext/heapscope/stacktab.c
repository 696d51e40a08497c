#include "stacktab.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "idindex.h"

typedef struct {
  uint32_t hash;
  uint32_t refcount;
  uint32_t frame_count;
  uint32_t frame_ids[]; // leaf first
} stack_entry;

struct stacktab {
  hs_frame *frames; // frames[frame id]; frames[0] unused
  uint32_t frame_count, frame_capacity;
  idindex frame_index;

  stack_entry **stacks;  // stacks[stack id]; NULL = free id
  uint32_t *free_ids;    // ids whose stack was freed, reused first
  uint32_t stack_slots;  // ids 1..stack_slots-1 have been handed out
  uint32_t stack_capacity, free_count, live_stacks, max_stacks;
  size_t stack_bytes;    // bytes of the live stack_entry blocks
  idindex stack_index;
};

typedef struct {
  const uint32_t *frame_ids;
  uint32_t n;
} stack_key;

static bool frame_equals(const void *ctx, uint32_t id, const void *key) {
  const stacktab *table = ctx;
  return memcmp(&table->frames[id], key, sizeof(hs_frame)) == 0;
}

static bool stack_equals(const void *ctx, uint32_t id, const void *key_ptr) {
  const stacktab *table = ctx;
  const stack_key *key = key_ptr;
  const stack_entry *entry = table->stacks[id];
  return entry->frame_count == key->n && memcmp(entry->frame_ids, key->frame_ids, sizeof(uint32_t) * key->n) == 0;
}

stacktab *stacktab_new(uint32_t max_stacks) {
  stacktab *table = calloc(1, sizeof(stacktab));
  if (table == NULL) return NULL;
  table->max_stacks = max_stacks;
  table->frame_capacity = 256;
  table->frames = calloc(table->frame_capacity, sizeof(hs_frame));
  table->frame_count = 1;
  table->stack_capacity = 256;
  table->stacks = calloc(table->stack_capacity, sizeof(stack_entry *));
  table->free_ids = malloc(sizeof(uint32_t) * table->stack_capacity);
  table->stack_slots = 1;
  if (table->frames == NULL || table->stacks == NULL || table->free_ids == NULL ||
      !idindex_init(&table->frame_index, 256) || !idindex_init(&table->stack_index, 256)) {
    stacktab_free(table);
    return NULL;
  }
  return table;
}

void stacktab_free(stacktab *table) {
  if (table == NULL) return;
  if (table->stacks) {
    for (uint32_t id = 1; id < table->stack_slots; id++) free(table->stacks[id]);
  }
  free(table->stacks);
  free(table->free_ids);
  free(table->frames);
  idindex_free(&table->frame_index);
  idindex_free(&table->stack_index);
  free(table);
}

uint32_t stacktab_intern_frame(stacktab *table, hs_frame frame) {
  uint32_t hash = idindex_hash_bytes(&frame, sizeof frame);
  uint32_t id = idindex_find(&table->frame_index, hash, frame_equals, table, &frame);
  if (id != IDINDEX_NONE) return id;
  if (table->frame_count == table->frame_capacity) {
    if (table->frame_capacity >= UINT32_MAX / 2) return 0;
    hs_frame *frames = realloc(table->frames, sizeof(hs_frame) * table->frame_capacity * 2);
    if (frames == NULL) return 0;
    table->frames = frames;
    table->frame_capacity *= 2;
  }
  id = table->frame_count;
  if (!idindex_insert(&table->frame_index, hash, id)) return 0;
  table->frames[id] = frame;
  table->frame_count++;
  return id;
}

const hs_frame *stacktab_frame(const stacktab *table, uint32_t frame_id) {
  return frame_id < table->frame_count ? &table->frames[frame_id] : &table->frames[0];
}

uint32_t stacktab_frame_count(const stacktab *table) { return table->frame_count; }

// Returns a free stack id (reusing freed ones first), or 0 when memory is short.
static uint32_t take_stack_id(stacktab *table) {
  if (table->free_count > 0) return table->free_ids[--table->free_count];
  if (table->stack_slots == table->stack_capacity) {
    if (table->stack_capacity >= UINT32_MAX / 2) return 0;
    uint32_t capacity = table->stack_capacity * 2;
    stack_entry **stacks = realloc(table->stacks, sizeof(stack_entry *) * capacity);
    if (stacks == NULL) return 0;
    table->stacks = stacks;
    memset(stacks + table->stack_capacity, 0, sizeof(stack_entry *) * (capacity - table->stack_capacity));
    uint32_t *free_ids = realloc(table->free_ids, sizeof(uint32_t) * capacity);
    if (free_ids == NULL) return 0; // stacks grew, which is harmless
    table->free_ids = free_ids;
    table->stack_capacity = capacity;
  }
  return table->stack_slots++;
}

stacktab_status stacktab_acquire(stacktab *table, const uint32_t *frame_ids, uint32_t n, uint32_t *stack_id) {
  stack_key key = {frame_ids, n};
  uint32_t hash = idindex_hash_bytes(frame_ids, sizeof(uint32_t) * n);
  uint32_t id = idindex_find(&table->stack_index, hash, stack_equals, table, &key);
  if (id != IDINDEX_NONE) {
    table->stacks[id]->refcount++;
    *stack_id = id;
    return STACKTAB_OK;
  }
  if (table->live_stacks >= table->max_stacks) return STACKTAB_FULL;

  size_t bytes = sizeof(stack_entry) + sizeof(uint32_t) * n;
  stack_entry *entry = malloc(bytes);
  if (entry == NULL) return STACKTAB_NOMEM;
  id = take_stack_id(table);
  if (id == 0) {
    free(entry);
    return STACKTAB_NOMEM;
  }
  if (!idindex_insert(&table->stack_index, hash, id)) {
    free(entry);
    table->free_ids[table->free_count++] = id;
    return STACKTAB_NOMEM;
  }
  entry->hash = hash;
  entry->refcount = 1;
  entry->frame_count = n;
  memcpy(entry->frame_ids, frame_ids, sizeof(uint32_t) * n);
  table->stacks[id] = entry;
  table->live_stacks++;
  table->stack_bytes += bytes;
  *stack_id = id;
  return STACKTAB_OK;
}

void stacktab_retain(stacktab *table, uint32_t stack_id) { table->stacks[stack_id]->refcount++; }

void stacktab_release(stacktab *table, uint32_t stack_id) {
  stack_entry *entry = table->stacks[stack_id];
  if (--entry->refcount > 0) return;
  idindex_remove(&table->stack_index, entry->hash, stack_id);
  table->stack_bytes -= sizeof(stack_entry) + sizeof(uint32_t) * entry->frame_count;
  free(entry);
  table->stacks[stack_id] = NULL;
  table->free_ids[table->free_count++] = stack_id;
  table->live_stacks--;
}

const uint32_t *stacktab_stack(const stacktab *table, uint32_t stack_id, uint32_t *n) {
  const stack_entry *entry = table->stacks[stack_id];
  *n = entry->frame_count;
  return entry->frame_ids;
}

uint32_t stacktab_live_stacks(const stacktab *table) { return table->live_stacks; }

size_t stacktab_memory(const stacktab *table) {
  return sizeof(stacktab) + sizeof(hs_frame) * table->frame_capacity + idindex_memory(&table->frame_index) +
         (sizeof(stack_entry *) + sizeof(uint32_t)) * table->stack_capacity + idindex_memory(&table->stack_index) +
         table->stack_bytes;
}
