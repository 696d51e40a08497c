# frozen_string_literal: true

require_relative "test_http_helper"
require "heapscope/env_config"

# HEAPSCOPE_* parsing: defaults, every accepted form, and the exact line for each bad value.
# The last tests run a real process with RUBYOPT=-rheapscope/auto and bad variables: it must
# print one line per bad variable and run to completion, unprofiled.
class TestAutoEnv < Minitest::Test
  include SurfacesTestHelper

  def parse(env)
    Heapscope::EnvConfig.parse(env)
  end

  def test_defaults
    config, errors = parse({})
    assert_empty errors
    assert_equal true, config[:enabled]
    assert_equal({}, config[:start])
    assert_nil config[:dir]
    assert_equal 60.0, config[:interval]
    assert_equal 48, config[:keep]
    assert_equal true, config[:final]
    assert_nil config[:http]
    assert_nil config[:pyroscope]
  end

  def test_good_values
    config, errors = parse(
      "HEAPSCOPE_SAMPLE_EVERY" => "500", "HEAPSCOPE_MAX_FRAMES" => "64", "HEAPSCOPE_MIN_AGE" => "0",
      "HEAPSCOPE_MAX_TRACKED_OBJECTS" => "1000", "HEAPSCOPE_MAX_STACKS" => "10", "HEAPSCOPE_TRACK_SIZES" => "false", "HEAPSCOPE_MAX_OVERHEAD" => "0.05",
      "HEAPSCOPE_CENSUS" => "0", "HEAPSCOPE_SAMPLING" => "windowed", "HEAPSCOPE_WINDOW_SHARE" => "0.1",
      "HEAPSCOPE_DIR" => "/tmp/x", "HEAPSCOPE_INTERVAL" => "0.5", "HEAPSCOPE_KEEP" => "3", "HEAPSCOPE_FINAL" => "0",
      "HEAPSCOPE_APP_NAME" => "web-1.api", "HEAPSCOPE_HTTP" => "6060", "HEAPSCOPE_HTTP_FORK" => "same",
      "HEAPSCOPE_PYROSCOPE_URL" => "http://127.0.0.1:4040", "HEAPSCOPE_PYROSCOPE_LABELS" => "env=prod, region=eu-1",
    )
    assert_empty errors
    assert_equal({ sample_every: 500, max_frames: 64, min_age: 0, max_tracked_objects: 1000, max_stacks: 10,
                   track_sizes: false, max_overhead: 0.05, census: false, sampling: :windowed, window_share: 0.1 }, config[:start])
    assert_nil parse("HEAPSCOPE_MAX_OVERHEAD" => "off").first[:start].fetch(:max_overhead)
    assert_equal ["/tmp/x", 0.5, 3, false, "web-1.api"], config.values_at(:dir, :interval, :keep, :final, :app_name)
    assert_equal({ host: "127.0.0.1", port: 6060, token: nil, fork: :same }, config[:http])
    assert_equal({ url: "http://127.0.0.1:4040", labels: { "env" => "prod", "region" => "eu-1" }, token: nil },
                 config[:pyroscope])
  end

  def test_sampling_and_window_share_forms
    {
      { "HEAPSCOPE_SAMPLING" => "always" } => { sampling: :always },
      { "HEAPSCOPE_SAMPLING" => " windowed " } => { sampling: :windowed },
      { "HEAPSCOPE_WINDOW_SHARE" => "1" } => { window_share: 1.0 },
      { "HEAPSCOPE_WINDOW_SHARE" => "1.0" } => { window_share: 1.0 },
      { "HEAPSCOPE_WINDOW_SHARE" => ".005" } => { window_share: 0.005 },
      { "HEAPSCOPE_SAMPLING" => "always", "HEAPSCOPE_WINDOW_SHARE" => "0.5" } => { sampling: :always, window_share: 0.5 },
      { "HEAPSCOPE_SAMPLING" => "", "HEAPSCOPE_WINDOW_SHARE" => " " } => {},
    }.each do |env, start|
      config, errors = parse(env)
      assert_empty errors, env.inspect
      assert_equal start, config[:start], env.inspect
      assert_instance_of Float, config[:start][:window_share], env.inspect if start.key?(:window_share)
    end
  end

  def test_host_port_forms
    assert_equal ["127.0.0.1", 6060], Heapscope::EnvConfig.parse_host_port("6060")
    assert_equal ["127.0.0.1", 6060], Heapscope::EnvConfig.parse_host_port(":6060")
    assert_equal ["localhost", 80], Heapscope::EnvConfig.parse_host_port("localhost:80")
    assert_equal ["::1", 7000], Heapscope::EnvConfig.parse_host_port("[::1]:7000")
    assert_equal ["127.0.0.2", 0], Heapscope::EnvConfig.parse_host_port("127.0.0.2:0")
  end

  def test_loopback_detection
    %w[127.0.0.1 127.1.2.3 ::1 localhost].each { |h| assert Heapscope::EnvConfig::HttpAddress.loopback?(h), h }
    %w[0.0.0.0 :: 10.0.0.1 192.168.1.1 example.com].each { |h| refute Heapscope::EnvConfig::HttpAddress.loopback?(h), h }
  end

  def test_empty_values_count_as_unset
    config, errors = parse("HEAPSCOPE_SAMPLE_EVERY" => "", "HEAPSCOPE_HTTP" => "  ")
    assert_empty errors
    assert_equal({}, config[:start])
    assert_nil config[:http]
  end

  BAD = {
    "HEAPSCOPE_ENABLED" => ["maybe", "must be 1 or 0 (true/false, yes/no, on/off)"],
    "HEAPSCOPE_SAMPLE_EVERY" => ["abc", "must be an integer from 1 to 2147483647"],
    "HEAPSCOPE_MAX_FRAMES" => ["5000", "must be an integer from 1 to 3000"],
    "HEAPSCOPE_MIN_AGE" => ["-1", "must be an integer from 0 to 2147483647"],
    "HEAPSCOPE_MAX_TRACKED_OBJECTS" => ["0", "must be an integer from 1 to 2147483647"],
    "HEAPSCOPE_MAX_STACKS" => ["1e6", "must be an integer from 1 to 2147483647"],
    "HEAPSCOPE_TRACK_SIZES" => ["2", "must be 1 or 0 (true/false, yes/no, on/off)"],
    "HEAPSCOPE_CENSUS" => ["sometimes", "must be 1 or 0 (true/false, yes/no, on/off)"],
    "HEAPSCOPE_MAX_OVERHEAD" => ["1.5", "must be a number above 0 and at most 1, or off"],
    "HEAPSCOPE_SAMPLING" => ["sometimes", "must be one of windowed, always"],
    "HEAPSCOPE_WINDOW_SHARE" => ["0", "must be a number above 0 and at most 1, or budget"],
    "HEAPSCOPE_INTERVAL" => ["0", "must be a number of seconds from 0.1 to 86400"],
    "HEAPSCOPE_KEEP" => ["0", "must be an integer from 1 to 1000000"],
    "HEAPSCOPE_FINAL" => ["sometimes", "must be 1 or 0 (true/false, yes/no, on/off)"],
    "HEAPSCOPE_APP_NAME" => ["my app", "use 1 to 100 of A-Z a-z 0-9 _ . -"],
    "HEAPSCOPE_HTTP" => ["localhost", "must be HOST:PORT, [IPV6]:PORT or PORT"],
    "HEAPSCOPE_HTTP_FORK" => ["sometimes", "must be one of offset, same, off"],
    "HEAPSCOPE_PYROSCOPE_URL" => ["ftp://x", "must be an http:// or https:// URL without query, e.g. http://127.0.0.1:4040"],
    "HEAPSCOPE_PYROSCOPE_LABELS" => ["env", '"env" is not key=value'],
  }.freeze

  def test_each_bad_value_names_the_variable_and_the_value
    BAD.each do |name, (value, reason)|
      _, errors = parse(name => value)
      assert_equal ["heapscope: #{name}=#{value.inspect} is invalid: #{reason}"], errors, name
    end
  end

  def test_more_bad_values
    {
      { "HEAPSCOPE_HTTP" => "127.0.0.1:70000" } => 'HEAPSCOPE_HTTP="127.0.0.1:70000" is invalid: port must be from 0 to 65535',
      { "HEAPSCOPE_HTTP" => "0.0.0.0:6060" } =>
        'HEAPSCOPE_HTTP="0.0.0.0:6060" is invalid: 0.0.0.0 is not a loopback address: set HEAPSCOPE_HTTP_TOKEN to serve it',
      { "HEAPSCOPE_HTTP" => "0.0.0.0:6060", "HEAPSCOPE_HTTP_TOKEN" => "short" } =>
        'HEAPSCOPE_HTTP_TOKEN (5 characters, not shown) is invalid: must be at least 16 characters',
      { "HEAPSCOPE_SAMPLE_EVERY" => "2147483648" } =>
        'HEAPSCOPE_SAMPLE_EVERY="2147483648" is invalid: must be an integer from 1 to 2147483647',
      { "HEAPSCOPE_INTERVAL" => "1h" } => 'HEAPSCOPE_INTERVAL="1h" is invalid: must be a number of seconds from 0.1 to 86400',
      { "HEAPSCOPE_SAMPLING" => "Always" } => 'HEAPSCOPE_SAMPLING="Always" is invalid: must be one of windowed, always',
      { "HEAPSCOPE_SAMPLING" => ":windowed" } => 'HEAPSCOPE_SAMPLING=":windowed" is invalid: must be one of windowed, always',
      { "HEAPSCOPE_WINDOW_SHARE" => "off" } => 'HEAPSCOPE_WINDOW_SHARE="off" is invalid: must be a number above 0 and at most 1, or budget',
      { "HEAPSCOPE_WINDOW_SHARE" => "1.01" } => 'HEAPSCOPE_WINDOW_SHARE="1.01" is invalid: must be a number above 0 and at most 1, or budget',
      { "HEAPSCOPE_WINDOW_SHARE" => "-0.1" } => 'HEAPSCOPE_WINDOW_SHARE="-0.1" is invalid: must be a number above 0 and at most 1, or budget',
      { "HEAPSCOPE_WINDOW_SHARE" => "2%" } => 'HEAPSCOPE_WINDOW_SHARE="2%" is invalid: must be a number above 0 and at most 1, or budget',
      { "HEAPSCOPE_PYROSCOPE_URL" => "http://x:4040/?a=1" } =>
        'HEAPSCOPE_PYROSCOPE_URL="http://x:4040/?a=1" is invalid: must be an http:// or https:// URL without query, e.g. http://127.0.0.1:4040',
      { "HEAPSCOPE_PYROSCOPE_LABELS" => "a=b{c}" } =>
        'HEAPSCOPE_PYROSCOPE_LABELS="a=b{c}" is invalid: label value "b{c}" must not contain {}=, or quotes',
      { "HEAPSCOPE_PYROSCOPE_LABELS" => "9a=b" } =>
        'HEAPSCOPE_PYROSCOPE_LABELS="9a=b" is invalid: label name "9a" must start with a letter or _ and hold only letters, digits, _ and .',
    }.each do |env, line|
      _, errors = parse(env)
      assert_equal ["heapscope: #{line}"], errors, env.inspect
    end
    config, errors = parse("HEAPSCOPE_HTTP" => "0.0.0.0:6060", "HEAPSCOPE_HTTP_TOKEN" => "0123456789abcdef")
    assert_empty errors
    assert_equal "0123456789abcdef", config[:http][:token]
  end

  def test_app_name_defaults_to_the_script
    old = $PROGRAM_NAME
    $PROGRAM_NAME = "/srv/bin/my worker.rb"
    assert_equal "my_worker", parse({}).first[:app_name]
    $PROGRAM_NAME = "-e"
    assert_equal "ruby", parse({}).first[:app_name]
    $PROGRAM_NAME = ".hidden.rb"
    assert_equal "hidden", parse({}).first[:app_name]
  ensure
    $PROGRAM_NAME = old
  end

  # A real process: every bad variable prints one line, and the script still runs to the end.
  def test_bad_variables_never_take_the_app_down
    env = ruby_env("HEAPSCOPE_SAMPLE_EVERY" => "lots", "HEAPSCOPE_HTTP" => "0.0.0.0:1")
    out, err, status = capture(env, "puts :app_ran; puts defined?(Heapscope::Native) ? :loaded : :not_loaded")
    assert status.success?, err
    assert_equal "app_ran\nnot_loaded\n", out
    assert_equal [
      'heapscope: HEAPSCOPE_SAMPLE_EVERY="lots" is invalid: must be an integer from 1 to 2147483647; profiling is off',
      'heapscope: HEAPSCOPE_HTTP="0.0.0.0:1" is invalid: 0.0.0.0 is not a loopback address: set HEAPSCOPE_HTTP_TOKEN to serve it; profiling is off',
    ], err.lines.map(&:chomp)
  end

  def test_disabled_prints_nothing
    out, err, status = capture(ruby_env("HEAPSCOPE_ENABLED" => "0"), "puts Heapscope::Auto.config.inspect")
    assert status.success?
    assert_equal "nil\n", out
    assert_equal "", err
  end

  def test_autostart_starts_the_profiler
    skip_unless_native
    script = "p Heapscope.running?; p Heapscope.config.values_at(:sample_every, :max_frames, :min_age, :track_sizes)"
    env = ruby_env("HEAPSCOPE_SAMPLE_EVERY" => "7", "HEAPSCOPE_MAX_FRAMES" => "9", "HEAPSCOPE_MIN_AGE" => "0",
                   "HEAPSCOPE_TRACK_SIZES" => "no")
    out, err, status = capture(env, script)
    assert status.success?, err
    assert_equal "true\n[7, 9, 0, false]\n", out
    assert_equal "", err
  end

  # The variables reach Heapscope.start; unset, sampling follows start's rule (always at sample_every 1).
  def test_autostart_passes_sampling_and_window_share
    skip_unless_native
    script = "p Heapscope.config.values_at(:sampling, :window_share); p Heapscope.stats.values_at(:sampling, :window_share)"
    assert_autostart_prints(script,
                            { "HEAPSCOPE_SAMPLING" => "always", "HEAPSCOPE_WINDOW_SHARE" => "0.25" } => "[:always, 0.25]\n[:always, nil]\n",
                            { "HEAPSCOPE_SAMPLE_EVERY" => "1" } => "[:always, :budget]\n[:always, nil]\n")
    # Windowed is the default where windows can change at interrupt checks (Ruby 3.3+), always elsewhere.
    out, err, status = capture(ruby_env("HEAPSCOPE_WINDOW_SHARE" => "0.25"),
                               "p Heapscope::Native::WINDOWED_SUPPORTED && Heapscope::Native::WINDOWED_TICKER; #{script}")
    assert status.success?, err
    supported, rest = out.split("\n", 2)
    expected = supported == "true" ? "[:windowed, 0.25]\n[:windowed, 0.25]\n" : "[:always, 0.25]\n[:always, nil]\n"
    assert_equal [expected, ""], [rest, err]
  end

  # Exact means exact: HEAPSCOPE_SAMPLE_EVERY alone turns the budget off; HEAPSCOPE_MAX_OVERHEAD set
  # too (a fraction or off) wins; neither keeps the default budget.
  def test_autostart_sample_every_is_never_lowered_unless_max_overhead_is_set
    skip_unless_native
    script = "p Heapscope.config[:max_overhead]; p Heapscope.stats.values_at(:max_overhead, :sample_every, :current_sample_every)"
    assert_autostart_prints(script,
                            {} => "0.01\n[0.01, 1000, 1000]\n",
                            { "HEAPSCOPE_SAMPLE_EVERY" => "1" } => "nil\n[nil, 1, 1]\n",
                            { "HEAPSCOPE_SAMPLE_EVERY" => "1", "HEAPSCOPE_MAX_OVERHEAD" => "0.05" } => "0.05\n[0.05, 1, 1]\n",
                            { "HEAPSCOPE_SAMPLE_EVERY" => "7", "HEAPSCOPE_MAX_OVERHEAD" => "off" } => "nil\n[nil, 7, 7]\n",
                            { "HEAPSCOPE_MAX_OVERHEAD" => "off" } => "nil\n[nil, 1000, 1000]\n")
  end

  # Runs script under autostart with each set of variables; it must print what is expected, nothing on stderr.
  def assert_autostart_prints(script, cases)
    cases.each do |vars, expected|
      out, err, status = capture(ruby_env(vars), script)
      assert status.success?, err
      assert_equal [expected, ""], [out, err], vars.inspect
    end
  end

  # Issue 12, quiet defaults: autostart with no output asked for still leaves a result, one final
  # profile in ./heapscope-profiles of the directory the process started in (it changes directory
  # before exit here), announced in one line; HEAPSCOPE_FINAL=0 leaves nothing.
  def test_with_no_output_set_a_final_profile_goes_to_the_default_directory
    skip_unless_native
    Dir.mktmpdir("heapscope-auto") do |dir|
      script = "KEEP = Array.new(2_000) { |i| \"leak \#{i}\" * 10 }; Dir.chdir('/'); puts :ran"
      # Sampled densely and always on, so that the kept strings are surely in it (about 400 samples).
      env = ruby_env("HEAPSCOPE_FINAL" => nil, "HEAPSCOPE_APP_NAME" => "quiet", "HEAPSCOPE_SAMPLING" => "always",
                     "HEAPSCOPE_SAMPLE_EVERY" => "10")
      out, err, status = capture(env, script, chdir: dir)
      assert_equal [true, "ran\n"], [status.success?, out], err
      real = File.realpath(dir)
      files = Dir.children(File.join(real, "heapscope-profiles"))
      assert_equal 1, files.size, files.inspect
      assert_match(/\Aquiet-\d+-\d{8}T\d{6}\.\d{3}Z-final\.heap\.pb\.gz\z/, files.first)
      path = File.join(real, "heapscope-profiles", files.first)
      assert_equal "heapscope: final profile written to #{path}\n", err
      require "heapscope/pprof"
      decoded = Heapscope::Pprof.decode(File.binread(path))
      live = decoded.samples.select { |s| s.labels["class"] == "String" && s.frames.any? { |f| f.file == "-e" && f.line == 1 } }
      assert_operator live.sum { |s| s.value("inuse_objects") }, :>, 0, "the kept strings are in it"
      if system("command -v go >/dev/null 2>&1")
        top, gerr, gstatus = Open3.capture3({ "HOME" => dir, "PPROF_TMPDIR" => dir }, "go", "tool", "pprof", "-top",
                                            "-lines", "-sample_index=inuse_objects", path)
        assert gstatus.success?, gerr
        assert_match(/-e:1\b/, top, "go tool pprof reads the default final profile and names the leak line")
      end

      FileUtils.rm_rf(File.join(real, "heapscope-profiles"))
      out, err, status = capture(ruby_env("HEAPSCOPE_FINAL" => "0"), "puts :ran", chdir: dir)
      assert_equal [true, "ran\n", ""], [status.success?, out, err]
      refute File.exist?(File.join(real, "heapscope-profiles")), "HEAPSCOPE_FINAL=0: nothing written"
    end
  end

  def test_port_in_use_keeps_the_app_profiled_without_listener
    skip_unless_native
    blocker = TCPServer.new("127.0.0.1", 0)
    port = blocker.addr[1]
    out, err, status = capture(ruby_env("HEAPSCOPE_HTTP" => "127.0.0.1:#{port}"), "p Heapscope.running?")
    assert status.success?, err
    assert_equal "true\n", out
    assert_match(/\Aheapscope: HEAPSCOPE_HTTP=127\.0\.0\.1:#{port} cannot listen: .*Address already in use.*; the listener is off\n\z/, err)
  ensure
    blocker&.close
  end

  # Issue 11, item 9: a URL the pattern accepts must also be one the pusher can use, so the check
  # happens with the other variables (before anything starts) and names the variable.
  def test_pyroscope_url_and_token_are_checked_as_the_pusher_uses_them
    {
      { "HEAPSCOPE_PYROSCOPE_URL" => "http://[::1" } =>
        'HEAPSCOPE_PYROSCOPE_URL="http://[::1" is invalid: cannot be parsed as a URL',
      { "HEAPSCOPE_PYROSCOPE_URL" => "http://u%zz:p@127.0.0.1:4040" } =>
        'HEAPSCOPE_PYROSCOPE_URL="http://u%zz:p@127.0.0.1:4040" is invalid: cannot be parsed as a URL',
      { "HEAPSCOPE_PYROSCOPE_URL" => "http://127.0.0.1:99999" } =>
        'HEAPSCOPE_PYROSCOPE_URL="http://127.0.0.1:99999" is invalid: port must be from 1 to 65535, got 99999',
      { "HEAPSCOPE_PYROSCOPE_URL" => "http://:4040" } => 'HEAPSCOPE_PYROSCOPE_URL="http://:4040" is invalid: has no host',
      { "HEAPSCOPE_PYROSCOPE_URL" => "http://127.0.0.1:4040", "HEAPSCOPE_PYROSCOPE_TOKEN" => "tok\r\nX-Evil: 1" } =>
        "HEAPSCOPE_PYROSCOPE_TOKEN (14 characters, not shown) is invalid: must not contain control characters such as " \
        "a newline (it is sent in an HTTP header)",
    }.each do |env, line|
      _, errors = parse(env)
      assert_equal ["heapscope: #{line}"], errors, env.inspect
    end
    %w[http://[::1]:4040 https://user:p%40ss@pyro.example/base/ http://localhost:4040/].each do |url|
      assert_empty parse("HEAPSCOPE_PYROSCOPE_URL" => url).last, url
    end
  end

  # The whole of autostart is off, as the line says: no listener, no writer, no final profile.
  def test_unparsable_pyroscope_url_turns_everything_off
    Dir.mktmpdir do |dir|
      port = free_port
      env = ruby_env("HEAPSCOPE_PYROSCOPE_URL" => "http://[::1", "HEAPSCOPE_DIR" => dir, "HEAPSCOPE_HTTP" => port.to_s)
      out, err, status = capture(env, "p [defined?(Heapscope::Native), Thread.list.size]; " \
                                      "begin; TCPSocket.new('127.0.0.1', #{port}); p :listening; rescue SystemCallError; p :no_listener; end")
      assert status.success?, err
      assert_equal "[nil, 1]\n:no_listener\n", out
      assert_equal ['heapscope: HEAPSCOPE_PYROSCOPE_URL="http://[::1" is invalid: cannot be parsed as a URL; profiling is off'],
                   err.lines.map(&:chomp)
      assert_empty Dir.children(dir), "no final profile: profiling never started"
    end
  end

  # A surface that fails to start for a reason no check foresaw (injected here) stops what had
  # started, so "profiling is off" is true.
  def test_a_surface_failing_to_start_stops_everything_started_before_it
    skip_unless_native
    Dir.mktmpdir do |dir|
      port = free_port
      env = { "RUBYOPT" => "-I#{LIB}", "HEAPSCOPE_PYROSCOPE_URL" => "http://127.0.0.1:1", "HEAPSCOPE_DIR" => dir,
              "HEAPSCOPE_HTTP" => port.to_s, "HEAPSCOPE_INTERVAL" => "0.1" }
      script = <<~RUBY
        require "heapscope/surfaces/pyroscope"
        Heapscope::Pyroscope.prepend(Module.new { def initialize(**) raise IOError, "injected" end })
        require "heapscope/auto"
        p [Heapscope.running?, Thread.list.size, Heapscope::Auto.stats, Heapscope::Auto.config]
        begin; TCPSocket.new("127.0.0.1", #{port}); p :listening; rescue SystemCallError; p :no_listener; end
        sleep 0.3
      RUBY
      out, err, status = capture(env, script)
      assert status.success?, err
      assert_equal "[false, 1, {}, nil]\n:no_listener\n", out
      lines = err.lines.map(&:chomp)
      assert_equal "heapscope: serving http://127.0.0.1:#{port}/debug/pprof/ (pid #{lines[0][/pid (\d+)/, 1]})", lines[0]
      assert_equal ["heapscope: autostart failed starting the Pyroscope pusher (HEAPSCOPE_PYROSCOPE_URL): IOError: injected; profiling is off"],
                   lines.drop(1)
      assert_empty Dir.children(dir), "neither periodic files nor a final profile"
    end
  end

  # Issue 11, item 13: an application that calls Heapscope.start itself, run under autostart.
  def test_heapscope_start_in_application_code_under_autostart_warns_once_and_returns_false
    skip_unless_native
    script = <<~RUBY
      p Heapscope.start(sample_every: 5)
      p Heapscope.start
      p [Heapscope.running?, Heapscope.config[:sample_every]]
      begin
        Heapscope.start(bogus: 1)
      rescue ArgumentError => e
        p e.class
      end
      Heapscope.stop
      p Heapscope.start(sample_every: 7), Heapscope.config[:sample_every]
      begin
        Heapscope.start
      rescue Heapscope::Error
        p :raises_for_the_apps_own_profiler
      end
    RUBY
    out, err, status = capture(ruby_env("HEAPSCOPE_SAMPLE_EVERY" => "3"), script)
    assert status.success?, err
    assert_equal "false\nfalse\n[true, 3]\nArgumentError\ntrue\n7\n:raises_for_the_apps_own_profiler\n", out
    assert_equal ["heapscope: Heapscope.start was called while autostart (RUBYOPT=-rheapscope/auto) is profiling this process: " \
                  "it returns false and autostart's settings stay (call Heapscope.stop first to start with other options)"],
                 err.lines.map(&:chomp)
  end

  # Issue 11, item 10: the final profile failing must say so, even after periodic writes failed
  # for the same reason (their warning was given once, and the final one used to pass in silence).
  def test_a_final_profile_that_cannot_be_written_prints_one_line_with_the_path_and_the_error
    skip_unless_native
    Dir.mktmpdir do |tmp|
      blocker = File.join(tmp, "a-file")
      File.write(blocker, "")
      dir = File.join(blocker, "sub")
      err = final_failure(dir)
      assert_match(/\A#{final_prefix(dir)}(File exists|Not a directory) \(Errno::(EEXIST|ENOTDIR)\)\z/, err)
    end
  end

  def test_a_final_profile_on_a_full_disk_prints_one_line_with_the_path_and_the_error
    skip_unless_native
    Dir.mktmpdir do |tmp|
      skip "cannot mount a tmpfs here" unless system("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", tmp, err: File::NULL)
      begin
        File.open(File.join(tmp, "filler"), "wb") { |f| loop { f.write("\0" * 4096) } } rescue Errno::ENOSPC
        err = final_failure(tmp)
        assert_match(/\A#{final_prefix(tmp)}No space left on device \(Errno::ENOSPC\)\z/, err)
        assert_equal ["filler"], Dir.children(tmp), "no partial file is left"
      ensure
        system("umount", tmp, err: File::NULL)
      end
    end
  end

  private

  def final_prefix(dir)
    "heapscope: final profile not written to #{Regexp.escape(dir)}/app-\\d+-\\d{8}T\\d{6}\\.\\d{3}Z-final\\.heap\\.pb\\.gz: "
  end

  # Runs an app whose periodic writes into dir fail; returns the one line about its final profile.
  def final_failure(dir)
    env = ruby_env("HEAPSCOPE_DIR" => dir, "HEAPSCOPE_APP_NAME" => "app", "HEAPSCOPE_INTERVAL" => "0.1", "HEAPSCOPE_FINAL" => nil)
    out, err, status = capture(env, "sleep 0.5; puts :ran")
    assert_equal [true, "ran\n"], [status.success?, out], err
    lines = err.lines.map(&:chomp)
    assert_equal 2, lines.size, err
    assert_match(/\Aheapscope: cannot write profiles to #{Regexp.escape(dir)}: /, lines[0], "the periodic writes' one warning")
    lines[1]
  end

  # Runs script under autostart in a fresh directory (a final profile written by default lands
  # there, never in the checkout). HEAPSCOPE_FINAL is 0 unless env says otherwise (nil: unset), so
  # tests about other things see only their own lines.
  def capture(env, script, chdir: nil)
    require "open3"
    env = { "HEAPSCOPE_FINAL" => "0" }.merge(env)
    run = ->(dir) { Timeout.timeout(60) { Open3.capture3(env, RbConfig.ruby, "-e", script, chdir: dir) } }
    chdir ? run.call(chdir) : Dir.mktmpdir("heapscope-auto") { |dir| run.call(dir) }
  end
end
