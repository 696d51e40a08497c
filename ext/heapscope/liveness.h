// liveness: what the GC knows about an object, on every Ruby heapscope builds on.
//
// The recorder asks two questions of the GC, and each Ruby answers them through different exported
// functions (probed by extconf.rb with have_func, never by version number):
//
//   "Did this GC mark obj?"  (at GC_END_MARK, before sweeping)
//       rb_objspace_marked_object_p  Ruby 3.1-3.3 (ext/objspace's heap dump uses it)
//       rb_obj_gc_flags              Ruby 3.4: the flags ObjectSpace.dump prints, "marked" among them
//       rb_gc_object_metadata        Ruby 4.0+: the same flags as {name, value} entries
//   "Is this address a slot of a live heap page?"  (outside the GC, after a GC we did not see)
//       rb_objspace_each_objects     every Ruby: yields each heap page's slot range
//
// NOTE: liveness_init runs once, outside the GC: the flag readers intern their names on first use
//       (which allocates), so it makes that first call itself. Everything else never allocates Ruby
//       objects and never raises.
#ifndef HEAPSCOPE_LIVENESS_H
#define HEAPSCOPE_LIVENESS_H

#include <ruby.h>
#include <stdbool.h>
#include <stddef.h>

// Prepares the mark-bit reader. Returns NULL when liveness works here, else why not (a static string:
// no mechanism exported, or a GC other than Ruby's default, such as MMTk, which exposes no mark bits).
const char *liveness_init(void);

// The name of the function this build reads mark bits with ("rb_objspace_marked_object_p", ...).
const char *liveness_mechanism(void);

// Inside the GC at GC_END_MARK: whether the GC marked obj. obj must be an object on a live heap page
// (a record that was valid when this GC started); anything else may crash.
bool liveness_marked(VALUE obj);

// The slot ranges of the heap's live pages, sorted by address, for checking addresses that may point
// into pages a GC has since freed. Owned by the caller (liveness_pages_free).
typedef struct liveness_pages liveness_pages;

// Outside the GC only (it walks the heap's page list). NULL when memory is short.
liveness_pages *liveness_pages_collect(void);
void liveness_pages_free(liveness_pages *pages);
// Whether obj is the start of a slot on one of the pages: only then may its header be read.
// Reads no memory of obj's.
bool liveness_pages_has_slot(const liveness_pages *pages, VALUE obj);

#endif
