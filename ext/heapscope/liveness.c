// Mark bits and heap pages through whatever this Ruby exports (liveness.h has the map per version).
#include "liveness.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// All are exported by libruby but declared only in its internal headers.
#if defined(HAVE_RB_OBJSPACE_MARKED_OBJECT_P)
int rb_objspace_marked_object_p(VALUE obj);
#elif defined(HAVE_RB_OBJ_GC_FLAGS)
size_t rb_obj_gc_flags(VALUE obj, ID *flags, size_t max);
#elif defined(HAVE_RB_GC_OBJECT_METADATA)
struct rb_gc_object_metadata_entry {
  ID name;
  VALUE val;
};
struct rb_gc_object_metadata_entry *rb_gc_object_metadata(VALUE obj);
#endif
#ifdef HAVE_RB_GC_ACTIVE_GC_NAME
const char *rb_gc_active_gc_name(void);
#endif
void rb_objspace_each_objects(int (*callback)(void *start, void *end, size_t stride, void *data), void *data);

#if !defined(HAVE_RB_OBJSPACE_MARKED_OBJECT_P)
static ID id_marked; // the flag's name, interned by liveness_init (outside the GC)
#endif

const char *liveness_init(void) {
#ifdef HAVE_RB_GC_ACTIVE_GC_NAME
  // Ruby 3.4+ can load another collector (RUBY_GC_LIBRARY, e.g. MMTk): it has no mark bits to read and
  // no GC_END_MARK, so liveness cannot work there.
  const char *gc = rb_gc_active_gc_name();
  if (gc != NULL && strcmp(gc, "default") != 0) return "this process runs a GC other than Ruby's default one";
#endif
#if defined(HAVE_RB_OBJSPACE_MARKED_OBJECT_P)
  return NULL;
#elif defined(HAVE_RB_OBJ_GC_FLAGS) || defined(HAVE_RB_GC_OBJECT_METADATA)
  id_marked = rb_intern("marked");
  // The first call interns the reader's own flag names (allocating): here, never inside the GC.
  VALUE probe = rb_obj_alloc(rb_cObject);
#if defined(HAVE_RB_OBJ_GC_FLAGS)
  ID flags[8];
  (void)rb_obj_gc_flags(probe, flags, 8);
#else
  (void)rb_gc_object_metadata(probe);
#endif
  RB_GC_GUARD(probe);
  return NULL;
#else
  return "this Ruby exports none of the GC functions heapscope reads mark bits with";
#endif
}

const char *liveness_mechanism(void) {
#if defined(HAVE_RB_OBJSPACE_MARKED_OBJECT_P)
  return "rb_objspace_marked_object_p";
#elif defined(HAVE_RB_OBJ_GC_FLAGS)
  return "rb_obj_gc_flags";
#elif defined(HAVE_RB_GC_OBJECT_METADATA)
  return "rb_gc_object_metadata";
#else
  return "none";
#endif
}

bool liveness_marked(VALUE obj) {
#if defined(HAVE_RB_OBJSPACE_MARKED_OBJECT_P)
  return rb_objspace_marked_object_p(obj) != 0;
#elif defined(HAVE_RB_OBJ_GC_FLAGS)
  ID flags[8];
  size_t n = rb_obj_gc_flags(obj, flags, 8);
  for (size_t i = 0; i < n; i++) {
    if (flags[i] == id_marked) return true;
  }
  return false;
#elif defined(HAVE_RB_GC_OBJECT_METADATA)
  for (const struct rb_gc_object_metadata_entry *e = rb_gc_object_metadata(obj); e->name != 0; e++) {
    if (e->name == id_marked) return RTEST(e->val);
  }
  return false;
#else
  (void)obj;
  return true; // unreachable: liveness_init refused to start
#endif
}

// ---- Heap pages ----

typedef struct {
  uintptr_t start, end; // [start, end): the page's slots
  size_t stride;        // slot size
} page_range;

struct liveness_pages {
  page_range *ranges;
  size_t count, capacity;
  bool failed; // memory ran short while collecting
};

static int collect_page(void *start, void *end, size_t stride, void *data) {
  liveness_pages *pages = data;
  if (pages->count == pages->capacity) {
    size_t grown = pages->capacity ? pages->capacity * 2 : 256;
    page_range *bigger = realloc(pages->ranges, grown * sizeof *bigger);
    if (bigger == NULL) {
      pages->failed = true;
      return 1; // stop the walk
    }
    pages->ranges = bigger;
    pages->capacity = grown;
  }
  pages->ranges[pages->count++] = (page_range){(uintptr_t)start, (uintptr_t)end, stride};
  return 0;
}

static int compare_ranges(const void *a, const void *b) {
  uintptr_t x = ((const page_range *)a)->start, y = ((const page_range *)b)->start;
  return x < y ? -1 : x > y;
}

liveness_pages *liveness_pages_collect(void) {
  liveness_pages *pages = calloc(1, sizeof *pages);
  if (pages == NULL) return NULL;
  rb_objspace_each_objects(collect_page, pages);
  if (pages->failed) {
    liveness_pages_free(pages);
    return NULL;
  }
  // Pages of different slot sizes come in separate runs (Ruby 3.2+): one order for the binary search.
  qsort(pages->ranges, pages->count, sizeof *pages->ranges, compare_ranges);
  return pages;
}

void liveness_pages_free(liveness_pages *pages) {
  if (pages == NULL) return;
  free(pages->ranges);
  free(pages);
}

bool liveness_pages_has_slot(const liveness_pages *pages, VALUE obj) {
  uintptr_t p = (uintptr_t)obj;
  size_t lo = 0, hi = pages->count; // the last range starting at or below p, if any
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (pages->ranges[mid].start <= p) lo = mid + 1;
    else hi = mid;
  }
  if (lo == 0) return false;
  const page_range *range = &pages->ranges[lo - 1];
  return p < range->end && range->stride != 0 && (p - range->start) % range->stride == 0;
}
