# frozen_string_literal: true

# Builds the bench-only extension HookToggle (bench/hooktoggle/hooktoggle.c); bench/extension.rb runs it
# into tmp/bench/hooktoggle for bench/hooktoggle/run.rb and pin.rb. Never part of the gem.
require "mkmf"
$CFLAGS << " -O2 -Wall -Wextra -Wno-unused-parameter"
have_func("rb_gc_disable_no_rest") # Ruby 3.2+ aborts on a malloc inside the GC unless GC is disabled
create_makefile("hooktoggle")
