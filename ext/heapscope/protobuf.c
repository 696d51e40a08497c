#include "protobuf.h"

#include <stdlib.h>
#include <string.h>

enum { WIRE_VARINT = 0, WIRE_LENGTH = 2 };

void pb_init(pb_buffer *b) { *b = (pb_buffer){0}; }

void pb_free(pb_buffer *b) {
  free(b->data);
  *b = (pb_buffer){0};
}

static bool reserve(pb_buffer *b, size_t extra) {
  if (b->failed) return false;
  if (b->len + extra <= b->capacity) return true;
  size_t capacity = b->capacity ? b->capacity : 4096;
  while (capacity < b->len + extra) capacity *= 2;
  uint8_t *data = realloc(b->data, capacity);
  if (data == NULL) {
    b->failed = true;
    return false;
  }
  b->data = data;
  b->capacity = capacity;
  return true;
}

// Writes value as a varint into out (at least 10 bytes); returns the bytes used.
static size_t encode_varint(uint8_t *out, uint64_t value) {
  size_t n = 0;
  while (value >= 0x80) {
    out[n++] = (uint8_t)(value | 0x80);
    value >>= 7;
  }
  out[n++] = (uint8_t)value;
  return n;
}

void pb_varint(pb_buffer *b, uint64_t value) {
  if (!reserve(b, 10)) return;
  b->len += encode_varint(b->data + b->len, value);
}

static void key(pb_buffer *b, uint32_t tag, int wire_type) { pb_varint(b, ((uint64_t)tag << 3) | (uint64_t)wire_type); }

void pb_uint64(pb_buffer *b, uint32_t tag, uint64_t value) {
  key(b, tag, WIRE_VARINT);
  pb_varint(b, value);
}

void pb_uint64_opt(pb_buffer *b, uint32_t tag, uint64_t value) {
  if (value != 0) pb_uint64(b, tag, value);
}

// int64 fields are varints of the two's-complement value (negative numbers take 10 bytes).
void pb_int64(pb_buffer *b, uint32_t tag, int64_t value) { pb_uint64(b, tag, (uint64_t)value); }

void pb_int64_opt(pb_buffer *b, uint32_t tag, int64_t value) {
  if (value != 0) pb_int64(b, tag, value);
}

void pb_bytes(pb_buffer *b, uint32_t tag, const void *bytes, size_t len) {
  key(b, tag, WIRE_LENGTH);
  pb_varint(b, len);
  if (!reserve(b, len)) return;
  if (len) memcpy(b->data + b->len, bytes, len);
  b->len += len;
}

void pb_packed_uint64(pb_buffer *b, uint32_t tag, const uint64_t *values, size_t n) {
  if (n == 0) return;
  size_t start = pb_start_message(b);
  for (size_t i = 0; i < n; i++) pb_varint(b, values[i]);
  pb_end_message(b, tag, start);
}

void pb_packed_uint32(pb_buffer *b, uint32_t tag, const uint32_t *values, size_t n) {
  if (n == 0) return;
  size_t start = pb_start_message(b);
  for (size_t i = 0; i < n; i++) pb_varint(b, values[i]);
  pb_end_message(b, tag, start);
}

void pb_packed_int64(pb_buffer *b, uint32_t tag, const int64_t *values, size_t n) {
  pb_packed_uint64(b, tag, (const uint64_t *)values, n);
}

size_t pb_start_message(pb_buffer *b) { return b->len; }

void pb_end_message(pb_buffer *b, uint32_t tag, size_t start) {
  if (b->failed) return;
  uint8_t header[20];
  size_t header_len = encode_varint(header, ((uint64_t)tag << 3) | WIRE_LENGTH);
  header_len += encode_varint(header + header_len, b->len - start);
  if (!reserve(b, header_len)) return;
  // Slide the body forward and put the key and length in front of it.
  memmove(b->data + start + header_len, b->data + start, b->len - start);
  memcpy(b->data + start, header, header_len);
  b->len += header_len;
}
