# frozen_string_literal: true

# alloc: the pure allocation loop. Nearly all of its time is Object.new, so it shows the per-allocation
# cost of a hook at its worst (DESIGN.md: ~40 ns and 536 instructions per iteration unprofiled).
Bench::Workloads.define(:alloc, sizes: { full: 4_000_000, quick: 300_000, callgrind: 1_000_000 },
                                summary: "while loop of Object.new") do |n|
  i = 0
  while i < n
    Object.new
    i += 1
  end
  nil
end
