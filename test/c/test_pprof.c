// Unit tests for ext/heapscope/snapshot.c and pprof.c: a hand-built snapshot is encoded, gzipped,
// gunzipped and read back with the independent decoder in pprof_decode.h.
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "../../ext/heapscope/pprof.h"
#include "check.h"
#include "pprof_decode.h"

static uint32_t str(hs_snapshot *s, const char *text) { return strtab_intern(s->strings, text, strlen(text)); }

static void test_snapshot_tables(void) {
  hs_snapshot *s = snapshot_new();
  CHECK(s != NULL);
  hs_location a = {1, 2, 10}, b = {1, 2, 11};
  CHECK_EQ_U64(snapshot_location_id(s, a), 1);
  CHECK_EQ_U64(snapshot_location_id(s, b), 2);
  CHECK_EQ_U64(snapshot_location_id(s, a), 1);
  // Past the initial 64 locations and the index's first capacity.
  unsigned wrong = 0;
  for (int32_t i = 0; i < 3000; i++) wrong += snapshot_location_id(s, (hs_location){5, 6, i}) != (uint32_t)i + 3;
  for (int32_t i = 0; i < 3000; i++) wrong += s->locations[i + 2].line != i;
  CHECK_EQ_U64(wrong, 0);
  CHECK_EQ_U64(s->location_count, 3002);
  uint32_t ids[] = {1, 2, 3};
  uint32_t off1 = snapshot_add_stack(s, ids, 3), off2 = snapshot_add_stack(s, ids, 0), off3 = snapshot_add_stack(s, ids + 1, 2);
  CHECK_EQ_U64(off1, 0);
  CHECK_EQ_U64(off2, 3);
  CHECK_EQ_U64(off3, 3);
  CHECK(s->location_ids[3] == 2 && s->location_ids[4] == 3);
  int64_t values[HS_VALUE_COUNT] = {1, 2, 3, 4};
  for (int i = 0; i < 200; i++) CHECK(snapshot_add_sample(s, off1, 3, 0, HS_NO_AGE, values, NULL, NULL, 0));
  CHECK_EQ_U64(s->sample_count, 200);
  CHECK(s->samples[199].values[3] == 4 && s->samples[199].gc_age == HS_NO_AGE);
  snapshot_free(s);
  snapshot_free(NULL);
}

// Gunzips in into a new buffer; NULL on error.
static uint8_t *gunzip(const pb_buffer *in, size_t *out_len) {
  size_t capacity = in->len * 20 + 1024;
  uint8_t *out = malloc(capacity);
  z_stream zs = {0};
  if (out == NULL || inflateInit2(&zs, 15 + 16) != Z_OK) {
    free(out);
    return NULL;
  }
  zs.next_in = in->data;
  zs.avail_in = (uInt)in->len;
  zs.next_out = out;
  zs.avail_out = (uInt)capacity;
  int status = inflate(&zs, Z_FINISH);
  *out_len = capacity - zs.avail_out;
  inflateEnd(&zs);
  if (status != Z_STREAM_END) {
    free(out);
    return NULL;
  }
  return out;
}

static void test_encode(void) {
  hs_snapshot *s = snapshot_new();
  s->strings = strtab_new();
  uint32_t f_main = str(s, "Object#main"), f_leaf = str(s, "Foo#make"), f_c = str(s, "Array#map");
  uint32_t file_a = str(s, "/app/a.rb"), file_b = str(s, "/app/b.rb"), cls = str(s, "String");
  uint32_t unused = str(s, "never used"); // in the snapshot's strings but not referenced
  (void)unused;
  uint32_t l_leaf = snapshot_location_id(s, (hs_location){f_leaf, file_b, 7});
  uint32_t l_c = snapshot_location_id(s, (hs_location){f_c, file_a, 3});
  uint32_t l_main = snapshot_location_id(s, (hs_location){f_main, file_a, 3});
  uint32_t l_leaf2 = snapshot_location_id(s, (hs_location){f_leaf, file_b, 8}); // same function, other line
  uint32_t stack1[] = {l_leaf, l_c, l_main}, stack2[] = {l_leaf2, l_main};
  uint32_t o1 = snapshot_add_stack(s, stack1, 3), o2 = snapshot_add_stack(s, stack2, 2);
  int64_t alloc_values[HS_VALUE_COUNT] = {300, 12000, 0, 0};
  int64_t live_values[HS_VALUE_COUNT] = {0, 0, 100, 4000};
  int64_t big_values[HS_VALUE_COUNT] = {INT64_MAX, -5, 0, 1};
  CHECK(snapshot_add_sample(s, o1, 3, cls, HS_NO_AGE, alloc_values, NULL, NULL, 0));
  CHECK(snapshot_add_sample(s, o1, 3, cls, 0, live_values, NULL, NULL, 0));
  CHECK(snapshot_add_sample(s, o2, 2, 0, 4, live_values, NULL, NULL, 0));
  CHECK(snapshot_add_sample(s, o2, 0, 0, HS_NO_AGE, big_values, NULL, NULL, 0)); // no locations at all
  s->period = 128;
  s->time_nanos = 1700000000123456789;
  s->duration_nanos = 5000000000;
  s->allocs = true;
  s->comments = strdup("first line\n\nthird line after an empty one\nlast without newline");

  pb_buffer raw, gz;
  pb_init(&raw);
  pb_init(&gz);
  CHECK(pprof_encode(s, &raw));
  CHECK(pprof_gzip(&raw, &gz));
  CHECK(gz.len > 20 && gz.data[0] == 0x1f && gz.data[1] == 0x8b);
  size_t len = 0;
  uint8_t *plain = gunzip(&gz, &len);
  CHECK(plain != NULL && len == raw.len && memcmp(plain, raw.data, len) == 0);
  free(plain);

  pd_profile *p = pd_decode(raw.data, raw.len);
  CHECK(p != NULL);
  if (p == NULL) {
    fprintf(stderr, "decode: %s\n", pd_error);
    return;
  }
  CHECK(pd_validate(p));
  CHECK_EQ_U64(p->sample_type_count, 4);
  const char *types[4][2] = {{"alloc_objects", "count"}, {"alloc_space", "bytes"}, {"inuse_objects", "count"}, {"inuse_space", "bytes"}};
  for (int i = 0; i < 4; i++) CHECK(pd_str_is(p, p->sample_types[i][0], types[i][0]) && pd_str_is(p, p->sample_types[i][1], types[i][1]));
  CHECK(pd_str_is(p, p->period_type[0], "allocations") && pd_str_is(p, p->period_type[1], "count"));
  CHECK(p->period == 128 && p->time_nanos == 1700000000123456789 && p->duration_nanos == 5000000000);
  CHECK(pd_str_is(p, p->default_sample_type, "alloc_space"));
  // Comments: one per non-empty line, in order.
  CHECK_EQ_U64(p->comment_count, 3);
  CHECK(pd_str_is(p, p->comments[0], "first line"));
  CHECK(pd_str_is(p, p->comments[1], "third line after an empty one"));
  CHECK(pd_str_is(p, p->comments[2], "last without newline"));
  // Locations 1..4 in snapshot order; functions deduplicated per (name, file): Foo#make once.
  CHECK_EQ_U64(p->location_count, 4);
  CHECK_EQ_U64(p->function_count, 3);
  CHECK(p->locations[0].line == 7 && p->locations[3].line == 8);
  CHECK(p->locations[0].function_id == p->locations[3].function_id);
  const pd_function *leaf = &p->functions[p->locations[0].function_id - 1];
  CHECK(pd_str_is(p, leaf->name, "Foo#make") && pd_str_is(p, leaf->filename, "/app/b.rb"));
  const pd_function *c = &p->functions[p->locations[1].function_id - 1];
  CHECK(pd_str_is(p, c->name, "Array#map") && pd_str_is(p, c->filename, "/app/a.rb"));
  // Samples, in order, with their values and labels.
  CHECK_EQ_U64(p->sample_count, 4);
  const pd_sample *s0 = &p->samples[0], *s1 = &p->samples[1], *s2 = &p->samples[2], *s3 = &p->samples[3];
  CHECK(s0->location_count == 3 && s0->location_ids[0] == 1 && s0->location_ids[1] == 2 && s0->location_ids[2] == 3);
  CHECK(s0->values[0] == 300 && s0->values[1] == 12000 && s0->values[2] == 0 && s0->values[3] == 0);
  CHECK(s0->label_count == 1 && pd_str_is(p, s0->labels[0].key, "class") && pd_str_is(p, s0->labels[0].str, "String"));
  // gc_age 0 is written with a unit, so readers keep it.
  CHECK(s1->label_count == 2 && pd_str_is(p, s1->labels[1].key, "gc_age") && s1->labels[1].num == 0 &&
        pd_str_is(p, s1->labels[1].num_unit, "gcs"));
  CHECK(s2->location_count == 2 && s2->location_ids[0] == 4 && s2->location_ids[1] == 3);
  CHECK(s2->label_count == 1 && s2->labels[0].num == 4);
  CHECK(s3->location_count == 0 && s3->label_count == 0 && s3->values[0] == INT64_MAX && s3->values[1] == -5);
  // The string table holds only what is used: no "never used".
  bool found_unused = false;
  for (size_t i = 0; i < p->string_count; i++) found_unused |= pd_str_is(p, (int64_t)i, "never used");
  CHECK(!found_unused);
  pd_free(p);

  // Encoding is deterministic.
  pb_buffer again;
  pb_init(&again);
  CHECK(pprof_encode(s, &again));
  CHECK(again.len == raw.len && memcmp(again.data, raw.data, raw.len) == 0);
  pb_free(&again);
  pb_free(&raw);
  pb_free(&gz);
  snapshot_free(s);
}

// An empty heap profile: header only, no default_sample_type (viewers pick inuse_space).
static void test_empty(void) {
  hs_snapshot *s = snapshot_new();
  s->strings = strtab_new();
  pb_buffer raw, gz;
  pb_init(&raw);
  pb_init(&gz);
  CHECK(pprof_encode(s, &raw));
  pd_profile *p = pd_decode(raw.data, raw.len);
  CHECK(p != NULL && pd_validate(p));
  if (p) {
    CHECK(p->sample_count == 0 && p->location_count == 0 && p->function_count == 0 && p->comment_count == 0);
    CHECK(p->default_sample_type == 0 && p->sample_type_count == 4 && p->period == 0);
  }
  pd_free(p);
  CHECK(pprof_gzip(&raw, &gz));
  size_t len;
  uint8_t *plain = gunzip(&gz, &len);
  CHECK(plain != NULL && len == raw.len);
  free(plain);
  pb_free(&raw);
  pb_free(&gz);
  // Gzip of nothing is still a valid gzip stream.
  pb_buffer nothing;
  pb_init(&nothing);
  CHECK(pprof_gzip(&nothing, &gz));
  plain = gunzip(&gz, &len);
  CHECK(plain != NULL && len == 0);
  free(plain);
  pb_free(&gz);
  snapshot_free(s);
}

// Many samples and locations: lengths of nested messages cross varint size boundaries.
static void test_large(void) {
  hs_snapshot *s = snapshot_new();
  s->strings = strtab_new();
  char name[32];
  uint32_t ids[200];
  for (int i = 0; i < 200; i++) {
    int len = snprintf(name, sizeof name, "m%d", i % 50);
    uint32_t f = strtab_intern(s->strings, name, (size_t)len);
    ids[i] = snapshot_location_id(s, (hs_location){f, 0, i});
  }
  uint32_t off = snapshot_add_stack(s, ids, 200);
  int64_t values[HS_VALUE_COUNT] = {1, 2, 3, 4};
  for (int i = 0; i < 5000; i++) CHECK(snapshot_add_sample(s, off, 200 - (uint32_t)(i % 200), 0, i % 3 ? i : HS_NO_AGE, values, NULL, NULL, 0));
  pb_buffer raw;
  pb_init(&raw);
  CHECK(pprof_encode(s, &raw));
  pd_profile *p = pd_decode(raw.data, raw.len);
  CHECK(p != NULL && pd_validate(p));
  if (p) {
    CHECK_EQ_U64(p->sample_count, 5000);
    CHECK_EQ_U64(p->location_count, 200);
    CHECK_EQ_U64(p->function_count, 50);
    CHECK_EQ_U64(p->samples[1].location_count, 199);
    CHECK(p->samples[4999].location_count == 1 && p->samples[4999].location_ids[0] == 1);
  }
  pd_free(p);
  pb_free(&raw);
  snapshot_free(s);
}

int main(void) {
  test_snapshot_tables();
  test_encode();
  test_empty();
  test_large();
  return check_report("test_pprof");
}
