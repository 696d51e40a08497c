#include "names.h"

#include <ruby/debug.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idindex.h"

typedef struct {
  VALUE frame;          // pinned by names_mark
  uint32_t function_id; // strtab ids, valid once resolved
  uint32_t file_id;
  bool is_c_function;
} code_entry;

struct names {
  code_entry *codes; // codes[id - 1]
  uint32_t count, capacity;
  uint32_t resolved;  // codes[0..resolved) have names
  uint32_t unknown_id, overflow_id; // strtab ids of the placeholder names
  idindex index;
};

names *names_new(void) {
  names *n = calloc(1, sizeof(names));
  if (n == NULL) return NULL;
  if (!idindex_init(&n->index, 1024)) {
    free(n);
    return NULL;
  }
  return n;
}

void names_free(names *n) {
  if (n == NULL) return;
  free(n->codes);
  idindex_free(&n->index);
  free(n);
}

void names_mark(const names *n) {
  if (n == NULL) return;
  for (uint32_t i = 0; i < n->count; i++) rb_gc_mark(n->codes[i].frame);
}

size_t names_memory(const names *n) {
  return n ? sizeof(names) + sizeof(code_entry) * n->capacity + idindex_memory(&n->index) : 0;
}

static bool frame_equals(const void *ctx, uint32_t id, const void *key) {
  const names *n = ctx;
  return n->codes[id - 1].frame == *(const VALUE *)key;
}

uint32_t names_code_id(names *n, VALUE frame) {
  uint32_t hash = idindex_hash_bytes(&frame, sizeof frame);
  uint32_t id = idindex_find(&n->index, hash, frame_equals, n, &frame);
  if (id != IDINDEX_NONE) return id;
  if (n->count >= NAMES_MAX_CODES) return NAMES_OVERFLOW;
  if (n->count == n->capacity) {
    uint32_t capacity = n->capacity ? n->capacity * 2 : 1024;
    code_entry *codes = realloc(n->codes, sizeof(code_entry) * capacity);
    if (codes == NULL) return 0;
    n->codes = codes;
    n->capacity = capacity;
  }
  id = n->count + 1;
  if (!idindex_insert(&n->index, hash, id)) return 0;
  n->codes[id - 1] = (code_entry){.frame = frame};
  n->count++;
  return id;
}

static uint32_t intern_value(strtab *strings, VALUE str) {
  if (!RB_TYPE_P(str, T_STRING)) return 0;
  return strtab_intern(strings, RSTRING_PTR(str), (size_t)RSTRING_LEN(str));
}

bool names_resolve(names *n, strtab *strings) {
  if (n->unknown_id == 0) {
    n->unknown_id = strtab_intern(strings, "(unknown)", 9);
    n->overflow_id = strtab_intern(strings, "(code table full)", 17);
    if (n->unknown_id == STRTAB_ERROR || n->overflow_id == STRTAB_ERROR) {
      n->unknown_id = 0;
      return false;
    }
  }
  for (; n->resolved < n->count; n->resolved++) {
    code_entry *code = &n->codes[n->resolved];
    VALUE label = rb_profile_frame_full_label(code->frame);
    // C functions have no path (their absolute_path is a placeholder such as "<cfunc>").
    VALUE path = rb_profile_frame_path(code->frame);
    VALUE absolute_path = NIL_P(path) ? Qnil : rb_profile_frame_absolute_path(code->frame);
    uint32_t function_id = intern_value(strings, label);
    uint32_t file_id = intern_value(strings, NIL_P(absolute_path) ? path : absolute_path);
    RB_GC_GUARD(label);
    RB_GC_GUARD(path);
    RB_GC_GUARD(absolute_path);
    if (function_id == STRTAB_ERROR || file_id == STRTAB_ERROR) return false;
    // n->codes may have moved if a GC ran the allocation hook meanwhile: index again.
    code = &n->codes[n->resolved];
    code->function_id = function_id ? function_id : n->unknown_id;
    code->file_id = file_id;
    code->is_c_function = NIL_P(path);
  }
  return true;
}

void names_code_info(const names *n, uint32_t code_id, uint32_t *function_id, uint32_t *file_id, bool *is_c_function) {
  *file_id = 0;
  *is_c_function = false;
  if (code_id == NAMES_OVERFLOW) {
    *function_id = n->overflow_id;
  } else if (code_id == 0 || code_id > n->resolved) {
    *function_id = n->unknown_id;
  } else {
    const code_entry *code = &n->codes[code_id - 1];
    *function_id = code->function_id;
    *file_id = code->file_id;
    *is_c_function = code->is_c_function;
  }
}

uint32_t names_class_id(strtab *strings, VALUE obj) {
  VALUE klass = rb_class_real(RBASIC_CLASS(obj));
  if (klass == 0) return strtab_intern(strings, "<hidden>", 8);
  VALUE name = rb_mod_name(klass);
  if (!NIL_P(name)) return intern_value(strings, name);

  // An anonymous class: name it after its nearest named ancestor, so its objects aggregate.
  // (rb_class_get_superclass, unlike rb_class_superclass, never raises; it also walks through the
  // include classes of modules, which are skipped.)
  VALUE ancestor = klass;
  VALUE ancestor_name = Qnil;
  while (NIL_P(ancestor_name)) {
    ancestor = rb_class_get_superclass(ancestor);
    if (ancestor == 0 || NIL_P(ancestor)) break;
    if (RB_TYPE_P(ancestor, T_CLASS)) ancestor_name = rb_mod_name(ancestor);
  }
  char label[256];
  int len = NIL_P(ancestor_name)
              ? snprintf(label, sizeof label, "<anonymous class>")
              : snprintf(label, sizeof label, "<anonymous subclass of %.*s>",
                         (int)(RSTRING_LEN(ancestor_name) > 200 ? 200 : RSTRING_LEN(ancestor_name)), RSTRING_PTR(ancestor_name));
  return strtab_intern(strings, label, (size_t)len);
}
