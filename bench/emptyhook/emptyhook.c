/*
** heapscope_bench: the bench-only extension behind bench/run.
**
** HeapscopeBench.empty_hook_enable turns on a RUBY_INTERNAL_EVENT_NEWOBJ tracepoint whose callback does
** nothing. Its cost is the floor every NEWOBJ-based profiler pays (the VM leaves its fast allocation path
** and calls out on every allocation), so bench/run reports each profiler's extra cost against it.
**
** HeapscopeBench.callgrind_toggle flips callgrind's "collect" state (a no-op outside valgrind), so that
** `bench/run --callgrind` counts the instructions of the measured region only, not Ruby's boot.
*/
#include <ruby.h>
#include <ruby/debug.h>
#ifdef HAVE_VALGRIND_CALLGRIND_H
#include <valgrind/callgrind.h>
#endif

static VALUE bench_tracepoint = Qnil;

/* The empty callback: the measured cost is the VM's, not ours. */
static void bench_on_newobj(VALUE tpval, void *data) {
    (void)tpval;
    (void)data;
}

static VALUE bench_empty_hook_enable(VALUE self) {
    (void)self;
    if (NIL_P(bench_tracepoint)) {
        bench_tracepoint = rb_tracepoint_new(0, RUBY_INTERNAL_EVENT_NEWOBJ, bench_on_newobj, NULL);
    }
    rb_tracepoint_enable(bench_tracepoint);
    return Qtrue;
}

static VALUE bench_empty_hook_disable(VALUE self) {
    (void)self;
    if (NIL_P(bench_tracepoint)) return Qfalse;
    rb_tracepoint_disable(bench_tracepoint);
    return Qtrue;
}

/* Returns true when built with callgrind's client requests (the toggle then works under valgrind). */
static VALUE bench_callgrind_available(VALUE self) {
    (void)self;
#ifdef HAVE_VALGRIND_CALLGRIND_H
    return Qtrue;
#else
    return Qfalse;
#endif
}

/* Returns true when running under valgrind. */
static VALUE bench_running_on_valgrind(VALUE self) {
    (void)self;
#ifdef HAVE_VALGRIND_CALLGRIND_H
    return RUNNING_ON_VALGRIND ? Qtrue : Qfalse;
#else
    return Qfalse;
#endif
}

static VALUE bench_callgrind_toggle(VALUE self) {
    (void)self;
#ifdef HAVE_VALGRIND_CALLGRIND_H
    CALLGRIND_TOGGLE_COLLECT;
#endif
    return Qnil;
}

void Init_heapscope_bench(void) {
    VALUE mod = rb_define_module("HeapscopeBench");
    rb_gc_register_address(&bench_tracepoint);
    rb_define_module_function(mod, "empty_hook_enable", bench_empty_hook_enable, 0);
    rb_define_module_function(mod, "empty_hook_disable", bench_empty_hook_disable, 0);
    rb_define_module_function(mod, "callgrind_available?", bench_callgrind_available, 0);
    rb_define_module_function(mod, "running_on_valgrind?", bench_running_on_valgrind, 0);
    rb_define_module_function(mod, "callgrind_toggle", bench_callgrind_toggle, 0);
}
