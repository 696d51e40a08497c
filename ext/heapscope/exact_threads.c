#include "exact_threads.h"

#include "capture.h"
#include "ractors.h"

// Thread.new, .start, .fork and Fiber.new: the method of the same name up the chain (rb_call_super passes
// the block given here), then the object it made to capture, leaving out this method's own frame.
static VALUE watched_new(int argc, VALUE *argv, VALUE self) {
  (void)self;
  VALUE made = rb_call_super_kw(argc, argv, RB_PASS_CALLED_KEYWORDS);
  if (ractors_in_main()) capture_track_exact(made, 1);
  return made;
}

void exact_threads_init(VALUE mHeapscope) {
  VALUE thread_watch = rb_define_module_under(mHeapscope, "ThreadWatch");
  VALUE fiber_watch = rb_define_module_under(mHeapscope, "FiberWatch");
  // Ractor-safe: another Ractor's Thread.new runs these too (a method not marked so would raise
  // Ractor::UnsafeError there), and they touch nothing outside the main Ractor.
  rb_ext_ractor_safe(true);
  rb_define_method(thread_watch, "new", watched_new, -1);
  rb_define_method(thread_watch, "start", watched_new, -1);
  rb_define_method(thread_watch, "fork", watched_new, -1);
  rb_define_method(fiber_watch, "new", watched_new, -1);
  rb_ext_ractor_safe(false);
}
