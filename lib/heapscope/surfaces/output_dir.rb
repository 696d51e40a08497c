# frozen_string_literal: true

require_relative "../atomic_write"

module Heapscope
  # OutputDir is the directory where a PeriodicWriter or Dumps writes, held open: it is opened once
  # (AtomicWrite.open_directory: created if missing, every ancestor checked) and every write, listing
  # and deletion after that goes through that descriptor, never through the path again. So whatever
  # happens to the path once the directory is open (a parent swapped for a symlink), files go into
  # the directory that was checked, and only there.
  #
  #   out = Heapscope::OutputDir.new("/var/tmp/heap")
  #   stat = out.write("web-1-20261130T061500.123Z.heap.pb.gz", bytes)
  #   out.use { |dir| dir.entries }
  #
  # Each use checks the open directory again (by its descriptor): one made writable by every user, or
  # given to another user, since it was opened is refused until it is fixed, then opened afresh from
  # its path. So is one removed meanwhile (nothing written there could ever be read), and a forked
  # child opens its own. Thread-safe: one use at a time.
  class OutputDir
    attr_reader :path

    def initialize(path)
      @path = File.expand_path(path.to_s)
      @lock = Mutex.new
      @handle = nil
    end

    # Opens the directory now, if it exists, so that an unsafe one is reported at start and later
    # uses are anchored to what was checked then. Returns self; raises what opening raises.
    def open_if_present
      use { nil } if File.directory?(@path)
      self
    end

    # Yields the directory's Native::DirHandle (opened, and created, on first use) and returns what
    # the block returns. Raises UnsafeDirectoryError or SystemCallError when it cannot be opened.
    def use
      @lock.synchronize { yield current }
    end

    # Writes data to name atomically (AtomicWrite.write_in). Returns the File::Stat of the file written.
    def write(name, data)
      use { |dir| AtomicWrite.write_in(dir, name, data) }
    end

    def close
      @lock.synchronize { drop }
    end

    # In a forked child: the parent's descriptor is left to the parent (a child may close descriptors
    # it inherited), the next use opens the directory again.
    def after_fork
      @lock = Mutex.new
      drop
    end

    private

    def current
      drop if @handle && !still_usable?
      @handle ||= AtomicWrite.open_directory(@path, create: true).tap { @pid = Process.pid }
    end

    # False when the handle is to be opened afresh: in a forked child, or the directory was removed
    # (or the descriptor lost). Raises UnsafeDirectoryError, dropping the handle, when the directory
    # became unsafe: once it is fixed it is opened again from its path and checked all the way down.
    def still_usable?
      return false if @pid != Process.pid

      stat = @handle.stat
      return false if stat.nlink.zero?

      AtomicWrite.check_opened(stat, @path, @path)
      true
    rescue SystemCallError, IOError
      false
    rescue UnsafeDirectoryError
      drop
      raise
    end

    def drop
      @handle&.close
      @handle = nil
    end
  end
end
