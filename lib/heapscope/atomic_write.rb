# frozen_string_literal: true

require "securerandom"

module Heapscope
  # Raised when heapscope refuses to write into a directory that another user could tamper with.
  class UnsafeDirectoryError < StandardError; end

  # Every file heapscope writes (Heapscope.write, the periodic writer, the final profile of
  # autostart and `heapscope run`, dumps) goes through AtomicWrite, so one set of rules keeps a local
  # user from turning heapscope into a tool that writes or deletes where they choose (issue 11, item
  # 3; issue 12, item 5):
  #
  # - the directory is opened once (open_directory), walking down from "/" one name at a time, and
  #   every later operation is relative to that descriptor (Native::DirHandle: openat, renameat,
  #   unlinkat): swapping the path for a symlink afterwards changes nothing about where files go;
  # - on the way down every directory (the target and each ancestor) must belong to root or to this
  #   user and must not be writable by every user unless it has the sticky bit, and every symlink
  #   followed must belong to root or to this user, as careful daemons check (sshd's StrictModes):
  #   otherwise its owner could put another directory in its place. Refused with
  #   UnsafeDirectoryError naming the offending directory or symlink;
  # - the temp file has an unpredictable name (SecureRandom) and is created with
  #   O_CREAT|O_EXCL|O_NOFOLLOW: a file or symlink planted at that name makes the open fail, it is
  #   never opened, truncated or followed;
  # - the final name is only ever renamed onto, which replaces a symlink found there instead of
  #   following it (the file the link pointed at is untouched);
  # - on failure only the temp file this call created is removed (checked by device and inode),
  #   never a file of the same name that someone else created.
  #
  # Group-writable directories are accepted: the group's members are trusted like the owner
  # (umask 002 with per-user groups makes every new directory group-writable).
  #
  # Readers never see a partial file: the bytes are fsynced before the rename. Returns path.
  def self.write_atomically(path, data)
    path = path.to_s
    dir = AtomicWrite.open_directory(File.dirname(path))
    begin
      AtomicWrite.write_in(dir, File.basename(path), data)
    ensure
      dir.close
    end
    path
  end

  module AtomicWrite
    # O_NOFOLLOW is POSIX; the constant is missing where the platform has none.
    NOFOLLOW = File.const_defined?(:NOFOLLOW) ? File::NOFOLLOW : 0
    # Names beside the final file: ".NAME.tmp-PID-HEX". The pid lets the periodic writer remove
    # temp files of dead processes; the 64 random bits make the name impossible to predict.
    TEMP_PATTERN = /\.tmp-(\d+)(?:-[0-9a-f]{16})?\z/.freeze
    # Symlinks followed while opening one directory, as the kernel's own limit (MAXSYMLINKS).
    MAX_SYMLINKS = 40

    class << self
      # Heapscope::Native::DirHandle, loading the extension when only this file was required (the
      # report CLI, a PeriodicWriter used alone).
      def dir_handle
        require_relative "../heapscope" unless defined?(Heapscope::Native::DirHandle)
        Heapscope::Native::DirHandle
      end

      # Opens dir (created, mode 0755 before the umask, where missing when create is true) and returns
      # its Native::DirHandle; the caller closes it. Raises UnsafeDirectoryError when another user
      # could replace it or one of its ancestors (see write_atomically), SystemCallError when a part
      # of the path is missing or not a directory.
      def open_directory(dir, create: false)
        shown = dir.to_s
        pending = File.expand_path(shown).split("/").reject(&:empty?)
        parents = [] # handles of the directories above the current one (for "..")
        names = []   # the physical path walked so far
        links = 0
        current = dir_handle.root
        check_opened(current.stat, shown, "/", last: pending.all?("."))
        until pending.empty?
          name = pending.shift
          next if name == "."

          if name == ".."
            # Above the directory reached, not above the name as written: "/..", like the kernel, is "/".
            next if parents.empty?

            current.close
            current = parents.pop
            names.pop
            next
          end
          entry = lookup(current, name, create)
          here = "/#{(names + [name]).join("/")}"
          if entry.symlink?
            check_symlink(entry, shown, here, last: pending.all?("."))
            links += 1
            raise Errno::ELOOP, "#{shown} (more than #{MAX_SYMLINKS} symlinks)" if links > MAX_SYMLINKS

            target = current.readlink(name)
            if target.start_with?("/")
              (parents << current).each(&:close)
              parents = []
              names = []
              current = dir_handle.root
            end
            pending = target.split("/").reject(&:empty?) + pending
            next
          end
          # O_NOFOLLOW: a symlink put there since the lookup makes this fail (ENOTDIR), never followed.
          child = current.open_dir(name)
          parents << current
          current = child
          names << name
          check_opened(current.stat, shown, here, last: pending.all?("."))
        end
        parents.each(&:close)
        current
      rescue StandardError
        parents&.each(&:close)
        current&.close
        raise
      end

      # Raises UnsafeDirectoryError when another user could replace files in dir (see above).
      def check_directory(dir)
        open_directory(dir).close
        nil
      end

      # Raises UnsafeDirectoryError when stat, a directory opened on the way to shown (at here, the
      # last one when last), may be replaced or written by another user.
      def check_opened(stat, shown, here, last: true)
        if (stat.mode & 0o002) != 0 && !stat.sticky?
          raise UnsafeDirectoryError, format("refusing to write into %s: every user may write there and it has no " \
                                             "sticky bit (mode %04o), so another user could replace heapscope's files; " \
                                             "chmod o-w or chmod +t it", shown, stat.mode & 0o7777) if last

          raise UnsafeDirectoryError, format("refusing to write into %s: its ancestor %s may be written by every user and " \
                                             "has no sticky bit (mode %04o), so another user could put another directory " \
                                             "in its place; chmod o-w or chmod +t %s", shown, here, stat.mode & 0o7777, here)
        end
        return if trusted_owner?(stat.uid)

        if last
          raise UnsafeDirectoryError, "refusing to write into #{shown}: it belongs to another user (uid #{stat.uid}), " \
                                      "who could replace or read heapscope's files; use a directory of your own"
        end
        raise UnsafeDirectoryError, "refusing to write into #{shown}: its ancestor #{here} belongs to another user " \
                                    "(uid #{stat.uid}), who could put another directory in its place; use a directory " \
                                    "whose parents all belong to you or root"
      end

      # Writes data to name in the directory handle dir atomically (see write_atomically). Returns the
      # File::Stat of the file written (its device and inode say later whether an entry still is it).
      def write_in(dir, name, data)
        attempts = 0
        begin
          dir.write_replace(temp_name(name), name, data, 0o644)
        rescue Errno::EEXIST, Errno::ELOOP
          # 64 random bits: a collision means someone is planting names; a few tries, then give up.
          attempts += 1
          retry if attempts < 3
          raise
        end
      end

      # ".NAME.tmp-PID-RANDOM". NAME_MAX is 255 bytes: the name is cut to keep room for the suffix.
      def temp_name(name)
        ".#{name.byteslice(0, 200).scrub("")}.tmp-#{Process.pid}-#{SecureRandom.hex(8)}"
      end

      def trusted_owner?(uid)
        uid == Process.euid || uid.zero?
      end

      private

      # The entry name in dir, not following a symlink; created as a directory first when missing
      # and create is true.
      def lookup(dir, name, create)
        dir.stat(name)
      rescue Errno::ENOENT
        raise unless create

        begin
          dir.mkdir(name, 0o755)
        rescue Errno::EEXIST
          nil # made meanwhile by someone else: checked like any other once opened
        end
        dir.stat(name)
      end

      # A symlink is where its owner wants: only root's and this user's are followed.
      def check_symlink(stat, shown, here, last:)
        return if trusted_owner?(stat.uid)

        subject = last ? "it is a symlink" : "#{here} is a symlink"
        raise UnsafeDirectoryError, "refusing to write into #{shown}: #{subject} owned by another user (uid #{stat.uid}), " \
                                    "who chooses where it points; use a directory of your own"
      end
    end
  end
end
