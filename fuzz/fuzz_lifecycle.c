// fuzz_lifecycle: the recorder's record lifecycle inside a real Ruby VM. libruby is embedded; the
// extension's sources are linked in and Init_heapscope is called directly. Each input is a sequence of
// operations run through Heapscope::Native and small Ruby snippets (so allocations have Ruby frames):
// start (random sample_every, max_frames, min_age, caps, windowed or always sampling and its share),
// allocate objects of several types at several sites and keep some, drop kept objects, minor and major GCs, compaction, profiles of both types,
// reset, stop and restart. After every operation the recorder must hold no invalid record, and every
// profile must be gzip bytes. A crash, a sanitizer report or a broken check fails the target.
//
// libruby itself is not instrumented (only heapscope's code and this harness are), so Ruby's
// conservative stack scan reads the harness's redzones unchecked. Run with
// ASAN_OPTIONS=detect_leaks=0:use_sigaltstack=0 (Ruby's heap is never freed; Ruby owns the signal stacks).
#include <ruby.h>
#include <stdio.h>

#include "fuzz_input.h"

void Init_heapscope(void);

static VALUE native, keep;

static VALUE eval(VALUE code) { return rb_eval_string(StringValueCStr(code)); }

// Runs Ruby code, turning an exception into a failure of the target (heapscope must not raise here).
static VALUE run(const char *fmt, ...) {
  char code[512];
  va_list args;
  va_start(args, fmt);
  vsnprintf(code, sizeof code, fmt, args);
  va_end(args);
  int state = 0;
  VALUE result = rb_protect(eval, rb_str_new_cstr(code), &state);
  if (state) {
    VALUE error = rb_errinfo();
    fprintf(stderr, "fuzz_lifecycle: %s raised %s\n", code, RSTRING_PTR(rb_inspect(error)));
    abort();
  }
  return result;
}

static void check_invariants(void) {
  VALUE stats = run("Heapscope::Native._stats");
  VALUE invalid = rb_hash_aref(stats, ID2SYM(rb_intern("invalid_records")));
  if (!NIL_P(invalid) && NUM2ULL(invalid) != 0) {
    fprintf(stderr, "fuzz_lifecycle: %llu invalid records\n", NUM2ULL(invalid));
    abort();
  }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  RUBY_INIT_STACK;
  ruby_init();
  // ruby_options loads the prelude (GC.start and GC.compact live in gc.rb); the "-e ''" it parses is
  // never run.
  static char *ruby_argv[] = {"fuzz_lifecycle", "-e", "", NULL};
  ruby_options(3, ruby_argv);
  Init_heapscope();
  keep = rb_ary_new();
  rb_gc_register_address(&keep);
  rb_define_variable("$fuzz_keep", &keep);
  native = rb_eval_string("Heapscope::Native");
  rb_gc_register_address(&native);
  rb_eval_string("def fz_site0(n) = Array.new(n) { |i| 'x' * (i % 64) }\n"
                 "def fz_site1(n) = Array.new(n) { |i| [i, i.to_s] }\n"
                 "def fz_site2(n) = Array.new(n) { |i| { i => Object.new } }\n"
                 "def fz_site3(n) = Array.new(n) { |i| Struct.new(:a).new(i) }\n"
                 "def fz_deep(d, n) = d.zero? ? fz_site0(n) : fz_deep(d - 1, n)\n"
                 // lib/heapscope.rb's wrappers (exact_threads.h): Fibers made here are recorded whole.
                 "Fiber.singleton_class.prepend(Heapscope::FiberWatch)\n"
                 "def fz_fibers(n) = Array.new(n) { Fiber.new { Fiber.yield } }.each(&:resume)\n");
  return 0;
}

static void start(fz_input *in) {
  static const char *const shares[] = {"0.02", "0.3", "1.0"};
  // Focused classes (their own countdowns): none, or Strings and/or Arrays at a dense rate.
  static const char *const focus[] = {"nil", "[[String, 1]]", "[[Array, 3], [String, 2]]"};
  run("Heapscope::Native._start(%u, %u, %u, %s, %u, %u, 40, %s, %s, %s, %s, %u, %s, %s)", fz_below(in, 4) == 0 ? 1 + fz_below(in, 50) : 1,
      1 + fz_below(in, 64), fz_below(in, 3), fz_below(in, 2) ? "true" : "false", 1 + fz_below(in, 5000),
      1 + fz_below(in, 200), fz_below(in, 2) ? "nil" : "0.5", fz_below(in, 2) ? "true" : "false",
      shares[fz_below(in, 3)], fz_below(in, 2) ? "true" : "false", 1 + fz_below(in, 8), focus[fz_below(in, 3)],
      fz_below(in, 4) ? "true" : "false");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_input in = {data, size};
  start(&in);
  for (int op = 0; op < 64 && in.left > 0; op++) {
    switch (fz_below(&in, 13)) {
      case 0: case 1: case 2: { // allocate at a site, keep or drop
        unsigned site = fz_below(&in, 4), n = fz_below(&in, 300);
        if (fz_below(&in, 2)) run("$fuzz_keep.concat(fz_site%u(%u))", site, n);
        else run("fz_site%u(%u); nil", site, n);
        break;
      }
      case 3: run("$fuzz_keep.concat(fz_deep(%u, %u))", fz_below(&in, 200), fz_below(&in, 20)); break;
      case 4: run("$fuzz_keep = $fuzz_keep.drop(%u)", fz_below(&in, 500)); break;
      case 5: run("GC.start(full_mark: false)"); break;
      case 6: run("GC.start"); break;
      case 7: run("GC.compact"); break;
      case 8: {
        // The third argument: no extra comments, or lines (the memory breakdown's, lib/heapscope/memory.rb);
        // the fourth: with the census (census.c: a heap walk, the bound, its comment lines) or without.
        const char *allocs = fz_below(&in, 2) ? "true" : "false";
        unsigned min_age = fz_below(&in, 3);
        const char *comments = fz_below(&in, 2) ? "nil" : "\"heapscope memory: rss=1\\nmore\\n\"";
        const char *with_census = fz_below(&in, 4) ? "true" : "false";
        VALUE profile = run("Heapscope::Native._running? ? Heapscope::Native._profile(%s, %u, %s, %s) : \"\\x1f\\x8b\"",
                            allocs, min_age, comments, with_census);
        if (!RB_TYPE_P(profile, T_STRING) || RSTRING_LEN(profile) < 2 || (uint8_t)RSTRING_PTR(profile)[0] != 0x1f) {
          fprintf(stderr, "fuzz_lifecycle: a profile that is not gzip\n");
          abort();
        }
        break;
      }
      case 9: run("Heapscope::Native._reset"); break;
      case 12: run("$fuzz_keep.concat(fz_fibers(%u))", fz_below(&in, 40)); break; // Fibers, kept (exact_threads)
      case 10: run("Heapscope::Native._stop"); start(&in); break;
      case 11: // labels in force (the fiber-local the hook reads): a set (maybe past the cap), none, or a bogus id
        switch (fz_below(&in, 3)) {
          case 0: run("Thread.current[:__heapscope_labels] = Heapscope::Native._label_set([['k%u', 'v%u']]).abs", fz_below(&in, 3), fz_below(&in, 40)); break;
          case 1: run("Thread.current[:__heapscope_labels] = nil"); break;
          case 2: run("Thread.current[:__heapscope_labels] = %u", fz_below(&in, 100000)); break;
        }
        break;
    }
    check_invariants();
  }
  run("Heapscope::Native._stop; $fuzz_keep = []");
  return 0;
}
