# frozen_string_literal: true

# bench/thread_lines.rb: what the profile says a line of Threads or Fibers holds, against the truth,
# with exact_threads on (the default) and off, over fresh processes at default settings (issue 31: one
# sampled Puma thread read as 1000 MiB; the census's bound then put all of a class's bytes at the one
# line sampled).
#
#   bundle exec ruby bench/thread_lines.rb [RUNS]
#
# Each process starts heapscope (defaults), makes 2 Threads at one line, 10 at another and 20 Fibers at
# a third, all kept alive, allocates 2 million small objects (half kept a while, so the hook samples
# and the GC runs), then writes a profile. Per line and mode: the truth (ObjectSpace.memsize_of of its
# objects), the runs whose estimate was above 2x the truth, the largest estimate over truth, and the
# runs that showed the line at all.
require "open3"
require "rbconfig"
require "json"

ROOT = File.expand_path("..", __dir__)
RUNS = Integer(ARGV[0] || 20)

CHILD = <<~'RUBY'
  require "heapscope"
  require "heapscope/report/sites"
  require "objspace"
  Heapscope.start(exact_threads: ARGV[0] == "on")
  q = Queue.new
  few = Array.new(2) { Thread.new { q.pop } }     # FEW
  many = Array.new(10) { Thread.new { q.pop } }   # MANY
  fibers = Array.new(20) { Fiber.new { Fiber.yield } } # FIBERS
  fibers.each(&:resume)
  keep = []
  2_000_000.times { |i| keep << "s#{i}"; keep.shift(1000) if keep.size > 200_000 }
  path = ARGV[1]
  Heapscope.write(path, gc: true)
  prof = Heapscope::Report::Sites.load(path)
  ti = prof.sample_type_names.index("inuse_space")
  out = { "FEW" => few, "MANY" => many, "FIBERS" => fibers }.to_h do |marker, objs|
    line = ARGV[2 + %w[FEW MANY FIBERS].index(marker)].to_i
    # The line's Threads or Fibers (its blocks' Procs are not counted in the truth either).
    est = prof.samples.sum do |s|
      leaf = s.frames.first
      leaf && leaf.file == "-e" && leaf.line == line && %w[Thread Fiber].include?(s.labels["class"]) ? s.values[ti] : 0
    end
    [marker, [objs.sum { |o| ObjectSpace.memsize_of(o) }, est]]
  end
  puts JSON.generate(out)
  (few + many).size.times { q << 1 }
RUBY

lines = %w[FEW MANY FIBERS].map { |m| CHILD.lines.index { |l| l.include?("# #{m}") } + 1 }
results = Hash.new { |h, k| h[k] = [] }
%w[on off].each do |mode|
  RUNS.times do |run|
    path = File.join(ROOT, "tmp", "thread_lines_#{mode}_#{run}.pb.gz")
    out, status = Open3.capture2e({ "RUBYOPT" => nil }, RbConfig.ruby, "-I#{ROOT}/lib", "-e", CHILD, "--", mode, path, *lines.map(&:to_s))
    File.delete(path) if File.exist?(path)
    abort out unless status.success?
    JSON.parse(out.lines.last).each { |marker, pair| results[[mode, marker]] << pair }
  end
end
puts format("Ruby %s, %d fresh processes per mode; exact_threads on / off", RUBY_VERSION, RUNS)
puts format("%-8s %-4s %10s %10s %12s %10s", "line", "mode", "truth", "runs >2x", "max est/true", "shown")
results.each do |(mode, marker), pairs|
  truth = pairs.map(&:first).max
  ratios = pairs.map { |t, e| e.to_f / t }
  puts format("%-8s %-4s %8.1f KB %10d %12.1f %10d", marker, mode, truth / 1024.0, ratios.count { |r| r > 2 }, ratios.max,
              pairs.count { |_, e| e.positive? })
end
