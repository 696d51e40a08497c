# frozen_string_literal: true

require_relative "stats"

module Accuracy
  # The checks of a case's profiles against their census, the exact count of the live heap every profile
  # carries (Report::Census; issue 31's acceptance), for the inuse types in one mode's runs:
  #
  #   exact       a synthetic site's class row says exactly what is alive of the class (its objects and
  #               bytes equal the case's own count); mismatches must be 0
  #   unsampled   the class row's "not seen at any site" ±2σ holds the true unattributed amount (0 when
  #               the site is in the profile, the site's whole truth when it is not); pooled 90-98% (as
  #               far as the pairs can tell: the binomial test stats.rb applies to one site's runs)
  #   combined    a site in the profile is covered by its own ±2σ, a site missing from it only if its
  #               class's (or, without a class row, its type's) unseen amount could hold it (truth <=
  #               not seen + 2σ); pooled over every (site, run) with a truth, 90-98%
  #   above       no site reads (as top shows it) above its class's exact total or its types' together
  #               (a library line that makes Strings and Arrays: both types' totals); must be 0
  #   exact_max   a site recorded whole (Threads, Fibers) never reads above 2x its truth
  #
  # Pairs where both the estimate and its error are exact (a site recorded whole, error 0, equal to its
  # truth) are counted apart ("exact pairs"): an interval of width 0 that holds the truth says nothing
  # about error bars, and 100% of them would lift the pooled coverage past 98% for no reason.
  class CensusChecks
    INUSE = %w[inuse_objects inuse_space].freeze
    EXACT_MAX = 2.0

    attr_reader :mismatches, :unlisted, :unsampled, :combined, :above, :exact_pairs, :exact_max, :runs, :seconds

    # runs: one mode's run results; truth_of: ->(run, key) { {type => value} }; keys: the case's sites;
    # info_of: ->(run, key) { {"class", "type", "exact"} }.
    def initialize(runs, keys, truth_of:, info_of:)
      @runs = runs.count { |r| r["census"] }
      @mismatches = []
      @unlisted = 0
      @unsampled = [0, 0] # [covered, pairs]
      @combined = [0, 0]
      @above = []
      @exact_pairs = 0
      @exact_max = nil
      @seconds = runs.filter_map { |r| r.dig("census", "seconds") }
      runs.each do |r|
        next unless r["census"]

        keys.each { |key| check(r, key, truth_of.call(r, key), info_of.call(r, key) || {}) }
      end
    end

    def check(run, key, truth, info)
      klass = info["class"] && run.dig("census", "classes", info["class"])
      type = type_rows(run, Array(info["types"] || info["type"]))
      @unlisted += 1 if info["class"] && !klass && INUSE.any? { |t| truth[t].to_i.positive? }
      INUSE.each do |t|
        value = truth[t].to_i
        est, rel, shown = run.dig("estimates", key, t)
        present = !est.nil? && est.positive?
        cls = klass&.dig(t)
        typ = type&.dig(t)
        if cls && cls["exact"] != value
          @mismatches << "run #{run["run"]} #{key} #{t}: census #{cls["exact"]}, truth #{value}"
        end
        limit = [cls, typ].compact.map { |row| row["exact"] }.min
        @above << "run #{run["run"]} #{key} #{t}: #{shown} > #{limit}" if present && limit && shown && shown > limit
        next if value.zero?

        if info["exact"]
          ratio = (est || 0).fdiv(value)
          @exact_max = [@exact_max || 0, ratio].max
        end
        if present && rel&.zero? && est == value
          @exact_pairs += 1
          next
        end
        if cls
          unattributed = present ? 0 : value
          tally(@unsampled, (cls["not_seen"] - unattributed).abs <= 2 * cls["error"])
        end
        row = cls || typ
        covered = if present then Stats.covered?(est, rel, value)
                  elsif row then value <= row["not_seen"] + 2 * row["error"]
                  else false
                  end
        tally(@combined, covered)
      end
    end

    # The census rows of a site's types, summed when it has several (a parse makes Hashes, Arrays and
    # Strings): {inuse type => {"exact", "not_seen", "error"}}, errors added in quadrature; nil for none.
    def type_rows(run, names)
      rows = names.filter_map { |n| run.dig("census", "types", n) }
      return nil if rows.empty?

      INUSE.to_h do |t|
        parts = rows.filter_map { |r| r[t] }
        [t, { "exact" => parts.sum { |p| p["exact"] }, "not_seen" => parts.sum { |p| p["not_seen"] },
              "error" => Math.sqrt(parts.sum { |p| p["error"].to_f**2 }) }]
      end
    end

    def tally(pair, covered)
      pair[0] += 1 if covered
      pair[1] += 1
    end

    def share(pair)
      pair[1].zero? ? nil : pair[0].fdiv(pair[1])
    end

    def fails
      out = []
      out << "census exact (#{@mismatches.size})" if @mismatches.any?
      out << "above exact (#{@above.size})" if @above.any?
      [["unsampled", @unsampled], ["combined", @combined]].each do |name, (covered, pairs)|
        next if pairs.zero?

        # As one site's coverage is judged: failed only where the count is implausible for any coverage
        # in 90-98% (stats.rb); with hundreds of pairs that is 90-98% itself, give or take a point or two.
        pooled = { "runs" => pairs, "covered" => covered, "coverage" => covered.fdiv(pairs) }
        out << "#{name} cover #{(100 * pooled["coverage"]).round}% of #{pairs}" unless Stats.coverage_ok?(pooled, strict: false)
      end
      out << "exact site at #{@exact_max.round(2)}x" if @exact_max && @exact_max > EXACT_MAX
      out << "no census" if @runs.zero?
      out
    end

    def to_h
      { "runs" => @runs, "mismatches" => @mismatches.first(20), "mismatch_count" => @mismatches.size, "unlisted" => @unlisted,
        "unsampled_coverage" => share(@unsampled), "unsampled_pairs" => @unsampled[1],
        "combined_coverage" => share(@combined), "combined_pairs" => @combined[1], "exact_pairs" => @exact_pairs,
        "above" => @above.first(20), "above_count" => @above.size, "exact_max" => @exact_max,
        "census_ms" => @seconds.empty? ? nil : (1000 * Stats.mean(@seconds)).round(2), "fails" => fails }
    end
  end
end
