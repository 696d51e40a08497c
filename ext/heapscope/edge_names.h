#ifndef HEAPSCOPE_EDGE_NAMES_H
#define HEAPSCOPE_EDGE_NAMES_H

// edge_names: what a parent object holds a child by (instance variable, constant, class variable,
// Hash key, Array index, Struct member), for the hops of retention paths (retainers.c).
//
// Lifecycle: edge_names_new -> edge_names_want for every (parent, child) a path needs ->
// edge_names_resolve (each distinct parent is read ONCE, and only the wanted children are looked up,
// so a 3M-element Array costs one pass and no Ruby object per element) -> edge_names_get ->
// edge_names_free.
//
// NOTE: GVL held. Reading a parent calls no Ruby method of any object (C API only: RARRAY_AREF,
//       rb_hash_foreach, rb_struct_members, rb_ivar_foreach, rb_mod_const_at; an autoload constant is
//       never read) and never checks interrupts, so no other thread runs while a container is read:
//       none can see it mid-iteration (a Hash being iterated refuses new keys).
// NOTE: edge_names_resolve allocates Ruby objects only between parents (a module's constant list);
//       edge_names_get allocates the description it returns. Neither raises, except NoMemoryError.
//       VALUEs kept are the caller's (marked by it) or keys read from parents: edge_names_mark marks
//       them.

#include <ruby.h>
#include <stdbool.h>

typedef struct edge_names edge_names;

// NULL when memory is short.
edge_names *edge_names_new(void);
void edge_names_free(edge_names *en);
void edge_names_mark(const edge_names *en);

// Asks for the name of the edge parent -> child. False when memory is short (the edge stays unnamed).
bool edge_names_want(edge_names *en, VALUE parent, VALUE child);

// Reads each distinct parent wanted, calling between(data) before each: it may let other threads run
// (no container is being read then), and it stops the naming by returning false (the rest stay
// unnamed; edge_names_resolve returns false too).
bool edge_names_resolve(edge_names *en, bool (*between)(void *data), void *data);

// The edge parent -> child as Ruby will render it, or Qnil when unnamed: [:ivar, :@name],
// [:class_ivar, :@name], [:class_variable, :@@name], [:constant, module, :NAME], [:index, i],
// [:member, :name], [:value_at, key], [:key].
VALUE edge_names_get(const edge_names *en, VALUE parent, VALUE child);

#endif
