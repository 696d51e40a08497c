# frozen_string_literal: true

require "heapscope/report/units"

module Heapscope
  module Report
    # Verdict turns a site's values and their sampling errors into a call a leak-hunter can act on, with
    # its confidence, and, where the evidence is thin, what would decide it.
    #
    # Over a series of snapshots (leaks, Verdict.trend):
    #   leak                 the least-squares slope is more than Z (2) standard errors above zero: a
    #                        steady rise that sampling noise makes in about 2% of flat sites (one-sided).
    #   churn                the values move beyond their errors (chi-square of the residuals about the
    #                        line above its 99% point) without such a trend: up and down, or one step
    #                        up and flat since ("grew once": a cache warmed, a config loaded).
    #   not enough evidence  no trend at Z, but a hint of one (above HINT standard errors), too few
    #                        samples per snapshot to see one (THIN), or too few snapshots (MIN_POINTS).
    #                        The advice says how many more snapshots at this rate and error would reach
    #                        Z, and which sample_every would reach it over the snapshots already taken.
    #   noise                the values stay within their errors and show no trend worth the name.
    #
    # The errors of the points. A sampled sum's variance is proportional to its expected value (each
    # sampled object adds its weight times its size; Report::Sampling computes each snapshot's from the
    # profile's own model). Taking each point's error from its *observed* value would give a point that
    # happened to come out low a small error, and one with no sample none at all, so that plain
    # sampling noise around a rising line looks like churn: the issue's two leaking lines with few
    # samples were called "fluctuating (churn?)" that way. So the site's variance per unit of value, rho
    # = sum(err_i²) / sum(y_i), is pooled over its snapshots, and each point's variance is rho times the
    # larger of its value and the line's there (at least rho: about one sample's worth). The larger, as
    # the line itself is pulled by the points: one high point tilts it down to near zero at the start,
    # where the line alone would give the first point almost no error. rho = 0 means exact counts
    # (sample_every 1): then the fit's own scatter is the only error.
    #
    # The slope's standard error is the points' errors propagated through the least-squares weights
    # (t_i - tm) / sxx, inflated by sqrt(chi²/dof) when the residuals exceed the errors (a churning
    # site's real scatter then widens its slope's error, as a fit with unknown errors would do).
    #
    # Between two snapshots (diff, Verdict.change): z = change / sqrt(err_base² + err_new²); beyond Z it
    # "grew" or "shrank" (two snapshots cannot tell a leak from churn: leaks over more can), within it
    # "noise", unless the change is above HINT errors or its error above THIN of the value, when it is
    # "not enough evidence" with the sample_every that would reach Z.
    module Verdict
      LEAK = "leak"
      CHURN = "churn"
      NOISE = "noise"
      UNCLEAR = "not enough evidence"
      Z = 2.0
      HINT = 1.0
      # A relative error per snapshot above this (about 11 samples or fewer) is too thin to call a site
      # noise: a growth of a third of its value a snapshot would hide in it.
      THIN = 0.3
      # Three points are the fewest with a residual to judge a line by; a step needs four to be told
      # from a line.
      MIN_POINTS = 3
      MAX_MORE = 1000
      # chi² at 99.9% for 2 degrees of freedom (the step's place and second level): how much better a
      # step must fit than the line to be called one (Verdict.step).
      STEP_GAIN = 13.8
      # The standard normal's 99% point, for the chi-square threshold (Wilson-Hilferty).
      Z99 = 2.326

      module_function

      # The verdict on a series: t the times (minutes, ascending), y the values, err each value's
      # standard error (nil where unknown), every the profiles' sample_every (nil when unknown).
      # Returns a Hash: verdict, shape, z (the slope over its error; nil when infinite: exact counts),
      # scatter (sqrt(chi²/dof) of the residuals; nil when not computable), rate and rate_error (per
      # minute), point_error (the error of one snapshot now), and, from #advise, more_snapshots,
      # sample_every and advice.
      #
      # slope_variance: the slope's variance when the points' errors are not independent (snapshots of
      # one run share their samples: Report::Persistence), used in place of the one propagated from err
      # (and not widened by the points' scatter, which their independence was what made a measure of).
      def trend(t, y, err, every: nil, unit: "count", slope_variance: nil)
        n = t.size
        tm = t.sum / n.to_f
        ym = y.sum.to_f / n
        sxx = t.sum { |x| (x - tm)**2 }
        rate = t.each_index.sum { |i| (t[i] - tm) * (y[i] - ym) } / sxx
        line = t.map { |x| ym + rate * (x - tm) }
        resid = y.each_index.map { |i| y[i] - line[i] }
        dof = n - 2
        rho = pooled_rho(y, err)
        sigmas = rho && line.each_index.map { |i| point_sigma(rho, [line[i], y[i]].max) }
        # Exact counts leave residuals of rounding only: below a billionth of the largest value is zero.
        tol = 1e-9 * y.map(&:abs).max.to_f
        chi2 = sigmas && dof.positive? ? chi_square(resid, sigmas, tol) : nil
        scatter = chi2 && dof.positive? ? Math.sqrt(chi2 / dof) : nil
        beyond = chi2 ? chi2 > chi2_99(dof) : false
        fit_err = dof.positive? ? Math.sqrt(resid.sum { |r| r * r } / dof / sxx) : nil
        rate_err =
          if slope_variance && rho&.positive?
            # Not widened by the scatter: the points of one run are not independent, so their scatter
            # about the line is no measure of the slope's error (a leak's growth that came in bursts
            # is still growth), and the slope's variance is the design's own (Persistence).
            Math.sqrt(slope_variance)
          elsif rho&.positive?
            slope_error(t, tm, sxx, sigmas) * [1.0, scatter || 1.0].max
          else
            fit_err # exact counts (or unknown errors): only the scatter about the line says anything
          end
        z = if rate_err.nil? then nil
            elsif rate_err.positive? then rate / rate_err
            else (rate.positive? ? Float::INFINITY : 0.0)
            end
        res = { rate: rate, rate_error: rate_err, z: z, scatter: scatter, beyond: beyond,
                point_error: sigmas&.last, shape: nil }
        res[:verdict] =
          if n < MIN_POINTS then UNCLEAR
          elsif beyond && n >= 4 && (res[:shape] = step(y, sigmas, chi2, tol)) then CHURN
          elsif z && z > Z then LEAK
          elsif beyond then (res[:shape] = "up and down"; CHURN)
          elsif z.nil? || rho.nil? || z > HINT || thin?(line.last, sigmas.last) then UNCLEAR
          else NOISE
          end
        res[:shape] ||= "steady" if res[:verdict] == LEAK
        advise(res, t, line, rho, every, unit, one_run: !slope_variance.nil?) if res[:verdict] == UNCLEAR
        res
      end

      # rho, the site's sampling variance per unit of value pooled over its snapshots (see the module
      # comment); nil when an error is unknown, 0 when every count is exact.
      def pooled_rho(y, err)
        return nil unless err.all?

        total = y.sum(&:abs).to_f
        total.positive? ? err.sum { |e| e * e } / total : 0.0
      end

      # The error of a point whose expected value is v: rho x v, at least one sample's worth (rho).
      def point_sigma(rho, v)
        Math.sqrt(rho * [v, rho].max)
      end

      def slope_error(t, tm, sxx, sigmas)
        Math.sqrt(t.each_index.sum { |i| ((t[i] - tm) / sxx * sigmas[i])**2 })
      end

      # sum (r_i / s_i)², a residual with no error (exact counts) infinite unless it is zero (within tol).
      def chi_square(resid, sigmas, tol = 0.0)
        resid.each_index.sum do |i|
          if sigmas[i].positive? then (resid[i] / sigmas[i])**2
          elsif resid[i].abs <= tol then 0.0
          else Float::INFINITY
          end
        end
      end

      # The 99% point of chi-square with k degrees of freedom (Wilson-Hilferty: within 1% from k = 2).
      def chi2_99(k)
        k * (1 - 2.0 / (9 * k) + Z99 * Math.sqrt(2.0 / (9 * k)))**3
      end

      # "grew once" when one step up (two levels, the best of the n - 1 places) fits within the errors
      # where the line did not, and much better than it: chi² lower by STEP_GAIN. Sampling noise around
      # a rising line often fits a step within the errors too (the step has a free place as well as two
      # levels); only a clear gain, which a flat-rise-flat shape gives, calls it a step. nil otherwise.
      def step(y, sigmas, line_chi2, tol)
        best = (1...y.size).filter_map do |k|
          left = y[0...k].sum.to_f / k
          right = y[k..].sum.to_f / (y.size - k)
          next unless right > left

          fit = y.each_index.map { |i| y[i] - (i < k ? left : right) }
          chi_square(fit, sigmas, tol)
        end.min
        best && best <= chi2_99(y.size - 2) && line_chi2 - best > STEP_GAIN ? "grew once" : nil
      end

      def thin?(value, sigma)
        value.positive? && sigma / value > THIN
      end

      # Adds more_snapshots (how many more at the mean interval would bring the slope to Z standard
      # errors, if it keeps its rate and the errors grow with the value as they have), sample_every
      # (the rate that would reach Z over these snapshots: errors scale as sqrt(sample_every)), and the
      # advice as a sentence.
      def advise(res, t, line, rho, every, unit, one_run: false)
        rate = res[:rate]
        parts = []
        if rho.nil?
          res[:advice] = "the profiles do not say how they were sampled, so no error is known"
          return res
        end
        n = t.size
        step_t = (t.last - t.first) / (n - 1)
        if rate.positive? && step_t.positive?
          inflate = [1.0, res[:scatter] || 1.0].max
          more = one_run ? more_snapshots_of_one_run(t.size, res[:z]) : more_snapshots(t, line, rate, rho, inflate, step_t)
          res[:more_snapshots] = more
          per = " (#{Units.signed(rate.round, unit)}/min) and #{Units.abs_error(res[:point_error], unit)} per snapshot"
          parts << if more
                     "at this rate of growth#{per}, about #{more} more snapshot#{more == 1 ? "" : "s"} " \
                       "(one every #{interval(step_t)}) would separate it from noise at 2σ"
                   else
                     "at this rate of growth#{per}, more than #{MAX_MORE} more snapshots would be needed: it is noise"
                   end
        end
        better = better_every(res[:z], every, res[:scatter])
        if better
          res[:sample_every] = better
          parts << "sample_every: #{better} would reach 2σ over these snapshots (error scales as sqrt(sample_every))"
        end
        res[:advice] = parts.empty? ? nil : parts.join("; or ")
        res
      end

      # The fewest extra snapshots (at interval step_t, values on the line, variance rho x value,
      # inflated as the fit's) for rate / its error > Z; nil beyond MAX_MORE. Doubling, then bisection:
      # the slope's error only falls as points are added.
      def more_snapshots(t, line, rate, rho, inflate, step_t)
        z_at = lambda do |m|
          tt = t + Array.new(m) { |j| t.last + (j + 1) * step_t }
          yy = line + Array.new(m) { |j| line.last + rate * (j + 1) * step_t }
          tm = tt.sum / tt.size
          sxx = tt.sum { |x| (x - tm)**2 }
          err = slope_error(tt, tm, sxx, yy.map { |v| point_sigma(rho, v) }) * inflate
          err.positive? ? rate / err : Float::INFINITY
        end
        need = [MIN_POINTS - t.size, 1].max
        return need if z_at.call(need) > Z

        hi = need * 2
        hi *= 2 while hi <= MAX_MORE && z_at.call(hi) <= Z
        return nil if hi > MAX_MORE && z_at.call(MAX_MORE) <= Z

        hi = [hi, MAX_MORE].min
        lo = hi / 2
        while hi - lo > 1
          mid = (lo + hi) / 2
          z_at.call(mid) > Z ? hi = mid : lo = mid
        end
        hi
      end

      # The same for snapshots of one run (the slope's variance from what changed between them,
      # Report::Persistence): what varies is what was sampled or lost between snapshots, whose variance
      # grows with the span, so the slope's error falls as 1 / sqrt(span) (a random walk's slope), not
      # as the independent points' 1 / span^1.5: z grows as sqrt(span). n snapshots at z need
      # (n - 1) x ((Z / z)^2 - 1) more at the same interval; nil beyond MAX_MORE or without a trend.
      def more_snapshots_of_one_run(n, z)
        return nil unless z&.positive? && z.finite?

        more = [((n - 1) * ((Z / z)**2 - 1)).ceil, 1].max
        more > MAX_MORE ? nil : more
      end

      # The sample_every at which z would pass Z with the same values: errors scale as sqrt(sample_every)
      # (exactly so for 1-in-N sampling with N large; the (1 - p) factor makes it a slight underestimate
      # of the gain). nil when sampling is not what limits it (no rate, every object already counted,
      # scatter beyond the errors) or when even every object would not do.
      def better_every(z, every, scatter)
        return nil if every.nil? || every <= 1 || z.nil? || !z.positive? || (scatter && scatter > 1.5)

        wanted = (every * (z / Z)**2).floor
        return nil if wanted < 1 || wanted >= every

        round_down(wanted)
      end

      # Two significant digits, rounded down (the advice errs towards more samples).
      def round_down(v)
        return v if v < 100

        scale = 10**(Math.log10(v).floor - 1)
        (v / scale) * scale
      end

      def interval(minutes)
        minutes < 1 ? format("%.0f s", minutes * 60) : format("%.1f min", minutes)
      end

      # The verdict on a change between two snapshots (see the module comment): change = new - base, err
      # its standard error (nil when unknown), base and new the values, every NEW's sample_every.
      def change(change, err, base, new, every: nil)
        return { verdict: nil, z: nil } if err.nil?

        z = if err.positive? then change / err
            elsif change.zero? then 0.0
            else (change.positive? ? Float::INFINITY : -Float::INFINITY)
            end
        res = { z: z }
        size = [base.abs, new.abs].max
        res[:verdict] =
          if z.abs > Z then change.positive? ? "grew" : "shrank"
          elsif z.abs > HINT || (size.positive? && err / size > THIN) then UNCLEAR
          else NOISE
          end
        return res unless res[:verdict] == UNCLEAR

        better = better_every(z.abs, every, nil)
        if better
          res[:sample_every] = better
          res[:advice] = "sample_every: #{better} would make a change this size 2σ (error scales as sqrt(sample_every))"
        elsif every && every > 1
          # z already near 2 (or 0): no rate follows from it; halving the error is the next step.
          res[:advice] = "sample_every: #{[every / 4, 1].max} would cut its error about in half" \
                         "#{z.abs < HINT ? "; a change this small may be none" : ""}"
        end
        res
      end

      # A z for display and JSON: one decimal, cut towards zero so that 1.96 (short of Z) never shows
      # as the 2.0 of a verdict past it; nil (exact counts, no error at all) stays nil.
      def sigmas(z)
        z&.finite? ? z.truncate(1) : nil
      end

      # "8.1σ", or "exact" when the counts have no sampling error.
      def sigma_text(z)
        return "?" if z.nil?

        z.finite? ? format("%.1fσ", z.truncate(1)) : "exact"
      end
    end
  end
end
