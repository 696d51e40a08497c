# frozen_string_literal: true

require_relative "test_http_helper"
require "heapscope/surfaces/http_server"

# Issue 11, item 8: at the process's thread limit (`ulimit -u`) Thread.new raises ThreadError. The
# listener used to start a thread per request, so the first failure ended its accept thread for good
# with a backtrace on the application's stderr. The limit is simulated by making Thread.new fail in
# the listener's own threads (a real RLIMIT_NPROC does not bind root, which runs CI).
class TestHardeningHttpThreads < Minitest::Test
  include SurfacesTestHelper

  # Thread.new raises as at the thread limit while `failing` is set: for calls from the listener's
  # threads (named heapscope-http*), or from every thread when `everywhere` is set too.
  module ThreadLimit
    class << self
      attr_accessor :failing, :everywhere
    end

    def new(*args, **kwargs, &block)
      if ThreadLimit.failing && (ThreadLimit.everywhere || Thread.current.name.to_s.start_with?("heapscope-http"))
        raise ThreadError, "can't create Thread: Resource temporarily unavailable"
      end

      super
    end
  end
  Thread.singleton_class.prepend(ThreadLimit)

  def setup
    @source = FakeSource.new
    @servers = []
  end

  def teardown
    ThreadLimit.failing = ThreadLimit.everywhere = false
    @servers.each(&:stop)
  end

  def serve
    app = Heapscope::Rack.new(source: @source)
    server = Heapscope::HttpServer.new(host: "127.0.0.1", port: 0, app: app).start
    @servers << server
    server
  end

  def listener_threads
    Thread.list.select { |t| t.name.to_s.start_with?("heapscope-http") && t.alive? }
  end

  def test_the_listener_keeps_serving_when_no_thread_can_be_started
    others = listener_threads # of listeners that other tests in this process left behind
    server = serve
    _, err = capture_io do
      ThreadLimit.failing = true
      6.times do |i|
        status, headers, body = http_get(server.port, "/debug/pprof/heap", timeout: 5)
        assert_equal 200, status, "request #{i}"
        assert_equal Process.pid.to_s, headers["x-heapscope-pid"]
        refute_empty body
      end
      # A delta would hold the listener's only thread for N seconds: refused, with the reason.
      status, headers, body = http_get(server.port, "/debug/pprof/heap?seconds=1", timeout: 5)
      assert_equal 503, status
      assert_equal "5", headers["retry-after"]
      assert_match(/cannot start a thread to wait 1s for a delta profile/, body)
      assert server.running?
    end
    assert_empty err, "nothing reaches the application's stderr"
    assert_equal ["heapscope-http"], (listener_threads - others).map(&:name), "the loop serves alone"

    # Once threads can be started again, workers come back (tried at most once a second) and
    # deltas work again.
    ThreadLimit.failing = false
    wait_for("a worker thread", timeout: 10) do
      http_get(server.port, "/debug/pprof/heap", timeout: 5).first == 200 && (listener_threads - others).size > 1
    end
    assert_equal 200, http_get(server.port, "/debug/pprof/heap?seconds=1", timeout: 10).first
  end

  # A worker that is already running keeps serving even when no further thread can be started.
  def test_requests_queue_for_the_running_workers_at_the_limit
    server = serve
    assert_equal 200, http_get(server.port, "/debug/pprof/heap").first
    ThreadLimit.failing = true
    statuses = Array.new(6) { Thread.new { http_get(server.port, "/debug/pprof/heap", timeout: 5).first } }.map(&:value)
    assert_equal [200] * 6, statuses
    assert server.running?
  end

  # When even the listener's own thread cannot be started, start fails like a bind failure (which
  # autostart reports in one line, "cannot listen: ...; the listener is off"), and the port is closed.
  def test_start_at_the_thread_limit_raises_a_system_call_error
    port = free_port
    server = Heapscope::HttpServer.new(host: "127.0.0.1", port: port, app: Heapscope::Rack.new(source: @source))
    ThreadLimit.failing = ThreadLimit.everywhere = true
    error = assert_raises(Errno::EAGAIN) { server.start }
    ThreadLimit.failing = ThreadLimit.everywhere = false
    assert_match(/cannot start the listener thread \(can't create Thread/, error.message)
    refute server.running?
    assert_raises(Errno::ECONNREFUSED) { TCPSocket.new("127.0.0.1", port) }
  end
end
