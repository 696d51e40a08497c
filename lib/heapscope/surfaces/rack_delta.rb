# frozen_string_literal: true

require "heapscope/surfaces/http/connection"

module Heapscope
  # seconds=N: the change over the next N seconds (allocs = new allocations, heap = change in live
  # objects per site, negative where objects died).
  #
  # Waiting N seconds on the Rack server's thread starved the application: under `puma -t 1:1` an
  # ordinary request waited 9 s behind a seconds=10. So when the server offers a full hijack
  # (env["rack.hijack?"]: Puma, Unicorn, Passenger, Falcon over HTTP/1), the request's socket is taken
  # over after the first snapshot and a heapscope thread waits, takes the second, and writes the
  # answer itself: the server's thread is free at once. A server without one keeps the request's
  # thread for the wait, so there seconds is capped at HELD_MAX_SECONDS (400 beyond, naming the
  # ways to a longer one). The standalone listener waits on its own worker threads, up to MAX_SECONDS.
  class Rack
    # The longest delta that may hold a Rack server's request thread (no full hijack).
    HELD_MAX_SECONDS = 30
    # How long the answer of a hijacked delta may take to be written before the socket is closed.
    HIJACKED_WRITE_TIMEOUT = 30

    # DeltaSlot lets one delta run at a time in the process (each holds two profiles and, without a
    # hijack, a thread): a flag rather than a Mutex, since a hijacked delta ends on another thread
    # than the one that began it. A forked child starts with the slot free.
    class DeltaSlot
      def initialize
        @lock = Mutex.new
        @busy = false
        @pid = Process.pid
      end

      # True when the caller got the slot (and must #release it).
      def acquire
        @lock.synchronize do
          if @pid != Process.pid
            @pid = Process.pid
            @busy = false
          end
          next false if @busy

          @busy = true
        end
      end

      def release
        @lock.synchronize { @busy = false }
      end
    end

    DELTA_SLOT = DeltaSlot.new

    private

    # Only one delta runs at a time; others get 429.
    def delta(type, params, env)
      seconds = params[:seconds]
      hijack = env["rack.hijack?"] && env["rack.hijack"].respond_to?(:call) ? env["rack.hijack"] : nil
      if hijack.nil? && !env["heapscope.listener"] && seconds > HELD_MAX_SECONDS
        return text(400, "seconds=#{seconds} would hold this server's thread for #{seconds}s: this server offers no " \
                         "full rack.hijack, so a delta here may last at most #{HELD_MAX_SECONDS}s. Ask for less, serve " \
                         "the app with Puma (heapscope then waits on a thread of its own), or use the standalone " \
                         "listener (HEAPSCOPE_HTTP=127.0.0.1:6060), which waits up to #{MAX_SECONDS}s on its own threads\n")
      end
      return text(429, "another delta profile is being computed; retry later\n", "retry-after" => seconds.to_s) unless DELTA_SLOT.acquire

      handed = false
      forced = false
      begin
        # Both ends with a GC or neither, so garbage does not count on one side only: the limiter is
        # asked once, and a booked GC is held across the window (released after the second one).
        note = nil
        if params[:gc]
          wait = @gc_limiter.acquire
          forced = wait.zero?
          note = forced ? "forced" : "skipped; retry-after=#{wait}"
        end
        older = @source.profile(gc: forced, type: type)
        socket = hijack && take_socket(hijack)
        if socket
          handed = answer_later(socket, type, params, older, forced, note, head: env["REQUEST_METHOD"] == "HEAD")
          # The server ignores what an app returns after a full hijack.
          return [200, { "content-type" => "text/plain; charset=utf-8" }, []]
        end

        sleep(seconds)
        delta_answer(type, params, older, forced, note)
      ensure
        unless handed
          DELTA_SLOT.release
          @gc_limiter.release if forced
        end
      end
    end

    # The server's socket for this request (full hijack), or nil when the server refuses it (rackup's
    # WEBrick handler offers a partial hijack only, and raises for a full one).
    def take_socket(hijack)
      io = hijack.call
      io.respond_to?(:write) && io.respond_to?(:close) ? io : nil
    rescue NotImplementedError, StandardError
      nil
    end

    # Waits, answers and closes socket on a heapscope thread, which then gives the slot (and the GC
    # booking) back. Returns true; when no thread can be started, answers 503 at once and returns false.
    def answer_later(socket, type, params, older, forced, note, head:)
      Heapscope.start_internal_thread("heapscope-delta") do
        Thread.current.report_on_exception = false
        begin
          begin
            sleep(params[:seconds])
            status, headers, body = delta_answer(type, params, older, forced, note)
          rescue StandardError => e
            status, headers, body = delta_failure(e)
          ensure
            DELTA_SLOT.release
            @gc_limiter.release if forced
          end
          headers["x-heapscope-pid"] = Process.pid.to_s
          write_fully(socket, Http::Response.build(status, headers, body, head: head))
        ensure
          close_quietly(socket)
        end
      end
      true
    rescue ThreadError => e
      status, headers, body = text(503, "cannot start a thread to wait #{params[:seconds]}s for a delta profile " \
                                        "(#{e.message}); retry later\n", "retry-after" => "5")
      headers["x-heapscope-pid"] = Process.pid.to_s
      write_fully(socket, Http::Response.build(status, headers, body, head: head))
      close_quietly(socket)
      false
    end

    def delta_failure(error)
      return not_running(error.message) if defined?(Heapscope::Error) && error.is_a?(Heapscope::Error)

      text(500, "heapscope: #{error.class}: #{error.message}\n")
    end

    # Writes bytes within HIJACKED_WRITE_TIMEOUT (a client that stops reading costs this thread no
    # longer); false when they could not all be written.
    def write_fully(socket, bytes)
      return socket.write(bytes) == bytes.bytesize unless socket.respond_to?(:write_nonblock) # no deadline then

      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + HIJACKED_WRITE_TIMEOUT
      until bytes.empty?
        written = socket.write_nonblock(bytes, exception: false)
        if written == :wait_writable
          left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          return false if left <= 0 || !IO.select(nil, [socket], nil, left)
        else
          bytes = bytes.byteslice(written..)
        end
      end
      true
    rescue IOError, SystemCallError
      false
    end

    def close_quietly(socket)
      socket.close unless socket.closed?
    rescue IOError, SystemCallError
      nil
    end

    # The delta's response, from the older snapshot and one taken now.
    def delta_answer(type, params, older, forced, note)
      newer = @source.profile(gc: forced, type: type) if @source.running?
      return not_running if newer.nil?

      diff = DeltaVariance.subtract(by_site(Heapscope::Pprof.decode(newer)), by_site(Heapscope::Pprof.decode(older)))
      diff.duration_nanos = params[:seconds] * 1_000_000_000
      # The memory figures are a moment's, not a change: readers would set them beside the delta's total.
      diff.comments.reject! { |c| c.start_with?(Heapscope::Memory::COMMENT) }
      diff.comments << "heapscope delta profile: #{type} change over #{params[:seconds]}s (negative values: fewer live objects)"
      diff.comments << DeltaVariance::COMMENT if Report::Sampling.variance_labels(diff)
      status, headers, body = binary("#{type}-delta-#{params[:seconds]}s.pb.gz", diff.to_pprof(gzip: true))
      headers["x-heapscope-gc"] = note if note
      [status, headers, body]
    end

    # Drops the gc_age label, which changes as objects age: a delta compares sites (stack and class),
    # and an object that merely got older must not show as -1 in one age bucket and +1 in the next.
    def by_site(prof)
      prof.samples.each { |sample| sample.labels.delete("gc_age") }
      prof
    end

    public

    # DeltaVariance subtracts two snapshots of one process that carry variance labels (see
    # Report::Sampling), so the delta carries labels a reader can trust. Subtracting by (stack, labels)
    # would never match a sample, since its variance changes between the two; so the labels become
    # extra values for the subtraction and labels again afterwards:
    #   alloc_*: allocations since start only grow, and what the window adds is sampled independently of
    #            what came before, so the change's variance is new - old (at least 0);
    #   inuse_*: the objects alive in both snapshots are the same samples (positively correlated), so
    #            new + old is an upper bound of the change's variance: errors err on the safe side;
    #   variance groups (windowed sampling): a group's part is a sum over its windows, and a window is in
    #            the same group in both snapshots, so the delta's parts are new - old, for alloc_* and
    #            inuse_* alike (objects alive in both cancel), and readers compute the change's variance
    #            from them (with the newer snapshot's design line: an approximation for alloc_*, whose
    #            change came from the windows since the older one).
    module DeltaVariance
      COMMENT = "variance labels of this delta: alloc_* new - old, inuse_* new + old (an upper bound); variance groups new - old"

      def self.subtract(newer, older)
        names = Report::Sampling.variance_labels(newer)
        return Heapscope::Pprof.subtract(newer, older) unless names && Report::Sampling.variance_labels(older)

        n = newer.sample_types.size
        [newer, older].each do |prof|
          inuse_sign = prof.equal?(older) ? -1 : 1 # old's inuse variances negated: subtracting adds them
          prof.sample_types += names.map { |name| [name, "variance"] }
          prof.samples.each do |sample|
            extra = names.map do |name|
              v = sample.labels.delete(name)
              v = 0 unless v.is_a?(Integer)
              name.start_with?("inuse_") && name.end_with?(Report::Sampling::VARIANCE_SUFFIX) ? v * inuse_sign : v
            end
            sample.values.concat(extra)
          end
        end
        diff = Heapscope::Pprof.subtract(newer, older)
        diff.sample_types = diff.sample_types.first(n)
        diff.samples.each do |sample|
          sample.values.pop(names.size).each_with_index do |v, i|
            group = !names[i].end_with?(Report::Sampling::VARIANCE_SUFFIX)
            sample.labels[names[i]] = v if group ? !v.zero? : v.positive?
          end
        end
        diff.samples.reject! { |sample| sample.values.all?(&:zero?) }
        diff
      end
    end
  end
end
