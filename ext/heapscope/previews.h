#ifndef HEAPSCOPE_PREVIEWS_H
#define HEAPSCOPE_PREVIEWS_H

// previews: what a site's sampled live objects hold, shown as plain data (lib/heapscope/examples.rb
// renders it). For each of the site's oldest sampled objects: class, builtin type, size (memsize),
// age (GCs survived) and a bounded rendering of its kind: a String's byte size, encoding and (with
// consent) first 64 bytes; an Array's length and its first elements' classes; a Hash's size, its first
// pairs' key and value classes and (with consent) its first keys; an object's instance variable names.
//
// NOTE: GVL held, outside the GC. No method of any application object runs: objects are read with the
//       C API only (RSTRING_PTR, RARRAY_AREF, rb_hash_foreach, rb_ivar_foreach, rb_mod_name on the real
//       class) and no interrupt is checked while a container is read, so no other thread sees it
//       mid-iteration. Every read is bounded (bytes, elements, pairs, names), whatever the object's size.
// NOTE: the site's objects are picked with recorder_each_object into malloc'd arrays (no Ruby object is
//       made during that walk); a hidden holder object made before it marks and pins them, and the
//       classes and keys collected while a container is read, until the result is built.
// NOTE: the result holds no application object: only Strings, Integers, Symbols, Arrays and Hashes
//       made here. Contents (String bytes, Hash keys) are copied only when asked (the operator's
//       consent, decided in Ruby). Raises only RuntimeError (not running) and NoMemoryError.

#include <ruby.h>

// Defines Heapscope::Native._examples(file, line, max_objects, contents) under mNative.
void previews_define(VALUE mNative);

#endif
