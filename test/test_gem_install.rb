# frozen_string_literal: true

require "minitest/autorun"
require "fileutils"
require "open3"
require "rbconfig"
require "tmpdir"

# The gem as a user gets it (issue 16: gem install failed on Ruby 3.4 and 4.0): `gem build` of the
# gemspec, `gem install` of the .gem into an empty GEM_HOME (compiling the extension there, outside the
# checkout), then a fresh process that requires it from that GEM_HOME alone and counts exactly.
class TestGemInstall < Minitest::Test
  ROOT = File.expand_path("..", __dir__)

  def test_the_built_gem_installs_and_counts_exactly_from_an_empty_gem_home
    Dir.mktmpdir("heapscope-gem") do |dir|
      gem = RbConfig.ruby.sub(/ruby([\d.]*)\z/, 'gem\1')
      gem = "gem" unless File.executable?(gem)
      out, status = Open3.capture2e(gem, "build", File.join(ROOT, "heapscope.gemspec"), "--output", File.join(dir, "heapscope.gem"), chdir: ROOT)
      assert status.success?, "gem build failed:\n#{out}"
      home = File.join(dir, "home")
      env = { "GEM_HOME" => home, "GEM_PATH" => home, "RUBYOPT" => nil, "BUNDLE_GEMFILE" => nil, "RUBYLIB" => nil }
      out, status = Open3.capture2e(env, gem, "install", "--local", "--no-document", File.join(dir, "heapscope.gem"), chdir: dir)
      assert status.success?, "gem install failed:\n#{out}"
      script = <<~'RUBY'
        require "heapscope"
        raise "loaded from the checkout: #{$LOADED_FEATURES.grep(/heapscope\.so/)}" unless $LOADED_FEATURES.grep(/heapscope\.so/).all? { |f| f.start_with?(ENV["GEM_HOME"]) }
        Heapscope.start(sample_every: 1, max_overhead: nil)
        keep = Array.new(321) { Object.new }
        GC.start
        live = Heapscope::Native::LIVENESS
        prof = Heapscope.profile(gc: true)
        require "heapscope/pprof"
        decoded = Heapscope::Pprof.decode(prof)
        n = decoded.samples.select { |s| s.labels["class"] == "Object" && s.frames.first&.line == 4 }.sum { |s| s.value("inuse_objects") }
        puts "#{n} #{live}"
      RUBY
      out, status = Open3.capture2e(env, RbConfig.ruby, "-e", script, chdir: dir)
      assert status.success?, "the installed gem failed:\n#{out}"
      count, mechanism = out.lines.last.split
      assert_equal "321", count, "exactly the objects kept at line 4 (mark bits read with #{mechanism})"
    end
  end
end
