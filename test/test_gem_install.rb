# frozen_string_literal: true

require "minitest/autorun"
require "fileutils"
require "open3"
require "rbconfig"
require "rubygems/package"
require "tmpdir"

# The gem as a user gets it, outside the checkout (issue 16: gem install failed on Ruby 3.4 and 4.0;
# issue 12: the README's Install steps): `gem build` of the gemspec with no warning, `gem install` of
# the .gem into an empty GEM_HOME (compiling the extension there), then the same small application
# run three ways: plain `ruby` from that GEM_HOME, `bundle exec` in a Bundler app whose Gemfile names
# the installed gem, and `bundle exec` in a Bundler app that takes the gem from a `git:` source (which
# Bundler compiles itself). Each run must count exactly and load the extension from outside the checkout.
class TestGemInstall < Minitest::Test
  ROOT = File.expand_path("..", __dir__)
  GEMSPEC = File.join(ROOT, "heapscope-profiler.gemspec")
  NAME = "heapscope-profiler"

  # The application: 321 objects kept at line 4, counted exactly (sample_every 1).
  APP = <<~'RUBY'
    require "heapscope"
    raise "loaded from the checkout: #{$LOADED_FEATURES.grep(/heapscope\.so/)}" if $LOADED_FEATURES.grep(/heapscope\.so/).any? { |f| f.start_with?(ENV.fetch("HEAPSCOPE_TEST_CHECKOUT")) }
    Heapscope.start(sample_every: 1, max_overhead: nil)
    keep = Array.new(321) { Object.new }
    GC.start
    live = Heapscope::Native::LIVENESS
    prof = Heapscope.profile(gc: true)
    require "heapscope/pprof"
    decoded = Heapscope::Pprof.decode(prof)
    n = decoded.samples.select { |s| s.labels["class"] == "Object" && s.frames.first&.line == 4 }.sum { |s| s.value("inuse_objects") }
    puts "#{n} #{live} #{$LOADED_FEATURES.grep(/heapscope\.so/).first}"
  RUBY

  def setup
    @dir = Dir.mktmpdir("heapscope-gem")
    @home = File.join(@dir, "home")
    # Nothing of the checkout's Bundler or load path leaks into the user's processes: every BUNDLE_*
    # and BUNDLER_* variable of `bundle exec` is unset (newer RubyGems require BUNDLER_SETUP at boot).
    @env = ENV.keys.grep(/\ABUNDLER?_/).to_h { |k| [k, nil] }
    @env.merge!("GEM_HOME" => @home, "GEM_PATH" => @home, "RUBYOPT" => nil, "RUBYLIB" => nil,
                "BUNDLE_USER_HOME" => File.join(@dir, "bundle-home"), "HEAPSCOPE_TEST_CHECKOUT" => ROOT)
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  def tool(name)
    path = RbConfig.ruby.sub(/ruby([\d.]*)\z/, "#{name}\\1")
    File.executable?(path) ? path : name
  end

  def built_and_installed_gem
    out, status = Open3.capture2e(tool("gem"), "build", GEMSPEC, "--output", File.join(@dir, "#{NAME}.gem"), chdir: ROOT)
    assert status.success?, "gem build failed:\n#{out}"
    refute_match(/warning/i, out, "gem build warns (homepage, license, metadata)")
    out, status = Open3.capture2e(@env, tool("gem"), "install", "--local", "--no-document", File.join(@dir, "#{NAME}.gem"), chdir: @dir)
    assert status.success?, "gem install failed:\n#{out}"
  end

  # Runs APP (in app_dir, with bundle exec when bundled) and checks it counted exactly; returns the
  # path of the extension it loaded.
  def assert_app_counts_exactly(app_dir, bundled:)
    File.write(File.join(app_dir, "app.rb"), APP)
    cmd = bundled ? [tool("bundle"), "exec", RbConfig.ruby, "app.rb"] : [RbConfig.ruby, "app.rb"]
    out, status = Open3.capture2e(@env, *cmd, chdir: app_dir)
    assert status.success?, "the application failed:\n#{out}"
    count, mechanism, so = out.lines.last.split
    assert_equal "321", count, "exactly the objects kept at line 4 (mark bits read with #{mechanism})"
    so
  end

  def bundle_install(app_dir, gemfile, *flags)
    File.write(File.join(app_dir, "Gemfile"), gemfile)
    out, status = Open3.capture2e(@env.merge("BUNDLE_PATH" => File.join(@dir, "bundle")), tool("bundle"), "install", *flags,
                                  chdir: app_dir)
    assert status.success?, "bundle install failed:\n#{out}"
    @env["BUNDLE_PATH"] = File.join(@dir, "bundle")
  end

  def test_the_built_gem_installs_and_counts_exactly_from_an_empty_gem_home
    built_and_installed_gem
    app = File.join(@dir, "plain")
    FileUtils.mkdir_p(app)
    so = assert_app_counts_exactly(app, bundled: false)
    assert so.start_with?(@home), "the extension came from the GEM_HOME: #{so}"
  end

  # README, Install: `gem "heapscope-profiler"` in a Bundler app, with the gem installed as above.
  def test_a_bundler_app_uses_the_installed_gem
    built_and_installed_gem
    app = File.join(@dir, "app")
    FileUtils.mkdir_p(app)
    # --local: resolved from the installed gems only (the registry's copy of this gem is not ours).
    File.write(File.join(app, "Gemfile"), %(source "https://rubygems.org"\ngem "#{NAME}"\n))
    out, status = Open3.capture2e(@env, tool("bundle"), "install", "--local", chdir: app)
    assert status.success?, "bundle install failed:\n#{out}"
    so = assert_app_counts_exactly(app, bundled: true)
    assert so.start_with?(@home), "the extension came from the GEM_HOME: #{so}"
  end

  # README, Install: the prebuilt x86_64-linux gem, installed and used by a Bundler app with no
  # compiler, make or headers reachable on PATH. CI builds it once for every Ruby it covers (.ci/run)
  # and passes it in HEAPSCOPE_NATIVE_GEM; otherwise the test builds one that holds this Ruby's
  # extension (rake native_gem RUBIES=this).
  def test_the_prebuilt_gem_installs_and_runs_with_no_compiler
    minor = RUBY_VERSION[/\A\d+\.\d+/]
    gem = ENV["HEAPSCOPE_NATIVE_GEM"] || build_native_gem
    contents = Gem::Package.new(gem).contents
    (ENV.fetch("HEAPSCOPE_NATIVE_GEM_RUBIES", "").split | [minor]).each do |wanted|
      assert_includes contents, "lib/heapscope/#{wanted}/heapscope.so", "the prebuilt gem's extension for Ruby #{wanted}"
    end
    assert_empty Gem::Package.new(gem).spec.extensions, "the prebuilt gem compiles nothing"
    # PATH: ruby, gem and bundle only.
    bin = File.join(@dir, "bin")
    FileUtils.mkdir_p(bin)
    { "ruby" => RbConfig.ruby, File.basename(RbConfig.ruby) => RbConfig.ruby, "gem" => which(tool("gem")),
      "bundle" => which(tool("bundle")) }.each { |name, target| FileUtils.ln_sf(target, File.join(bin, name)) }
    @env["PATH"] = bin
    _, status = Open3.capture2e(@env, "/bin/sh", "-c", "command -v cc || command -v gcc || command -v clang || command -v make")
    refute status.success?, "a compiler or make is reachable on the test's PATH"
    out, status = Open3.capture2e(@env, "gem", "install", "--local", "--no-document", gem, chdir: @dir)
    assert status.success?, "gem install of the prebuilt gem failed:\n#{out}"
    app = File.join(@dir, "app")
    FileUtils.mkdir_p(app)
    File.write(File.join(app, "Gemfile"), %(source "https://rubygems.org"\ngem "#{NAME}"\n))
    out, status = Open3.capture2e(@env, "bundle", "install", "--local", chdir: app)
    assert status.success?, "bundle install failed:\n#{out}"
    assert_includes File.read(File.join(app, "Gemfile.lock")), "#{NAME} (#{Gem::Package.new(gem).spec.version}-x86_64-linux)"
    so = assert_app_counts_exactly(app, bundled: true)
    assert so.start_with?(@home), "the extension came from the GEM_HOME: #{so}"
    assert so.end_with?("/lib/heapscope/#{minor}/heapscope.so"), "this Ruby's prebuilt extension: #{so}"
  end

  def build_native_gem
    out, status = Open3.capture2e({ "NATIVE_GEM_DIR" => @dir, "RUBIES" => "this" }, RbConfig.ruby,
                                  Gem.bin_path("rake", "rake"), "native_gem", chdir: ROOT)
    assert status.success?, "rake native_gem failed:\n#{out}"
    path = out.lines.last.strip
    assert File.file?(path), "rake native_gem's last line names the gem: #{out}"
    path
  end

  # An absolute path for a command name (tool may return a bare name found on PATH).
  def which(command)
    return command if command.include?("/")

    found = ENV["PATH"].split(File::PATH_SEPARATOR).map { |dir| File.join(dir, command) }.find { |p| File.executable?(p) }
    found || flunk("#{command} is not on PATH")
  end

  # README, Install: `gem "heapscope-profiler", git: "..."` for unreleased code. The repository holds
  # exactly the gemspec's files (as a commit of the project would), so the test does not depend on
  # the checkout being a git repository.
  def test_a_bundler_app_takes_the_gem_from_a_git_source_and_builds_it
    repo = File.join(@dir, "repo")
    files = Dir.chdir(ROOT) { Gem::Specification.load(GEMSPEC).files } + [File.basename(GEMSPEC)]
    assert_includes files, "ext/heapscope/extconf.rb"
    files.each do |f|
      FileUtils.mkdir_p(File.dirname(File.join(repo, f)))
      FileUtils.cp(File.join(ROOT, f), File.join(repo, f))
    end
    git = ["git", "-c", "user.name=heapscope test", "-c", "user.email=test@localhost", "-c", "init.defaultBranch=main"]
    [%w[init -q], %w[add -A], %w[commit -q -m release]].each do |args|
      out, status = Open3.capture2e(*git, *args, chdir: repo)
      assert status.success?, "git #{args.first}: #{out}"
    end
    app = File.join(@dir, "app")
    FileUtils.mkdir_p(app)
    bundle_install(app, %(source "https://rubygems.org"\ngem "#{NAME}", git: #{repo.inspect}\n))
    so = assert_app_counts_exactly(app, bundled: true)
    assert so.start_with?(File.join(@dir, "bundle")), "the extension Bundler built from the git source: #{so}"
  end
end
