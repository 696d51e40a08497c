# frozen_string_literal: true

require_relative "../atomic_write"
require_relative "../internal"
require_relative "output_dir"

module Heapscope
  # PeriodicWriter writes a heap profile to dir every interval seconds from a background thread,
  # keeps the newest keep files of the app, and writes a final one when asked (auto.rb does at exit).
  #
  #   writer = Heapscope::PeriodicWriter.new(dir: "/var/tmp/prof", interval: 60, keep: 48, app_name: "web").start
  #
  # Files are named APP-PID-YYYYMMDDTHHMMSS.mmmZ.heap.pb.gz (the final one ends -final.heap.pb.gz),
  # so forked children never collide with their parent. The directory is opened once (OutputDir:
  # every ancestor checked, then only its descriptor used) and each file written as AtomicWrite
  # writes: a hidden temp file with an unpredictable name (.NAME.tmp-PID-RANDOM), created
  # exclusively, fsynced, then renamed: a reader, or a kill -9 at any moment, sees whole profiles
  # only, and nothing planted in the directory, nor done to its path, can make it write elsewhere.
  #
  # Rotation counts and deletes only (1) the periodic files this process wrote, each checked (device
  # and inode, as fstat said when it was written) to still be that very file, and (2) files named like
  # this app's profiles that belong to this user, are plain files with one link, and are none of the
  # names this process wrote: those of its earlier runs, of its forked workers and of a parent.
  # Another user's file is never counted nor deleted, whatever its name and mtime. A final profile
  # this process wrote counts but is never deleted. Temp files of dead processes are removed on
  # rotation when they belong to this user. Failures (disk full, unwritable or unsafe dir) warn once per
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

    # APP-PID-STAMP.heap.pb.gz and APP-PID-STAMP-final.heap.pb.gz: what rotation counts.
    def self.rotated_name(app_name)
      /\A#{Regexp.escape(app_name)}-\d+-\d{8}T\d{6}\.\d{3}Z(-final)?#{Regexp.escape(SUFFIX)}\z/
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
      @out = OutputDir.new(@dir)
      @rotated_name = PeriodicWriter.rotated_name(@app_name)
      @temp_name = /\A\.#{Regexp.escape(@app_name)}-\d+-\d{8}T\d{6}\.\d{3}Z(?:-[a-z]+)?#{Regexp.escape(SUFFIX)}#{AtomicWrite::TEMP_PATTERN.source}/
      @mine = {} # name => File::Stat as written, for each file this process wrote and has not removed
      @finals = {} # names of the final profiles this process wrote: never removed
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

    # The profile files rotation counts (see above), oldest first.
    def files
      return [] unless File.directory?(@dir) # only to not create it: what is listed comes from the handle

      Heapscope.internal do
        @write_lock.synchronize { @out.use { |dir| counted(dir).map { |name, _| File.join(@dir, name) } } }
      end
    end

    # Counters: written, failed, removed (by rotation).
    def stats
      { written: @counts[:written], failed: @counts[:failed], removed: @counts[:removed] }
    end

    # In a forked child: the thread is gone; start again (names now carry the child's pid).
    def after_fork
      Heapscope.internal do
        reset_sync
        @out.after_fork
        # The parent's files are its own; the child counts them as the app's (by owner), no more.
        @mine = {}
        @finals = {}
        @thread = nil
        start unless @stopping
      end
    end

    private

    # The directory is opened now when it exists, so an unsafe one is reported when the writer starts,
    # not one interval later, and every write goes where it was when checked. (Each write checks the
    # open directory again: it may be fixed, or made unsafe, while the application runs.)
    def preflight
      @out.open_if_present
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
        name = File.basename(path)
        begin
          bytes = @source.profile(gc: gc, type: :heap)
          @mine[name] = @out.write(name, bytes)
          @finals[name] = true if final
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

    # Keeps the newest keep counted files (see above) and removes this user's temp files of dead
    # processes. A file that is not what rotation decided on when it comes to remove it (replaced,
    # given away, linked elsewhere) is left.
    def rotate
      @out.use do |dir|
        old = counted(dir)
        excess = old.size - @keep
        old.each do |name, stat|
          break if excess <= 0
          next if @finals[name]

          excess -= 1
          next unless remove(dir, name, stat)

          @mine.delete(name)
          @counts[:removed] += 1
        end
        dir.entries.grep(@temp_name).each do |name|
          pid = name[AtomicWrite::TEMP_PATTERN, 1].to_i
          next unless pid.positive? && pid != Process.pid && !alive?(pid)

          stat = stat_of(dir, name)
          remove(dir, name, stat) if stat && owned_plain_file?(stat)
        end
      end
    rescue StandardError => e
      warn_once(e) # the profile is written; rotation tries again after the next one
    end

    # [[name, stat]] of the files rotation counts, oldest first (mtime, then name).
    def counted(dir)
      names = dir.entries.grep(@rotated_name)
      present = names.to_h { |name| [name, true] }
      @mine.delete_if { |name, _| !present[name] } # gone: removed by another process of the app
      names.filter_map do |name|
        stat = stat_of(dir, name)
        next unless stat

        if (written = @mine[name])
          # Our name, but only while it still is the file we wrote.
          [name, stat] if same_file?(stat, written)
        elsif owned_plain_file?(stat)
          [name, stat]
        end
      end.sort_by { |name, stat| [stat.mtime, name] }
    end

    # The entry's own stat (a symlink is not followed), nil when it is gone.
    def stat_of(dir, name)
      dir.stat(name)
    rescue SystemCallError
      nil
    end

    # Only this user's own plain files: not another user's (root can delete them in a sticky directory,
    # which is no reason to), and not a hard link, whose other name belongs to someone else's file.
    def owned_plain_file?(stat)
      stat.file? && stat.uid == Process.euid && stat.nlink == 1
    end

    def same_file?(stat, other)
      stat.dev == other.dev && stat.ino == other.ino
    end

    # Unlinks name if it still is the file seen as stat. Returns true when it was removed.
    def remove(dir, name, stat)
      now = stat_of(dir, name)
      return false unless now && same_file?(now, stat)

      dir.unlink(name)
      true
    rescue SystemCallError
      false # another process of the app removed it first
    end

    def alive?(pid)
      Process.kill(0, pid)
      true
    rescue Errno::ESRCH
      false
    rescue Errno::EPERM
      true
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
