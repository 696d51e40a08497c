# frozen_string_literal: true

require "heapscope/internal"

module Heapscope
  module Http
    # A few long-lived threads that run the app for the listener (a profile can take a while, a delta
    # waits up to 300 s), so the event loop never waits for one. Threads start on demand and stay;
    # when one cannot be started (ThreadError at the process's thread limit, `ulimit -u`), the pool
    # tries again at most once a second and, while it has no thread at all, submit returns false so
    # that the loop serves the request itself: the listener keeps answering and prints nothing.
    class WorkerPool
      RETRY_SECONDS = 1.0

      # The reason the last thread could not be started, or nil.
      attr_reader :spawn_error

      # spawn: called as spawn.call(name) { ... }, returns a started Thread (by default
      # Heapscope.start_internal_thread, which every heapscope thread starts through).
      def initialize(size:, spawn: nil)
        @size = size
        @spawn = spawn || ->(name, &block) { Heapscope.start_internal_thread(name, &block) }
        @jobs = Thread::Queue.new
        @threads = []
        @retry_at = nil
        @spawn_error = nil
      end

      # Queues job (a callable) for a worker. Returns false when no worker runs and none could be
      # started; the caller then runs the job itself. Called by one thread only (the loop).
      def submit(job)
        @threads.select!(&:alive?)
        # Start another worker only when every running one has (or will have) a job.
        grow if @threads.size < @size && @jobs.num_waiting <= @jobs.size
        return false if @threads.empty?

        @jobs << job
        true
      end

      def size
        @threads.count(&:alive?)
      end

      # Workers finish their current job, then end.
      def shutdown
        @jobs.close
      end

      private

      def grow
        now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        return if @retry_at && now < @retry_at

        @threads << @spawn.call("heapscope-http-worker") { work }
        @spawn_error = nil
        @retry_at = nil
      rescue StandardError => e # ThreadError, or EAGAIN from the OS: try again later
        @spawn_error = e
        @retry_at = now + RETRY_SECONDS
      end

      # The app's work for the listener is heapscope's: excluded from sampling (Heapscope.internal_thread,
      # which nests, so a spawn that excludes the thread already changes nothing).
      def work
        Heapscope.internal_thread do
          Thread.current.report_on_exception = false
          while (job = @jobs.pop)
            begin
              job.call
            rescue StandardError
              nil # the job answers its own errors; nothing may end the worker or reach stderr
            end
          end
        end
      end
    end
  end
end
