# frozen_string_literal: true

require "set"

require "heapscope/report/units"

module Heapscope
  module Report
    # Sampling turns an estimate into its standard error, from what the profile says about how it was
    # sampled. Four cases, newest first:
    #
    #   heapscope with variance groups (windowed sampling; comment lines "variance=groups" and
    #     "variance_groups=16 group_allocations=A_0,...,A_15"): windows are clusters, put into 16 random
    #     groups, and every sample carries, per sample type T, numeric labels T_vg0..T_vg15: the part of
    #     its value that came from each group's windows (a missing label is 0). Group parts add when
    #     samples are summed, so any site (a line, a function, a flame graph node) has its own parts
    #     Y_g, and its variance is the random-groups estimate of the ratio estimator's
    #       var = G/(G-1) x (1 - share) x sum_g (Y_g - R A_g)^2,  R = (sum Y_g) / (sum A_g),
    #     G the groups with A_g > 0 (ext/heapscope/variance.h). Two samples of one window (two classes
    #     made by one line, two gc_age buckets) are correlated, and this keeps it: adding the samples'
    #     own variances (their T_var labels, also written) would not. A site seen in few windows has an
    #     uncertain variance, so its error is widened by Student's t at the groups it really spans (see
    #     group_variance): +-2 errors cover 95% of outcomes there as elsewhere.
    #   heapscope with variance labels ("variance=labels": sampling always): every sample carries, for
    #     each sample type T, a numeric label T_var, the Bernoulli variance of its value. Each sampled
    #     allocation is drawn on its own, so the variance of a site (any sum of samples) is the sum of
    #     their labels. Sites sums the labels as extra value columns (variance_labels), and
    #     absolute_error reads them.
    #   heapscope without them (older profiles): each object was sampled with probability p = 1 /
    #     sample_every and counts 1/p, so a site of k sampled objects has a relative standard error of
    #     sqrt((1 - p) / k), k = objects * p. Windowed sampling ("sampling=windowed ... windows_opened=N")
    #     took samples in runs, so that formula is a lower bound there, and describe says so.
    #   Go: an object of size s is sampled with p = 1 - exp(-s/R), R the profile's period (bytes), s the
    #     site's average object size; then as above.
    # With none of them the error is unknown (nil) and reports print "?".
    #
    # A profile whose overhead budget lowered the rate (current_sample_every above sample_every, or
    # rate_lowered=true) says so in describe, which every report header prints; without variance labels
    # its errors then assume the lowered rate, so they are never the 0 that sample_every: 1 would give.
    # A rate lowered and since restored (max_sample_every above sample_every) says that instead: "from 1
    # in 1000 to 1 in 1000" contradicted itself.
    class Sampling
      attr_reader :sample_every, :current_sample_every, :period, :windows, :share, :mode
      # Focused classes in force (lib/heapscope/focus.rb): class name => its rate in force (1 in N).
      attr_reader :focus_rates
      # The classes recorded whole, never sampled (the exact_threads start option): their sites are
      # exact, and so is what no site shows of them (a Set of names, empty when the profile does not say so).
      attr_reader :exact_classes

      EXACT_THREADS = /\Aexact_threads=true\b/.freeze
      # Their names as the census and the class labels give them. A subclass is recorded whole too, and
      # the census names every listed class recorded whole on a line of its own (EXACT_CLASS, written by
      # ext/heapscope/census.c); profiles from before those lines name only these two.
      EXACT_CLASS_NAMES = %w[Thread Fiber].freeze
      EXACT_CLASS_PREFIX = "heapscope exact class: "
      EXACT_CLASS = /\Aheapscope exact class: name=(.{1,8192})\z/.freeze
      MAX_EXACT_CLASSES = 10_000 # lines read; a profile with more is not one heapscope wrote

      SAMPLE_EVERY = /\bsample_every=(\d{1,19})(?!\d)/.freeze
      CURRENT_SAMPLE_EVERY = /\bcurrent_sample_every=(\d{1,19})(?!\d)/.freeze
      FPC_SHARE = /\bfpc_share=([\d.e+-]{1,24})(?![\w.])/.freeze
      # A focused class's line (lib/heapscope/focus.rb): its rate in force and its name.
      FOCUS = /\Aheapscope focus: rate=\d{1,19} current_rate=(\d{1,19}) samples=\d{1,19} state=(\w{1,10}) class=(\S{1,300})\z/.freeze
      WINDOWED = /\bsampling=windowed\b/.freeze
      WINDOWS_OPENED = /\bwindows_opened=(\d{1,19})(?!\d)/.freeze
      VARIANCE = /\bvariance=(?:labels|groups)\b/.freeze
      GROUPED = /\bvariance=groups\b/.freeze
      # "variance_groups=16 group_allocations=1200,1315,...": bounded, linear.
      GROUPS_LINE = /\bvariance_groups=(\d{1,2}) group_allocations=(\d{1,19}(?:,\d{1,19}){0,63})(?![\d,])/.freeze
      # The allocation counters' design: the windows since Heapscope.reset ("alloc_variance_groups=16
      # group_allocations=..."; \b keeps GROUPS_LINE from matching it, "_" being a word character).
      ALLOC_GROUPS_LINE = /\balloc_variance_groups=(\d{1,2}) group_allocations=(\d{1,19}(?:,\d{1,19}){0,63})(?![\d,])/.freeze
      GROUP_SUFFIX = "_vg"
      # Student's t at 97.725% (two-sided 95.45%, the coverage of +-2 standard errors) for 1-4 degrees
      # of freedom; from 5 on the Cornish-Fisher expansion is within 0.003 of it (t_quantile).
      T_SMALL = [nil, 13.968, 4.527, 3.307, 2.869].freeze
      # key=value pairs of the variance line; values are short words and numbers.
      PAIR = /\b([a-z_]{1,40})=([\w.]{1,40})/.freeze
      VARIANCE_SUFFIX = "_var"

      # {sample type name => index}, the first of a name winning as in Profile#sample_index: one Hash
      # instead of a linear search per lookup (a profile can declare a million types).
      def self.type_index(prof)
        name_index(prof.sample_type_names)
      end

      def self.name_index(names)
        index = {}
        names.each_with_index { |name, i| index[name] ||= i }
        index
      end

      # The variance labels of each sample type, in type order, when the profile carries them; else
      # nil: per type its T_var label and, with variance groups, its T_vg0..T_vg15 labels. Sites and
      # FlameTree sum these labels as extra columns after the values (variance_columns says where).
      def self.variance_labels(prof)
        return nil unless prof.comments.any? { |c| c.match?(VARIANCE) }

        label_names(prof.sample_type_names, groups_of(prof))
      end

      # The variance columns' label names for type names, with `groups` groups per type (0: none).
      def self.label_names(type_names, groups)
        type_names.flat_map { |name| [variance_label(name), *Array.new(groups) { |g| "#{name}#{GROUP_SUFFIX}#{g}" }] }
      end

      # The number of variance groups a profile's labels use (0 when it has none, or no valid design).
      def self.groups_of(prof)
        return 0 unless prof.comments.any? { |c| c.match?(GROUPED) }

        prof.comments.each do |c|
          m = c.match(GROUPS_LINE) or next
          return m[1].to_i if m[1].to_i.between?(2, 64) && m[2].count(",") + 1 == m[1].to_i
        end
        0
      end

      # The name of a sample type's variance label: inuse_space -> inuse_space_var.
      def self.variance_label(type_name)
        "#{type_name}#{VARIANCE_SUFFIX}"
      end

      # A sample's values followed by its variance labels (labels: from variance_labels).
      def self.with_variances(sample, labels)
        add_variances(sample.values.dup, sample, labels)
      end

      # Appends the sample's variance labels to values and returns it. A label that is missing, or not
      # a number (a hand-edited profile), counts as 0.
      def self.add_variances(values, sample, labels)
        found = sample.labels
        labels.each do |name|
          v = found[name]
          values << (v.is_a?(Integer) ? v : 0)
        end
        values
      end

      # type_names: the sample types the value vectors given to this object follow (default: the
      # profile's own; FlameTree passes the first profile's for a diff's base); groups: the variance
      # groups per type in those vectors' variance columns (default: the profile's own; FlameTree
      # passes the largest of its profiles').
      def initialize(prof, type_names: prof.sample_type_names, groups: Sampling.groups_of(prof))
        @sample_every = nil
        @current_sample_every = nil
        @windows = nil
        @rate_lowered = false
        @lowered_at_times = nil # the lowest rate (largest every) a restored rate had, or true where unknown
        @variance = false
        @mode = nil
        @share = nil
        @fpc_share = nil
        @focus = []
        @focus_rates = {}
        @exact_classes = Set.new.freeze
        exact_threads = false
        named_exact = []
        prof.comments.each do |c|
          if (m = c.match(FOCUS))
            @focus << "#{m[3]} 1 in #{m[1]}#{" (not defined yet)" if m[2] == "pending"}#{" (automatic: it grew)" if m[2] == "auto"}"
            @focus_rates[m[3]] = m[1].to_i if %w[active auto].include?(m[2]) && m[1].to_i.positive?
            next
          end
          if c.match?(EXACT_THREADS)
            exact_threads = true
          elsif c.start_with?(EXACT_CLASS_PREFIX) && named_exact.size < MAX_EXACT_CLASSES && (m = c.match(EXACT_CLASS))
            named_exact << m[1]
          end
          # Linear patterns only (a comment is the profile writer's text): "windowed ... windows_opened"
          # is two searches, not one `.*` that backtracks over the comment for every "windowed" in it;
          # numbers longer than 19 digits are not numbers a writer meant, and sample_every=0 gives no rate
          # (it made every error infinite, which JSON cannot hold).
          # The share the finite-population correction uses where it differs from share= (0: none, when
          # the budget moved the share during the run).
          m = c.match(FPC_SHARE)
          @fpc_share = Float(m[1], exception: false) if m
          m = c.match(SAMPLE_EVERY)
          @sample_every = m[1].to_i if m && m[1].to_i.positive?
          m = c.match(CURRENT_SAMPLE_EVERY)
          @current_sample_every = m[1].to_i if m && m[1].to_i.positive?
          if c.match?(VARIANCE)
            read_variance_line(c)
          elsif (at = c.index(WINDOWED))
            w = c.match(WINDOWS_OPENED, at) and @windows = w[1].to_i
            @mode ||= "windowed"
          end
        end
        @exact_classes = Set.new(EXACT_CLASS_NAMES + named_exact).freeze if exact_threads
        if @sample_every && @current_sample_every && @current_sample_every > @sample_every
          @rate_lowered = true
        end
        @period = prof.period if prof.period_type && prof.period_type[1] == "bytes" && prof.period.to_i.positive?
        @ntypes = type_names.size
        @stride = 1 + groups # variance columns per type: T_var, then the groups'
        read_designs(prof) if groups.positive?
        @alloc_types = type_names.each_index.select { |i| type_names[i].start_with?("alloc_") }.to_h { |i| [i, true] }
        @objects = {}
        @bytes = {}
        index = Sampling.name_index(type_names)
        type_names.each_with_index do |name, i|
          # Pair each type with its object count and byte size: inuse_space <-> inuse_objects.
          base = name.sub(/_(space|objects)\z/, "")
          @objects[i] = index["#{base}_objects"]
          @bytes[i] = index["#{base}_space"]
        end
      end

      # True when errors can be computed at all.
      def known?
        @variance || !(@sample_every.nil? && @period.nil?)
      end

      # True when the profile carries variance labels (errors are the sampler's own).
      def variance?
        @variance
      end

      # True when the overhead budget lowered the sampling rate below 1 in sample_every.
      def rate_lowered?
        @rate_lowered
      end

      # The columns of a value vector (Sites, FlameTree) holding the variance labels of type_index
      # (its T_var, then its groups), or [] without labels.
      def variance_columns(type_index)
        return [] unless @variance

        base = @ntypes + type_index * @stride
        (base...base + @stride).to_a
      end

      # A short description for report headers.
      def describe
        text =
          if @variance
            "sample_every=#{@sample_every || "?"}, #{mode_text}; errors from the sampler's variance"
          elsif @sample_every && @windows
            "sample_every=#{@sample_every}, windowed sampling (#{@windows} windows): errors are lower bounds"
          elsif @sample_every then "sample_every=#{@sample_every}"
          elsif @period then "Go sampling, one sample per #{Units.bytes(@period)} allocated"
          else "sampling rate unknown"
          end
        text = "#{text}; #{scale_bounded_text}" if @scale_bounded
        text = "#{text}; focus: #{@focus.first(8).join(", ")}#{" and #{@focus.size - 8} more" if @focus.size > 8}" if @focus.any?
        if @rate_lowered
          "#{text}; rate lowered by the overhead budget from 1 in #{@sample_every} to 1 in #{@current_sample_every || "?"}"
        elsif @lowered_at_times
          lowest = @lowered_at_times == true ? "" : " (to 1 in #{@lowered_at_times} at the lowest)"
          "#{text}; rate lowered by the overhead budget at times#{lowest}, back at 1 in #{@sample_every} now"
        else
          text
        end
      end

      # Estimated number of samples behind an estimate, given the values vector (all sample types) of a
      # site and the index of the type reported. With variance labels, the number of independent
      # samples that would give the same relative error on the object count ((objects / error)²; the
      # object count itself when it is exact). nil when unknown.
      def samples(values, type_index)
        oi = @objects[type_index]
        return nil if oi.nil?

        if (var = variance_of(values, oi))
          objects = values[oi].abs
          return var.zero? ? objects.to_f : objects.to_f**2 / var
        end
        p = probability(values, type_index)
        p && values[oi].abs * p
      end

      # Relative error (0.1 = ±10%) of the value values[type_index]; nil when unknown or nothing sampled.
      def relative_error(values, type_index)
        value = values[type_index]
        if (var = variance_of(values, type_index))
          return value.zero? ? nil : Math.sqrt(var) / value.abs
        end

        p = probability(values, type_index)
        return nil if p.nil?

        k = values[@objects[type_index]].abs * p
        return nil if k <= 0

        Math.sqrt((1 - p) / k)
      end

      # The probability that one object of this site was sampled, or nil when unknown (old formulas).
      def probability(values, type_index)
        oi = @objects[type_index]
        return nil if oi.nil?

        if (every = assumed_every)
          1.0 / every
        elsif @period
          bi = @bytes[type_index]
          objects = values[oi].abs.to_f
          return nil if bi.nil? || objects.zero?

          1 - Math.exp(-values[bi].abs / objects / @period)
        end
      end

      # Absolute standard error of values[type_index] (same unit as the value), nil when unknown.
      def absolute_error(values, type_index)
        if (var = variance_of(values, type_index))
          return Math.sqrt(var)
        end

        rel = relative_error(values, type_index)
        return (values[type_index].zero? ? 0.0 : nil) if rel.nil?

        rel * values[type_index].abs
      end

      # The live samples' variance design ({allocations: [A_g], total:, groups:}: the windows'
      # allocations by variance group since start), or nil (not windowed, or no valid design).
      def live_design
        @design
      end

      # The finite-population correction of the random-groups variance: 1 - the share sampled.
      def fpc
        share = @fpc_share || @share
        share && share < 1 ? 1 - share : 1.0
      end

      private

      # The variance of type_index's value in a value vector (an Array or a Hash of columns): from its
      # summed groups when the profile has variance groups, else its summed T_var label; nil when the
      # profile has no labels or the vector lacks the columns. A negative sum of labels (only a crafted
      # profile makes one) counts as 0.
      def variance_of(values, type_index)
        return nil unless @variance

        base = @ntypes + type_index * @stride
        design = @alloc_types[type_index] && @alloc_design ? @alloc_design : @design
        return group_variance(values, base + 1, design) if design

        v = values[base]
        return nil if v.nil?

        v.positive? ? v : 0
      end

      # The random-groups variance (see the class comment) of the group parts at columns first..first +
      # groups - 1, widened by (t / 2)^2, t Student's at the degrees of freedom the parts really have:
      # min(G, n) - 1, n = (sum |Y_g|)^2 / sum Y_g^2 the number of groups the site effectively spans (one
      # window: n = 1, t = 14; all 16 groups alike: t = 2.13, the error 6% wider). Without two groups
      # with allocations, or when the site spans one group, it is (sum |Y_g|)^2: the estimate squared
      # (+-100%) where parts are positive.
      def group_variance(values, first, design)
        a = design[:allocations]
        return nil if values[first].nil? && values[first + a.size - 1].nil?

        Sampling.parts_variance(Array.new(a.size) { |g| values[first + g].to_f }, design, fpc)
      end

      # The random-groups variance (above) of an estimate whose parts by variance group are ys, under
      # design ({allocations: [A_g], total:, groups:}) and the finite-population correction fpc: what a
      # sum of samples' parts (a site, a label set, several sets together) is read by.
      def self.parts_variance(ys, design, fpc)
        a = design[:allocations]
        # (A delta's parts can be negative: its total may be 0 while its parts are not.)
        squares = ys.sum { |y| y * y }
        return 0.0 if squares.zero?

        total = ys.sum
        size = ys.sum(&:abs)
        spanned = size * size / squares
        groups = design[:groups]
        return size * size if groups < 2 || spanned < 1.5

        r = total / design[:total]
        residuals = 0.0
        ys.each_with_index { |y, g| residuals += (y - r * a[g])**2 }
        df = [[groups, spanned].min.floor - 1, 1].max
        groups / (groups - 1.0) * fpc * residuals * (t_quantile(df) / 2.0)**2
      end

      # Student's t at 97.725% for df >= 1 degrees of freedom.
      def t_quantile(df)
        Sampling.t_quantile(df)
      end

      def self.t_quantile(df)
        return T_SMALL[df] if df < T_SMALL.size

        z = 2.0
        z + (z**3 + z) / (4.0 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96.0 * df**2) +
          (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384.0 * df**3)
      end

      # The variance groups' allocations (the designs: live objects', and the allocation counters' when
      # the profile gives theirs apart), or none: errors then come from T_var labels.
      def read_designs(prof)
        @design = read_design(prof, GROUPS_LINE)
        @alloc_design = read_design(prof, ALLOC_GROUPS_LINE)
      end

      def read_design(prof, pattern)
        prof.comments.each do |c|
          m = c.match(pattern) or next
          a = m[2].split(",").map(&:to_f)
          next unless a.size == @stride - 1

          total = a.sum
          return total.positive? ? { allocations: a, total: total, groups: a.count(&:positive?) } : nil
        end
        nil
      end

      # The rate the old formula assumes: the lowered one when the budget lowered it (the larger error).
      def assumed_every
        return @current_sample_every if @rate_lowered

        @sample_every
      end

      # sampling=windowed|always share=F sample_every=N current_sample_every=M rate_lowered=B windows=W
      def read_variance_line(line)
        @variance = true
        pairs = line.scan(PAIR).to_h
        @mode = pairs["sampling"] if %w[windowed always].include?(pairs["sampling"])
        @share = Float(pairs["share"], exception: false)
        @windows = pairs["windows"].to_i if pairs["windows"]&.match?(/\A\d{1,19}\z/)
        # rate_lowered is the rate now; max_sample_every the lowest it was (profiles before it existed said
        # rate_lowered=true for a rate since restored, whose current_sample_every equals sample_every).
        lowest = pairs["max_sample_every"]&.match?(/\A\d{1,19}\z/) ? pairs["max_sample_every"].to_i : nil
        restored = @sample_every && @current_sample_every && @current_sample_every <= @sample_every
        if pairs["rate_lowered"] == "true" && !restored
          @rate_lowered = true
        elsif lowest && @sample_every && lowest > @sample_every
          @lowered_at_times = lowest
        elsif pairs["rate_lowered"] == "true"
          @lowered_at_times = true
        end
        scale = Float(pairs["weight_scale"], exception: false)
        wanted = Float(pairs["weight_scale_wanted"], exception: false)
        return unless scale && wanted && scale.positive? && wanted.positive?

        @scale_bounded = [scale, wanted] if wanted > scale * 1.001 || wanted < scale / 1.001
      end

      # The windows saw too few (or too many) allocations for their share, so the weight scale was held
      # at a bound short of what the ratio wanted: every estimate is off by about scale / wanted - 1, which
      # no error bar shows. (Short runs on a busy machine, where sync jobs run late and windows are lost.)
      def scale_bounded_text
        scale, wanted = @scale_bounded
        few = wanted > scale
        "the windows saw too #{few ? "few" : "many"} allocations: the weight scale was held at #{format("%.2f", scale)} " \
          "(the ratio wanted #{format("%.2f", wanted)}), so estimates are about " \
          "#{Units.share((1 - scale / wanted).abs)} too #{few ? "low" : "high"}"
      end

      def mode_text
        case @mode
        when "windowed"
          parts = []
          parts << "hook on #{Units.share(@share)} of the time" if @share
          parts << "#{@windows} windows" if @windows
          parts.empty? ? "windowed sampling" : "windowed sampling (#{parts.join(", ")})"
        when "always" then "sampling always"
        else "sampling mode unknown"
        end
      end
    end
  end
end
