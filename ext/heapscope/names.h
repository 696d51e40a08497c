// names: turns what the allocation hook captured (frame VALUEs, line numbers, an object's class) into
// interned ids: function and file names in the recorder's strtab, frames and stacks in its stacktab.
//
// Resolving a frame's name allocates Ruby strings, so it happens only in capture's postponed commit,
// never in the allocation hook. Each frame VALUE is resolved once and cached; the cache marks its
// frame VALUEs (pinned), because their names are read again whenever the same frame shows up.
//
// NOTE: GVL held; may allocate Ruby objects (and so trigger a GC); never raises.
#ifndef HEAPSCOPE_NAMES_H
#define HEAPSCOPE_NAMES_H

#include <ruby.h>
#include <stdbool.h>
#include <stdint.h>

#include "stacktab.h"
#include "strtab.h"

typedef struct names names;

// A new, empty cache, or NULL when memory is short.
names *names_new(void);
void names_free(names *n);
// Marks the cached frame VALUEs (from the owner's dmark).
void names_mark(const names *n);
size_t names_memory(const names *n);

// Resolves frames[0..count) (leaf first, as rb_profile_frames returns them, with their lines) into
// frame ids in out[0..count). C frames take the file and line of the Ruby code that called them, as
// Ruby's own backtraces show them. When omitted > 0 a last frame named "<omitted> frames omitted" is
// appended (out needs count + 1 slots). Ruby frames that have not started (line 0, such as a script's
// outer <main>) are left out, as Ruby's backtraces do. Returns the number of ids written, or
// NAMES_FAILED when memory is short.
#define NAMES_FAILED UINT32_MAX
uint32_t names_resolve_frames(names *n, strtab *strings, stacktab *stacks, const VALUE *frames, const int *lines,
                              uint32_t count, uint32_t omitted, uint32_t *out);

// The string id of obj's class name: "String", "Foo::Bar", "<anonymous subclass of Parent>", or
// "<hidden>" for VM-internal objects without a class. STRTAB_ERROR when memory is short.
uint32_t names_class_id(strtab *strings, VALUE obj);

#endif
