# frozen_string_literal: true

# bench/debug_text_cost.rb: what ?debug=1 costs the application. The text is built in Ruby with the
# GVL held (decode the profile, rank its sites), so this measures an application thread's loop (0.3 ms
# of Ruby work and a 1 ms sleep per turn, like a request waiting on a database) alone and while
# CLIENTS debug=1 requests are made at once, with SITES allocation sites each holding two tracked
# objects (sample_every 1). It prints each request's status and time, the loop's speed during them,
# and the application time lost per request and per profile sample.
#
#   bundle exec ruby -Ilib bench/debug_text_cost.rb [SITES=40000] [CLIENTS=2]
require "heapscope"
require "heapscope/surfaces/rack"

sites = Integer(ARGV[0] || 40_000)
clients = Integer(ARGV[1] || 2)
Heapscope.start(sample_every: 1, max_overhead: nil)
KEEP = [] # rubocop:disable Lint/ConstantDefinitionInBlock
eval((1..sites).map { |i| "KEEP << +\"s#{i}\"" }.join("\n"), binding, "/app/sites.rb", 1) # rubocop:disable Security/Eval
GC.start
app = Heapscope::Rack.app
samples = Heapscope::Pprof.decode(Heapscope.profile).samples.size
Heapscope::Rack::TEXT_LIMITER.reset if defined?(Heapscope::Rack::TEXT_LIMITER)

def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

turns = 0
stop = false
loop_thread = Thread.new do
  until stop
    x = 0
    2000.times { x += 1 }
    sleep 0.001
    turns += 1
  end
end
sleep 1
t0 = now
before = turns
sleep 3
alone = (turns - before) / (now - t0)
t0 = now
before = turns
results = Array.new(clients) do
  Thread.new do
    started = now
    status, = app.call("REQUEST_METHOD" => "GET", "PATH_INFO" => "/debug/pprof/heap", "QUERY_STRING" => "debug=1",
                       "SCRIPT_NAME" => "")
    [status, now - started]
  end
end.map(&:value)
elapsed = now - t0
during = (turns - before) / elapsed
lost = elapsed - (turns - before) / alone
served = results.count { |status, _| status == 200 }
stop = true
loop_thread.join
puts "#{sites} sites, #{samples} profile samples, #{clients} debug=1 requests at once (Ruby #{RUBY_VERSION})"
results.each { |status, took| printf("  %d in %.2f s\n", status, took) }
printf("application loop: %.0f turns/s alone, %.0f/s during the requests (%.2f s): %.0f%% of its speed\n",
       alone, during, elapsed, 100.0 * during / alone)
printf("application time lost: %.2f s, %.2f s per text served, %.0f us per profile sample\n",
       lost, lost / [served, 1].max, lost / [served, 1].max / samples * 1e6)
