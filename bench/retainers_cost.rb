# frozen_string_literal: true

# bench/retainers_cost.rb: what a retainers walk (Heapscope.retainers, ext/heapscope/retainers.c)
# costs the application, per million live objects. Two heaps per size N:
#   arrays:  N small Arrays kept alive, then one sampled String behind all of them, so the walk must
#            reach every object first (the worst case for the walk);
#   strings: one N-element Array of sampled Strings (a site held by a big container: the naming reads
#            that Array once; Strings are leaves the walk does not keep).
# For each it reports the walk's time and the whole call's, the objects reached, the longest pause the
# walk caused (its own measure, and the longest gap a thread sleeping 1 ms in a loop saw) and the RSS
# the call added at its highest (read by that thread each millisecond). The median of 3 runs.
#
#   bundle exec ruby -Ilib bench/retainers_cost.rb [1000000 3000000 ...]
require "heapscope"

sizes = ARGV.empty? ? [1_000_000, 3_000_000] : ARGV.map { |a| Integer(a) }
FILE = File.basename(__FILE__)
LINES = %w[ARRAYS STRINGS].to_h { |k| [k, File.readlines(__FILE__).index { |l| l.include?("# #{k}" + " SITE") } + 1] }

def rss_mb
  File.read("/proc/self/status")[/^VmRSS:\s+(\d+)/, 1].to_i / 1024.0
end

# Runs the block while a thread sleeps 1 ms in a loop; returns [block's value, longest gap seen, highest
# RSS seen (MB)].
def with_ticker
  longest = 0.0
  peak = 0.0
  ticks = 0
  stop = false
  ticker = Thread.new do
    last = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    until stop
      sleep 0.001
      now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      longest = [longest, now - last].max
      peak = [peak, rss_mb].max
      last = now
      ticks += 1
    end
  end
  Thread.pass until ticks > 3
  longest = 0.0
  value = yield
  stop = true
  ticker.join
  [value, longest, peak]
end

def measure(site)
  runs = Array.new(3) do
    GC.start
    before = rss_mb
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    report, gap, peak = with_ticker { Heapscope.retainers(site, time_limit: 60, max_memory: "4G") }
    total = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    { report: report, gap: gap, total: total, rss: [peak, rss_mb].max - before }
  end
  runs.sort_by { |r| r[:total] }[1]
end

puts "| heap | live objects | reached | walk | whole call | per million reached | longest pause (walk / app) | RSS added (peak) |"
puts "|---|---|---|---|---|---|---|---|"
sizes.each do |n|
  %w[arrays strings].each do |heap|
    keep = nil
    if heap == "arrays"
      keep = Array.new(n) { |i| [i] }
      Heapscope.start(sample_every: 1, max_overhead: nil, sampling: :always)
      keep << [+"behind everything"] # ARRAYS SITE
    else
      Heapscope.start(sample_every: 1, max_overhead: nil, sampling: :always)
      keep = Array.new(n) { |i| +"element #{i}" } # STRINGS SITE
    end
    m = measure("#{FILE}:#{LINES[heap.upcase]}")
    r = m[:report]
    warn "cut short: #{r[:cut_short]}" if r[:cut_short]
    puts format("| %s | %d | %d | %.0f ms | %.0f ms | %.0f ms | %.0f / %.0f ms | %+.0f MB |", heap, n, r[:visited], r[:seconds] * 1000,
                m[:total] * 1000, m[:total] * 1000 / (r[:visited] / 1e6), r[:longest_pause] * 1000, m[:gap] * 1000, m[:rss])
    Heapscope.stop
    keep = nil
    GC.start
  end
end
