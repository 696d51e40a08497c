#include "previews.h"

#include <ruby/encoding.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture.h"
#include "names.h"
#include "recorder.h"
#include "site_match.h"

// Design: two phases, because the first may not allocate and the second must.
// 1. Pick: recorder_each_object visits the records (a GC there could drop records mid-walk, so no Ruby
//    object is made); the site's objects go into malloc'd arrays, the `capacity` oldest kept (the
//    longest survivors are what a leak hunt wants to see).
// 2. Render: each object is read with the C API into a Hash of plain data. Records hold objects weakly,
//    and making the result allocates (so may run a GC, even a compaction): the holder, a hidden
//    TypedData made before phase 1, marks and pins the picked objects, and the classes and keys a
//    container's reading collected, until the result is built.
// Nothing here looks an object up through its methods: a class that overrides inspect, to_s, hash,
// ==, method_missing or respond_to? is read like any other.

// Exported by gc.c (ext/objspace's memsize_of); census.c and recorder.c declare it too.
size_t rb_obj_memsize_of(VALUE obj);

enum {
  HEAD_BYTES = 64,    // a String's first bytes shown (with consent)
  KEY_BYTES = 40,     // a String or Symbol key's first bytes shown (retainers' KEY_PREVIEW)
  SCAN_LIMIT = 10000, // elements, pairs or instance variables of one object read, at most
  TALLY_CLASSES = 32, // distinct classes counted per container; more are counted as "other"
  TOP_CLASSES = 5,    // classes listed per container
  SHOWN_KEYS = 5,     // keys shown per Hash (with consent)
  KEY_ELEMENTS = 5,   // elements shown of an Array key (retainers' KEY_ELEMENTS)
  SHOWN_IVARS = 16,   // instance variable names listed per object
  NAME_BYTES = 200,   // the longest class or variable name shown (names.c bounds labels alike)
  MAX_OBJECTS = 100,  // the most examples one call renders
};

typedef struct {
  VALUE classes[TALLY_CLASSES];
  uint64_t counts[TALLY_CLASSES];
  size_t used;
  uint64_t other;
} class_tally;

typedef struct {
  site_match site;
  uint32_t gc_now;
  VALUE *objs;     // the site's oldest sampled objects met so far, oldest first
  uint32_t *ages;  // GCs each survived
  size_t count, capacity;
  uint64_t matched; // the site's sampled objects in all
  bool contents;    // copy String bytes and Hash keys (the operator's consent)
  // What the object being rendered holds; reset for each object.
  class_tally first, second; // an Array's elements; a Hash's keys and values
  VALUE keys[SHOWN_KEYS];
  size_t key_count;
  ID ivars[SHOWN_IVARS];
  size_t ivar_count, ivar_total;
  long scanned;
} previews_job;

// ---- Phase 1: pick (no Ruby allocation) ----

static bool pick(VALUE obj, uint32_t stack_id, uint32_t alloc_gc, void *data) {
  previews_job *job = data;
  // (VM-internal objects have no class: they never reach Ruby.)
  if (RBASIC_CLASS(obj) == 0 || !site_match_stack(&job->site, stack_id)) return true;
  job->matched++;
  uint32_t age = job->gc_now - alloc_gc;
  // Insertion into the sorted few (capacity is at most MAX_OBJECTS); equal ages keep the first met.
  size_t at = job->count;
  while (at > 0 && job->ages[at - 1] < age) at--;
  if (at >= job->capacity) return true;
  size_t end = job->count < job->capacity ? job->count : job->capacity - 1;
  memmove(&job->objs[at + 1], &job->objs[at], (end - at) * sizeof(VALUE));
  memmove(&job->ages[at + 1], &job->ages[at], (end - at) * sizeof(uint32_t));
  job->objs[at] = obj;
  job->ages[at] = age;
  if (job->count < job->capacity) job->count++;
  return true;
}

// ---- Reading containers (no Ruby allocation, no interrupt check) ----

static VALUE real_class_of(VALUE v) {
  VALUE klass = RB_SPECIAL_CONST_P(v) ? rb_class_of(v) : RBASIC_CLASS(v);
  return klass == 0 ? 0 : rb_class_real(klass);
}

static void tally(class_tally *t, VALUE v) {
  VALUE klass = real_class_of(v);
  for (size_t i = 0; i < t->used; i++) {
    if (t->classes[i] == klass) {
      t->counts[i]++;
      return;
    }
  }
  if (t->used == TALLY_CLASSES) {
    t->other++;
    return;
  }
  t->classes[t->used] = klass;
  t->counts[t->used++] = 1;
}

static int on_pair(VALUE key, VALUE value, VALUE data) {
  previews_job *job = (previews_job *)data;
  tally(&job->first, key);
  tally(&job->second, value);
  if (job->contents && job->key_count < SHOWN_KEYS) job->keys[job->key_count++] = key;
  return ++job->scanned < SCAN_LIMIT ? ST_CONTINUE : ST_STOP;
}

static int on_ivar(ID id, VALUE value, st_data_t data) {
  (void)value;
  previews_job *job = (previews_job *)data;
  // Only variables a program can name: the VM keeps hidden ones (no "@") on some objects.
  VALUE name = rb_id2str(id);
  if (name == 0 || RSTRING_LEN(name) < 2 || RSTRING_PTR(name)[0] != '@') return ST_CONTINUE;
  if (job->ivar_count < SHOWN_IVARS) job->ivars[job->ivar_count++] = id;
  return ++job->ivar_total < SCAN_LIMIT ? ST_CONTINUE : ST_STOP;
}

// ---- Phase 2: render (allocates; everything read is pinned by the holder) ----

static VALUE bounded_copy(VALUE str, long max) {
  long len = RSTRING_LEN(str);
  return rb_enc_str_new(RSTRING_PTR(str), len < max ? len : max, rb_enc_get(str));
}

// A class's name, or its nearest named ancestor's (as names_class_id labels samples).
static VALUE class_name(VALUE klass) {
  if (klass == 0) return rb_str_new_cstr("<hidden>");
  VALUE name = rb_mod_name(klass);
  if (!NIL_P(name)) return bounded_copy(name, NAME_BYTES);
  VALUE ancestor = klass;
  while (NIL_P(name)) {
    ancestor = rb_class_get_superclass(ancestor);
    if (ancestor == 0 || NIL_P(ancestor)) return rb_str_new_cstr("<anonymous class>");
    if (RB_TYPE_P(ancestor, T_CLASS)) name = rb_mod_name(ancestor);
  }
  VALUE text = rb_str_new_cstr("<anonymous subclass of ");
  rb_str_append(text, bounded_copy(name, NAME_BYTES));
  return rb_str_cat_cstr(text, ">");
}

static const char *type_name(VALUE obj) {
  switch (RB_BUILTIN_TYPE(obj)) {
    case RUBY_T_OBJECT: return "object";
    case RUBY_T_CLASS: return "class";
    case RUBY_T_MODULE: return "module";
    case RUBY_T_FLOAT: return "float";
    case RUBY_T_STRING: return "string";
    case RUBY_T_REGEXP: return "regexp";
    case RUBY_T_ARRAY: return "array";
    case RUBY_T_HASH: return "hash";
    case RUBY_T_STRUCT: return "struct";
    case RUBY_T_BIGNUM: return "bignum";
    case RUBY_T_FILE: return "file";
    case RUBY_T_DATA: return "data";
    case RUBY_T_MATCH: return "match";
    case RUBY_T_COMPLEX: return "complex";
    case RUBY_T_RATIONAL: return "rational";
    case RUBY_T_SYMBOL: return "symbol";
    default: return "other";
  }
}

static void set(VALUE hash, const char *key, VALUE value) {
  rb_hash_aset(hash, ID2SYM(rb_intern(key)), value);
}

// The first max bytes of a String as a double-quoted literal (String#inspect's C function, run on our
// own copy), "..." after it when there is more.
static VALUE quoted_head(VALUE str, long max) {
  VALUE text = rb_str_inspect(bounded_copy(str, max));
  return RSTRING_LEN(str) > max ? rb_str_cat_cstr(text, "...") : text;
}

// [[class name, count], ...] for the TOP_CLASSES most counted, then ["(other classes)", n] if any.
static VALUE tally_list(const class_tally *t) {
  VALUE list = rb_ary_new();
  bool shown[TALLY_CLASSES] = {false};
  uint64_t rest = t->other;
  for (size_t k = 0; k < TOP_CLASSES && k < t->used; k++) {
    size_t best = TALLY_CLASSES;
    for (size_t i = 0; i < t->used; i++) {
      if (!shown[i] && (best == TALLY_CLASSES || t->counts[i] > t->counts[best])) best = i;
    }
    shown[best] = true;
    rb_ary_push(list, rb_ary_new_from_args(2, class_name(t->classes[best]), ULL2NUM(t->counts[best])));
  }
  for (size_t i = 0; i < t->used; i++) rest += shown[i] ? 0 : t->counts[i];
  if (rest > 0) rb_ary_push(list, rb_ary_new_from_args(2, rb_str_new_cstr("(other classes)"), ULL2NUM(rest)));
  return list;
}

static bool plain_symbol_name(VALUE name) {
  const char *p = RSTRING_PTR(name);
  long len = RSTRING_LEN(name);
  if (len == 0 || !(p[0] == '_' || (p[0] >= 'a' && p[0] <= 'z') || (p[0] >= 'A' && p[0] <= 'Z'))) return false;
  for (long i = 1; i < len; i++) {
    char c = p[i];
    bool word = c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!word && !(i == len - 1 && (c == '?' || c == '!'))) return false;
  }
  return true;
}

// A key as it reads in code for nil, true, false, Integers, Floats, Symbols and Strings (bounded), an
// Array by its first KEY_ELEMENTS elements (one level: a cache keyed by request parameters shows them);
// anything else by its class only: #<Foo>. The Array is pinned (a key collected while its Hash was
// read): each element is read from it afresh after the previous one's text was made.
static VALUE key_text(VALUE key, int depth) {
  if (NIL_P(key)) return rb_str_new_cstr("nil");
  if (key == Qtrue) return rb_str_new_cstr("true");
  if (key == Qfalse) return rb_str_new_cstr("false");
  if (RB_FIXNUM_P(key)) return rb_fix2str(key, 10);
  if (RB_FLOAT_TYPE_P(key) && real_class_of(key) == rb_cFloat) {
    char text[32];
    snprintf(text, sizeof text, "%.17g", rb_float_value(key));
    return rb_str_new_cstr(text);
  }
  if (RB_SYMBOL_P(key)) {
    VALUE name = rb_sym2str(key);
    VALUE text = rb_str_new_cstr(":");
    rb_str_append(text, RSTRING_LEN(name) <= KEY_BYTES && plain_symbol_name(name) ? name : quoted_head(name, KEY_BYTES));
    return text;
  }
  if (RB_TYPE_P(key, T_STRING)) return quoted_head(key, KEY_BYTES);
  if (depth == 0 && RB_TYPE_P(key, T_ARRAY) && real_class_of(key) == rb_cArray) {
    VALUE text = rb_str_new_cstr("[");
    for (long i = 0; i < RARRAY_LEN(key) && i < KEY_ELEMENTS; i++) {
      if (i > 0) rb_str_cat_cstr(text, ", ");
      rb_str_append(text, key_text(RARRAY_AREF(key, i), depth + 1));
    }
    if (RARRAY_LEN(key) > KEY_ELEMENTS) rb_str_catf(text, ", ...%ld more", RARRAY_LEN(key) - KEY_ELEMENTS);
    return rb_str_cat_cstr(text, "]");
  }
  VALUE text = rb_str_new_cstr("#<");
  rb_str_append(text, class_name(real_class_of(key)));
  return rb_str_cat_cstr(text, ">");
}

static void reset_scratch(previews_job *job) {
  memset(&job->first, 0, sizeof job->first);
  memset(&job->second, 0, sizeof job->second);
  job->key_count = job->ivar_count = job->ivar_total = 0;
  job->scanned = 0;
}

static void render_string(const previews_job *job, VALUE obj, VALUE out) {
  set(out, "bytesize", LONG2NUM(RSTRING_LEN(obj)));
  set(out, "encoding", rb_str_new_cstr(rb_enc_name(rb_enc_get(obj))));
  // Only the first bytes are read, whatever the String's size: a 10 MB String costs what a short one does.
  if (job->contents) set(out, "head", quoted_head(obj, HEAD_BYTES));
}

static void render_array(previews_job *job, VALUE obj, VALUE out) {
  long len = RARRAY_LEN(obj);
  long n = len < SCAN_LIMIT ? len : SCAN_LIMIT;
  for (long i = 0; i < n; i++) tally(&job->first, RARRAY_AREF(obj, i));
  set(out, "length", LONG2NUM(len));
  set(out, "scanned", LONG2NUM(n));
  set(out, "elements", tally_list(&job->first));
}

static void render_hash(previews_job *job, VALUE obj, VALUE out) {
  rb_hash_foreach(obj, on_pair, (VALUE)job);
  set(out, "length", SIZET2NUM(RHASH_SIZE(obj)));
  set(out, "scanned", LONG2NUM(job->scanned));
  set(out, "key_classes", tally_list(&job->first));
  set(out, "value_classes", tally_list(&job->second));
  if (!job->contents) return;
  VALUE keys = rb_ary_new();
  for (size_t i = 0; i < job->key_count; i++) rb_ary_push(keys, key_text(job->keys[i], 0));
  set(out, "keys", keys);
}

static void render_object(previews_job *job, VALUE obj, VALUE out) {
  rb_ivar_foreach(obj, on_ivar, (st_data_t)job);
  VALUE names = rb_ary_new();
  for (size_t i = 0; i < job->ivar_count; i++) {
    VALUE name = rb_id2str(job->ivars[i]);
    if (name != 0) rb_ary_push(names, bounded_copy(name, NAME_BYTES));
  }
  set(out, "ivar_count", SIZET2NUM(job->ivar_total));
  set(out, "ivars", names);
}

static VALUE render(previews_job *job, size_t i) {
  VALUE obj = job->objs[i];
  reset_scratch(job);
  VALUE out = rb_hash_new();
  set(out, "class", class_name(real_class_of(obj)));
  set(out, "type", ID2SYM(rb_intern(type_name(obj))));
  set(out, "size", SIZET2NUM(rb_obj_memsize_of(obj)));
  set(out, "age", UINT2NUM(job->ages[i]));
  switch (RB_BUILTIN_TYPE(obj)) {
    case RUBY_T_STRING: render_string(job, obj, out); break;
    case RUBY_T_ARRAY: render_array(job, obj, out); break;
    case RUBY_T_HASH: render_hash(job, obj, out); break;
    case RUBY_T_OBJECT: render_object(job, obj, out); break;
    default: break;
  }
  reset_scratch(job); // (nothing read stays pinned longer than needed)
  return out;
}

static VALUE render_all(VALUE arg) {
  previews_job *job = (previews_job *)arg;
  VALUE examples = rb_ary_new_capa((long)job->count);
  for (size_t i = 0; i < job->count; i++) rb_ary_push(examples, render(job, i));
  VALUE result = rb_hash_new();
  set(result, "sampled", ULL2NUM(job->matched));
  set(result, "examples", examples);
  return result;
}

// Marks (and so pins) the picked objects and what the current one's reading collected. Only in a GC:
// a retainers walk asks objects on C stacks for their references outside any GC (retainers.c), and
// must not find the site's objects held by this holder.
static void previews_mark(void *data) {
  const previews_job *job = data;
  if (job == NULL || !rb_during_gc()) return;
  rb_gc_mark_locations(job->objs, job->objs + job->count);
  rb_gc_mark_locations(job->first.classes, job->first.classes + job->first.used);
  rb_gc_mark_locations(job->second.classes, job->second.classes + job->second.used);
  rb_gc_mark_locations(job->keys, job->keys + job->key_count);
}

static const rb_data_type_t previews_type = {
  .wrap_struct_name = "heapscope_previews",
  .function = {.dmark = previews_mark, .dfree = NULL, .dsize = NULL},
  .flags = RUBY_TYPED_FREE_IMMEDIATELY,
};

typedef struct {
  previews_job *job;
  VALUE holder;
} previews_run;

static VALUE finish(VALUE arg) {
  previews_run *run = (previews_run *)arg;
  DATA_PTR(run->holder) = NULL; // (the holder may stay on a stack: it must not mark freed arrays)
  free(run->job->objs);
  free(run->job->ages);
  run->job->objs = NULL;
  run->job->ages = NULL;
  return Qnil;
}

// Native._examples(file, line, max_objects, contents) -> {sampled:, examples: [{class:, type:, size:,
// age:, ...}]}: the site's max_objects oldest sampled live objects (1..100), rendered.
static VALUE native_examples(VALUE self, VALUE file, VALUE line, VALUE max_objects, VALUE contents) {
  (void)self;
  StringValue(file);
  int32_t site_line = (int32_t)NUM2INT(line);
  size_t capacity = NUM2SIZET(max_objects);
  if (capacity < 1) capacity = 1;
  if (capacity > MAX_OBJECTS) capacity = MAX_OBJECTS;
  if (!capture_running()) rb_raise(rb_eRuntimeError, "heapscope is not running");
  // Naming frames allocates: done before anything is picked. So is the holder.
  if (!names_resolve(capture_names(), recorder_strings(capture_recorder()))) {
    rb_raise(rb_eNoMemError, "heapscope: not enough memory to name frames");
  }
  previews_job job;
  memset(&job, 0, sizeof job);
  previews_run run = {&job, TypedData_Wrap_Struct(0, &previews_type, NULL)};
  job.capacity = capacity;
  job.contents = RTEST(contents);
  job.objs = malloc(capacity * sizeof(VALUE));
  job.ages = malloc(capacity * sizeof(uint32_t));
  if (job.objs == NULL || job.ages == NULL) {
    finish((VALUE)&run);
    rb_raise(rb_eNoMemError, "heapscope: not enough memory to pick examples");
  }
  DATA_PTR(run.holder) = &job;
  capture_settle_records();
  site_match_init(&job.site, RSTRING_PTR(file), (size_t)RSTRING_LEN(file), site_line);
  job.gc_now = (uint32_t)rb_gc_count();
  recorder_each_object(capture_recorder(), pick, &job);
  VALUE result = rb_ensure(render_all, (VALUE)&job, finish, (VALUE)&run);
  RB_GC_GUARD(run.holder);
  RB_GC_GUARD(file);
  return result;
}

void previews_define(VALUE mNative) {
  rb_define_singleton_method(mNative, "_examples", native_examples, 4);
}
