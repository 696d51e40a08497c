// Label sets: pairs of string ids in one array, each set a slice {offset, n} of it, found again by the
// hash of its (canonically ordered) pairs through an idindex.
#include "labels.h"

#include <stdlib.h>
#include <string.h>

#include "idindex.h"
#include "strtab.h"

typedef struct {
  uint32_t offset; // into pairs
  uint32_t n;
} set_entry;

struct labelsets {
  strtab *strings;
  label_pair *pairs;
  size_t pair_count, pair_capacity;
  set_entry *sets; // sets[id - 1]
  uint32_t set_count, set_capacity;
  idindex index;
  uint32_t max_sets;
  uint32_t other_id; // the string "(other)", interned at creation
  uint32_t overflow_sets; // sets made for overflow (at most LABELSETS_OVERFLOW_RESERVE)
  uint64_t overflowed, dropped;
};

typedef struct {
  const label_pair *pairs;
  uint32_t n;
} set_key;

static bool set_equals(const void *ctx, uint32_t id, const void *key_ptr) {
  const labelsets *t = ctx;
  const set_key *key = key_ptr;
  const set_entry *e = &t->sets[id - 1];
  return e->n == key->n && memcmp(t->pairs + e->offset, key->pairs, sizeof(label_pair) * key->n) == 0;
}

labelsets *labelsets_new(uint32_t max_sets) {
  labelsets *t = calloc(1, sizeof(labelsets));
  if (t == NULL) return NULL;
  t->strings = strtab_new();
  if (t->strings == NULL || !idindex_init(&t->index, 64)) {
    labelsets_free(t);
    return NULL;
  }
  t->other_id = strtab_intern(t->strings, LABELS_OTHER, strlen(LABELS_OTHER));
  if (t->other_id == STRTAB_ERROR) {
    labelsets_free(t);
    return NULL;
  }
  labelsets_set_max(t, max_sets);
  return t;
}

void labelsets_free(labelsets *t) {
  if (t == NULL) return;
  strtab_free(t->strings);
  free(t->pairs);
  free(t->sets);
  idindex_free(&t->index);
  free(t);
}

void labelsets_set_max(labelsets *t, uint32_t max_sets) { t->max_sets = max_sets ? max_sets : 1; }

// The id of the set pairs[0..n) (canonical), adding it while fewer than limit sets exist. IDINDEX_NONE
// when it is absent and cannot be added (limit reached, or memory short: *no_memory is then set).
static uint32_t find_or_add(labelsets *t, const label_pair *pairs, uint32_t n, uint32_t limit, bool *no_memory) {
  set_key key = {pairs, n};
  uint32_t hash = idindex_hash_bytes(pairs, sizeof(label_pair) * n);
  uint32_t id = idindex_find(&t->index, hash, set_equals, t, &key);
  if (id != IDINDEX_NONE || t->set_count >= limit) return id;
  if (t->set_count == t->set_capacity) {
    uint32_t grown = t->set_capacity ? t->set_capacity * 2 : 64;
    set_entry *sets = realloc(t->sets, sizeof(set_entry) * grown);
    if (sets == NULL) goto no_memory;
    t->sets = sets;
    t->set_capacity = grown;
  }
  if (t->pair_count + n > t->pair_capacity) {
    size_t grown = t->pair_capacity ? t->pair_capacity * 2 : 256;
    while (grown < t->pair_count + n) grown *= 2;
    label_pair *grown_pairs = realloc(t->pairs, sizeof(label_pair) * grown);
    if (grown_pairs == NULL) goto no_memory;
    t->pairs = grown_pairs;
    t->pair_capacity = grown;
  }
  id = t->set_count + 1;
  if (!idindex_insert(&t->index, hash, id)) goto no_memory;
  memcpy(t->pairs + t->pair_count, pairs, sizeof(label_pair) * n);
  t->sets[id - 1] = (set_entry){(uint32_t)t->pair_count, n};
  t->pair_count += n;
  t->set_count++;
  return id;
no_memory:
  *no_memory = true;
  return IDINDEX_NONE;
}

// Puts pairs[0..n) in canonical order: by key id (keys are distinct).
static void sort_pairs(label_pair *pairs, uint32_t n) {
  for (uint32_t i = 1; i < n; i++) {
    label_pair p = pairs[i];
    uint32_t j = i;
    for (; j > 0 && pairs[j - 1].key > p.key; j--) pairs[j] = pairs[j - 1];
    pairs[j] = p;
  }
}

// The canonical set of pairs[0..n) (n <= LABELS_MAX_PAIRS, distinct keys): found, added, or, past the
// cap, its overflow set.
static uint32_t intern_pairs(labelsets *t, label_pair *pairs, uint32_t n, bool strings_known) {
  if (n == 0) return LABELSET_NONE;
  sort_pairs(pairs, n);
  bool no_memory = false;
  uint32_t id = strings_known ? find_or_add(t, pairs, n, t->max_sets, &no_memory) : IDINDEX_NONE;
  if (id != IDINDEX_NONE) return id;
  if (!no_memory) {
    // The cap is reached: the same keys, every value "(other)".
    for (uint32_t i = 0; i < n; i++) pairs[i].value = t->other_id;
    uint32_t before = t->set_count;
    uint32_t limit = t->overflow_sets < LABELSETS_OVERFLOW_RESERVE ? UINT32_MAX : 0;
    id = find_or_add(t, pairs, n, limit, &no_memory);
    if (t->set_count != before) t->overflow_sets++;
    if (id != IDINDEX_NONE) {
      t->overflowed++;
      return id;
    }
  }
  t->dropped++;
  return LABELSET_NONE;
}

// The string id of bytes, interned while the table is below its cap; once full only an existing
// string is found (a set with a new string cannot be a known set). STRTAB_ERROR: not found (full) or
// memory short.
static uint32_t string_id(labelsets *t, const char *bytes, size_t len, bool full) {
  if (len > LABELS_MAX_LEN) len = LABELS_MAX_LEN;
  return full ? strtab_find(t->strings, bytes, len) : strtab_intern(t->strings, bytes, len);
}

uint32_t labelsets_intern(labelsets *t, const label_text *texts, uint32_t n) {
  label_pair pairs[LABELS_MAX_PAIRS];
  uint32_t count = 0;
  bool full = t->set_count >= t->max_sets, strings_known = true;
  for (uint32_t i = 0; i < n; i++) {
    if (texts[i].key_len == 0) continue;
    // Once full, a key never seen has no overflow set either (strings stay bounded): dropped.
    uint32_t key = string_id(t, texts[i].key, texts[i].key_len, full);
    uint32_t value = string_id(t, texts[i].value, texts[i].value_len, full);
    if (key == STRTAB_ERROR) {
      t->dropped++;
      return LABELSET_NONE;
    }
    if (value == STRTAB_ERROR) {
      if (!full) { // memory short
        t->dropped++;
        return LABELSET_NONE;
      }
      strings_known = false; // an unknown value: not a set we have, so overflow
      value = t->other_id;
    }
    uint32_t j = 0;
    while (j < count && pairs[j].key != key) j++;
    if (j < count) pairs[j].value = value;
    else if (count < LABELS_MAX_PAIRS) pairs[count++] = (label_pair){key, value};
  }
  return intern_pairs(t, pairs, count, strings_known);
}

uint32_t labelsets_with(labelsets *t, uint32_t set, const char *key, size_t key_len, const char *value, size_t value_len) {
  uint32_t n;
  const label_pair *have = labelsets_get(t, set, &n);
  label_pair pairs[LABELS_MAX_PAIRS];
  if (n != 0) memcpy(pairs, have, sizeof(label_pair) * n);
  bool full = t->set_count >= t->max_sets;
  uint32_t key_id = string_id(t, key, key_len, full);
  if (key_id == STRTAB_ERROR || key_id == 0) return set;
  for (uint32_t i = 0; i < n; i++) {
    if (pairs[i].key == key_id) return set;
  }
  if (n == LABELS_MAX_PAIRS) return set;
  uint32_t value_id = string_id(t, value, value_len, full);
  bool strings_known = value_id != STRTAB_ERROR;
  if (!strings_known && !full) return set; // memory short: the set without the extra pair
  pairs[n] = (label_pair){key_id, strings_known ? value_id : t->other_id};
  return intern_pairs(t, pairs, n + 1, strings_known);
}

const label_pair *labelsets_get(const labelsets *t, uint32_t set, uint32_t *n) {
  if (set == LABELSET_NONE || set > t->set_count) {
    *n = 0;
    return t->pairs; // never read: *n is 0
  }
  *n = t->sets[set - 1].n;
  return t->pairs + t->sets[set - 1].offset;
}

const char *labelsets_string(const labelsets *t, uint32_t id, size_t *len) { return strtab_get(t->strings, id, len); }

uint32_t labelsets_id_limit(const labelsets *t) { return t->set_count + 1; }

void labelsets_get_stats(const labelsets *t, labelsets_stats *stats) {
  stats->sets = t->set_count;
  stats->overflowed = t->overflowed;
  stats->dropped = t->dropped;
  stats->max_sets = t->max_sets;
  stats->memory_bytes = sizeof(labelsets) + strtab_memory(t->strings) + sizeof(label_pair) * t->pair_capacity +
                        sizeof(set_entry) * t->set_capacity + idindex_memory(&t->index);
}
