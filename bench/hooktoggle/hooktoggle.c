// hooktoggle: a NEWOBJ tracepoint with an empty callback, registered inside every GC (from a dmark, as
// heapscope's windowed sampling does) and removed by itself after `length` allocations. No sampling, no
// records: it isolates what turning the allocation hook on and off does to the VM. bench/hooktoggle/run.rb
// uses it, and bench/hooktoggle/pin.rb its one-shot form; docs/benchmarks.md reports what they showed.
#include <ruby.h>
#include <ruby/debug.h>

#ifdef HAVE_RB_GC_DISABLE_NO_REST
VALUE rb_gc_disable_no_rest(void); // exported, declared only in Ruby's internal headers (as in windows.c)
#endif

static VALUE hook;
static long length, left, windows;

static void on_newobj(VALUE tracepoint, void *unused) {
  (void)tracepoint;
  (void)unused;
  if (--left == 0) rb_tracepoint_disable(hook);
}

static void holder_mark(void *unused) {
  (void)unused;
  rb_gc_mark(hook);
  if (length == 0 || !rb_during_gc() || RTEST(rb_tracepoint_enabled_p(hook))) return;
  left = length; // registering mallocs 48 bytes: Ruby 3.1 has no malloc check inside the GC, 3.2+ does
#ifdef HAVE_RB_GC_DISABLE_NO_REST
  VALUE was_disabled = rb_gc_disable_no_rest();
#endif
  rb_tracepoint_enable(hook);
#ifdef HAVE_RB_GC_DISABLE_NO_REST
  if (!RTEST(was_disabled)) rb_gc_enable();
#endif
  windows++;
}

static const rb_data_type_t holder_type = {.wrap_struct_name = "hooktoggle", .function = {.dmark = holder_mark}};

// HookToggle.start(length): from the next GC on, the hook is on for the first `length` allocations
// after each GC. HookToggle.windows: how many times it was turned on.
static VALUE start(VALUE self, VALUE n) {
  (void)self;
  length = NUM2LONG(n);
  return Qnil;
}

// HookToggle.hook_next(n): the hook is on, from now, for the next n allocations (bench/hooktoggle/pin.rb).
static VALUE hook_next(VALUE self, VALUE n) {
  (void)self;
  if (RTEST(rb_tracepoint_enabled_p(hook))) return Qfalse;
  left = NUM2LONG(n);
  rb_tracepoint_enable(hook);
  return Qtrue;
}

static VALUE count(VALUE self) {
  (void)self;
  return LONG2NUM(windows);
}

void Init_hooktoggle(void) {
  hook = rb_tracepoint_new(0, RUBY_INTERNAL_EVENT_NEWOBJ, on_newobj, NULL);
  rb_gc_register_mark_object(hook);
  VALUE holder = TypedData_Wrap_Struct(rb_cObject, &holder_type, &hook);
  rb_gc_register_mark_object(holder);
  VALUE m = rb_define_module("HookToggle");
  rb_define_singleton_method(m, "start", start, 1);
  rb_define_singleton_method(m, "windows", count, 0);
  rb_define_singleton_method(m, "hook_next", hook_next, 1);
}
