# frozen_string_literal: true

module Heapscope
  # Fork runs callbacks in a child right after fork, through Ruby 3.1's Process._fork hook, which
  # every fork path goes through (Kernel#fork, Process.fork, IO.popen("-"), puma and unicorn workers).
  #
  #   Heapscope::Fork.after_fork_child { |parent_pid| restart_my_thread }
  #
  # A child starts with only the forking thread, so each background thread of heapscope (periodic
  # writer, listener, pusher) registers a callback here to start again and to name its output with
  # the child's pid. The recorder's own fork handling (records inherited objects, discards a
  # half-done snapshot) belongs to the core; this file only sequences the Ruby-side surfaces.
  module Fork
    @callbacks = []
    @lock = Mutex.new

    class << self
      # Registers block to run in each forked child; returns the block (pass it to remove).
      def after_fork_child(&block)
        raise ArgumentError, "Heapscope::Fork.after_fork_child needs a block" unless block

        install
        @lock.synchronize { @callbacks << block }
        block
      end

      def remove(block)
        @lock.synchronize { @callbacks.delete(block) }
      end

      # Runs in the child with the parent's pid. A failing callback warns and does not stop the
      # others, nor the child.
      def run_child_callbacks(parent_pid)
        @lock = Mutex.new # the parent's lock may have been held by a thread the child lacks
        # The parent's heapscope threads are gone: free their slots before the callbacks start new ones.
        InternalThreads.after_fork if defined?(InternalThreads)
        @callbacks.dup.each do |callback|
          callback.call(parent_pid)
        rescue StandardError => e
          warn "heapscope: after-fork callback failed in pid #{Process.pid}: #{e.class}: #{e.message}"
        end
      end

      def installed?
        @installed == true
      end

      private

      def install
        return if @installed

        unless Process.respond_to?(:_fork)
          warn "heapscope: this Ruby has no Process._fork (needs >= 3.1): forked children will not restart heapscope's threads"
          @installed = true
          return
        end
        Process.singleton_class.prepend(Hook)
        @installed = true
      end
    end

    # Prepended to Process's singleton class: _fork returns 0 in the child.
    module Hook
      def _fork
        parent = Process.pid
        pid = super
        Heapscope::Fork.run_child_callbacks(parent) if pid.zero?
        pid
      end
    end
  end
end
