# frozen_string_literal: true

require "minitest/autorun"
require "open3"
require "rbconfig"

# Code that runs at an interrupt check (a trap handler, another thread, a postponed job) may stop or
# restart heapscope. Before the fix, a profile polled GC.stress with a method call between its census and
# its snapshot (Ruby 3.3+): a trap handler or a thread switch there ran Heapscope.stop and start in the
# middle of the profile (gdb: capture_stop under profile_take, 3,973 times in 25 s), which then read a
# freed recorder; a Ractor found by the ticker's job there did the same (a segfault in Native._profile
# seen once in CI's Ractor cases). Now every API entry asks Ruby first and the profile's steps run no
# Ruby code; Heapscope.stats[:profiles_abandoned] counts a profile that found its run gone.
class TestHardeningInterrupts < Minitest::Test
  ROOT = File.expand_path("..", __dir__)

  # The main thread takes profiles for SECONDS while a child process sends SIGUSR1 every few ms; the
  # trap handler stops heapscope and, two times in three, starts it again. The census makes most of a
  # profile's time a stretch without interrupt checks, so signals pile up for the first check after it.
  SCRIPT = <<~'RUBY'
    require "heapscope"
    require "heapscope/pprof"
    Heapscope.start
    keep = 200_000.times.map { |i| "k#{i}" }
    traps = inside = 0
    trap("USR1") do
      traps += 1
      inside += 1 if caller.any? { |l| l.include?("_profile") }
      Heapscope.stop
      Heapscope.start unless traps % 3 == 0
    end
    killer = spawn("sh", "-c", "while kill -USR1 #{Process.pid} 2>/dev/null; do sleep 0.003; done")
    ring = []
    taken = refused = bad = 0
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) - started < Float(ENV.fetch("SECONDS_TO_RUN"))
      ring << 1000.times.map { |i| "r#{i}" }
      ring.shift if ring.size > 10
      begin
        bytes = Heapscope.profile
        Heapscope::Pprof.decode(bytes).samples.size
        taken += 1
      rescue Heapscope::Error
        refused += 1
        Heapscope.start rescue nil
      rescue => e
        bad += 1
        warn "BAD #{e.class}: #{e.message}"
      end
    end
    trap("USR1", "IGNORE")
    Process.kill("TERM", killer)
    Process.wait(killer)
    Heapscope.start rescue nil
    puts "taken=#{taken} refused=#{refused} bad=#{bad} traps=#{traps} inside=#{inside} abandoned=#{Heapscope.stats[:profiles_abandoned]}"
  RUBY

  def test_stop_and_start_from_a_trap_handler_during_profiles
    out, err, status = Open3.capture3({ "RUBYOPT" => nil, "SECONDS_TO_RUN" => "3" }, RbConfig.ruby, "-I#{ROOT}/lib", "-e", SCRIPT)
    assert status.success?, "exit #{status.inspect}\n#{out}\n#{err[0, 3000]}"
    m = out.match(/taken=(\d+) refused=(\d+) bad=(\d+) traps=(\d+) inside=(\d+) abandoned=(\d+)/)
    refute_nil m, "#{out}\n#{err[0, 3000]}"
    taken, _refused, bad, traps, inside, abandoned = m.captures.map(&:to_i)
    assert_equal 0, bad, err[0, 3000]
    assert_equal 0, abandoned, "a profile found its run stopped or restarted between its steps: #{out}"
    # The test exercised the path: profiles were taken, and many traps ran inside Native._profile.
    assert_operator taken, :>=, 20, out
    assert_operator traps, :>=, 100, out
    assert_operator inside, :>=, 20, "too few traps ran inside a profile to test anything: #{out}"
  end

  # A trap handler that raises (as Ruby's own SIGINT handler does) may run inside the sync job's
  # GC.stress poll. The job still runs afterwards: the poll catches the raise and raises it again once
  # the job is done (unwinding through the job would leave it marked running, and no window would
  # change again). Raises land at whatever interrupt check comes first, and one inside the poll is rare,
  # so this checks the program's view over many: raises are rescued, and windows go on opening.
  RAISING = <<~'RUBY'
    require "heapscope"
    Heapscope.start
    Boom = Class.new(StandardError)
    # Ignored until the loop can rescue: the first signal may come while spawn is still returning.
    trap("USR1", "IGNORE")
    killer = spawn("sh", "-c", "while kill -USR1 #{Process.pid} 2>/dev/null; do sleep 0.002; done")
    rescued = 0
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 1.5
    begin # (a raise lands at any interrupt check: the loop's condition and the trap calls included)
      trap("USR1") { raise Boom } if Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      2000.times { Object.new } while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      trap("USR1", "IGNORE")
    rescue Boom
      rescued += 1
      retry
    end
    Process.kill("TERM", killer)
    Process.wait(killer)
    before = Heapscope.stats.values_at(:sync_jobs, :windows_opened)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    200.times { Object.new } while Process.clock_gettime(Process::CLOCK_MONOTONIC) - started < 0.5
    after = Heapscope.stats.values_at(:sync_jobs, :windows_opened)
    puts "rescued=#{rescued} jobs=#{after[0] - before[0]} windows=#{after[1] - before[1]} ticker=#{Heapscope::Native::WINDOWED_TICKER}"
  RUBY

  def test_a_trap_handler_that_raises_leaves_the_windows_going
    out, err, status = Open3.capture3({ "RUBYOPT" => nil }, RbConfig.ruby, "-I#{ROOT}/lib", "-e", RAISING)
    assert status.success?, "exit #{status.inspect}\n#{out}\n#{err[0, 3000]}"
    m = out.match(/rescued=(\d+) jobs=(\d+) windows=(\d+) ticker=(true|false)/)
    refute_nil m, "#{out}\n#{err[0, 3000]}"
    assert_operator m[1].to_i, :>=, 50, out
    skip "no ticker on Ruby #{RUBY_VERSION}: windows change at GCs" unless m[4] == "true"
    assert_operator m[2].to_i, :>, 0, "no sync job ran after the raises: #{out}"
    assert_operator m[3].to_i, :>, 0, "no window opened after the raises: #{out}"
  end
end
