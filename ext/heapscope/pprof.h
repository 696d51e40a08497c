// pprof: writes a snapshot as a profile.proto message (github.com/google/pprof proto/profile.proto),
// in Go's heap-profile vocabulary so every pprof consumer reads it without configuration.
//
// Pure C, no Ruby, no global state: safe to call without the GVL.
#ifndef HEAPSCOPE_PPROF_H
#define HEAPSCOPE_PPROF_H

#include <stdbool.h>

#include "protobuf.h"
#include "snapshot.h"

// Encodes snapshot into out (raw protobuf, appended). Returns false when memory is short.
bool pprof_encode(const hs_snapshot *snapshot, pb_buffer *out) __attribute__((warn_unused_result));

// Gzips in into out (which must be empty). Returns false when memory is short or zlib fails.
bool pprof_gzip(const pb_buffer *in, pb_buffer *out) __attribute__((warn_unused_result));

#endif
