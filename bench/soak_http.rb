# frozen_string_literal: true

# bench/soak_http.rb: the standalone listener under a mixed, hostile load must keep answering and stay
# flat. A child process runs a small churning application under RUBYOPT=-rheapscope/auto with
# HEAPSCOPE_HTTP on 127.0.0.1 (the real listener, the real profiler). A second child (the attacker,
# no heapscope) keeps idle connections open, trickles request heads byte by byte, sends garbage
# (random bytes, TLS and HTTP/2 prefaces, oversized lines and headers, bodies, bad methods, half
# requests) and reads two profiles very slowly, reopening whatever the listener closes. This process
# is the legitimate client: a request about every 0.25 s, rotating through heap, allocs, debug=1,
# gc=1, the index and a seconds=1 delta, each of which must be answered with 200 within a second
# (the delta within its window plus a second). Every 5 s it records the application's RSS, threads,
# open descriptors and CPU from /proc.
#
# Exit status 1 unless: every legitimate request was answered in time; the RSS of the last third is
# at most 10% over the middle third (the first third is warm-up); the thread count after the first
# third never exceeds its maximum in the first third. Everything is bounded: the run ends after the
# given minutes (default 10), the attacker holds at most IDLE + SLOW + 2 connections, and both
# children are killed at the end. Loopback only. Needs the C extension (bundle exec rake compile).
#
#   bundle exec ruby -Ilib bench/soak_http.rb [minutes=10] [--idle N=500] [--slow N=50] [--garbage PER_SECOND=20]
require "socket"
require "io/wait"
require "rbconfig"
require "tmpdir"
require "fileutils"

$stdout.sync = true

ROOT = File.expand_path("..", __dir__)
LIB = File.join(ROOT, "lib")

options = { idle: 500, slow: 50, garbage: 20 }
args = ARGV.dup
minutes = 10.0
until args.empty?
  arg = args.shift
  case arg
  when "--idle", "--slow", "--garbage" then options[arg.delete_prefix("--").to_sym] = Integer(args.shift, 10)
  when /\A\d+(\.\d+)?\z/ then minutes = Float(arg)
  else abort("usage: bench/soak_http.rb [minutes=10] [--idle N] [--slow N] [--garbage PER_SECOND]")
  end
end
unless File.exist?(File.join(LIB, "heapscope", "heapscope.#{RbConfig::CONFIG["DLEXT"]}"))
  abort("bench/soak_http.rb: the C extension is not built (bundle exec rake compile)")
end
soft, hard = Process.getrlimit(:NOFILE)
need = options[:idle] + options[:slow] + 200
Process.setrlimit(:NOFILE, [need, hard].min, hard) if soft < need

def clock
  Process.clock_gettime(Process::CLOCK_MONOTONIC)
end

# The application: a fixed live set and request-like churn; every 5 s it prints its longest pause
# between two loop turns (what a forced GC or a stalled listener would show).
APP = <<~'RUBY'
  $stdout.sync = true
  live = Array.new(200_000) { |i| "live-#{i}" }
  recent = Array.new(2000)
  n = 0
  last = report = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  worst = 0.0
  loop do
    40.times { |j| recent[(n + j) % recent.size] = { id: n, name: "item-#{n}-#{j}", tags: [j.to_s] } }
    n += 1
    now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    worst = now - last if now - last > worst
    last = now
    if now - report >= 5
      puts "pause_ms #{(worst * 1000).round(1)} live #{live.size}"
      worst = 0.0
      report = now
    end
    sleep 0.0005 if (n % 50).zero? # an application that also waits on I/O, not one spinning a core
  end
RUBY

# The attacker: runs in a forked child until TERM, then prints its counters.
class Attacker
  SLOW_HEAD = "GET /debug/pprof/heap HTTP/1.1\r\nHost: x\r\nX-Pad: "
  GARBAGE = [
    -> { Random.bytes(rand(16..2048)) },
    -> { "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03".b + Random.bytes(64) },
    -> { "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" },
    -> { "GET /#{"a" * 9000} HTTP/1.1\r\n\r\n" },
    -> { "GET /debug/pprof/heap HTTP/1.1\r\n#{"X-A: #{"b" * 100}\r\n" * 200}\r\n" },
    -> { "GET /debug/pprof/heap HTTP/1.1\r\n#{"X: y\r\n" * 101}\r\n" },
    -> { "GET /debug/pprof/heap HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello" },
    -> { "POST /debug/pprof/heap HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" },
    -> { "DELETE /debug/pprof/heap HTTP/1.1\r\n\r\n" },
    -> { "GET /debug/pprof/heap?gc=2&seconds=x HTTP/1.1\r\n\r\n" },
    -> { "GET /debug/pprof/goroutine HTTP/1.1\r\n\r\n" },
    -> { "GET /heap HTTP/1.1\r\n\r\n" },
    -> { "GET /debug/pprof/heap HTTP/1.1\r\nno colon\r\n\r\n" },
    -> { "GET /debug/pprof/heap HTTP/1.1\r\n" }, # half a head, then close
    -> { "\r\n\r\n" },
    -> { "" }, # connect and close
  ].freeze

  def initialize(port, idle:, slow:, garbage:)
    @port = port
    @idle = Array.new(idle)
    @slow = Array.new(slow)
    @readers = Array.new(2)
    @garbage_per_second = garbage
    @pending = [] # garbage connections waiting for their answer: [socket, deadline, bytes read]
    @stats = Hash.new(0)
  end

  def run
    stop = false
    Signal.trap("TERM") { stop = true }
    next_garbage = clock
    next_report = clock + 5
    until stop
      if clock >= next_report
        puts @stats.sort.map { |k, v| "#{k}=#{v}" }.join(" ")
        next_report += 5
      end
      keep_open(@idle, nil, :idle)
      keep_open(@slow, SLOW_HEAD, :slow)
      keep_open(@readers, "GET /debug/pprof/heap HTTP/1.1\r\n\r\n", :slow_reader)
      @slow.each { |s| s&.write_nonblock("a", exception: false) rescue nil } # rubocop:disable Style/RescueModifier
      @readers.each { |s| s&.read_nonblock(1, exception: false) rescue nil } # rubocop:disable Style/RescueModifier
      next_garbage = clock - 1 if next_garbage < clock - 1 # no backlog of garbage after a slow pass
      while clock >= next_garbage
        garbage if @pending.size < 200
        next_garbage += 1.0 / @garbage_per_second
      end
      poll_garbage
      sleep 0.05
    end
    puts @stats.sort.map { |k, v| "#{k}=#{v}" }.join(" ")
  end

  private

  def open(head)
    sock = Socket.tcp("127.0.0.1", @port, connect_timeout: 1)
    sock.write(head) if head
    sock
  rescue SystemCallError
    @stats[:connect_failed] += 1
    nil
  end

  # Reopens (up to 100 per pass) the connections the listener answered or closed. Slow readers are
  # only replaced at end of file: they are reading on purpose.
  def keep_open(list, head, kind)
    open_ones = list.compact.reject(&:closed?)
    readable = kind == :slow_reader ? [] : (IO.select(open_ones, nil, nil, 0)&.first || [])
    budget = 100
    list.each_with_index do |s, i|
      gone = s.nil? || s.closed? || readable.include?(s) || (kind == :slow_reader && eof?(s))
      next unless gone
      break if (budget -= 1).negative?

      s&.close rescue nil # rubocop:disable Style/RescueModifier
      list[i] = open(head)
      @stats[:"#{kind}_opened"] += 1
    end
  end

  def eof?(sock)
    sock.read_nonblock(1, exception: false).nil?
  rescue SystemCallError, IOError
    true
  end

  # One garbage client: connect, send what fits without blocking; poll_garbage reads the answer.
  def garbage
    bytes = GARBAGE.sample.call
    sock = open(nil)
    return unless sock

    sock.write_nonblock(bytes, exception: false) unless bytes.empty?
    if bytes.empty?
      sock.close # connect and close
      @stats[:garbage_hangup] += 1
    else
      @pending << [sock, clock + 6.0, +""] # long enough to see a 408 for half a head
    end
  rescue SystemCallError, IOError
    sock&.close
    @stats[:garbage_reset] += 1
  end

  # Counts each garbage connection's status once it is answered and closed, or after 6 s.
  def poll_garbage
    return if @pending.empty?

    readable = IO.select(@pending.map(&:first), nil, nil, 0)&.first || []
    now = clock
    @pending.reject! do |sock, deadline, data|
      finished =
        if readable.include?(sock)
          begin
            chunk = sock.read_nonblock(4096, exception: false)
            data << chunk if chunk.is_a?(String)
            chunk.nil?
          rescue SystemCallError, IOError
            true
          end
        else
          now > deadline
        end
      if finished
        @stats[:"garbage_#{data[/\AHTTP\/1\.1 (\d+)/, 1] || "no_answer"}"] += 1
        sock.close
      end
      finished
    end
  end
end

# One legitimate request on a fresh connection: [status or nil, seconds].
def legit(port, target, limit)
  started = clock
  deadline = started + limit
  sock = Socket.tcp("127.0.0.1", port, connect_timeout: limit)
  sock.write("GET #{target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
  data = +""
  while (left = deadline - clock).positive? && sock.wait_readable(left)
    chunk = sock.read_nonblock(65_536, exception: false)
    break if chunk.nil?

    data << chunk unless chunk == :wait_readable
  end
  complete = data.include?("\r\n\r\n") && data.bytesize >= data.index("\r\n\r\n") + 4 + data[/content-length: (\d+)/i, 1].to_i
  [complete ? data[/\AHTTP\/1\.1 (\d+)/, 1].to_i : nil, clock - started]
rescue SystemCallError, IOError
  [nil, clock - started]
ensure
  sock&.close
end

# CPU seconds (user + system) from a /proc stat line.
def cpu_seconds(stat)
  stat.split(") ").last.split(" ")[11, 2].sum(&:to_i) / 100.0
end

# RSS, threads, descriptors, the process's CPU, and that of the listener's event loop (the thread named
# heapscope-http; its workers, which build the profiles, are heapscope-http-worker).
def proc_status(pid)
  status = File.read("/proc/#{pid}/status")
  loop_cpu = Dir.glob("/proc/#{pid}/task/*").sum do |task|
    File.read("#{task}/comm").strip == "heapscope-http" ? cpu_seconds(File.read("#{task}/stat")) : 0
  rescue SystemCallError
    0 # the thread ended meanwhile
  end
  { rss_mb: status[/^VmRSS:\s+(\d+)/, 1].to_i / 1024.0, threads: status[/^Threads:\s+(\d+)/, 1].to_i,
    fds: Dir.children("/proc/#{pid}/fd").size, cpu_s: cpu_seconds(File.read("/proc/#{pid}/stat")), loop_cpu_s: loop_cpu }
end

tmp = Dir.mktmpdir("heapscope-soak-http")
port = TCPServer.new("127.0.0.1", 0).then { |s| s.addr[1].tap { s.close } }
env = { "RUBYOPT" => "-I#{LIB} -rheapscope/auto", "HEAPSCOPE_HTTP" => "127.0.0.1:#{port}" }
app_out = File.join(tmp, "app.out")
app = Process.spawn(env, RbConfig.ruby, "-e", APP, out: app_out, err: File.join(tmp, "app.err"), pgroup: true)
attacker = nil
begin
  ready = clock + 30
  until (probe = legit(port, "/debug/pprof/", 1)).first == 200
    abort("bench/soak_http.rb: the listener did not come up: #{File.read(File.join(tmp, "app.err"))}") if clock > ready
    sleep 0.2
  end
  attacker_out = File.join(tmp, "attacker.out")
  attacker = fork do
    $stdout.reopen(attacker_out, "w")
    $stdout.sync = true
    $stderr.reopen($stdout)
    begin
      Attacker.new(port, **options).run
    rescue Exception => e # rubocop:disable Lint/RescueException
      puts "attacker failed: #{e.class}: #{e.message} #{e.backtrace.first(3).join(" ")}"
    end
    exit!(0)
  end
  puts "soak_http: #{minutes} min against pid #{app} on 127.0.0.1:#{port}; attacker pid #{attacker}: " \
       "#{options[:idle]} idle, #{options[:slow]} slow, #{options[:garbage]} garbage/s, 2 slow readers"

  targets = ["/debug/pprof/heap", "/debug/pprof/allocs", "/debug/pprof/heap?debug=1", "/debug/pprof/heap?gc=1",
             "/debug/pprof/", "/debug/pprof/allocs?debug=1&gc=1"]
  started = clock
  deadline = started + minutes * 60
  readings = []
  legit_count = 0
  failures = []
  latencies = []
  next_reading = started + 5 # the first reading after a few requests, so warm-up is in the first third
  next_delta = started + 10
  i = 0
  while (now = clock) < deadline
    if now >= next_delta
      target = "/debug/pprof/heap?seconds=1"
      limit = 2.0
      next_delta = now + 30
    else
      target = targets[i % targets.size]
      limit = 1.0
      i += 1
    end
    status, seconds = legit(port, target, limit)
    legit_count += 1
    latencies << seconds if limit == 1.0
    failures << "#{target}: #{status.inspect} after #{seconds.round(3)} s at #{(now - started).round}s" unless status == 200 && seconds < limit
    if clock >= next_reading
      reading = proc_status(app).merge(t: (clock - started).round)
      readings << reading
      pause = File.read(app_out).scan(/pause_ms (\S+)/).last&.first
      recent = latencies.last(40)
      printf("%5ds rss=%.1f MB threads=%d fds=%d cpu=%.1fs (event loop %.1fs) legit=%d failed=%d p50=%.1fms max=%.1fms " \
             "app_pause=%sms\n", reading[:t], reading[:rss_mb], reading[:threads], reading[:fds], reading[:cpu_s],
             reading[:loop_cpu_s], legit_count,
             failures.size, recent.sort[recent.size / 2].to_f * 1000, recent.max.to_f * 1000, pause || "-")
      next_reading += 5
    end
    sleep 0.25
  end

  Process.kill("TERM", attacker)
  Process.wait(attacker)
  attacker_stats = File.read(attacker_out).strip.lines.last.to_s.strip
  attacker = nil
  third = [readings.size / 3, 1].max
  first = readings.first(third)
  middle = readings[third, third] || first
  last = readings.last(third)
  rss_ok = last.map { |r| r[:rss_mb] }.max <= middle.map { |r| r[:rss_mb] }.max * 1.10
  threads_ok = readings.drop(third).map { |r| r[:threads] }.max.to_i <= first.map { |r| r[:threads] }.max
  sorted = latencies.sort
  puts "attacker: #{attacker_stats}"
  puts "app pauses (ms, every 5 s): #{File.read(app_out).scan(/pause_ms (\S+)/).flatten.join(" ")}"
  printf("legit: %d requests, %d failed; latency p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", legit_count, failures.size,
         sorted[sorted.size / 2].to_f * 1000, sorted[(sorted.size * 0.99).floor].to_f * 1000, sorted.last.to_f * 1000)
  printf("rss: first third max %.1f MB, middle third max %.1f MB, last third max %.1f MB: %s\n",
         first.map { |r| r[:rss_mb] }.max, middle.map { |r| r[:rss_mb] }.max, last.map { |r| r[:rss_mb] }.max,
         rss_ok ? "flat" : "GROWING")
  printf("threads: first third max %d, afterwards max %d: %s; fds max %d\n", first.map { |r| r[:threads] }.max,
         readings.drop(third).map { |r| r[:threads] }.max.to_i, threads_ok ? "flat" : "GROWING",
         readings.map { |r| r[:fds] }.max)
  failures.first(20).each { |line| puts "  failed: #{line}" }
  ok = failures.empty? && rss_ok && threads_ok
  puts ok ? "soak_http: PASS" : "soak_http: FAIL"
  exit(ok ? 0 : 1)
ensure
  [attacker, app].compact.each do |pid|
    Process.kill("KILL", pid == app ? -pid : pid)
    Process.wait(pid)
  rescue SystemCallError
    nil
  end
  FileUtils.rm_rf(tmp)
end
