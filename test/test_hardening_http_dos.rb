# frozen_string_literal: true

require_relative "test_http_helper"
require "io/wait"
require "heapscope/surfaces/http_server"

# Issue 11, item 4: idle, trickling and garbage connections must not keep the standalone listener
# from answering a legitimate request within a second, with or without a token. The listener runs
# in a child process (its own descriptors and GVL), loading the same http_server.rb as this test
# (so `ruby -I OLD/lib -Ilib -Itest` runs it against another copy).
class TestHardeningHttpDos < Minitest::Test
  include SurfacesTestHelper

  TOKEN = "dos-test-token-0123456789"
  SERVED_WITHIN = 1.0

  # The child: a listener over a fixed tiny profile; prints its port, then waits for stdin to close.
  CHILD = <<~'RUBY'
    begin
      soft, hard = Process.getrlimit(:NOFILE)
      Process.setrlimit(:NOFILE, [hard, 8192].min, hard) if soft < 4096
    rescue StandardError
      nil
    end
    require "heapscope/surfaces/http_server"
    source = Object.new
    def source.running? = true
    def source.profile(gc: false, type: :heap) = "profile-bytes"
    token = ENV["DOS_TOKEN"].to_s.empty? ? nil : ENV["DOS_TOKEN"]
    server = Heapscope::HttpServer.new(host: "127.0.0.1", port: 0, token: token, app: Heapscope::Rack.new(source: source)).start
    puts server.port
    $stdout.flush
    $stdin.read
  RUBY

  # Holds idle and slow (trickling) connections open against a port, reopening those the listener
  # closes (evicted, 408), from one thread with non-blocking sockets.
  class Attack
    SLOW_HEAD = "GET /debug/pprof/heap HTTP/1.1\r\nHost: x\r\nX-Pad: "

    attr_reader :reopened

    def initialize(port, idle:, slow:)
      @port = port
      @idle = Array.new(idle) { open }
      @slow = Array.new(slow) { open(SLOW_HEAD) }
      @reopened = 0
      @stop = false
    end

    def open_count
      (@idle + @slow).count { |s| s && !s.closed? }
    end

    def start
      @thread = Thread.new do
        until @stop
          keep_open(@idle, nil)
          keep_open(@slow, SLOW_HEAD)
          @slow.each do |s|
            s&.write_nonblock("a", exception: false)
          rescue IOError, SystemCallError
            nil # found closed on the next pass
          end
          sleep 0.05
        end
      end
      self
    end

    def stop
      @stop = true
      @thread&.join(5)
      (@idle + @slow).each { |s| s&.close rescue nil } # rubocop:disable Style/RescueModifier
    end

    private

    def open(head = nil)
      sock = Socket.tcp("127.0.0.1", @port, connect_timeout: 2)
      sock.write(head) if head
      sock
    rescue SystemCallError
      nil
    end

    # A socket the listener answered or closed becomes readable: replace it (a bounded number per
    # pass, so the attacker does not hog this process).
    def keep_open(list, head)
      readable = IO.select(list.compact.reject(&:closed?), nil, nil, 0)&.first || []
      budget = 100
      list.each_with_index do |s, i|
        next unless s.nil? || s.closed? || readable.include?(s)
        break if (budget -= 1).negative?

        s&.close rescue nil # rubocop:disable Style/RescueModifier
        list[i] = open(head)
        @reopened += 1
      end
    end
  end

  def setup
    @tmp = Dir.mktmpdir("heapscope-dos")
    need = 2 * (1000 + 50) + 200
    soft, hard = Process.getrlimit(:NOFILE)
    if soft < need
      skip "needs #{need} descriptors, the hard limit is #{hard}" if hard < need
      Process.setrlimit(:NOFILE, need, hard)
    end
  end

  def teardown
    @attack&.stop
    @stdin&.close rescue nil # rubocop:disable Style/RescueModifier
    reap_children
    FileUtils.rm_rf(@tmp) if @tmp
  end

  # The lib directory of the http_server.rb this process loaded, then ours (for heapscope/env_config).
  def child_load_path
    loaded = $LOADED_FEATURES.find { |f| f.end_with?("/heapscope/surfaces/http_server.rb") }
    [File.dirname(loaded, 3), LIB].uniq.flat_map { |dir| ["-I", dir] }
  end

  def start_child(token: nil)
    reader, @stdin = IO.pipe
    out = File.join(@tmp, "child.out")
    pid = Process.spawn({ "DOS_TOKEN" => token.to_s }, RbConfig.ruby, *child_load_path, "-e", CHILD,
                        in: reader, out: out, err: File.join(@tmp, "child.err"), pgroup: true)
    reader.close
    (@children ||= []) << pid
    wait_for("the child's port") { File.read(out)[/\A\d+\n/] }.to_i
  end

  # One request on a fresh connection; returns [status or nil, seconds]. Gives up after limit.
  def timed_get(port, target, headers: {}, limit: 3)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    deadline = started + limit
    lines = headers.map { |k, v| "#{k}: #{v}\r\n" }.join
    sock = Socket.tcp("127.0.0.1", port, connect_timeout: limit)
    sock.write("GET #{target} HTTP/1.1\r\nHost: 127.0.0.1\r\n#{lines}\r\n")
    data = +""
    loop do
      left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
      break if left <= 0 || !sock.wait_readable(left)

      chunk = sock.read_nonblock(65_536, exception: false)
      break if chunk.nil?

      data << chunk unless chunk == :wait_readable
    end
    status = data.empty? ? nil : parse_response(data).first
    [status, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started]
  rescue SystemCallError, IOError
    [nil, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started]
  ensure
    sock&.close
  end

  # Opens the attack, then asks `requests` times (spread over more than the 5 s header timeout, so
  # slow connections are timed out and reopened meanwhile); every answer must be 200 within a second.
  def assert_served_under_attack(port, idle:, slow:, requests:, headers: {})
    @attack = Attack.new(port, idle: idle, slow: slow)
    # Right after the burst: the listener used to spend 0.1 s on each connection it refused.
    results = [timed_get(port, "/debug/pprof/heap", headers: headers)]
    @attack.start
    (requests - 1).times do
      break unless results.last[0] == 200 && results.last[1] < SERVED_WITHIN # one failure is enough

      sleep 0.35
      results << timed_get(port, "/debug/pprof/heap", headers: headers)
    end
    summary = "open=#{@attack.open_count} reopened=#{@attack.reopened} results=#{results.map { |s, t| [s, t.round(3)] }}"
    warn summary if ENV["DOS_VERBOSE"]
    assert results.all? { |status, seconds| status == 200 && seconds < SERVED_WITHIN }, summary
    assert_operator @attack.open_count, :>=, (idle + slow) * 9 / 10, summary
    results
  end

  def test_a_request_is_served_within_a_second_beside_1000_idle_and_50_slow_connections
    port = start_child
    assert_served_under_attack(port, idle: 1000, slow: 50, requests: 20)
    assert_operator @attack.reopened, :>=, 50, "the slow connections were timed out (408) and reopened"
  end

  # The token is only in the request head, so it cannot protect the listener from connections
  # that never send one; those must cost nothing, and a wrong token gets 401 at once.
  def test_a_token_protected_listener_serves_its_client_beside_idle_and_slow_connections
    port = start_child(token: TOKEN)
    assert_served_under_attack(port, idle: 300, slow: 30, requests: 16, headers: { "Authorization" => "Bearer #{TOKEN}" })
    status, seconds = timed_get(port, "/debug/pprof/heap", headers: { "Authorization" => "Bearer wrong" })
    assert_equal 401, status
    assert_operator seconds, :<, SERVED_WITHIN
  end

  # Bytes that cannot start an HTTP request (a TLS handshake here) get 400 at once, not after the
  # header timeout.
  def test_garbage_is_refused_at_once
    port = start_child
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    status, headers, body = raw_request(port, "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03".b, timeout: 8)
    assert_equal 400, status
    assert_equal "malformed request line\n", body
    assert_equal "no-store", headers["cache-control"]
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, :<, 2
  end
end
