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
      "HEAPSCOPE_SAMPLING" => "windowed", "HEAPSCOPE_WINDOW_SHARE" => "0.1",
      "HEAPSCOPE_DIR" => "/tmp/x", "HEAPSCOPE_INTERVAL" => "0.5", "HEAPSCOPE_KEEP" => "3", "HEAPSCOPE_FINAL" => "0",
      "HEAPSCOPE_APP_NAME" => "web-1.api", "HEAPSCOPE_HTTP" => "6060", "HEAPSCOPE_HTTP_FORK" => "same",
      "HEAPSCOPE_PYROSCOPE_URL" => "http://127.0.0.1:4040", "HEAPSCOPE_PYROSCOPE_LABELS" => "env=prod, region=eu-1",
    )
    assert_empty errors
    assert_equal({ sample_every: 500, max_frames: 64, min_age: 0, max_tracked_objects: 1000, max_stacks: 10,
                   track_sizes: false, max_overhead: 0.05, sampling: :windowed, window_share: 0.1 }, config[:start])
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
    "HEAPSCOPE_MAX_OVERHEAD" => ["1.5", "must be a number above 0 and at most 1, or off"],
    "HEAPSCOPE_SAMPLING" => ["sometimes", "must be one of windowed, always"],
    "HEAPSCOPE_WINDOW_SHARE" => ["0", "must be a number above 0 and at most 1"],
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
        'HEAPSCOPE_HTTP_TOKEN="short" is invalid: must be at least 16 characters',
      { "HEAPSCOPE_SAMPLE_EVERY" => "2147483648" } =>
        'HEAPSCOPE_SAMPLE_EVERY="2147483648" is invalid: must be an integer from 1 to 2147483647',
      { "HEAPSCOPE_INTERVAL" => "1h" } => 'HEAPSCOPE_INTERVAL="1h" is invalid: must be a number of seconds from 0.1 to 86400',
      { "HEAPSCOPE_SAMPLING" => "Always" } => 'HEAPSCOPE_SAMPLING="Always" is invalid: must be one of windowed, always',
      { "HEAPSCOPE_SAMPLING" => ":windowed" } => 'HEAPSCOPE_SAMPLING=":windowed" is invalid: must be one of windowed, always',
      { "HEAPSCOPE_WINDOW_SHARE" => "off" } => 'HEAPSCOPE_WINDOW_SHARE="off" is invalid: must be a number above 0 and at most 1',
      { "HEAPSCOPE_WINDOW_SHARE" => "1.01" } => 'HEAPSCOPE_WINDOW_SHARE="1.01" is invalid: must be a number above 0 and at most 1',
      { "HEAPSCOPE_WINDOW_SHARE" => "-0.1" } => 'HEAPSCOPE_WINDOW_SHARE="-0.1" is invalid: must be a number above 0 and at most 1',
      { "HEAPSCOPE_WINDOW_SHARE" => "2%" } => 'HEAPSCOPE_WINDOW_SHARE="2%" is invalid: must be a number above 0 and at most 1',
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
    {
      { "HEAPSCOPE_SAMPLING" => "always", "HEAPSCOPE_WINDOW_SHARE" => "0.25" } => "[:always, 0.25]\n[:always, nil]\n",
      { "HEAPSCOPE_SAMPLE_EVERY" => "1" } => "[:always, 0.02]\n[:always, nil]\n",
    }.each do |vars, expected|
      out, err, status = capture(ruby_env(vars), script)
      assert status.success?, err
      assert_equal [expected, ""], [out, err], vars.inspect
    end
    out, err, status = capture(ruby_env("HEAPSCOPE_WINDOW_SHARE" => "0.25"), "p Heapscope::Native::WINDOWED_SUPPORTED; #{script}")
    assert status.success?, err
    supported, rest = out.split("\n", 2)
    expected = supported == "true" ? "[:windowed, 0.25]\n[:windowed, 0.25]\n" : "[:always, 0.25]\n[:always, nil]\n"
    assert_equal [expected, ""], [rest, err]
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

  private

  def capture(env, script)
    require "open3"
    Timeout.timeout(60) { Open3.capture3(env, RbConfig.ruby, "-e", script) }
  end
end
