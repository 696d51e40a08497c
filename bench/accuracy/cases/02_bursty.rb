# frozen_string_literal: true

module Accuracy
  module Cases
    # Bursts of allocation after idle phases (sleeps without a single allocation), like a worker woken by
    # a queue: each burst makes short-lived request garbage and a few results kept in a ring of the last
    # bursts; between bursts a trickle of small objects. Time says nothing about where allocations happen.
    class Bursty < SyntheticCase
      register "bursty", "bursts of allocation between idle sleeps; results of the last bursts kept"

      BURST = 25_000 # garbage objects per burst
      KEPT = 4_000 # results kept per burst
      RING = 12 # bursts whose results stay alive
      TRICKLE = 400 # objects between bursts, kept in a ring
      IDLE_S = 0.02

      def setup
        @bursts = scaled(50)
        @fill = Array.new(257) { |n| ("y" * n).freeze }
        @request = site(:request, String) { |k, n| k.new << @fill[n] }
        @result = site(:result, Array) { |k| k.new(2) }
        @trickle = site(:trickle, String) { |k, n| k.new << @fill[n] }
      end

      def work
        ring = Array.new(RING)
        small = Array.new(TRICKLE * RING)
        t = 0
        @bursts.times do |b|
          sleep(IDLE_S)
          kept = Array.new(KEPT)
          BURST.times { |i| @request.make(16 + i % 120) }
          KEPT.times do |i|
            r = @result.make
            r[0] = b
            r[1] = i
            kept[i] = r
          end
          ring[b % RING] = kept
          TRICKLE.times do |i|
            small[t % small.size] = @trickle.make(8 + i % 40)
            t += 1
          end
        end
        @kept = [ring, small]
      end
    end
  end
end
