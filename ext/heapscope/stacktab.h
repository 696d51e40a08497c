// stacktab: interned frames and stacks.
//
// A frame is {code id, line}: the code id names the method or block (see names.h; it is resolved to
// names only when a profile is built), the line is where that code was executing. Equal frames share
// one frame id.
// A stack is a list of frame ids, leaf first; equal stacks share one stack id and a reference count:
// each tracked object and each allocation counter holding the stack owns one reference, and the stack
// is freed (its id reused) when the last one is released. Frames are never freed: they name code.
//
// Ids start at 1; 0 means "none". Pure C, no Ruby, never raises; not thread-safe (the owner holds
// the GVL). Safe inside the allocation hook and the GC hook: it only mallocs and frees.
#ifndef HEAPSCOPE_STACKTAB_H
#define HEAPSCOPE_STACKTAB_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  uint32_t code_id; // names.h code id; 0 = a marker: "line frames omitted"
  int32_t line;     // 0 for C functions (they take their caller's line in profiles)
} hs_frame;
// Frames are hashed and compared as bytes: there must be no padding.
_Static_assert(sizeof(hs_frame) == 8, "hs_frame must be padding-free");

typedef struct stacktab stacktab;

typedef enum {
  STACKTAB_OK = 0,
  STACKTAB_FULL,  // max_stacks distinct stacks are alive; a new one was refused
  STACKTAB_NOMEM, // memory is short; nothing changed
} stacktab_status;

// A new, empty table that holds at most max_stacks live stacks. NULL when memory is short.
stacktab *stacktab_new(uint32_t max_stacks);
void stacktab_free(stacktab *table);

// Returns the id of frame, adding it if new; 0 when memory is short.
uint32_t stacktab_intern_frame(stacktab *table, hs_frame frame);
// The frame behind frame_id (1..frame_count). Valid until the next stacktab_intern_frame.
const hs_frame *stacktab_frame(const stacktab *table, uint32_t frame_id);
uint32_t stacktab_frame_count(const stacktab *table);

// Finds or adds the stack frame_ids[0..n) and takes one reference to it, storing its id in *stack_id.
stacktab_status stacktab_acquire(stacktab *table, const uint32_t *frame_ids, uint32_t n, uint32_t *stack_id)
  __attribute__((warn_unused_result));
// Takes one more reference to a live stack.
void stacktab_retain(stacktab *table, uint32_t stack_id);
// Drops one reference; the stack is freed when none is left.
void stacktab_release(stacktab *table, uint32_t stack_id);
// The frame ids of a live stack (leaf first) and their number in *n. Valid while the stack lives.
const uint32_t *stacktab_stack(const stacktab *table, uint32_t stack_id, uint32_t *n);

uint32_t stacktab_live_stacks(const stacktab *table);
size_t stacktab_memory(const stacktab *table);

#endif
