# frozen_string_literal: true

# bench/retainers_cost.rb: the pause a retainers walk causes (Heapscope.retainers,
# ext/heapscope/retainers.c), per million live objects. For each size it keeps N small Arrays alive,
# then one sampled String behind all of them, so the walk must reach every object first; it reports the
# walk's time (the application's pause: GVL held, GC off), the objects visited and the walk's table bytes.
#
#   bundle exec ruby -Ilib bench/retainers_cost.rb [1000000 3000000 ...]
require "heapscope"

sizes = ARGV.empty? ? [1_000_000, 3_000_000] : ARGV.map { |a| Integer(a) }
line = File.readlines(__FILE__).index { |l| l.include?("# SAMPLED" + " SITE") } + 1

puts "| live objects | objects visited | walk (the pause) | per million visited | walk tables |"
puts "|---|---|---|---|---|"
sizes.each do |n|
  keep = Array.new(n) { |i| [i] }
  GC.start
  Heapscope.start(sample_every: 1, max_overhead: nil, sampling: :always)
  times = []
  report = nil
  3.times do
    keep << [+"behind everything"] # SAMPLED SITE
    report = Heapscope.retainers("#{File.basename(__FILE__)}:#{line}", time_limit: 60, max_memory: "4G")
    times << report[:seconds]
  end
  Heapscope.stop
  t = times.sort[1]
  visited = report[:visited]
  puts format("| %d | %d | %.0f ms | %.0f ms | %.0f MiB |", n, visited, t * 1000, t * 1000 / (visited / 1e6),
              report[:table_bytes] / 1048576.0)
  keep = nil
  GC.start
end
