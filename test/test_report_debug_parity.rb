# frozen_string_literal: true

# Issue 33: `?debug=1` and `heapscope top` showed different rows for the same profile: the text kept a
# row per leaf frame and class, listed sites at 0 B, and ranked by its own rules. Now the text is top's
# report (Report::Top): the same rows, in the same order, with the same values and errors, checked here
# on a hand-made profile and on one taken from a real process, against top's table and its JSON.

require_relative "test_report_helper"
require_relative "test_http_helper"
require "json"
require "open3"
require "heapscope/report/cli"
require "heapscope/surfaces/rack"

class TestReportDebugParity < Minitest::Test
  include ReportHelper

  LINE = [["Cache#store", "app/cache.rb", 12], ["main", "app/main.rb", 3]].freeze
  CFUNC = [["String#*", "app/cache.rb", 12], ["Cache#store", "app/cache.rb", 12], ["main", "app/main.rb", 3]].freeze
  GONE = [["Request#parse", "app/request.rb", 7], ["main", "app/main.rb", 4]].freeze
  HEADER = /^\s*flat\s+flat%\s+sum%\s+cum\s+cum%\s+error\s+site$/.freeze
  # A row holding nothing: 0 B flat and cum (the old text listed dead sites so). A caller with 0 B flat
  # and a cum stays, as in top.
  NOTHING = /\A\s*0 B\s+\S+\s+\S+\s+0 B\s/.freeze

  def setup
    @dir = Dir.mktmpdir("heapscope-parity")
    Heapscope::Rack::TEXT_LIMITER.reset
  end

  def teardown
    FileUtils.rm_rf(@dir) if @dir
  end

  # The table of a text: its header row and the rows under it (up to the first blank or note line).
  def table(text)
    lines = text.lines.map(&:chomp)
    start = lines.index { |l| l.match?(HEADER) }
    refute_nil start, text
    lines[start..].take_while { |l| !l.empty? && !l.start_with?("≤", "(") }
  end

  # Both surfaces over one file: [debug text, top's text (-n as the listener's cap), top's JSON].
  def both(path, type: :heap)
    sample = type == :allocs ? "alloc_space" : "inuse_space"
    debug = Heapscope::Rack::TextReport.render(File.binread(path), type: type)
    status, top, err = run_cli("top", path, "-n", Heapscope::Rack::TextReport::ROW_LIMIT.to_s, "--sample", sample)
    assert_equal [0, ""], [status, err]
    _, json, = run_cli("top", path, "-n", Heapscope::Rack::TextReport::ROW_LIMIT.to_s, "--sample", sample, "--json")
    [debug, top, JSON.parse(json)]
  end

  def test_one_line_allocating_two_classes_is_one_row_and_zero_sites_are_hidden
    prof = heapscope_profile([
                               [LINE, [100, 6400, 80, 5120], { "class" => "String" }],
                               [CFUNC, [50, 4000, 40, 3200], { "class" => "Array" }],
                               [GONE, [900, 90_000, 0, 0], { "class" => "Hash" }], # every object died
                             ], sample_every: 16)
    path = write("two-classes.pb.gz", prof)
    debug, top, data = both(path)
    assert_equal table(top), table(debug)
    rows = table(debug).drop(1)
    # One row for the line (String and Array, Ruby and C leaf frames), its caller, and no dead site.
    assert_equal 2, rows.size, debug
    assert_match(%r{\A\s*8\.1 KiB\s+100\.0%\s+100\.0%\s+8\.1 KiB\s+100\.0%\s+±35%\s+Cache#store app/cache\.rb:12\z}, rows[0])
    assert_match(%r{\A\s*0 B\s+0\.0%\s+100\.0%\s+8\.1 KiB\s+100\.0%\s+-\s+main app/main\.rb:3\z}, rows[1])
    refute(rows.any? { |r| r.match?(NOTHING) }, "no row at zero")
    assert_includes debug, "2 more at zero hidden"
    assert_equal [["Cache#store app/cache.rb:12", 8320], ["main app/main.rb:3", 0]], data["entries"].map { |e| [e["name"], e["flat"]] }
    # The allocs text ranks by alloc_space, as top --sample alloc_space does, and lists the dead site.
    debug, top, = both(path, type: :allocs)
    assert_equal table(top), table(debug)
    assert_match(/Request#parse app\/request\.rb:7\z/, table(debug)[1])
  end

  def test_the_variance_profile_has_the_same_rows_and_errors
    prof = heapscope_profile([], sample_every: 100)
    prof.comments << "heapscope sample_every=100 variance=labels windows=120 windowed_on=0.04"
    [[LINE, [1000, 64_000, 800, 8_000_000], { "class" => "String", "inuse_space_var" => 3_600_000_000_000, "inuse_objects_var" => 60_000 }],
     [CFUNC, [500, 32_000, 400, 4_000_000], { "class" => "Array", "inuse_space_var" => 2_800_000_000_000, "inuse_objects_var" => 40_000 }],
     [GONE, [50_000, 9_000_000, 100, 1_000_000], { "class" => "Array", "inuse_space_var" => 1e11.to_i, "inuse_objects_var" => 10_000 }]].each do |frames, values, labels|
      prof.add_sample(frames: frames, values: values, labels: labels)
    end
    path = write("variance.pb.gz", prof)
    debug, top, data = both(path)
    assert_equal table(top), table(debug)
    assert_equal ["Cache#store app/cache.rb:12", "Request#parse app/request.rb:7"], data["entries"].first(2).map { |e| e["name"] }
    cache = table(debug).find { |l| l.include?("Cache#store") }
    # Variances add over the line's two samples (of two classes): sqrt(3.6e12 + 2.8e12) of 12e6.
    assert_includes cache, Heapscope::Report::Units.error(data["entries"][0]["relative_error"])
    assert_includes cache, "±21%"
  end

  # A real process, sampled at every allocation: lines that allocate several classes (a String and
  # the Array holding it), objects that all died, and C functions under a Ruby line.
  def test_a_real_profile_reads_the_same_through_the_listener_and_top
    skip "the C extension is not built (bundle exec rake compile)" unless File.exist?(SurfacesTestHelper::NATIVE)
    script = <<~RUBY
      require "heapscope"
      require "heapscope/surfaces/rack"
      Heapscope.start(sample_every: 1, max_overhead: nil)
      KEEP = []
      def keep(n) = n.times { KEEP << ["x" * 100, { n => n }] }
      def churn(n) = n.times { ["y" * 100] }
      keep(300)
      churn(2000)
      KEEP.concat(Array.new(50) { |i| "z" * (i + 200) })
      GC.start
      bytes = Heapscope.profile(gc: true)
      File.binwrite(ARGV[0], bytes)
      File.write(ARGV[1], Heapscope::Rack::TextReport.render(bytes, type: :heap))
    RUBY
    path = File.join(@dir, "real.pb.gz")
    text = File.join(@dir, "real.txt")
    _, err, status = Open3.capture3(RbConfig.ruby, "-I#{SurfacesTestHelper::LIB}", "-e", script, path, text)
    assert status.success?, err
    debug = File.read(text)
    _, top, = run_cli("top", path, "-n", Heapscope::Rack::TextReport::ROW_LIMIT.to_s, "--sample", "inuse_space")
    assert_equal table(top), table(debug)
    rows = table(debug).drop(1)
    assert_operator rows.size, :>=, 2, debug
    refute(rows.any? { |r| r.match?(NOTHING) }, "no row at zero:\n#{debug}")
    keep = rows.grep(/-e:5\z/)
    assert_equal 1, keep.size, "the line allocating a String, an Array and a Hash is one row:\n#{debug}"
    assert_empty rows.grep(/-e:6\z/), "the churned line holds nothing and is hidden:\n#{debug}"
  end
end
