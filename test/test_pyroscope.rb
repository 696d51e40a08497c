# frozen_string_literal: true

require_relative "test_http_helper"
require "heapscope/pyroscope"
require "uri"
require "open3"

# The Pyroscope pusher against a loopback receiver written here: method, path, query, multipart
# field, auth, and what happens when the receiver is down, slow or failing.
class TestPyroscope < Minitest::Test
  include SurfacesTestHelper

  # Receiver is a minimal HTTP server that records each request and answers with status.
  class Receiver
    Request = Struct.new(:method, :target, :headers, :body)
    attr_reader :requests, :port
    attr_accessor :status, :hang

    def initialize
      @server = TCPServer.new("127.0.0.1", 0)
      @port = @server.addr[1]
      @requests = Queue.new
      @status = 200
      @hang = false
      @thread = Thread.new { loop { handle(@server.accept) } rescue IOError }
    end

    def handle(sock)
      Thread.new do
        head = +""
        head << sock.readpartial(4096) until head.include?("\r\n\r\n")
        head, body = head.split("\r\n\r\n", 2)
        request_line, *lines = head.split("\r\n")
        headers = lines.to_h { |l| k, v = l.split(":", 2); [k.downcase, v.strip] }
        body << sock.readpartial(65_536) while body.bytesize < headers["content-length"].to_i
        if @hang
          sleep 5
        else
          method, target, = request_line.split(" ")
          @requests << Request.new(method, target, headers, body.b)
          sock.write("HTTP/1.1 #{@status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        end
      rescue IOError, SystemCallError
        nil
      ensure
        sock.close
      end
    end

    def close
      @server.close
    end
  end

  def setup
    @source = FakeSource.new
    @warnings = []
    @receiver = Receiver.new
  end

  def teardown
    @pusher&.stop
    @receiver.close
  end

  def pusher(url: "http://127.0.0.1:#{@receiver.port}", **options)
    @pusher = Heapscope::Pyroscope.new(url: url, app_name: "web", source: @source, open_timeout: 1, read_timeout: 1,
                                       min_backoff: 0.1, max_backoff: 0.4, warn: ->(l) { @warnings << l }, **options)
  end

  def next_request(timeout = 10)
    Timeout.timeout(timeout) { @receiver.requests.pop }
  end

  # Splits a multipart/form-data body into {name => [filename, bytes]}.
  def multipart_fields(content_type, body)
    boundary = content_type[/boundary=(\S+)/, 1]
    parts = body.split("--#{boundary}")
    assert_equal "--\r\n", parts.last
    parts[1..-2].to_h do |part|
      head, data = part.delete_prefix("\r\n").split("\r\n\r\n", 2)
      name = head[/name="([^"]+)"/, 1]
      [name, [head[/filename="([^"]+)"/, 1], data.delete_suffix("\r\n")]]
    end
  end

  def test_pushes_the_heap_profile_as_multipart_to_ingest
    before = Time.now.to_i
    pusher(labels: { "env" => "test", "region" => "eu" }, interval: 0.2).start
    request = next_request
    assert_equal "POST", request.method
    path, query = request.target.split("?", 2)
    assert_equal "/ingest", path
    params = URI.decode_www_form(query).to_h
    assert_equal "web.heap{env=test,region=eu}", params["name"]
    assert_equal "pprof", params["format"]
    assert_operator params["from"].to_i, :<, params["until"].to_i
    assert_includes before..(Time.now.to_i + 2), params["until"].to_i
    assert_match %r{\Amultipart/form-data; boundary=}, request.headers["content-type"]
    fields = multipart_fields(request.headers["content-type"], request.body)
    assert_equal ["profile"], fields.keys
    assert_equal "profile.pprof", fields["profile"][0]
    prof = Heapscope::Pprof.decode(fields["profile"][1])
    assert_equal %w[alloc_objects alloc_space inuse_objects inuse_space], prof.sample_type_names
    # The next push continues where this one ended.
    second = URI.decode_www_form(next_request.target.split("?", 2)[1]).to_h
    assert_equal params["until"], second["from"]
    assert_operator @pusher.stats[:pushed], :>=, 1
    assert_empty @warnings
  end

  def test_base_path_auth_and_token
    url = "http://user%40x:p%3Ass@127.0.0.1:#{@receiver.port}/pyro/"
    pusher(url: url).collect_now
    @pusher.start
    request = next_request
    assert request.target.start_with?("/pyro/ingest?"), request.target
    assert_equal "Basic #{["user@x:p:ss"].pack("m0")}", request.headers["authorization"]
    @pusher.stop
    pusher(token: "tok123").tap(&:collect_now).start
    assert_equal "Bearer tok123", next_request.headers["authorization"]
  end

  def test_receiver_down_drops_oldest_and_never_blocks
    port = free_port
    pusher(url: "http://127.0.0.1:#{port}", queue_size: 2, interval: 3600).start
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    5.times { assert @pusher.collect_now }
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, :<, 1, "collecting never waits on the network"
    wait_for("failed posts") { @pusher.stats[:failed] >= 2 }
    stats = @pusher.stats
    assert_equal 0, stats[:pushed]
    assert_operator stats[:dropped], :>=, 2 # 5 profiles into a queue of 2 while the sender holds one
    assert_operator stats[:queued], :<=, 2
    assert_equal 1, @warnings.size, @warnings.inspect
    assert_match(/Pyroscope push to 127\.0\.0\.1:#{port} failed: Errno::ECONNREFUSED/, @warnings.first)
  end

  def test_failing_receiver_is_retried_with_backoff_then_succeeds
    @receiver.status = 500
    pusher(interval: 3600).tap(&:collect_now).start
    first = next_request
    retry_ = next_request
    assert_equal first.target, retry_.target, "the same profile is retried"
    @receiver.status = 200
    wait_for("a push") { @pusher.stats[:pushed] == 1 }
    assert_operator @pusher.stats[:failed], :>=, 2
    assert_equal 0, @pusher.stats[:queued]
    assert_equal 1, @warnings.size
    assert_match(/failed: RuntimeError: HTTP 500/, @warnings.first)
  end

  def test_slow_receiver_times_out
    @receiver.hang = true
    pusher(interval: 3600).tap(&:collect_now).start
    wait_for("a timeout", timeout: 10) { @pusher.stats[:failed] >= 1 }
    assert_match(/Timeout|timed out/i, @warnings.first)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    @pusher.stop
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, :<, 4
  end

  def test_not_running_collects_nothing
    @source.running = false
    refute pusher.collect_now
    assert_equal 0, @pusher.stats[:queued]
  end

  def test_multipart_encoding
    type, body = Heapscope::Pyroscope.multipart("profile" => ["p.pprof", "\x00\x01binary\r\n".b])
    boundary = type[/boundary=(\S+)/, 1]
    assert_equal "--#{boundary}\r\nContent-Disposition: form-data; name=\"profile\"; filename=\"p.pprof\"\r\n" \
                 "Content-Type: application/octet-stream\r\n\r\n\x00\x01binary\r\n\r\n--#{boundary}--\r\n".b, body
  end

  def test_bad_arguments
    assert_raises(ArgumentError) { Heapscope::Pyroscope.new(url: "ftp://x", app_name: "a", source: @source) }
    assert_raises(ArgumentError) { Heapscope::Pyroscope.new(url: "http://x", app_name: "a", source: @source, interval: 0) }
    assert_raises(ArgumentError) { Heapscope::Pyroscope.new(url: "http://x", app_name: "a", source: @source, queue_size: 0) }
  end

  # A real process under RUBYOPT=-rheapscope/auto pushes real profiles.
  def test_autostart_pushes_to_the_receiver
    skip_unless_native
    env = ruby_env("HEAPSCOPE_PYROSCOPE_URL" => "http://127.0.0.1:#{@receiver.port}", "HEAPSCOPE_APP_NAME" => "svc",
                   "HEAPSCOPE_INTERVAL" => "0.3", "HEAPSCOPE_SAMPLE_EVERY" => "100", "HEAPSCOPE_SAMPLING" => "always",
                   "HEAPSCOPE_PYROSCOPE_LABELS" => "env=test")
    script = "$keep = Array.new(20_000) { |i| 'kept-' * 8 + i.to_s } # KEPT\nGC.start\nsleep 1.2"
    out, err, status = Timeout.timeout(60) { Open3.capture3(env, RbConfig.ruby, "-e", script) }
    assert status.success?, err
    assert_equal "", out
    assert_equal "", err
    requests = []
    requests << @receiver.requests.pop until @receiver.requests.empty?
    assert_operator requests.size, :>=, 2
    last = requests.last
    assert_equal "svc.heap{env=test}", URI.decode_www_form(last.target.split("?", 2)[1]).to_h["name"]
    prof = Heapscope::Pprof.decode(multipart_fields(last.headers["content-type"], last.body)["profile"][1])
    kept = prof.samples.select { |s| s.frames.any? { |f| f.file == "-e" && f.line == 1 } }
    assert_operator kept.sum { |s| s.value("inuse_objects") }, :>, 10_000
  end

  def test_autostart_with_the_receiver_down_leaves_the_app_alone
    skip_unless_native
    port = free_port
    env = ruby_env("HEAPSCOPE_PYROSCOPE_URL" => "http://127.0.0.1:#{port}", "HEAPSCOPE_INTERVAL" => "0.2")
    script = "sleep 1; p Heapscope::Auto.stats[:pyroscope]"
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    out, err, status = Timeout.timeout(60) { Open3.capture3(env, RbConfig.ruby, "-e", script) }
    assert status.success?, err
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, :<, 6, "exit waits at most the flush timeout"
    stats = eval(out) # rubocop:disable Security/Eval -- our own child's p output
    assert_equal 0, stats[:pushed]
    assert_operator stats[:failed], :>=, 1
    assert_equal 1, err.lines.size, err
    assert_match(/\Aheapscope: Pyroscope push to 127\.0\.0\.1:#{port} failed: Errno::ECONNREFUSED/, err)
  end
end
