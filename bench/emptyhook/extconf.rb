# frozen_string_literal: true

# Builds the bench-only extension HeapscopeBench (bench/emptyhook/emptyhook.c). bench/run builds it into
# tmp/bench/emptyhook; it is never part of the gem.
require "mkmf"

# Callgrind client requests let bench/run --callgrind count only the measured region. Without the header
# the toggle is a no-op and the callgrind mode says so.
have_header("valgrind/callgrind.h")
$CFLAGS << " -O2 -Wall -Wextra -Wno-unused-parameter"
create_makefile("heapscope_bench")
