# frozen_string_literal: true

require "heapscope/pacer"
require "heapscope/report/top"

module Heapscope
  class Rack
    # TextLimiter bounds what ?debug=1 costs the application. Its text is built in Ruby, holding the
    # GVL: decoding the profile and ranking its sites cost the application 50-133 us per profile
    # sample (80,000 samples: 8-21 s per text), and two clients at once left an application thread
    # that waits on I/O at 2-3% of its speed. So one text is built at a time in the process (others get 429 at
    # once), it yields the GVL every 0.2 ms (Pacer), and texts spend CPU from a bucket: it holds at
    # most BURST seconds and refills at `share` seconds per second, and a text may start only while
    # the bucket is not empty (one that overdraws it delays the next until it is refilled). Clients
    # looping on debug=1 thus get at most `share` of one core on average (a fifth by default), while
    # texts of ordinary profiles (a few ms each) are never held back. The pprof profile (without
    # debug=1) is not limited: it is built mostly without the GVL. One limiter serves the process
    # (TEXT_LIMITER); a forked child starts with a full bucket.
    class TextLimiter
      SHARE = 0.2
      BURST = 1.0

      attr_reader :share

      # share: the most of one core that texts may take on average, above 0 and at most 1.
      def initialize(share: SHARE, burst: BURST, clock: nil)
        raise ArgumentError, "share must be above 0 and at most 1, got #{share.inspect}" unless share.is_a?(Numeric) && share.positive? && share <= 1

        @share = share
        @burst = burst
        @clock = clock || -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
        @lock = Mutex.new
        reset_state
      end

      # Books a text. Returns nil when the caller may build one now (it must then call #release), or
      # [why, whole seconds to wait] when it may not.
      def acquire
        @lock.synchronize do
          reset_after_fork
          next ["another debug=1 text is being built in this process (one at a time)", 1] if @busy

          refill
          unless @credit.positive?
            next ["debug=1 texts may use at most #{(@share * 100).round}% of one core: the last one took " \
                  "#{format("%.2f", @last_cpu)}s of CPU", [(-@credit / @share).ceil, 1].max]
          end

          @busy = true
          nil
        end
      end

      # After the text: cpu_seconds is what building it cost.
      def release(cpu_seconds)
        @lock.synchronize do
          refill
          @busy = false
          @last_cpu = cpu_seconds
          @credit -= cpu_seconds
        end
      end

      # A full bucket and nothing being built.
      def reset
        @lock.synchronize { reset_state }
      end

      # Builds one text (the block) under the limit. Returns [:ok, the block's value], or, without
      # running it, [:refused, why, whole seconds to wait].
      def run
        refused = acquire
        return [:refused, *refused] if refused

        cpu = thread_cpu
        begin
          [:ok, yield]
        ensure
          release(thread_cpu - cpu)
        end
      end

      private

      def reset_state
        @busy = false
        @credit = @burst
        @refilled = @clock.call
        @last_cpu = 0.0
        @pid = Process.pid
      end

      def refill
        now = @clock.call
        @credit = [@credit + (now - @refilled) * @share, @burst].min
        @refilled = now
      end

      def thread_cpu
        Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
      rescue Errno::EINVAL, NotImplementedError
        Process.clock_gettime(Process::CLOCK_MONOTONIC) # no per-thread clock: wall time, an upper bound
      end

      def reset_after_fork
        reset_state unless @pid == Process.pid
      end
    end

    TEXT_LIMITER = TextLimiter.new

    # TextReport renders a profile as the readable top list of ?debug=1: `heapscope top`'s own report
    # and table (Report::Top, by line, sorted by flat), so the listener and top show one set of rows,
    # in one order, with one error each, and hide the sites at zero as top does (issue 33: this text
    # once kept a row per leaf frame and class, zeros included). Above the table: the process, the
    # profile's comments and the autostarted surfaces' counters, which a file read later would not have.
    module TextReport
      ROW_LIMIT = 100

      # Returns the text for gzipped pprof bytes; type :heap ranks by inuse_space, :allocs by alloc_space
      # (their object counts for a profile without sizes). limit: rows at most (`heapscope top -n`).
      # note: one more comment line (e.g. why gc=1 was not honoured), or nil. pace: called at each step
      # of the decoding and ranking (a Heapscope::Pacer lets the application's threads run), or nil.
      def self.render(bytes, type:, limit: nil, note: nil, pace: nil)
        # share: and usable: as `heapscope top` reads a file (equal samples one object; names scrubbed).
        prof = Report::Sites.usable(Heapscope::Pprof.decode(bytes, share: true, pace: pace), "the #{type} profile")
        kind = type == :allocs ? "alloc" : "inuse"
        sample = ["#{kind}_space", "#{kind}_objects"].find { |name| prof.sample_index(name) }
        data = Report::Top.report(prof, path: "#{type} profile", sample: sample, n: limit || ROW_LIMIT, pace: pace)
        head = ["heapscope #{type} profile, pid #{Process.pid}, #{Time.now.utc.strftime("%Y-%m-%dT%H:%M:%SZ")}"]
        head << "# #{note}" if note
        # The census's own lines (and its names of classes recorded whole) are its rows in the table's
        # header; a profile may carry thousands of them.
        prof.comments.each { |c| head << "# #{c}" unless c.start_with?(Report::Census::PREFIX, Report::Sampling::EXACT_CLASS_PREFIX) }
        surfaces.each { |line| head << "# #{line}" }
        "#{Report::Top.text(data, title: head)}\n"
      end

      # Counters of the autostarted surfaces (periodic files, Pyroscope pushes), when there are any.
      def self.surfaces
        return [] unless defined?(Heapscope::Auto) && Heapscope::Auto.config

        Heapscope::Auto.stats.filter_map do |name, counters|
          next unless counters.is_a?(Hash) && counters.values.all?(Integer)

          "#{name}: #{counters.map { |k, v| "#{k}=#{v}" }.join(" ")}"
        end
      end
    end
  end
end
