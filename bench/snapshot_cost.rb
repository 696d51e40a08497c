# frozen_string_literal: true

# bench/snapshot_cost.rb: what a profile costs as the tracked set grows, and what tracking costs in
# memory. For each size it tracks N live objects (sample_every 1, budget off, 64 allocation sites,
# 4 classes), then takes 5 profiles and reports the median time with the GVL held (naming, measuring,
# grouping, copying) and without it (encoding, gzip), plus heapscope's bytes per tracked object.
#
#   bundle exec ruby -Ilib bench/snapshot_cost.rb [100000 1000000 ...]
require "heapscope"

sizes = ARGV.empty? ? [100_000, 1_000_000] : ARGV.map { |a| Integer(a) }

SITES = Array.new(64) do |i|
  kind = i % 4
  eval(<<~RUBY, binding, __FILE__, __LINE__ + 1) # rubocop:disable Security/Eval
    lambda do |keep, n|
      n.times { keep << #{["Object.new", "+'s#{i}'", "[#{i}]", "{ k: #{i} }"][kind]} }
    end
  RUBY
end

def median(values) = values.sort[values.size / 2]

puts "| tracked objects | profile (median of 5) | GVL held | encode + gzip (GVL released) | profile bytes | heapscope bytes / tracked object | record bytes |"
puts "|---|---|---|---|---|---|---|"
sizes.each do |n|
  Heapscope.start(sample_every: 1, max_overhead: nil, max_tracked_objects: n * 2)
  keep = []
  SITES.each { |site| site.call(keep, n / SITES.size) }
  GC.start
  runs = Array.new(5) do
    t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    bytes = Heapscope.profile.bytesize
    t1 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    s = Heapscope.stats
    [t1 - t0, s[:last_profile_gvl_ns] / 1e9, s[:last_profile_encode_ns] / 1e9, bytes]
  end
  s = Heapscope.stats
  printf("| %d | %.1f ms | %.1f ms | %.1f ms | %d | %.1f | %d |\n", s[:tracked_objects], median(runs.map { _1[0] }) * 1000,
         median(runs.map { _1[1] }) * 1000, median(runs.map { _1[2] }) * 1000, runs.last[3],
         s[:recorder_bytes].to_f / s[:tracked_objects], s[:record_bytes])
  keep = nil
  Heapscope.stop
  GC.start
end
