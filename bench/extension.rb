# frozen_string_literal: true

require "fileutils"
require "open3"
require "rbconfig"

module Bench
  # bench's own C extensions (bench/emptyhook for bench/run, bench/hooktoggle for its scripts), never part
  # of the gem. build compiles one for the running Ruby into tmp/bench/NAME unless a build newer than its
  # sources is there, and returns that directory (for -I); on a failed build it aborts with the log's end.
  module Extension
    TMP = File.expand_path("../tmp/bench", __dir__)

    def self.build(name)
      src = File.join(__dir__, name)
      dir = File.join(TMP, name)
      built = Dir[File.join(dir, "*.#{RbConfig::CONFIG["DLEXT"]}")].first
      return dir if built && Dir[File.join(src, "*")].none? { |f| File.mtime(f) > File.mtime(built) }

      FileUtils.mkdir_p(dir)
      log = File.join(TMP, "#{name}-build.log")
      out, status = Open3.capture2e("sh", "-c", "#{RbConfig.ruby} #{File.join(src, "extconf.rb")} && make -s V=0", chdir: dir)
      File.write(log, out)
      abort "bench: building bench/#{name} failed (#{log}):\n#{out.lines.last(10).join}" unless status.success?
      dir
    end
  end
end
