# frozen_string_literal: true

module Accuracy
  module Cases
    # Objects of every lifetime from a tenth of a GC interval to many: a ring of recent items (~0.1 GC
    # intervals), a FIFO cache (~1), an LRU cache whose hot keys stay for many intervals while cold ones
    # churn, a session store whose sessions expire after exponentially distributed times (short and long
    # ones mixed), a slow leak, and garbage that dies at once. Every step does a bit of each, so all share
    # the same GC intervals; the notes give the lifetimes measured in them.
    class Lifetimes < SyntheticCase
      register "lifetimes", "caches with churn (FIFO, LRU), sessions with expiry, a slow leak: lifetimes 0.1-10 GC intervals"

      RECENT = 12_000
      FIFO = 25_000
      LRU = 30_000
      LRU_KEYS = 120_000
      SESSION_SHORT = 4_000 # mean steps a short session lives
      SESSION_LONG = 60_000 # and a long one
      LEAK_EVERY = 16

      BACKGROUND = 400_000 # long-lived objects made before start: a heap whose GC interval is ~100k+ allocations

      def setup
        @steps = scaled(200_000)
        @fill = Array.new(513) { |n| ("x" * n).freeze }
        @background = Array.new(BACKGROUND / 4) { |i| [i.to_s, i.to_s, i.to_s] }
        @rng = Random.new(17)
        @temp = site(:temp, String) { |k, n| k.new << @fill[n] }
        @recent_item = site(:recent_item, String) { |k, n| k.new << @fill[n] }
        @fifo_entry = site(:fifo_entry, Array) { |k| k.new(3) }
        @fifo_value = site(:fifo_value, String) { |k, n| k.new << @fill[n] }
        @lru_value = site(:lru_value, String) { |k, n| k.new << @fill[n] }
        @session = site(:session, Hash) { |k, i| k[:id, i] } # its table made here: later keys keep its size
        @session_data = site(:session_data, String) { |k, n| k.new << @fill[n] }
        @leak_item = site(:leak_item, Array) { |k| k.new(4) }
      end

      def work
        recent = Array.new(RECENT)
        fifo = Array.new(FIFO)
        lru = {}
        sessions = {}
        wheel = {}
        @leak = []
        r = 0
        a0 = GC.stat(:total_allocated_objects)
        @steps.times do |i|
          @temp.make(24 + i % 80)
          3.times do |j|
            recent[r % RECENT] = @recent_item.make(24 + (i + j) % 64)
            r += 1
          end
          e = @fifo_entry.make
          e[0] = i
          e[1] = @fifo_value.make(50 + i % 200)
          fifo[i % FIFO] = e
          key = (@rng.rand**3 * LRU_KEYS).to_i # hot keys near 0
          if (v = lru.delete(key))
            lru[key] = v
          else
            lru[key] = @lru_value.make(40 + key % 160)
            lru.shift if lru.size > LRU
          end
          if i.odd?
            s = @session.make(i)
            s[:data] = @session_data.make(100 + i % 300)
            mean = @rng.rand < 0.5 ? SESSION_SHORT : SESSION_LONG
            sessions[i] = s
            (wheel[i + 1 + (-Math.log(1 - @rng.rand) * mean).to_i] ||= []) << i
          end
          if (ids = wheel.delete(i))
            ids.each { |id| sessions.delete(id) }
          end
          @leak << @leak_item.make if (i % LEAK_EVERY).zero?
        end
        per_step = (GC.stat(:total_allocated_objects) - a0).to_f / @steps
        @kept = [recent, fifo, lru, sessions, wheel]
        @per_step = per_step
      end

      def measure_work
        super
        @notes["lifetime_gc_intervals"] = {
          "recent_item" => intervals(RECENT * @per_step / 3), "fifo" => intervals(FIFO * @per_step),
          "session_short" => intervals(SESSION_SHORT * @per_step), "session_long" => intervals(SESSION_LONG * @per_step),
          "lru_cold_key" => "about #{intervals(LRU * @per_step)}, hot keys: the whole run",
        }
      end
    end
  end
end
