# frozen_string_literal: true

# A Rack app with a leak, served with Heapscope::Rack as middleware:
#
#   RUBYOPT=-rheapscope/auto rackup -s puma -p 9292 examples/surfaces/config.ru
#   curl localhost:9292/leak        # each request keeps 500 strings forever
#   go tool pprof -top -lines -sample_index=inuse_space http://127.0.0.1:9292/debug/pprof/heap
#
# examples/surfaces/puma_cluster.rb runs it in puma's cluster mode (one profile per worker).
require "heapscope/rack"

# Allocated at boot: with preload_app! this happens in puma's master and every worker inherits it.
PRELOADED = Array.new(5000) { |i| "preloaded-#{i}-" * 6 } # PRELOADED line

LEAKED = []

# Each worker keeps objects of its own (see puma_cluster.rb); the sites differ by worker index.
module WorkerOwn
  def self.even
    $worker_own = Array.new(5000) { |i| "even-worker-#{i}-" * 6 } # EVEN line
  end

  def self.odd
    $worker_own = Array.new(5000) { |i| "odd-worker-#{i}-" * 6 } # ODD line
  end
end

use Heapscope::Rack
run(lambda do |env|
  if env["PATH_INFO"] == "/leak"
    500.times { |i| LEAKED << "request-leak-#{i}-" * 6 } # REQUEST LEAK line
  end
  [200, { "content-type" => "text/plain" }, ["pid #{Process.pid}\n"]]
end)
