# frozen_string_literal: true

module Heapscope
  # heapscope's own work must never show in a user's profile: a listener socket once weighed 31% of a
  # heap. The C core keeps a table of excluded threads (Native._exclude_thread/_include_thread, 32 at
  # most): allocations made by those threads are never sampled.
  #
  #   Thread.new { Heapscope.internal_thread { loop } }  # every thread heapscope starts (listener,
  #                               # workers, periodic writer, Pyroscope pusher): excluded first thing,
  #                               # for its whole life; its slot in the table is given back when it ends
  #   Heapscope.internal { ... }  # heapscope's work on a user's thread (a /debug/pprof request in the
  #                               # app's Rack server, building or writing a profile, starting a surface)
  #
  # Loaded without the C extension too (the surfaces and the report commands run without it): then
  # both only run the block. The surfaces accept any profile source, so this must not need Native.
  module InternalThreads
    # Thread variables, not Thread#[] (fiber-local): the core's exclusion is per thread, so the
    # nesting depth must be too, or a block that switches fibers would restore too early.
    DEPTH = :__heapscope_internal_depth
    PERMANENT = :__heapscope_excluded_thread

    @lock = Mutex.new
    @threads = [] # excluded for life (internal_thread), until they end

    class << self
      # True when the C extension is loaded (the surfaces also run on other profile sources without it).
      def supported?
        defined?(Heapscope::Native) ? true : false
      end

      # Runs the block (a heapscope thread's body) with the current thread excluded from sampling, and
      # gives its slot back when the block ends: a writer restarted many times must not fill the table.
      def internal_thread
        thread = Thread.current
        excluded = exclude_for_life(thread)
        yield
      ensure
        release(thread) if excluded
      end

      # Runs the block with the current thread excluded, then restores it: nesting-safe (only the
      # outermost block includes the thread again), and a heapscope thread stays excluded. When the
      # table is full the block runs anyway (its allocations may then be sampled).
      def internal
        thread = Thread.current
        return yield if !supported? || thread.thread_variable_get(PERMANENT)

        depth = thread.thread_variable_get(DEPTH)
        if depth
          thread.thread_variable_set(DEPTH, depth + 1)
        else
          # Excluded before anything is stored, so the thread variable's own storage is not sampled.
          return yield unless Heapscope::Native._exclude_thread(thread)

          thread.thread_variable_set(DEPTH, 1)
        end
        begin
          yield
        ensure
          depth = thread.thread_variable_get(DEPTH) - 1
          if depth.zero?
            thread.thread_variable_set(DEPTH, nil)
            Heapscope::Native._include_thread(thread)
          else
            thread.thread_variable_set(DEPTH, depth)
          end
        end
      end

      # In a forked child (Fork calls this before the surfaces restart their threads): the parent's
      # heapscope threads do not exist here, so their slots are given back.
      def after_fork
        @lock = Mutex.new # a lock held by a thread the child lacks
        dead = @threads.reject(&:alive?)
        @threads -= dead
        dead.each { |thread| Heapscope::Native._include_thread(thread) } if supported?
      end

      private

      def exclude_for_life(thread)
        return false if thread.thread_variable_get(PERMANENT)
        return false unless supported? && Heapscope::Native._exclude_thread(thread)

        thread.thread_variable_set(PERMANENT, true)
        @lock.synchronize { @threads << thread }
        true
      end

      def release(thread)
        @lock.synchronize { @threads.delete(thread) }
        thread.thread_variable_set(PERMANENT, nil)
        Heapscope::Native._include_thread(thread)
      end
    end
  end

  # Extended by the surfaces' classes (HttpServer, PeriodicWriter, Pyroscope, Rack): an application
  # may build one after Heapscope.start, and the object, its sockets, locks and parsed settings are
  # heapscope's, so construction runs in Heapscope.internal.
  module InternalNew
    def new(*args, **kwargs, &block)
      Heapscope.internal { super }
    end
  end

  class << self
    # Runs the block excluded from sampling (see InternalThreads.internal).
    def internal(&block)
      InternalThreads.internal(&block)
    end

    # Runs a heapscope thread's body excluded from sampling (see InternalThreads.internal_thread).
    def internal_thread(&block)
      InternalThreads.internal_thread(&block)
    end

    # Starts a heapscope thread named name (as `ps -T` and Thread#name show it) whose body is the
    # block, excluded from sampling for its whole life. Returns the Thread once it has run.
    #
    # Why wait: a new native thread makes itself the ractor's "running" thread as it starts, before it
    # holds the GVL (Ruby 3.3-4.0, ruby_thread_set_native), and a postponed job triggered from a
    # non-Ruby thread flags that thread. So until the new thread first runs (up to a 100 ms time slice
    # while the caller computes) the windowed sampler's sync jobs would wait on it and no window would
    # open or close. Handing it the GVL once here ends that at once.
    def start_internal_thread(name, &block)
      internal do
        started = Thread::Queue.new
        thread = Thread.new do
          started << true
          InternalThreads.internal_thread(&block)
        end
        thread.name = name if thread.respond_to?(:name=)
        begin
          started.pop
        rescue ThreadError
          nil # a trap handler may not wait: the thread runs at its next turn instead
        end
        thread
      end
    end
  end
end
