# frozen_string_literal: true

# A small "request handler" that leaks: every request's session is remembered in a cache that is
# never pruned (see SessionCache#remember). Most other allocations are garbage after each request.
#
#   ruby -Ilib examples/leaky_app.rb [out.pb.gz]
#
# Runs 60,000 requests (about a second) under heapscope, writes a heap profile and prints the top live allocation sites.
require "heapscope"
require "json"

class SessionCache
  def initialize
    @sessions = {}
  end

  def remember(id, user)
    @sessions[id] = { user: user, token: "token-#{id}" * 4, seen_at: Time.now.to_f } # the leak
  end
end

class App
  def initialize
    @cache = SessionCache.new
  end

  def call(id)
    params = { "id" => id, "items" => Array.new(10) { |i| { "sku" => "sku-#{i}", "qty" => i } } }
    body = JSON.generate(params)                       # garbage after the request
    @cache.remember(id, "user-#{id % 100}")           # kept forever
    body.bytesize
  end
end

out = ARGV[0] || "heap.pb.gz"
Heapscope.start(sample_every: 100)
app = App.new
60_000.times { |id| app.call(id) }
Heapscope.write(out, gc: true)
stats = Heapscope.stats
# Who holds the leak: paths from a GC root to the leak line's sampled objects (docs/leak-hunting.md).
leak_line = File.readlines(__FILE__).index { |l| l.include?("# the leak") } + 1
# keys: true shows Hash keys' contents: this script's author is the operator (over HTTP it takes show_contents).
retainers = Heapscope::Retainers.text(Heapscope.retainers("leaky_app.rb:#{leak_line}", limit: 2, keys: true))
Heapscope.stop

puts "wrote #{out}: #{File.size(out)} bytes, #{stats[:tracked_objects]} objects tracked " \
     "(1 in #{stats[:sample_every]} allocations sampled, #{stats[:recorder_bytes] / 1024} KiB used by heapscope)"
puts
puts "== heapscope top #{out}"
require "heapscope/report/cli"
Heapscope::Report::CLI.run("top", [out, "-n", "8"])
puts
puts "== Heapscope.retainers(\"leaky_app.rb:#{leak_line}\"): who keeps the leak alive"
puts retainers
