# frozen_string_literal: true

module Accuracy
  module Cases
    # A run of about 0.1 s from Heapscope.start to the profile: a short script, a one-off job, a test,
    # where a new user tries heapscope first. Issue 31 measured such runs 21-49% low (2-6 windows, the
    # weight scale at its bound); the same work at 10x the length was unbiased.
    class ShortRun < SyntheticCase
      register "short_run", "a run of about 0.1 s: scratch objects, a ring, a kept list"

      def setup
        @fill = Array.new(65) { |n| ("s" * n).freeze }
        @scratch = site(:scratch, String) { |k, n| k.new << @fill[n] }
        @recent = site(:recent, Array) { |k, n| k.new(n) }
        @result = site(:result, String) { |k, n| k.new << @fill[n] }
      end

      def work
        ring = Array.new(15_000)
        @ring = ring
        @results = []
        n = scaled(240_000)
        n.times do |i|
          case i % 8
          when 0, 1 then ring[i % ring.size] = @recent.make(i & 3)
          when 2 then @results << @result.make(i & 63)
          else @scratch.make(i & 63)
          end
        end
      end
    end
  end
end
