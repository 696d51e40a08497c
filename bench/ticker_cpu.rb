# frozen_string_literal: true

# What windowed sampling costs in CPU time, the ticker thread included (docs/windowed-sampling.md, "What
# the ticker costs"): three program shapes, each in fresh processes without heapscope, with its default
# and with a fixed window share of 0.04, printing the process's CPU time and the ticker's.
#
#   ruby -Ilib bench/ticker_cpu.rb [SECONDS]      (Ruby 3.3+; 8 s per process by default)
#
# Shapes: idle (one sleep), paced (about 125 allocations, then a 1 ms wait, over and over), busy (a
# CPU-bound loop that allocates). On a shared machine run it twice: CPU times move with the load.
require "rbconfig"

SHAPES = %w[idle paced busy].freeze
MODES = %w[none default fixed].freeze

def child(shape, mode, seconds)
  unless mode == "none"
    require "heapscope"
    mode == "default" ? Heapscope.start : Heapscope.start(window_share: 0.04)
  end
  keep = Array.new(16_000)
  cpu0 = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
  t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  j = 0
  case shape
  when "idle" then sleep seconds
  else
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0 < seconds
      100.times { |i| "x" * (i + 20) }
      8.times { |i| { id: i } }
      2.times { |i| keep[(2 * j + i) % keep.size] = "l" * (60 + j % 120) }
      j += 1
      sleep 0.001 if shape == "paced"
    end
  end
  cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - cpu0
  stats = mode == "none" ? {} : Heapscope.stats
  format("%-6s %-8s cpu %7.3f s  jobs done %7d  share %-6s ticker %7.1f ms in %6d wake-ups  own %6.1f ms",
         shape, mode, cpu, j, stats[:window_share] || "-", stats[:ticker_cpu_ns].to_f / 1e6,
         stats[:ticker_wakeups].to_i, stats[:own_ns].to_f / 1e6)
end

if ARGV[0] == "--child"
  puts child(ARGV[1], ARGV[2], Float(ARGV[3]))
else
  seconds = Float(ARGV.fetch(0, "8"))
  lib = File.expand_path("../lib", __dir__)
  SHAPES.each do |shape|
    MODES.each do |mode|
      out = IO.popen([RbConfig.ruby, "-I#{lib}", __FILE__, "--child", shape, mode, seconds.to_s], &:read)
      abort "bench/ticker_cpu.rb: the #{shape}/#{mode} process failed" unless $?.success?
      puts out
    end
  end
end
