#include "strtab.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "idindex.h"

typedef struct {
  uint32_t offset; // into bytes
  uint32_t len;
} strtab_entry;

struct strtab {
  char *bytes; // every string back to back, no separators
  size_t bytes_len, bytes_capacity;
  strtab_entry *entries; // entries[id]; entries[0] is ""
  uint32_t count, capacity;
  idindex index; // hash of the bytes -> id (id 0 is never indexed)
};

typedef struct {
  const char *bytes;
  size_t len;
} strtab_key;

static bool entry_equals(const void *ctx, uint32_t id, const void *key_ptr) {
  const strtab *table = ctx;
  const strtab_key *key = key_ptr;
  const strtab_entry *entry = &table->entries[id];
  return entry->len == key->len && memcmp(table->bytes + entry->offset, key->bytes, key->len) == 0;
}

strtab *strtab_new(void) {
  strtab *table = calloc(1, sizeof(strtab));
  if (table == NULL) return NULL;
  table->capacity = 64;
  table->entries = calloc(table->capacity, sizeof(strtab_entry));
  table->bytes_capacity = 1024;
  table->bytes = malloc(table->bytes_capacity);
  if (table->entries == NULL || table->bytes == NULL || !idindex_init(&table->index, 64)) {
    strtab_free(table);
    return NULL;
  }
  table->count = 1; // id 0: "" at offset 0, length 0
  return table;
}

void strtab_free(strtab *table) {
  if (table == NULL) return;
  free(table->bytes);
  free(table->entries);
  idindex_free(&table->index);
  free(table);
}

// Makes room for one more entry of len bytes; false when memory is short.
static bool reserve(strtab *table, size_t len) {
  if (table->count == table->capacity) {
    if (table->capacity >= UINT32_MAX / 2) return false;
    strtab_entry *entries = realloc(table->entries, sizeof(strtab_entry) * table->capacity * 2);
    if (entries == NULL) return false;
    table->entries = entries;
    table->capacity *= 2;
  }
  if (table->bytes_len + len > table->bytes_capacity) {
    size_t capacity = table->bytes_capacity * 2;
    while (capacity < table->bytes_len + len) capacity *= 2;
    if (capacity > UINT32_MAX) return false; // offsets are 32-bit
    char *bytes = realloc(table->bytes, capacity);
    if (bytes == NULL) return false;
    table->bytes = bytes;
    table->bytes_capacity = capacity;
  }
  return true;
}

uint32_t strtab_find(const strtab *table, const char *bytes, size_t len) {
  if (len == 0) return 0;
  if (len > STRTAB_MAX_LEN) len = STRTAB_MAX_LEN;
  strtab_key key = {bytes, len};
  uint32_t id = idindex_find(&table->index, idindex_hash_bytes(bytes, len), entry_equals, table, &key);
  return id == IDINDEX_NONE ? STRTAB_ERROR : id;
}

uint32_t strtab_intern(strtab *table, const char *bytes, size_t len) {
  if (len == 0) return 0;
  if (len > STRTAB_MAX_LEN) len = STRTAB_MAX_LEN;
  strtab_key key = {bytes, len};
  uint32_t hash = idindex_hash_bytes(bytes, len);
  uint32_t id = idindex_find(&table->index, hash, entry_equals, table, &key);
  if (id != IDINDEX_NONE) return id;

  if (!reserve(table, len)) return STRTAB_ERROR;
  id = table->count;
  if (!idindex_insert(&table->index, hash, id)) return STRTAB_ERROR;
  memcpy(table->bytes + table->bytes_len, bytes, len);
  table->entries[id] = (strtab_entry){(uint32_t)table->bytes_len, (uint32_t)len};
  table->bytes_len += len;
  table->count++;
  return id;
}

const char *strtab_get(const strtab *table, uint32_t id, size_t *len) {
  if (id >= table->count) id = 0;
  *len = table->entries[id].len;
  return table->bytes + table->entries[id].offset;
}

uint32_t strtab_count(const strtab *table) { return table->count; }

size_t strtab_memory(const strtab *table) {
  return sizeof(strtab) + table->bytes_capacity + sizeof(strtab_entry) * table->capacity + idindex_memory(&table->index);
}

strtab *strtab_clone(const strtab *table) {
  strtab *copy = calloc(1, sizeof(strtab));
  if (copy == NULL) return NULL;
  copy->bytes = malloc(table->bytes_len ? table->bytes_len : 1);
  copy->entries = malloc(sizeof(strtab_entry) * table->count);
  if (copy->bytes == NULL || copy->entries == NULL) {
    strtab_free(copy);
    return NULL;
  }
  memcpy(copy->bytes, table->bytes, table->bytes_len);
  memcpy(copy->entries, table->entries, sizeof(strtab_entry) * table->count);
  copy->bytes_len = copy->bytes_capacity = table->bytes_len;
  copy->count = copy->capacity = table->count;
  // The copy is read-only: no index (strtab_intern on it would find nothing and append duplicates).
  return copy;
}
