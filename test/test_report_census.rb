# frozen_string_literal: true

# Numbers that add up (issue 31): a profile that carries the exact census of the live heap ("heapscope
# census..." comment lines, written in C at every snapshot) shows, per class and per type, the exact
# total, what the sampled sites account for, and the rest "not seen at any site" with the error of the
# sites' sum; a site never reads above its class's exact total; the memory breakdown uses the exact
# bytes. Profiles without a census read exactly as before. Profiles are built with the project's own
# writer; go tool pprof checks they stay valid pprof.

require_relative "test_report_helper"
require "json"
require "heapscope/report/cli"
require "heapscope/report/census"
require "heapscope/surfaces/rack"

class TestReportCensus < Minitest::Test
  include ReportHelper
  Census = Heapscope::Report::Census
  Top = Heapscope::Report::Top

  MIB = 1024 * 1024
  A = [["Cache#store", "app/cache.rb", 12], ["main", "app/main.rb", 3]].freeze
  B = [["Worker#spawn", "app/worker.rb", 7], ["main", "app/main.rb", 4]].freeze
  C = [["Parser#read", "app/parser.rb", 20], ["main", "app/main.rb", 5]].freeze
  SETTINGS = "sample_every=1000 current_sample_every=1000 max_overhead=0.01 max_frames=64 min_age=%d track_sizes=true"
  VARIANCE = "sampling=always share=1 sample_every=1000 current_sample_every=1000 rate_lowered=false windows=0 variance=labels"
  MEMORY = "heapscope memory: rss=#{120 * MIB} rss_anon=#{100 * MIB} rss_file=#{20 * MIB} heap_pages=100 " \
           "heap_page_size=65536 slot_size=40 heap_live_slots=10000 heap_free_slots=100"

  # The census of the examples below: String 8 MiB, Thread 1 MiB (12 objects), Hash 2 MiB, an anonymous
  # class, and 20 MiB of others in 100 classes.
  def census_lines(min_age: 0)
    ["heapscope census: seconds=0.004210 objects=200000 bytes=#{32 * MIB} classes=104 classes_listed=4 bounded_samples=2 min_age=#{min_age}",
     "heapscope census type: objects=150000 bytes=#{9 * MIB} name=T_STRING",
     "heapscope census type: objects=12 bytes=#{1 * MIB} name=T_DATA",
     "heapscope census type: objects=49988 bytes=#{22 * MIB} name=T_HASH",
     "heapscope census class: objects=100000 bytes=#{8 * MIB} type=T_STRING name=String",
     "heapscope census class: objects=12 bytes=#{1 * MIB} type=T_DATA name=Thread",
     "heapscope census class: objects=20000 bytes=#{2 * MIB} type=T_HASH name=Hash",
     "heapscope census class: objects=7 bytes=700 type=T_OBJECT name=<anonymous subclass of Foo>"]
  end

  # rows: [frames, inuse_objects, inuse_space, inuse_space_var, class]; alloc values mirror inuse.
  def profile(rows, census: census_lines, min_age: 0, memory: false)
    prof = heapscope_profile([], sample_every: 1000)
    prof.comments.push(format(SETTINGS, min_age), VARIANCE).concat(census)
    prof.comments << MEMORY if memory
    rows.each do |frames, objects, bytes, var, klass|
      labels = { "class" => klass, "inuse_space_var" => var, "inuse_objects_var" => objects * 999 }
      prof.add_sample(frames: frames, values: [objects, bytes, objects, bytes], labels: labels)
    end
    prof
  end

  # String: 5 MiB at A (var 1 MiB²... written as bytes²); Thread: two sites of 800 KiB each, 1.6 MiB
  # together against 1 MiB exact; Hash 1 MiB at C.
  def example
    profile([[A, 5000, 5 * MIB, (1 * MIB)**2, "String"],
             [B, 1000, 800 * 1024, (400 * 1024)**2, "Thread"],
             [A, 1000, 800 * 1024, (300 * 1024)**2, "Thread"],
             [C, 1000, 1 * MIB, (512 * 1024)**2, "Hash"]])
  end

  def setup
    @dir = Dir.mktmpdir("heapscope-census")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  def test_parses_the_lines_names_with_spaces_included
    c = Census.of(example)
    assert_in_delta 0.00421, c.seconds, 1e-9
    assert_equal [200_000, 32 * MIB, 104, 4, 2, 0], [c.objects, c.bytes, c.classes, c.classes_listed, c.bounded_samples, c.min_age]
    assert_equal ["T_OBJECT", 7, 700, nil], c.class_totals["<anonymous subclass of Foo>"], "no sq_bytes: unknown"
    assert_equal [150_000, 9 * MIB, nil], c.types["T_STRING"]
    assert_equal 1 * MIB, c.exact("Thread", "inuse_space")
    assert_equal 12, c.exact("Thread", "inuse_objects")
    assert_nil c.exact("Thread", "alloc_space"), "allocations are not what is alive"
    assert_equal 0, c.ignored
  end

  def test_reads_the_header_as_ext_heapscope_census_c_writes_it
    # The C writer leaves min_age out of the header (the census covers every age); these lines are
    # from a real profile (docs/reading-profiles.md).
    c = Census.parse(["heapscope census: seconds=0.002326 objects=56350 bytes=7396125 classes=79 classes_listed=36 bounded_samples=1",
                      "heapscope census type: objects=2189 bytes=197792 name=T_OBJECT",
                      "heapscope census class: objects=40405 bytes=2966639 type=T_STRING name=String",
                      "heapscope census class: objects=2 bytes=1049424 type=T_DATA name=Thread"])
    refute_nil c
    assert_equal [56_350, 7_396_125, 1, 0], [c.objects, c.bytes, c.bounded_samples, c.min_age]
    assert_equal ["T_DATA", 2, 1_049_424, nil], c.class_totals["Thread"]
  end

  # The samples' own error cannot see objects no sample found: a class's sum of squared sizes (the
  # census's sq_bytes) gives the error sampling at 1 in w has over all its objects, (w - 1) x sq_bytes,
  # and a bytes row takes the larger.
  def test_unseen_big_objects_widen_the_error_of_what_no_site_saw
    # 150,000 small Strings (40 bytes) and 100 of 40 KiB; the samples found 150 small ones only.
    sq = 150_000 * 40.0**2 + 100 * 40_960.0**2
    census = ["heapscope census: seconds=0.001 objects=150100 bytes=10096000 classes=1 classes_listed=1 " \
              "bounded_samples=0 sq_bytes=#{format("%.6e", sq)}",
              "heapscope census type: objects=150100 bytes=10096000 sq_bytes=#{format("%.6e", sq)} name=T_STRING",
              "heapscope census class: objects=150100 bytes=10096000 sq_bytes=#{format("%.6e", sq)} type=T_STRING name=String"]
    prof = profile([[A, 150_000, 6_000_000, 999 * 150 * 40.0**2 * 1000, "String"]], census: census)
    c = Census.of(prof)
    assert_in_delta sq, c.class_totals["String"][3], sq * 1e-6
    bytes = c.report(prof, prof.sample_index("inuse_space"))["rows"].find { |r| r["name"] == "String" }
    assert_in_delta Math.sqrt(999 * sq), bytes["error"], Math.sqrt(999 * sq) * 1e-5
    objects = c.report(prof, prof.sample_index("inuse_objects"))["rows"].find { |r| r["name"] == "String" }
    assert_operator objects["error"].to_f, :<, 150_100, "objects keep the samples' own error"
  end

  def test_samples_of_classes_the_census_does_not_list_count_under_other_classes
    prof = profile([[A, 5000, 5 * MIB, (1 * MIB)**2, "String"], [C, 10, 300_000, 100_000**2, "Unlisted"],
                    [C, 10, 200_000, 100_000**2, nil]].map { |r| r[4].nil? ? r[0..3] + ["x"] : r })
    prof.samples.last.labels.delete("class")
    data = Top.report(prof, sample: "inuse_space")
    other = data["census"]["other"]
    assert_equal 500_000, other["at_sites"], "the unlisted class and the sample without a class label"
    assert_equal 32 * MIB - 8 * MIB - 2 * MIB - 1 * MIB - 700, other["exact"]
    assert_in_delta Math.sqrt(2) * 100_000, other["error"], 1
    status, out, err = run_cli("top", write("j.pb.gz", prof), "--json")
    assert_equal 0, status, err
    assert_equal other["at_sites"], JSON.parse(out)["census"]["other"]["at_sites"]
  end

  def test_rows_add_up_and_carry_the_error_of_the_class_as_one_site
    prof = example
    data = Census.of(prof).report(prof, prof.sample_index("inuse_space"))
    rows = data["rows"].to_h { |r| [r["name"], r] }
    string = rows.fetch("String")
    assert_equal [8 * MIB, 5 * MIB, 3 * MIB], string.values_at("exact", "at_sites", "not_seen")
    assert_in_delta 1 * MIB, string["error"], 1, "one sample: its own variance"
    thread = rows.fetch("Thread")
    assert_equal 1600 * 1024, thread["at_sites"], "both sites of Thread"
    assert_equal 1 * MIB - 1600 * 1024, thread["not_seen"], "never rescaled: the remainder is negative"
    assert_in_delta 500 * 1024, thread["error"], 1, "variances of a class's samples add: sqrt(400² + 300²) KiB"
    # The rows, "other classes" included, add up to the census's total and to the profile's.
    all = data["rows"] + [data["other"]]
    assert_equal 32 * MIB, all.sum { |r| r["exact"] }
    assert_equal prof.samples.sum { |s| s.values[3] }, all.sum { |r| r["at_sites"] }
    assert_equal 100, data["other"]["count"], "104 classes, 4 shown"
    # Rows per type: a class line's type says whose sites they are.
    types = data["types"].to_h { |r| [r["name"], r] }
    assert_equal 1600 * 1024, types["T_DATA"]["at_sites"]
    assert_equal 22 * MIB - 1 * MIB, types["T_HASH"]["not_seen"]
    # By objects the same, from the objects' columns.
    objects = Census.of(prof).report(prof, prof.sample_index("inuse_objects"))["rows"].to_h { |r| [r["name"], r] }
    assert_equal [12, 2000, -1988], objects["Thread"].values_at("exact", "at_sites", "not_seen")
  end

  # One class's or type's row on its own (what bench/accuracy checks a site's class by) is the row the
  # report shows, whether or not the report lists it among its first rows; nil for what the census lacks.
  def test_one_class_or_type_row_is_the_reports_row
    prof = example
    census = Census.of(prof)
    %w[inuse_space inuse_objects].each do |type|
      ti = prof.sample_index(type)
      data = census.report(prof, ti)
      data["rows"].each { |r| assert_equal r, census.class_row(prof, ti, r["name"]), "#{type} #{r["name"]}" }
      data["types"].each { |r| assert_equal r, census.type_row(prof, ti, r["name"]), "#{type} #{r["name"]}" }
      assert_nil census.class_row(prof, ti, "NoSuchClass")
      assert_nil census.type_row(prof, ti, "T_STRUCT")
    end
    assert_nil census.class_row(prof, prof.sample_index("alloc_space"), "String"), "allocations are not what is alive"
  end

  # A class the census names as recorded whole (a Thread subclass under exact_threads) has nothing
  # unseen by chance: its row's error is its samples' own (0: they are exact). The line counts only in a
  # profile that says exact_threads=true.
  def test_classes_named_as_recorded_whole_have_an_exact_row
    big = "<anonymous subclass of Foo>"
    lines = census_lines.map { |l| l.end_with?("name=#{big}") ? l.sub("bytes=700", "bytes=700 sq_bytes=7.0e+06") : l }
    [[[], true], [["exact_threads=true exact_tracked=0 skipped_exact=0"], false]].each do |extra, wide|
      prof = profile([], census: lines + extra + ["heapscope exact class: name=#{big}"])
      assert_equal !wide, Heapscope::Report::Sampling.new(prof).exact_classes.include?(big)
      row = Census.of(prof).class_row(prof, prof.sample_index("inuse_space"), big)
      assert_equal wide, row["error"].positive?, "exact_threads=#{!wide}: #{row}"
    end
  end

  # A profile taken before any sample (just after start, or at a very sparse rate) still has its census:
  # every row is all "not seen", and top reads it (it raised NoMethodError on the empty sum).
  def test_a_profile_without_samples_reads_its_census
    prof = profile([])
    data = Top.report(prof, sample: "inuse_space")
    string = data["census"]["rows"].find { |r| r["name"] == "String" }
    assert_equal [8 * MIB, 0, 8 * MIB], string.values_at("exact", "at_sites", "not_seen")
    assert_equal 0, data["census"]["other"]["at_sites"]
  end

  def test_the_census_error_is_the_error_top_gives_the_class
    prof = example
    data = Top.report(prof, by: "class", sample: "inuse_space")
    string = data["entries"].find { |e| e["name"] == "String" }
    census = data["census"]["rows"].find { |r| r["name"] == "String" }
    assert_in_delta string["relative_error"] * string["flat"], census["error"], 1e-3 * census["error"]
  end

  def test_with_variance_groups_a_class_sums_its_groups_not_its_sites_variances
    # The worked example of test_report_variance_groups: two samples made in the same windows, parts of
    # 100 objects in even groups and 60 in odd ones each; here both are String, at two lines. As one
    # site their summed groups give an error of 177.7 objects; adding the two sites' own variances
    # would give sqrt(2) x 88.9 = 125.7, too small: they are correlated.
    parts = (0...16).to_h { |g| ["inuse_objects_vg#{g}", g.even? ? 100 : 60] }
    prof = heapscope_profile([], sample_every: 100)
    prof.comments.push(format(SETTINGS, 0),
                       "sampling=windowed share=0.04 sample_every=100 current_sample_every=100 rate_lowered=false " \
                       "windows=400 hook_on_share=0.04 allocations=400000 skipped_own=0 variance=groups",
                       "variance_groups=16 group_allocations=#{Array.new(16, 1000).join(",")}",
                       "heapscope census: seconds=0.001 objects=5000 bytes=500000 classes=1 classes_listed=1 bounded_samples=0 min_age=0",
                       "heapscope census type: objects=5000 bytes=500000 name=T_STRING",
                       "heapscope census class: objects=5000 bytes=500000 type=T_STRING name=String")
    [A, B].each { |f| prof.add_sample(frames: f, values: [0, 0, 640, 64_000], labels: parts.merge("class" => "String")) }
    data = Census.of(prof).report(prof, prof.sample_index("inuse_objects"))
    string = data["rows"][0]
    assert_equal [5000, 1280, 3720], string.values_at("exact", "at_sites", "not_seen")
    assert_in_delta 177.7, string["error"], 0.3
    assert_in_delta 177.7, data["types"][0]["error"], 0.3, "the type's sites are the same samples"
  end

  def test_top_prints_the_rows_and_the_negative_remainder_in_words
    status, out, err = run_cli("top", write("c.pb.gz", example))
    assert_equal 0, status, err
    assert_includes out, "exact totals (census, 4.2 ms): 200,000 objects, 32.0 MiB in 104 classes"
    assert_match(/^  String\s+8\.0 MiB\s+5\.0 MiB  3\.0 MiB ±1\.0 MiB$/, out)
    assert_match(/^  Thread\s+1\.0 MiB\s+1\.6 MiB  sites' estimates exceed the exact total by 576 KiB \(±500 KiB: sampling error\)$/, out)
    assert_match(/^  other classes \(100\)\s+21\.0 MiB\s+0 B  21\.0 MiB$/, out)
    assert_match(/^  T_STRING\s+9\.0 MiB\s+5\.0 MiB/, out)
  end

  def test_a_site_never_reads_above_its_classs_exact_total
    # Thread at B: 1.5 MiB in one site, 1 MiB exact. Site A mixes String and Thread: only its Thread
    # part is bounded.
    prof = profile([[B, 1000, 1536 * 1024, (700 * 1024)**2, "Thread"],
                    [A, 1000, 1536 * 1024, (700 * 1024)**2, "Thread"],
                    [A, 5000, 5 * MIB, (1 * MIB)**2, "String"]])
    data = Top.report(prof, sample: "inuse_space")
    rows = data["entries"].to_h { |e| [e["name"], e] }
    b = rows.fetch("Worker#spawn app/worker.rb:7")
    assert_equal [1 * MIB, ["Thread"], 1536 * 1024], b.values_at("flat", "bounded_by", "flat_estimate")
    a = rows.fetch("Cache#store app/cache.rb:12")
    assert_equal 6 * MIB, a["flat"], "String's 5 MiB plus Thread's part bounded at 1 MiB"
    main = rows.fetch("main app/main.rb:4")
    assert_equal [0, 1 * MIB, nil, 1536 * 1024], main.values_at("flat", "cum", "flat_estimate", "cum_estimate"), "cum is bounded too"
    text = Top.text(data)
    assert_match(/^≤1\.0 MiB .* Worker#spawn app\/worker\.rb:7$/, text)
    assert_match(/^ +0 B .* ≤1\.0 MiB .* main app\/main\.rb:4$/, text, "only the bounded column is marked")
    assert_includes text, "≤ Worker#spawn app/worker.rb:7: bounded by Thread's exact total (census); the estimate was flat 1.5 MiB, cum 1.5 MiB"
    # By class: the row itself.
    by_class = Top.report(prof, by: "class", sample: "inuse_space")["entries"].to_h { |e| [e["name"], e] }
    assert_equal 1 * MIB, by_class["Thread"]["flat"]
    assert_nil by_class["String"]["bounded_by"]
    # ?debug=1: top's rows (issue 33), bounded as top bounds them.
    debug = Heapscope::Rack::TextReport.render(prof.to_pprof, type: :heap)
    assert_match(/^≤1\.0 MiB .* Worker#spawn app\/worker\.rb:7$/, debug)
    assert_includes debug, "≤ Worker#spawn app/worker.rb:7: bounded by Thread's exact total (census); the estimate was flat 1.5 MiB"
    assert_match(/^  Thread +1\.0 MiB/, debug)
    refute_includes debug, "# heapscope census class:", "the raw lines are the rows"
    # Nor the census's names of classes recorded whole: they are part of the rows' errors.
    prof.comments << "heapscope exact class: name=Thread"
    refute_includes Heapscope::Rack::TextReport.render(prof.to_pprof, type: :heap), "heapscope exact class"
  end

  # The default min_age is 1: the rows stay, and say that the young objects the sites leave out are
  # part of the remainder.
  def test_min_age_profiles_say_the_remainder_holds_young_objects
    prof = profile([[A, 5000, 5 * MIB, (1 * MIB)**2, "String"]], min_age: 2)
    data = Top.report(prof, sample: "inuse_space")
    refute_nil data["census"]["rows"]
    assert_includes Top.text(data), "sites leave out objects younger than min_age=2 GCs; the census counts every age, " \
                                    "so \"not seen at any site\" includes them"
    assert_includes Top.text(data), "not seen at any site"
    # The census's own min_age=0 is not the profile's.
    assert_equal 2, Census.of(prof).profile_min_age
  end

  def test_allocation_views_get_no_rows
    data = Top.report(example, sample: "alloc_space")
    assert_nil data["census"]
    refute_includes Top.text(data), "exact totals"
  end

  def test_hostile_census_lines_are_bounded_and_ignored
    huge = "9" * 25
    lines = census_lines + [
      "heapscope census class: objects=#{huge} bytes=1 type=T_STRING name=Huge",
      "heapscope census class: objects=1 bytes=1 type=T_STRING name=",
      "heapscope census class: objects=1 bytes=1 type=lower name=X",
      "heapscope census type: objects=-1 bytes=1 name=T_STRING",
      "heapscope census class: objects=1 bytes=1 type=T_STRING name=#{"x" * 20_000}",
      "heapscope census: seconds=NaN objects=1",
    ]
    c = Census.parse(lines)
    assert_equal 6, c.ignored
    assert_nil c.class_totals["Huge"]
    assert_equal 4, c.class_totals.size
    # A million lines: read up to the cap, in bounded time, no exception.
    many = census_lines + Array.new(1_000_000) { |i| "heapscope census class: objects=0 bytes=0 type=T_OBJECT name=C#{i}" }
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    c = Census.parse(many)
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - t, :<, 5
    assert_equal 1_000_008 - Census::MAX_LINES, c.ignored
    assert_equal Census::MAX_LINES - 8 + 4, c.class_totals.size
    # Lines that contradict the totals, or no header: no census at all, and the reports read as without.
    assert_nil Census.parse(census_lines.drop(1))
    assert_nil Census.parse(census_lines + ["heapscope census class: objects=1 bytes=#{40 * MIB} type=T_DATA name=Big"])
    prof = profile([[A, 5000, 5 * MIB, (1 * MIB)**2, "String"]], census: census_lines.drop(1))
    assert_nil Top.report(prof)["census"]
  end

  def test_a_hostile_profile_through_top_and_debug_text
    lines = census_lines + ["heapscope census class: objects=1 bytes=1 type=T_STRING name=\e[2Jevil\r"] +
            Array.new(200_000) { "heapscope census type: objects=#{"1" * 20} bytes=#{"1" * 20} name=T_OBJECT" }
    prof = profile([[A, 5000, 5 * MIB, (1 * MIB)**2, "String"]], census: lines)
    status, out, err = run_cli("top", write("h.pb.gz", prof))
    assert_equal 0, status, err
    refute_includes out, "\e[2J", "names reach the terminal escaped"
    assert_includes out, "census lines ignored"
    debug = Heapscope::Rack::TextReport.render(prof.to_pprof, type: :heap)
    assert_operator debug.lines.size, :<, 200, "the raw census lines are not echoed"
  end

  def test_profiles_without_a_census_read_as_before
    plain = profile([[A, 5000, 5 * MIB, (1 * MIB)**2, "String"]], census: [], memory: true)
    data = Top.report(plain, sample: "inuse_space")
    assert_nil data["census"]
    assert_nil data["entries"][0]["bounded_by"]
    text = Top.text(data)
    refute_includes text, "exact totals"
    refute_includes text, "≤"
    assert_includes text, "profiled objects  5.0 MiB (this profile's inuse_space, estimated;"
    refute_includes Heapscope::Rack::TextReport.render(plain.to_pprof, type: :heap), "census"
    refute_includes Heapscope::Report::Flamegraph.html(plain, path: "p.pb.gz"), "hs-census\""
  end

  def test_the_memory_breakdown_uses_the_exact_bytes
    prof = profile([[A, 5000, 5 * MIB, (1 * MIB)**2, "String"]], memory: true)
    parts = Heapscope::Memory.of_profile(prof)
    assert_equal 32 * MIB, parts[:profiled]
    assert_equal 1, parts[:profiled_exact]
    assert_equal 32 * MIB - 200_000 * 40, parts[:profiled_malloc], "slots from the census's object count"
    text = Top.text(Top.report(prof))
    assert_includes text, "profiled objects  32.0 MiB (all live objects, exact (census); "
    refute_includes text, "young and VM-internal"
    assert_includes Heapscope::Memory.to_json(parts), "\"profiled_exact\":1"
  end

  def test_the_flame_graph_page_has_the_table
    prof = example
    prof.comments << "heapscope census class: objects=1 bytes=1 type=T_OBJECT name=<script>x</script>"
    html = Heapscope::Report::Flamegraph.html(prof, path: "c.pb.gz")
    table = html[%r{<table id="hs-census">.*?</table>}m]
    refute_nil table
    assert_includes table, "<td class=\"n\">String</td><td>8.0 MiB</td><td>5.0 MiB</td><td>3.0 MiB ±1.0 MiB</td>"
    assert_includes table, "&lt;anonymous subclass of Foo&gt;"
    assert_includes table, "class=\"over\">sites&#39; estimates exceed the exact total by 576 KiB"
    refute_includes html, "<script>x</script>"
    # An allocation view's page still shows the live objects' table, of inuse_space.
    assert_includes Heapscope::Report::Flamegraph.html(prof, path: "c.pb.gz", sample: "alloc_space"), "id=\"hs-census\""
  end

  def test_go_tool_pprof_reads_profiles_with_a_census
    path = write("g.pb.gz", example)
    raw = go_pprof("-raw", path)
    assert_includes raw, "heapscope census class: objects=12 bytes=1048576 type=T_DATA name=Thread"
    assert_includes raw, "name=<anonymous subclass of Foo>"
    assert_equal our_view(Heapscope::Pprof.read(path))[:samples].size, parse_raw(raw)[:samples].size
  end
end
