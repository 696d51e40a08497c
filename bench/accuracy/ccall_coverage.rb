# frozen_string_literal: true

# Where the windowed hook is on around a long C call: the json_parse accuracy workload's shape (one
# JSON::Parser#parse of about 200k objects, which checks no interrupts, then 20k strings made in Ruby),
# with the share of each part's allocations the hook saw (Heapscope::Testing.hook_allocations before
# and after it), the share of parses it saw anything of, and the weight scale the run ended with.
# A parse's allocations follow the hook's state at the last sync point before them (the call's start,
# a GC inside it), so they are seen at about the planned share; Ruby code loses the windows shorter than
# the ticker's wake-up delay and runs slower with the hook on. One global weight scale cannot be right
# for both.
#
#   ruby -Ilib bench/accuracy/ccall_coverage.rb [PROCESSES (4)] [share (0.04)]
#
# Prints one line per process and the mean; needs a Ruby whose windowed mode has a ticker (3.3+).
require "json"
require_relative "fresh_processes"

PARSES = 12
DOCS = 20_000

def child(share)
  require "heapscope"
  text = JSON.generate(Array.new(DOCS) { |i| { "id" => i, "name" => "user#{i}", "tags" => ["t#{i % 7}", "tag"], "z" => "z" * (i % 50) } })
  fill = Array.new(128) { |n| ("s" * n).freeze }
  t = Heapscope::Testing
  seen = Hash.new(0)
  made = Hash.new(0)
  kept = []
  touched = 0
  Heapscope.start(sampling: :windowed, window_share: share)
  PARSES.times do |p|
    h0 = t.hook_allocations
    v0 = GC.stat(:total_allocated_objects)
    docs = JSON::Parser.new(text).parse
    h1 = t.hook_allocations
    v1 = GC.stat(:total_allocated_objects)
    kept[p % 3] = docs.map { |d| String.new << fill[d["id"] % 128] }
    h2 = t.hook_allocations
    v2 = GC.stat(:total_allocated_objects)
    seen["parse"] += h1 - h0
    made["parse"] += v1 - v0
    seen["ruby"] += h2 - h1
    made["ruby"] += v2 - v1
    touched += 1 if h1 > h0
  end
  stats = Heapscope.stats
  Heapscope.stop
  puts JSON.generate(coverage: seen.to_h { |k, n| [k, n.to_f / made[k]] }, parses_seen: touched.to_f / PARSES,
                     weight_scale: stats[:weight_scale_wanted], hook_on_share: stats[:hook_on_share], windows: stats[:windows_opened])
end

processes, share, results = FreshProcesses.main(__FILE__) { |child_share| child(child_share) }
line = lambda do |label, r|
  puts format("%-7s parse %.4f  ruby %.4f  parses seen %.3f  weight_scale %.2f  hook_on_share %.4f  windows %.0f", label,
              r["coverage"]["parse"], r["coverage"]["ruby"], r["parses_seen"], r["weight_scale"], r["hook_on_share"], r["windows"])
end
results.each_with_index { |r, i| line.call("run #{i + 1}", r) }
mean = ->(&pick) { results.sum(&pick) / processes }
line.call("mean", { "coverage" => { "parse" => mean.call { |r| r["coverage"]["parse"] }, "ruby" => mean.call { |r| r["coverage"]["ruby"] } },
                    "parses_seen" => mean.call { |r| r["parses_seen"] }, "weight_scale" => mean.call { |r| r["weight_scale"] },
                    "hook_on_share" => mean.call { |r| r["hook_on_share"] }, "windows" => mean.call { |r| r["windows"] } })
puts format("the profile weighs every sample by one scale: share / seen over all allocations (planned share %.2f)", share)
