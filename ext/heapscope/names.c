#include "names.h"

#include <ruby/debug.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idindex.h"

// Past this many cached frames the cache is emptied and starts again, so code generated at run time
// (eval) cannot pin an unbounded number of frames.
#define NAMES_MAX_CACHED 100000

typedef struct {
  VALUE frame;          // pinned by names_mark
  uint32_t function_id; // strtab ids
  uint32_t file_id;
  bool is_c_function;   // no file or line of its own
} cached_frame;

struct names {
  cached_frame *entries; // entries[id - 1]
  uint32_t count, capacity;
  idindex index;
};

names *names_new(void) {
  names *n = calloc(1, sizeof(names));
  if (n == NULL) return NULL;
  if (!idindex_init(&n->index, 256)) {
    free(n);
    return NULL;
  }
  return n;
}

void names_free(names *n) {
  if (n == NULL) return;
  free(n->entries);
  idindex_free(&n->index);
  free(n);
}

void names_mark(const names *n) {
  if (n == NULL) return;
  for (uint32_t i = 0; i < n->count; i++) rb_gc_mark(n->entries[i].frame);
}

size_t names_memory(const names *n) {
  return n ? sizeof(names) + sizeof(cached_frame) * n->capacity + idindex_memory(&n->index) : 0;
}

static bool frame_equals(const void *ctx, uint32_t id, const void *key) {
  const names *n = ctx;
  return n->entries[id - 1].frame == *(const VALUE *)key;
}

static uint32_t intern_value(strtab *strings, VALUE str) {
  if (!RB_TYPE_P(str, T_STRING)) return 0;
  return strtab_intern(strings, RSTRING_PTR(str), (size_t)RSTRING_LEN(str));
}

// Looks frame up in the cache, resolving and adding it when missing. NULL when memory is short.
static const cached_frame *resolve(names *n, strtab *strings, VALUE frame) {
  uint32_t hash = idindex_hash_bytes(&frame, sizeof frame);
  uint32_t id = idindex_find(&n->index, hash, frame_equals, n, &frame);
  if (id != IDINDEX_NONE) return &n->entries[id - 1];

  VALUE label = rb_profile_frame_full_label(frame);
  // C functions have no path (their absolute_path is a placeholder such as "<cfunc>").
  VALUE path = rb_profile_frame_path(frame);
  VALUE absolute_path = NIL_P(path) ? Qnil : rb_profile_frame_absolute_path(frame);
  cached_frame entry = {
    .frame = frame,
    .function_id = intern_value(strings, label),
    .file_id = intern_value(strings, NIL_P(absolute_path) ? path : absolute_path),
    .is_c_function = NIL_P(path),
  };
  RB_GC_GUARD(label);
  RB_GC_GUARD(path);
  RB_GC_GUARD(absolute_path);
  if (entry.function_id == STRTAB_ERROR || entry.file_id == STRTAB_ERROR) return NULL;

  if (n->count >= NAMES_MAX_CACHED) {
    n->count = 0;
    idindex_free(&n->index);
    if (!idindex_init(&n->index, 256)) return NULL;
  }
  if (n->count == n->capacity) {
    uint32_t capacity = n->capacity ? n->capacity * 2 : 256;
    cached_frame *entries = realloc(n->entries, sizeof(cached_frame) * capacity);
    if (entries == NULL) return NULL;
    n->entries = entries;
    n->capacity = capacity;
  }
  id = n->count + 1;
  if (!idindex_insert(&n->index, hash, id)) return NULL;
  n->entries[id - 1] = entry;
  n->count++;
  return &n->entries[id - 1];
}

uint32_t names_resolve_frames(names *n, strtab *strings, stacktab *stacks, const VALUE *frames, const int *lines,
                              uint32_t count, uint32_t omitted, uint32_t *out) {
  // Walk from the root towards the leaf so a C frame can take the location of its Ruby caller.
  uint32_t caller_file = 0;
  int32_t caller_line = 0;
  for (uint32_t i = count; i-- > 0;) {
    const cached_frame *cached = resolve(n, strings, frames[i]);
    if (cached == NULL) return NAMES_FAILED;
    hs_frame frame = {cached->function_id, cached->file_id, lines[i]};
    if (cached->is_c_function) {
      frame.file_id = caller_file;
      frame.line = caller_line;
    } else if (lines[i] == 0) {
      // A Ruby frame that has not started executing (the script's outer <main>): Ruby's own
      // backtraces leave it out, and so do we.
      out[i] = 0;
      continue;
    } else {
      caller_file = cached->file_id;
      caller_line = lines[i];
    }
    out[i] = stacktab_intern_frame(stacks, frame);
    if (out[i] == 0) return NAMES_FAILED;
  }
  uint32_t kept = 0;
  for (uint32_t i = 0; i < count; i++) {
    if (out[i] != 0) out[kept++] = out[i];
  }
  count = kept;
  if (omitted == 0) return count;
  char label[64];
  int len = snprintf(label, sizeof label, "%u frames omitted", omitted);
  uint32_t function_id = strtab_intern(strings, label, (size_t)len);
  if (function_id == STRTAB_ERROR) return NAMES_FAILED;
  out[count] = stacktab_intern_frame(stacks, (hs_frame){function_id, 0, 0});
  return out[count] ? count + 1 : NAMES_FAILED;
}

uint32_t names_class_id(strtab *strings, VALUE obj) {
  VALUE klass = rb_class_real(RBASIC_CLASS(obj));
  if (klass == 0) return strtab_intern(strings, "<hidden>", 8);
  VALUE name = rb_mod_name(klass);
  if (!NIL_P(name)) return intern_value(strings, name);

  // An anonymous class: name it after its nearest named ancestor, so its objects aggregate.
  VALUE ancestor = klass;
  VALUE ancestor_name = Qnil;
  while (NIL_P(ancestor_name)) {
    ancestor = rb_class_superclass(ancestor);
    if (NIL_P(ancestor)) break;
    ancestor_name = rb_mod_name(ancestor);
  }
  char label[256];
  int len = NIL_P(ancestor_name)
              ? snprintf(label, sizeof label, "<anonymous class>")
              : snprintf(label, sizeof label, "<anonymous subclass of %.*s>", (int)(RSTRING_LEN(ancestor_name) > 200 ? 200 : RSTRING_LEN(ancestor_name)), RSTRING_PTR(ancestor_name));
  RB_GC_GUARD(ancestor_name);
  return strtab_intern(strings, label, (size_t)len);
}
