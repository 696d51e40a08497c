# frozen_string_literal: true

require "minitest/autorun"
require "open3"
require "rbconfig"

# Fault injection (issue 6, fail-safe): Heapscope::Testing.fail_recorder_allocations(n) makes the
# recorder's next n allocations fail. Samples that needed the memory are dropped and counted; a
# profile that cannot get memory raises NoMemoryError; nothing crashes, and everything works again
# once memory is back. (The pure-C modules' failure paths are covered exhaustively by
# test/c/test_faults.c.) Runs in a child process, so a crash fails the test instead of the runner.
class TestFaultInjection < Minitest::Test
  LIB = File.expand_path("../lib", __dir__)

  def run_script(script)
    out, err, status = Open3.capture3({ "RUBYOPT" => nil }, RbConfig.ruby, "-I", LIB, "-e", script)
    assert status.success?, "#{status.inspect}\n--- stdout\n#{out}\n--- stderr\n#{err.lines.first(40).join}"
    out
  end

  def test_failed_recorder_allocations_drop_samples_and_are_counted
    out = run_script(<<~'RUBY')
      require "heapscope"
      require "heapscope/pprof"
      def live(line)
        prof = Heapscope::Pprof.decode(Heapscope.profile(gc: true))
        prof.samples.select { |s| s.frames.first&.line == line && s.labels["class"] == "String" }.sum { |s| s.value("inuse_objects") }
      end
      Heapscope.start(sample_every: 1, max_overhead: nil)
      keep = []
      Heapscope::Testing.fail_recorder_allocations(3)
      # The record array grows at 1024, 2048 and 4096 records: each growth fails once, drops one sample,
      # and the next sample grows it.
      8000.times { |i| keep << "item #{i}" } # LINE
      line = __LINE__ - 1
      stats = Heapscope.stats
      raise "dropped_no_memory #{stats[:dropped_no_memory]}" unless stats[:dropped_no_memory] == 3
      raise "dropped #{stats[:dropped]}" unless stats[:dropped] == 3
      got = live(line)
      raise "live #{got}" unless got.between?(8000 - 3, 8000)
      raise "invalid records" unless Heapscope.stats[:invalid_records] == 0
      puts "OK #{got} live, #{stats[:dropped_no_memory]} dropped"
    RUBY
    assert_match(/\AOK /, out)
    puts "\n  #{out}" if ENV["HEAPSCOPE_STRESS_VERBOSE"]
  end

  def test_profile_without_memory_raises_and_the_next_one_works
    out = run_script(<<~'RUBY')
      require "heapscope"
      require "heapscope/pprof"
      Heapscope.start(sample_every: 1, max_overhead: nil)
      keep = Array.new(3000) { |i| "item #{i}" } # LINE
      line = __LINE__ - 1
      count = -> { Heapscope::Pprof.decode(Heapscope.profile(gc: true)).samples.select { |s| s.frames.first&.line == line && s.labels["class"] == "String" }.sum { |s| s.value("inuse_objects") } }
      before = count.call
      raised = 0
      # Fail each of the snapshot's first allocations in turn (groups, stack slices, scratch).
      (1..6).each do |n|
        Heapscope::Testing.fail_recorder_allocations(n)
        begin
          Heapscope.profile
        rescue NoMemoryError => e
          raise "message: #{e.message}" unless e.message.start_with?("heapscope:")
          raised += 1
        end
        Heapscope::Testing.fail_recorder_allocations(0)
        after = count.call
        raise "after #{n} failures: #{after} != #{before}" unless after == before
      end
      raise "no failure was injected" if raised.zero?
      raise "invalid records" unless Heapscope.stats[:invalid_records] == 0
      Heapscope.stop
      Heapscope::Testing.fail_recorder_allocations(1)
      Heapscope.start(sample_every: 1, max_overhead: nil) # recorder_new's own allocations are not hooked
      keep2 = Array.new(2000) { |i| "more #{i}" }
      Heapscope.profile(gc: true)
      puts "OK #{raised} profiles refused, counts unchanged (#{before})"
    RUBY
    assert_match(/\AOK /, out)
    puts "\n  #{out}" if ENV["HEAPSCOPE_STRESS_VERBOSE"]
  end
end
