# frozen_string_literal: true

module Accuracy
  module Cases
    # GCs started by malloc growth rather than by running out of slots: big strings (16-128 KiB, one
    # object each, the bytes malloc'd) made in a loop, the last ones kept, and small objects beside
    # them. Most GCs then start right inside the code that makes the big strings.
    class MallocGc < SyntheticCase
      register "malloc_gc", "malloc-driven GCs: big strings (16-128 KiB) beside small objects"

      BIG_KEPT = 300
      SMALL_PER_BIG = 50
      SMALL_KEPT = 60_000

      def setup
        @bigs = scaled(24_000)
        @chunks = Array.new(64) { |i| ("m" * (16_384 + i * 1_792)).freeze } # 16-128 KiB
        @fill = Array.new(129) { |n| ("n" * n).freeze }
        @big = site(:big_string, String) { |k, n| k.new << @chunks[n] }
        @small = site(:small, Array) { |k| k.new(2) }
        @note = site(:small_note, String) { |k, n| k.new << @fill[n] }
      end

      def work
        big = Array.new(BIG_KEPT)
        small = Array.new(SMALL_KEPT)
        s = 0
        gcs = GC.count
        by = Hash.new(0)
        @bigs.times do |i|
          if GC.count != gcs
            gcs = GC.count
            by[GC.latest_gc_info(:gc_by).to_s] += 1 # the last of them, if several ran since
          end
          big[i % BIG_KEPT] = @big.make((i * 37) % 64)
          SMALL_PER_BIG.times do |j|
            small[s % SMALL_KEPT] = (j.even? ? @small.make : @note.make(16 + j % 100))
            s += 1
          end
        end
        @kept = [big, small]
        @notes["gcs_by"] = by
      end
    end
  end
end
