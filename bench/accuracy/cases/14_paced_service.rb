# frozen_string_literal: true

module Accuracy
  module Cases
    # A service that allocates lightly: jobs of about a hundred allocations, each followed by a 1 ms wait
    # (a socket read, a database round trip), about 13 s a run. The enabled hook would cost it about a
    # percent of its time, so the overhead budget raises the window share step by step (issue 31 item 3:
    # a program that allocates little gets a high share), up to its top of 1 / 2. That takes several
    # seconds: the share rises once a stretch of 100 windows closes, and a program that mostly waits
    # opens few windows at a low share. The notes give the mean share its allocations were seen at.
    # Sessions expire, a bounded cache churns, a log ring keeps the latest lines, and every job leaves
    # scratch behind.
    class PacedService < SyntheticCase
      register "paced_service", "jobs of a few hundred allocations with short waits between: a high budget share"

      JOBS = 10_000
      WAIT = 0.001 # seconds between jobs
      SESSIONS = 12_000 # the newest kept (two logins a job)
      CACHE = 8_000
      LOG = 16_000

      def setup
        @jobs = scaled(JOBS)
        @fill = Array.new(257) { |n| ("p" * n).freeze }
        @rng = Random.new(23)
        @scratch = site(:scratch, String) { |k, n| k.new << @fill[n] }
        @params = site(:params, Hash) { |k, i| k[:id, i] }
        @session = site(:session, Hash) { |k, i| k[:user, i] }
        @session_data = site(:session_data, String) { |k, n| k.new << @fill[n] }
        @cache_entry = site(:cache_entry, Array) { |k| k.new(2) }
        @log_line = site(:log_line, String) { |k, n| k.new << @fill[n] }
      end

      def work
        @sessions = {}
        @cache = {}
        @log = Array.new(LOG)
        @jobs.times do |j|
          job(j)
          sleep WAIT
        end
      end

      private

      def job(j)
        100.times { |i| @scratch.make((j + i) % 200) }
        8.times { |i| @params.make(i) }
        2.times do |i|
          @sessions.delete(@sessions.first[0]) if @sessions.size >= SESSIONS # the oldest session expires
          session = @sessions[2 * j + i] = @session.make(j)
          session[:data] = @session_data.make(32 + j % 200)
        end
        key = @rng.rand(CACHE * 2)
        unless @cache.key?(key)
          @cache.delete(@cache.first[0]) if @cache.size >= CACHE
          entry = @cache_entry.make
          entry[0] = key
          @cache[key] = entry
        end
        2.times { |i| @log[(2 * j + i) % LOG] = @log_line.make(60 + j % 120) }
      end
    end
  end
end
