# frozen_string_literal: true

require "securerandom"

module Heapscope
  # Raised when heapscope refuses to write into a directory that another user could tamper with.
  class UnsafeDirectoryError < StandardError; end

  # Every file heapscope writes (Heapscope.write, the periodic writer, the final profile of
  # autostart and `heapscope run`) goes through write_atomically, so one set of rules keeps a local
  # user from turning heapscope into a tool that overwrites files it can write (issue 11, item 3):
  #
  # - the temp file has an unpredictable name (SecureRandom) and is created with
  #   O_CREAT|O_EXCL|O_NOFOLLOW: a file or symlink planted at that name makes the open fail, it is
  #   never opened, truncated or followed;
  # - the final name is only ever rename(2)d onto, which replaces a symlink found there instead of
  #   following it (the file the link pointed at is untouched);
  # - a directory writable by every user without the sticky bit, or owned by another user (other
  #   than root), is refused with UnsafeDirectoryError: there anyone could swap heapscope's files
  #   or read them;
  # - on failure only the temp file this call created is removed, never a file of the same name
  #   that someone else created.
  #
  # Readers never see a partial file: the bytes are fsynced before the rename. Returns path.
  def self.write_atomically(path, data)
    path = path.to_s
    dir = File.dirname(path)
    AtomicWrite.check_directory(dir)
    file, tmp = AtomicWrite.create_temp(dir, File.basename(path))
    begin
      # Bytes as they are: with Encoding.default_internal set (Rails sets UTF-8) a text-mode file
      # would transcode a gzipped profile and fail.
      file.binmode
      file.write(data)
      file.flush
      file.fsync
      file.close
      File.rename(tmp, path)
      tmp = nil
    ensure
      begin
        # On a full disk close flushes the same buffered bytes and fails again; the temp file must
        # still go.
        file.close unless file.closed?
      rescue SystemCallError, IOError
        nil
      end
      AtomicWrite.remove(tmp) if tmp
    end
    path
  end

  module AtomicWrite
    # O_NOFOLLOW is POSIX; the constant is missing where the platform has none.
    NOFOLLOW = File.const_defined?(:NOFOLLOW) ? File::NOFOLLOW : 0
    CREATE_FLAGS = File::WRONLY | File::CREAT | File::EXCL | NOFOLLOW | File::BINARY
    # Names beside the final file: ".NAME.tmp-PID-HEX". The pid lets the periodic writer remove
    # temp files of dead processes; the 64 random bits make the name impossible to predict.
    TEMP_PATTERN = /\.tmp-(\d+)(?:-[0-9a-f]{16})?\z/.freeze

    class << self
      # Raises UnsafeDirectoryError when another user could replace files in dir (see above).
      # Group-writable directories are accepted: the group's members are trusted like the owner
      # (umask 002 with per-user groups makes every new directory group-writable).
      def check_directory(dir)
        link = File.lstat(dir)
        if link.symlink? && !trusted_owner?(link.uid)
          raise UnsafeDirectoryError, "refusing to write into #{dir}: it is a symlink owned by another user " \
                                      "(uid #{link.uid}), who chooses where it points; use a directory of your own"
        end
        stat = File.stat(dir)
        return unless stat.directory? # creating the temp file fails with the reason

        if (stat.mode & 0o002) != 0 && !stat.sticky?
          raise UnsafeDirectoryError, format("refusing to write into %s: every user may write there and it has no " \
                                             "sticky bit (mode %04o), so another user could replace heapscope's files; " \
                                             "chmod o-w or chmod +t it", dir, stat.mode & 0o7777)
        end
        return if trusted_owner?(stat.uid)

        raise UnsafeDirectoryError, "refusing to write into #{dir}: it belongs to another user (uid #{stat.uid}), " \
                                    "who could replace or read heapscope's files; use a directory of your own"
      end

      # Creates a new temp file beside the final one. Returns [File, path].
      def create_temp(dir, base)
        attempts = 0
        begin
          # NAME_MAX is 255 bytes: keep room for the suffix.
          tmp = File.join(dir, ".#{base.byteslice(0, 200).scrub("")}.tmp-#{Process.pid}-#{SecureRandom.hex(8)}")
          [File.open(tmp, CREATE_FLAGS, 0o644), tmp]
        rescue Errno::EEXIST, Errno::ELOOP
          # 64 random bits: a collision means someone is planting names; a few tries, then give up.
          attempts += 1
          retry if attempts < 3
          raise
        end
      end

      def remove(tmp)
        File.unlink(tmp)
      rescue SystemCallError
        nil
      end

      private

      def trusted_owner?(uid)
        uid == Process.euid || uid.zero?
      end
    end
  end
end
