#include "retainers_walk.h"

#include <stdlib.h>

// The paths of a retainers walk (retainers.c) as Ruby arrays: each target's chain of nodes read back
// from parents, its edges named by edge_names.c, VM-internal objects replaced by their kind.

#ifdef HAVE_RB_OBJSPACE_REACHABLE_OBJECTS_FROM_ROOT
// ---- The result ----

// Objects Ruby code must never hold: those without a class (hidden strings, arrays, hashes of the VM)
// and the VM's own types. (Ours, not rb_objspace_internal_object_p, which newer Rubies may not export.)
bool retainers_is_internal(VALUE obj) {
  if (RB_SPECIAL_CONST_P(obj)) return false;
  if (RBASIC_CLASS(obj) == 0) return true;
  switch (RB_BUILTIN_TYPE(obj)) {
    case RUBY_T_IMEMO: case RUBY_T_ICLASS: case RUBY_T_ZOMBIE: case RUBY_T_MOVED: case RUBY_T_NONE:
#ifdef T_NODE
    case RUBY_T_NODE: // (a macro guards it: newer Rubies may drop the type)
#endif
      return true;
    default:
      return false;
  }
}

static const char *internal_kind(VALUE obj) {
  switch (RB_BUILTIN_TYPE(obj)) {
    case RUBY_T_IMEMO: return "VM-internal (imemo: environment, instruction sequence, method entry...)";
    case RUBY_T_ICLASS: return "VM-internal (included module)";
    case RUBY_T_CLASS: return "VM-internal (class)";
    case RUBY_T_STRING: return "VM-internal (hidden String)";
    case RUBY_T_ARRAY: return "VM-internal (hidden Array)";
    case RUBY_T_HASH: return "VM-internal (hidden Hash)";
    default: return "VM-internal (object)";
  }
}

// The chain of nodes from a root to node, root first. Longer chains keep their root and their last
// MAX_HOPS - 1 hops (*cut says hops were left out).
static int chain_of(const walk *w, uint32_t node, uint32_t *chain, bool *cut) {
  uint32_t reversed[MAX_HOPS];
  int len = 0;
  *cut = false;
  for (uint32_t n = node; n != NO_PARENT; n = PARENT(w, n)) {
    if (len < MAX_HOPS - 1 || PARENT(w, n) == NO_PARENT) {
      reversed[len++] = n;
    } else {
      *cut = true;
    }
  }
  for (int k = 0; k < len; k++) chain[k] = reversed[len - 1 - k];
  return len;
}

static bool is_module(VALUE obj) {
  return !retainers_is_internal(obj) && (RB_TYPE_P(obj, RUBY_T_CLASS) || RB_TYPE_P(obj, RUBY_T_MODULE));
}

// Whether obj runs code that captures variables: its children of VM-internal kinds are that code or
// those variables. (C checks: no method of obj is called.)
static bool runs_code(VALUE obj) {
  return RTEST(rb_obj_is_proc(obj)) || RTEST(rb_obj_is_method(obj)) || RTEST(rb_obj_is_kind_of(obj, rb_cBinding)) ||
         RTEST(rb_obj_is_kind_of(obj, rb_cThread));
}

// Whether child, VM-internal, may be where the ordinary parent keeps its variables: Ruby 4.0 keeps a
// module's, and those of objects that are not T_OBJECT (a String's, a Data's), in an object of the VM's
// own (an imemo). The parent still names the value behind it (rb_ivar_foreach reads through), and
// only a name found that way leaves the internal hop out of a path.
static bool may_hold_variables(VALUE parent, VALUE child) {
  return is_module(parent) || RB_BUILTIN_TYPE(child) == RUBY_T_IMEMO;
}

// Asks edge_names for every edge the chain needs: between two ordinary objects, and from an ordinary
// object over the VM-internal table that holds its variables (may_hold_variables) to the value.
static bool want_edges(edge_names *names, const walk *w, const uint32_t *chain, int len, bool cut) {
  for (int k = cut ? 2 : 1; k < len; k++) {
    VALUE parent = OBJ(w, chain[k - 1]), child = OBJ(w, chain[k]);
    if (retainers_is_internal(parent)) continue;
    if (!retainers_is_internal(child)) {
      if (!edge_names_want(names, parent, child)) return false;
    } else if (may_hold_variables(parent, child) && k + 1 < len && !retainers_is_internal(OBJ(w, chain[k + 1]))) {
      if (!edge_names_want(names, parent, OBJ(w, chain[k + 1]))) return false;
    }
  }
  return true;
}

static void push_hop(VALUE objects, VALUE kinds, VALUE edges, VALUE obj, VALUE edge) {
  bool internal = retainers_is_internal(obj);
  rb_ary_push(objects, internal ? Qnil : obj);
  rb_ary_push(kinds, internal ? rb_str_new_cstr(internal_kind(obj)) : Qnil);
  rb_ary_push(edges, edge);
}

// [category, objects, kinds, edges] for a chain: objects holds each hop's object, or nil for a
// VM-internal one (kinds names it: such objects must never reach Ruby code); kinds holds nil for
// ordinary objects; edges[k] is what hop k - 1 holds hop k by (edge_names_get's description,
// [:captured], or nil). A VM-internal table of variables (may_hold_variables) is left out where its
// owner names the value itself.
static VALUE path_of(const walk *w, const edge_names *names, const uint32_t *chain, int len, bool cut) {
  VALUE objects = rb_ary_new_capa(len + 1), kinds = rb_ary_new_capa(len + 1), edges = rb_ary_new_capa(len + 1);
  push_hop(objects, kinds, edges, OBJ(w, chain[0]), Qnil);
  if (cut) {
    rb_ary_push(objects, Qnil);
    rb_ary_push(kinds, rb_str_new_cstr("(hops left out)"));
    rb_ary_push(edges, Qnil);
  }
  for (int k = cut ? 2 : 1; k < len; k++) {
    VALUE parent = OBJ(w, chain[k - 1]), child = OBJ(w, chain[k]);
    if (cut && k == 2) parent = Qnil; // (the hop before was left out)
    VALUE edge = Qnil;
    if (parent == Qnil || retainers_is_internal(parent)) {
      edge = Qnil;
    } else if (!retainers_is_internal(child)) {
      edge = edge_names_get(names, parent, child);
    } else if (may_hold_variables(parent, child) && k + 1 < len && !retainers_is_internal(OBJ(w, chain[k + 1])) &&
               !NIL_P(edge = edge_names_get(names, parent, OBJ(w, chain[k + 1])))) {
      k++;
      push_hop(objects, kinds, edges, OBJ(w, chain[k]), edge);
      continue;
    } else if (runs_code(parent)) {
      edge = rb_ary_new_from_args(1, ID2SYM(rb_intern("captured")));
    }
    push_hop(objects, kinds, edges, child, edge);
  }
  uint8_t c = CATEGORY(w, chain[0]);
  VALUE category = rb_str_new_cstr(c < w->category_count ? w->categories[c] : "(root)");
  return rb_ary_new_from_args(4, category, objects, kinds, edges);
}

// Between two parents read for names: the time limit and the slices hold there too.
static bool between_parents(void *data) {
  return retainers_pace((retainers_job *)data) == NULL;
}

// Names the edges of the paths to the targets reached and builds them. Returns "time" or "memory"
// when the naming was cut short (some edges then stay unnamed), else NULL.
const char *retainers_build_paths(retainers_job *job, VALUE paths) {
  walk *w = &job->w;
  size_t found = 0;
  // Owned by the job: finish_walk frees them, whether this returns or raises.
  uint32_t(*chains)[MAX_HOPS] = job->path_chains = malloc((w->target_count ? w->target_count : 1) * sizeof(*chains));
  int *lengths = job->path_lengths = malloc((w->target_count ? w->target_count : 1) * sizeof(int));
  bool *cuts = job->path_cuts = malloc((w->target_count ? w->target_count : 1) * sizeof(bool));
  job->names = edge_names_new();
  const char *cut_short = NULL;
  if (chains == NULL || lengths == NULL || cuts == NULL || job->names == NULL) {
    cut_short = "memory";
  } else {
    for (size_t t = 0; t < w->target_count; t++) {
      uint32_t node = retainers_node_of(w, w->targets[t]);
      if (node == 0) continue;
      lengths[found] = chain_of(w, node - 1, chains[found], &cuts[found]);
      if (!want_edges(job->names, w, chains[found], lengths[found], cuts[found])) cut_short = "memory";
      found++;
    }
    if (!edge_names_resolve(job->names, between_parents, job)) cut_short = "time";
    // From here on nothing lets other threads run: the paths are read as the names were.
    for (size_t p = 0; p < found; p++) rb_ary_push(paths, path_of(w, job->names, chains[p], lengths[p], cuts[p]));
  }
  return cut_short;
}
#endif
