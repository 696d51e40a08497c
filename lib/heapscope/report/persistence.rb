# frozen_string_literal: true

require "heapscope/report/sampling"
require "heapscope/report/sites"

module Heapscope
  module Report
    # Persistence: the error of a site's growth over snapshots of one run of heapscope, whose points
    # share their samples.
    #
    # A sampled object stays the same sample for as long as it lives: a leaking site's value at the
    # tenth snapshot holds the samples of the ninth, plus those born since. So the points' errors are
    # not independent: the luck of the early samples is in every later point and cancels out of the
    # slope. Judging the slope by the points' errors as if independent counts that luck again at every
    # point; a steady leak sampled at 1 in 1000 stayed "not enough evidence" over six snapshots that all
    # agreed.
    #
    # Windowed sampling gives each sample the variance group of its window (16 groups, by window number,
    # for the whole run), and every profile the windows' allocations per group since start (its design).
    # A point's estimate is a ratio estimator, so its error comes from its linearized parts per group,
    #   e_lg = Y_lg - R_l A_lg,  R_l = sum_g Y_lg / sum_g A_lg
    # (Report::Sampling). The groups are the same windows at every point, so the slope sum_l w_l y_l
    # (the least-squares weights w_l) has the parts sum_l w_l e_lg, and its random-groups variance is
    #   G / (G - 1) x (1 - share) x sum_g (sum_l w_l e_lg)^2,
    # widened by Student's t at the groups its parts really span, as a point's is. A sample alive at
    # every point adds w_l times its value to its group at each, and the w_l sum to 0: it cancels, as it
    # should. A sample born once and seen at the later points adds in proportion to their weights only.
    # The weight scale's drift from point to point (the run's realized share) is in the parts too, since
    # R_l follows each point's own design.
    #
    # Sampling always, every sample is drawn on its own and carries its Bernoulli variance (T_var).
    # The slope is also sum_i W_i d_i over the steps d_i = y[i+1] - y[i], W_i the sum of the weights of
    # the later points (all positive), and a step's variance is that of what was sampled in it plus
    # that of what its earlier point lost: the samples of point i+1 younger than gc_(i+1) - gc_i +
    # min_age GCs (their gc_age) were born in the step; point i's variance less that of the older
    # ones is what died. Two steps share only a sample born in one and lost in a later one, which adds
    # to one and takes from the other: a negative covariance, so sum_i W_i^2 var(d_i) is an upper
    # bound, tight for a leak (nothing lost). A gc_age bucket that straddles the threshold is split in
    # proportion to the ages it spans; whichever way that errs, it moves variance from what lived on
    # to what was born or lost, so the bound stays one. Sizes are measured at each snapshot: what a
    # surviving sample's growth adds is at least (sqrt(var_i) - sqrt(var_old))^2, which counts when
    # it is the larger.
    #
    # What tells that the points are of one run: every heapscope profile says "run_id=PID-START
    # gc_count=N" (one recorder, so one set of samples and one numbering of windows; N is rb_gc_count()
    # when its samples' ages were taken). Without it the points' errors are used as before.
    module Persistence
      RUN = /\Arun_id=(\d{1,19}-\d{1,20}) gc_count=(\d{1,10})\s*\z/.freeze
      MIN_AGE = /\bmin_age=(\d{1,10})(?!\d)/.freeze

      module_function

      # The run id of a heapscope profile that says it, else nil.
      def run_id(prof)
        prof.comments.each do |c|
          m = RUN.match(c) and return m[1]
        end
        nil
      end

      # True when every profile is of one run (and says so).
      def one_run?(profs)
        ids = profs.map { |p| run_id(p) }
        !ids.empty? && !ids.first.nil? && ids.uniq.size == 1
      end

      # Sets :slope_variance on every site of a series of one run (see the module comment) and returns
      # true; false (nothing set) otherwise. points: [{prof:, ti:}] in time order; times: their times;
      # sites: {key => {key:, errors:, parts: [the site's group parts at each point, or nil where
      # absent]}}.
      def fill(points, times, sites)
        return false unless one_run?(points.map { |p| p[:prof] })
        # Live values only: the allocation counters follow another design (since Heapscope.reset).
        return false unless points.all? { |p| p[:prof].sample_types[p[:ti]][0].start_with?("inuse_") }

        samplings = points.map { |p| Sampling.new(p[:prof]) }
        designs = samplings.map(&:live_design)
        return fill_always(points, times, sites, samplings) if designs.all?(&:nil?)
        return false if designs.any?(&:nil?) || designs.map { |d| d[:allocations].size }.uniq.size != 1

        w = slope_weights(times)
        fpc = samplings.last.fpc
        groups = designs.last[:groups]
        sites.each_value do |s|
          parts = s[:parts]
          next if parts.nil? || parts.compact.any? { |ys| ys.size != designs.first[:allocations].size }

          s[:slope_variance] = slope_variance(w, parts, designs, fpc, groups)
        end
        true
      end

      # fill for profiles sampled always (T_var labels, no groups): see the module comment.
      def fill_always(points, times, sites, samplings)
        return false if samplings.any? { |s| !s.variance? }

        facts = points.map { |p| gc_facts(p[:prof]) }
        return false unless gc_series?(facts)

        ages = points.each_with_index.map { |p, l| ages(p[:prof], p[:by], p[:ti], samplings[l]) }
        sites.each_value do |s|
          next if s[:errors].any?(&:nil?)

          s[:slope_variance] = steps_variance(times, s[:errors].map { |e| e * e }, ages.map { |a| a.fetch(s[:key], {}) }, facts)
        end
        true
      end

      # True when every point says its GC count and min_age, in an order that never goes back.
      def gc_series?(facts)
        facts.none?(&:nil?) && facts.each_cons(2).all? { |a, b| b[:gc] >= a[:gc] }
      end

      # The slope's variance, sampling always, as the sum over steps (see the module comment): times of
      # the points, var the site's variance at each, ages its {gc_age bucket => T_var} at each, facts
      # each point's {gc:, min_age:}.
      def steps_variance(times, var, ages, facts)
        weights = step_weights(slope_weights(times))
        weights.each_index.sum do |i|
          old = older_variance(ages[i + 1], facts[i + 1][:gc] - facts[i][:gc] + facts[i + 1][:min_age])
          born = [var[i + 1] - old, 0.0].max
          lost = [var[i] - old, (Math.sqrt(var[i]) - Math.sqrt([old, 0.0].max))**2].max
          weights[i]**2 * (born + lost)
        end
      end

      # W_i, the weight of the step from point i to i + 1 in a slope with point weights w: the sum of the
      # weights of the later points.
      def step_weights(w)
        acc = 0.0
        out = Array.new(w.size - 1)
        (w.size - 1).downto(1) do |k|
          acc += w[k]
          out[k - 1] = acc
        end
        out
      end

      # For a diff of two profiles of one run sampled always: a lambda (base site variance, new site
      # variance, site key) -> the change's variance (what was sampled or lost between them: the steps'
      # variance of the module comment, exact for one step), or nil when that does not apply. The later
      # profile (by GC count) says which samples were in both, whichever was given first.
      def always_change(base, newer, s_base, s_new, bi, ti, by)
        return nil unless s_base.variance? && s_new.variance? && !s_base.live_design && !s_new.live_design

        fa = gc_facts(base)
        fb = gc_facts(newer)
        return nil unless fa && fb

        later, f_early, f_late, s_late, t_late = fb[:gc] >= fa[:gc] ? [newer, fa, fb, s_new, ti] : [base, fb, fa, s_base, bi]
        ages = ages(later, by, t_late, s_late)
        threshold = f_late[:gc] - f_early[:gc] + f_late[:min_age]
        lambda do |var_base, var_new, key|
          var_early, var_late = later.equal?(newer) ? [var_base, var_new] : [var_new, var_base]
          old = older_variance(ages.fetch(key, {}), threshold)
          [var_late - old, 0.0].max + [var_early - old, (Math.sqrt(var_early) - Math.sqrt([old, 0.0].max))**2].max
        end
      end

      # {gc:, min_age:} of a profile that says them, else nil.
      def gc_facts(prof)
        gc = min_age = nil
        prof.comments.each do |c|
          m = RUN.match(c) and gc = m[2].to_i
          m = MIN_AGE.match(c) and min_age ||= m[1].to_i
        end
        gc && min_age ? { gc: gc, min_age: min_age } : nil
      end

      # {site key => {gc_age bucket => T_var}} of type ti in prof grouped by by (one aggregation).
      def ages(prof, by, ti, sampling)
        out = {}
        split = AgeColumns.new(prof, ti, sampling)
        return out unless split.any?

        Sites.aggregate(prof, by, cum: [], columns: split.columns).each { |key, e| out[key] = split.of(e.flat) }
        out
      end

      # AgeColumns splits each site's T_var by gc_age bucket inside an aggregation (Sites.aggregate's
      # columns:), a column per bucket that occurs (at most 64: buckets are powers of two), so a reader
      # that aggregates anyway gets them in the same pass.
      class AgeColumns
        def initialize(prof, ti, sampling)
          @buckets = []
          return if sampling.variance_columns(ti).empty?

          @buckets = prof.samples.map { |s| Persistence.bucket(s.labels["gc_age"]) }.uniq.compact.sort
          @index = @buckets.each_with_index.to_h
          @label = Sampling.variance_label(prof.sample_types[ti][0])
          @first = Sampling.variance_labels(prof).size + prof.sample_types.size
        end

        def any?
          !@buckets.empty?
        end

        # [width, fill] for Sites.aggregate, or nil when there is nothing to split.
        def columns
          return nil unless any?

          index = @index
          label = @label
          [@buckets.size, lambda do |sample, more|
            i = index[Persistence.bucket(sample.labels["gc_age"])]
            v = sample.labels[label]
            more[i] = v if i && v.is_a?(Integer)
          end]
        end

        # {bucket => T_var} of an aggregated value vector.
        def of(flat)
          out = {}
          @buckets.each_with_index do |b, i|
            v = flat[@first + i].to_f
            out[b] = v unless v.zero?
          end
          out
        end
      end

      # The power-of-two bucket of a gc_age label (heapscope's labels already are one), nil if none.
      def bucket(age)
        return nil unless age.is_a?(Integer)

        age.positive? ? 1 << (age.bit_length - 1) : 0
      end

      # The share of bucket b's ages (b, or b..2b-1 from 2 on) at or above threshold a.
      def share_at_least(b, a)
        return b >= a ? 1.0 : 0.0 if b < 2
        return 1.0 if a <= b
        return 0.0 if a > 2 * b - 1

        (2 * b - a).to_f / b
      end

      # The variance of a site's age parts at or above threshold a: its samples that were already alive.
      def older_variance(parts, a)
        parts.sum { |b, var| share_at_least(b, a) * var }
      end

      # The least-squares slope's weights (t_l - mean) / sxx.
      def slope_weights(t)
        tm = t.sum / t.size.to_f
        sxx = t.sum { |x| (x - tm)**2 }
        t.map { |x| sxx.positive? ? (x - tm) / sxx : 0.0 }
      end

      # The random-groups variance of sum_l w_l y_l (see the module comment).
      def slope_variance(w, parts, designs, fpc, groups)
        e = Array.new(designs.first[:allocations].size, 0.0)
        parts.each_with_index do |ys, l|
          next if ys.nil?

          a = designs[l][:allocations]
          r = ys.sum / designs[l][:total]
          ys.each_index { |g| e[g] += w[l] * (ys[g] - r * a[g]) }
        end
        squares = e.sum { |x| x * x }
        return 0.0 if squares.zero?

        size = e.sum(&:abs)
        spanned = size * size / squares
        return size * size if groups < 2 || spanned < 1.5

        df = [[groups, spanned].min.floor - 1, 1].max
        groups / (groups - 1.0) * fpc * squares * (Sampling.t_quantile(df) / 2.0)**2
      end
    end
  end
end
