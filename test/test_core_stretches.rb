# frozen_string_literal: true

require_relative "core_helper"

# A weight scale per stretch of the run (docs/windowed-sampling.md): when a stretch closes, every sample
# of its windows is multiplied by its scale, in the allocation counters (folded in then) and in live
# records (found by window number at each profile); later samples keep the open stretch's scale; exact
# records (Threads) are never scaled. The plan's choice of stretches and scales is unit-tested in C
# (test/c/test_sampling_plan.c); here Testing.close_stretch drives the recorder's side, under
# sample_every: 1 so every allocation is a sample of weight 1 and the expected values are exact.
class TestCoreStretches < Minitest::Test
  include CoreHelper

  class Before; end
  class After; end

  def test_a_closed_stretch_scales_its_samples_and_no_other
    Heapscope.start(sample_every: 1, sampling: :always, min_age: 0)
    before = Array.new(1000) { Before.new } # BEFORE_LINE
    early = "x" * 100 # EARLY_LINE: measured at the next GC or profile, after its stretch closed
    thread = Thread.new { sleep } # THREAD_LINE
    assert Heapscope::Testing.close_stretch(0.5)
    after = Array.new(400) { After.new } # AFTER_LINE
    prof = heap_profile
    assert_equal 500, made(prof, "alloc_objects", at("# BEFORE_LINE"), klass: "#{self.class}::Before")
    assert_equal 500, made(prof, "inuse_objects", at("# BEFORE_LINE"), klass: "#{self.class}::Before")
    assert_equal 400, made(prof, "inuse_objects", at("# AFTER_LINE"), klass: "#{self.class}::After")
    assert_equal 400, made(prof, "alloc_objects", at("# AFTER_LINE"), klass: "#{self.class}::After")
    # Bytes measured after the stretch closed take its scale too, in counters and live records alike.
    size = ObjectSpace.memsize_of(early)
    assert_in_delta 0.5 * size, made(prof, "alloc_space", at("# EARLY_LINE"), klass: "String"), 1.0
    assert_in_delta 0.5 * size, made(prof, "inuse_space", at("# EARLY_LINE"), klass: "String"), 1.0
    # A Thread recorded whole is known, not estimated: never scaled.
    assert_equal 1, made(prof, "inuse_objects", at("# THREAD_LINE"), klass: "Thread")
    # A second stretch: the first keeps its scale, the second gets its own.
    assert Heapscope::Testing.close_stretch(2.0)
    prof = heap_profile
    assert_equal 500, made(prof, "alloc_objects", at("# BEFORE_LINE"), klass: "#{self.class}::Before")
    assert_equal 800, made(prof, "alloc_objects", at("# AFTER_LINE"), klass: "#{self.class}::After")
    # After Heapscope.reset the counters start empty; live records keep their stretches' scales.
    Heapscope.reset
    prof = heap_profile
    assert_equal 0, made(prof, "alloc_objects", at("# BEFORE_LINE"), klass: "#{self.class}::Before")
    assert_equal 500, made(prof, "inuse_objects", at("# BEFORE_LINE"), klass: "#{self.class}::Before")
    assert_equal 800, made(prof, "inuse_objects", at("# AFTER_LINE"), klass: "#{self.class}::After")
    [before, after, early].each(&:size)
  ensure
    thread&.kill&.join
  end

  def test_close_stretch_refuses_bad_input
    error = assert_raises(RuntimeError) { Heapscope::Testing.close_stretch(1.0) }
    assert_equal "heapscope is not running", error.message
    Heapscope.start(sample_every: 1, sampling: :always)
    [0, -1.0].each do |bad|
      error = assert_raises(ArgumentError) { Heapscope::Testing.close_stretch(bad) }
      assert_equal "scale must be positive", error.message
    end
  end

  # Windowed, on a Ruby whose ticker opens windows many times a second (3.3+), a run closes stretches,
  # each scale within the bounds, and the profile says so.
  def test_a_windowed_run_closes_stretches
    Heapscope.start(sample_every: 1000, sampling: :windowed)
    skip "Ruby #{RUBY_VERSION} changes windows at GCs only (no ticker): too few for a stretch" unless ticker_ruby?
    keep = []
    # Until a stretch closed (100 windows and half a second: about a second on an idle machine, a few on
    # a loaded one), at most 20 s.
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 20.0
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline && Heapscope.stats[:weight_stretches].zero?
      10_000.times { |i| keep << Object.new if (i % 50).zero? }
      keep.shift(keep.size - 50_000) if keep.size > 50_000
    end
    stats = Heapscope.stats
    assert_operator stats[:weight_stretches], :>=, 1, stats.inspect
    assert_operator stats[:stretch_scale_min], :>=, 0.5, stats.inspect
    assert_operator stats[:stretch_scale_max], :<=, 5.0, stats.inspect
    assert_operator stats[:stretch_scale_min], :<=, stats[:stretch_scale_max]
    line = heap_profile.comments.find { |c| c.start_with?("stretches=") }
    n = line[/\Astretches=(\d+) /, 1].to_i
    assert_operator n, :>=, stats[:weight_stretches], line
  end

  private

  def at(marker) = line_of(marker, File.expand_path(__FILE__))

  # The total of type over the samples of klass whose innermost frame in this file is at line. Not the
  # leaf: another test in this process may wrap Thread.new in Ruby (test_core_exact_threads.rb says why).
  def made(prof, type, line, klass:)
    file = File.expand_path(__FILE__)
    prof.samples.sum do |s|
      mine = s.labels["class"] == klass && s.frames.find { |f| f.file == file }
      mine && mine.line == line ? s.value(type) : 0
    end
  end

  def ticker_ruby?
    Gem::Version.new(RUBY_VERSION) >= Gem::Version.new("3.3")
  end
end
