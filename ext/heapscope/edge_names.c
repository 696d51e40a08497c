#include "edge_names.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// Design: the paths of one retainers walk need at most a few tens of thousands of edges, but their
// parents can be huge (a cache Hash, a 3M-element Array). Each wanted edge (parent, child) goes in an
// open-addressing table; then every distinct parent is read once, in C, and each thing it holds is
// looked up in that table. Only what a wanted edge needs is kept (an index, an ID, a Hash key); Ruby
// objects for the names are made afterwards, when no container is being read.

typedef enum {
  EDGE_NONE = 0,
  EDGE_IVAR,
  EDGE_CLASS_IVAR,
  EDGE_CLASS_VARIABLE,
  EDGE_CONSTANT,
  EDGE_INDEX,
  EDGE_MEMBER,
  EDGE_VALUE_AT,
  EDGE_KEY,
} edge_kind;

typedef struct {
  VALUE parent, child;
  VALUE key;   // EDGE_VALUE_AT: the Hash key that holds child
  long index;  // EDGE_INDEX
  ID id;       // EDGE_IVAR, EDGE_CLASS_IVAR, EDGE_CLASS_VARIABLE, EDGE_CONSTANT, EDGE_MEMBER
  edge_kind kind;
} wanted_edge;

struct edge_names {
  wanted_edge *edges;
  size_t count, capacity;
  uint32_t *slots; // (parent, child) -> edge index + 1, 0 = empty
  size_t mask;
  // Distinct parents in the order first wanted, with how many of their edges are still unnamed.
  VALUE *parents;
  uint32_t *unnamed;
  size_t parent_count, parent_capacity;
  uint32_t *parent_slots; // parent -> index + 1
  size_t parent_mask;
};

static size_t hash_pair(VALUE a, VALUE b) {
  uint64_t x = ((uint64_t)a >> 3) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)b >> 3) * 0xC2B2AE3D27D4EB4Full;
  return (size_t)(x ^ (x >> 29));
}

static size_t edge_slot(const edge_names *en, VALUE parent, VALUE child) {
  size_t i = hash_pair(parent, child) & en->mask;
  while (en->slots[i] != 0) {
    const wanted_edge *e = &en->edges[en->slots[i] - 1];
    if (e->parent == parent && e->child == child) break;
    i = (i + 1) & en->mask;
  }
  return i;
}

static size_t parent_slot(const edge_names *en, VALUE parent) {
  size_t i = hash_pair(parent, 0) & en->parent_mask;
  while (en->parent_slots[i] != 0 && en->parents[en->parent_slots[i] - 1] != parent) i = (i + 1) & en->parent_mask;
  return i;
}

edge_names *edge_names_new(void) {
  edge_names *en = calloc(1, sizeof(edge_names));
  if (en == NULL) return NULL;
  en->capacity = en->parent_capacity = 64;
  en->mask = en->parent_mask = 128 - 1;
  en->edges = malloc(en->capacity * sizeof(wanted_edge));
  en->slots = calloc(en->mask + 1, sizeof(uint32_t));
  en->parents = malloc(en->parent_capacity * sizeof(VALUE));
  en->unnamed = malloc(en->parent_capacity * sizeof(uint32_t));
  en->parent_slots = calloc(en->parent_mask + 1, sizeof(uint32_t));
  if (!en->edges || !en->slots || !en->parents || !en->unnamed || !en->parent_slots) {
    edge_names_free(en);
    return NULL;
  }
  return en;
}

void edge_names_free(edge_names *en) {
  if (en == NULL) return;
  free(en->edges);
  free(en->slots);
  free(en->parents);
  free(en->unnamed);
  free(en->parent_slots);
  free(en);
}

void edge_names_mark(const edge_names *en) {
  if (en == NULL) return;
  for (size_t i = 0; i < en->count; i++) {
    rb_gc_mark(en->edges[i].parent);
    rb_gc_mark(en->edges[i].child);
    rb_gc_mark(en->edges[i].key);
  }
}

// Both tables stay under half full; growing rehashes. False when memory is short (tables unchanged).
static bool grow_edges(edge_names *en) {
  if (en->count == en->capacity) {
    wanted_edge *edges = realloc(en->edges, en->capacity * 2 * sizeof(wanted_edge));
    if (edges == NULL) return false;
    en->edges = edges;
    en->capacity *= 2;
  }
  if ((en->count + 1) * 2 > en->mask + 1) {
    size_t size = (en->mask + 1) * 2;
    uint32_t *slots = calloc(size, sizeof(uint32_t));
    if (slots == NULL) return false;
    free(en->slots);
    en->slots = slots;
    en->mask = size - 1;
    for (size_t n = 0; n < en->count; n++) en->slots[edge_slot(en, en->edges[n].parent, en->edges[n].child)] = (uint32_t)n + 1;
  }
  return true;
}

static bool grow_parents(edge_names *en) {
  if (en->parent_count == en->parent_capacity) {
    size_t capacity = en->parent_capacity * 2;
    VALUE *parents = realloc(en->parents, capacity * sizeof(VALUE));
    if (parents == NULL) return false;
    en->parents = parents;
    uint32_t *unnamed = realloc(en->unnamed, capacity * sizeof(uint32_t));
    if (unnamed == NULL) return false;
    en->unnamed = unnamed;
    en->parent_capacity = capacity;
  }
  if ((en->parent_count + 1) * 2 > en->parent_mask + 1) {
    size_t size = (en->parent_mask + 1) * 2;
    uint32_t *slots = calloc(size, sizeof(uint32_t));
    if (slots == NULL) return false;
    free(en->parent_slots);
    en->parent_slots = slots;
    en->parent_mask = size - 1;
    for (size_t n = 0; n < en->parent_count; n++) en->parent_slots[parent_slot(en, en->parents[n])] = (uint32_t)n + 1;
  }
  return true;
}

bool edge_names_want(edge_names *en, VALUE parent, VALUE child) {
  if (en->slots[edge_slot(en, parent, child)] != 0) return true;
  if (!grow_edges(en) || !grow_parents(en)) return false;
  size_t p = parent_slot(en, parent);
  if (en->parent_slots[p] == 0) {
    en->parents[en->parent_count] = parent;
    en->unnamed[en->parent_count] = 0;
    en->parent_slots[p] = (uint32_t)++en->parent_count;
  }
  en->unnamed[en->parent_slots[p] - 1]++;
  wanted_edge *e = &en->edges[en->count];
  memset(e, 0, sizeof(*e));
  e->parent = parent;
  e->child = child;
  e->key = Qnil;
  en->slots[edge_slot(en, parent, child)] = (uint32_t)++en->count;
  return true;
}

// ---- Reading one parent ----

typedef struct {
  edge_names *en;
  VALUE parent;
  uint32_t *unnamed; // the parent's count of edges still unnamed
  bool is_module;
} reader;

// Names the edge parent -> child by what was just read, unless it is not wanted or already named
// (the first name found wins: the lowest index, the first key in the Hash's order).
static void found(reader *r, VALUE child, edge_kind kind, VALUE key, long index, ID id) {
  if (RB_SPECIAL_CONST_P(child) || *r->unnamed == 0) return;
  uint32_t slot = r->en->slots[edge_slot(r->en, r->parent, child)];
  if (slot == 0) return;
  wanted_edge *e = &r->en->edges[slot - 1];
  if (e->kind != EDGE_NONE) return;
  e->kind = kind;
  e->key = key;
  e->index = index;
  e->id = id;
  (*r->unnamed)--;
}

static int on_hash_pair(VALUE key, VALUE value, VALUE data) {
  reader *r = (reader *)data;
  found(r, value, EDGE_VALUE_AT, key, 0, 0);
  found(r, key, EDGE_KEY, Qnil, 0, 0);
  return *r->unnamed == 0 ? ST_STOP : ST_CONTINUE;
}

static int on_ivar(ID id, VALUE value, st_data_t data) {
  reader *r = (reader *)data;
  // Only variables a program can name ("@x", "@@x"): the VM keeps hidden ones (no "@") on some objects.
  VALUE name = rb_id2str(id);
  if (name == 0 || RSTRING_LEN(name) < 2 || RSTRING_PTR(name)[0] != '@') return ST_CONTINUE;
  edge_kind kind = !r->is_module ? EDGE_IVAR : RSTRING_PTR(name)[1] == '@' ? EDGE_CLASS_VARIABLE : EDGE_CLASS_IVAR;
  found(r, value, kind, Qnil, 0, id);
  return *r->unnamed == 0 ? ST_STOP : ST_CONTINUE;
}

static void read_array(reader *r) {
  // RARRAY_AREF reads in place (on 3.1 it leaves an Array on the transient heap where it is).
  for (long i = 0; i < RARRAY_LEN(r->parent) && *r->unnamed > 0; i++) found(r, RARRAY_AREF(r->parent, i), EDGE_INDEX, Qnil, i, 0);
}

// rb_struct_members and RSTRUCT_GET (rb_struct_aref) are Struct's C functions, not its methods: a
// subclass's #members or #[] is not run. (They raise only for a Struct whose class lost its members.)
static VALUE read_struct_members(VALUE data) {
  reader *r = (reader *)data;
  VALUE members = rb_struct_members(r->parent);
  long n = RSTRUCT_LEN(r->parent);
  for (long i = 0; i < n && i < RARRAY_LEN(members) && *r->unnamed > 0; i++) {
    VALUE member = RARRAY_AREF(members, i);
    if (RB_SYMBOL_P(member)) found(r, RSTRUCT_GET(r->parent, (int)i), EDGE_MEMBER, Qnil, 0, SYM2ID(member));
  }
  return Qnil;
}

// ($! is put back as it was: a walk run from a rescue clause must not clear the application's.)
static void read_struct(reader *r) {
  VALUE errinfo = rb_errinfo();
  int state = 0;
  rb_protect(read_struct_members, (VALUE)r, &state);
  if (state) rb_set_errinfo(errinfo);
}

// A module's constants, autoloads left alone (rb_autoload_p says which; reading one would load it).
static VALUE read_constant_list(VALUE data) {
  reader *r = (reader *)data;
  VALUE names = rb_const_list(rb_mod_const_at(r->parent, 0));
  for (long i = 0; i < RARRAY_LEN(names) && *r->unnamed > 0; i++) {
    ID id = SYM2ID(RARRAY_AREF(names, i));
    if (!NIL_P(rb_autoload_p(r->parent, id)) || !rb_const_defined_at(r->parent, id)) continue;
    found(r, rb_const_get_at(r->parent, id), EDGE_CONSTANT, Qnil, 0, id);
  }
  RB_GC_GUARD(names);
  return Qnil;
}

// Reading a deprecated constant warns through Warning.warn (a method the application may define):
// ruby_verbose is nil meanwhile, which silences it.
static void read_constants(reader *r) {
  VALUE verbose = ruby_verbose, errinfo = rb_errinfo();
  ruby_verbose = Qnil;
  int state = 0;
  rb_protect(read_constant_list, (VALUE)r, &state);
  ruby_verbose = verbose;
  if (state) rb_set_errinfo(errinfo); // (none expected: the constants left then stay unnamed)
}

static void read_parent(edge_names *en, size_t p) {
  reader r = {en, en->parents[p], &en->unnamed[p], false};
  VALUE parent = r.parent;
  if (RB_SPECIAL_CONST_P(parent)) return;
  switch (RB_BUILTIN_TYPE(parent)) {
    case RUBY_T_ARRAY: read_array(&r); break;
    case RUBY_T_HASH: rb_hash_foreach(parent, on_hash_pair, (VALUE)&r); break;
    case RUBY_T_STRUCT: read_struct(&r); break;
    case RUBY_T_CLASS: case RUBY_T_MODULE:
      r.is_module = true;
      read_constants(&r);
      break;
    default: break;
  }
  if (*r.unnamed > 0) rb_ivar_foreach(parent, on_ivar, (st_data_t)&r);
}

bool edge_names_resolve(edge_names *en, bool (*between)(void *data), void *data) {
  for (size_t p = 0; p < en->parent_count; p++) {
    if (!between(data)) return false;
    read_parent(en, p);
  }
  return true;
}

VALUE edge_names_get(const edge_names *en, VALUE parent, VALUE child) {
  uint32_t slot = en->slots[edge_slot(en, parent, child)];
  if (slot == 0) return Qnil;
  const wanted_edge *e = &en->edges[slot - 1];
  switch (e->kind) {
    case EDGE_IVAR: return rb_ary_new_from_args(2, ID2SYM(rb_intern("ivar")), ID2SYM(e->id));
    case EDGE_CLASS_IVAR: return rb_ary_new_from_args(2, ID2SYM(rb_intern("class_ivar")), ID2SYM(e->id));
    case EDGE_CLASS_VARIABLE: return rb_ary_new_from_args(2, ID2SYM(rb_intern("class_variable")), ID2SYM(e->id));
    case EDGE_CONSTANT: return rb_ary_new_from_args(3, ID2SYM(rb_intern("constant")), e->parent, ID2SYM(e->id));
    case EDGE_INDEX: return rb_ary_new_from_args(2, ID2SYM(rb_intern("index")), LONG2NUM(e->index));
    case EDGE_MEMBER: return rb_ary_new_from_args(2, ID2SYM(rb_intern("member")), ID2SYM(e->id));
    case EDGE_VALUE_AT: return rb_ary_new_from_args(2, ID2SYM(rb_intern("value_at")), e->key);
    case EDGE_KEY: return rb_ary_new_from_args(1, ID2SYM(rb_intern("key")));
    default: return Qnil;
  }
}
