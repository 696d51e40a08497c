# frozen_string_literal: true

require_relative "test_http_helper"
require "heapscope/surfaces/http_server"

# The standalone listener on loopback with a fake source: serving, auth, and each defence against
# slow or hostile clients (test_hardening_http_*.rb hold issue 11's attacks on it).
class TestHttpServer < Minitest::Test
  include SurfacesTestHelper

  TOKEN = "s3cret-token-0123456789"

  def setup
    @source = FakeSource.new
    @servers = []
  end

  def teardown
    @servers.each(&:stop)
  end

  def serve(**options)
    # A limiter of its own: ?gc=1 in one test must not be rate-limited by another's.
    app = Heapscope::Rack.new(source: @source, gc_limiter: Heapscope::Rack::GcLimiter.new)
    server = Heapscope::HttpServer.new(host: "127.0.0.1", port: 0, app: app, **options).start
    @servers << server
    server
  end

  def test_serves_profiles_and_reports_its_url
    server = serve
    assert server.running?
    assert_equal "http://127.0.0.1:#{server.port}/debug/pprof/", server.url
    status, headers, body = http_get(server.port, "/debug/pprof/heap?gc=1")
    assert_equal 200, status
    assert_equal "application/octet-stream", headers["content-type"]
    assert_equal "close", headers["connection"]
    assert_equal body.bytesize, headers["content-length"].to_i
    assert_includes Heapscope::Pprof.decode(body).sample_type_names, "inuse_space"
    assert_equal [true, :heap], @source.calls.last
    status, _, body = http_get(server.port, "/debug/pprof/heap?seconds=0")
    assert_equal 400, status
    assert_equal "seconds must be an integer from 1 to 300, got \"0\"\n", body
    assert_equal 404, http_get(server.port, "/nope").first
  end

  def test_head_keeps_the_length_and_sends_no_body
    @source.payload = "p" * 1234
    server = serve
    status, headers, body = raw_request(server.port, "HEAD /debug/pprof/heap HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_equal 200, status
    assert_equal "1234", headers["content-length"]
    assert_equal "", body
  end

  def test_stop_closes_the_port
    server = serve
    port = server.port
    server.stop
    refute server.running?
    assert_raises(Errno::ECONNREFUSED) { TCPSocket.new("127.0.0.1", port) }
  end

  def test_non_loopback_without_token_is_refused
    error = assert_raises(ArgumentError) { Heapscope::HttpServer.new(host: "0.0.0.0", port: 0, app: Object.new) }
    assert_match(/refusing to serve profiles on non-loopback address 0\.0\.0\.0 without a token/, error.message)
    # With a token it is allowed (not started here: the test binds loopback only).
    Heapscope::HttpServer.new(host: "0.0.0.0", port: 0, app: Object.new, token: TOKEN)
  end

  def test_token_is_required_on_every_request
    server = serve(token: TOKEN)
    status, headers, body = http_get(server.port, "/debug/pprof/heap")
    assert_equal 401, status
    assert_equal 'Bearer realm="heapscope"', headers["www-authenticate"]
    assert_match(/missing or wrong Authorization/, body)
    assert_equal 401, http_get(server.port, "/debug/pprof/heap", headers: { "Authorization" => "Bearer wrong" }).first
    assert_equal 401, http_get(server.port, "/debug/pprof/heap", headers: { "Authorization" => "Bearer #{TOKEN}x" }).first
    assert_equal 401, http_get(server.port, "/debug/pprof/heap", headers: { "Authorization" => "Basic #{TOKEN}" }).first
    assert_equal 401, http_get(server.port, "/debug/pprof/", headers: { "Authorization" => "Bearer #{TOKEN[0..-2]}" }).first
    assert_empty @source.calls
    assert_equal 200, http_get(server.port, "/debug/pprof/heap", headers: { "Authorization" => "Bearer #{TOKEN}" }).first
  end

  def test_slow_client_gets_408
    server = serve(read_timeout: 0.5)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    status, _, body = raw_request(server.port, "GET /debug/pprof/heap HTTP/1.1\r\nHost: x\r\n")
    assert_equal 408, status
    assert_match(/not received within 0.5s/, body)
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, :<, 5
  end

  def test_size_limits
    server = serve
    status, = raw_request(server.port, "GET /#{"a" * 9000} HTTP/1.1\r\n\r\n")
    assert_equal 414, status
    status, = raw_request(server.port, "GET / HTTP/1.1\r\n#{"X-A: #{"b" * 100}\r\n" * 200}\r\n")
    assert_equal 431, status
    status, = raw_request(server.port, "GET / HTTP/1.1\r\n#{"X: y\r\n" * 101}\r\n")
    assert_equal 431, status
    status, _, body = raw_request(server.port, "GET /debug/pprof/heap HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello")
    assert_equal 413, status
    assert_match(/request bodies are not accepted/, body)
    status, = raw_request(server.port, "garbage\r\n\r\n")
    assert_equal 400, status
    status, = raw_request(server.port, "GET /debug/pprof/heap HTTP/1.1\r\nno colon here\r\n\r\n")
    assert_equal 400, status
    assert_empty @source.calls
  end

  # At the cap a new connection evicts the oldest one without an admitted request (503 to it); the
  # others stay open.
  def test_at_the_connection_cap_the_oldest_idle_connection_is_evicted
    server = serve(max_connections: 3, read_timeout: 5)
    oldest, *younger = Array.new(3) do
      sock = TCPSocket.new("127.0.0.1", server.port)
      sleep 0.1 # accepted in this order
      sock
    end
    status, = http_get(server.port, "/debug/pprof/heap")
    assert_equal 200, status
    status, headers, body = parse_response(Timeout.timeout(5) { oldest.read })
    assert_equal 503, status
    assert_equal "1", headers["retry-after"]
    assert_equal "closed: the listener is at its limit of 3 open connections\n", body
    assert_nil IO.select(younger, nil, nil, 0.2), "the younger idle connections are still open"
  ensure
    [oldest, *younger].each { |sock| sock&.close }
  end

  # A connection whose request the app is answering is not evicted, even when it is the oldest.
  def test_admitted_requests_are_never_evicted
    gate = Queue.new
    blocking = FakeSource.new
    blocking.define_singleton_method(:profile) do |gc: false, type: :heap|
      gate.pop if type == :allocs
      super(gc: gc, type: type)
    end
    server = Heapscope::HttpServer.new(host: "127.0.0.1", port: 0, app: Heapscope::Rack.new(source: blocking),
                                       max_connections: 2).start
    @servers << server
    held = Thread.new { http_get(server.port, "/debug/pprof/allocs") }
    wait_for("the first request to reach the app") { gate.num_waiting == 1 }
    idle = TCPSocket.new("127.0.0.1", server.port)
    sleep 0.1
    assert_equal 200, http_get(server.port, "/debug/pprof/heap").first
    assert_equal 503, parse_response(Timeout.timeout(5) { idle.read }).first, "the idle one went"
    gate << :go
    assert_equal 200, held.value.first
  ensure
    idle&.close
  end

  def test_the_default_connection_cap_is_well_under_the_descriptor_limit
    soft = Process.getrlimit(:NOFILE).first
    cap = Heapscope::HttpServer.default_max_connections
    assert_operator cap, :<=, [soft / 4, 16].max
    assert_operator cap, :<=, 1024
    assert_equal cap, Heapscope::HttpServer.new(app: Object.new).max_connections
  end

  # Evicted and refused clients of a burst get a 503 they can read: the listener lingers after its
  # one-write goodbye, so a request still on its way does not reset the connection (CI once saw a reset
  # here when goodbyes closed at once).
  def test_burst_of_clients_gets_200_or_503_and_the_server_survives
    server = serve(max_connections: 4, max_requests: 2)
    statuses = Array.new(40) { Thread.new { http_get(server.port, "/debug/pprof/heap").first } }.map(&:value)
    assert_includes statuses, 200
    assert statuses.all? { |code| [200, 503].include?(code) }, statuses.tally.inspect
    assert_equal 200, http_get(server.port, "/debug/pprof/heap").first
  end

  # Beyond the lingering goodbyes a flood's client may see a reset (one write and close), but every
  # answer that arrives is 200 or 503, and the listener serves on.
  def test_a_flood_beyond_the_lingering_goodbyes_gets_answers_or_resets_and_the_server_survives
    server = serve(max_connections: 4, max_requests: 2)
    graceful = 4 + Heapscope::HttpServer::REFUSALS + Heapscope::HttpServer::GOODBYE_LINGERS
    flood = graceful + 60
    outcomes = Array.new(flood) do
      Thread.new do
        http_get(server.port, "/debug/pprof/heap").first
      rescue Errno::ECONNRESET, Errno::EPIPE
        :reset
      end
    end.map(&:value)
    assert_includes outcomes, 200
    assert outcomes.all? { |o| [200, 503, :reset].include?(o) }, outcomes.tally.inspect
    assert_operator outcomes.count(:reset), :<=, flood - graceful, outcomes.tally.inspect
    assert_equal 200, http_get(server.port, "/debug/pprof/heap").first
  end

  def test_an_app_that_raises_gets_500_and_the_listener_serves_on
    app = ->(_env) { raise ArgumentError, "broken app" }
    server = Heapscope::HttpServer.new(host: "127.0.0.1", port: 0, app: app).start
    @servers << server
    status, headers, body = http_get(server.port, "/debug/pprof/heap")
    assert_equal 500, status
    assert_equal "heapscope: ArgumentError: broken app\n", body
    assert_equal "no-store", headers["cache-control"]
    assert server.running?
  end

  # An unexpected error inside the event loop (a bug) neither ends the listener nor loses the
  # connection it happened on.
  module FailOnce
    class << self
      attr_accessor :armed
    end

    def read_request
      if FailOnce.armed
        FailOnce.armed = false
        raise "a bug in the loop"
      end
      super
    end
  end
  Heapscope::Http::Connection.prepend(FailOnce)

  def test_an_error_in_the_event_loop_does_not_end_the_listener
    server = serve
    FailOnce.armed = true
    victim = raw_request(server.port, "GET /debug/pprof/heap HTTP/1.1\r\n\r\n")
    assert_equal 200, victim.first, "the connection it hit is read again on the next turn"
    refute FailOnce.armed
    assert_equal 200, http_get(server.port, "/debug/pprof/heap").first
    assert server.running?
  ensure
    FailOnce.armed = false
  end

  def test_ipv6_loopback
    begin
      TCPServer.new("::1", 0).close
    rescue SystemCallError
      skip "no IPv6 loopback here"
    end
    server = Heapscope::HttpServer.new(host: "::1", port: 0, app: Heapscope::Rack.new(source: @source)).start
    @servers << server
    assert_equal "http://[::1]:#{server.port}/debug/pprof/", server.url
    sock = TCPSocket.new("::1", server.port)
    sock.write("GET /debug/pprof/heap HTTP/1.1\r\n\r\n")
    assert_equal 200, parse_response(sock.read).first
    sock.close
  end

  def test_client_that_disconnects_does_not_kill_the_server
    server = serve
    5.times do
      s = TCPSocket.new("127.0.0.1", server.port)
      s.write("GET /debug/pprof/heap HTTP/1.1\r\n")
      s.close
    end
    assert_equal 200, http_get(server.port, "/debug/pprof/heap").first
    assert server.running?
  end

  # after_fork in a forked child, for each HEAPSCOPE_HTTP_FORK mode. The child runs only the
  # listener, then exits with exit! (no at_exit of the test process).
  def fork_child(server)
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      result = server.after_fork
      writer.puts(result ? result.port : "none")
      writer.close
      sleep 30
      exit!(0)
    end
    writer.close
    line = Timeout.timeout(10) { reader.gets.to_s.chomp }
    [pid, line]
  ensure
    reader&.close
  end

  def finish_child(pid)
    Process.kill("KILL", pid)
    Process.wait(pid)
  end

  def test_fork_offset_binds_the_next_free_port
    base = free_port_pair # the child takes base + 1, which must be free too
    server = Heapscope::HttpServer.new(host: "127.0.0.1", port: base, app: Heapscope::Rack.new(source: @source)).start
    @servers << server
    pid, port = fork_child(server)
    assert_equal base + 1, port.to_i
    assert_equal pid.to_s, http_get(base + 1, "/debug/pprof/heap")[1]["x-heapscope-pid"]
    assert_equal Process.pid.to_s, http_get(base, "/debug/pprof/heap")[1]["x-heapscope-pid"]
  ensure
    finish_child(pid) if pid
  end

  def test_fork_same_shares_the_socket_and_off_serves_nothing
    server = serve(fork_mode: :same)
    pid, port = fork_child(server)
    assert_equal server.port, port.to_i
    server.stop # the parent stops accepting; the child's copy of the socket still does
    assert_equal pid.to_s, http_get(server.port, "/debug/pprof/heap")[1]["x-heapscope-pid"]
    finish_child(pid)

    quiet = serve(fork_mode: :off)
    pid, port = fork_child(quiet)
    assert_equal "none", port
    quiet.stop
    assert_raises(Errno::ECONNREFUSED) { TCPSocket.new("127.0.0.1", quiet.port) }
  ensure
    finish_child(pid) if pid
  end
end
