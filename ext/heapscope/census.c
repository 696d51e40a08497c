// census: exact live totals per type and per class, from one walk of the heap (census.h).
#include "census.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "names.h"
#include "population.h"

// Ruby's heap walk and object measure: exported by every Ruby heapscope supports (extconf.rb probes
// them), declared in no public header.
void rb_objspace_each_objects(int (*callback)(void *start, void *end, size_t stride, void *data), void *data);
size_t rb_obj_memsize_of(VALUE obj);

// The walk's table: open addressing keyed by the class VALUE (stable: no GC runs inside the walk).
typedef struct {
  VALUE klass; // 0: empty
  census_class entry;
} klass_slot;

typedef struct {
  census *c;
  strtab *strings;
  uint32_t fixed_size;
  census_whole_fn whole;
  klass_slot *slots;
  size_t capacity, used; // capacity: a power of two
  bool failed;
} walk;

static size_t slot_of(VALUE klass, size_t capacity) {
  uint64_t h = (uint64_t)klass * 0x9e3779b97f4a7c15ull;
  return (size_t)(h >> 20) & (capacity - 1);
}

static bool grow(walk *w) {
  size_t capacity = w->capacity ? w->capacity * 2 : 1024;
  klass_slot *slots = calloc(capacity, sizeof *slots);
  if (slots == NULL) return false;
  for (size_t i = 0; i < w->capacity; i++) {
    if (w->slots[i].klass == 0) continue;
    size_t j = slot_of(w->slots[i].klass, capacity);
    while (slots[j].klass != 0) j = (j + 1) & (capacity - 1);
    slots[j] = w->slots[i];
  }
  free(w->slots);
  w->slots = slots;
  w->capacity = capacity;
  return true;
}

// The entry of obj's class, added (and its name interned) on first sight; NULL when memory is short.
static census_class *entry_of(walk *w, VALUE obj, VALUE klass) {
  if (w->used * 2 >= w->capacity && !grow(w)) return NULL;
  size_t i = slot_of(klass, w->capacity);
  while (w->slots[i].klass != 0) {
    if (w->slots[i].klass == klass) return &w->slots[i].entry;
    i = (i + 1) & (w->capacity - 1);
  }
  // The sampler names an object's class with the same function at allocation, so ids match labels.
  uint32_t class_id = names_class_id(w->strings, obj);
  if (class_id == STRTAB_ERROR) return NULL;
  w->slots[i].klass = klass;
  w->slots[i].entry = (census_class){.class_id = class_id, .type = (uint8_t)RB_BUILTIN_TYPE(obj),
                                     .whole = w->whole != NULL && w->whole(obj)};
  w->used++;
  return &w->slots[i].entry;
}

static int count_page(void *start, void *end, size_t stride, void *data) {
  walk *w = data;
  if (w->failed) return 1;
  for (VALUE v = (VALUE)start; v < (VALUE)end; v += stride) {
    // A free slot has no flags; the rest are filtered as the sampler filters allocations.
    if (RBASIC(v)->flags == 0 || population_is_internal(v)) continue;
    uint64_t bytes = w->fixed_size ? w->fixed_size : rb_obj_memsize_of(v);
    census_class *entry = entry_of(w, v, RBASIC_CLASS(v));
    if (entry == NULL) {
      w->failed = true;
      return 1;
    }
    double square = (double)bytes * (double)bytes;
    entry->total.objects++;
    entry->total.bytes += bytes;
    entry->total.sq_bytes += square;
    w->c->types[RB_BUILTIN_TYPE(v)].objects++;
    w->c->types[RB_BUILTIN_TYPE(v)].bytes += bytes;
    w->c->types[RB_BUILTIN_TYPE(v)].sq_bytes += square;
    w->c->all.objects++;
    w->c->all.bytes += bytes;
    w->c->all.sq_bytes += square;
  }
  return 0;
}

static int by_class_id(const void *a, const void *b) {
  uint32_t x = ((const census_class *)a)->class_id, y = ((const census_class *)b)->class_id;
  return (x > y) - (x < y);
}

bool census_take(census *c, strtab *strings, uint32_t fixed_size, census_whole_fn whole) {
  memset(c, 0, sizeof *c);
  uint64_t started = clock_monotonic_nanos();
  walk w = {.c = c, .strings = strings, .fixed_size = fixed_size, .whole = whole};
  // The walk first finishes a GC in progress (lazy sweeping too), so dead objects are not counted.
  rb_objspace_each_objects(count_page, &w);
  if (w.failed) {
    free(w.slots);
    memset(c, 0, sizeof *c);
    return false;
  }
  // One entry per class name: anonymous classes named after one ancestor are merged.
  c->classes = malloc((w.used ? w.used : 1) * sizeof *c->classes);
  if (c->classes == NULL) {
    free(w.slots);
    memset(c, 0, sizeof *c);
    return false;
  }
  for (size_t i = 0; i < w.capacity; i++) {
    if (w.slots[i].klass != 0) c->classes[c->class_count++] = w.slots[i].entry;
  }
  free(w.slots);
  qsort(c->classes, c->class_count, sizeof *c->classes, by_class_id);
  size_t merged = 0;
  for (size_t i = 0; i < c->class_count; i++) {
    if (merged > 0 && c->classes[merged - 1].class_id == c->classes[i].class_id) {
      c->classes[merged - 1].total.objects += c->classes[i].total.objects;
      c->classes[merged - 1].total.bytes += c->classes[i].total.bytes;
      c->classes[merged - 1].total.sq_bytes += c->classes[i].total.sq_bytes;
      // Whole only if every class of the name is (named after one ancestor, they all are or none is).
      c->classes[merged - 1].whole = c->classes[merged - 1].whole && c->classes[i].whole;
    } else {
      c->classes[merged++] = c->classes[i];
    }
  }
  c->class_count = merged;
  c->nanos = clock_monotonic_nanos() - started;
  return true;
}

void census_free(census *c) {
  free(c->classes);
  c->classes = NULL;
  c->class_count = 0;
}

static const census_class *find_class(const census *c, uint32_t class_id) {
  size_t lo = 0, hi = c->class_count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (c->classes[mid].class_id < class_id) lo = mid + 1;
    else hi = mid;
  }
  return lo < c->class_count && c->classes[lo].class_id == class_id ? &c->classes[lo] : NULL;
}

const census_total *census_class_total(const census *c, uint32_t class_id) {
  const census_class *entry = find_class(c, class_id);
  return entry ? &entry->total : NULL;
}

// Sets value to limit when it is over CENSUS_PHANTOM_FACTOR times limit, scaling the variance
// groups' parts of that value to match, so readers summing parts get the new value. True when it did.
static bool cap_value(hs_snapshot *s, hs_sample *sample, int value, int64_t limit) {
  if ((double)sample->values[value] <= CENSUS_PHANTOM_FACTOR * (double)limit) return false;
  double factor = sample->values[value] > 0 ? (double)limit / (double)sample->values[value] : 0.0;
  sample->values[value] = limit;
  if (sample->variances[value] > 0) sample->variances[value] = (int64_t)((double)sample->variances[value] * factor * factor);
  if (sample->groups != 0 && value >= sample->group_types && value <= sample->group_types + 1) {
    float *parts = s->group_totals[sample->groups - 1][value - sample->group_types];
    for (int g = 0; g < VARIANCE_GROUPS; g++) parts[g] = (float)(parts[g] * factor);
  }
  return true;
}

void census_bound_samples(census *c, hs_snapshot *snapshot) {
  for (size_t i = 0; i < snapshot->sample_count; i++) {
    hs_sample *sample = &snapshot->samples[i];
    if (sample->values[HS_INUSE_OBJECTS] == 0 && sample->values[HS_INUSE_SPACE] == 0) continue;
    const census_total *total = sample->class_id ? census_class_total(c, sample->class_id) : NULL;
    // A sampled live object whose class the census did not see at all (it died between the snapshot's
    // records and the walk: cannot happen with the GVL held) keeps its estimate.
    if (total == NULL) continue;
    bool capped = cap_value(snapshot, sample, HS_INUSE_OBJECTS, (int64_t)total->objects);
    capped |= cap_value(snapshot, sample, HS_INUSE_SPACE, (int64_t)total->bytes);
    if (capped) c->bounded_samples++;
  }
}

static const char *type_name(int type) {
  switch (type) {
    case RUBY_T_OBJECT: return "T_OBJECT";
    case RUBY_T_CLASS: return "T_CLASS";
    case RUBY_T_MODULE: return "T_MODULE";
    case RUBY_T_FLOAT: return "T_FLOAT";
    case RUBY_T_STRING: return "T_STRING";
    case RUBY_T_REGEXP: return "T_REGEXP";
    case RUBY_T_ARRAY: return "T_ARRAY";
    case RUBY_T_HASH: return "T_HASH";
    case RUBY_T_STRUCT: return "T_STRUCT";
    case RUBY_T_BIGNUM: return "T_BIGNUM";
    case RUBY_T_FILE: return "T_FILE";
    case RUBY_T_DATA: return "T_DATA";
    case RUBY_T_MATCH: return "T_MATCH";
    case RUBY_T_COMPLEX: return "T_COMPLEX";
    case RUBY_T_RATIONAL: return "T_RATIONAL";
    case RUBY_T_SYMBOL: return "T_SYMBOL";
    default: return NULL;
  }
}

// A growing text buffer; on a failed malloc it is dropped and stays NULL.
typedef struct {
  char *text;
  size_t len, capacity;
} text_buf;

static void append(text_buf *b, const char *format, ...) __attribute__((format(printf, 2, 3)));
static void append(text_buf *b, const char *format, ...) {
  if (b->text == NULL && b->capacity != 0) return; // failed earlier
  for (;;) {
    va_list args;
    va_start(args, format);
    int n = vsnprintf(b->text ? b->text + b->len : NULL, b->text ? b->capacity - b->len : 0, format, args);
    va_end(args);
    if (n < 0) return;
    if (b->text != NULL && b->len + (size_t)n < b->capacity) {
      b->len += (size_t)n;
      return;
    }
    size_t capacity = (b->capacity ? b->capacity * 2 : 4096) + (size_t)n;
    char *grown = realloc(b->text, capacity);
    if (grown == NULL) {
      free(b->text);
      b->text = NULL;
      b->capacity = 1;
      return;
    }
    b->text = grown;
    b->capacity = capacity;
  }
}

// A class name made safe for one comment line: control bytes (a newline would split the line) become '?'.
static void append_name(text_buf *b, const strtab *strings, uint32_t class_id) {
  size_t len = 0;
  const char *name = strtab_get(strings, class_id, &len);
  // As long as a class label may be (strtab cuts there too), so a long name still matches its samples'.
  char safe[STRTAB_MAX_LEN + 1];
  if (len >= sizeof safe) len = sizeof safe - 1;
  for (size_t i = 0; i < len; i++) safe[i] = (unsigned char)name[i] < 0x20 || name[i] == 0x7f ? '?' : name[i];
  safe[len] = '\0';
  append(b, "%s\n", safe);
}

static int by_bytes_descending(const void *a, const void *b) {
  uint64_t x = (*(const census_class *const *)a)->total.bytes, y = (*(const census_class *const *)b)->total.bytes;
  return (x < y) - (x > y);
}

char *census_comments(const census *c, const hs_snapshot *snapshot, const strtab *strings, size_t max_others) {
  // Which classes have a sample in this profile: those are listed, then the biggest others.
  bool *sampled = calloc(c->class_count ? c->class_count : 1, sizeof *sampled);
  const census_class **others = malloc((c->class_count ? c->class_count : 1) * sizeof *others);
  if (sampled == NULL || others == NULL) {
    free(sampled);
    free((void *)others);
    return NULL;
  }
  for (size_t i = 0; i < snapshot->sample_count; i++) {
    const census_class *entry = find_class(c, snapshot->samples[i].class_id);
    if (entry != NULL) sampled[entry - c->classes] = true;
  }
  size_t listed = 0, other_count = 0;
  for (size_t i = 0; i < c->class_count; i++) {
    if (sampled[i]) listed++;
    else others[other_count++] = &c->classes[i];
  }
  qsort((void *)others, other_count, sizeof *others, by_bytes_descending);
  if (other_count > max_others) other_count = max_others;
  listed += other_count;

  text_buf b = {0};
  append(&b, "heapscope census: seconds=%.6f objects=%llu bytes=%llu classes=%zu classes_listed=%zu bounded_samples=%u sq_bytes=%.6e\n",
         (double)c->nanos / 1e9, (unsigned long long)c->all.objects, (unsigned long long)c->all.bytes, c->class_count, listed,
         c->bounded_samples, c->all.sq_bytes);
  for (int t = 0; t <= RUBY_T_MASK; t++) {
    const char *name = type_name(t);
    if (name == NULL || c->types[t].objects == 0) continue;
    append(&b, "heapscope census type: objects=%llu bytes=%llu sq_bytes=%.6e name=%s\n", (unsigned long long)c->types[t].objects,
           (unsigned long long)c->types[t].bytes, c->types[t].sq_bytes, name);
  }
  for (size_t i = 0; i < c->class_count + other_count; i++) {
    const census_class *entry = i < c->class_count ? (sampled[i] ? &c->classes[i] : NULL) : others[i - c->class_count];
    if (entry == NULL) continue;
    const char *type = type_name(entry->type);
    append(&b, "heapscope census class: objects=%llu bytes=%llu sq_bytes=%.6e type=%s name=", (unsigned long long)entry->total.objects,
           (unsigned long long)entry->total.bytes, entry->total.sq_bytes, type ? type : "T_OTHER");
    append_name(&b, strings, entry->class_id);
    if (entry->whole) {
      append(&b, "heapscope exact class: name=");
      append_name(&b, strings, entry->class_id);
    }
  }
  free(sampled);
  free((void *)others);
  return b.text;
}
