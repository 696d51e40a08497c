# frozen_string_literal: true

# A checkout used as a Bundler `path:` gem has no compiled extension (Bundler does not compile path
# gems): `require "heapscope"` must say what is missing and how to build it (issue 12), not only the
# path Ruby could not open.
require "minitest/autorun"
require "open3"
require "rbconfig"
require "tmpdir"
require "fileutils"

class TestMissingExtension < Minitest::Test
  ROOT = File.expand_path("..", __dir__)

  def test_require_without_the_extension_names_the_fix
    Dir.mktmpdir("heapscope-noext") do |dir|
      FileUtils.cp_r(File.join(ROOT, "lib"), dir)
      Dir.glob(File.join(dir, "lib/heapscope/*.{so,bundle}")).each { |f| File.delete(f) }
      _, err, status = Open3.capture3(RbConfig.ruby, "--disable-gems", "-I", File.join(dir, "lib"), "-e", 'require "heapscope"')
      refute status.success?
      assert_includes err, "heapscope: its C extension (heapscope/heapscope.so) is not built for Ruby #{RUBY_VERSION}"
      assert_includes err, "bundle exec rake compile"
      assert_includes err, "gem build heapscope-profiler.gemspec"
      assert_includes err, "(LoadError)"
    end
  end
end
