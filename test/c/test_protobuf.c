// Unit tests for ext/heapscope/protobuf.c, checked byte for byte against the wire format.
#include <stdlib.h>
#include <string.h>

#include "../../ext/heapscope/protobuf.h"
#include "check.h"

static bool bytes_are(const pb_buffer *b, const uint8_t *want, size_t len) {
  return !b->failed && b->len == len && memcmp(b->data, want, len) == 0;
}
#define BYTES_ARE(b, ...)                                       \
  do {                                                          \
    static const uint8_t want_[] = {__VA_ARGS__};               \
    CHECK(bytes_are((b), want_, sizeof want_));                 \
  } while (0)

static void test_varints(void) {
  pb_buffer b;
  pb_init(&b);
  pb_varint(&b, 0);
  BYTES_ARE(&b, 0x00);
  pb_free(&b);
  pb_varint(&b, 1);
  pb_varint(&b, 127);
  pb_varint(&b, 128);
  pb_varint(&b, 300);
  BYTES_ARE(&b, 0x01, 0x7f, 0x80, 0x01, 0xac, 0x02);
  pb_free(&b);
  pb_varint(&b, UINT64_MAX);
  BYTES_ARE(&b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01);
  pb_free(&b);
  CHECK(b.data == NULL && b.len == 0);
}

static void test_fields(void) {
  pb_buffer b;
  pb_init(&b);
  pb_uint64(&b, 1, 150);
  BYTES_ARE(&b, 0x08, 0x96, 0x01);
  pb_free(&b);
  pb_uint64_opt(&b, 1, 0);
  pb_int64_opt(&b, 2, 0);
  CHECK_EQ_U64(b.len, 0);
  pb_uint64(&b, 1, 0); // the non-opt variant writes zeros
  BYTES_ARE(&b, 0x08, 0x00);
  pb_free(&b);
  pb_int64(&b, 2, -1); // two's complement: ten bytes
  BYTES_ARE(&b, 0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01);
  pb_free(&b);
  pb_int64_opt(&b, 3, 5);
  BYTES_ARE(&b, 0x18, 0x05);
  pb_free(&b);
  pb_bytes(&b, 6, "abc", 3);
  pb_bytes(&b, 6, "", 0);
  BYTES_ARE(&b, 0x32, 0x03, 'a', 'b', 'c', 0x32, 0x00);
  pb_free(&b);
  pb_uint64(&b, 16, 1); // tag 16: a two-byte key
  BYTES_ARE(&b, 0x80, 0x01, 0x01);
  pb_free(&b);
}

static void test_packed(void) {
  pb_buffer b;
  pb_init(&b);
  uint64_t values[] = {3, 270, 86942};
  pb_packed_uint64(&b, 4, values, 3);
  BYTES_ARE(&b, 0x22, 0x06, 0x03, 0x8e, 0x02, 0x9e, 0xa7, 0x05);
  pb_free(&b);
  pb_packed_uint64(&b, 4, values, 0); // empty: nothing at all
  CHECK_EQ_U64(b.len, 0);
  uint32_t ids[] = {3, 270, 86942};
  pb_packed_uint32(&b, 4, ids, 3); // same bytes as the uint64 values
  BYTES_ARE(&b, 0x22, 0x06, 0x03, 0x8e, 0x02, 0x9e, 0xa7, 0x05);
  pb_free(&b);
  pb_packed_uint32(&b, 4, ids, 0);
  CHECK_EQ_U64(b.len, 0);
  int64_t negative[] = {-1, 1};
  pb_packed_int64(&b, 2, negative, 2);
  BYTES_ARE(&b, 0x12, 0x0b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x01);
  pb_free(&b);
}

static void test_nested(void) {
  pb_buffer b;
  pb_init(&b);
  pb_uint64(&b, 1, 1);
  size_t outer = pb_start_message(&b);
  pb_uint64(&b, 1, 2);
  size_t inner = pb_start_message(&b);
  pb_uint64(&b, 2, 3);
  pb_end_message(&b, 3, inner);
  size_t empty = pb_start_message(&b);
  pb_end_message(&b, 4, empty); // an empty message is still written (key, length 0)
  pb_end_message(&b, 5, outer);
  BYTES_ARE(&b, 0x08, 0x01, 0x2a, 0x08, 0x08, 0x02, 0x1a, 0x02, 0x10, 0x03, 0x22, 0x00);
  pb_free(&b);

  // A body of 200 bytes needs a two-byte length: the body slides forward by one more byte.
  size_t start = pb_start_message(&b);
  for (int i = 0; i < 100; i++) pb_uint64(&b, 1, (uint64_t)i);
  pb_end_message(&b, 2, start);
  CHECK_EQ_U64(b.len, 203);
  CHECK(b.data[0] == 0x12 && b.data[1] == 0xc8 && b.data[2] == 0x01);
  CHECK(b.data[3] == 0x08 && b.data[4] == 0x00 && b.data[201] == 0x08 && b.data[202] == 99);
  pb_free(&b);

  // Growth across the initial 4096-byte capacity while messages are open.
  size_t s0 = pb_start_message(&b);
  for (int i = 0; i < 3000; i++) {
    size_t s1 = pb_start_message(&b);
    pb_bytes(&b, 1, "0123456789", 10);
    pb_end_message(&b, 2, s1);
  }
  pb_end_message(&b, 3, s0);
  // 3000 * (2 + 12) = 42000 bytes of body, a key and a three-byte length.
  CHECK_EQ_U64(b.len, 42000 + 1 + 3);
  CHECK(b.data[0] == 0x1a && b.data[1] == (0x80 | (42000 & 0x7f)) && b.data[4] == 0x12 && b.data[5] == 12);
  CHECK(!b.failed);
  pb_free(&b);
}

// Failures are sticky: once failed, writes are ignored (the caller checks once at the end).
static void test_failed_is_sticky(void) {
  pb_buffer b;
  pb_init(&b);
  pb_uint64(&b, 1, 1);
  b.failed = true;
  size_t len = b.len;
  pb_uint64(&b, 1, 2);
  pb_bytes(&b, 2, "x", 1);
  size_t start = pb_start_message(&b);
  pb_uint64(&b, 1, 3);
  pb_end_message(&b, 3, start);
  CHECK_EQ_U64(b.len, len);
  pb_free(&b);
  CHECK(!b.failed);
}

int main(void) {
  test_varints();
  test_fields();
  test_packed();
  test_nested();
  test_failed_is_sticky();
  return check_report("test_protobuf");
}
