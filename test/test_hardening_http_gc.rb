# frozen_string_literal: true

require_relative "test_http_helper"
require "heapscope/surfaces/http_server"

# Issue 11, item 5: ?gc=1 forces a full GC, which stops the whole process (0.2-1.4 s at 3M
# objects), and had no limit: two clients looping on it stalled the application. Now at most one
# forced GC per Heapscope::Rack.gc_interval seconds (10) in the process, shared by every middleware
# and the standalone listener; other gc=1 requests are served without a GC and say so.
class TestHardeningHttpGc < Minitest::Test
  include SurfacesTestHelper

  def setup
    @source = FakeSource.new
    @clock = Clock.new
    @servers = []
  end

  def teardown
    @servers.each(&:stop)
    Heapscope::Rack::GC_LIMITER.reset if defined?(Heapscope::Rack::GC_LIMITER)
  end

  def limiter(interval = 10)
    Heapscope::Rack::GcLimiter.new(interval: interval, clock: @clock.to_proc)
  end

  def get(app, path, query = "")
    status, headers, body = app.call("REQUEST_METHOD" => "GET", "SCRIPT_NAME" => "", "PATH_INFO" => path, "QUERY_STRING" => query)
    [status, headers, body.to_a.join]
  end

  def gc_calls
    @source.calls.map(&:first)
  end

  def test_one_forced_gc_per_interval_the_others_are_served_without_one
    app = Heapscope::Rack.new(source: @source, gc_limiter: limiter(10))
    status, headers, = get(app, "/debug/pprof/heap", "gc=1")
    assert_equal 200, status
    assert_equal "forced", headers["x-heapscope-gc"]
    @clock.now += 4
    status, headers, body = get(app, "/debug/pprof/heap", "gc=1")
    assert_equal 200, status, "served, not refused"
    assert_equal "skipped; retry-after=6", headers["x-heapscope-gc"]
    refute_empty body
    _, headers, text = get(app, "/debug/pprof/allocs", "gc=1&debug=1")
    assert_equal "skipped; retry-after=6", headers["x-heapscope-gc"]
    assert_match(/^# gc=1 skipped: at most one forced GC per 10s in this process; the next is allowed in 6s;/, text)
    _, headers, = get(app, "/debug/pprof/heap")
    assert_nil headers["x-heapscope-gc"], "no header when no GC was asked for"
    @clock.now += 6
    _, headers, = get(app, "/debug/pprof/heap", "gc=1")
    assert_equal "forced", headers["x-heapscope-gc"]
    assert_equal [true, false, false, false, true], gc_calls
  end

  # The interval counts from the end of the forced GC, so a GC that takes long is not followed at once.
  def test_the_interval_starts_when_the_forced_gc_ends
    clock = @clock
    slow = FakeSource.new
    slow.define_singleton_method(:profile) do |gc: false, type: :heap|
      clock.now += 3 if gc
      super(gc: gc, type: type)
    end
    app = Heapscope::Rack.new(source: slow, gc_limiter: limiter(10))
    get(app, "/debug/pprof/heap", "gc=1")
    @clock.now += 9
    assert_equal "skipped; retry-after=1", get(app, "/debug/pprof/heap", "gc=1")[1]["x-heapscope-gc"]
  end

  # By default every Heapscope::Rack in the process (middleware and listener alike) shares one limit.
  def test_the_default_limit_is_process_wide
    Heapscope::Rack::GC_LIMITER.reset
    assert_equal 10, Heapscope::Rack.gc_interval
    middleware = Heapscope::Rack.new(->(_env) { [200, {}, ["app"]] }, source: @source)
    standalone = Heapscope::Rack.new(source: @source)
    assert_equal "forced", get(middleware, "/debug/pprof/heap", "gc=1")[1]["x-heapscope-gc"]
    assert_match(/\Askipped; retry-after=(10|9)\z/, get(standalone, "/debug/pprof/heap", "gc=1")[1]["x-heapscope-gc"])
    assert_equal [true, false], gc_calls
  end

  def test_the_interval_can_be_set_and_zero_turns_the_limit_off
    app = Heapscope::Rack.new(source: @source, gc_limiter: limiter(0))
    3.times { assert_equal "forced", get(app, "/debug/pprof/heap", "gc=1")[1]["x-heapscope-gc"] }
    assert_raises(ArgumentError) { Heapscope::Rack::GcLimiter.new(interval: -1) }
    before = Heapscope::Rack.gc_interval
    Heapscope::Rack.gc_interval = 30
    assert_equal 30, Heapscope::Rack::GC_LIMITER.interval
  ensure
    Heapscope::Rack.gc_interval = before if before
  end

  # A delta forces a GC at both ends or at neither, and holds the booking over its window.
  def test_a_delta_collects_at_both_ends_or_neither
    app = Heapscope::Rack.new(source: @source, gc_limiter: Heapscope::Rack::GcLimiter.new(interval: 10))
    status, headers, = get(app, "/debug/pprof/heap", "seconds=1&gc=1")
    assert_equal 200, status
    assert_equal "forced", headers["x-heapscope-gc"]
    assert_equal [true, true], gc_calls
    status, headers, = get(app, "/debug/pprof/heap", "seconds=1&gc=1")
    assert_equal 200, status
    assert_match(/\Askipped; retry-after=\d+\z/, headers["x-heapscope-gc"])
    assert_equal [true, true, false, false], gc_calls
  end

  # The attack of the issue, through the listener: clients looping on ?gc=1 get one GC per interval.
  # (Written against the API both before and after the limit, so it shows the old behaviour fail.)
  def test_clients_looping_on_gc_through_the_listener_force_one_gc
    Heapscope::Rack::GC_LIMITER.reset if defined?(Heapscope::Rack::GC_LIMITER)
    server = Heapscope::HttpServer.new(host: "127.0.0.1", port: 0, app: Heapscope::Rack.new(source: @source)).start
    @servers << server
    notes = Array.new(2) do
      Thread.new { Array.new(10) { http_get(server.port, "/debug/pprof/heap?gc=1").then { |s, h, _| [s, h["x-heapscope-gc"]] } } }
    end.flat_map(&:value)
    assert_equal [200], notes.map(&:first).uniq
    assert_equal 1, gc_calls.count(true), gc_calls.inspect
    assert_equal 20, gc_calls.size
    assert_equal 1, notes.count { |_, note| note == "forced" }
    assert_equal 19, notes.count { |_, note| note.to_s.start_with?("skipped; retry-after=") }
  end

  # Each process has its own heap and GCs: a forked child (a puma worker) gets its own allowance.
  def test_a_forked_child_has_its_own_allowance
    shared = limiter(10)
    assert_equal 0, shared.acquire
    shared.release
    assert_operator shared.acquire, :>, 0
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      writer.puts(shared.acquire)
      writer.close
      exit!(0)
    end
    writer.close
    assert_equal "0", Timeout.timeout(10) { reader.read.strip }
    Process.wait(pid)
    assert_operator shared.acquire, :>, 0, "the parent's booking stands"
  ensure
    reader&.close
  end
end
