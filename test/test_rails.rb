# frozen_string_literal: true

require_relative "test_http_helper"
require "open3"
require "stringio"

# The Railtie (lib/heapscope/surfaces/rails.rb) in a real minimal Rails app written here: railties and
# actionpack from the Gemfile's rails group, served by Puma, read by `go tool pprof` through the
# endpoint the app mounts in its routes. Which processes profile (server, cluster workers, not rake
# or a console) and what a bad setting says are checked in child processes, since autostart runs once
# per process.
class TestRails < Minitest::Test
  include SurfacesTestHelper

  APP_RB = <<~'RUBY'
    require "logger"
    require "rails"
    require "action_controller/railtie"
    require "heapscope"

    class LeakApp < Rails::Application
      config.root = __dir__
      config.eager_load = false
      config.logger = Logger.new(nil)
      config.secret_key_base = "0" * 64
      config.hosts.clear
      # Every sampled allocation seen: this test is about the integration, not the windows.
      config.heapscope.sample_every = 50
      config.heapscope.sampling = :always
      config.heapscope.final = false
    end
  RUBY

  CONFIG_RU = <<~'RUBY'
    require_relative "app"
    LeakApp.initialize!
    LeakApp.routes.draw do
      get "/leak", to: "leaks#create"
      get "/", to: "leaks#index"
      # The app's own constraint: only requests addressed to 127.0.0.1 reach the profiles.
      mount Heapscope::Rack.app, at: "/debug/pprof", constraints: { host: "127.0.0.1" }
    end
    run LeakApp
  RUBY

  CONTROLLER = <<~'RUBY'
    class LeaksController < ActionController::Base
      KEPT = []

      def index
        render plain: "pid #{Process.pid}\n"
      end

      def create
        500.times { |i| KEPT << "kept #{i} " * 4 } # CONTROLLER LEAK
        render plain: "kept #{KEPT.size}\n"
      end
    end
  RUBY

  # The line said when profiling starts (RailsIntegration.started_line).
  STARTED = /\Aheapscope: profiling this Rails process \(pid \d+\): .* silences this line\n\z/.freeze

  def setup
    skip_unless_native
    begin
      require "rails/version"
    rescue LoadError
      skip "railties is not installed (bundle install: the Gemfile's rails group)"
    end
    @tmp = Dir.mktmpdir("heapscope-rails")
    File.write(File.join(@tmp, "app.rb"), APP_RB)
    File.write(File.join(@tmp, "config.ru"), CONFIG_RU)
    FileUtils.mkdir_p(File.join(@tmp, "app/controllers"))
    File.write(File.join(@tmp, "app/controllers/leaks_controller.rb"), CONTROLLER)
  end

  def teardown
    reap_children
    FileUtils.rm_rf(@tmp) if @tmp
  end

  # The child's environment: heapscope from this checkout, no autostart, no HEAPSCOPE_* of ours.
  def child_env(extra = {})
    cleared = ENV.keys.grep(/\AHEAPSCOPE_/).to_h { |name| [name, nil] }
    cleared.merge("RUBYLIB" => LIB, "RUBYOPT" => "-I#{LIB} #{ENV["RUBYOPT"]}".strip).merge(extra)
  end

  # Loads the app the way a runner, a rake task or a console would, runs code, returns [stdout, stderr].
  def in_app(code, env: {})
    script = "require_relative 'app'\n#{code}"
    out, err, status = Timeout.timeout(120) { Open3.capture3(child_env(env), RbConfig.ruby, "-e", script, chdir: @tmp) }
    assert status.success?, "the child failed: #{err}"
    [out, err]
  end

  def start_puma(*args)
    puma = Gem.bin_path("puma", "puma")
    port = free_port
    pid, out, err = spawn_child(child_env, RbConfig.ruby, puma, "-b", "tcp://127.0.0.1:#{port}", *args,
                                File.join(@tmp, "config.ru"), dir: @tmp)
    wait_for("puma to serve the app", timeout: 60) do
      http_get(port, "/").first == 200
    rescue SystemCallError
      false
    end
    [pid, port, out, err]
  end

  def leak_line
    "leaks_controller.rb:#{CONTROLLER.lines.index { |l| l.include?("# CONTROLLER LEAK") } + 1}"
  end

  def test_go_tool_pprof_finds_a_controller_leak_through_the_mounted_endpoint
    skip_unless_go
    _pid, port, _out, err = start_puma
    20.times { assert_equal 200, http_get(port, "/leak").first }
    heap = pprof_top("http://127.0.0.1:#{port}/debug/pprof/heap?gc=1", "inuse_objects")
    assert_includes top_row(heap), leak_line, heap
    assert_includes pprof_top("http://127.0.0.1:#{port}/debug/pprof/allocs", "alloc_space"), leak_line
    # The Railtie labels each action's samples endpoint=Controller#action (lib/heapscope/surfaces/rails.rb).
    _, _, bytes = http_get(port, "/debug/pprof/allocs")
    File.binwrite(profile = File.join(@tmp, "allocs.pb.gz"), bytes)
    assert_includes pprof_top(profile, "alloc_objects", tagfocus: "endpoint=LeaksController#create"), leak_line
    refute_includes pprof_top(profile, "alloc_objects", tagfocus: "endpoint=LeaksController#index"), leak_line
    # The index links below the mount point; the app's constraint keeps other hosts out (Rails' 404).
    status, _, body = http_get(port, "/debug/pprof/")
    assert_equal 200, status
    assert_includes body, 'href="/debug/pprof/heap?debug=1"'
    status, = raw_request(port, "GET /debug/pprof/heap HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    assert_equal 404, status
    said = File.read(err).lines.grep(/heapscope/)
    assert_equal 1, said.grep(STARTED).size, said.join
    assert_equal [], said.grep_v(STARTED), "heapscope said more than its start line in a good configuration"
  end

  def test_every_puma_cluster_worker_profiles_itself_with_and_without_preload
    # Puma 6+ preloads by default in cluster mode; a config file turns it off.
    no_preload = File.join(@tmp, "no_preload.rb")
    File.write(no_preload, "preload_app! false\n")
    [["--preload"], ["-C", no_preload]].each do |preload|
      master, port, = start_puma("-w", "2", *preload)
      pids = {}
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 30
      while pids.size < 2 && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
        http_get(port, "/leak")
        status, headers, body = http_get(port, "/debug/pprof/heap?debug=1")
        # A worker's debug=1 texts may use 20% of one core; a loaded machine made one take 0.2 s of
        # CPU, and the next was refused (429, retry after 1 s), as documented: wait, and ask again.
        if status == 429
          sleep [[Float(headers["retry-after"] || 1, exception: false) || 1, 0.1].max, 5].min
          next
        end
        assert_equal 200, status, "a worker's profile (#{preload.inspect}): #{body}"
        pids[headers["x-heapscope-pid"].to_i] = body
      end
      assert_equal 2, pids.size, "both workers answer with their own profile (#{preload.inspect})"
      refute_includes pids.keys, master, "the master serves no requests"
      reap_children
      @children = []
    end
  end

  def test_only_server_processes_profile_unless_enabled
    boot = "LeakApp.initialize!\nputs Heapscope.running?"
    # A runner or a script: no server loaded.
    assert_equal ["false\n", ""], in_app(boot)
    # A rake task (assets:precompile, db:migrate, ...), even with a server's constants loaded.
    assert_equal ["false\n", ""], in_app("require 'rake'; require 'puma'; require 'puma/launcher'\n" \
                                         "Rake.application.init('rake', ['assets:precompile'])\n#{boot}")
    # A console, even with puma loaded.
    assert_equal ["false\n", ""], in_app("require 'puma'; require 'puma/launcher'; module Rails; class Console; end; end\n#{boot}")
    # Puma loaded (Puma::Launcher), no console, no task: a server. Each says so in one line.
    out, err = in_app("require 'puma'; require 'puma/launcher'\n#{boot}")
    assert_equal "true\n", out
    assert_match STARTED, err
    # Asked for: in a runner too, by the setting or by the variable.
    assert_equal "true\n", in_app("LeakApp.config.heapscope.enabled = true\n#{boot}").first
    assert_equal "true\n", in_app(boot, env: { "HEAPSCOPE_ENABLED" => "1" }).first
    assert_equal ["false\n", ""], in_app("require 'puma'; require 'puma/launcher'\nLeakApp.config.heapscope.enabled = false\n#{boot}")
    # A pending autoload of a server's constant does not count, and is not loaded to find out.
    assert_equal ["false\nnil\n", ""],
                 in_app("module Puma; autoload :Launcher, 'puma/launcher'; end\n#{boot}\np $LOADED_FEATURES.grep(/puma\\/launcher/).first")
  end

  def test_settings_and_variables
    boot = "LeakApp.config.heapscope.enabled = true\n%s\nLeakApp.initialize!\np [Heapscope.running?, (Heapscope.stats[:sample_every] if Heapscope.running?)]"
    assert_equal "[true, 50]\n", in_app(format(boot, "")).first
    # The environment wins over config.heapscope.
    assert_equal "[true, 7]\n", in_app(format(boot, ""), env: { "HEAPSCOPE_SAMPLE_EVERY" => "7" }).first
    # A bad setting: one line naming it, and the app boots unprofiled.
    out, err = in_app(format(boot, "LeakApp.config.heapscope.sample_evry = 5"))
    assert_equal "[false, nil]\n", out
    assert_match(/\Aheapscope: config\.heapscope\.sample_evry is not a setting \(settings: enabled, sample_every, .*\); profiling is off\n\z/, err)
    out, err = in_app(format(boot, "LeakApp.config.heapscope.sample_every = 'often'"))
    assert_equal "[false, nil]\n", out
    assert_match(/\Aheapscope: config\.heapscope\.sample_every="often" is invalid: .*; profiling is off\n\z/, err)
    out, err = in_app(format(boot, "LeakApp.config.heapscope.dir = ['log']"))
    assert_equal "[false, nil]\n", out
    assert_equal "heapscope: config.heapscope.dir takes a String, a number, a Symbol, true or false, not an Array; " \
                 "profiling is off\n", err
    # Labels for actions and jobs: on by default where profiling starts, off by the setting or the
    # variable (the same parser as every setting: a bad value is named).
    labels = "LeakApp.config.heapscope.enabled = true\n%s\nLeakApp.initialize!\np Heapscope::RailsLabels.subscribed?"
    assert_equal "true\n", in_app(format(labels, "")).first
    assert_equal "false\n", in_app(format(labels, "LeakApp.config.heapscope.labels = false")).first
    assert_equal "false\n", in_app(format(labels, ""), env: { "HEAPSCOPE_LABELS" => "0" }).first
    out, err = in_app(format(labels, "LeakApp.config.heapscope.labels = 'sometimes'"))
    assert_equal "false\n", out
    assert_match(/\Aheapscope: config\.heapscope\.labels="sometimes" is invalid: must be 1 or 0/, err)
    # A bad variable is still named as the variable.
    out, err = in_app(format(boot, ""), env: { "HEAPSCOPE_SAMPLE_EVERY" => "-1" })
    assert_equal "[false, nil]\n", out
    assert_match(/\Aheapscope: HEAPSCOPE_SAMPLE_EVERY="-1" is invalid: /, err)
  end

  # Rails sets Encoding.default_internal to UTF-8: a profile file must still be its bytes.
  def test_profiles_are_written_as_bytes_under_a_default_internal_encoding
    path = File.join(@tmp, "x.pb.gz")
    code = "Encoding.default_internal = 'UTF-8'; require 'heapscope'; Heapscope.start(sample_every: 1)\n" \
           "KEEP = Array.new(100) { 'x' * 10 }; Heapscope.write(#{path.inspect})"
    _out, err, status = Open3.capture3(child_env, RbConfig.ruby, "-e", code)
    assert status.success?, err
    assert_equal "\x1f\x8b".b, File.binread(path, 2)
    assert Heapscope::Pprof.read(path).samples.any?
  end

  def test_settings_reach_the_surfaces
    dir = File.join(@tmp, "profiles")
    code = "LeakApp.config.heapscope.enabled = true\nLeakApp.config.heapscope.dir = #{dir.inspect}\n" \
           "LeakApp.config.heapscope.final = true\nLeakApp.config.heapscope.app_name = 'shop'\nLeakApp.initialize!"
    _out, err = in_app(code)
    files = Dir.children(dir)
    assert_equal 1, files.size, files.inspect
    assert_match(/\Ashop-\d+-.*-final\.heap\.pb\.gz\z/, files.first)
    assert_equal "heapscope: profiling this Rails process (pid #{err[/pid (\d+)/, 1]}): profiles go to #{dir} every 60 s; " \
                 "live where config/routes.rb mounts Heapscope::Rack.app (e.g. /debug/pprof/heap). " \
                 "config.heapscope.quiet = true (HEAPSCOPE_QUIET=1) silences this line\n" \
                 "heapscope: final profile written to #{File.join(dir, files.first)}\n", err
    assert Heapscope::Pprof.read(File.join(dir, files.first)).samples.any?
  end

  # Issue 33: under Rails nothing said profiling was on until the process exited. One line says where
  # profiles go and where to read them live; the setting or the variable silences it.
  def test_one_line_says_profiling_started_unless_quiet
    boot = "LeakApp.config.heapscope.enabled = true\n%s\nLeakApp.initialize!\np Heapscope.running?"
    _, err = in_app(format(boot, "LeakApp.config.heapscope.final = true"))
    assert_match(/\Aheapscope: profiling this Rails process \(pid \d+\): a final profile goes to #{Regexp.escape(File.join(File.realpath(@tmp), "heapscope-profiles"))} at exit; /, err)
    assert_equal 1, err.lines.grep(STARTED).size, err
    port = free_port
    out, err = in_app(format(boot, "LeakApp.config.heapscope.http = #{port}"))
    assert_equal "true\n", out
    assert_includes err, "live at http://127.0.0.1:#{port}/debug/pprof/ (heapscope top http://127.0.0.1:#{port}/debug/pprof/heap)"
    assert_equal ["true\n", ""], in_app(format(boot, "LeakApp.config.heapscope.quiet = true"))
    assert_equal ["true\n", ""], in_app(format(boot, ""), env: { "HEAPSCOPE_QUIET" => "1" })
  end
end
