# frozen_string_literal: true

require_relative "core_helper"

class TestCoreRecorder < Minitest::Test
  include CoreHelper

  Point = Struct.new(:x, :y)
  class Widget; end

  def make_points(keep)
    123.times { |i| keep << Point.new(i, i) } # POINTS
  end

  def make_temporaries
    1000.times { |i| Point.new(i, -i) } # TEMPORARIES
  end

  def test_live_objects_counted_exactly_and_temporaries_absent
    Heapscope.start(sample_every: 1, max_overhead: nil)
    keep = []
    make_points(keep)
    in_finished_thread { make_temporaries }
    prof = heap_profile(gc: true)

    points_line = line_of("# POINTS", __FILE__)
    temps_line = line_of("# TEMPORARIES", __FILE__)
    assert_equal 123, sum_at(prof, "inuse_objects", points_line)
    assert_equal keep.sum { |o| ObjectSpace.memsize_of(o) }, sum_at(prof, "inuse_space", points_line)
    assert_equal 0, sum_at(prof, "inuse_objects", temps_line), "temporaries must be gone after a GC"
    # ...but they were allocated: the allocation counters still know them.
    assert_equal 1000, sum_at(prof, "alloc_objects", temps_line)
    assert_equal ["Point"], samples_at(prof, points_line).map { |s| s.labels["class"].split("::").last }.uniq
    assert_operator Heapscope.stats[:dead_removed], :>=, 1000
    assert_equal 0, Heapscope.stats[:invalid_records]
  end

  def alloc_via_helper(keep)
    keep << Widget.new # HELPER
  end

  def test_two_call_sites_give_two_stacks_that_differ_only_in_the_call_site
    Heapscope.start(sample_every: 1, max_overhead: nil)
    keep = []
    alloc_via_helper(keep) # SITE A
    alloc_via_helper(keep) # SITE B
    prof = heap_profile(gc: true)
    samples = samples_at(prof, line_of("# HELPER", __FILE__)).select { |s| s.value("inuse_objects") > 0 }
    assert_equal 2, samples.size
    stacks = samples.map { |s| s.frames.map { |f| [f.function, f.file, f.line] } }
    assert_equal stacks[0].size, stacks[1].size
    differing = stacks[0].zip(stacks[1]).each_index.reject { |i| stacks[0][i] == stacks[1][i] }
    assert_equal 1, differing.size, "only the call-site frame may differ"
    lines = stacks.map { |s| s[differing.first][2] }.sort
    assert_equal [line_of("# SITE A", __FILE__), line_of("# SITE B", __FILE__)], lines
  end

  def test_many_objects_at_one_site_share_one_stack
    Heapscope.start(sample_every: 1, max_overhead: nil)
    before = Heapscope.stats[:stacks]
    keep = []
    10_000.times { keep << Object.new }
    after = Heapscope.stats[:stacks]
    assert_operator after - before, :<=, 3, "10,000 allocations at one site must not create a stack each"
    assert_operator Heapscope.stats[:tracked_objects], :>=, 10_000
  end

  def test_stack_is_freed_when_its_last_object_dies
    Heapscope.start(sample_every: 1, max_overhead: nil)
    in_finished_thread { 50.times { |i| Array.new(i) } } # a site whose objects all die
    Heapscope.reset # the allocation counters no longer hold the stack either
    GC.start
    stacks_before = Heapscope.stats[:stacks]
    in_finished_thread { 100.times { |i| [i, i] } }
    GC.start
    Heapscope.reset
    GC.start
    assert_operator Heapscope.stats[:stacks], :<=, stacks_before + 1
  end

  def test_class_labels
    Heapscope.start(sample_every: 1, max_overhead: nil)
    anonymous = Class.new(Widget)
    keep = [
      "a string".dup,            # CLASS String
      [1, 2, 3],                 # CLASS Array
      { a: 1 },                  # CLASS Hash
      Widget.new,                # CLASS Widget
      anonymous.new,             # CLASS anon
    ]
    prof = heap_profile(gc: true)
    expected = {
      "String" => "String", "Array" => "Array", "Hash" => "Hash",
      "Widget" => "TestCoreRecorder::Widget", "anon" => "<anonymous subclass of TestCoreRecorder::Widget>",
    }
    expected.each do |marker, klass|
      labels = samples_at(prof, line_of("# CLASS #{marker}", __FILE__)).map { |s| s.labels["class"] }
      assert_includes labels, klass, "class label for #{marker}"
    end
    refute_nil keep
  end

  def test_gc_age_grows_and_min_age_filters
    Heapscope.start(sample_every: 1, max_overhead: nil)
    keep = [Widget.new] # AGED
    allocated_at = GC.count
    line = line_of("# AGED", __FILE__)
    widget = "TestCoreRecorder::Widget"
    young = heap_profile
    # (Building a profile allocates and may start a GC: only a profile that saw none can leave it out.)
    if GC.count == allocated_at
      assert_equal 0, sum_at(young, "inuse_objects", line, klass: widget), "default min_age 1 leaves out objects that survived no GC"
    end
    before = GC.count - allocated_at
    with_zero = heap_profile(min_age: 0)
    after = GC.count - allocated_at
    assert_equal 1, sum_at(with_zero, "inuse_objects", line, klass: widget)
    ages = samples_at(with_zero, line, klass: widget).select { |s| s.value("inuse_objects") > 0 }.map { |s| s.labels["gc_age"] }
    assert_equal 1, ages.size, ages.inspect
    assert_includes Heapscope::Testing.age_bucket(before)..Heapscope::Testing.age_bucket(after), ages.first

    # Building a profile allocates, and may start a GC of its own: the age it reports is the one at its
    # start or, if a GC ran inside, up to the one at its end (loading open3 first, as other test files
    # do, made one run inside the first profile here).
    ages = [1, 3, 9].map do |survived|
      GC.start while GC.count - allocated_at < survived
      before = GC.count - allocated_at
      reported = heap_age(line)
      after = GC.count - allocated_at
      [reported, Heapscope::Testing.age_bucket(before), Heapscope::Testing.age_bucket(after)]
    end
    ages.each { |reported, low, high| assert_includes low..high, reported }
    assert_equal ages.map(&:first).sort, ages.map(&:first)
    assert_operator ages.last.first, :>=, 8, "after 9 GCs the object is in the 8+ bucket"
    # Buckets are powers of two: 9 GCs survived is reported in the bucket starting at 8.
    assert_equal [0, 1, 2, 2, 4, 4, 8, 8, 16], [0, 1, 2, 3, 4, 7, 8, 15, 16].map { |a| Heapscope::Testing.age_bucket(a) }
    refute_nil keep
  end

  def heap_age(line)
    samples_at(heap_profile, line, klass: "TestCoreRecorder::Widget").select { |s| s.value("inuse_objects") > 0 }.map { |s| s.labels["gc_age"] }.max || -1
  end

  def test_sizes_are_remeasured_and_frozen_objects_measured_once
    Heapscope.start(sample_every: 1, max_overhead: nil)
    growing = +"x" # GROWING
    frozen = ("y" * 500).freeze # FROZEN
    grow_line = line_of("# GROWING", __FILE__)
    frozen_line = line_of("# FROZEN", __FILE__)
    first = heap_profile(gc: true)
    small = sum_at(first, "inuse_space", grow_line)
    growing << ("z" * 100_000)
    second = heap_profile(gc: true)
    assert_equal ObjectSpace.memsize_of(growing), sum_at(second, "inuse_space", grow_line)
    assert_operator sum_at(second, "inuse_space", grow_line), :>, small + 90_000
    assert_operator sum_at(second, "alloc_space", grow_line), :<, small + 1000, "alloc_space keeps the size at allocation"
    assert_equal ObjectSpace.memsize_of(frozen), sum_at(second, "inuse_space", frozen_line)
    assert_operator Heapscope.stats[:frozen], :>=, 1
  end

  def test_track_sizes_false_reports_slot_sizes
    Heapscope.start(sample_every: 1, max_overhead: nil, track_sizes: false)
    keep = Array.new(10) { "q" * 10_000 } # SLOTS
    prof = heap_profile(gc: true)
    line = line_of("# SLOTS", __FILE__)
    assert_equal 10, sum_at(prof, "inuse_objects", line, klass: "String")
    assert_equal 10 * Heapscope::SLOT_SIZE, sum_at(prof, "inuse_space", line, klass: "String")
    refute_nil keep
  end

  def test_c_functions_carry_the_calling_ruby_line
    Heapscope.start(sample_every: 1, max_overhead: nil)
    keep = "ab" * 3000 # C FRAME
    prof = heap_profile(gc: true)
    line = line_of("# C FRAME", __FILE__)
    leafs = samples_at(prof, line).select { |s| s.value("inuse_objects") > 0 }.map { |s| s.frames.first.function }
    assert_includes leafs, "String#*"
    refute_nil keep
  end

  def deep(n, keep)
    return keep << Object.new if n.zero? # DEEP LEAF

    deep(n - 1, keep)
  end

  def test_deep_stacks_end_with_an_omitted_frame
    Heapscope.start(sample_every: 1, max_overhead: nil, max_frames: 20)
    keep = []
    deep(100, keep)
    prof = heap_profile(gc: true)
    sample = samples_at(prof, line_of("# DEEP LEAF", __FILE__)).find { |s| s.value("inuse_objects") > 0 }
    refute_nil sample
    assert_equal 21, sample.frames.size
    assert_match(/\A\d+ frames omitted\z/, sample.frames.last.function)
    omitted = sample.frames.last.function.to_i
    # The real depth: this test's own frames (caller_locations ignores C frames, rb_profile_frames
    # does not, so count both the same way: the frames below the deep recursion are the same).
    depth_here = caller_locations(0).size
    assert_operator omitted, :>=, 101 + depth_here - 20 - 10
    assert_operator omitted, :<=, 101 + depth_here * 2
    assert_operator Heapscope.stats[:frames_truncated], :>=, 1
  end

  def test_tracked_objects_cap_counts_what_it_drops
    Heapscope.start(sample_every: 1, max_overhead: nil, max_tracked_objects: 100)
    keep = Array.new(1000) { Object.new }
    stats = Heapscope.stats
    assert_equal 100, stats[:tracked_objects]
    assert_operator stats[:dropped_tracked_cap], :>=, 900
    prof = heap_profile
    assert(prof.comments.any? { |c| c =~ /dropped_tracked_cap=(\d+)/ && $1.to_i >= 900 }, prof.comments.inspect)
    refute_nil keep
  end
end
