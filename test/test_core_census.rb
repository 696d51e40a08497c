# frozen_string_literal: true

require_relative "core_helper"

# The census (ext/heapscope/census.c): every profile carries the live heap's exact totals per type and
# per class, and no sample stands for more than its class holds.
class TestCoreCensus < Minitest::Test
  include CoreHelper

  class Counted
    def initialize(n)
      @payload = "p" * n
    end
  end

  CLASS_LINE = /\Aheapscope census class: objects=(\d+) bytes=(\d+) sq_bytes=\S+ type=(\w+) name=(.*)\z/.freeze

  def census_classes(prof)
    prof.comments.filter_map { |c| CLASS_LINE.match(c) }.to_h { |m| [m[4], [Integer(m[1]), Integer(m[2]), m[3]]] }
  end

  # Exact per class: the census's count and bytes of a class equal ObjectSpace's in the same moment.
  def test_class_totals_equal_objectspace
    Heapscope.start(sample_every: 7, max_overhead: nil)
    keep = Array.new(1234) { |i| Counted.new(i % 300) }
    GC.start
    GC.disable # nothing dies between ObjectSpace's count and the census
    want = ObjectSpace.each_object(Counted).to_a
    prof = heap_profile
    GC.enable
    got = census_classes(prof).fetch(Counted.name)
    assert_equal want.size, got[0], "objects of #{Counted}"
    assert_equal want.sum { |o| ObjectSpace.memsize_of(o) }, got[1], "bytes of #{Counted}"
    assert_equal "T_OBJECT", got[2]
    strings = census_classes(prof).fetch("String")
    assert_operator strings[0], :>=, 1234, "the payload Strings are counted"
    summary = prof.comments.grep(/\Aheapscope census: /).first
    assert_match(/seconds=\d+\.\d{6} objects=\d+ bytes=\d+ classes=\d+ classes_listed=\d+ bounded_samples=\d+ sq_bytes=\d\.\d{6}e\+\d{2}\z/, summary)
    refute_nil keep
  end

  # Types add up: the type lines sum to the summary's totals, as do (with "other classes") class lines.
  def test_type_lines_sum_to_the_total
    Heapscope.start(sample_every: 100, max_overhead: nil)
    prof = heap_profile(gc: true)
    summary = prof.comments.grep(/\Aheapscope census: /).first
    objects = Integer(summary[/ objects=(\d+)/, 1])
    bytes = Integer(summary[/ bytes=(\d+)/, 1])
    types = prof.comments.grep(/\Aheapscope census type: /)
    assert_equal objects, types.sum { |l| Integer(l[/objects=(\d+)/, 1]) }
    assert_equal bytes, types.sum { |l| Integer(l[/bytes=(\d+)/, 1]) }
    assert_includes types.join("\n"), "name=T_STRING"
    listed = census_classes(prof)
    assert_operator listed.values.sum { |o, _, _| o }, :<=, objects
    # Every class that has a sample in the profile is listed, so readers can bound it.
    prof.samples.each { |s| assert listed.key?(s.labels["class"]), "class #{s.labels["class"]} of a sample is listed" }
  end

  # The phantom: one sampled Thread (memsize ~1 MiB: its VM stack) standing for sample_every
  # allocations read 1000 MiB beside a heap of a few. Its estimate is capped at Thread's exact total.
  # Threads are recorded whole by default (test_core_exact_threads.rb); sampled here, as any big object
  # still is, to check the bound.
  def test_a_sampled_thread_never_stands_for_more_than_all_threads
    Heapscope.start(sample_every: 1000, max_overhead: nil, sampling: :always, exact_threads: false)
    sampled = nil
    40_000.times do
      t = Thread.new { sleep }
      if Heapscope::Testing.tracked_objects.any? { |o| o.equal?(t) }
        sampled = t
        break
      end
      t.kill.join
    end
    skip "no Thread was sampled in 40,000 tries (chance about 4e-18 at 1 in 1000)" if sampled.nil?
    prof = heap_profile(gc: true)
    threads = census_classes(prof).fetch("Thread")
    thread_samples = prof.samples.select { |s| s.labels["class"] == "Thread" }
    refute_empty thread_samples
    estimate = thread_samples.sum { |s| s.value("inuse_space") }
    assert_operator estimate, :<=, threads[1], "Thread's sampled bytes never exceed all Threads' bytes"
    assert_operator thread_samples.sum { |s| s.value("inuse_objects") }, :<=, threads[0]
    assert_match(/bounded_samples=[1-9]/, prof.comments.grep(/\Aheapscope census: /).first)
    assert_operator ObjectSpace.memsize_of(sampled) * 1000, :>, threads[1], "without the bound it was a phantom"
  ensure
    sampled&.kill&.join
  end

  # A long class name is the samples' label in full, so its census line names the same class.
  def test_a_long_class_name_matches_its_samples
    name = "Long#{"x" * 900}"
    klass = self.class.const_set(name, Class.new)
    Heapscope.start(sample_every: 1, max_overhead: nil)
    keep = Array.new(5) { klass.new }
    prof = heap_profile
    label = prof.samples.map { |s| s.labels["class"] }.find { |c| c&.end_with?(name) }
    refute_nil label
    assert_equal 5, census_classes(prof).fetch(label)[0]
    refute_nil keep
  ensure
    self.class.send(:remove_const, name) if self.class.const_defined?(name, false)
  end

  def test_census_false_leaves_it_out
    Heapscope.start(census: false)
    prof = heap_profile
    assert_empty prof.comments.grep(/census/)
    error = assert_raises(ArgumentError) { Heapscope.stop; Heapscope.start(census: "no") }
    assert_match(/census must be true or false, got "no"/, error.message)
  end

  # A class name is one comment line whatever it holds (3.3+ lets a class take any temporary name).
  def test_a_class_name_with_a_newline_stays_on_its_line
    klass = Class.new
    skip "this Ruby cannot give a class a temporary name" unless klass.respond_to?(:set_temporary_name)
    klass.set_temporary_name("odd\nheapscope census: objects=1 bytes=1")
    Heapscope.start(sample_every: 1, max_overhead: nil)
    keep = Array.new(3) { klass.new }
    prof = heap_profile
    assert_equal 1, prof.comments.grep(/\Aheapscope census: /).size
    assert census_classes(prof).key?("odd?heapscope census: objects=1 bytes=1"), census_classes(prof).keys.grep(/odd/).inspect
    refute_nil keep
  end
end
