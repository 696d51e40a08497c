// protobuf: a schema-free protocol buffers encoder (wire format only; pprof.c knows the schema).
//
// Nested messages are written in place: pb_start_message remembers where the body starts and
// pb_end_message back-patches the tag and length in front of it, so no second buffer is needed.
// Memory failures are sticky: the first failed growth sets `failed`, later writes are ignored, and the
// caller checks once at the end. Pure C, no Ruby; safe without the GVL.
#ifndef HEAPSCOPE_PROTOBUF_H
#define HEAPSCOPE_PROTOBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
  uint8_t *data;
  size_t len, capacity;
  bool failed; // an allocation failed: the contents are incomplete
} pb_buffer;

void pb_init(pb_buffer *b);
void pb_free(pb_buffer *b);

void pb_varint(pb_buffer *b, uint64_t value);
void pb_uint64(pb_buffer *b, uint32_t tag, uint64_t value);
void pb_uint64_opt(pb_buffer *b, uint32_t tag, uint64_t value); // skipped when 0 (proto3 default)
void pb_int64(pb_buffer *b, uint32_t tag, int64_t value);
void pb_int64_opt(pb_buffer *b, uint32_t tag, int64_t value);   // skipped when 0
void pb_bytes(pb_buffer *b, uint32_t tag, const void *bytes, size_t len);
void pb_packed_uint64(pb_buffer *b, uint32_t tag, const uint64_t *values, size_t n);
void pb_packed_int64(pb_buffer *b, uint32_t tag, const int64_t *values, size_t n);
void pb_packed_uint32(pb_buffer *b, uint32_t tag, const uint32_t *values, size_t n); // as repeated uint64

// Starts a nested message; returns the offset to pass to pb_end_message.
size_t pb_start_message(pb_buffer *b);
// Ends the message started at start as field tag (length-delimited).
void pb_end_message(pb_buffer *b, uint32_t tag, size_t start);

#endif
