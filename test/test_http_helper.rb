# frozen_string_literal: true

# Shared by the surface tests (test_http*, test_auto*, test_cli_run*, test_periodic*, test_pyroscope*,
# test_fork_surfaces*): a fake profile source, loopback HTTP helpers and child-process helpers.
# It defines no tests itself.
require "minitest/autorun"
require "socket"
require "timeout"
require "tmpdir"
require "rbconfig"
require "heapscope/pprof"

module SurfacesTestHelper
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

  ROOT = File.expand_path("..", __dir__)
  LIB = File.join(ROOT, "lib")
  NATIVE = File.join(LIB, "heapscope", "heapscope.#{RbConfig::CONFIG["DLEXT"]}")

  # FakeSource stands in for Heapscope: a profile whose inuse/alloc values grow by step on each
  # call, so a delta over two calls is exactly step.
  class FakeSource
    attr_accessor :running, :payload
    attr_reader :calls

    def initialize(step: 100, running: true)
      @running = running
      @step = step
      @calls = []
      @lock = Mutex.new
    end

    def running?
      @running
    end

    def profile(gc: false, type: :heap)
      raise Heapscope::Error, "heapscope is not running" if defined?(Heapscope::Error) && !@running

      n = @lock.synchronize do
        @calls << [gc, type]
        @calls.size
      end
      return @payload if @payload

      prof = Heapscope::Pprof::Profile.new(
        sample_types: [%w[alloc_objects count], %w[alloc_space bytes], %w[inuse_objects count], %w[inuse_space bytes]],
        default_sample_type: type == :allocs ? "alloc_space" : nil,
      )
      prof.add_sample(frames: [["leak", "app.rb", 12], ["main", "app.rb", 30]],
                      values: [n, n * @step, n, n * @step], labels: { "class" => "String", "gc_age" => "1-2" })
      prof.add_sample(frames: [["steady", "app.rb", 20]], values: [5, 500, 5, 500], labels: { "class" => "Array" })
      prof.to_pprof(gzip: true)
    end
  end

  def skip_unless_native
    skip "the C extension is not built (bundle exec rake compile)" unless File.exist?(NATIVE)
  end

  def skip_unless_go
    skip "go is not installed (go tool pprof)" unless system("command -v go >/dev/null 2>&1")
  end

  # A port that was free a moment ago on 127.0.0.1.
  def free_port
    server = TCPServer.new("127.0.0.1", 0)
    server.addr[1]
  ensure
    server&.close
  end

  # A port whose next one is free too (a forked child's listener takes port + 1): both were bindable a
  # moment ago. Another process may still take one before the test does, but not one already in use.
  def free_port_pair
    50.times do
      port = free_port
      next if port >= 65_535

      begin
        TCPServer.new("127.0.0.1", port + 1).close
        TCPServer.new("127.0.0.1", port).close
        return port
      rescue Errno::EADDRINUSE
        next
      end
    end
    raise "no two consecutive free ports found"
  end

  # Sends raw bytes to 127.0.0.1:port and returns [status, headers, body] (reads until close).
  def raw_request(port, bytes, timeout: 10)
    Timeout.timeout(timeout) do
      sock = TCPSocket.new("127.0.0.1", port)
      sock.write(bytes)
      data = sock.read
      sock.close
      parse_response(data)
    end
  end

  def http_get(port, target, headers: {}, timeout: 10)
    lines = headers.map { |k, v| "#{k}: #{v}\r\n" }.join
    raw_request(port, "GET #{target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n#{lines}\r\n", timeout: timeout)
  end

  def parse_response(data)
    head, body = data.b.split("\r\n\r\n", 2)
    status_line, *lines = head.to_s.split("\r\n")
    headers = lines.to_h { |l| k, v = l.split(":", 2); [k.downcase, v.to_s.strip] }
    [status_line.to_s.split(" ")[1].to_i, headers, body.to_s]
  end

  # Waits until the block returns truthy (polling), or fails after timeout seconds.
  def wait_for(what, timeout: 15)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    loop do
      result = yield
      return result if result
      flunk "timed out waiting for #{what}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.05
    end
  end

  # Spawns a child in its own process group with output to files; returns [pid, out_path, err_path].
  def spawn_child(env, *cmd, dir:)
    out = File.join(dir, "child-#{rand(1 << 30)}.out")
    err = "#{out}.err"
    pid = Process.spawn(env, *cmd, out: out, err: err, pgroup: true)
    (@children ||= []) << pid
    [pid, out, err]
  end

  # Ends every child spawned by spawn_child (its whole process group), TERM then KILL.
  def reap_children
    (@children || []).each do |pid|
      begin
        Process.kill("TERM", -pid)
      rescue Errno::ESRCH, Errno::EPERM
        next
      end
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 5
      until Process.wait(pid, Process::WNOHANG)
        if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
          Process.kill("KILL", -pid) rescue nil
          Process.wait(pid) rescue nil
          break
        end
        sleep 0.05
      end
    rescue Errno::ECHILD
      nil
    end
    @children = []
  end

  # Runs `go tool pprof -top -lines` on a URL or file, only the samples whose labels match tagfocus
  # (KEY=VALUE) when given; returns its output (profiles it saves go to @tmp, not ~/pprof).
  def pprof_top(url, sample_index, tagfocus: nil)
    require "open3"
    focus = tagfocus ? ["-tagfocus=#{tagfocus}"] : []
    out, err, status = Timeout.timeout(60) do
      Open3.capture3({ "PPROF_TMPDIR" => @tmp, "HOME" => @tmp }, "go", "tool", "pprof", "-top", "-lines",
                     "-sample_index=#{sample_index}", *focus, url)
    end
    assert status.success?, "go tool pprof failed: #{err}"
    out
  end

  # The first row of a -top table.
  def top_row(output)
    output.lines.drop_while { |l| !l.include?("flat%") }[1].to_s
  end

  # Serves config (a config.ru) with rackup and puma on a free port, with env; returns [port, stderr path]
  # once it answers GET / with 200. Skips when the rackup or puma gem is missing.
  def start_rackup(env, config)
    begin
      rackup = Gem.bin_path("rackup", "rackup")
      Gem.bin_path("puma", "puma")
    rescue Gem::Exception
      skip "the rackup and puma gems are not installed (bundle install)"
    end
    port = free_port
    _pid, _out, err = spawn_child(env, RbConfig.ruby, rackup, "-s", "puma", "-o", "127.0.0.1", "-p", port.to_s,
                                  config, dir: @tmp)
    wait_for("rackup to listen", timeout: 30) do
      http_get(port, "/").first == 200
    rescue SystemCallError
      false
    end
    [port, err]
  end

  def ruby_env(extra = {})
    { "RUBYOPT" => "-I#{LIB} -rheapscope/auto", "RUBYLIB" => LIB }.merge(extra)
  end
end
