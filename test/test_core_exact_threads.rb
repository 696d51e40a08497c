# frozen_string_literal: true

# Threads and Fibers are recorded whole (exact_threads, on by default): each one made by Thread.new,
# .start, .fork or Fiber.new is at its caller's line with weight 1 and no error, in the default mode and
# under sampling always, at the default rate, where a sample of one used to stand for a thousand stacks
# (issue 31: one Puma thread read as 1000 MiB). The census's unsampled row for them is exact too. Off,
# they are sampled like any object. heapscope's own threads and other Ractors are left alone.

require_relative "core_helper"
require "open3"
require "rbconfig"
require "tmpdir"
require "heapscope/report/census"
require "heapscope/report/sites"

class TestCoreExactThreads < Minitest::Test
  include CoreHelper

  class Worker < Thread; end

  # Makes 3 + 2 + 1 Threads, 2 Workers and 4 Fibers, each kind at its own line, all kept alive on a
  # queue; yields them, then lets the threads end.
  def with_threads_and_fibers
    queue = Queue.new
    threads = Array.new(3) { Thread.new { queue.pop } } # THREAD_NEW
    threads += Array.new(2) { Thread.start { queue.pop } } # THREAD_START
    threads << Thread.fork { queue.pop } # THREAD_FORK
    threads += Array.new(2) { Worker.new { queue.pop } } # WORKER_NEW
    fibers = Array.new(4) { Fiber.new { Fiber.yield 1 } } # FIBER_NEW
    fibers.each(&:resume)
    Thread.pass until threads.all? { |t| t.status == "sleep" }
    yield threads, fibers
  ensure
    threads&.size&.times { queue << 1 }
    threads&.each(&:join)
  end

  # marker => [count, class]
  EXPECTED = { "THREAD_NEW" => [3, "Thread"], "THREAD_START" => [2, "Thread"], "THREAD_FORK" => [1, "Thread"],
               "WORKER_NEW" => [2, "TestCoreExactThreads::Worker"], "FIBER_NEW" => [4, "Fiber"] }.freeze

  def check_exact(prof, threads, fibers)
    made = { "THREAD_NEW" => threads[0, 3], "THREAD_START" => threads[3, 2], "THREAD_FORK" => threads[5, 1],
             "WORKER_NEW" => threads[6, 2], "FIBER_NEW" => fibers }
    EXPECTED.each do |marker, (count, klass)|
      line = line_of("# #{marker}", __FILE__)
      samples = made_at(prof, line, klass)
      assert_equal count, samples.sum { |s| s.value("inuse_objects") }, "#{marker}: live objects"
      assert_equal count, samples.sum { |s| s.value("alloc_objects") }, "#{marker}: allocations"
      bytes = made[marker].sum { |o| ObjectSpace.memsize_of(o) }
      assert_equal bytes, samples.sum { |s| s.value("inuse_space") }, "#{marker}: live bytes"
      # Known, not estimated: no variance label is above 0.
      samples.each do |s|
        variance = s.labels.select { |k, _| k.end_with?("_var") || k.match?(/_vg\d+\z/) }
        assert variance.values.all?(&:zero?), "#{marker}: #{variance}"
      end
    end
  end

  # The samples of klass whose innermost frame in this file is at line. Not the leaf: another library
  # may wrap Thread.new in Ruby too (test_hardening_http_threads.rb does, in this process), and its
  # frame, between ours and the caller, is where the object was made as far as any stack can tell.
  def made_at(prof, line, klass)
    file = File.expand_path(__FILE__)
    prof.samples.select do |s|
      s.labels["class"] == klass && (mine = s.frames.find { |f| f.file == file }) && mine.line == line
    end
  end

  def test_threads_and_fibers_are_recorded_whole_at_their_line
    Heapscope.start(sample_every: 1000)
    with_threads_and_fibers do |threads, fibers|
      bytes = Heapscope.profile(gc: true)
      prof = decode(bytes)
      check_exact(prof, threads, fibers)
      assert_equal 12, Heapscope.stats[:exact_tracked]
      assert_includes prof.comments, "exact_threads=true exact_tracked=12 skipped_exact=#{Heapscope.stats[:skipped_exact]}"
      # The census row of Threads: what no site shows (the main thread, made before start) is exact.
      census = Heapscope::Report::Census.of(prof)
      ti = prof.sample_type_names.index("inuse_space")
      row = census.report(prof, ti)["rows"].find { |r| r["name"] == "Thread" }
      assert_equal 0, row["error"]
      assert_equal threads[0, 6].sum { |t| ObjectSpace.memsize_of(t) }, row["at_sites"]
      # A subclass is recorded whole too, and the census names it so: its row is exact as well (before
      # the "heapscope exact class" lines it kept the sampled error, 1 MiB stacks squared).
      assert_includes prof.comments, "heapscope exact class: name=TestCoreExactThreads::Worker"
      worker = census.class_row(prof, ti, "TestCoreExactThreads::Worker")
      assert_equal [threads[6, 2].sum { |t| ObjectSpace.memsize_of(t) }, 0, 0], worker.values_at("at_sites", "not_seen", "error")
      refute prof.comments.any? { |c| c.start_with?("heapscope exact class: name=String") }, "only classes recorded whole"
      # go tool pprof reads the same: the Fibers' line holds 4 objects of class Fiber. (Last: Open3
      # makes threads of its own, recorded too.)
      Dir.mktmpdir do |dir|
        path = File.join(dir, "heap.pb.gz")
        File.binwrite(path, bytes)
        top, status = Open3.capture2e("go", "tool", "pprof", "-top", "-lines", "-sample_index=inuse_objects",
                                      "-tagfocus=class=Fiber", path)
        assert status.success?, top
        row = top.lines.find { |l| l.include?("#{File.basename(__FILE__)}:#{line_of("# FIBER_NEW", __FILE__)}") }
        assert_match(/\A\s*4\s/, row.to_s, top)
      end
    end
  end

  # Sampling always, at the default rate and at every allocation: the hook leaves Threads and Fibers
  # alone (skipped_exact, at least the 12 made here when it sees every allocation), so nothing is
  # counted twice.
  def test_always_sampling_records_them_whole_too
    [1000, 1].each do |every|
      Heapscope.start(sampling: :always, sample_every: every)
      with_threads_and_fibers do |threads, fibers|
        check_exact(heap_profile(gc: true), threads, fibers)
        assert_operator Heapscope.stats[:skipped_exact], :>=, 12 if every == 1
      end
      Heapscope.stop
    end
  end

  # Every allocation sampled (weight 1) shows them at the same lines, through the hook: exact_threads
  # off leaves them to the sampler, and the profile says so.
  def test_off_they_are_sampled_like_any_object
    Heapscope.start(sampling: :always, sample_every: 1, exact_threads: false)
    with_threads_and_fibers do |_threads, _fibers|
      prof = heap_profile(gc: true)
      assert_equal 0, Heapscope.stats[:exact_tracked]
      assert_includes prof.comments, "exact_threads=false exact_tracked=0 skipped_exact=0"
      refute prof.comments.any? { |c| c.start_with?("heapscope exact class:") }, "nothing is recorded whole"
      # At the caller's line: the wrappers add no Ruby frame a sample could take its line from.
      assert_equal 3, made_at(prof, line_of("# THREAD_NEW", __FILE__), "Thread").sum { |s| s.value("inuse_objects") }
      assert_equal 4, made_at(prof, line_of("# FIBER_NEW", __FILE__), "Fiber").sum { |s| s.value("inuse_objects") }
    end
  end

  def test_heapscope_threads_and_stopped_runs_are_left_alone
    Heapscope.start(sample_every: 1000)
    thread = Heapscope.start_internal_thread("heapscope-test") { sleep }
    assert_equal 0, Heapscope.stats[:exact_tracked]
    thread.kill.join
    Heapscope.stop
    t = Thread.new { 1 } # made while stopped: nothing recorded, nothing raised
    assert_equal 1, t.value
    assert_equal({ x: 1 }, Thread.new(x: 1) { |x:| { x: x } }.value) # keywords still reach the block
    assert_equal [{ x: 1 }], Thread.new({ x: 1 }) { |*a| a }.value # a positional Hash stays positional
    assert_raises(ThreadError) { Thread.new } # and Thread.new's own errors still come through
  end

  def test_bad_option_is_named
    error = assert_raises(ArgumentError) { Heapscope.start(exact_threads: "yes") }
    assert_includes error.message, "exact_threads"
  end

  # A Ractor makes threads and fibers: heapscope is off then (it does not support Ractors), and its
  # wrappers never call the core from there (that would raise Ractor::UnsafeError in the Ractor).
  def test_threads_made_inside_a_ractor_do_not_raise
    script = <<~RUBY
      Warning[:experimental] = false
      require "heapscope"
      Heapscope.start
      r = Ractor.new { [Thread.new { 1 }.value, Fiber.new { 2 }.resume, Thread.start { 3 }.value] }
      p(r.respond_to?(:value) ? r.value : r.take)
    RUBY
    out, status = Open3.capture2e({ "RUBYOPT" => nil }, RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), "-e", script)
    assert status.success?, out
    assert_includes out, "[1, 2, 3]"
  end
end
