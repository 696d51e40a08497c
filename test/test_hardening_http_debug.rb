# frozen_string_literal: true

require_relative "test_http_helper"
require "heapscope/rack"

# Issue 12, item 9: ?debug=1 decodes and ranks the profile in Ruby with the GVL held, 110-130 us of
# the application's time per sample, with no limit: two requests on 40,000 sites (sample_every 1)
# took 50 s each while an application loop ran 4-15 times a second instead of 380-670. Now one text
# at a time (429 beyond), a CPU bucket (a fifth of one core on average), and the GVL handed over
# every 0.5 ms. bench/debug_text_cost.rb measures the full-size case.
class TestHardeningHttpDebug < Minitest::Test
  include SurfacesTestHelper

  # A clock the test moves by hand.
  class Clock
    attr_accessor :now

    def initialize
      @now = 1000.0
    end

    def to_proc
      -> { @now }
    end
  end

  def setup
    Heapscope::Rack::TEXT_LIMITER.reset if defined?(Heapscope::Rack::TEXT_LIMITER)
  end

  def get(app, path, query = "")
    status, headers, body = app.call("REQUEST_METHOD" => "GET", "SCRIPT_NAME" => "", "PATH_INFO" => path, "QUERY_STRING" => query)
    [status, headers, body.to_a.join]
  end

  # A source whose profile waits until released, so a text stays "being built".
  class HeldSource < FakeSource
    attr_reader :entered

    def initialize
      super
      @entered = Thread::Queue.new
      @release = Thread::Queue.new
    end

    def profile(gc: false, type: :heap)
      @entered << true
      @release.pop
      super
    end

    def release!(n)
      n.times { @release << true }
    end
  end

  def test_texts_beyond_one_at_a_time_get_429_at_once
    source = HeldSource.new
    app = Heapscope::Rack.new(source: source)
    first = Thread.new { get(app, "/debug/pprof/heap", "debug=1") }
    Timeout.timeout(10) { source.entered.pop }
    others = Array.new(7) { Thread.new { get(app, "/debug/pprof/heap", "debug=1") } }
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    answers = Timeout.timeout(10) do
      loop do
        break others.map(&:value) if others.none?(&:alive?)
        break nil if source.entered.size.positive? # a second text started building: not refused

        sleep 0.01
      end
    end
    source.release!(8)
    refute_nil answers, "a second debug=1 text was built while the first was"
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, :<, 5
    answers.each do |status, headers, body|
      assert_equal 429, status
      assert_equal "1", headers["retry-after"]
      assert_match(/\Aanother debug=1 text is being built in this process \(one at a time\); retry in 1s/, body)
    end
    assert_equal 200, first.value[0]
    # The binary profile is not limited.
    source.release!(1)
    assert_equal 200, get(app, "/debug/pprof/heap")[0]
  ensure
    source&.release!(16)
  end

  def test_the_cpu_bucket_bounds_texts_to_a_share_of_one_core
    clock = Clock.new
    limiter = Heapscope::Rack::TextLimiter.new(share: 0.2, burst: 1.0, clock: clock.to_proc)
    assert_nil limiter.acquire
    limiter.release(3.0) # a text of 3 s CPU overdraws the 1 s bucket by 2 s: 10 s to refill at 0.2/s
    why, wait = limiter.acquire
    assert_equal 10, wait
    assert_match(/\Adebug=1 texts may use at most 20% of one core: the last one took 3.00s of CPU\z/, why)
    clock.now += 9.9
    assert_equal 1, limiter.acquire[1]
    clock.now += 0.2
    assert_nil limiter.acquire
    limiter.release(0.01)
    # Small texts back to back are never held back (the bucket is refilled faster than they drain it
    # at human speed, and holds a second).
    20.times do
      clock.now += 0.05
      assert_nil limiter.acquire
      limiter.release(0.01)
    end
    assert_raises(ArgumentError) { Heapscope::Rack::TextLimiter.new(share: 0) }
  end

  def test_a_refused_text_says_why_through_rack
    clock = Clock.new
    limiter = Heapscope::Rack::TextLimiter.new(clock: clock.to_proc)
    source = FakeSource.new
    app = Heapscope::Rack.new(source: source, text_limiter: limiter)
    assert_equal 200, get(app, "/debug/pprof/heap", "debug=1")[0]
    assert_nil limiter.acquire
    limiter.release(2.0) # as if a text of 2 s CPU had just ended
    calls = source.calls.size
    status, headers, body = get(app, "/debug/pprof/allocs", "debug=1")
    assert_equal 429, status
    assert_operator headers["retry-after"].to_i, :>=, 4
    assert_match(/may use at most 20% of one core.*the pprof profile, without debug=1, is not limited/, body)
    assert_equal calls, source.calls.size, "a refused text builds no profile"
  end

  # The application's own thread keeps running during a text of many sites: a loop that sleeps 1 ms
  # per turn (like a request waiting on a database) ran at 3-5% of its speed behind one text before
  # (each wake-up waited for Ruby's 100 ms time slice) and runs at 40-55% now.
  def test_an_application_thread_keeps_running_during_a_text_of_many_sites
    skip_unless_native
    script = <<~'RUBY'
      require "heapscope"
      require "heapscope/rack"
      Heapscope.start(sample_every: 1, max_overhead: nil)
      KEEP = []
      eval((1..6000).map { |i| "KEEP << +\"s#{i}\"" }.join("\n"), binding, "/app/sites.rb", 1)
      GC.start
      app = Heapscope::Rack.app
      turns = 0
      stop = false
      loop_thread = Thread.new { until stop; x = 0; 500.times { x += 1 }; sleep 0.001; turns += 1; end }
      best = 0
      elapsed = 0
      3.times do # the best of three, so that one stall of a loaded machine does not decide
        Heapscope::Rack::TEXT_LIMITER.reset if defined?(Heapscope::Rack::TEXT_LIMITER)
        t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        before = turns
        sleep 0.5
        alone = (turns - before) / (Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0)
        t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        before = turns
        status, = app.call("REQUEST_METHOD" => "GET", "PATH_INFO" => "/debug/pprof/heap", "QUERY_STRING" => "debug=1", "SCRIPT_NAME" => "")
        raise "status #{status}" unless status == 200
        took = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0
        ratio = (turns - before) / took / alone
        best, elapsed = ratio, took if ratio > best
      end
      stop = true
      loop_thread.join
      puts "#{best.round(3)} #{elapsed.round(2)}"
    RUBY
    out, err, status = Timeout.timeout(240) do
      require "open3"
      Open3.capture3(RbConfig.ruby, "-I#{LIB}", "-e", script)
    end
    assert status.success?, err
    ratio, took = out.split.map(&:to_f)
    puts "app loop at #{ratio} of its speed during a #{took}s text" if ENV["VERBOSE"]
    # A text must be long enough for the time slice to show (0.5-1.5 s here).
    assert_operator took, :>, 0.3, "the text took #{took}s"
    # Before: 3-5% of the loop's speed alone; after: 40-55%. 20% leaves room both ways.
    assert_operator ratio, :>, 0.2, "the application loop ran at #{(ratio * 100).round}% of its speed during a #{took}s text"
  end
end
