# frozen_string_literal: true

module Accuracy
  # The criteria (README.md): per site, mode and type, from the runs' [estimate, relative error, truth]:
  #   z         (mean - truth) / SE, SE the runs' own standard deviation over sqrt(runs); pass |z| <= 4
  #   spread    standard deviation of (estimate - truth) / truth over the runs (one profile's typical error)
  #   ratio     default spread / :always spread; pass <= 1.5
  #   coverage  share of runs whose printed ±2 sigma (2 x relative error x estimate) holds the truth;
  #             pass 90-98%: strictly for each case's pooled rows, and for one site as far as its runs can
  #             tell (binomial tails at both ends, ALPHA), or strictly with --strict-coverage
  module Stats
    Z_MAX = 4.0
    RATIO_MAX = 1.5
    COVERAGE = (0.90..0.98).freeze
    ALPHA = 0.001

    module_function

    def mean(xs)
      xs.sum.to_f / xs.size
    end

    def sd(xs)
      return 0.0 if xs.size < 2

      m = mean(xs)
      Math.sqrt(xs.sum { |x| (x - m)**2 } / (xs.size - 1))
    end

    def covered?(estimate, rel, truth)
      return estimate == truth if rel.nil?

      (estimate - truth).abs <= 2 * rel * estimate.abs
    end

    # One mode's numbers for one site and type; runs: [[estimate, relative error, truth], ...].
    def summarize(runs)
      truth = mean(runs.map(&:last))
      d = runs.map { |e, _, t| e - t }
      se = sd(d) / Math.sqrt(runs.size)
      md = mean(d)
      z = if se.positive? then md / se
          elsif md.zero? then 0.0
          end # nil: every run gave the same wrong estimate
      spread = truth.positive? ? sd(runs.map { |e, _, t| t.positive? ? (e - t) / t.to_f : 0.0 }) : nil
      covered = runs.count { |e, rel, t| covered?(e, rel, t) }
      { "runs" => runs.size, "truth" => truth, "mean" => mean(runs.map(&:first)), "se" => se, "z" => z,
        "spread" => spread, "covered" => covered, "coverage" => covered.fdiv(runs.size) }
    end

    def z_ok?(m)
      !m["z"].nil? && m["z"].abs <= Z_MAX
    end

    def ratio(default, always)
      return nil if default["spread"].nil? || always["spread"].nil?
      return (default["spread"].zero? ? 1.0 : nil) if always["spread"].zero?

      default["spread"] / always["spread"]
    end

    def ratio_ok?(ratio)
      !ratio.nil? && ratio <= RATIO_MAX
    end

    # A site's coverage: strictly in COVERAGE, or (lenient) not shown outside it by its runs' count.
    def coverage_ok?(m, strict:)
      return COVERAGE.cover?(m["coverage"]) if strict

      n = m["runs"]
      k = m["covered"]
      binomial_cdf(k, n, COVERAGE.begin) >= ALPHA && 1 - binomial_cdf(k - 1, n, COVERAGE.end) >= ALPHA
    end

    # P(X <= k) for X ~ Binomial(n, p).
    def binomial_cdf(k, n, p)
      return 0.0 if k.negative?
      return 1.0 if k >= n

      (0..k).sum { |i| choose(n, i) * p**i * (1 - p)**(n - i) }
    end

    def choose(n, k)
      (1..k).reduce(1r) { |acc, i| acc * (n - k + i) / i }.to_f
    end
  end
end
