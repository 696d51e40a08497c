# frozen_string_literal: true

# How much of its share of allocations the windowed hook sees in allocation-dense Ruby code, and why it
# sees less: a steady loop of short-lived strings (about 6M allocations) under the default mode, in
# fresh processes. Per process: the share of time the ticker requested "on" (requested_share), the share
# of virtual time the hook was really on (realized_share), the share of allocations it saw
# (hook_on_share), their ratio (hook_on_share / realized_share: below 1 where the program runs slower
# with the hook on than virtual time charges for), the hook cost calibrated at load (hook_cost_ns) and
# the weight scale the ratio of allocations asks for. docs/architecture.md reads these.
#
#   ruby -Ilib bench/accuracy/hook_charge.rb [PROCESSES (4)] [share (0.04)]
#
# Needs a Ruby whose windowed mode has a ticker (3.3+).
require "json"
require_relative "fresh_processes"

def child(share)
  require "heapscope"
  Heapscope.start(sampling: :windowed, window_share: share)
  ring = []
  3_000_000.times do |i|
    ring << "x#{i}"
    ring.shift if ring.size > 1000
  end
  s = Heapscope.stats
  abort "no ticker on this Ruby: windows change at GCs only" unless s[:sync_jobs].positive?
  keys = %i[requested_share realized_share hook_on_share hook_cost_ns weight_scale_wanted windows_opened]
  puts JSON.generate(s.slice(*keys))
end

processes, share, runs = FreshProcesses.main(__FILE__) { |s| child(s) }
line = lambda do |label, r|
  puts format("%-7s requested %.4f  realized %.4f  hook_on_share %.4f  seen/on-time %.3f  " \
              "hook_cost_ns %5.1f  weight_scale %.2f  windows %.0f",
              label, r["requested_share"], r["realized_share"], r["hook_on_share"],
              r["hook_on_share"] / r["realized_share"], r["hook_cost_ns"], r["weight_scale_wanted"], r["windows_opened"])
end
runs.each_with_index { |r, i| line.call("run #{i + 1}", r) }
mean = runs.first.keys.to_h { |k| [k, runs.sum { |r| r[k] } / runs.size] }
line.call("mean", mean)
puts "(#{processes} processes, share #{share})"
