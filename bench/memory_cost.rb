# frozen_string_literal: true

# bench/memory_cost.rb: what the memory breakdown (lib/heapscope/memory.rb) adds to each profile. In
# one process, with malloc's free lists fragmented on purpose (mallinfo2 walks them), it times
# Heapscope::Memory.measure (the /proc read, GC.stat and mallinfo2 that every profile now does) beside
# a whole profile, both in the same run, so the ratio holds on a noisy machine.
#
#   bundle exec ruby -Ilib bench/memory_cost.rb [LIVE_STRINGS]
require "heapscope"

live = Integer(ARGV[0] || 500_000)
Heapscope.start(sample_every: 1000, sampling: :always)
# Fragmentation: keep every other malloc'd string, so the freed ones stay as many small free chunks.
keep = Array.new(live * 2) { |i| "fragment #{i} " * 3 }
keep = keep.each_slice(2).map(&:first)
GC.start

def clock = Process.clock_gettime(Process::CLOCK_MONOTONIC)

def median_us(runs)
  times = Array.new(runs) do
    t = clock
    yield
    (clock - t) * 1e6
  end
  times.sort[runs / 2]
end

measure = median_us(200) { Heapscope::Memory.measure }
malloc = defined?(Heapscope::Native._malloc_stats) ? median_us(200) { Heapscope::Native._malloc_stats } : nil
profile = median_us(9) { Heapscope.profile }
m = Heapscope::Memory.measure
puts "live strings: #{keep.size}; malloc free inside: #{m[:malloc_free] ? (m[:malloc_free] / 1048576.0).round(1) : "?"} MiB"
puts "| what | median | share of one profile |"
puts "|---|---|---|"
puts format("| Memory.measure (whole breakdown) | %.0f us | %.1f%% |", measure, 100 * measure / profile)
puts format("| of which mallinfo2 | %.0f us | %.1f%% |", malloc, 100 * malloc / profile) if malloc
puts format("| Heapscope.profile | %.0f us | 100%% |", profile)
