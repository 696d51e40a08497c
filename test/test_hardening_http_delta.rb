# frozen_string_literal: true

require_relative "test_http_helper"
require "heapscope/surfaces/rack"

# Issue 12, item 12: a Rack ?seconds=N delta slept N seconds (up to 300) on the server's thread: under
# `puma -t 1:1` an ordinary request waited 9 s behind a seconds=10. Now, when the server offers a full
# rack.hijack, a heapscope thread takes the socket over for the wait and the server's thread is free
# at once; a server without one may be held for at most Rack::HELD_MAX_SECONDS (400 beyond).
class TestHardeningHttpDelta < Minitest::Test
  include SurfacesTestHelper

  def setup
    @source = FakeSource.new
    @tmp = Dir.mktmpdir("heapscope-delta")
  end

  def teardown
    reap_children
    FileUtils.rm_rf(@tmp) if @tmp
  end

  def now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  # An env like Puma's: a full hijack hands over one end of a socket pair; the test reads the other.
  def hijack_env(query, method: "GET")
    ours, theirs = UNIXSocket.pair
    @peers = (@peers || []) << theirs
    env = { "REQUEST_METHOD" => method, "SCRIPT_NAME" => "", "PATH_INFO" => "/debug/pprof/heap", "QUERY_STRING" => query,
            "rack.hijack?" => true, "rack.hijack" => -> { ours } }
    [env, theirs]
  end

  def test_a_hijacked_delta_frees_the_servers_thread_and_answers_on_the_socket
    app = Heapscope::Rack.new(source: @source)
    env, peer = hijack_env("seconds=1")
    started = now
    app.call(env)
    assert_operator now - started, :<, 0.5, "the call returned at once"
    # A second delta while the first waits: 429 at once, as before.
    assert_equal 429, app.call("REQUEST_METHOD" => "GET", "PATH_INFO" => "/debug/pprof/heap", "QUERY_STRING" => "seconds=1")[0]
    status, headers, body = parse_response(Timeout.timeout(20) { peer.read })
    assert_operator now - started, :>=, 1, "the answer came after the window"
    assert_equal 200, status
    assert_equal "close", headers["connection"]
    assert_equal Process.pid.to_s, headers["x-heapscope-pid"]
    assert_equal 'attachment; filename="heap-delta-1s.pb.gz"', headers["content-disposition"]
    prof = Heapscope::Pprof.decode(body)
    leak = prof.samples.find { |s| s.frames.first.function == "leak" }
    assert_equal 100, leak.value("inuse_space"), "the change over the window"
    # The slot is free again once the answer is written.
    wait_for("the slot to be free", timeout: 10) do
      env2, peer2 = hijack_env("seconds=1", method: "HEAD")
      app.call(env2)
      head = parse_response(Timeout.timeout(20) { peer2.read })
      head[0] == 200 && head[2].empty? && head[1]["content-length"].to_i.positive?
    end
  end

  def test_without_a_hijack_a_delta_longer_than_the_cap_is_refused_with_the_ways_out
    app = Heapscope::Rack.new(source: @source)
    status, _, body = app.call("REQUEST_METHOD" => "GET", "PATH_INFO" => "/debug/pprof/heap", "QUERY_STRING" => "seconds=31")
    assert_equal 400, status
    assert_match(/\Aseconds=31 would hold this server's thread for 31s: this server offers no full rack.hijack, so a delta here may last at most 30s\./,
                 body.join)
    assert_match(/standalone listener \(HEAPSCOPE_HTTP=127\.0\.0\.1:6060\)/, body.join)
    assert_empty @source.calls, "refused before any profile is taken"
  end

  # The attack of the issue, against a real Puma with one thread.
  def test_an_ordinary_request_is_served_during_a_delta_under_puma_with_one_thread
    skip_unless_native
    begin
      puma = Gem.bin_path("puma", "puma")
    rescue Gem::Exception
      skip "the puma gem is not installed (bundle install)"
    end
    config = File.join(@tmp, "config.ru")
    File.write(config, <<~RUBY)
      require "heapscope/surfaces/rack"
      use Heapscope::Rack
      run ->(env) { [200, { "content-type" => "text/plain" }, ["app"]] }
    RUBY
    port = free_port
    spawn_child(ruby_env("HEAPSCOPE_FINAL" => "0"), RbConfig.ruby, puma, "-t", "1:1", "-w", "0", "-b", "tcp://127.0.0.1:#{port}",
                config, dir: @tmp)
    wait_for("puma to listen", timeout: 60) do
      http_get(port, "/").first == 200
    rescue SystemCallError
      false
    end
    delta = Thread.new { http_get(port, "/debug/pprof/heap?seconds=4", timeout: 60) }
    sleep 0.8 # the delta's request is on puma's only thread by now
    started = now
    status, _, body = http_get(port, "/", timeout: 30)
    took = now - started
    assert_equal [200, "app"], [status, body]
    # Before: 3-4 s (the rest of the delta's window); after: a few ms.
    assert_operator took, :<, 1.5, "an ordinary request waited #{took.round(2)}s behind the delta"
    status, headers, body = delta.value
    assert_equal 200, status
    assert_equal 'attachment; filename="heap-delta-4s.pb.gz"', headers["content-disposition"]
    assert_match(/heapscope delta profile: heap change over 4s/, Heapscope::Pprof.decode(body).comments.join("\n"))
  end
end
