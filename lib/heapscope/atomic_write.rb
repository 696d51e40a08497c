# frozen_string_literal: true

module Heapscope
  # Writes data to path so that no reader ever sees a partial file: the bytes go to tmp (by default a
  # unique name beside path, so the rename stays within one file system), are fsynced, and the file is
  # renamed over path. On any error the temp file is removed and the error raised. Returns path.
  def self.write_atomically(path, data, tmp: nil)
    tmp ||= "#{path}.tmp-#{Process.pid}-#{rand(1 << 32).to_s(16)}"
    begin
      File.open(tmp, File::WRONLY | File::CREAT | File::TRUNC | File::BINARY, 0o644) do |f|
        f.write(data)
        f.flush
        f.fsync
      end
      File.rename(tmp, path)
    ensure
      File.unlink(tmp) if File.exist?(tmp)
    end
    path
  end
end
