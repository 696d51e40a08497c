# frozen_string_literal: true

require_relative "core_helper"

# The sampler's statistics, checked through the public API and through the sampler itself.
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
      Heapscope.start(sample_every: 2)
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
    Heapscope.start(sample_every: 100)
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
