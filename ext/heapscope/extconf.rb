# frozen_string_literal: true

require "mkmf"

# Warnings are errors in CI only (HEAPSCOPE_WERROR=1), so a newer compiler never breaks gem install.
$CFLAGS << " -std=gnu11 -O2 -g -Wall -Wextra -fvisibility=hidden"
$CFLAGS << " #{ENV["HEAPSCOPE_CFLAGS"]}" if ENV["HEAPSCOPE_CFLAGS"]
$LDFLAGS << " #{ENV["HEAPSCOPE_LDFLAGS"]}" if ENV["HEAPSCOPE_LDFLAGS"]
# The sanitizer builds (rake asan, docs/robustness.md) compile with clang instead of Ruby's compiler;
# Ruby's gcc-only warning flags are then unknown to it, which is not worth a warning.
if ENV["HEAPSCOPE_CC"]
  RbConfig::MAKEFILE_CONFIG["CC"] = RbConfig::CONFIG["CC"] = ENV["HEAPSCOPE_CC"]
  $CFLAGS << " -Wno-unknown-warning-option" if ENV["HEAPSCOPE_CC"].include?("clang")
end

# Ruby's own headers are system headers: -Wextra warnings inside them are not ours to fix.
$INCFLAGS = $INCFLAGS.gsub(/-I(\$\((?:arch_hdrdir|hdrdir)\)\S*)/, '-isystem \\1')

require_relative "../../lib/heapscope/version"
$defs << %(-DHEAPSCOPE_VERSION=\\"#{Heapscope::VERSION}\\")

# Liveness reads the GC's mark bits (liveness.h): each Ruby exports a different function for it, all
# declared only in its internal headers. Probed in order of preference (cheapest first).
liveness = %w[rb_objspace_marked_object_p rb_obj_gc_flags rb_gc_object_metadata].find { |f| have_func(f) }
unless liveness
  abort "heapscope: this Ruby exports none of rb_objspace_marked_object_p (MRI 3.1-3.3), rb_obj_gc_flags " \
        "(3.4) or rb_gc_object_metadata (4.0+), one of which heapscope needs to know which sampled " \
        "objects are alive."
end
# After a GC heapscope did not see, records are checked against the heap's pages (every MRI exports it).
abort "heapscope: this Ruby does not export rb_objspace_each_objects" unless have_func("rb_objspace_each_objects")
# Suspect records are checked from a postponed job: Ruby 3.3+ wants handles made in advance
# (rb_postponed_job_register_one is deprecated there and gone in 4.1).
have_func("rb_postponed_job_preregister", "ruby/debug.h")
# A thread that takes the GVL wakes a ticker that had stopped following the chain (ticker.h, idle).
have_func("rb_internal_thread_add_event_hook", "ruby/thread.h")
# Ruby 3.4+ can run another GC (RUBY_GC_LIBRARY): heapscope refuses to start under one.
have_func("rb_gc_active_gc_name")
# memsize_of from C; without it sizes are the slot size.
have_func("rb_obj_memsize_of")
# Windowed sampling registers its hooks inside the GC (windows.c). Ruby 3.2+ aborts on a malloc during
# GC unless GC is disabled; this (exported from 3.2 on where available) disables it without finishing
# the GC in progress. Ruby 3.1 has no such check and does not export it.
have_func("rb_gc_disable_no_rest")

# Who holds a sampled object (retainers.c): the walk ext/objspace uses, exported on every MRI checked.
have_func("rb_objspace_reachable_objects_from_root")

# glibc's allocator figures for the memory breakdown (memstats.h); elsewhere the breakdown omits them.
have_func("mallinfo2", "malloc.h")
# The thread label (label_threads) reads the native thread's name with prctl(PR_GET_NAME): Linux.
have_func("prctl", "sys/prctl.h")

abort "heapscope: zlib.h is missing (apt-get install zlib1g-dev)" unless have_header("zlib.h")
abort "heapscope: libz is missing (apt-get install zlib1g-dev)" unless have_library("z", "deflateInit2_", "zlib.h")

# Ractors (ractors.h): 3.4+ exports rb_gc_multi_ractor_p, which says whether the process ever left
# single-Ractor mode; 3.1 and 3.2 say it with ruby_single_main_ractor, which ractors.c looks up with
# dlsym when it loads (a link test passes on a static Ruby that does not export it). dlsym is in libc
# from glibc 2.34, in libdl before.
have_func("rb_gc_multi_ractor_p")
have_library("dl", "dlsym", "dlfcn.h") unless have_func("dlsym", "dlfcn.h")

# The prebuilt gem's builds (rakelib/native_gem.rake) do not link libruby: Ruby's symbols are resolved
# from the process that loads the extension, so one build serves a Ruby built with a shared libruby
# (Debian's) and one linked statically (rbenv's, ruby-build's default).
$LIBRUBYARG = "" if ENV["HEAPSCOPE_NO_LIBRUBY"] == "1"

# Last, so mkmf's own probe programs (which trip -Wextra) are not compiled with it.
$CFLAGS << " -Werror" if ENV["HEAPSCOPE_WERROR"] == "1"

$srcs = Dir[File.join(__dir__, "*.c")].map { |path| File.basename(path) }
create_makefile("heapscope/heapscope")
