# frozen_string_literal: true

require_relative "core_helper"
require "open3"
require "tmpdir"

# The Ruby API's contract: options, errors, profile types, files, and go tool pprof reading it all.
class TestCoreAPI < Minitest::Test
  include CoreHelper

  Leak = Struct.new(:payload)

  def test_bad_start_options_name_the_option_and_value
    cases = {
      { bogus: 1 } => /unknown option :bogus/,
      { sample_every: 0 } => /sample_every must be an Integer from 1 to \d+, got 0/,
      { sample_every: 1.5 } => /sample_every must be an Integer from 1 to \d+, got 1.5/,
      { sample_every: "10" } => /sample_every must be an Integer from 1 to \d+, got "10"/,
      { max_frames: 0 } => /max_frames must be an Integer from 1 to 3000, got 0/,
      { max_frames: 3001 } => /max_frames must be an Integer from 1 to 3000, got 3001/,
      { min_age: -1 } => /min_age must be an Integer from 0 to \d+, got -1/,
      { track_sizes: "yes" } => /track_sizes must be true or false, got "yes"/,
      { max_tracked_objects: 0 } => /max_tracked_objects must be an Integer from 1/,
    }
    cases.each do |options, message|
      error = assert_raises(ArgumentError, options.inspect) { Heapscope.start(**options) }
      assert_match message, error.message
      refute Heapscope.running?, "a bad option must not start the profiler"
    end
  end

  def test_state_errors_say_what_to_do
    error = assert_raises(Heapscope::Error) { Heapscope.profile }
    assert_match(/not running: call Heapscope.start/, error.message)
    assert_raises(Heapscope::Error) { Heapscope.write(File.join(Dir.tmpdir, "never.pb.gz")) }
    Heapscope.start
    error = assert_raises(Heapscope::Error) { Heapscope.start }
    assert_match(/already running \(call Heapscope.stop first/, error.message)
    assert Heapscope.running?, "the failed second start leaves the first run alone"
  end

  def test_bad_profile_options
    Heapscope.start
    assert_match(/type must be one of :heap, :allocs, got :cpu/, assert_raises(ArgumentError) { Heapscope.profile(type: :cpu) }.message)
    assert_match(/gc must be true or false, got 1/, assert_raises(ArgumentError) { Heapscope.profile(gc: 1) }.message)
    assert_match(/min_age must be an Integer from 0/, assert_raises(ArgumentError) { Heapscope.profile(min_age: -2) }.message)
    assert_match(/unknown option :seconds/, assert_raises(ArgumentError) { Heapscope.profile(seconds: 1) }.message)
  end

  def test_profile_vocabulary_heap_and_allocs
    Heapscope.start(sample_every: 1, max_overhead: nil)
    keep = [Leak.new("x")]
    heap = heap_profile(gc: true)
    assert_equal [%w[alloc_objects count], %w[alloc_space bytes], %w[inuse_objects count], %w[inuse_space bytes]], heap.sample_types
    assert_nil heap.default_sample_type, "viewers default to inuse_space (the last type)"
    assert_in_delta Time.now.to_f, heap.time_nanos / 1e9, 10, "time_nanos is when the profile was taken"
    assert_operator heap.duration_nanos, :>, 0, "duration_nanos is the time since start"
    assert_equal "", heap.string_table[0]
    allocs = decode(Heapscope.profile(type: :allocs))
    assert_equal "alloc_space", allocs.default_sample_type
    assert_equal (1..allocs.locations.size).to_a, allocs.locations.map(&:id)
    assert_equal (1..allocs.functions.size).to_a, allocs.functions.map(&:id)
    refute_nil keep
  end

  def test_allocs_count_allocations_since_start_until_reset
    Heapscope.start(sample_every: 1, max_overhead: nil)
    in_finished_thread { 300.times { Leak.new(nil) } } # COUNTED
    line = line_of("# COUNTED", __FILE__)
    prof = decode(Heapscope.profile(type: :allocs))
    assert_equal 300, sum_at(prof, "alloc_objects", line, klass: "TestCoreAPI::Leak")
    assert_equal 300 * ObjectSpace.memsize_of(Leak.new(nil)), sum_at(prof, "alloc_space", line, klass: "TestCoreAPI::Leak")
    Heapscope.reset
    prof = decode(Heapscope.profile(type: :allocs))
    assert_equal 0, sum_at(prof, "alloc_objects", line, klass: "TestCoreAPI::Leak")
  end

  def test_write_is_atomic_and_go_tool_pprof_reads_it
    Heapscope.start(sample_every: 1, max_overhead: nil)
    keep = Array.new(77) { Leak.new("y" * 100) } # WRITTEN
    Dir.mktmpdir do |dir|
      path = File.join(dir, "heap.pb.gz")
      assert_equal path, Heapscope.write(path, gc: true)
      assert_equal [path], Dir[File.join(dir, "*")], "no temp file is left behind"
      prof = Heapscope::Pprof.read(path)
      line = line_of("# WRITTEN", __FILE__)
      assert_equal 77, sum_at(prof, "inuse_objects", line, klass: "TestCoreAPI::Leak")

      raw, status = Open3.capture2e("go", "tool", "pprof", "-raw", path)
      assert status.success?, raw
      assert_match(/^PeriodType: allocations count$/, raw)
      assert_match(/alloc_objects\/count alloc_space\/bytes inuse_objects\/count inuse_space\/bytes/, raw)
      # The sample for our line, as go tool pprof prints it: values, then its labels.
      assert_match(/^\s+0\s+0\s+77\s+\d+: [\d ]+\n\s+class:\[TestCoreAPI::Leak\]\n\s+gc_age:\[1 gcs\]/, raw)
      assert_match(/#{Regexp.escape(__FILE__)}:#{line}/, raw)

      top, status = Open3.capture2e("go", "tool", "pprof", "-top", "-sample_index=inuse_objects", "-lines", path)
      assert status.success?, top
      first_row = top.lines.find { |l| l =~ /^\s+\d+\s+[\d.]+%/ }
      assert_includes first_row, "#{File.basename(__FILE__)}:#{line}", "the 77 objects' line leads go tool pprof's top:\n#{top}"
    end
    refute_nil keep
  end

  def test_write_to_a_missing_directory_raises_and_leaves_nothing
    Heapscope.start
    Dir.mktmpdir do |dir|
      path = File.join(dir, "missing", "heap.pb.gz")
      assert_raises(Errno::ENOENT) { Heapscope.write(path) }
      assert_empty Dir[File.join(dir, "**", "*")]
    end
  end

  def test_stats_report_the_recorder
    Heapscope.start(sample_every: 1, max_overhead: nil)
    keep = Array.new(1000) { Object.new }
    stats = Heapscope.stats
    %i[running sample_every samples_taken tracked_objects stacks frames strings dead_removed frozen
       skipped_internal dropped record_bytes recorder_bytes].each { |key| assert stats.key?(key), key.to_s }
    assert_equal true, stats[:running]
    assert_operator stats[:samples_taken], :>=, 1000
    assert_operator stats[:tracked_objects], :>=, 1000
    assert_operator stats[:record_bytes], :<=, 48
    assert_operator stats[:recorder_bytes], :>, stats[:tracked_objects] * stats[:record_bytes]
    refute_nil keep
  end

  def test_bad_sampling_and_window_share_name_the_option_and_value
    cases = {
      { sampling: :bogus } => /sampling must be one of :windowed, :always \(or nil for the default\), got :bogus/,
      { sampling: "windowed" } => /sampling must be one of :windowed, :always .*, got "windowed"/,
      { window_share: 0 } => /window_share must be a number above 0 and at most 1 \(the fraction of time the allocation hook is on\) or :budget, got 0/,
      { window_share: nil } => /window_share must be a number above 0 and at most 1 .* or :budget, got nil/,
      { window_share: :auto } => /window_share must be a number above 0 and at most 1 .* or :budget, got :auto/,
      { window_share: 1.5 } => /window_share must be a number above 0 and at most 1 .*, got 1.5/,
      { window_share: "0.1" } => /window_share must be a number above 0 and at most 1 .*, got "0.1"/,
      { window_share: -0.5 } => /window_share must be a number above 0 and at most 1 .*, got -0.5/,
    }
    cases.each do |options, message|
      error = assert_raises(ArgumentError, options.inspect) { Heapscope.start(**options) }
      assert_match message, error.message
      refute Heapscope.running?, "a bad option must not start the profiler"
    end
    unless Heapscope::Native::WINDOWED_SUPPORTED
      error = assert_raises(ArgumentError) { Heapscope.start(sampling: :windowed) }
      assert_match(/sampling: :windowed is not supported on Ruby/, error.message)
    end
  end

  # Exact means exact (issue 17, item 4): a sample_every the caller chose is never lowered by the
  # budget unless max_overhead is given too; the default rate keeps the default budget.
  def test_an_explicit_sample_every_turns_the_budget_off_unless_max_overhead_is_given
    assert_equal :budget, Heapscope::START_DEFAULTS[:window_share]
    {
      {} => 0.01,
      { sample_every: 1 } => nil,
      { sample_every: 1000 } => nil, # even the default value, when the caller says it
      { sample_every: 1, max_overhead: 0.05 } => 0.05,
      { sample_every: 1, max_overhead: nil } => nil,
      { max_overhead: 0.2 } => 0.2,
    }.each do |options, budget|
      Heapscope.start(**options)
      [Heapscope.config[:max_overhead], Heapscope.stats[:max_overhead]].each do |seen|
        budget.nil? ? assert_nil(seen, options.inspect) : assert_equal(budget, seen, options.inspect)
      end
      Heapscope.stop
    end
  end

  # sample_every: 1 records every allocation, however much it costs: no budget lowers it.
  def test_sample_every_one_counts_every_allocation_exactly
    Heapscope.start(sample_every: 1)
    assert_equal :always, Heapscope.config[:sampling]
    keep = nil
    line = __LINE__ + 1
    in_finished_thread { keep = Array.new(50_000) { Leak.new(nil) } }
    GC.start
    prof = heap_profile
    assert_equal 50_000, sum_at(prof, "alloc_objects", line, klass: "TestCoreAPI::Leak")
    assert_equal 50_000, sum_at(prof, "inuse_objects", line, klass: "TestCoreAPI::Leak")
    assert_equal 1, Heapscope.stats[:current_sample_every]
    assert_equal 1, Heapscope.stats[:max_sample_every], "no budget: the rate was never lowered"
    refute Heapscope.stats[:rate_lowered]
    line_text = prof.comments.find { |c| c.start_with?("sampling=") }
    assert_match(/\bmax_sample_every=1 rate_lowered=false\b.*\bvariance=labels\z/, line_text)
    refute_nil keep
  end

  def test_sampling_mode_defaults_and_what_stats_and_profiles_report
    Heapscope.start(sample_every: 1)
    assert_equal :always, Heapscope.config[:sampling], "sample_every: 1 samples always"
    stats = Heapscope.stats
    assert_equal [:always, nil, 1.0], stats.values_at(:sampling, :window_share, :hook_on_share)
    Heapscope.stop

    Heapscope.start(sampling: :always, window_share: 1)
    assert_equal :always, Heapscope.stats[:sampling]
    Heapscope.stop

    Heapscope.start
    # Windowed is the default where windows can change at interrupt checks (Ruby 3.3+: the ticker).
    expected = Heapscope::Native::WINDOWED_SUPPORTED && Heapscope::Native::WINDOWED_TICKER ? :windowed : :always
    assert_equal expected, Heapscope.config[:sampling]
    keep = Array.new(200_000) { Object.new }
    GC.start
    stats = Heapscope.stats
    %i[sampling window_share hook_on_share realized_share weight_scale allocations hook_allocations windows_opened
       sync_jobs window_sample_every window_seen_share gc_registrations_deferred skipped_own].each { |key| assert stats.key?(key), key.to_s }
    assert_equal expected, stats[:sampling]
    assert_instance_of Float, stats[:hook_on_share]
    # (Ruby 3.1 changes windows at GCs only: two GCs may have opened none.)
    assert_operator stats[:hook_on_share], :>=, 0
    assert_operator stats[:hook_on_share], :<=, 1
    assert_kind_of Integer, stats[:allocations]
    assert_operator stats[:allocations], :>=, 200_000
    %i[hook_allocations windows_opened sync_jobs window_sample_every gc_registrations_deferred skipped_own].each do |key|
      assert_kind_of Integer, stats[key], key.to_s
      assert_operator stats[key], :>=, 0, key.to_s
    end
    assert_operator stats[:hook_allocations], :<=, stats[:allocations]
    assert_operator stats[:window_sample_every], :>=, 1
    if expected == :windowed
      # The budget sets the share (from 0.04, within its bounds) where a ticker runs.
      assert_equal true, stats[:window_share_auto]
      assert_operator stats[:window_share], :>=, 0.005
      assert_operator stats[:window_share], :<=, 0.5
      # The ticker (Ruby 3.3+) opens windows many times a second; Ruby 3.1's change at GCs only.
      assert_operator stats[:windows_opened], :>=, 1, "the ticker opens windows" if stats[:ticker_wakeups].positive?
      assert_operator stats[:hook_allocations], :<, stats[:allocations], "the hook is off between windows"
    end
    comments = decode(Heapscope.profile).comments
    line = comments.find { |c| c.start_with?("sampling=") }
    assert line, comments.inspect
    assert_match(/\Asampling=#{expected} share=[\d.]+ realized_share=[\d.]+ weight_scale=[\d.]+ weight_scale_wanted=[\d.]+ sample_every=\d+ current_sample_every=\d+ max_sample_every=\d+ rate_lowered=(true|false) windows=\d+ hook_on_share=[\d.]+ allocations=\d+ skipped_own=\d+ variance=#{expected == :windowed ? "groups" : "labels"}\z/, line)
    # Windowed: the variance groups' allocations (docs/configuration.md), 16 whole numbers.
    auto = comments.find { |c| c.start_with?("share_auto=") }
    assert_match(/\Ashare_auto=#{expected == :windowed} current_share=[\d.e-]+ min_share=[\d.e-]+ share_changes=\d+ share_changes_waited=\d+ hook_cost_full_share=[\d.]+ fpc_share=[\d.e-]+\z/, auto)
    stretches = comments.find { |c| c.start_with?("stretches=") }
    assert_match(/\Astretches=\d+ stretch_scale_min=[\d.]+ stretch_scale_max=[\d.]+ open_stretch_scale=[\d.]+\z/, stretches)
    design = comments.find { |c| c.start_with?("variance_groups=") }
    if expected == :windowed
      assert_match(/\Avariance_groups=16 group_allocations=\d+(,\d+){15}\z/, design)
    else
      assert_nil design
    end
    refute_nil keep
  end
end
