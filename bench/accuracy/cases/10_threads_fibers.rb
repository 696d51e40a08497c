# frozen_string_literal: true

module Accuracy
  module Cases
    # A process that keeps a few dozen Threads and Fibers alive (a server's thread pools, a scheduler's
    # fibers) beside many small objects. A Thread's VM stack makes it about a thousand times the size of
    # a small object, so one sampled Thread standing for sample_every allocations was the 1000 MiB
    # phantom of issue 31; heapscope now records Threads and Fibers whole (exact_threads). Their lines
    # also allocate VM internals, so they are read by their class (`top --label class=...`), and no run
    # may read them above 2x their truth.
    class ThreadsFibers < SyntheticCase
      register "threads_fibers", "a few dozen Threads and Fibers kept alive beside many small objects"
      # Issue 31 judges the spread ratio on the real gems and the request app and reports it elsewhere:
      # here the rings of recent small objects hold the last 2.5% of an allocation-dense run, which a
      # windowed sampler at its share sees in 2-3 windows (docs/windowed-sampling.md).
      judge_ratio false

      SMALL = 1_200_000 # small objects made during the run
      # [site, how many], made evenly through the run
      KEPT = { worker_thread: 24, pool_thread: 8, task_fiber: 40 }.freeze

      def setup
        @fill = Array.new(65) { |n| ("f" * n).freeze }
        @gate = Queue.new
        gate = @gate
        @thread_body = proc { gate.pop }
        @fiber_body = proc { Fiber.yield }
        @makers = {
          worker_thread: site(:worker_thread, Thread, by_class: true, exact: true) { |k, b| k.new(&b) },
          pool_thread: site(:pool_thread, Thread, by_class: true, exact: true) { |k, b| k.new(&b) },
          # Resumed once on its line, so the size counted is the size with its stack (the truth of
          # alloc_space is each object's size when make returns).
          task_fiber: site(:task_fiber, Fiber, by_class: true, exact: true) { |k, b| k.new(&b).tap(&:resume) },
        }
        @text = site(:small_text, String) { |k, n| k.new << @fill[n] }
        @row = site(:small_row, Array) { |k, n| k.new(n) }
      end

      def work
        @kept = []
        @texts = Array.new(30_000)
        @rows = Array.new(8_000)
        n = scaled(SMALL)
        schedule = KEPT.flat_map { |name, count| Array.new(count) { name } }.shuffle(random: Random.new(7))
        every = n / (schedule.size + 1)
        n.times do |i|
          if (i % 3).zero?
            @rows[i % @rows.size] = @row.make(i & 3)
          else
            @texts[i % @texts.size] = @text.make(i & 63)
          end
          next unless (i % every).zero? && !schedule.empty? && i.positive?

          name = schedule.pop
          obj = @makers[name].make(name == :task_fiber ? @fiber_body : @thread_body)
          # A Fiber is left suspended at its Fiber.yield, alive with its stack; a Thread must be running
          # before the run goes on (it gets its VM stack when it starts).
          Thread.pass until name == :task_fiber || obj.status == "sleep"
          @kept << obj
        end
      end
    end
  end
end
