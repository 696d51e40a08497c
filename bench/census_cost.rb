# frozen_string_literal: true

# bench/census_cost.rb: what the census (ext/heapscope/census.c: exact live totals per type and class
# at every profile) costs as the heap grows. For each size it keeps N live objects of a mix of types
# (plain objects with an ivar, Strings of 0-200 bytes, small Arrays and Hashes, 2,000 classes' worth of
# instances), takes 5 profiles with the default sampling and reports the median census time (GVL held,
# stats[:last_census_ns]) per million live objects, beside the whole profile's GVL time with and
# without the census.
#
#   bundle exec ruby -Ilib bench/census_cost.rb [1000000 3000000 ...]
require "heapscope"

sizes = ARGV.empty? ? [1_000_000, 3_000_000] : ARGV.map { |a| Integer(a) }
CLASSES = Array.new(2_000) { Class.new { def initialize(v) = @v = v } }

def median(values) = values.sort[values.size / 2]

def profile_times(census)
  Heapscope.start(census: census)
  runs = Array.new(5) do
    Heapscope.profile
    s = Heapscope.stats
    [s[:last_census_ns] / 1e9, s[:last_profile_gvl_ns] / 1e9]
  end
  live = GC.stat(:heap_live_slots)
  Heapscope.stop
  [median(runs.map(&:first)), median(runs.map(&:last)), live]
end

puts "| live slots | census (median of 5) | per million live objects | profile's GVL time with census | without |"
puts "|---|---|---|---|---|"
sizes.each do |n|
  keep = Array.new(n / 5) { |i| [Object.new.tap { |o| o.instance_variable_set(:@a, i) }, "s" * (i % 200)] }
  keep.concat(Array.new(n / 10) { |i| { k: i } })
  keep.concat(Array.new(n / 10) { |i| CLASSES[i % CLASSES.size].new(i) })
  GC.start
  census, with, live = profile_times(true)
  _, without, = profile_times(false)
  printf("| %d | %.1f ms | %.1f ms | %.1f ms | %.1f ms |\n", live, census * 1000, census * 1000 / (live / 1e6), with * 1000, without * 1000)
  keep = nil
  GC.start
end
