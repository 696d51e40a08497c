# frozen_string_literal: true

# Builds the bench-only extension HookToggle (bench/hooktoggle/hooktoggle.c) into tmp/bench/hooktoggle;
# bench/hooktoggle/run.rb does it. Never part of the gem.
require "mkmf"
$CFLAGS << " -O2 -Wall -Wextra -Wno-unused-parameter"
create_makefile("hooktoggle")
