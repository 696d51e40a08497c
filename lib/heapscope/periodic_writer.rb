# frozen_string_literal: true

require "fileutils"
require_relative "atomic_write"
require_relative "internal"

module Heapscope
  # PeriodicWriter writes a heap profile to dir every interval seconds from a background thread,
  # keeps the newest keep files of the app, and writes a final one when asked (auto.rb does at exit).
  #
  #   writer = Heapscope::PeriodicWriter.new(dir: "/var/tmp/prof", interval: 60, keep: 48, app_name: "web").start
  #
  # Files are named APP-PID-YYYYMMDDTHHMMSS.mmmZ.heap.pb.gz (the final one ends -final.heap.pb.gz),
  # so forked children never collide with their parent. Each is written by Heapscope.write_atomically
  # (atomic_write.rb): a hidden temp file with an unpredictable name (.NAME.tmp-PID-RANDOM), created
  # exclusively, fsynced, then renamed: a reader, or a kill -9 at any moment, sees whole profiles
  # only, and nothing planted in the directory can make it write elsewhere. Temp files left by dead
  # processes are removed on rotation. Failures (disk full, unwritable or unsafe dir) warn once per
  # error class and never raise. The thread excludes itself from sampling, and what runs on the
  # caller's thread (start, after_fork, write_now, write_final) runs in Heapscope.internal: the
  # writer's own objects never appear in the profiles it writes.
  class PeriodicWriter
    extend InternalNew

    SUFFIX = ".heap.pb.gz"
    APP_NAME = /\A[A-Za-z0-9_.\-]+\z/.freeze

    # The app_name every profile file name starts with; raises ArgumentError for a bad one (it goes
    # into file names and globs, so only these characters).
    def self.check_app_name(app_name)
      raise ArgumentError, "app_name must use only A-Z a-z 0-9 _ . -, got #{app_name.inspect}" unless app_name.to_s.match?(APP_NAME)

      app_name.to_s
    end

    # dir/APP-PID-STAMP[-tag].heap.pb.gz: the name of every profile file heapscope writes (periodic,
    # final, Dumps' rss and signal), so forked children never collide with their parent.
    def self.profile_path(dir, app_name, tag = nil)
      stamp = Time.now.utc.strftime("%Y%m%dT%H%M%S.%LZ")
      File.join(dir, "#{app_name}-#{Process.pid}-#{stamp}#{tag ? "-#{tag}" : ""}#{SUFFIX}")
    end

    # Writes a profile's bytes to path atomically, creating its directory if missing (0755 before the
    # umask: a directory heapscope creates is never writable by others). Raises what the write raises.
    def self.write_profile(path, bytes)
      FileUtils.mkdir_p(File.dirname(path), mode: 0o755)
      Heapscope.write_atomically(path, bytes)
    end

    attr_reader :dir, :interval, :keep, :app_name

    # source:   anything answering running? and profile(gc:, type:) (Heapscope by default).
    # warn:     where warnings go (a callable taking one line).
    # periodic: false writes no periodic files: start only checks the directory, and only write_now
    #           and write_final write (autostart's final profile when no output was asked for).
    def initialize(dir:, interval: 60, keep: 48, app_name: "ruby", source: nil, warn: nil, periodic: true)
      raise ArgumentError, "interval must be a number > 0, got #{interval.inspect}" unless interval.is_a?(Numeric) && interval.positive?
      raise ArgumentError, "keep must be an Integer >= 1, got #{keep.inspect}" unless keep.is_a?(Integer) && keep >= 1
      PeriodicWriter.check_app_name(app_name)

      @dir = File.expand_path(dir.to_s)
      @interval = interval
      @keep = keep
      @app_name = app_name.to_s
      @periodic = periodic
      @source = source || (require "heapscope"; Heapscope)
      @warn = warn || ->(line) { Kernel.warn(line) }
      @warned = {}
      @counts = Hash.new(0)
      reset_sync
    end

    # Starts the background thread. Returns self.
    def start
      Heapscope.internal do
        @stopping = false
        preflight
        if @periodic
          @thread = Heapscope.start_internal_thread("heapscope-writer") { run }
        end
        self
      end
    end

    def running?
      !@thread.nil? && @thread.alive?
    end

    # Stops the thread (waits for a write in progress). Returns nil.
    def stop
      @sync.synchronize do
        @stopping = true
        @wake.signal
      end
      @thread&.join(30)
      @thread = nil
      nil
    end

    # Writes one profile now. Returns the path, or nil when it failed (warned about once per error
    # class) or the profiler is not running.
    def write_now(final: false, gc: false)
      path, error = attempt(final: final, gc: gc)
      warn_once(error) if error
      error ? nil : path
    end

    # Writes the final profile, after a full GC unless gc: false, and reports the outcome instead
    # of warning, so the caller can say in one line what happened to it (a failure already warned
    # about by a periodic write would otherwise go unmentioned). Returns [path, nil] when written,
    # [path, error] when writing path failed, [nil, nil] when the profiler is not running.
    def write_final(gc: true)
      attempt(final: true, gc: gc)
    end

    # Profile files of this app in dir, oldest first.
    def files
      # app_name is limited to [A-Za-z0-9_.-], so it holds no glob metacharacters.
      pattern = /\A#{Regexp.escape(@app_name)}-\d+-\d{8}T\d{6}\.\d{3}Z(-final)?#{Regexp.escape(SUFFIX)}\z/
      Dir.glob("#{@app_name}-*#{SUFFIX}", base: @dir)
         .select { |name| name.match?(pattern) }
         .map { |name| File.join(@dir, name) }
         .sort_by { |f| [mtime(f), File.basename(f)] }
    end

    # Counters: written, failed, removed (by rotation).
    def stats
      { written: @counts[:written], failed: @counts[:failed], removed: @counts[:removed] }
    end

    # In a forked child: the thread is gone; start again (names now carry the child's pid).
    def after_fork
      Heapscope.internal do
        reset_sync
        @thread = nil
        start unless @stopping
      end
    end

    private

    # An unsafe directory is reported when the writer starts, not one interval later. (Each write
    # checks again: the directory may be fixed, or made unsafe, while the application runs.)
    def preflight
      Heapscope::AtomicWrite.check_directory(@dir) if File.directory?(@dir)
    rescue StandardError => e
      warn_once(e)
    end

    # One write. Returns [path, nil], [path, error] or [nil, nil] (not running); never raises.
    def attempt(final:, gc:)
      Heapscope.internal { attempt_locked(final, gc) }
    end

    def attempt_locked(final, gc)
      @write_lock.synchronize do
        return [nil, nil] unless @source.running?

        path = PeriodicWriter.profile_path(@dir, @app_name, final ? "final" : nil)
        begin
          PeriodicWriter.write_profile(path, @source.profile(gc: gc, type: :heap))
          @counts[:written] += 1
          rotate
          [path, nil]
        rescue StandardError => e
          @counts[:failed] += 1
          [path, e]
        end
      end
    rescue StandardError => e
      [nil, e]
    end

    def reset_sync
      @sync = Mutex.new
      @wake = ConditionVariable.new
      @write_lock = Mutex.new
    end

    def run
      deadline = clock + @interval
      loop do
        @sync.synchronize do
          loop do
            break if @stopping

            left = deadline - clock
            break if left <= 0

            @wake.wait(@sync, left)
          end
        end
        break if @stopping

        write_now
        # The next tick on the original schedule; skip ticks a slow write overran.
        deadline += @interval while deadline <= clock
      end
    rescue StandardError => e
      warn_once(e)
    end

    # Keeps the newest keep files of the app (any pid) and removes temp files of dead processes.
    def rotate
      old = files
      old.first([old.size - @keep, 0].max).each do |f|
        File.unlink(f)
        @counts[:removed] += 1
      rescue Errno::ENOENT
        nil # another process of the app rotated it first
      rescue SystemCallError
        nil # not ours to remove (another user's file in a sticky directory): the write still counts
      end
      Dir.glob(".#{@app_name}-*#{SUFFIX}.tmp-*", base: @dir).each do |name|
        tmp = File.join(@dir, name)
        # .NAME.tmp-PID-RANDOM (and .NAME.tmp-PID from older versions). unlink removes a planted
        # symlink itself, never what it points at.
        pid = tmp[AtomicWrite::TEMP_PATTERN, 1].to_i
        File.unlink(tmp) if pid.positive? && !alive?(pid)
      rescue SystemCallError
        nil
      end
    end

    def alive?(pid)
      Process.kill(0, pid)
      true
    rescue Errno::ESRCH
      false
    rescue Errno::EPERM
      true
    end

    # The entry's own time: a symlink planted under a profile's name is not followed.
    def mtime(path)
      File.lstat(path).mtime
    rescue Errno::ENOENT
      Time.at(0)
    end

    def warn_once(error)
      return if @warned[error.class]

      @warned[error.class] = true
      @warn.call("heapscope: cannot write profiles to #{@dir}: #{error.class}: #{error.message} " \
                 "(further #{error.class} failures are not reported)")
    end

    def clock
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
