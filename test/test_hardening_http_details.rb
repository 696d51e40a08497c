# frozen_string_literal: true

require_relative "test_http_helper"
require "heapscope/surfaces/http_server"

# Issue 11, item 13 (the HTTP details): every response carries Cache-Control and X-Heapscope-Pid,
# including the index page and the listener's own error replies; a literal "%" (%25) in the query
# is valid; the listener serves nothing outside /debug/pprof; the Bearer scheme is case-insensitive.
class TestHardeningHttpDetails < Minitest::Test
  include SurfacesTestHelper

  TOKEN = "details-token-0123456789"

  def setup
    @source = FakeSource.new
    @servers = []
  end

  def teardown
    @servers.each(&:stop)
  end

  def serve(**options)
    app = Heapscope::Rack.new(source: @source)
    server = Heapscope::HttpServer.new(host: "127.0.0.1", port: 0, app: app, **options).start
    @servers << server
    server
  end

  def assert_common_headers(headers, what)
    assert_equal "no-store", headers["cache-control"], what
    assert_equal Process.pid.to_s, headers["x-heapscope-pid"], what
  end

  def rack_get(app, path, query = "", script_name: "")
    app.call("REQUEST_METHOD" => "GET", "SCRIPT_NAME" => script_name, "PATH_INFO" => path, "QUERY_STRING" => query)
  end

  def test_the_index_page_has_the_common_headers_in_rack_and_the_listener
    status, headers, = rack_get(Heapscope::Rack.new(->(_env) { [200, {}, []] }, source: @source), "/debug/pprof/")
    assert_equal 200, status
    assert_common_headers(headers, "middleware index")
    status, headers, = http_get(serve.port, "/debug/pprof/")
    assert_equal 200, status
    assert_common_headers(headers, "listener index")
  end

  def test_the_listeners_own_replies_have_the_common_headers
    server = serve(token: TOKEN, read_timeout: 0.5)
    replies = {
      401 => "GET /debug/pprof/heap HTTP/1.1\r\n\r\n",
      400 => "GET /debug/pprof/heap HTTP/1.1\r\nno colon\r\n\r\n",
      413 => "GET /debug/pprof/heap HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
      414 => "GET /#{"a" * 9000} HTTP/1.1\r\n\r\n",
      431 => "GET / HTTP/1.1\r\n#{"X: y\r\n" * 101}\r\n",
      408 => "GET /debug/pprof/heap HTTP/1.1\r\n",
    }
    replies.each do |status, request|
      got, headers, = raw_request(server.port, request)
      assert_equal status, got, request[0, 40].inspect
      assert_common_headers(headers, "#{status} reply")
    end
  end

  # A source whose profile waits until something is pushed to gate: its request holds its slot.
  def source_waiting_on(gate)
    source = FakeSource.new
    source.define_singleton_method(:profile) do |gc: false, type: :heap|
      gate.pop
      super(gc: gc, type: type)
    end
    source
  end

  # A listener whose only slot (option: 1) is held by a request the app is still answering: the next
  # request gets 503 with body, and the common headers; the held one is answered once released.
  def assert_503_beside_a_held_request(option, body, label)
    gate = Queue.new
    app = Heapscope::Rack.new(source: source_waiting_on(gate))
    server = Heapscope::HttpServer.new(host: "127.0.0.1", port: 0, app: app, option => 1).start
    @servers << server
    held = Thread.new { http_get(server.port, "/debug/pprof/heap") }
    wait_for("the first request to reach the app") { gate.num_waiting == 1 }
    status, headers, got = http_get(server.port, "/debug/pprof/heap")
    assert_equal 503, status
    assert_equal "1", headers["retry-after"]
    assert_equal body, got
    assert_common_headers(headers, label)
    gate << :go
    assert_equal 200, held.value.first
  end

  # max_connections: a connection whose request the app is still answering is never evicted, so the
  # next one is refused.
  def test_a_503_at_the_connection_limit_has_the_common_headers
    assert_503_beside_a_held_request(:max_connections, "too many connections\n", "503 at max_connections")
  end

  # max_requests: a request the app is still answering fills the only slot.
  def test_a_503_at_the_request_limit_has_the_common_headers
    assert_503_beside_a_held_request(:max_requests, "too many requests at once (at most 1); retry\n", "503 at max_requests")
  end

  def test_a_percent_encoded_percent_is_valid
    app = Heapscope::Rack.new(source: @source)
    assert_equal 200, rack_get(app, "/debug/pprof/heap", "x=%25").first
    assert_equal 200, rack_get(app, "/debug/pprof/heap", "x=%25zz&y=%FF&z=a+b").first
    # The process-wide limit on forced GCs: another test's GC a moment ago must not refuse this one.
    Heapscope::Rack::GC_LIMITER.reset
    status, _, body = rack_get(app, "/debug/pprof/heap", "gc=%31&debug=%30")
    assert_equal 200, status
    refute_match(/heapscope heap profile/, body.to_a.join, "debug=%30 is debug=0")
    assert_equal [true, :heap], @source.calls.last, "gc=%31 is gc=1"
    ["x=%zz", "x=%", "x=%2", "x=100%"].each do |query|
      status, _, body = rack_get(app, "/debug/pprof/heap", query)
      assert_equal 400, status, query
      assert_equal "the query string is not valid percent-encoding\n", body.join
    end
    assert_equal 200, http_get(serve.port, "/debug/pprof/heap?x=%25").first
  end

  def test_nothing_is_served_outside_debug_pprof
    server = serve
    ["/", "/heap", "/allocs", "/heap?debug=1", "/debug/pprofheap", "/debug"].each do |target|
      status, headers, body = http_get(server.port, target)
      assert_equal 404, status, target
      assert_match(%r{heapscope serves /debug/pprof/, /debug/pprof/heap, /debug/pprof/allocs, /debug/pprof/memstats, /debug/pprof/retainers and /debug/pprof/examples}, body)
      assert_common_headers(headers, target)
    end
    assert_empty @source.calls
    assert_equal 200, http_get(server.port, "/debug/pprof/heap").first
    assert_equal 200, http_get(server.port, "/debug/pprof").first
    # A standalone Rack app mounted with map("/admin/prof") still owns its mount point.
    app = Heapscope::Rack.new(source: @source)
    assert_equal 200, rack_get(app, "/heap", script_name: "/admin/prof").first
    assert_equal 200, rack_get(app, "", script_name: "/admin/prof").first
    assert_equal 404, rack_get(app, "/heap").first
  end

  def test_the_bearer_scheme_is_case_insensitive
    server = serve(token: TOKEN)
    ["Bearer", "bearer", "BEARER", "bEaReR"].each do |scheme|
      assert_equal 200, http_get(server.port, "/debug/pprof/heap", headers: { "Authorization" => "#{scheme} #{TOKEN}" }).first, scheme
    end
    assert_equal 200, http_get(server.port, "/debug/pprof/heap", headers: { "Authorization" => "bearer  #{TOKEN}" }).first
    assert_equal 401, http_get(server.port, "/debug/pprof/heap", headers: { "Authorization" => "bearer#{TOKEN}" }).first
    assert_equal 401, http_get(server.port, "/debug/pprof/heap", headers: { "Authorization" => "basic #{TOKEN}" }).first
  end
end
