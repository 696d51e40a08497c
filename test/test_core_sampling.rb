# frozen_string_literal: true

require_relative "core_helper"

# The sampler's statistics in always mode (every allocation seen), checked through the public API and through
# the sampler itself. Windowed sampling: test_core_windowed.rb and test_windowed_accuracy.rb.
class TestCoreSampling < Minitest::Test
  include CoreHelper

  def alternate(keep, pairs)
    pairs.times do
      keep << Object.new # SITE A
      keep << Object.new # SITE B
    end
  end

  # Allocations alternate between two sites. With 1-in-2 sampling a fixed counter would see only one
  # of them; random geometric skips see each with probability 1/2, so each estimate (2 x samples) has
  # standard deviation sqrt(n) around the true n.
  def test_alternating_sites_are_estimated_without_bias
    n = 5000
    line_a = line_of("# SITE A", __FILE__)
    line_b = line_of("# SITE B", __FILE__)
    sd = Math.sqrt(n)
    runs = 8
    totals = { a: 0, b: 0 }
    runs.times do
      Heapscope.start(sample_every: 2, sampling: :always)
      keep = []
      alternate(keep, n)
      prof = heap_profile(gc: true)
      a = sum_at(prof, "inuse_objects", line_a, klass: "Object")
      b = sum_at(prof, "inuse_objects", line_b, klass: "Object")
      assert_in_delta n, a, 4 * sd, "site A estimate"
      assert_in_delta n, b, 4 * sd, "site B estimate"
      assert_equal 0, a % 2, "every sample weighs sample_every"
      totals[:a] += a
      totals[:b] += b
      Heapscope.stop
    end
    # Over all runs the mean is even tighter: sd of the mean is sqrt(n / runs).
    assert_in_delta n, totals[:a] / runs.to_f, 4 * Math.sqrt(n.to_f / runs)
    assert_in_delta n, totals[:b] / runs.to_f, 4 * Math.sqrt(n.to_f / runs)
  end

  def test_sample_every_one_samples_every_allocation_with_weight_one
    assert_equal [1] * 100, Heapscope::Testing.sampler_countdowns(1, 100, 42)
  end

  def test_countdowns_are_geometric_with_mean_sample_every
    [10, 1000].each do |every|
      draws = Heapscope::Testing.sampler_countdowns(every, 40_000, 1234)
      mean = draws.sum / draws.size.to_f
      # Geometric(p) on {1, 2, ...}: mean 1/p, variance (1-p)/p^2.
      sd_of_mean = Math.sqrt((1 - 1.0 / every) * every**2) / Math.sqrt(draws.size)
      assert_in_delta every, mean, 4 * sd_of_mean, "mean countdown for sample_every #{every}"
      assert_operator draws.min, :>=, 1
      # Memorylessness: P(X > k) = (1-p)^k. Check k = sample_every (~ e^-1).
      tail = draws.count { |d| d > every } / draws.size.to_f
      expected = (1 - 1.0 / every)**every
      assert_in_delta expected, tail, 4 * Math.sqrt(expected * (1 - expected) / draws.size)
    end
  end

  def test_different_seeds_give_different_sequences
    refute_equal Heapscope::Testing.sampler_countdowns(100, 50, 1), Heapscope::Testing.sampler_countdowns(100, 50, 2)
    assert_equal Heapscope::Testing.sampler_countdowns(100, 50, 7), Heapscope::Testing.sampler_countdowns(100, 50, 7)
  end

  def test_estimates_scale_by_sample_every
    Heapscope.start(sample_every: 100, sampling: :always)
    keep = Array.new(200_000) { Object.new } # MANY
    prof = heap_profile(gc: true)
    estimate = sum_at(prof, "inuse_objects", line_of("# MANY", __FILE__), klass: "Object")
    # Binomial(200000, 1/100) samples, each weighing 100: sd = 100 * sqrt(200000 * 0.01 * 0.99).
    assert_in_delta 200_000, estimate, 4 * 100 * Math.sqrt(200_000 * 0.01 * 0.99)
    assert_equal 0, estimate % 100
    assert(prof.comments.any? { |c| c.include?("sample_every=100") })
    assert_equal 100, prof.period
    refute_nil keep
  end
end

class TestCoreBudget < Minitest::Test
  include CoreHelper

  def keep_objects(keep, n)
    n.times { keep << Object.new } # BUDGETED
  end

  def test_budget_lowers_the_rate_under_load_and_estimates_stay_unbiased
    Heapscope.start(sample_every: 1, max_overhead: 0.001)
    keep = []
    n = 400_000
    keep_objects(keep, n)
    stats = Heapscope.stats
    assert_operator stats[:current_sample_every], :>, 1, "sampling every allocation costs far more than 0.1%"
    assert_operator stats[:rate_adjustments], :>=, 1
    prof = heap_profile(gc: true)
    estimate = sum_at(prof, "inuse_objects", line_of("# BUDGETED", __FILE__), klass: "Object")
    # Each allocation was sampled with the probability in force then and weighs its inverse, so the sum
    # is unbiased; its sd is at most sqrt(n * highest sample_every used).
    highest = [stats[:current_sample_every], 1024].min
    assert_in_delta n, estimate, 4 * Math.sqrt(n * highest) + 1
    assert(prof.comments.any? { |c| c.include?("max_overhead=0.001") }, prof.comments.inspect)
  end

  def test_budget_raises_the_rate_again_when_load_drops
    Heapscope.start(sample_every: 1, max_overhead: 0.001)
    keep = []
    # Load until the budget has lowered the rate (a window is 100 ms; give it at most 5 s).
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 5
    while Heapscope.stats[:current_sample_every] == 1 && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      keep_objects(keep, 50_000)
    end
    # The load's objects go, so that no GC in a quiet period walks their records (sampling work too).
    keep.clear
    GC.start
    lowered = Heapscope.stats[:current_sample_every]
    assert_operator lowered, :>, 1
    # Quiet periods: a few allocations per 120 ms window cost far less than the budget, so the rate
    # doubles back. Not in every window, though: the first quiet window may still hold the load's work,
    # and a sample preempted on a busy machine can cost more than the 100 us a 100 ms window allows (a
    # clean-clone CI run, with the load's records kept, once saw the rate end at 32 after 12 fixed
    # periods). So up to 40 periods, until the rate is above where the load left it.
    periods = 0
    until Heapscope.stats[:current_sample_every] < lowered || (periods += 1) > 40
      sleep 0.12
      keep_objects(keep, 2 * Heapscope.stats[:current_sample_every])
    end
    stats = Heapscope.stats
    assert_operator stats[:current_sample_every], :<, lowered,
                    "after #{periods} quiet periods: #{stats.slice(:current_sample_every, :rate_adjustments, :sampling_overhead, :gc_runs_seen)}"
  end

  def test_without_a_budget_the_rate_never_moves
    Heapscope.start(sample_every: 1, max_overhead: nil)
    keep = []
    keep_objects(keep, 200_000)
    assert_equal 1, Heapscope.stats[:current_sample_every]
    assert_nil Heapscope.stats[:max_overhead]
  end

  def test_bad_max_overhead
    [0, -0.1, 1.5, "0.01", Float::NAN].each do |bad|
      error = assert_raises(ArgumentError) { Heapscope.start(max_overhead: bad) }
      assert_match(/max_overhead must be a number above 0 and at most 1/, error.message)
    end
  end
end
