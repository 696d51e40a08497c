# frozen_string_literal: true

# A checkout used as a Bundler `path:` gem has no compiled extension (Bundler does not compile path
# gems): `require "heapscope"` must say what is missing and how to build it (issue 12), not only the
# path Ruby could not open.
require "minitest/autorun"
require "open3"
require "rbconfig"
require "tmpdir"
require "fileutils"

module CopiedLib
  ROOT = File.expand_path("..", __dir__)

  # Copies lib/ without any built extension into a temporary directory, lets the block add files to
  # it, then returns the stderr of `require "heapscope"` from that copy (which must fail).
  def require_error_from_copy
    Dir.mktmpdir("heapscope-noext") do |dir|
      FileUtils.cp_r(File.join(ROOT, "lib"), dir)
      Dir.glob(File.join(dir, "lib/heapscope/**/*.{so,bundle}")).each { |f| File.delete(f) }
      yield File.join(dir, "lib") if block_given?
      _, err, status = Open3.capture3(RbConfig.ruby, "--disable-gems", "-I", File.join(dir, "lib"), "-e", 'require "heapscope"')
      refute status.success?
      err
    end
  end
end

class TestMissingExtension < Minitest::Test
  include CopiedLib

  def test_require_without_the_extension_names_the_fix
    err = require_error_from_copy
    assert_includes err, "heapscope: its C extension (heapscope/heapscope.so) is not built for Ruby #{RUBY_VERSION}"
    assert_includes err, "bundle exec rake compile"
    assert_includes err, "gem build heapscope-profiler.gemspec"
    assert_includes err, "(LoadError)"
  end
end

# The prebuilt gem (rakelib/native_gem.rake) on a Ruby it holds no build for: the error names the
# builds it has and the source gem.
class TestPrebuiltForAnotherRuby < Minitest::Test
  include CopiedLib

  def test_require_names_the_rubies_the_prebuilt_gem_serves_and_the_source_gem
    err = require_error_from_copy do |lib|
      %w[2.9 9.8].each do |minor|
        FileUtils.mkdir_p(File.join(lib, "heapscope", minor))
        File.write(File.join(lib, "heapscope", minor, "heapscope.#{RbConfig::CONFIG["DLEXT"]}"), "not this Ruby's")
      end
    end
    assert_includes err, "heapscope: this prebuilt gem holds its C extension for Ruby 2.9, 9.8, not for #{RUBY_VERSION}"
    assert_includes err, "gem install heapscope-profiler --platform ruby"
    assert_includes err, "force_ruby_platform: true"
    assert_includes err, "(LoadError)"
  end
end
