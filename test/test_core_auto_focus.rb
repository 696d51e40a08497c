# frozen_string_literal: true

require_relative "core_helper"

# Automatic focus (lib/heapscope/auto_focus.rb): classes whose exact live bytes (the census of each
# profile) kept growing get a denser rate, and lose it when they stop. The detector is fed census lines
# directly where a test needs exact numbers, and real profiles end to end.
class TestCoreAutoFocus < Minitest::Test
  include CoreHelper

  class Leaky
    def initialize(payload)
      @payload = payload
    end
  end

  class Steady; end

  def census(sizes)
    sizes.map { |name, bytes| "heapscope census class: objects=10 bytes=#{bytes} sq_bytes=1.0e+06 type=T_OBJECT name=#{name}\n" }.join
  end

  def detector(taken: [])
    Heapscope.start(sample_every: 1000, sampling: :always)
    first = Heapscope::Native._focus_stats.size - Heapscope::AutoFocus::SLOTS
    assert_operator first, :>=, 0, "Heapscope.start keeps the automatic strata"
    [Heapscope::AutoFocus.new(first_index: first, rate: 100, taken: taken, resolve: Heapscope::Focus.method(:lookup)), first]
  end

  def test_a_class_that_grew_at_every_interval_is_focused_and_let_go_when_it_stops
    af, first = detector
    leaky, steady = Leaky.name, Steady.name
    mib = 1024 * 1024
    [1, 2, 3].each_with_index do |m, t|
      assert_empty af.observe(census(leaky => m * mib, steady => 5 * mib), t * 1.0), "3 observations are not enough"
    end
    changes = af.observe(census(leaky => 4 * mib, steady => 5 * mib), 3.0)
    assert_equal [["focus", leaky, 3, 3 * mib]], changes.map { |c| c.values_at(:action, :class, :rises, :growth) }
    assert_equal [[leaky, first]], af.active
    assert_equal [100, 100], Heapscope::Native._focus_stats[first].first(2)
    assert_match(/\Aheapscope auto_focus: at=\S+ action=focus rate=100 growth=#{3 * mib} rises=3 class=#{Regexp.escape(leaky)}\n\z/, af.comments)
    # Flat for three intervals: let go.
    assert_empty af.observe(census(leaky => 4 * mib, steady => 5 * mib), 4.0), "one flat interval is not a stop"
    assert_empty af.observe(census(leaky => 4 * mib, steady => 5 * mib), 5.0), "two flat intervals are not a stop"
    changes = af.observe(census(leaky => 4 * mib, steady => 5 * mib), 6.0)
    assert_equal [["release", leaky]], changes.map { |c| c.values_at(:action, :class) }
    assert_empty af.active
  end

  def test_fluctuation_small_growth_and_operator_classes_are_left_alone
    af, = detector(taken: [Steady.name])
    mib = 1024 * 1024
    series = {
      Leaky.name => [10, 12, 11, 13].map { |m| m * mib },           # up and down: not every interval rose
      "String" => [100 * mib, 100 * mib + 1000, 100 * mib + 2000, 100 * mib + 3000], # rose, but by 3 KB of 100 MiB
      Steady.name => [1, 2, 3, 4].map { |m| m * mib },              # grows, but the operator focuses it
    }
    4.times do |t|
      assert_empty af.observe(census(series.transform_values { |v| v[t] }), t * 1.0)
    end
    assert_empty af.active
  end

  def test_observations_closer_than_the_interval_count_once
    af, = detector
    mib = 1024 * 1024
    [0.0, 0.1, 0.2, 0.3].each_with_index { |t, i| af.observe(census(Leaky.name => (i + 1) * mib), t) }
    assert_empty af.active, "four profiles within 0.3 s are one observation"
  end

  # End to end: a leaking class, a profile a round; after four rounds of growth its samples weigh the
  # denser rate, profiles and stats say so, and its estimate stays within 5 standard errors.
  def test_profiles_focus_a_growing_class_on_their_own
    Heapscope.start(sample_every: 1000, sampling: :always)
    keep = []
    rounds = 7
    rounds.times do |round|
      5000.times { keep << Leaky.new(nil) } # LEAKY
      heap_profile(gc: true)
      sleep Heapscope::AutoFocus::MIN_INTERVAL if round < rounds - 1
    end
    stats = Heapscope.stats[:auto_focus]
    active = stats[:active].map { |a| a[:class] }
    assert_includes active, Leaky.name, stats.inspect
    assert_operator stats[:active].find { |a| a[:class] == Leaky.name }[:samples], :>, 0
    prof = heap_profile(gc: true)
    assert(prof.comments.any? { |c| c.match?(/\Aheapscope focus: rate=100 current_rate=\d+ samples=\d+ state=auto class=#{Regexp.escape(Leaky.name)}\z/) })
    assert(prof.comments.any? { |c| c.start_with?("heapscope auto_focus: ") && c.end_with?("class=#{Leaky.name}") })
    # Samples drawn before focus weigh 1000, after it 100: the sum is unbiased either way.
    n = rounds * 5000
    estimate = sum_at(prof, "inuse_objects", line_of("# LEAKY", __FILE__), klass: Leaky.name)
    assert_in_delta n, estimate, 5 * Math.sqrt(n * 999.0)
    refute_nil keep
  end

  def test_auto_focus_false_keeps_no_strata_and_no_census_means_none
    Heapscope.start(sample_every: 1000, sampling: :always, auto_focus: false)
    assert_equal [], Heapscope::Native._focus_stats
    assert_nil Heapscope.stats[:auto_focus]
    Heapscope.stop
    Heapscope.start(sample_every: 1000, sampling: :always, census: false)
    assert_equal [], Heapscope::Native._focus_stats
    Heapscope.stop
    Heapscope.start(sample_every: 1000, sampling: :always)
    assert_equal({ active: [], changes: [] }, Heapscope.stats[:auto_focus])
    error = assert_raises(ArgumentError) { Heapscope.start(auto_focus: "yes") }
    assert_match(/auto_focus/, error.message)
  end

  def test_the_environment_variable
    config, errors = Heapscope::EnvConfig.parse("HEAPSCOPE_AUTO_FOCUS" => "0")
    assert_empty errors
    assert_equal false, config[:start][:auto_focus]
  end
end
