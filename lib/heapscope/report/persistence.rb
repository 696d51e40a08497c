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
    # Both are for sites whose samples live on from one snapshot to the next (LIVES_ON of the
    # earlier point's value is still there at the next, by the ages): a leak, a cache. A site whose
    # samples come and go (a bounded cache whose entries are replaced between snapshots, request
    # garbage) shares little, so its points' own errors are right for it, and exact sampling always;
    # the groups' estimate of a change then rests on the few windows its samples came from, and read
    # too narrow (a replaced cache was called a leak in 3 of 28 runs of examples/memo_cache.rb on 3.4).
    #
    # What tells that the points are of one run: every heapscope profile says "run_id=PID-START
    # gc_count=N" (one recorder, so one set of samples and one numbering of windows; N is rb_gc_count()
    # when its samples' ages were taken). Without it the points' errors are used as before.
    module Persistence
      RUN = /\Arun_id=(\d{1,19}-\d{1,20}) gc_count=(\d{1,10})\s*\z/.freeze
      MIN_AGE = /\bmin_age=(\d{1,10})(?!\d)/.freeze
      # The share of the earlier points' value that must still be there at the next ones: a leak keeps
      # all of it (0.9 and more, measured: ages are in power-of-two buckets); a cache whose entries live
      # two snapshots keeps half, and its change rests on few windows (at 0.5 such a cache was called a
      # leak at 4.3σ in one of 10 runs of examples/memo_cache.rb on Ruby 3.4).
      LIVES_ON = 0.8

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

      # Sets :slope_variance on every site of a series of one run whose samples live on (see the module
      # comment) and returns true; false (nothing set) when the series is not of one run. points:
      # [{prof:, ti:, by:}] in time order; times: their times; sites: {key => {key:, values:, errors:,
      # parts: [the site's group parts at each point, or nil where absent]}}.
      def fill(points, times, sites)
        return false unless one_run?(points.map { |p| p[:prof] })
        # Live values only: the allocation counters follow another design (since Heapscope.reset).
        return false unless points.all? { |p| p[:prof].sample_types[p[:ti]][0].start_with?("inuse_") }

        samplings = points.map { |p| Sampling.new(p[:prof]) }
        facts = points.map { |p| gc_facts(p[:prof]) }
        return false unless gc_series?(facts)

        designs = samplings.map(&:live_design)
        windowed = designs.none?(&:nil?) && designs.map { |d| d[:allocations].size }.uniq.size == 1
        return false unless windowed || (designs.all?(&:nil?) && samplings.all?(&:variance?))

        ages = points.each_with_index.map { |p, l| point_ages(p, samplings[l]) }
        fpc = samplings.last.fpc
        sites.each_value do |s|
          next if s[:errors].any?(&:nil?)

          s[:slope_variance] = series_variance(times, s[:values], s[:errors], ages.map { |a| a.fetch(s[:key], {}) }, facts,
                                               parts: s[:parts], designs: windowed ? designs : nil, fpc: fpc)
        end
        true
      end

      # The slope's variance of one site over a series of one run (fill, and `heapscope ui`'s summaries),
      # or nil when its samples do not live on: times, its values, errors and ages ({gc_age bucket =>
      # [value, T_var]}) at each point, each point's facts ({gc:, min_age:}); windowed, its parts at each
      # point (nil where absent), the points' designs and the last one's fpc (designs nil: sampling
      # always).
      def series_variance(times, values, errors, ages, facts, parts: nil, designs: nil, fpc: 1.0)
        return nil unless lives_on?(values, ages, facts)
        return steps_variance(times, errors.map { |e| e * e }, ages, facts) unless designs

        slope_variance(slope_weights(times), parts, designs, fpc, designs.last[:groups])
      end

      # The samples' ages of a point ({prof:, ti:, by:}), computed once per point (leaks' age column
      # reads the newest point's too).
      def point_ages(point, sampling = Sampling.new(point[:prof]))
        point[:ages] ||= ages(point[:prof], point[:by], point[:ti], sampling)
      end

      # True when at least LIVES_ON of the site's value at each point but the last was still there at
      # the next, over the series: values its values, ages its {gc_age bucket => [value, T_var]} at each
      # point, facts each point's {gc:, min_age:}.
      def lives_on?(values, ages, facts)
        before = lived = 0.0
        (1...values.size).each do |l|
          old = older(ages[l], threshold(facts[l - 1], facts[l]), 0)
          lived += [old, values[l - 1]].min
          before += values[l - 1]
        end
        before.positive? && lived >= LIVES_ON * before
      end

      # The gc_age a sample of the later snapshot has at least when it was already in the earlier one:
      # the GCs between them and the later one's min_age.
      def threshold(early, late)
        late[:gc] - early[:gc] + late[:min_age]
      end

      # The variance of one step, sampling always: what the later snapshot holds beyond the samples of
      # the earlier one (born), and what the earlier one's samples lost (died, or changed size: at least
      # (sqrt(var_early) - sqrt(old))^2); old is the later snapshot's variance of the samples in both.
      def step_variance(var_early, var_late, old)
        [var_late - old, 0.0].max + [var_early - old, (Math.sqrt(var_early) - Math.sqrt([old, 0.0].max))**2].max
      end

      # True when every point says its GC count and min_age, in an order that never goes back.
      def gc_series?(facts)
        facts.none?(&:nil?) && facts.each_cons(2).all? { |a, b| b[:gc] >= a[:gc] }
      end

      # The slope's variance, sampling always, as the sum over steps (see the module comment): times of
      # the points, var the site's variance at each, ages its {gc_age bucket => [value, T_var]} at each, facts
      # each point's {gc:, min_age:}.
      def steps_variance(times, var, ages, facts)
        weights = step_weights(slope_weights(times))
        weights.each_index.sum do |i|
          weights[i]**2 * step_variance(var[i], var[i + 1], older(ages[i + 1], threshold(facts[i], facts[i + 1]), 1))
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

      # For a diff of two profiles of one run: a Pair that says, per site, whether its samples lived on
      # from the earlier profile to the later (by GC count, whichever was given first), and, sampling
      # always, the change's variance; nil without the GC counts.
      def pair(base, newer, s_base, s_new, bi, ti, by)
        fa = gc_facts(base)
        fb = gc_facts(newer)
        return nil unless fa && fb

        later_is_new = fb[:gc] >= fa[:gc]
        later, s_late, t_late = later_is_new ? [newer, s_new, ti] : [base, s_base, bi]
        Pair.new(ages(later, by, t_late, s_late), later_is_new ? threshold(fa, fb) : threshold(fb, fa), later_is_new)
      end

      # See pair. ages: the later profile's {key => {bucket => [value, T_var]}}.
      Pair = Struct.new(:ages, :threshold, :later_is_new) do
        # True when at least LIVES_ON of the earlier profile's value of site key is in the later one.
        def lives_on?(key, v_base, v_new)
          early = later_is_new ? v_base : v_new
          early.positive? && Persistence.older(ages.fetch(key, {}), threshold, 0) >= LIVES_ON * early
        end

        # The change's variance sampling always (the steps' variance of the module comment, exact for
        # one step), from the two sides' variances.
        def always_variance(key, var_base, var_new)
          var_early, var_late = later_is_new ? [var_base, var_new] : [var_new, var_base]
          Persistence.step_variance(var_early, var_late, Persistence.older(ages.fetch(key, {}), threshold, 1))
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

      # {site key => {gc_age bucket => [value, T_var]}} of type ti in prof grouped by by (one
      # aggregation; T_var 0 without variance labels).
      def ages(prof, by, ti, sampling)
        out = {}
        split = AgeColumns.new(prof, ti, sampling)
        return out unless split.any?

        Sites.aggregate(prof, by, cum: [], columns: split.columns).each { |key, e| out[key] = split.of(e.flat) }
        out
      end

      # AgeColumns splits each site's value and T_var by gc_age bucket inside an aggregation
      # (Sites.aggregate's columns:), two columns per bucket that occurs (at most 64 buckets: they are
      # powers of two), so a reader that aggregates anyway gets them in the same pass.
      class AgeColumns
        def initialize(prof, ti, sampling)
          @buckets = prof.samples.map { |s| Persistence.bucket(s.labels["gc_age"]) }.uniq.compact.sort
          @index = @buckets.each_with_index.to_h
          @ti = ti
          @label = sampling.variance_columns(ti).empty? ? nil : Sampling.variance_label(prof.sample_types[ti][0])
          @first = (Sampling.variance_labels(prof)&.size || 0) + prof.sample_types.size
        end

        def any?
          !@buckets.empty?
        end

        # [width, fill] for Sites.aggregate, or nil when there is nothing to split.
        def columns
          return nil unless any?

          index = @index
          label = @label
          ti = @ti
          n = @buckets.size
          [2 * n, lambda do |sample, more|
            i = index[Persistence.bucket(sample.labels["gc_age"])] or next
            more[i] = sample.values[ti]
            v = label && sample.labels[label]
            more[n + i] = v if v.is_a?(Integer)
          end]
        end

        # {bucket => [value, T_var]} of an aggregated value vector.
        def of(flat)
          out = {}
          n = @buckets.size
          @buckets.each_with_index do |b, i|
            value = flat[@first + i] || 0
            var = flat[@first + n + i].to_f
            out[b] = [value, var] unless value.zero? && var.zero?
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

      # The value (k = 0) or T_var (k = 1) of a site's age parts ({bucket => [value, T_var]}) at or
      # above threshold a: of its samples that were already alive then.
      def older(parts, a, k)
        parts.sum { |b, pair| share_at_least(b, a) * pair[k] }
      end

      # The least-squares slope's weights (t_l - mean) / sxx.
      def slope_weights(t)
        tm = t.sum / t.size.to_f
        sxx = t.sum { |x| (x - tm)**2 }
        t.map { |x| sxx.positive? ? (x - tm) / sxx : 0.0 }
      end

      # The random-groups variance of sum_l w_l y_l (see the module comment), widened by Student's t at
      # the groups its parts span, as a point's is; spanning fewer than 1.5, its error is its own size
      # (+-100%), as for a point. (Counting the groups from the site's own parts alone, without the
      # R_l A_lg term that spreads the design's luck over every group, was tried: errors 1.3-2x wider
      # for sites of few windows, and no fewer false leaks on examples/memo_cache.rb.)
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
