# frozen_string_literal: true

require "minitest/autorun"
require "open3"
require "tmpdir"

# Issue 33: bin/setup failed at once when another process held apt's lock. It now waits (bounded),
# saying once who holds it. Only the wait is run here (`bin/setup wait-apt-lock`, on a lock file of
# the test's: HEAPSCOPE_APT_LOCKS), never apt-get. /proc/locks lists flock locks as it lists apt's
# fcntl ones, so a flock held by this process stands for apt.
class TestBinSetup < Minitest::Test
  SETUP = File.expand_path("../bin/setup", __dir__)

  def setup
    skip "needs Linux's /proc/locks" unless File.readable?("/proc/locks")
    @dir = Dir.mktmpdir("heapscope-setup")
    @lock = File.join(@dir, "lock-frontend")
    File.write(@lock, "")
  end

  def teardown
    FileUtils.rm_rf(@dir) if @dir
  end

  def wait_for_lock(wait)
    env = { "HEAPSCOPE_APT_LOCKS" => "#{File.join(@dir, "missing")} #{@lock}", "HEAPSCOPE_APT_LOCK_WAIT" => wait.to_s }
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    out, err, status = Open3.capture3(env, SETUP, "wait-apt-lock")
    [status.exitstatus, out, err, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started]
  end

  def test_a_free_lock_is_not_waited_for
    status, out, err, seconds = wait_for_lock(30)
    assert_equal [0, "", ""], [status, out, err]
    assert_operator seconds, :<, 5
  end

  def test_it_waits_for_the_lock_and_says_so_once
    File.open(@lock) do |f|
      f.flock(File::LOCK_EX)
      Thread.new { sleep 2.5; f.flock(File::LOCK_UN) }
      status, out, err, seconds = wait_for_lock(30)
      assert_equal [0, ""], [status, out]
      assert_equal ["bin/setup: waiting for apt's lock (held by PID #{Process.pid}, ruby: #{@lock}), up to 30 s\n"],
                   err.lines.map { |l| l.sub(/PID (\d+), [^:]*:/, "PID \\1, ruby:") }
      assert_operator seconds, :>=, 2
      assert_operator seconds, :<, 20
    end
  end

  def test_the_wait_is_bounded
    File.open(@lock) do |f|
      f.flock(File::LOCK_EX)
      status, _, err, seconds = wait_for_lock(1)
      assert_equal 1, status
      assert_equal 2, err.lines.size, err
      assert_equal "bin/setup: apt's lock (#{@lock}) is still held by PID #{Process.pid} after 1 s; " \
                   "run bin/setup again when it is done\n", err.lines.last
      assert_operator seconds, :<, 10
    end
  end
end
