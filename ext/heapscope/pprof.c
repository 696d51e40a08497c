// The profile.proto schema, as heapscope uses it:
//   Profile.sample_type: alloc_objects/count, alloc_space/bytes, inuse_objects/count, inuse_space/bytes
//   Profile.sample: location ids leaf first; values already scaled by the sampling weight (pprof
//     consumers do no unsampling of their own); labels "class" (str) and "gc_age" (num, GCs survived,
//     bucket lower bound), "<type>_var" (num, per value type that is not exact: the estimate of that
//     sample's sampling variance, objects^2 or bytes^2) and, windowed, "<type>_vg<g>" (num: the part
//     of the value from windows of variance group g, g = 0..15, omitted when 0; variance.h says how a
//     sum of samples gets its variance from its summed groups), and the application's labels (str: the
//     keys and values of Heapscope.with_labels, e.g. endpoint, job, thread; labels.h; the Ruby side
//     keeps their keys apart from ours)
//   one Location per distinct (function, file, line) (one Line each), one Function per distinct
//   (name, file)
//   string_table[0] == ""; location and function ids are 1..N in first-use order, so the output is
//   deterministic for a given snapshot.
#include "pprof.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "idindex.h"

// Field numbers, each with its wire type.
enum {
  tagProfile_SampleType = 1,        // repeated ValueType
  tagProfile_Sample = 2,            // repeated Sample
  tagProfile_Location = 4,          // repeated Location
  tagProfile_Function = 5,          // repeated Function
  tagProfile_StringTable = 6,       // repeated string
  tagProfile_TimeNanos = 9,         // int64
  tagProfile_DurationNanos = 10,    // int64
  tagProfile_PeriodType = 11,       // ValueType
  tagProfile_Period = 12,           // int64
  tagProfile_Comment = 13,          // repeated int64 (string index)
  tagProfile_DefaultSampleType = 14, // int64 (string index)

  tagValueType_Type = 1, // int64 (string index)
  tagValueType_Unit = 2, // int64 (string index)

  tagSample_Location = 1, // repeated uint64, packed
  tagSample_Value = 2,    // repeated int64, packed
  tagSample_Label = 3,    // repeated Label

  tagLabel_Key = 1, // int64 (string index)
  tagLabel_Str = 2, // int64 (string index)
  tagLabel_Num = 3, // int64
  tagLabel_NumUnit = 4, // int64 (string index)

  tagLocation_ID = 1,   // uint64
  tagLocation_Line = 4, // repeated Line

  tagLine_FunctionID = 1, // uint64
  tagLine_Line = 2,       // int64

  tagFunction_ID = 1,         // uint64
  tagFunction_Name = 2,       // int64 (string index)
  tagFunction_Filename = 4,   // int64 (string index)
};

static const char *const variance_label_names[HS_VALUE_COUNT] = {
  "alloc_objects_var", "alloc_space_var", "inuse_objects_var", "inuse_space_var",
};
static const char *const sample_type_names[HS_VALUE_COUNT][2] = {
  {"alloc_objects", "count"},
  {"alloc_space", "bytes"},
  {"inuse_objects", "count"},
  {"inuse_space", "bytes"},
};

// The tables one encoding builds: output strings and function ids.
typedef struct {
  const hs_snapshot *snapshot;
  strtab *out_strings;      // the output string_table (index 0 = "")
  uint32_t *string_map;     // snapshot string id -> output index + 1 (0 = not yet mapped)
  uint32_t (*functions)[2]; // function id - 1 -> {name, file} output string indexes
  uint32_t function_count;
  idindex function_index;
  bool failed;
} encoder;

static int64_t literal(encoder *e, const char *s) {
  uint32_t id = strtab_intern(e->out_strings, s, strlen(s));
  if (id == STRTAB_ERROR) e->failed = true;
  return id;
}

static int64_t mapped_string(encoder *e, uint32_t snapshot_id) {
  if (e->string_map[snapshot_id] == 0) {
    size_t len;
    const char *bytes = strtab_get(e->snapshot->strings, snapshot_id, &len);
    uint32_t id = strtab_intern(e->out_strings, bytes, len);
    if (id == STRTAB_ERROR) {
      e->failed = true;
      return 0;
    }
    e->string_map[snapshot_id] = id + 1;
  }
  return e->string_map[snapshot_id] - 1;
}

static bool function_equals(const void *ctx, uint32_t id, const void *key) {
  const encoder *e = ctx;
  return memcmp(e->functions[id - 1], key, sizeof(uint32_t[2])) == 0;
}

// Returns the function id for (name, file), adding it if new. functions has room for one per
// location: there are never more functions than locations.
static uint32_t function_id(encoder *e, uint32_t name, uint32_t file) {
  uint32_t key[2] = {name, file};
  uint32_t hash = idindex_hash_bytes(key, sizeof key);
  uint32_t id = idindex_find(&e->function_index, hash, function_equals, e, key);
  if (id != IDINDEX_NONE) return id;
  id = ++e->function_count;
  memcpy(e->functions[id - 1], key, sizeof key);
  if (!idindex_insert(&e->function_index, hash, id)) e->failed = true;
  return id;
}

static void write_value_type(pb_buffer *b, uint32_t tag, int64_t type, int64_t unit) {
  size_t start = pb_start_message(b);
  pb_int64_opt(b, tagValueType_Type, type);
  pb_int64_opt(b, tagValueType_Unit, unit);
  pb_end_message(b, tag, start);
}

static void write_label(pb_buffer *b, int64_t key, int64_t str, int64_t num, int64_t num_unit) {
  size_t start = pb_start_message(b);
  pb_int64(b, tagLabel_Key, key);
  pb_int64_opt(b, tagLabel_Str, str);
  pb_int64_opt(b, tagLabel_Num, num);
  pb_int64_opt(b, tagLabel_NumUnit, num_unit);
  pb_end_message(b, tagSample_Label, start);
}

// A group total as a label's whole number, saturated (a float may hold more than int64 can).
static int64_t group_total(float v) {
  if (!(v == v)) return 0; // NaN: nothing a reader could use
  if (v >= 9.2e18f) return INT64_MAX;
  if (v <= -9.2e18f) return INT64_MIN;
  return llroundf(v);
}

static void write_samples(encoder *e, pb_buffer *b) {
  const hs_snapshot *s = e->snapshot;
  int64_t class_key = literal(e, "class"), age_key = literal(e, "gc_age");
  // A unit keeps gc_age 0 visible: pprof readers drop a numeric label that is 0 and has no unit.
  int64_t gcs_unit = literal(e, "gcs");
  int64_t variance_keys[HS_VALUE_COUNT];
  for (int v = 0; v < HS_VALUE_COUNT; v++) variance_keys[v] = literal(e, variance_label_names[v]);
  int64_t group_keys[HS_VALUE_COUNT][VARIANCE_GROUPS];
  for (int v = 0; s->has_groups && v < HS_VALUE_COUNT; v++) {
    for (int g = 0; g < VARIANCE_GROUPS; g++) {
      char name[40];
      snprintf(name, sizeof name, "%s_vg%d", sample_type_names[v][0], g);
      group_keys[v][g] = literal(e, name);
    }
  }
  for (size_t i = 0; i < s->sample_count && !e->failed; i++) {
    const hs_sample *sample = &s->samples[i];
    size_t start = pb_start_message(b);
    // (An empty stack may come before any location id exists: no arithmetic on a NULL array then.)
    const uint32_t *ids = sample->locations_len ? s->location_ids + sample->locations_offset : NULL;
    pb_packed_uint32(b, tagSample_Location, ids, sample->locations_len);
    pb_packed_int64(b, tagSample_Value, sample->values, HS_VALUE_COUNT);
    if (sample->class_id != 0) write_label(b, class_key, mapped_string(e, sample->class_id), 0, 0);
    if (sample->gc_age != HS_NO_AGE) write_label(b, age_key, 0, sample->gc_age, gcs_unit);
    // The labels in force where it was allocated (labels.h), key and value alternating.
    if (sample->labels_len != 0 && (size_t)sample->labels_offset + sample->labels_len <= s->label_id_count) {
      const uint32_t *ids = s->label_ids + sample->labels_offset;
      uint32_t string_count = strtab_count(s->strings);
      for (uint32_t l = 0; l + 1 < sample->labels_len; l += 2) {
        if (ids[l] >= string_count || ids[l + 1] >= string_count) continue;
        write_label(b, mapped_string(e, ids[l]), mapped_string(e, ids[l + 1]), 0, 0);
      }
    }
    for (int v = 0; v < HS_VALUE_COUNT; v++) {
      if (sample->variances[v] != 0) write_label(b, variance_keys[v], 0, sample->variances[v], 0);
    }
    if (s->has_groups && sample->groups != 0 && sample->group_types >= 0 && sample->group_types + 1 < HS_VALUE_COUNT) {
      const hs_group_totals *totals = &s->group_totals[sample->groups - 1];
      for (int t = 0; t < 2; t++) {
        for (int g = 0; g < VARIANCE_GROUPS; g++) {
          int64_t total = group_total((*totals)[t][g]);
          if (total != 0) write_label(b, group_keys[sample->group_types + t][g], 0, total, 0);
        }
      }
    }
    pb_end_message(b, tagProfile_Sample, start);
  }
}

static void write_locations_and_functions(encoder *e, pb_buffer *b) {
  const hs_snapshot *s = e->snapshot;
  for (uint32_t l = 0; l < s->location_count && !e->failed; l++) {
    const hs_location *location = &s->locations[l];
    uint32_t function = function_id(e, (uint32_t)mapped_string(e, location->function_id), (uint32_t)mapped_string(e, location->file_id));
    size_t start = pb_start_message(b);
    pb_uint64(b, tagLocation_ID, l + 1);
    size_t line_start = pb_start_message(b);
    pb_uint64(b, tagLine_FunctionID, function);
    pb_int64_opt(b, tagLine_Line, location->line);
    pb_end_message(b, tagLocation_Line, line_start);
    pb_end_message(b, tagProfile_Location, start);
  }
  for (uint32_t f = 0; f < e->function_count; f++) {
    size_t start = pb_start_message(b);
    pb_uint64(b, tagFunction_ID, f + 1);
    pb_int64_opt(b, tagFunction_Name, e->functions[f][0]);
    pb_int64_opt(b, tagFunction_Filename, e->functions[f][1]);
    pb_end_message(b, tagProfile_Function, start);
  }
}

static void write_header(encoder *e, pb_buffer *b) {
  const hs_snapshot *s = e->snapshot;
  for (int i = 0; i < HS_VALUE_COUNT; i++) {
    write_value_type(b, tagProfile_SampleType, literal(e, sample_type_names[i][0]), literal(e, sample_type_names[i][1]));
  }
  pb_int64_opt(b, tagProfile_TimeNanos, s->time_nanos);
  pb_int64_opt(b, tagProfile_DurationNanos, s->duration_nanos);
  write_value_type(b, tagProfile_PeriodType, literal(e, "allocations"), literal(e, "count"));
  pb_int64_opt(b, tagProfile_Period, s->period);
  if (s->allocs) pb_int64(b, tagProfile_DefaultSampleType, literal(e, "alloc_space"));
  for (const char *line = s->comments; line != NULL && *line != '\0';) {
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    uint32_t id = strtab_intern(e->out_strings, line, len);
    if (id == STRTAB_ERROR) e->failed = true;
    else if (id != 0) pb_int64(b, tagProfile_Comment, id);
    line = end ? end + 1 : line + len;
  }
}

bool pprof_encode(const hs_snapshot *snapshot, pb_buffer *out) {
  encoder e = {.snapshot = snapshot};
  e.out_strings = strtab_new();
  e.string_map = calloc(strtab_count(snapshot->strings), sizeof(uint32_t));
  e.functions = malloc(sizeof(uint32_t[2]) * (snapshot->location_count + 1));
  if (e.out_strings == NULL || e.string_map == NULL || e.functions == NULL || !idindex_init(&e.function_index, 64)) {
    e.failed = true;
  }
  if (!e.failed) {
    write_header(&e, out);
    write_samples(&e, out);
    write_locations_and_functions(&e, out);
    for (uint32_t id = 0; id < strtab_count(e.out_strings) && !e.failed; id++) {
      size_t len;
      const char *bytes = strtab_get(e.out_strings, id, &len);
      pb_bytes(out, tagProfile_StringTable, bytes, len);
    }
  }
  strtab_free(e.out_strings);
  free(e.string_map);
  free(e.functions);
  idindex_free(&e.function_index);
  return !e.failed && !out->failed;
}

bool pprof_gzip(const pb_buffer *in, pb_buffer *out) {
  z_stream zs = {0};
  // windowBits 15 + 16: a gzip header and trailer around the deflate stream.
  if (deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return false;
  size_t bound = deflateBound(&zs, in->len) + 32;
  out->data = malloc(bound);
  if (out->data == NULL) {
    deflateEnd(&zs);
    out->failed = true;
    return false;
  }
  out->capacity = bound;
  zs.next_in = in->data;
  zs.avail_in = (uInt)in->len;
  zs.next_out = out->data;
  zs.avail_out = (uInt)bound;
  int status = deflate(&zs, Z_FINISH);
  out->len = bound - zs.avail_out;
  deflateEnd(&zs);
  return status == Z_STREAM_END;
}
