# frozen_string_literal: true

require_relative "test_http_helper"
require "heapscope/surfaces/pyroscope"
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

  # Hostile is a loopback server that reads each request whole, then answers with the block
  # (given the socket); it counts requests and the bytes the block managed to send.
  class Hostile
    attr_reader :port, :requests, :sent

    def initialize(&answer)
      @server = TCPServer.new("127.0.0.1", 0)
      @port = @server.addr[1]
      @requests = Queue.new
      @sent = Queue.new
      @threads = []
      @thread = Thread.new do
        loop do
          sock = @server.accept
          @threads << Thread.new { serve(sock, answer) }
        end
      rescue IOError
        nil
      end
    end

    def serve(sock, answer)
      head = +"".b
      head << sock.readpartial(4096) until head.include?("\r\n\r\n")
      head, body = head.split("\r\n\r\n", 2)
      length = head[/^content-length: *(\d+)/i, 1].to_i
      body << sock.readpartial(65_536) while body.bytesize < length
      @requests << head
      count = 0
      begin
        answer.call(->(bytes) { sock.write(bytes); count += bytes.bytesize })
      rescue IOError, SystemCallError
        nil # the client hung up: what a bounded client does
      end
      @sent << count
    rescue IOError, SystemCallError
      nil
    ensure
      sock.close
    end

    def close
      @server.close
      @threads.each { |t| t.join(5) || t.kill }
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

  # Issue 11, item 7: a server answering with 200 MB (RSS went to 353 MB when the answer was read
  # whole). Only the status line is read; the client hangs up on the rest.
  def test_a_huge_answer_is_not_read
    chunk = ("x" * (1 << 20)).b
    hostile = Hostile.new do |send|
      send.call("HTTP/1.1 200 OK\r\nContent-Length: #{200 << 20}\r\n\r\n")
      200.times { send.call(chunk) }
    end
    pusher(url: "http://127.0.0.1:#{hostile.port}", read_timeout: 10).tap(&:collect_now).start
    wait_for("the push") { @pusher.stats[:pushed] == 1 }
    sent = Timeout.timeout(30) { hostile.sent.pop }
    assert_operator sent, :<, 64 << 20, "the server could send only what socket buffers hold before the client hung up"
    assert_empty @warnings
  ensure
    hostile&.close
  end

  # A server that trickles its answer, a byte every 0.2 s, used to hold the sender (and exit) for
  # as long as it liked: each read got its own read_timeout. The deadline now bounds the phase.
  TRICKLE = lambda do |send|
    "HTTP/1.1 200 OK\r\nX-Pad: #{"a" * 150}\r\n\r\n".each_char do |c|
      send.call(c)
      sleep 0.2
    end
  end

  def test_a_trickled_answer_fails_at_the_deadline
    hostile = Hostile.new(&TRICKLE)
    pusher(url: "http://127.0.0.1:#{hostile.port}", read_timeout: 1).tap(&:collect_now).start
    Timeout.timeout(10) { hostile.requests.pop }
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    wait_for("the timeout", timeout: 5) { @pusher.stats[:failed] >= 1 }
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, :<, 2.5
    assert_equal 0, @pusher.stats[:pushed]
    assert_equal 1, @warnings.size, @warnings.inspect
    assert_match(/failed: Heapscope::Pyroscope::TimeoutError: timed out during answer \(the limit is 1 s to send the profile and get the answer\)/,
                 @warnings.first)
  ensure
    @pusher&.stop
    hostile&.close
  end

  def test_stop_abandons_a_push_in_flight
    hostile = Hostile.new(&TRICKLE)
    pusher(url: "http://127.0.0.1:#{hostile.port}", read_timeout: 30).tap(&:collect_now).start
    Timeout.timeout(10) { hostile.requests.pop }
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    @pusher.stop(flush_timeout: 0.5)
    # 0.5 s of flushing, then the push is abandoned within 0.1 s (it used to hold stop for 32 s).
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, :<, 2.5
    refute @pusher.running?
    assert_empty @warnings, "an abandoned push is not a failure to warn about"
  ensure
    hostile&.close
  end

  # The documented bound: at exit the sender gets 2 s to flush, whatever the server does.
  def test_autostart_exits_on_time_while_the_server_trickles
    skip_unless_native
    hostile = Hostile.new(&TRICKLE)
    env = ruby_env("HEAPSCOPE_PYROSCOPE_URL" => "http://127.0.0.1:#{hostile.port}", "HEAPSCOPE_INTERVAL" => "0.2")
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    out, err, status = Timeout.timeout(60) do
      Open3.capture3(env, RbConfig.ruby, "-e", "sleep 0.5; p Heapscope::Auto.stats[:pyroscope][:pushed]")
    end
    elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    assert status.success?, err
    assert_equal ["0\n", ""], [out, err]
    refute hostile.requests.empty?, "a push was in flight at exit"
    # Ruby's start and the 0.5 s sleep, then at most 2 s of flushing and 1 s to abandon (it took
    # 19 s before): the margin is for a loaded machine.
    assert_operator elapsed, :<, 7, "exit took #{elapsed.round(1)} s"
  ensure
    hostile&.close
  end

  # A self-signed certificate for 127.0.0.1: [key, cert].
  def self_signed
    require "openssl"
    key = OpenSSL::PKey::RSA.new(2048)
    cert = OpenSSL::X509::Certificate.new
    cert.version = 2
    cert.serial = 1
    cert.subject = cert.issuer = OpenSSL::X509::Name.parse("/CN=127.0.0.1")
    cert.public_key = key.public_key
    cert.not_before = Time.now - 60
    cert.not_after = Time.now + 3600
    extensions = OpenSSL::X509::ExtensionFactory.new
    extensions.subject_certificate = extensions.issuer_certificate = cert
    cert.add_extension(extensions.create_extension("subjectAltName", "IP:127.0.0.1"))
    cert.add_extension(extensions.create_extension("basicConstraints", "CA:TRUE", true))
    cert.sign(key, OpenSSL::Digest.new("SHA256"))
    [key, cert]
  end

  # A whole push over TLS, in a child whose trust store is this certificate (SSL_CERT_FILE is read
  # when OpenSSL loads).
  def test_https_push_with_a_trusted_certificate
    key, cert = self_signed
    Dir.mktmpdir do |dir|
      File.write(File.join(dir, "cert.pem"), cert.to_pem)
      File.write(File.join(dir, "key.pem"), key.to_pem)
      script = <<~'RUBY'
        require "openssl"
        require "socket"
        require "heapscope/surfaces/pyroscope"
        context = OpenSSL::SSL::SSLContext.new
        context.cert = OpenSSL::X509::Certificate.new(File.read("cert.pem"))
        context.key = OpenSSL::PKey.read(File.read("key.pem"))
        tcp = TCPServer.new("127.0.0.1", 0)
        server = OpenSSL::SSL::SSLServer.new(tcp, context)
        got = Queue.new
        Thread.new do
          sock = server.accept
          head = +""
          head << sock.readpartial(4096) until head.include?("\r\n\r\n")
          length = head[/^content-length: *(\d+)/i, 1].to_i
          head << sock.readpartial(65_536) while head.bytesize < head.index("\r\n\r\n") + 4 + length
          got << head.lines.first
          sock.write("HTTP/1.1 204 No Content\r\n\r\n")
          sock.close
        end
        source = Object.new
        def source.running? = true
        def source.profile(**) = "profile-bytes"
        pusher = Heapscope::Pyroscope.new(url: "https://127.0.0.1:#{tcp.addr[1]}", app_name: "tls", source: source,
                                          open_timeout: 5, read_timeout: 5, proxy: nil, warn: ->(l) { warn l })
        pusher.collect_now
        pusher.start
        require "timeout"
        puts Timeout.timeout(20) { got.pop } # the child ends on its own whatever happens
        200.times { break if pusher.stats[:pushed] == 1; sleep 0.05 }
        pusher.stop
        puts :pushed
      RUBY
      out, err, status = Timeout.timeout(60) do
        Open3.capture3({ "SSL_CERT_FILE" => File.join(dir, "cert.pem"), "RUBYLIB" => LIB }, RbConfig.ruby, "-e", script, chdir: dir)
      end
      assert status.success?, err
      assert_match(%r{\APOST /ingest\?name=tls\.heap.* HTTP/1\.1\r?\npushed\n\z}, out)
      assert_equal "", err
    end
  end

  def test_https_verifies_the_certificate
    key, cert = self_signed
    context = OpenSSL::SSL::SSLContext.new
    context.cert = cert
    context.key = key
    tcp = TCPServer.new("127.0.0.1", 0)
    server = OpenSSL::SSL::SSLServer.new(tcp, context)
    thread = Thread.new do
      sock = server.accept
      sock.close
    rescue OpenSSL::SSL::SSLError, IOError, SystemCallError
      nil
    end
    pusher(url: "https://127.0.0.1:#{tcp.addr[1]}").tap(&:collect_now).start
    wait_for("the failure") { @pusher.stats[:failed] >= 1 }
    assert_match(/OpenSSL::SSL::SSLError: .*certificate verify failed/, @warnings.first)
  ensure
    @pusher&.stop
    thread&.join(5)
    tcp&.close
  end

  # Net::HTTP went through http_proxy; the bounded client does too.
  def test_goes_through_an_http_proxy
    proxy = Hostile.new { |send| send.call("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n") }
    pusher(url: "http://pyroscope.example:4040/base", proxy: "http://u:p%40ss@127.0.0.1:#{proxy.port}").tap(&:collect_now).start
    head = Timeout.timeout(10) { proxy.requests.pop }
    assert_match %r{\APOST http://pyroscope\.example:4040/base/ingest\?name=web\.heap%7B%7D&from=\d+&until=\d+&format=pprof&spyName=heapscope HTTP/1\.1\r\n}, head
    assert_includes head, "\r\nHost: pyroscope.example:4040\r\n"
    assert_includes head, "\r\nProxy-Authorization: Basic #{["u:p@ss"].pack("m0")}"
    wait_for("the push") { @pusher.stats[:pushed] == 1 }
  ensure
    @pusher&.stop
    proxy&.close
  end

  def test_https_goes_through_a_proxy_tunnel
    proxy = Hostile.new { |send| send.call("HTTP/1.1 200 Connection established\r\n\r\n") } # then hangs up
    pusher(url: "https://pyroscope.example/", proxy: "http://127.0.0.1:#{proxy.port}").tap(&:collect_now).start
    head = Timeout.timeout(10) { proxy.requests.pop }
    assert_equal "CONNECT pyroscope.example:443 HTTP/1.1\r\nHost: pyroscope.example:443", head
    wait_for("the failed handshake") { @pusher.stats[:failed] >= 1 }
    assert_match(/OpenSSL::SSL::SSLError|EOFError|ECONNRESET/, @warnings.first)
  ensure
    @pusher&.stop
    proxy&.close
  end

  def test_http_proxy_from_the_environment_is_not_used_for_loopback
    old = ENV.to_h.slice("http_proxy", "HTTP_PROXY")
    ENV["http_proxy"] = "http://127.0.0.1:#{free_port}"
    pusher.tap(&:collect_now).start
    next_request
    wait_for("the push") { @pusher.stats[:pushed] == 1 }
  ensure
    ENV.delete("http_proxy")
    ENV.update(old)
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
    # Issue 11, item 9: URI's own parse error used to escape as URI::InvalidURIError.
    error = assert_raises(ArgumentError) { Heapscope::Pyroscope.new(url: "http://[::1", app_name: "a", source: @source) }
    assert_equal 'url "http://[::1" is invalid: cannot be parsed as a URL', error.message
    error = assert_raises(ArgumentError) { Heapscope::Pyroscope.new(url: "http://x", app_name: "a", source: @source, token: "a\nb") }
    assert_match(/\Atoken is invalid: must not contain control characters/, error.message)
    error = assert_raises(ArgumentError) { Heapscope::Pyroscope.new(url: "http://x", app_name: "a", source: @source, proxy: "https://p") }
    assert_equal 'proxy "https://p" is invalid: must be http://', error.message
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
