// names: the code and class names behind what the allocation hook captured.
//
// The hook may not allocate Ruby objects, and a frame's full name ("block in Foo#bar") is built as a
// new Ruby string. So the hook only turns each frame VALUE (an iseq or method entry from
// rb_profile_frames) into a small integer code id, and the names are read later, when a profile is
// built (names_resolve). The frame VALUEs are marked (pinned) for as long as the table lives: their
// names may be asked for at any later snapshot. Class names, on the other hand, are read in the hook:
// rb_mod_name returns the class's existing path string without allocating.
#ifndef HEAPSCOPE_NAMES_H
#define HEAPSCOPE_NAMES_H

#include <ruby.h>
#include <stdbool.h>
#include <stdint.h>

#include "strtab.h"

// Past this many distinct frame VALUEs (code generated at run time, eval), new ones share code id
// NAMES_OVERFLOW, named "(code table full)", instead of pinning more.
#define NAMES_MAX_CODES 1000000u
#define NAMES_OVERFLOW UINT32_MAX

typedef struct names names;

// A new, empty table, or NULL when memory is short.
names *names_new(void);
void names_free(names *n);
// Marks every frame VALUE held (from the owner's dmark).
void names_mark(const names *n);
size_t names_memory(const names *n);

// In the allocation hook (no Ruby allocation, no raise): the code id of frame, added if new.
// NAMES_OVERFLOW when the table is full; 0 when memory is short.
uint32_t names_code_id(names *n, VALUE frame);

// Outside the hooks (GVL held; allocates Ruby strings): reads the names of every code added since
// the last call into strings. Returns false when memory is short (the rest are tried next time).
bool names_resolve(names *n, strtab *strings);

// What a code id resolved to: function and file name ids, and whether it is a C function (no file
// and line of its own: profiles show it at its Ruby caller's line, as Ruby's backtraces do).
// Unresolved or overflow ids read as function "(unknown)"/"(code table full)" ids set up by
// names_resolve, file 0.
void names_code_info(const names *n, uint32_t code_id, uint32_t *function_id, uint32_t *file_id, bool *is_c_function);

// In the allocation hook (no Ruby allocation): the string id of obj's class name: "String",
// "Foo::Bar", "<anonymous subclass of Parent>", or "<hidden>" for VM-internal objects without a
// class. (A metaclass is labelled "Class": it is marked singleton only after its allocation.) STRTAB_ERROR when memory is short.
uint32_t names_class_id(strtab *strings, VALUE obj);

#endif
