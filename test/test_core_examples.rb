# frozen_string_literal: true

require_relative "core_helper"
require "json"
require "stringio"
require "open3"
require "heapscope/surfaces/rack"
require "heapscope/surfaces/http_server"
require "heapscope/report/cli"

# What a site's sampled objects hold (Heapscope.examples, ext/heapscope/previews.c): no method of the
# application's runs, big objects preview in bounded time and bytes, contents only with the operator's
# consent (API, HTTP and CLI), bad input is refused clearly. (named test_core_* so CI's ASan run
# covers the C reading)
class TestCoreExamples < Minitest::Test
  include CoreHelper

  FILE = File.basename(__FILE__)
  SECRET = "SECRET-TOKEN-5f3a"

  # Every method a careless preview would call records the call and raises.
  module Booby
    CALLS = []

    %i[inspect to_s hash == eql? method_missing respond_to? respond_to_missing? class instance_variables
       size length bytesize encoding each keys].each do |name|
      define_method(name) do |*|
        CALLS << name
        raise "#{name} of an application object was called"
      end
    end
  end

  class Suspect
    include Booby

    def initialize(name)
      @name = name
      @payload = [name]
    end
  end

  class SuspectString < String
    include Booby
  end

  class SuspectArray < Array
    include Booby
  end

  class SuspectHash < Hash
    include Booby
  end

  def teardown
    $heapscope_examples = nil
    Booby::CALLS.clear
    Heapscope::Rack::ExamplesEndpoint::LIMITER.reset
    super
  end

  def start(consent)
    Heapscope.start(sample_every: 1, max_overhead: nil, sampling: :always, show_contents: consent)
  end

  def site(marker)
    "#{FILE}:#{line_of(marker, __FILE__)}"
  end

  # Classes overriding inspect, to_s, hash, ==, method_missing, respond_to? (and class, size, each...)
  # are previewed with none of them running: as objects, as a String, an Array and a Hash subclass, as
  # a Hash's keys and as elements.
  def test_an_application_class_is_previewed_without_its_methods_running
    start(true)
    $heapscope_examples = [] # (an Array: a Hash would call #hash)
    $heapscope_examples << Suspect.new("first") # SUSPECT SITE
    $heapscope_examples << SuspectString.new("suspect bytes") # SUSPECT STRING SITE
    $heapscope_examples << SuspectArray.new([Suspect.allocate, 1, :a]) # SUSPECT ARRAY SITE
    by_identity = {}.compare_by_identity
    by_identity[Suspect.allocate] = Suspect.allocate
    $heapscope_examples << by_identity
    $heapscope_examples << SuspectHash.new # SUSPECT HASH SITE
    reports = ["# SUSPECT SITE", "# SUSPECT STRING SITE", "# SUSPECT ARRAY SITE", "# SUSPECT HASH SITE"].map do |marker|
      Heapscope.examples(site(marker))
    end
    hash_report = Heapscope.examples("#{FILE}:#{line_of("by_identity = {}", __FILE__)}")
    texts = (reports + [hash_report]).map { |r| Heapscope::Examples.text(r) }
    assert_empty Booby::CALLS, "application methods ran: #{Booby::CALLS.uniq.inspect}"

    object = reports[0][:examples].find { |e| e[:class] == "TestCoreExamples::Suspect" }
    assert_equal({ type: :object, ivar_count: 2, ivars: %w[@name @payload] }, object.slice(:type, :ivar_count, :ivars))
    string = reports[1][:examples].find { |e| e[:class] == "TestCoreExamples::SuspectString" }
    assert_equal({ type: :string, bytesize: 13, encoding: "UTF-8", head: '"suspect bytes"' }, string.slice(:type, :bytesize, :encoding, :head))
    array = reports[2][:examples].find { |e| e[:class] == "TestCoreExamples::SuspectArray" }
    assert_equal [["TestCoreExamples::Suspect", 1], ["Integer", 1], ["Symbol", 1]], array[:elements]
    hash = hash_report[:examples].find { |e| e[:type] == :hash }
    assert_equal [["TestCoreExamples::Suspect", 1]], hash[:key_classes]
    assert_equal ["#<TestCoreExamples::Suspect>"], hash[:keys], "an application object as a key: by class only, even with consent"
    assert_includes texts[0], "instance variables: @name, @payload"
    assert_includes texts[2], "3 elements: TestCoreExamples::Suspect x1, Integer x1, Symbol x1"
    assert(reports[3][:examples].any? { |e| e[:class] == "TestCoreExamples::SuspectHash" && e[:length].zero? })
    # The report is plain data: nothing of the application's is in it.
    JSON.generate(reports + [hash_report])
    assert_empty Booby::CALLS
  end

  # A 10 MB String and a million-element Array preview in bounded time and bytes: only the String's
  # first 64 bytes and the Array's first 10,000 elements are read.
  def test_big_objects_preview_in_bounded_time_and_bytes
    start(true)
    $heapscope_examples = ["y" * 10_000_000] # BIG STRING SITE
    $heapscope_examples << Array.new(1_000_000) { |i| i } # BIG ARRAY SITE
    Heapscope.examples(site("# BIG STRING SITE")) # (warm: the frames' names are read once)
    [["# BIG STRING SITE", :string], ["# BIG ARRAY SITE", :array]].each do |marker, type|
      took = Float::INFINITY
      report = nil
      3.times do
        t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        report = Heapscope.examples(site(marker))
        took = [took, Process.clock_gettime(Process::CLOCK_MONOTONIC) - t].min
      end
      assert_operator took, :<, 0.05, "#{type}: #{(took * 1000).round(1)} ms"
      example = report[:examples].find { |e| e[:type] == type }
      text = Heapscope::Examples.text(report)
      assert_operator text.bytesize, :<, 2000, text
      assert_operator JSON.generate(report).bytesize, :<, 4000
      if type == :string
        assert_equal 10_000_000, example[:bytesize]
        assert_operator example[:size], :>=, 10_000_000
        assert_equal "\"#{"y" * 64}\"...", example[:head]
      else
        assert_equal [1_000_000, 10_000, [["Integer", 10_000]]], example.values_at(:length, :scanned, :elements)
        assert_includes text, "1000000 elements (classes of the first 10000): Integer x10000"
      end
    end
  end

  # Rendering allocates: under GC.stress with compaction every allocation runs a GC that may move
  # objects. The picked objects and the keys and classes being rendered are pinned (a moved or freed one
  # would read garbage: ASan's run checks it), after a compaction between sampling and the call. In a
  # child process: its small heap keeps a GC per allocation affordable.
  STRESS_SCRIPT = <<~'RUBY'
    require "heapscope"
    Heapscope.start(sample_every: 1, max_overhead: nil, sampling: :always, show_contents: true)
    Quote = Class.new { def hash = raise("hash called") }
    keys = Array.new(3) { |i| [+"key #{i}", i] }
    values = Array.new(3) { Quote.allocate }
    kept = Array.new(3) { |i| { keys[i] => values[i] } } # STRESS SITE
    GC.verify_compaction_references(toward: :empty)
    GC.auto_compact = true
    GC.stress = true
    report = Heapscope.examples("-e:6", max: 10)
    GC.stress = false
    report[:examples].select { |e| e[:type] == :hash && e[:length] == 1 }.each { |e| puts [e[:key_classes], e[:value_classes], e[:keys]].inspect }
    kept.clear
  RUBY

  def test_objects_stay_pinned_while_rendered_under_gc_stress_and_compaction
    out, err, status = Open3.capture3(RbConfig.ruby, "-I#{File.expand_path("../lib", __dir__)}", "-e", STRESS_SCRIPT)
    assert status.success?, err
    lines = out.lines.map(&:chomp)
    assert_equal 3, lines.size, out + err
    lines.each { |line| assert_match(/\A\[\[\["Array", 1\]\], \[\["Quote", 1\]\], \["\[\\"key \d\\", \d\]"\]\]\z/, line) }
  end

  def fill_secrets
    $heapscope_examples = [+"#{SECRET} in a string"] # SECRET STRING SITE
    $heapscope_examples << { "#{SECRET} as a key" => 1, secret_symbol_key: 2, ["#{SECRET} in a key", 7, [1]] => 3 } # SECRET HASH SITE
  end

  # Without consent no String byte or key shows anywhere: the API's report, its text and JSON, the HTTP
  # endpoint (text and JSON) and the CLI against the listener. With consent the first bytes do.
  def test_contents_only_with_the_operators_consent
    [false, true].each do |consent|
      start(consent)
      fill_secrets
      outputs = []
      ["# SECRET STRING SITE", "# SECRET HASH SITE"].each do |marker|
        report = Heapscope.examples(site(marker))
        outputs << report.inspect << Heapscope::Examples.text(report) << JSON.generate(report)
        assert_equal consent, report[:contents]
        app = Heapscope::Rack.app
        %w[text json].each do |format|
          Heapscope::Rack::ExamplesEndpoint::LIMITER.reset
          status, _, body = app.call("REQUEST_METHOD" => "GET", "PATH_INFO" => "/debug/pprof/examples",
                                     "QUERY_STRING" => "site=#{site(marker)}&format=#{format}")
          assert_equal 200, status, body.join
          outputs << body.join
        end
      end
      outputs << cli_output(site("# SECRET STRING SITE")) << cli_output(site("# SECRET HASH SITE"), "--json")
      all = outputs.join("\n")
      if consent
        assert_includes all, "\"#{SECRET} in a string\""
        assert_includes all, "first keys: \"#{SECRET} as a key\", :secret_symbol_key, [\"#{SECRET} in a key\", 7, #<Array>]"
      else
        refute_includes all, "SECRET", "contents leaked without consent"
        refute_includes all, "secret_symbol_key"
        assert_includes all, "String and key contents hidden"
        assert_includes all, "keys String x1, Symbol x1, Array x1; values Integer x3"
      end
      Heapscope.stop
    end
  end

  def cli_output(site, *flags)
    Heapscope::Rack::ExamplesEndpoint::LIMITER.reset
    server = Heapscope::HttpServer.new(host: "127.0.0.1", port: 0).start
    out = StringIO.new
    err = StringIO.new
    status = Heapscope::Report::CLI.run("examples", ["http://127.0.0.1:#{server.port}", site, *flags], out: out, err: err)
    assert_equal 0, status, err.string
    out.string
  ensure
    server&.stop
  end

  def test_bad_arguments_are_refused_clearly
    start(false)
    ["nope", "file.rb", "file.rb:0", ":12", "", nil].each do |bad|
      error = assert_raises(ArgumentError) { Heapscope.examples(bad) }
      assert_match(/site must be FILE:LINE/, error.message)
    end
    [0, 101, "5", 2.0, nil].each do |bad|
      error = assert_raises(ArgumentError) { Heapscope.examples("a.rb:1", max: bad) }
      assert_match(/max must be an Integer from 1 to 100/, error.message)
    end
    report = Heapscope.examples("nowhere.rb:1")
    assert_equal 0, report[:sampled]
    assert_includes Heapscope::Examples.text(report), "no sampled live object was allocated there"
    Heapscope.stop
    assert_match(/not running/, assert_raises(Heapscope::Error) { Heapscope.examples("a.rb:1") }.message)
  end

  def test_the_http_endpoint_statuses
    start(false)
    fill_secrets
    app = Heapscope::Rack.app
    get = ->(query) { app.call("REQUEST_METHOD" => "GET", "PATH_INFO" => "/debug/pprof/examples", "QUERY_STRING" => query) }
    status, headers, body = get.call("site=#{site("# SECRET HASH SITE")}&max=20&format=json")
    assert_equal 200, status, body.join
    assert_equal "application/json", headers["content-type"]
    report = JSON.parse(body.join)
    assert_includes report["examples"].map { |e| e["class"] }, "Hash"
    # One read per second: the next is refused with Retry-After.
    status, headers, body = get.call("site=#{site("# SECRET HASH SITE")}")
    assert_equal 429, status
    assert_match(/\A\d+\z/, headers["retry-after"])
    assert_includes body.join, "retry in"
    {
      "" => "site is required",
      "site=x" => "site must be FILE:LINE",
      "site=x.rb:0" => "site must be FILE:LINE",
      "site=x.rb:1&max=0" => "max must be an integer from 1 to 20",
      "site=x.rb:1&max=21" => "max must be an integer from 1 to 20",
      "site=x.rb:1&format=xml" => "format must be text or json",
      "site=x.rb:1&max=1&max=2" => "parameter max given more than once",
    }.each do |query, message|
      Heapscope::Rack::ExamplesEndpoint::LIMITER.reset
      status, _, body = get.call(query)
      assert_equal 400, status, query
      assert_includes body.join, message, query
    end
    Heapscope.stop
    Heapscope::Rack::ExamplesEndpoint::LIMITER.reset
    status, _, body = get.call("site=x.rb:1")
    assert_equal 503, status
    assert_includes body.join, "not running"
    status, = app.call("REQUEST_METHOD" => "POST", "PATH_INFO" => "/debug/pprof/examples", "QUERY_STRING" => "site=x.rb:1")
    assert_equal 405, status
  end

  def test_the_cli_refuses_bad_input_in_one_line
    [[["http://127.0.0.1:1", "a.rb:1", "--max", "0"], /--max must be from 1 to 20/],
     [["ftp://x", "a.rb:1"], /URL must be http:\/\/ or https:\/\//],
     [["http://127.0.0.1:1"], /URL and FILE:LINE/]].each do |argv, message|
      out = StringIO.new
      err = StringIO.new
      assert_equal 2, Heapscope::Report::CLI.run("examples", argv, out: out, err: err), argv.inspect
      assert_match(message, err.string)
      assert_equal 1, err.string.lines.size
    end
  end
end
