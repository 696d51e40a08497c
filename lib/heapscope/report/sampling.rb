# frozen_string_literal: true

module Heapscope
  module Report
    # Sampling turns an estimate into its sampling error. A profile's values are scaled-up samples: each
    # object was sampled with probability p and counts 1/p, so a site estimated from k sampled objects has
    # a relative standard error of sqrt((1 - p) / k), about 1/sqrt(k) when p is small (Poisson counting) and
    # 0 when every object is sampled. p comes from the profile:
    #   heapscope: p = 1/sample_every (the comment line "sample_every=N"), k = objects * p.
    #   Go:        an object of size s is sampled with p = 1 - exp(-s/R), R the profile's period
    #              (MemProfileRate, bytes); s is the site's average object size, k = objects * p.
    # With neither, the error is unknown (nil) and reports print "?".
    # heapscope's windowed sampling (comment "sampling=windowed ... windows_opened=N") takes its samples in
    # windows, so they are not independent: sqrt((1 - p) / k) is then a lower bound, and describe says so.
    class Sampling
      attr_reader :sample_every, :period, :windows

      SAMPLE_EVERY = /\bsample_every=(\d{1,19})(?!\d)/.freeze
      WINDOWED = /\bsampling=windowed\b/.freeze
      WINDOWS_OPENED = /\bwindows_opened=(\d{1,19})(?!\d)/.freeze

      # {sample type name => index}, the first of a name winning as in Profile#sample_index: one Hash
      # instead of a linear search per lookup (a profile can declare a million types).
      def self.type_index(prof)
        index = {}
        prof.sample_type_names.each_with_index { |name, i| index[name] ||= i }
        index
      end

      def initialize(prof)
        @sample_every = nil
        @windows = nil
        prof.comments.each do |c|
          # Linear patterns only (a comment is the profile writer's text): "windowed ... windows_opened"
          # is two searches, not one `.*` that backtracks over the comment for every "windowed" in it;
          # numbers longer than 19 digits are not numbers a writer meant, and sample_every=0 gives no rate
          # (it made every error infinite, which JSON cannot hold).
          m = c.match(SAMPLE_EVERY)
          @sample_every = m[1].to_i if m && m[1].to_i.positive?
          at = c.index(WINDOWED) or next
          w = c.match(WINDOWS_OPENED, at) and @windows = w[1].to_i
        end
        @period = prof.period if prof.period_type && prof.period_type[1] == "bytes" && prof.period.to_i.positive?
        @objects = {}
        @bytes = {}
        index = Sampling.type_index(prof)
        prof.sample_type_names.each_with_index do |name, i|
          # Pair each type with its object count and byte size: inuse_space <-> inuse_objects.
          base = name.sub(/_(space|objects)\z/, "")
          @objects[i] = index["#{base}_objects"]
          @bytes[i] = index["#{base}_space"]
        end
      end

      # True when errors can be computed at all.
      def known?
        !(@sample_every.nil? && @period.nil?)
      end

      # A short description for report headers.
      def describe
        if @sample_every && @windows
          "sample_every=#{@sample_every}, windowed sampling (#{@windows} windows): errors are lower bounds"
        elsif @sample_every then "sample_every=#{@sample_every}"
        elsif @period then "Go sampling, one sample per #{Units.bytes(@period)} allocated"
        else "sampling rate unknown"
        end
      end

      # Estimated number of samples behind an estimate, given the values vector (all sample types) of a
      # site and the index of the type reported. nil when unknown.
      def samples(values, type_index)
        p = probability(values, type_index)
        p && values[@objects[type_index]].abs * p
      end

      # Relative error (0.1 = ±10%) of the value values[type_index]; nil when unknown or nothing sampled.
      def relative_error(values, type_index)
        p = probability(values, type_index)
        return nil if p.nil?

        k = values[@objects[type_index]].abs * p
        return nil if k <= 0

        Math.sqrt((1 - p) / k)
      end

      # The probability that one object of this site was sampled, or nil when unknown.
      def probability(values, type_index)
        oi = @objects[type_index]
        return nil if oi.nil?

        if @sample_every
          1.0 / @sample_every
        elsif @period
          bi = @bytes[type_index]
          objects = values[oi].abs.to_f
          return nil if bi.nil? || objects.zero?

          1 - Math.exp(-values[bi].abs / objects / @period)
        end
      end

      # Absolute standard error of values[type_index] (same unit as the value), nil when unknown.
      def absolute_error(values, type_index)
        rel = relative_error(values, type_index)
        return (values[type_index].zero? ? 0.0 : nil) if rel.nil?

        rel * values[type_index].abs
      end
    end
  end
end
