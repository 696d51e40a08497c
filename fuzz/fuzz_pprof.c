// fuzz_pprof: the encoder round trip. The input describes a snapshot (strings, locations, stacks,
// samples with any int64 values and labels, comments, header fields); it is encoded with pprof_encode,
// read back with the independent decoder in test/c/pprof_decode.h, validated (the rules pprof
// consumers enforce) and compared field by field with what went in. Every tenth input is also gzipped
// and gunzipped.
#include <math.h>
#include <stdio.h>
#include <zlib.h>

#include "../ext/heapscope/pprof.h"
#include "../test/c/pprof_decode.h"
#include "fuzz_input.h"

#define MAX_STRINGS 64
#define MAX_LOCATIONS 64
#define MAX_STACK 32
#define MAX_SAMPLES 64
#define MAX_COMMENT_LINES 16

static bool same_bytes(const pd_profile *p, int64_t index, const char *bytes, size_t len) {
  const pd_string *s = pd_str(p, index);
  return s != NULL && s->len == len && (len == 0 || memcmp(s->bytes, bytes, len) == 0);
}

static bool snapshot_string_is(const pd_profile *p, int64_t index, const strtab *strings, uint32_t id) {
  size_t len;
  const char *bytes = strtab_get(strings, id, &len);
  return same_bytes(p, index, bytes, len);
}

static void check_gzip(const pb_buffer *raw) {
  pb_buffer gz;
  pb_init(&gz);
  FZ_ASSERT(pprof_gzip(raw, &gz));
  uint8_t *plain = malloc(raw->len + 1);
  z_stream zs = {0};
  FZ_ASSERT(plain != NULL && inflateInit2(&zs, 15 + 16) == Z_OK);
  zs.next_in = gz.data;
  zs.avail_in = (uInt)gz.len;
  zs.next_out = plain;
  zs.avail_out = (uInt)raw->len + 1;
  FZ_ASSERT(inflate(&zs, Z_FINISH) == Z_STREAM_END);
  FZ_ASSERT(zs.total_out == raw->len && (raw->len == 0 || memcmp(plain, raw->data, raw->len) == 0));
  inflateEnd(&zs);
  free(plain);
  pb_free(&gz);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_input in = {data, size};
  hs_snapshot *s = snapshot_new();
  FZ_ASSERT(s != NULL);
  s->strings = strtab_new();
  FZ_ASSERT(s->strings != NULL);

  // Strings: any bytes (NULs, invalid UTF-8, duplicates, longer than STRTAB_MAX_LEN when repeated).
  uint32_t string_count = 1 + fz_below(&in, MAX_STRINGS);
  uint32_t string_ids[MAX_STRINGS];
  for (uint32_t i = 0; i < string_count; i++) {
    uint8_t bytes[64];
    size_t len = fz_bytes(&in, bytes, sizeof bytes);
    uint32_t repeat = 1 + fz_below(&in, 4) * 40; // 1, 41, 81 or 121 copies (up to ~7.7 KB)
    char *text = malloc(len * repeat + 1);
    for (uint32_t r = 0; r < repeat; r++) memcpy(text + r * len, bytes, len);
    string_ids[i] = strtab_intern(s->strings, text, len * repeat);
    free(text);
    FZ_ASSERT(string_ids[i] != STRTAB_ERROR);
  }
  uint32_t strings_total = strtab_count(s->strings);

  // Locations (deduplicated by the snapshot), any line including negative ones.
  uint32_t location_count = fz_below(&in, MAX_LOCATIONS + 1);
  for (uint32_t i = 0; i < location_count; i++) {
    hs_location l = {string_ids[fz_below(&in, string_count)], fz_below(&in, 2) ? string_ids[fz_below(&in, string_count)] : 0,
                     (int32_t)fz_bits(&in, 4)};
    uint32_t id = snapshot_location_id(s, l);
    FZ_ASSERT(id >= 1 && id <= s->location_count);
  }

  // Samples over stacks of those locations.
  uint32_t sample_count = fz_below(&in, MAX_SAMPLES + 1);
  for (uint32_t i = 0; i < sample_count && s->location_count > 0; i++) {
    uint32_t stack[MAX_STACK], n = fz_below(&in, MAX_STACK + 1);
    for (uint32_t k = 0; k < n; k++) stack[k] = 1 + fz_below(&in, s->location_count);
    uint32_t offset = snapshot_add_stack(s, stack, n);
    FZ_ASSERT(offset != UINT32_MAX);
    int64_t values[HS_VALUE_COUNT];
    for (int v = 0; v < HS_VALUE_COUNT; v++) values[v] = (int64_t)fz_bits(&in, fz_below(&in, 9));
    uint32_t class_id = fz_below(&in, 2) ? fz_below(&in, strings_total) : 0;
    int32_t gc_age = fz_below(&in, 2) ? (int32_t)fz_bits(&in, 4) : HS_NO_AGE;
    // Windowed samples carry totals by variance group (any float, huge and negative ones too).
    hs_group_totals groups;
    bool with_groups = fz_below(&in, 2);
    for (int t = 0; with_groups && t < 2; t++) {
      for (int g = 0; g < VARIANCE_GROUPS; g++) groups[t][g] = (float)((int64_t)fz_bits(&in, fz_below(&in, 9))) * (fz_below(&in, 2) ? 1e12f : 1.0f);
    }
    if (with_groups) s->has_groups = true;
    FZ_ASSERT(snapshot_add_sample(s, offset, n, class_id, gc_age, values, NULL, with_groups ? &groups : NULL,
                                  fz_below(&in, 2) ? HS_ALLOC_OBJECTS : HS_INUSE_OBJECTS));
  }

  // Header and comments (lines of any non-NUL bytes, empty lines included).
  s->allocs = fz_below(&in, 2);
  s->period = (int64_t)fz_bits(&in, fz_below(&in, 9));
  s->time_nanos = (int64_t)fz_bits(&in, 8);
  s->duration_nanos = (int64_t)fz_bits(&in, 8);
  uint32_t comment_lines = fz_below(&in, MAX_COMMENT_LINES + 1);
  if (comment_lines > 0) {
    s->comments = calloc(comment_lines, 65);
    char *w = s->comments;
    for (uint32_t i = 0; i < comment_lines; i++) {
      uint8_t line[64];
      size_t len = fz_bytes(&in, line, sizeof line);
      for (size_t k = 0; k < len; k++) *w++ = (char)(line[k] == 0 || line[k] == '\n' ? 'x' : line[k]);
      if (i + 1 < comment_lines) *w++ = '\n';
    }
  }

  pb_buffer raw;
  pb_init(&raw);
  FZ_ASSERT(pprof_encode(s, &raw));
  pd_profile *p = pd_decode(raw.data, raw.len);
  if (p == NULL) fprintf(stderr, "decode failed: %s\n", pd_error);
  FZ_ASSERT(p != NULL);
  if (!pd_validate(p)) fprintf(stderr, "invalid profile: %s\n", pd_error);
  FZ_ASSERT(pd_validate(p));

  // Header.
  FZ_ASSERT(p->sample_type_count == HS_VALUE_COUNT);
  FZ_ASSERT(p->period == s->period && p->time_nanos == s->time_nanos && p->duration_nanos == s->duration_nanos);
  FZ_ASSERT(s->allocs ? same_bytes(p, p->default_sample_type, "alloc_space", 11) : p->default_sample_type == 0);
  // Comments: the non-empty lines, in order.
  size_t comment = 0;
  for (const char *line = s->comments; line != NULL && *line != '\0';) {
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    if (len > 0) {
      FZ_ASSERT(comment < p->comment_count);
      FZ_ASSERT(same_bytes(p, p->comments[comment], line, len > STRTAB_MAX_LEN ? STRTAB_MAX_LEN : len));
      comment++;
    }
    line = end ? end + 1 : line + len;
  }
  FZ_ASSERT(comment == p->comment_count);
  // Locations: same order, same names, files and lines; functions deduplicated by (name, file).
  FZ_ASSERT(p->location_count == s->location_count);
  for (uint32_t i = 0; i < s->location_count; i++) {
    const hs_location *want = &s->locations[i];
    const pd_location *got = &p->locations[i];
    const pd_function *f = &p->functions[got->function_id - 1];
    FZ_ASSERT(got->line == want->line);
    FZ_ASSERT(snapshot_string_is(p, f->name, s->strings, want->function_id));
    FZ_ASSERT(snapshot_string_is(p, f->filename, s->strings, want->file_id));
  }
  for (size_t a = 0; a < p->function_count; a++) {
    for (size_t b = a + 1; b < p->function_count; b++) {
      FZ_ASSERT(p->functions[a].name != p->functions[b].name || p->functions[a].filename != p->functions[b].filename);
    }
  }
  // Samples: same order, stacks, values and labels.
  FZ_ASSERT(p->sample_count == s->sample_count);
  for (size_t i = 0; i < s->sample_count; i++) {
    const hs_sample *want = &s->samples[i];
    const pd_sample *got = &p->samples[i];
    FZ_ASSERT(got->location_count == want->locations_len);
    for (uint32_t k = 0; k < want->locations_len; k++) FZ_ASSERT(got->location_ids[k] == s->location_ids[want->locations_offset + k]);
    for (int v = 0; v < HS_VALUE_COUNT; v++) FZ_ASSERT(got->values[v] == want->values[v]);
    size_t label = 0;
    if (want->class_id != 0) {
      FZ_ASSERT(label < got->label_count && same_bytes(p, got->labels[label].key, "class", 5));
      FZ_ASSERT(snapshot_string_is(p, got->labels[label].str, s->strings, want->class_id));
      label++;
    }
    if (want->gc_age != HS_NO_AGE) {
      FZ_ASSERT(label < got->label_count && same_bytes(p, got->labels[label].key, "gc_age", 6));
      FZ_ASSERT(got->labels[label].num == want->gc_age && same_bytes(p, got->labels[label].num_unit, "gcs", 3));
      label++;
    }
    // Then the nonzero group totals, as whole numbers (saturated), named <type>_vg<group>.
    static const char *const types[HS_VALUE_COUNT] = {"alloc_objects", "alloc_space", "inuse_objects", "inuse_space"};
    for (int t = 0; want->groups != 0 && t < 2; t++) {
      for (int g = 0; g < VARIANCE_GROUPS; g++) {
        float v = s->group_totals[want->groups - 1][t][g];
        int64_t num = v >= 9.2e18f ? INT64_MAX : v <= -9.2e18f ? INT64_MIN : llroundf(v);
        if (num == 0) continue;
        char name[40];
        int len = snprintf(name, sizeof name, "%s_vg%d", types[want->group_types + t], g);
        FZ_ASSERT(label < got->label_count && same_bytes(p, got->labels[label].key, name, (size_t)len));
        FZ_ASSERT(got->labels[label].num == num);
        label++;
      }
    }
    FZ_ASSERT(label == got->label_count);
  }
  // Every string in the table is distinct (the table is interned).
  for (size_t a = 1; a < p->string_count && p->string_count < 200; a++) {
    for (size_t b = a + 1; b < p->string_count; b++) {
      FZ_ASSERT(!(p->strings[a].len == p->strings[b].len && memcmp(p->strings[a].bytes, p->strings[b].bytes, p->strings[a].len) == 0));
    }
  }
  if (size % 10 == 0) check_gzip(&raw);

  pd_free(p);
  pb_free(&raw);
  snapshot_free(s);
  return 0;
}
