# frozen_string_literal: true

require "rbconfig"
require "tmpdir"

# Ractor cases (issue items 3 and 4): each runs in a fresh Ruby process, because the failures were a
# Ractor::UnsafeError that killed the application and a segfault inside Ruby. Shared by
# test/test_hardening_ractors.rb (a few runs per case) and bench/ractors.rb (10 runs per case).
#
# Every script prints "RESULT <what the application computed>" and, where heapscope was running,
# "OFF <off_reason>"; run checks the exit status, those lines, that there is no [BUG] and no exception
# on stderr, and how many of heapscope's Ractor warnings were printed.
module RactorCases
  ROOT = File.expand_path("../..", __dir__)
  WARNING = "profiling is off for now (heapscope does not support Ractors)"
  # Ruby 3.1's VM crash (ext/heapscope/ractors.h): heapscope cannot start again there once a Ractor ran.
  RESTARTS = Gem::Version.new(RUBY_VERSION) >= Gem::Version.new("3.3")

  PRELUDE = <<~'RUBY'
    Warning[:experimental] = false
    $stdout.sync = true
    def off_line = puts("OFF #{Heapscope.stats[:off_reason].inspect} running=#{Heapscope.running?}")
    # Ruby 4.0 replaced Ractor#take (3.x) with Ractor#value: the cases say take on every Ruby.
    class Ractor; alias_method :take, :value unless method_defined?(:take); end
  RUBY

  # A Ractor made through a Method taken before heapscope loaded: Ractor.new's prepend never sees it.
  # Its work (100,000 allocations) keeps it alive well past the main Ractor's next interrupt check,
  # where Ruby 3.3 (which has no multi-Ractor flag to read) counts Ractors (ext/heapscope/ractors.h).
  CAPTURED = <<~'RUBY'
    SPAWN = Ractor.method(:new)
    require "heapscope"
    Heapscope.start(sample_every: 1000, OPTIONS)
    puts "RESULT #{SPAWN.call { 100_000.times.map { |i| "x#{i}" }.size }.take}"
    off_line
  RUBY

  CASES = {
    # Item 3 as reported: heapscope required, never started.
    "nested_not_started" => {
      script: %(require "heapscope"\nputs "RESULT \#{Ractor.new { Ractor.new { 1 }.take + 1 }.take}"\n),
      result: "2", warnings: 0,
    },
    "nested_running" => {
      script: <<~'RUBY',
        require "heapscope"
        Heapscope.start
        puts "RESULT #{Ractor.new { Ractor.new { 1 }.take + 1 }.take}"
        off_line
      RUBY
      result: "2", warnings: 1, off: true,
    },
    # Item 4 as reported (the default sampling: always on 3.1, windowed on 3.3+), then each mode.
    "captured_default" => { script: CAPTURED.sub(", OPTIONS", ""), result: "100000", warnings: 1, off: true },
    "captured_always" => { script: CAPTURED.sub("OPTIONS", "sampling: :always"), result: "100000", warnings: 1, off: true },
    "captured_windowed" => {
      script: CAPTURED.sub("OPTIONS", "sampling: :windowed, window_share: 0.5"), result: "100000", warnings: 1, off: true,
      if: -> { Heapscope::Native::WINDOWED_SUPPORTED },
    },
    # The Ractor starts while windows open and close (the ticker on 3.3+, GCs on 3.1) and the main
    # Ractor goes on allocating (not blocked in take): a GC or job in either Ractor may meet it first.
    "captured_during_windows" => {
      script: <<~'RUBY',
        SPAWN = Ractor.method(:new)
        require "heapscope"
        Heapscope.start(sample_every: 50, sampling: :windowed, window_share: 0.5)
        keep = []
        200.times { keep << 1000.times.map { |i| "k#{i}" }; keep.shift if keep.size > 20 }
        r = SPAWN.call { 20.times.sum { 20_000.times.map { |i| "x#{i}" }.size } }
        300.times { keep << 1000.times.map { |i| [i] }; keep.shift if keep.size > 20 }
        puts "RESULT #{r.take}"
        off_line
      RUBY
      result: "400000", warnings: 1, off: true,
      if: -> { Heapscope::Native::WINDOWED_SUPPORTED },
    },
    # A supervisor Ractor that starts workers, under autostart with the periodic files and the
    # listener, which go on working (and asking for profiles) after heapscope switched itself off.
    "supervisor_autostart" => {
      autostart: true,
      script: <<~'RUBY',
        require "net/http"
        sup = Ractor.new do
          workers = 3.times.map { |i| Ractor.new(i) { |n| 20_000.times.map { |k| "w#{n}-#{k}" }.size } }
          workers.sum(&:take)
        end
        x = 0
        20.times { x += 5_000.times.map { |i| "m#{i}" }.size; sleep 0.02 }
        puts "RESULT #{sup.take + x}"
        sleep 0.5 # the periodic writer runs a few times with heapscope off
        uri = URI("http://127.0.0.1:#{Heapscope::Auto.server.port}/debug/pprof/heap")
        res = Net::HTTP.get_response(uri)
        puts "HTTP #{res.code} #{res.body.lines.first}"
        off_line
      RUBY
      result: "160000", warnings: 1, off: true, http: "503", http_says: "switched itself off: a Ractor was started",
    },
    # After the Ractors are gone: 3.3+ starts again (and profiles); 3.1 refuses, saying why.
    "restart_after_ractors" => {
      script: <<~'RUBY',
        SPAWN = Ractor.method(:new)
        require "heapscope"
        Heapscope.start(sample_every: 1000)
        puts "RESULT #{SPAWN.call { 100_000.times.map { |i| "x#{i}" }.size }.take}"
        off_line
        sleep 0.01 while Ractor.count > 1
        begin
          Heapscope.start(sample_every: 10)
          keep = 1000.times.map { |i| "again #{i}" }
          puts "RESTART profile #{Heapscope.profile.bytesize > 0}"
        rescue Heapscope::Error => e
          puts "RESTART refused #{e.message}"
        end
      RUBY
      result: "100000", warnings: 1, off: true, restart: RESTARTS ? "profile true" : "refused heapscope cannot start on Ruby",
    },
  }.freeze

  module_function

  def names
    require_relative "../../lib/heapscope"
    CASES.select { |_, c| c[:if].nil? || c[:if].call }.keys
  end

  # Runs case name once in a fresh process. Returns [errors (empty when it passed), stdout, stderr].
  def run(name, timeout: 120)
    c = CASES.fetch(name)
    Dir.mktmpdir("heapscope-ractors") do |dir|
      env = { "RUBYOPT" => nil }
      args = [RbConfig.ruby, "-I#{ROOT}/lib"]
      if c[:autostart]
        env.merge!("HEAPSCOPE_DIR" => dir, "HEAPSCOPE_INTERVAL" => "0.1", "HEAPSCOPE_HTTP" => "0", "HEAPSCOPE_FINAL" => "1")
        args << "-rheapscope/auto"
      end
      script = File.join(dir, "case.rb")
      File.write(script, PRELUDE + c[:script])
      out_r, out_w = IO.pipe
      err_r, err_w = IO.pipe
      pid = Process.spawn(env, *args, script, out: out_w, err: err_w, chdir: dir)
      out_w.close
      err_w.close
      readers = [Thread.new { out_r.read }, Thread.new { err_r.read }]
      status = nil
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
      until (status = Process.wait2(pid, Process::WNOHANG)&.last)
        if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
          Process.kill(:KILL, pid)
          status = Process.wait2(pid).last
          break
        end
        sleep 0.05
      end
      out, err = readers.map(&:value)
      [check(c, status, out, err), out, err]
    end
  end

  def check(c, status, out, err)
    errors = []
    errors << "exit status #{status.inspect}" unless status.success?
    errors << "Ruby crashed: [BUG]" if err.include?("[BUG]")
    errors << "an exception on stderr" if err.match?(/Error\)|terminated with exception|\(\w+Error\)/)
    result = out[/^RESULT (.*)$/, 1]
    errors << "RESULT #{result.inspect}, wanted #{c[:result]}" unless result == c[:result]
    warnings = err.scan(WARNING).size
    errors << "#{warnings} heapscope Ractor warnings, wanted #{c[:warnings]}" unless warnings == c[:warnings]
    if c[:off]
      off = out[/^OFF (.*)$/, 1].to_s
      errors << "heapscope not off for a Ractor: #{off}" unless off.include?("a Ractor was started") && off.end_with?("running=false")
    end
    errors << "listener answered #{out[/^HTTP (.*)$/, 1].inspect}, wanted #{c[:http]}" if c[:http] && out[/^HTTP (\d+)/, 1] != c[:http]
    if c[:http_says] && !out[/^HTTP (.*)$/, 1].to_s.include?(c[:http_says])
      errors << "listener said #{out[/^HTTP (.*)$/, 1].inspect}, wanted it to say #{c[:http_says].inspect}"
    end
    errors << "restart: #{out[/^RESTART (.*)$/, 1].inspect}, wanted #{c[:restart]}" if c[:restart] && !out[/^RESTART (.*)$/, 1].to_s.start_with?(c[:restart])
    errors
  end
end
