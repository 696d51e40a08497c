# frozen_string_literal: true

# Where in a burst the windowed hook is on. The bursty accuracy workload (a quiet loop, one allocation
# at A, 1,000 at B, 100 at C) under windowed sampling, with the share of each stretch's allocations the
# hook saw (Heapscope::Testing.hook_allocations before and after it). Unbiased windows see every
# stretch alike, at about the realized share; a share that falls from A to C is the end-of-burst
# bias test/test_windowed_accuracy.rb measures as SiteC's deficit.
#
#   ruby -Ilib bench/accuracy/burst_coverage.rb [PROCESSES (4)] [share (0.04)]
#
# Each process is fresh (the hook cost is measured once per process). Prints one line per process and
# the mean; needs a Ruby whose windowed mode has a ticker (3.3+), else windows change at GCs only.
require "json"
require_relative "fresh_processes"

STRETCHES = { "A" => 1, "B1" => 250, "B2" => 250, "B3" => 500, "C" => 100 }.freeze
BURSTS = 1_000

def child(share)
  require "heapscope"
  Object.const_set(:SiteA, Class.new)
  Object.const_set(:SiteB, Class.new)
  Object.const_set(:SiteC, Class.new)
  t = Heapscope::Testing
  seen = Hash.new(0)
  Heapscope.start(sampling: :windowed, window_share: share)
  x = 0
  BURSTS.times do
    20_000.times { x += 1 }
    h0 = t.hook_allocations
    SiteA.new
    h1 = t.hook_allocations
    250.times { SiteB.new }
    h2 = t.hook_allocations
    250.times { SiteB.new }
    h3 = t.hook_allocations
    500.times { SiteB.new }
    h4 = t.hook_allocations
    100.times { SiteC.new }
    h5 = t.hook_allocations
    [h1 - h0, h2 - h1, h3 - h2, h4 - h3, h5 - h4].zip(STRETCHES.keys) { |d, k| seen[k] += d }
  end
  stats = Heapscope.stats
  Heapscope.stop
  coverage = STRETCHES.to_h { |k, n| [k, seen[k].to_f / (n * BURSTS)] }
  puts JSON.generate(coverage: coverage, hook_on_share: stats[:hook_on_share], windows: stats[:windows_opened],
                     hook_cost_ns: stats[:hook_cost_ns])
end

processes, share, results = FreshProcesses.main(__FILE__) { |child_share| child(child_share) }
line = ->(label, cov, extra) { puts format("%-6s %s  %s", label, STRETCHES.keys.map { |k| format("%s %.4f", k, cov[k]) }.join("  "), extra) }
results.each_with_index do |r, i|
  line.call("run #{i + 1}", r["coverage"], format("hook_on_share %.4f windows %d hook_cost_ns %.1f", r["hook_on_share"], r["windows"], r["hook_cost_ns"]))
end
mean = STRETCHES.keys.to_h { |k| [k, results.sum { |r| r["coverage"][k] } / processes] }
line.call("mean", mean, format("C / B %.3f (1.000 when unbiased)", mean["C"] / ((mean["B1"] + mean["B2"] + 2 * mean["B3"]) / 4)))
