# frozen_string_literal: true

require "etc"
require "heapscope/ui/summary"
require "heapscope/ui/summary_cache"

module Heapscope
  module UI
    # Prefetch fills the summary cache from child processes when a server starts over many profiles it
    # has never summarized: decoding is pure Ruby and holds the GVL, so one process uses one core, and a
    # first look at 500 profiles took minutes. The files are dealt out in turn, one run per core: the
    # server's own summarizer keeps every (children + 1)th file, each child takes its own share, in the
    # order given (Sources gives them coarse to fine over time, so every process's first files already
    # span the whole series), writing summaries to the cache. The summarizer reads a child's files back
    # (SummaryCache#read) when they are ready, going on with its own meanwhile, and decodes a file itself
    # if the child died or could not write it.
    #
    # Only with a cache (children hand their work over through it) and fork; at most MAX_CHILDREN.
    class Prefetch
      MIN_FILES = 16 # fewer are read quickly enough by one process
      MAX_CHILDREN = 3
      POLL = 0.02

      # jobs: [[path, stamp]] in the order the summarizer reads them. Returns a Prefetch, or nil when
      # it is not worth it (few files, one core, no cache, no fork).
      def self.start(jobs, cache, max_size:)
        children = [Etc.nprocessors - 1, MAX_CHILDREN].min
        return nil if children < 1 || jobs.size < MIN_FILES || !cache.enabled? || !Process.respond_to?(:fork)

        new(jobs, cache, max_size, children)
      end

      def initialize(jobs, cache, max_size, children)
        @cache = cache
        @owner = {} # path => pid of the child summarizing it
        @running = {} # pid => true while it runs
        runs = Array.new(children + 1) { [] }
        jobs.each_with_index { |job, i| runs[i % (children + 1)] << job }
        runs.drop(1).each do |run|
          pid = fork { summarize(run, max_size) }
          @running[pid] = true
          run.each { |path, _| @owner[path] = pid }
        end
      end

      # What take answers while the child that owns a file still works on it.
      LATER = :later

      # The summary of path from the child that owns it; LATER while that child still runs without
      # having written it; nil when the path is not a child's, or its child ended without it (the caller
      # then decodes it). Never waits.
      def take(path, stamp, table)
        pid = @owner[path] or return nil
        alive = running?(pid) # before the read: a child that wrote it and ended is read, not decoded again
        @cache.read(path, stamp, table) || (alive ? LATER : nil)
      end

      def stop
        @running.each_key do |pid|
          Process.kill("TERM", pid)
          Process.wait(pid)
        rescue SystemCallError
          nil
        end
        @running.clear
      end

      private

      def running?(pid)
        return false unless @running[pid]
        return true unless Process.waitpid(pid, Process::WNOHANG)

        @running.delete(pid)
        false
      rescue Errno::ECHILD
        @running.delete(pid)
        false
      end

      # The child's whole life: every file of its run into the cache, then exit! (no at_exit handler of
      # the parent's, such as a test runner's, may run twice).
      def summarize(run, max_size)
        table = SiteTable.new
        run.each do |path, stamp|
          next if @cache.read(path, stamp, table)

          prof = Report::Sites.load(path, max_size: max_size)
          @cache.write(path, stamp, Summarize.call(prof, table, name: path, fallback_time: stamp[0]), table)
        rescue StandardError
          nil # the parent decodes it and reports the error
        end
      ensure
        exit!(0)
      end
    end
  end
end
