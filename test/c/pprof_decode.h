// pprof_decode.h: a small, independent profile.proto reader for the C tests and fuzz targets.
//
// It shares no code with ext/heapscope (not even the wire helpers), so an encoder bug cannot hide in
// a decoder that makes the same mistake. Every read is bounds-checked: it must survive whatever the
// fuzzer makes the encoder write. It reads only the fields heapscope writes; others are skipped.
// pd_decode returns NULL on malformed input (the reason in pd_error).
#ifndef HEAPSCOPE_TEST_PPROF_DECODE_H
#define HEAPSCOPE_TEST_PPROF_DECODE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const uint8_t *p, *end;
} pd_reader;

typedef struct {
  int64_t key, str, num, num_unit;
} pd_label;

typedef struct {
  uint64_t *location_ids;
  size_t location_count;
  int64_t values[8];
  size_t value_count;
  pd_label labels[48]; // class, gc_age, 4 variances, 2 x 16 variance groups, and room
  size_t label_count;
} pd_sample;

typedef struct {
  uint64_t id, function_id;
  int64_t line;
  size_t line_count; // Line messages seen (heapscope writes exactly one)
} pd_location;

typedef struct {
  uint64_t id;
  int64_t name, filename;
} pd_function;

typedef struct {
  const uint8_t *bytes;
  size_t len;
} pd_string; // points into the decoded buffer

typedef struct {
  int64_t sample_types[8][2];
  size_t sample_type_count;
  pd_sample *samples;
  size_t sample_count;
  pd_location *locations;
  size_t location_count;
  pd_function *functions;
  size_t function_count;
  pd_string *strings;
  size_t string_count;
  int64_t comments[64];
  size_t comment_count;
  int64_t period_type[2], period, time_nanos, duration_nanos, default_sample_type;
} pd_profile;

static const char *pd_error;

static inline bool pd_varint(pd_reader *r, uint64_t *out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (r->p >= r->end) return false;
    uint8_t byte = *r->p++;
    if (shift == 63 && byte > 1) return false; // more than 64 bits
    v |= (uint64_t)(byte & 0x7f) << shift;
    if (!(byte & 0x80)) {
      *out = v;
      return true;
    }
  }
  return false;
}

// Reads one field's key; for length-delimited fields sets *sub to its body; for varints *value.
static inline bool pd_field(pd_reader *r, uint32_t *tag, int *wire, uint64_t *value, pd_reader *sub) {
  uint64_t key;
  if (!pd_varint(r, &key)) return false;
  *tag = (uint32_t)(key >> 3);
  *wire = (int)(key & 7);
  switch (*wire) {
    case 0: return pd_varint(r, value);
    case 2: {
      uint64_t len;
      if (!pd_varint(r, &len) || len > (uint64_t)(r->end - r->p)) return false;
      sub->p = r->p;
      sub->end = r->p + len;
      r->p += len;
      return true;
    }
    case 1: if (r->end - r->p < 8) return false; r->p += 8; return true;
    case 5: if (r->end - r->p < 4) return false; r->p += 4; return true;
    default: return false;
  }
}

static inline bool pd_grow(void **array, size_t count, size_t elem) {
  // Capacity is 4, then the next power of two: grow only when count reaches it.
  if (count != 0 && (count < 4 || (count & (count - 1)) != 0)) return true;
  size_t capacity = count ? count * 2 : 4;
  void *grown = realloc(*array, capacity * elem);
  if (grown == NULL) return false;
  *array = grown;
  return true;
}

#define PD_FAIL(msg) do { pd_error = (msg); return false; } while (0)

// A repeated uint64 written either packed (wire 2) or one by one (wire 0).
static inline bool pd_repeated(int wire, uint64_t value, pd_reader *sub, uint64_t **out, size_t *count) {
  if (wire == 0) {
    if (!pd_grow((void **)out, *count, sizeof(uint64_t))) PD_FAIL("out of memory");
    (*out)[(*count)++] = value;
    return true;
  }
  if (wire != 2) PD_FAIL("bad wire type for a repeated number");
  while (sub->p < sub->end) {
    uint64_t v;
    if (!pd_varint(sub, &v)) PD_FAIL("bad packed varint");
    if (!pd_grow((void **)out, *count, sizeof(uint64_t))) PD_FAIL("out of memory");
    (*out)[(*count)++] = v;
  }
  return true;
}

static inline bool pd_value_type(pd_reader r, int64_t out[2]) {
  out[0] = out[1] = 0;
  while (r.p < r.end) {
    uint32_t tag; int wire; uint64_t v = 0; pd_reader sub;
    if (!pd_field(&r, &tag, &wire, &v, &sub)) PD_FAIL("bad ValueType");
    if (wire == 0 && (tag == 1 || tag == 2)) out[tag - 1] = (int64_t)v;
  }
  return true;
}

static inline bool pd_sample_msg(pd_reader r, pd_sample *s) {
  memset(s, 0, sizeof *s);
  while (r.p < r.end) {
    uint32_t tag; int wire; uint64_t v = 0; pd_reader sub = {0};
    if (!pd_field(&r, &tag, &wire, &v, &sub)) PD_FAIL("bad Sample field");
    if (tag == 1) {
      if (!pd_repeated(wire, v, &sub, &s->location_ids, &s->location_count)) return false;
    } else if (tag == 2) {
      uint64_t *values = NULL;
      size_t n = 0;
      if (!pd_repeated(wire, v, &sub, &values, &n)) { free(values); return false; }
      for (size_t i = 0; i < n; i++) {
        if (s->value_count == 8) { free(values); PD_FAIL("too many values"); }
        s->values[s->value_count++] = (int64_t)values[i];
      }
      free(values);
    } else if (tag == 3 && wire == 2) {
      if (s->label_count == sizeof s->labels / sizeof s->labels[0]) PD_FAIL("too many labels");
      pd_label *l = &s->labels[s->label_count++];
      memset(l, 0, sizeof *l);
      while (sub.p < sub.end) {
        uint32_t t; int w; uint64_t lv = 0; pd_reader ls;
        if (!pd_field(&sub, &t, &w, &lv, &ls)) PD_FAIL("bad Label");
        if (w != 0) continue;
        if (t == 1) l->key = (int64_t)lv;
        if (t == 2) l->str = (int64_t)lv;
        if (t == 3) l->num = (int64_t)lv;
        if (t == 4) l->num_unit = (int64_t)lv;
      }
    }
  }
  return true;
}

static inline bool pd_location_msg(pd_reader r, pd_location *l) {
  memset(l, 0, sizeof *l);
  while (r.p < r.end) {
    uint32_t tag; int wire; uint64_t v = 0; pd_reader sub;
    if (!pd_field(&r, &tag, &wire, &v, &sub)) PD_FAIL("bad Location");
    if (tag == 1 && wire == 0) l->id = v;
    if (tag == 4 && wire == 2) {
      l->line_count++;
      while (sub.p < sub.end) {
        uint32_t t; int w; uint64_t lv = 0; pd_reader ls;
        if (!pd_field(&sub, &t, &w, &lv, &ls)) PD_FAIL("bad Line");
        if (t == 1 && w == 0) l->function_id = lv;
        if (t == 2 && w == 0) l->line = (int64_t)lv;
      }
    }
  }
  return true;
}

static inline bool pd_function_msg(pd_reader r, pd_function *f) {
  memset(f, 0, sizeof *f);
  while (r.p < r.end) {
    uint32_t tag; int wire; uint64_t v = 0; pd_reader sub;
    if (!pd_field(&r, &tag, &wire, &v, &sub)) PD_FAIL("bad Function");
    if (wire != 0) continue;
    if (tag == 1) f->id = v;
    if (tag == 2) f->name = (int64_t)v;
    if (tag == 4) f->filename = (int64_t)v;
  }
  return true;
}

static inline void pd_free(pd_profile *p) {
  if (p == NULL) return;
  for (size_t i = 0; i < p->sample_count; i++) free(p->samples[i].location_ids);
  free(p->samples);
  free(p->locations);
  free(p->functions);
  free(p->strings);
  free(p);
}

static inline bool pd_decode_into(pd_profile *p, const uint8_t *data, size_t len) {
  pd_reader r = {data, data + len};
  while (r.p < r.end) {
    uint32_t tag; int wire; uint64_t v = 0; pd_reader sub = {0};
    if (!pd_field(&r, &tag, &wire, &v, &sub)) PD_FAIL("bad Profile field");
    switch (tag) {
      case 1:
        if (wire != 2 || p->sample_type_count == 8) PD_FAIL("bad sample_type");
        if (!pd_value_type(sub, p->sample_types[p->sample_type_count++])) return false;
        break;
      case 2:
        if (wire != 2 || !pd_grow((void **)&p->samples, p->sample_count, sizeof(pd_sample))) PD_FAIL("bad sample");
        if (!pd_sample_msg(sub, &p->samples[p->sample_count++])) return false;
        break;
      case 4:
        if (wire != 2 || !pd_grow((void **)&p->locations, p->location_count, sizeof(pd_location))) PD_FAIL("bad location");
        if (!pd_location_msg(sub, &p->locations[p->location_count++])) return false;
        break;
      case 5:
        if (wire != 2 || !pd_grow((void **)&p->functions, p->function_count, sizeof(pd_function))) PD_FAIL("bad function");
        if (!pd_function_msg(sub, &p->functions[p->function_count++])) return false;
        break;
      case 6:
        if (wire != 2 || !pd_grow((void **)&p->strings, p->string_count, sizeof(pd_string))) PD_FAIL("bad string");
        p->strings[p->string_count++] = (pd_string){sub.p, (size_t)(sub.end - sub.p)};
        break;
      case 9: p->time_nanos = (int64_t)v; break;
      case 10: p->duration_nanos = (int64_t)v; break;
      case 11: if (wire != 2 || !pd_value_type(sub, p->period_type)) PD_FAIL("bad period_type"); break;
      case 12: p->period = (int64_t)v; break;
      case 13:
        if (wire != 0 || p->comment_count == 64) PD_FAIL("bad comment");
        p->comments[p->comment_count++] = (int64_t)v;
        break;
      case 14: p->default_sample_type = (int64_t)v; break;
      default: break;
    }
  }
  return true;
}

// Decodes data[0..len), or returns NULL (reason in pd_error).
static pd_profile *pd_decode(const uint8_t *data, size_t len) {
  pd_profile *p = calloc(1, sizeof(pd_profile));
  if (p == NULL) return NULL;
  if (!pd_decode_into(p, data, len)) {
    pd_free(p);
    return NULL;
  }
  return p;
}

// The string at index i, or NULL when out of range.
static const pd_string *pd_str(const pd_profile *p, int64_t i) {
  return i >= 0 && (uint64_t)i < p->string_count ? &p->strings[i] : NULL;
}

static inline bool pd_str_is(const pd_profile *p, int64_t i, const char *s) {
  const pd_string *str = pd_str(p, i);
  return str != NULL && str->len == strlen(s) && memcmp(str->bytes, s, str->len) == 0;
}

// Checks the rules heapscope promises (and Parca's validator enforces): string_table[0] == "", every
// string index in range, location and function ids 1..N in order, every location's function exists,
// every sample has one value per sample type and refers to existing locations.
static inline bool pd_validate(const pd_profile *p) {
  if (p->string_count == 0 || p->strings[0].len != 0) PD_FAIL("string_table[0] is not \"\"");
  for (size_t i = 0; i < p->sample_type_count; i++) {
    if (!pd_str(p, p->sample_types[i][0]) || !pd_str(p, p->sample_types[i][1])) PD_FAIL("sample_type string out of range");
  }
  for (size_t i = 0; i < p->location_count; i++) {
    if (p->locations[i].id != i + 1) PD_FAIL("location ids are not 1..N");
    if (p->locations[i].line_count != 1) PD_FAIL("location without exactly one line");
    if (p->locations[i].function_id == 0 || p->locations[i].function_id > p->function_count) PD_FAIL("line names a missing function");
  }
  for (size_t i = 0; i < p->function_count; i++) {
    if (p->functions[i].id != i + 1) PD_FAIL("function ids are not 1..N");
    if (!pd_str(p, p->functions[i].name) || !pd_str(p, p->functions[i].filename)) PD_FAIL("function string out of range");
  }
  for (size_t i = 0; i < p->sample_count; i++) {
    const pd_sample *s = &p->samples[i];
    if (s->value_count != p->sample_type_count) PD_FAIL("sample value count != sample type count");
    for (size_t l = 0; l < s->location_count; l++) {
      if (s->location_ids[l] == 0 || s->location_ids[l] > p->location_count) PD_FAIL("sample names a missing location");
    }
    for (size_t l = 0; l < s->label_count; l++) {
      if (!pd_str(p, s->labels[l].key) || !pd_str(p, s->labels[l].str) || !pd_str(p, s->labels[l].num_unit)) {
        PD_FAIL("label string out of range");
      }
    }
  }
  for (size_t i = 0; i < p->comment_count; i++) {
    if (!pd_str(p, p->comments[i])) PD_FAIL("comment out of range");
  }
  if (!pd_str(p, p->default_sample_type) || !pd_str(p, p->period_type[0]) || !pd_str(p, p->period_type[1])) {
    PD_FAIL("header string out of range");
  }
  return true;
}

#endif
