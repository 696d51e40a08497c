# frozen_string_literal: true

require "heapscope/pacer"

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

    # TextReport renders a profile as the readable top list of ?debug=1: the allocation sites
    # (leaf frame and class) holding the most, largest first, each with the standard error of its
    # bytes as `heapscope top` computes it (Report::Sampling: the variance labels when the profile has
    # them), and the sampling line of the reports' headers (which says when the budget lowered the rate).
    module TextReport
      ROW_LIMIT = 100

      # Returns the text for gzipped pprof bytes; type :heap ranks by inuse_space, :allocs by alloc_space.
      # note: one more comment line (e.g. why gc=1 was not honoured), or nil. pace: called at each step
      # of the decoding and ranking (a Heapscope::Pacer lets the application's threads run), or nil.
      def self.render(bytes, type:, limit: nil, note: nil, pace: nil)
        prof = Heapscope::Pprof.decode(bytes, pace: pace)
        kind = type == :allocs ? "alloc" : "inuse"
        space = prof.sample_index("#{kind}_space") || 0
        count = prof.sample_index("#{kind}_objects") || space
        sampling = Report::Sampling.new(prof)
        var = Report::Sampling.variance_labels(prof)
        # {[site, class] => value vector}: every type (and variance) summed, for the error.
        rows = {}
        leaves = {} # location id => the leaf frame's text: the whole stack is never expanded
        prof.samples.each do |sample|
          pace&.call
          id = sample.location_ids.first
          leaf = id ? (leaves[id] ||= prof.frames_for([id]).first.to_s) : "(no frames)"
          key = [leaf, sample.labels["class"].to_s]
          values = var ? Report::Sampling.with_variances(sample, var) : sample.values
          if (row = rows[key]) then Report::Sites.add(row, values)
          else rows[key] = values.dup
          end
        end
        total_space = rows.values.sum { |v| v[space].to_i }
        total_count = rows.values.sum { |v| v[count].to_i }
        # With a census (Report::Census), a row (one class at one site) never reads above its class's
        # exact total: bounded before ranking, and said so under the table.
        census = Report::Census.of(prof)
        space_name = prof.sample_types[space]&.first
        bound = ->(klass, v) { [v[space], census&.exact(klass, space_name)].compact.min }
        ranked = rows.sort_by { |(site, klass), v| [-bound.call(klass, v), -v[count], site, klass] }
        limit ||= ROW_LIMIT
        out = +"heapscope #{type} profile, pid #{Process.pid}, #{Time.now.utc.strftime("%Y-%m-%dT%H:%M:%SZ")}\n"
        out << "# #{kind}_space #{human(total_space)} in #{total_count} #{kind}_objects (estimates scaled from samples)\n"
        out << "# sampling: #{sampling.describe}; error: standard error of #{kind}_space\n"
        out << "# #{note}\n" if note
        if (parts = Heapscope::Memory.of_profile(prof))
          Heapscope::Memory.report_lines(parts, size: ->(b) { human(b) }).each { |line| out << "# #{line}\n" }
        end
        if census && kind == "inuse"
          Report::Census.text(census.report(prof, space, sampling: sampling)).each { |line| out << "# #{line}\n" }
        end
        # The census's own lines are the rows above; a profile may carry thousands of them.
        prof.comments.each { |c| out << "# #{c}\n" unless census && c.start_with?(Report::Census::PREFIX) }
        surfaces.each { |line| out << "# #{line}\n" }
        out << format("%12s %7s %7s %12s  %-24s %s\n", "#{kind}_space", "error", "%", "objects", "class", "allocation site")
        notes = []
        ranked.first(limit).each do |(site, klass), v|
          value = bound.call(klass, v)
          share = total_space.zero? ? 0.0 : 100.0 * value / total_space
          error = v[space].zero? ? "-" : Report::Units.error(sampling.relative_error(v, space))
          shown = human(value.to_i)
          if value < v[space]
            shown = "≤#{shown}"
            notes << "# ≤ #{site} (#{klass}): bounded by #{klass}'s exact total (census); the estimate was #{human(v[space].to_i)}\n"
          end
          out << format("%12s %7s %6.2f%% %12d  %-24s %s\n", shown, error, share, v[count].to_i,
                        klass.empty? ? "-" : klass, site)
        end
        out << "# ... #{ranked.size - limit} more sites\n" if ranked.size > limit
        notes.each { |n| out << n }
        out
      end

      # Counters of the autostarted surfaces (periodic files, Pyroscope pushes), when there are any.
      def self.surfaces
        return [] unless defined?(Heapscope::Auto) && Heapscope::Auto.config

        Heapscope::Auto.stats.filter_map do |name, counters|
          next unless counters.is_a?(Hash) && counters.values.all?(Integer)

          "#{name}: #{counters.map { |k, v| "#{k}=#{v}" }.join(" ")}"
        end
      end

      def self.human(bytes)
        units = %w[B KiB MiB GiB TiB]
        value = bytes.to_f
        unit = 0
        while value.abs >= 1024 && unit < units.size - 1
          value /= 1024
          unit += 1
        end
        unit.zero? ? "#{bytes}B" : format("%.1f%s", value, units[unit])
      end
    end
  end
end
