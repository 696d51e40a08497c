# frozen_string_literal: true

# A long-running process with a leak, for trying the no-code surfaces:
#
#   RUBYOPT=-rheapscope/auto HEAPSCOPE_HTTP=127.0.0.1:6060 ruby examples/surfaces/leaky_service.rb
#   go tool pprof -top -lines -sample_index=inuse_space http://127.0.0.1:6060/debug/pprof/heap
#
# The leak is the line marked LEAK below; everything else it allocates is garbage at once.
# It prints "ready" once the leak is in place, then runs until killed (or for ARGV[0] seconds).
class Cache
  def initialize
    @entries = []
  end

  def remember(i)
    @entries << "session-#{i}-" * 8 # LEAK: every entry is kept forever
  end
end

def churn(i)
  Array.new(4) { |j| "temporary #{i} #{j}" }.join(",") # garbage: freed right away
end

cache = Cache.new
20_000.times do |i|
  cache.remember(i)
  churn(i)
end
GC.start
$stdout.puts "ready"
$stdout.flush
deadline = ARGV[0] ? Process.clock_gettime(Process::CLOCK_MONOTONIC) + Float(ARGV[0]) : nil
i = 20_000
loop do
  break if deadline && Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

  50.times do
    cache.remember(i += 1)
    churn(i)
  end
  sleep 0.05
end
