# frozen_string_literal: true

# bench/liveness_cost.rb: what the liveness pass costs per tracked object at each GC, on the Ruby that
# runs it (each Ruby reads mark bits through a different function: docs/architecture.md, Liveness).
# Tracks N live objects (sample_every 1, budget off), then runs GCs and divides the GC hook's own time
# (stats[:sampling_ns], which times the pass) by GCs x tracked objects. Minor and full GCs separately.
#
#   bundle exec ruby -Ilib bench/liveness_cost.rb [objects=500000] [gcs=20]
require "heapscope"

n = Integer(ARGV[0] || 500_000)
gcs = Integer(ARGV[1] || 20)
Heapscope.start(sample_every: 1, sampling: :always, max_overhead: nil, max_tracked_objects: n * 2)
keep = Array.new(n) { Object.new }
GC.start
tracked = Heapscope.stats[:tracked_objects]
row = [RUBY_VERSION, Heapscope::Native::LIVENESS, tracked]
[false, true].each do |full|
  before = Heapscope.stats[:sampling_ns]
  started = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
  gcs.times { GC.start(full_mark: full, immediate_sweep: true) }
  wall = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond) - started
  pass = Heapscope.stats[:sampling_ns] - before
  row << format("%.2f ns/object (%.0f%% of the GC)", pass.to_f / gcs / tracked, 100.0 * pass / wall)
end
keep.clear
puts "| Ruby | mark bits via | tracked | minor GC pass | full GC pass |" if ENV["HEADER"]
puts "| #{row.join(" | ")} |"
