# frozen_string_literal: true

require_relative "test_http_helper"
require "heapscope/env_config"
require "heapscope/surfaces/http_server"

# Issue 12, item 13: a 100,000-character value of any HEAPSCOPE_* variable was echoed whole in one
# stderr line; numbers and sizes were stripped, so HEAPSCOPE_DUMP_RSS=" 5" meant 5 bytes although
# the docs say digits only; the standalone listener answered a bare-LF request (printf | nc) with 408
# after 5 s.
class TestHardeningEnvAndLf < Minitest::Test
  include SurfacesTestHelper

  def parse(env)
    Heapscope::EnvConfig.parse(env)
  end

  def test_a_long_bad_value_is_quoted_by_a_bounded_prefix_for_every_variable
    long = "x" * 100_000
    names = Heapscope::EnvConfig::VARIABLES.keys
    bad = names.filter_map do |name|
      env = { name => long }
      env["HEAPSCOPE_DUMP_RSS"] = "1G" if %w[HEAPSCOPE_DUMP_RSS_STEP HEAPSCOPE_DUMP_INTERVAL].include?(name)
      _, errors = parse(env)
      errors.each { |line| assert_operator line.length, :<, 400, "#{name}: #{line[0, 200]}..." }
      name unless errors.empty?
    end
    # Those that take any text (a directory, an Authorization token) accept it: the others refused it.
    assert_operator bad.size, :>=, 24, "variables that refused a 100,000-character value: #{bad.inspect}"
    _, errors = parse("HEAPSCOPE_SAMPLE_EVERY" => long)
    assert_equal ["heapscope: HEAPSCOPE_SAMPLE_EVERY=\"#{"x" * 80}\"... (100000 characters) is invalid: " \
                  "must be an integer from 1 to 2147483647"], errors
    # A label's text inside a reason is bounded too.
    _, errors = parse("HEAPSCOPE_PYROSCOPE_LABELS" => "k=#{long}\"")
    assert_operator errors.first.length, :<, 400
    assert_match(/label value "x+"\.\.\. \(100001 characters\) must not contain/, errors.first)
    # Short values are quoted whole, as before.
    assert_equal ["heapscope: HEAPSCOPE_SAMPLE_EVERY=\"lots\" is invalid: must be an integer from 1 to 2147483647"],
                 parse("HEAPSCOPE_SAMPLE_EVERY" => "lots")[1]
  end

  def test_numbers_and_sizes_with_spaces_or_signs_are_refused_naming_the_variable
    {
      "HEAPSCOPE_DUMP_RSS" => " 5", "HEAPSCOPE_SAMPLE_EVERY" => "100 ", "HEAPSCOPE_INTERVAL" => "\t60",
      "HEAPSCOPE_MAX_OVERHEAD" => " 0.1", "HEAPSCOPE_WINDOW_SHARE" => "0.5\n", "HEAPSCOPE_KEEP" => "4 8",
    }.each do |name, value|
      env = { name => value }
      env["HEAPSCOPE_DUMP_RSS"] ||= "1G"
      config, errors = parse(env)
      assert_equal 1, errors.size, "#{name}=#{value.inspect}: #{errors.inspect}"
      assert_match(/\Aheapscope: #{name}=#{Regexp.escape(value.inspect)} is invalid: .*\(digits only: it has spaces\)\z/, errors.first)
      assert_nil config[:dumps] if name == "HEAPSCOPE_DUMP_RSS"
    end
    _, errors = parse("HEAPSCOPE_MAX_FRAMES" => "+5")
    assert_match(/HEAPSCOPE_MAX_FRAMES="\+5" is invalid: must be an integer from 1 to 3000\z/, errors.first)
    # Unchanged: exact values, and empty or all-space values (unset).
    config, errors = parse("HEAPSCOPE_DUMP_RSS" => "5", "HEAPSCOPE_SAMPLE_EVERY" => "100", "HEAPSCOPE_INTERVAL" => "  ")
    assert_empty errors
    assert_equal [5, 100, 60.0], [config[:dumps][:rss], config[:start][:sample_every], config[:interval]]
  end

  def serve
    app = Heapscope::Rack.new(source: FakeSource.new)
    @server = Heapscope::HttpServer.new(host: "127.0.0.1", port: 0, app: app).start
  end

  def teardown
    @server&.stop
  end

  # What printf 'GET ... HTTP/1.1\nHost: x\n\n' | nc sends: answered at once, not with 408 after 5 s.
  def test_the_listener_answers_a_bare_lf_request_at_once
    port = serve.port
    ["GET /debug/pprof/ HTTP/1.1\nHost: x\n\n", "GET /debug/pprof/ HTTP/1.1\r\nHost: x\n\r\n",
     "GET /debug/pprof/ HTTP/1.0\n\n"].each do |request|
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      status, headers, body = raw_request(port, request)
      took = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
      assert_equal 200, status, request.inspect
      assert_equal "text/html; charset=utf-8", headers["content-type"]
      assert_includes body, "heapscope /debug/pprof/"
      assert_operator took, :<, 1.0, "#{request.inspect} answered after #{took.round(2)}s"
    end
    # A CR that ends no line is refused at once.
    status, _, body = raw_request(port, "GET /debug/pprof/ HTTP/1.1\rHost: x\n\n")
    assert_equal [400, "bare CR in the request head\n"], [status, body]
  end
end
