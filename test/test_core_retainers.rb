# frozen_string_literal: true

require_relative "core_helper"
require "json"
require "stringio"
require "heapscope/surfaces/rack"
require "heapscope/surfaces/http_server"

# Who holds a site's sampled objects (Heapscope.retainers, ext/heapscope/retainers.c): known
# structures checked hop by hop, a big heap within the time limit, the limits, compaction between
# sampling and the walk, and the HTTP endpoint. (named test_core_* so CI's ASan run covers the walk)
class TestCoreRetainers < Minitest::Test
  include CoreHelper

  FILE = File.basename(__FILE__)

  class Store
    def initialize
      @entries = []
    end

    def add(item)
      @entries << item
    end
  end

  module Fixtures
    CACHE = Store.new
  end

  class Holder
    @@kept = [] # rubocop:disable Style/ClassVars

    def self.keep(item)
      @@kept << item # rubocop:disable Style/ClassVars
    end
  end

  # The class's own instance variable (Ruby 4.0 keeps both kinds in a table the class points to).
  class Registry
    @items = []

    class << self
      attr_reader :items
    end
  end

  def setup
    Heapscope.start(sample_every: 1, max_overhead: nil, sampling: :always)
  end

  def teardown
    $heapscope_test_cache = nil
    @thread&.kill
    super
  end

  def line_of(marker)
    File.readlines(__FILE__).index { |l| l.include?(marker) } + 1
  end

  def hops(path)
    path[:hops].map { |h| [h[:edge], h[:class]] }
  end

  def fill_global
    $heapscope_test_cache = { "a" => [], "b" => [] }
    8.times { |i| $heapscope_test_cache[i.even? ? "a" : "b"] << +"global entry #{i}" } # GLOBAL SITE
  end

  def test_a_global_hash_of_arrays_of_strings
    fill_global
    report = Heapscope.retainers("#{FILE}:#{line_of("# GLOBAL SITE")}", keys: true)
    assert_operator report[:sampled], :>=, 8
    assert_equal 8, report[:held], "each kept string has a path; the rest is garbage"
    assert_nil report[:cut_short]
    assert_equal 1, report[:shapes], "keys and indexes do not make shapes"
    path = report[:paths].first
    assert_equal 8, path[:count]
    assert_equal "global variable $heapscope_test_cache", path[:root]
    assert_equal [[nil, "Hash"], ["value at key \"a\"", "Array"], ["[0]", "String (the sampled object)"]], hops(path)
  end

  # A String, Float or Bignum is skipped by the walk as a leaf (it holds nothing), unless it has instance
  # variables of its own: then what they hold must still be found through it, in a big Array (read a
  # chunk at a time) as in a small one.
  def test_an_instance_variable_of_a_string_in_a_big_array
    holders = Array.new(70_000) { |i| "holder #{i}" }
    5.times { |i| holders[i * 10_000].instance_variable_set(:@kept, +"held by a string #{i}") } # STRING IVAR SITE
    $heapscope_test_cache = holders
    report = Heapscope.retainers("#{FILE}:#{line_of("# STRING IVAR SITE")}")
    assert_equal 5, report[:held]
    path = report[:paths].first
    assert_equal "global variable $heapscope_test_cache", path[:root]
    assert_equal [[nil, "Array"], ["[i]", "String"], ["@kept", "String (the sampled object)"]],
                 hops(path).map { |edge, klass| [edge&.sub(/\A\[\d+\]\z/, "[i]"), klass] }
  end

  # Sampled objects that died since the last GC are reached from no root: they must not be shown as held
  # (they were, through the walk's own bookkeeping object on this thread's C stack).
  def test_garbage_is_not_held_by_anything
    in_finished_thread { 200.times { |i| +"garbage #{i}" } } # GARBAGE SITE
    report = Heapscope.retainers("#{FILE}:#{line_of("# GARBAGE SITE")}")
    assert_operator report[:sampled], :>=, 100
    assert_operator report[:held], :<=, report[:sampled] / 10, Heapscope::Retainers.text(report)
    assert_includes Heapscope::Retainers.text(report), "reached from no root: garbage the next GC frees"
  end

  def test_a_constant_holding_a_cache_object_with_an_instance_variable
    4.times { |i| Fixtures::CACHE.add(+"stored #{i}") } # CONSTANT SITE
    path = Heapscope.retainers("#{FILE}:#{line_of("# CONSTANT SITE")}")[:paths].first
    assert_equal 4, path[:count]
    assert_equal "constant TestCoreRetainers::Fixtures::CACHE", path[:root]
    assert_equal [[nil, "TestCoreRetainers::Store"], ["@entries", "Array"], ["[0]", "String (the sampled object)"]], hops(path)
  end

  def test_a_class_variable
    3.times { |i| Holder.keep(+"class var #{i}") } # CVAR SITE
    path = Heapscope.retainers("#{FILE}:#{line_of("# CVAR SITE")}")[:paths].first
    assert_equal "constant TestCoreRetainers::Holder", path[:root]
    assert_equal [[nil, "Class TestCoreRetainers::Holder"], ["class variable @@kept", "Array"],
                  ["[0]", "String (the sampled object)"]], hops(path)
  end

  def test_an_instance_variable_of_a_class
    3.times { |i| Registry.items << +"registered #{i}" } # CLASS IVAR SITE
    path = Heapscope.retainers("#{FILE}:#{line_of("# CLASS IVAR SITE")}")[:paths].first
    assert_equal "constant TestCoreRetainers::Registry", path[:root]
    assert_equal [[nil, "Class TestCoreRetainers::Registry"], ["@items (of the class)", "Array"],
                  ["[0]", "String (the sampled object)"]], hops(path)
  end

  # The Array lives only in the environment of the block the thread runs.
  def start_holder
    captured = Array.new(3) { |i| +"captured #{i}" } # CLOSURE SITE
    Thread.new { sleep; captured }
  end

  def test_a_closure_captured_by_a_thread
    @thread = start_holder
    @thread.name = "holder"
    Thread.pass until @thread.status == "sleep"
    report = Heapscope.retainers("#{FILE}:#{line_of("# CLOSURE SITE")}")
    strings = report[:paths].find { |p| p[:hops].last[:class] == "String (the sampled object)" }
    refute_nil strings, report.inspect
    assert_equal 3, strings[:count]
    assert_equal "a thread's stack or locals (Thread \"holder\")", strings[:root], report.inspect
    first, *rest = hops(strings)
    assert_equal "its code or captured variables", first[0]
    assert_match(/\AVM-internal \(imemo/, first[1], "the block's environment is shown by kind, never handed to Ruby")
    assert_equal [[nil, "Array"], ["[0]", "String (the sampled object)"]], rest.last(2)
  end

  def test_paths_survive_compaction_between_sampling_and_the_walk
    skip "GC.compact is not supported here" unless GC.respond_to?(:compact)
    fill_global
    verify_compaction
    path = Heapscope.retainers("#{FILE}:#{line_of("# GLOBAL SITE")}")[:paths].first
    assert_equal 8, path[:count]
    assert_equal "global variable $heapscope_test_cache", path[:root]
  end

  # A million live objects: the walk reaches a target behind all of them within the time limit.
  def test_a_million_objects_within_the_time_limit
    Heapscope.stop
    big = Array.new(1_000_000) { |i| [i] } # not sampled: the profiler is off
    Heapscope.start(sample_every: 1, max_overhead: nil, sampling: :always)
    big << [+"behind a million"] # BIG SITE
    report = Heapscope.retainers("#{FILE}:#{line_of("# BIG SITE")}", time_limit: 5)
    assert_nil report[:cut_short], report.inspect
    assert_operator report[:held], :>=, 1
    assert_operator report[:visited], :>, 1_000_000
    assert_operator report[:seconds], :<, 5
    # A walk too short for it says so and returns what it has.
    short = Heapscope.retainers("#{FILE}:#{line_of("# BIG SITE")}", time_limit: 0.001)
    assert_equal :time, short[:cut_short]
    assert_includes Heapscope::Retainers.text(short), "cut short at the time limit"
    # So does one whose tables may not grow.
    small = Heapscope.retainers("#{FILE}:#{line_of("# BIG SITE")}", max_memory: "1M")
    assert_equal :objects, small[:cut_short]
    assert_operator small[:kept], :<, 100_000
    big.clear
  end

  def test_arguments_are_checked
    ["nope", "file.rb", "file.rb:0", ":12", ""].each do |bad|
      assert_raises(ArgumentError) { Heapscope.retainers(bad) }
    end
    assert_raises(ArgumentError) { Heapscope.retainers("a.rb:1", limit: 0) }
    assert_raises(ArgumentError) { Heapscope.retainers("a.rb:1", time_limit: 0) }
    assert_raises(ArgumentError) { Heapscope.retainers("a.rb:1", max_memory: "lots") }
    Heapscope.stop
    error = assert_raises(Heapscope::Error) { Heapscope.retainers("a.rb:1") }
    assert_match(/not running/, error.message)
  end

  # `heapscope retainers URL SITE` against the standalone listener of this process.
  def test_the_cli_asks_a_live_listener
    require "heapscope/report/cli"
    fill_global
    Heapscope::Rack::RetainersEndpoint::LIMITER.reset
    server = Heapscope::HttpServer.new(host: "127.0.0.1", port: 0).start
    out = StringIO.new
    err = StringIO.new
    status = Heapscope::Report::CLI.run("retainers", ["http://127.0.0.1:#{server.port}", "#{FILE}:#{line_of("# GLOBAL SITE")}"],
                                        out: out, err: err)
    assert_equal 0, status, err.string
    assert_includes out.string, "#1: 8 of 8 objects, held by global variable $heapscope_test_cache"
    # The next walk within 10 s is refused, and the CLI says why in one line.
    status = Heapscope::Report::CLI.run("retainers", ["http://127.0.0.1:#{server.port}/debug/pprof", "#{FILE}:1"], out: out, err: err)
    assert_equal 2, status
    assert_match(/\Aheapscope retainers: 127\.0\.0\.1:\d+ answered 429: a retainers walk ran less than 10s ago/, err.string)
    err.truncate(0)
    err.rewind
    assert_equal 2, Heapscope::Report::CLI.run("retainers", ["ftp://x", "a.rb:1"], out: out, err: err)
    assert_includes err.string, "URL must be http:// or https://"
  ensure
    server&.stop
    Heapscope::Rack::RetainersEndpoint::LIMITER.reset
  end

  def test_the_http_endpoint
    fill_global
    app = Heapscope::Rack.app
    Heapscope::Rack::RetainersEndpoint::LIMITER.reset
    get = ->(query) { app.call("REQUEST_METHOD" => "GET", "PATH_INFO" => "/debug/pprof/retainers", "QUERY_STRING" => query) }
    status, headers, body = get.call("site=#{FILE}:#{line_of("# GLOBAL SITE")}&format=json")
    assert_equal 200, status, body.join
    assert_equal "application/json", headers["content-type"]
    report = JSON.parse(body.join)
    assert_equal "global variable $heapscope_test_cache", report["paths"].first["root"]
    # One walk per 10 s: the next is refused with Retry-After.
    status, headers, = get.call("site=#{FILE}:1")
    assert_equal 429, status
    assert_match(/\A\d+\z/, headers["retry-after"])
    Heapscope::Rack::RetainersEndpoint::LIMITER.reset
    status, _, body = get.call("site=#{FILE}:#{line_of("# GLOBAL SITE")}")
    assert_equal 200, status
    assert_includes body.join, "held by global variable $heapscope_test_cache"
    # Keys may be data: over HTTP they are named by class; keys=1 needs the operator's show_contents
    # (test_core_retainers_safety.rb).
    assert_includes body.join, "value at a String key -> Array"
    refute_includes body.join, "\"a\""
    {
      "" => "site is required",
      "site=x" => "site must be FILE:LINE",
      "site=x.rb:1&limit=500" => "limit must be an integer from 1 to 100",
      "site=x.rb:1&time_limit=10" => "time_limit must be seconds above 0 and at most 5.0",
      "site=x.rb:1&format=xml" => "format must be text or json",
      "site=x.rb:1&keys=yes" => "keys must be 0 or 1",
      "site=x.rb:1&site=y.rb:2" => "parameter site given more than once",
    }.each do |query, message|
      status, _, body = get.call(query)
      assert_equal 400, status, query
      assert_includes body.join, message, query
    end
  ensure
    Heapscope::Rack::RetainersEndpoint::LIMITER.reset
  end
end
