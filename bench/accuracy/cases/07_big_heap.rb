# frozen_string_literal: true

module Accuracy
  module Cases
    # A big heap that GCs rarely: an in-memory index of 1.2 million small objects built at start (the
    # heap grows, so GCs come further and further apart), then request-like work beside it, so the whole
    # work phase has only a few GCs: a process whose GCs are rare has few of them to sample by.
    class BigHeap < SyntheticCase
      register "big_heap", "a heap of 1.2M live objects, then work with only a few GCs"

      NODES = 800_000
      VALUES = 400_000
      CACHE = 50_000

      def setup
        @requests = scaled(700_000)
        @fill = Array.new(129) { |n| ("h" * n).freeze }
        @node = site(:index_node, Array) { |k| k.new(2) }
        @value = site(:index_value, String) { |k, n| k.new << @fill[n] }
        @temp = site(:request_temp, String) { |k, n| k.new << @fill[n] }
        @cached = site(:cached, Hash) { |k, i| k[:at, i] } # built whole: its size must not change later
      end

      def work
        g0 = GC.count
        @index = Array.new(NODES) do |i|
          n = @node.make
          n[0] = i
          n[1] = @value.make(24 + i % 100) if i < VALUES
          n
        end
        g1 = GC.count
        cache = Array.new(CACHE)
        @requests.times do |i|
          @temp.make(30 + i % 90)
          if (i % 4).zero?
            cache[(i / 4) % CACHE] = @cached.make(i)
          end
        end
        @cache = cache
        @notes["gcs_building"] = g1 - g0
        @notes["gcs_working"] = GC.count - g1
      end
    end
  end
end
