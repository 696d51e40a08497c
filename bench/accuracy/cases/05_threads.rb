# frozen_string_literal: true

module Accuracy
  module Cases
    # Four threads allocating at the same time, each at its own site with its own object size and its
    # own ring of kept objects (from a fraction of a GC interval to many), passing the GVL often so their
    # allocations interleave.
    class Threads < SyntheticCase
      register "threads", "four threads allocating at different sites at once"

      # [objects per thread, objects kept in its ring, payload bytes]
      PLAN = [[600_000, 5_000, 40], [500_000, 20_000, 120], [300_000, 60_000, 16], [200_000, 50_000, 300]].freeze
      PASS_EVERY = 500

      def setup
        @fill = Array.new(301) { |n| ("t" * n).freeze }
        @made = PLAN.map { |n, _, _| scaled(n) }
        @sites = [
          site(:thread1, String) { |k, n| k.new << @fill[n] },
          site(:thread2, String) { |k, n| k.new << @fill[n] },
          site(:thread3, String) { |k, n| k.new << @fill[n] },
          site(:thread4, String) { |k, n| k.new << @fill[n] },
        ]
      end

      def work
        @rings = PLAN.map { |_, keep, _| Array.new(keep) }
        threads = PLAN.each_with_index.map do |(_, keep, size), t|
          Thread.new(@sites[t], @rings[t], @made[t]) do |s, ring, n|
            n.times do |i|
              ring[i % keep] = s.make(size - i % (size / 2))
              Thread.pass if (i % PASS_EVERY).zero?
            end
          end
        end
        threads.each(&:join)
      end
    end
  end
end
