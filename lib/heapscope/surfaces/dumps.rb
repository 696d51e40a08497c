# frozen_string_literal: true

require_relative "../atomic_write"
require_relative "../internal"
require_relative "../memory"
require_relative "output_dir"
require_relative "periodic_writer"

module Heapscope
  # Dumps writes a heap profile at the moment memory goes wrong, not an hour later: when the process's
  # RSS first reaches a threshold and again each time it grows by a further step (at most one such
  # profile per min_interval seconds), and whenever the process receives the signal chosen.
  #
  #   dumps = Heapscope::Dumps.new(dir: "log/heapscope", rss: "1.5G", step: "256M", signal: "USR2").start
  #   dumps.stop
  #
  # Files: APP-PID-STAMP-rss.heap.pb.gz (written without a GC: no pause when memory is already high)
  # and APP-PID-STAMP-signal.heap.pb.gz (after a full GC: asked for), atomically, as every file
  # heapscope writes, into the directory opened once (OutputDir); the periodic writer's rotation never
  # removes them. Each carries the memory
  # breakdown (memory.rb). One background thread ("heapscope-dumps", excluded from sampling) reads RSS
  # every check_interval seconds and does the writing; the signal handler only wakes it, so nothing
  # runs in trap context but a one-byte write. A handler the application had for the signal still runs
  # after heapscope's. Failures warn once per error class and never raise.
  class Dumps
    # Signals a user may give heapscope: the ones meant for applications. (Ruby reserves others, and
    # INT, TERM, QUIT or CHLD have meanings an application relies on.)
    SIGNALS = %w[USR1 USR2 HUP].freeze
    SIZE = /\A\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*\z/i.freeze
    UNITS = { "" => 1, "K" => 1024, "M" => 1024**2, "G" => 1024**3, "T" => 1024**4 }.freeze

    # "1.5G", "256M", "800MiB", "1048576" or an Integer -> bytes (binary units). Raises ArgumentError
    # naming what was given.
    def self.parse_size(value, what = "size")
      return value if value.is_a?(Integer) && value.positive?

      m = SIZE.match(value.to_s)
      bytes = m && (Float(m[1]) * UNITS.fetch(m[2].upcase)).round
      unless bytes&.positive?
        raise ArgumentError, "#{what} must be a positive size like 1.5G, 512M or 800MiB (binary units), got #{value.inspect}"
      end

      bytes
    end

    attr_reader :dir, :threshold, :step, :signal

    # dir:            where profiles go (created 0755 if missing).
    # rss:            the threshold (a size, see parse_size), or nil: no RSS dumps.
    # step:           further growth that makes another dump (default: a tenth of rss).
    # signal:         "USR1", "USR2" or "HUP" (with or without SIG), or nil.
    # min_interval:   least seconds between two RSS dumps (signals are not limited).
    # check_interval: seconds between RSS readings.
    # rss_reader:     a callable returning RSS in bytes (tests); default /proc/self/status.
    def initialize(dir:, rss: nil, step: nil, signal: nil, min_interval: 60, check_interval: 1.0, app_name: "ruby",
                   source: nil, warn: nil, rss_reader: nil)
      @threshold = rss && Dumps.parse_size(rss, "rss")
      @step = step ? Dumps.parse_size(step, "step") : (@threshold && [@threshold / 10, 1].max)
      @signal = signal && Dumps.signal_name(signal)
      raise ArgumentError, "nothing to dump on: give rss: or signal:" unless @threshold || @signal
      unless min_interval.is_a?(Numeric) && min_interval >= 0
        raise ArgumentError, "min_interval must be a number of seconds >= 0, got #{min_interval.inspect}"
      end
      unless check_interval.is_a?(Numeric) && check_interval.positive?
        raise ArgumentError, "check_interval must be a number of seconds > 0, got #{check_interval.inspect}"
      end
      PeriodicWriter.check_app_name(app_name)

      @dir = File.expand_path(dir.to_s)
      @min_interval = min_interval
      @check_interval = check_interval
      @app_name = app_name.to_s
      @source = source || (require "heapscope"; Heapscope)
      @warn = warn || ->(line) { Kernel.warn(line) }
      @own_rss_reader = !rss_reader.nil?
      @rss_reader = rss_reader || -> { Dumps.rss }
      @warned = {}
      @counts = Hash.new(0)
      @out = OutputDir.new(@dir)
    end

    # "SIGUSR2", "usr2", "USR2" -> "USR2"; raises ArgumentError for a signal heapscope does not take.
    def self.signal_name(value)
      name = value.to_s.upcase.delete_prefix("SIG")
      return name if SIGNALS.include?(name) && Signal.list.key?(name)

      raise ArgumentError, "signal must be one of #{SIGNALS.join(", ")}, got #{value.inspect}"
    end

    # 1610612736 -> "1.5G" (for messages).
    def self.human(bytes)
      unit = %w[T G M K].find { |u| bytes >= UNITS[u] } || ""
      value = bytes.to_f / UNITS[unit]
      "#{value.round(1).to_s.delete_suffix(".0")}#{unit.empty? ? " bytes" : unit}"
    end

    # Resident set size in bytes (Linux), or nil.
    def self.rss
      Memory.resident[:rss]
    end

    # Starts the thread and installs the signal handler. Returns self. Raises ArgumentError when the
    # application already exits on the signal (a handler "EXIT"), which heapscope would change.
    def start
      return self if running?

      Heapscope.internal do
        @stopping = false
        @next_level = @threshold
        @last_rss_dump = nil
        @wake_r, @wake_w = IO.pipe
        preflight
        install_trap if @signal
        @thread = Heapscope.start_internal_thread("heapscope-dumps") { run }
        self
      end
    end

    def running?
      !@thread.nil? && @thread.alive?
    end

    # Stops the thread and gives the signal back to the handler it had. Returns nil.
    def stop
      @stopping = true
      wake
      @thread&.join(30)
      @thread = nil
      restore_trap
      [@wake_r, @wake_w].each { |io| io&.close unless io&.closed? }
      nil
    end

    # Counters: rss and signal profiles written, failed writes, RSS dumps held back by min_interval.
    def stats
      { rss: @counts[:rss], signal: @counts[:signal], failed: @counts[:failed], deferred: @counts[:deferred] }
    end

    # In a forked child: its own thread, its own RSS from the first level again, and the signal
    # taken back. A server's master may have trapped it after heapscope started (Puma traps USR1, USR2
    # and HUP for restarts); in a worker that handler has no meaning, so the child's signal goes to
    # heapscope, then to the handler the application had before heapscope started.
    def after_fork
      Heapscope.internal do
        @thread = nil
        @out.after_fork
        [@wake_r, @wake_w].each { |io| io&.close unless io&.closed? }
        @wake_r, @wake_w = IO.pipe
        @next_level = @threshold
        @last_rss_dump = nil
        Signal.trap(@signal, trap_handler) if @signal && !@stopping
        @thread = Heapscope.start_internal_thread("heapscope-dumps") { run } unless @stopping
      end
    end

    private

    # A new handler, remembered as ours (stop gives the signal back only while it is still ours).
    def trap_handler
      @handler = lambda do |signo|
        @signal_pending = true
        wake
        @previous.call(signo) if @previous.respond_to?(:call)
      end
    end

    def install_trap
      @previous = Signal.trap(@signal, trap_handler)
      return unless @previous == "EXIT"

      Signal.trap(@signal, @previous)
      @previous = nil
      raise ArgumentError, "the application exits on SIG#{@signal} (its handler is \"EXIT\"); choose another signal"
    end

    # Gives the signal back to the handler it had, unless someone trapped it after heapscope did
    # (then theirs stays).
    def restore_trap
      return unless @signal && defined?(@previous)

      current = Signal.trap(@signal, @previous.nil? ? "DEFAULT" : @previous)
      Signal.trap(@signal, current) unless current.equal?(@handler)
      remove_instance_variable(:@previous)
    rescue ArgumentError
      nil
    end

    # An unsafe directory is reported at start, not at the first dump (which may come weeks later), and
    # the directory checked then is where dumps go (OutputDir).
    def preflight
      if @threshold && !@own_rss_reader && Dumps.rss.nil?
        @warn.call("heapscope: RSS cannot be read here (no /proc/self/status): no profile will be written for RSS")
      end
      @out.open_if_present
    rescue StandardError => e
      warn_once(e)
    end

    # One byte into the pipe: the only thing done in trap context. A full pipe already holds a wake-up.
    def wake
      @wake_w&.write_nonblock(".", exception: false)
    rescue IOError
      nil
    end

    def run
      loop do
        ready = IO.select([@wake_r], nil, nil, @check_interval)
        @wake_r.read_nonblock(64, exception: false) if ready
        break if @stopping

        if @signal_pending
          @signal_pending = false
          write("signal", gc: true)
        end
        check_rss if @threshold
      end
    rescue StandardError => e
      warn_once(e)
    end

    def check_rss
      rss = @rss_reader.call
      return unless rss && rss >= @next_level

      now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      if @last_rss_dump && now - @last_rss_dump < @min_interval
        @counts[:deferred] += 1 unless @deferred
        @deferred = true
        return
      end
      @deferred = false
      @last_rss_dump = now
      write("rss", gc: false)
      # The next level above what RSS is now: one profile however many steps one reading jumped.
      @next_level = @threshold + (((rss - @threshold) / @step) + 1) * @step
    end

    def write(kind, gc:)
      Heapscope.internal do
        next unless @source.running?

        path = PeriodicWriter.profile_path(@dir, @app_name, kind)
        @out.write(File.basename(path), @source.profile(gc: gc, type: :heap))
        @counts[kind.to_sym] += 1
        path
      rescue StandardError => e
        @counts[:failed] += 1
        warn_once(e)
        nil
      end
    end

    def warn_once(error)
      return if @warned[error.class]

      @warned[error.class] = true
      @warn.call("heapscope: dump to #{@dir} failed: #{error.class}: #{error.message.sub(/ @ .*/m, "")}")
    end
  end
end
