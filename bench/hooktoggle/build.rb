# frozen_string_literal: true

require "rbconfig"
require "fileutils"

# Builds the bench-only HookToggle extension into tmp/bench/hooktoggle and returns that directory (for
# -I in the fresh processes that run.rb and pin.rb start).
module HookToggleBuild
  ROOT = File.expand_path("../..", __dir__)

  def self.build
    dir = File.join(ROOT, "tmp/bench/hooktoggle")
    FileUtils.mkdir_p(dir)
    Dir.chdir(dir) do
      system(RbConfig.ruby, File.join(__dir__, "extconf.rb"), out: File::NULL) or abort "extconf failed"
      system("make", "-s", out: File::NULL) or abort "make failed"
    end
    dir
  end
end
