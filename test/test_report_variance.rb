# frozen_string_literal: true

# Honest error bars (issue 17, item 3): profiles that carry variance labels (every sample has
# T_var = the sampler's variance of its value T, and a comment line says variance=labels) get their
# errors from the sums of those labels in top, diff (and its noise rule), leaks, the flame graph's
# data and ?debug=1; profiles without them keep the old formulas. A profile whose budget lowered the
# rate says so in every header and never prints a 0% error. The profiles are hand-made with the
# project's Ruby writer; go tool pprof reads the labels back as we do.

require_relative "test_report_helper"
require "json"
require "heapscope/report/cli"
require "heapscope/surfaces/rack"

class TestReportVariance < Minitest::Test
  include ReportHelper
  Sampling = Heapscope::Report::Sampling
  Units = Heapscope::Report::Units

  LEAK = [["Cache#store", "app/cache.rb", 12], ["main", "app/main.rb", 3]].freeze
  CFUNC = [["String#*", "app/cache.rb", 12], ["Cache#store", "app/cache.rb", 12], ["main", "app/main.rb", 3]].freeze
  CHURN = [["Request#parse", "app/request.rb", 7], ["main", "app/main.rb", 4]].freeze
  T0 = 1_800_000_000 * 10**9

  def setup
    @dir = Dir.mktmpdir("heapscope-variance")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  # The line the new core writes: sampling mode, share, rates, windows, variance=labels.
  def variance_line(sample_every: 100, current: sample_every, windows: 120, sampling: "windowed", lowest: nil,
                    lowered: current > sample_every)
    "sampling=#{sampling} share=0.04 sample_every=#{sample_every} current_sample_every=#{current} " \
      "#{"max_sample_every=#{lowest} " if lowest}" \
      "rate_lowered=#{lowered} windows=#{windows} hook_on_share=0.04100 allocations=9000000 " \
      "skipped_own=0 variance=labels"
  end

  # rows: [frames, [alloc_objects, alloc_space, inuse_objects, inuse_space], [their four variances], labels]
  def labelled_profile(rows, time_nanos: 0, **line)
    prof = heapscope_profile([], sample_every: line.fetch(:sample_every, 100), time_nanos: time_nanos)
    prof.comments << variance_line(**line)
    rows.each do |frames, values, variances, labels|
      vars = HEAPSCOPE_TYPES.each_with_index.to_h { |(name, _), i| ["#{name}_var", variances[i]] }
      vars.reject! { |_, v| v.zero? } # a missing label means 0, as the core writes them
      prof.add_sample(frames: frames, values: values, labels: (labels || {}).merge(vars))
    end
    prof
  end

  # Two samples on line app/cache.rb:12 (one through String#*) and one elsewhere.
  def cache_profile(**line)
    labelled_profile([
                       [LEAK, [1000, 64_000, 800, 8_000_000], [90_000, 4e8.to_i, 60_000, 3_600_000_000_000], { "class" => "String" }],
                       [CFUNC, [500, 32_000, 400, 4_000_000], [40_000, 1e8.to_i, 40_000, 2_800_000_000_000], { "class" => "String" }],
                       [CHURN, [50_000, 9_000_000, 100, 1_000_000], [2_500_000, 1e11.to_i, 10_000, 1e11.to_i], { "class" => "Array" }],
                     ], **line)
  end

  def test_a_sites_error_is_the_square_root_of_its_summed_variance_labels
    path = write("labels.pb.gz", cache_profile)
    status, out, err = run_cli("top", path, "--json")
    assert_equal [0, ""], [status, err]
    data = JSON.parse(out)
    cache = data["entries"].find { |e| e["file"] == "app/cache.rb" }
    assert_equal 12_000_000, cache["flat"]
    # Variances add over a site's samples: sqrt(3.6e12 + 2.8e12) = 2.53e6 of 12e6.
    assert_in_delta Math.sqrt(6.4e12) / 12e6, cache["relative_error"], 1e-4 # (4 significant digits)
    # Samples: (objects / their error)² = 1200² / (60,000 + 40,000).
    assert_in_delta 14.4, cache["samples"], 0.01
    refute_includes data["sampling"], "lower bounds"
    assert_equal "sample_every=100, windowed sampling (hook on 4% of the time, 120 windows); errors from the " \
                 "sampler's variance", data["sampling"]

    # The text prints it, and cum errors (--cum) sum the variance of every sample below: main (line 3)
    # holds both of the cache's samples, and allocates nothing itself.
    _, out, = run_cli("top", path)
    assert_match(/11\.4 MiB\s+92\.3%.*±21%\s+Cache#store app\/cache\.rb:12$/, out.lines.find { |l| l.include?("Cache#store") })
    _, out, = run_cli("top", path, "--cum", "--json")
    main = JSON.parse(out)["entries"].find { |e| e["name"] == "main app/main.rb:3" }
    assert_equal [0, 12_000_000], main.values_at("flat", "cum")
    assert_in_delta Math.sqrt(6.4e12) / 12e6, main["relative_error"], 1e-4
    # --by class and another sample type read their own labels.
    _, out, = run_cli("top", path, "--by", "class", "--sample", "alloc_objects", "--json")
    array = JSON.parse(out)["entries"].find { |e| e["name"] == "Array" }
    assert_in_delta Math.sqrt(2_500_000) / 50_000, array["relative_error"], 1e-5
  end

  # The labels are ordinary numeric pprof labels: go tool pprof reads the same ones, and summing what
  # it prints for the site's samples gives the variance top used.
  def test_go_tool_pprof_reads_the_variance_labels
    path = write("labels.pb.gz", cache_profile)
    raw = parse_raw(go_pprof("-raw", path))
    ours = our_view(Heapscope::Pprof.read(path))
    assert_equal ours[:samples].map { |s| s[:labels] }, raw[:samples].map { |s| s[:labels] }
    site = raw[:samples].select { |s| s[:frames].first.end_with?("app/cache.rb:12") }
    assert_equal 2, site.size
    assert_equal 6_400_000_000_000, site.sum { |s| Integer(s[:labels].fetch("inuse_space_var")) }
    tags = go_pprof("-tags", "-sample_index=alloc_objects", path)
    assert_match(/alloc_objects_var/, tags)
  end

  def test_profiles_without_labels_keep_the_old_formulas
    old = heapscope_profile([[LEAK, [1000, 64_000, 800, 8_000_000], { "class" => "String" }]], sample_every: 100)
    s = Sampling.new(old)
    refute s.variance?
    assert_in_delta Math.sqrt(0.99 / 8), s.relative_error([1000, 64_000, 800, 8_000_000], 3), 1e-9
    assert_empty s.variance_columns(3)
    # A labels line without labels on a sample: that sample's variance is 0 (exact), not the formula.
    prof = labelled_profile([[LEAK, [10, 640, 8, 512], [0, 0, 0, 0]]], sample_every: 1)
    _, out, = run_cli("top", write("exact.pb.gz", prof), "--json")
    assert_equal 0.0, JSON.parse(out)["entries"][0]["relative_error"]
  end

  def test_small_errors_never_print_as_zero
    assert_equal "0%", Units.error(0.0)
    assert_equal "<0.1%", Units.error(0.00004)
    assert_equal "±0.4%", Units.error(0.004)
    assert_equal "±5%", Units.error(0.049)
    assert_equal "±<1 B", Units.abs_error(0.2, "bytes")
    assert_equal "±<1", Units.abs_error(0.2, "count")
    assert_equal "±0 B", Units.abs_error(0.0, "bytes")
    assert_equal 3.0e-5, Units.significant(0.0000300004)
    # A huge site with a tiny variance: JSON keeps a nonzero error, the table says <0.1%.
    prof = labelled_profile([[LEAK, [10**9, 10**12, 10**9, 10**12], [10**9, 10**12, 10**9, 10**12]]])
    path = write("tiny.pb.gz", prof)
    _, out, = run_cli("top", path, "--json")
    assert_operator JSON.parse(out)["entries"][0]["relative_error"], :>, 0
    _, out, = run_cli("top", path)
    assert_match(/<0\.1%\s+Cache#store/, out)
  end

  # The Rails app's every profile said "rate lowered by the overhead budget from 1 in 1000 to 1 in 1000":
  # the budget had lowered the rate and restored it. Such a profile says what happened, with how low it
  # went where the profile says (max_sample_every), and a profile written before that key existed too.
  def test_a_rate_lowered_then_restored_says_so_without_contradicting_itself
    restored = cache_profile(sample_every: 1000, current: 1000, lowest: 4000)
    _, out, = run_cli("top", write("restored.pb.gz", restored))
    assert_includes out.lines[1], "rate lowered by the overhead budget at times (to 1 in 4000 at the lowest), back at 1 in 1000 now"
    refute_includes out, "to 1 in 1000;"
    old = cache_profile(sample_every: 1000, current: 1000, lowered: true)
    _, out, = run_cli("top", write("old-restored.pb.gz", old))
    assert_includes out.lines[1], "rate lowered by the overhead budget at times, back at 1 in 1000 now"
    never = cache_profile(sample_every: 1000, current: 1000, lowest: 1000)
    _, out, = run_cli("top", write("never.pb.gz", never))
    refute_includes out, "rate lowered"
    still = cache_profile(sample_every: 1000, current: 2000, lowest: 4000)
    _, out, = run_cli("top", write("still.pb.gz", still))
    assert_includes out.lines[1], "rate lowered by the overhead budget from 1 in 1000 to 1 in 2000"
  end

  def test_rate_lowered_profiles_say_so_in_every_header_and_never_claim_zero_error
    note = "rate lowered by the overhead budget from 1 in 1 to 1 in 16"
    lowered = cache_profile(sample_every: 1, current: 16)
    path = write("lowered.pb.gz", lowered)
    _, out, = run_cli("top", path)
    assert_includes out.lines[1], note
    refute_match(/\s0%\s/, out)
    _, out, = run_cli("diff", path, path)
    assert_equal 2, out.scan(note).size, out
    later = cache_profile(sample_every: 1, current: 16)
    later.time_nanos = T0 + 60 * 10**9
    lowered.time_nanos = T0
    _, out, = run_cli("leaks", write("a.pb.gz", lowered), write("b.pb.gz", later))
    assert_includes out.lines[0], note
    html = File.join(@dir, "l.html")
    run_cli("flamegraph", path, "-o", html)
    assert_includes File.read(html), note
    text = Heapscope::Rack::TextReport.render(lowered.to_pprof, type: :heap)
    assert_includes text, note

    # An older profile (no labels) lowered from sample_every=1: the formula assumes the lowered rate,
    # so the error is not the 0 that 1-in-1 would give.
    old = heapscope_profile([[LEAK, [50_000, 3_200_000, 50_000, 3_200_000], {}]], sample_every: 1)
    old.comments << "sample_every=1 current_sample_every=16 max_overhead=0.01"
    s = Sampling.new(old)
    assert s.rate_lowered?
    assert_includes s.describe, note
    assert_in_delta Math.sqrt((1 - 1 / 16.0) / (50_000 / 16.0)), s.relative_error([50_000, 3_200_000, 50_000, 3_200_000], 3), 1e-9
    _, out, = run_cli("top", write("old-lowered.pb.gz", old))
    assert_match(/±2%\s+Cache#store/, out)
  end

  # A change is noise unless |change| > 2 * sqrt(err_new² + err_base²).
  def test_diff_marks_noise_with_the_combined_error_of_both_profiles
    base = labelled_profile([[LEAK, [0, 0, 100, 10_000], [0, 0, 0, 3600]], [CHURN, [0, 0, 100, 10_000], [0, 0, 0, 3600]]])
    newer = labelled_profile([[LEAK, [0, 0, 100, 10_200], [0, 0, 0, 6400]], [CHURN, [0, 0, 100, 10_201], [0, 0, 0, 6400]]])
    # err = sqrt(6400 + 3600) = 100: +200 is noise, +201 is not.
    status, out, err = run_cli("diff", write("base.pb.gz", base), write("new.pb.gz", newer), "--json")
    assert_equal [0, ""], [status, err]
    rows = JSON.parse(out)["grew"].to_h { |r| [r["function"], r] }
    assert_equal [200, 100.0, true], rows["Cache#store"].values_at("change", "error", "noise")
    assert_equal [201, 100.0, false], rows["Request#parse"].values_at("change", "error", "noise")
    _, out, = run_cli("diff", File.join(@dir, "base.pb.gz"), File.join(@dir, "new.pb.gz"))
    # 200 is 2σ, still within (noise: true), but on the line: not enough evidence, and how to tell.
    assert_match(/\+200 B\s+\+2\.0%\s+±100 B\s+not enough evidence 2\.0σ\s+Cache#store/, out)
    assert_match(/\+201 B\s+\+2\.0%\s+±100 B\s+grew 2\.0σ\s+Request#parse/, out)
    assert_includes out, "Cache#store app/cache.rb:12: +200 B ±100 B: sample_every: 25 would cut its error about in half\n"
    # A site only in new: its own error alone. One labelled profile against an unlabelled one: each
    # side's error by its own rule.
    only = labelled_profile([[LEAK, [0, 0, 100, 10_200], [0, 0, 0, 6400]], [[["New#x", "n.rb", 1]], [0, 0, 1, 150], [0, 0, 0, 6400]]])
    data = Heapscope::Report::Diff.report(base, only)
    assert_equal [150, 80.0, true], data["grew"].find { |r| r["function"] == "New#x" }.values_at("change", "error", "noise")
    plain = heapscope_profile([[LEAK, [0, 0, 100, 10_000], {}]], sample_every: 1)
    row = Heapscope::Report::Diff.report(plain, newer)["grew"].find { |r| r["function"] == "Cache#store" }
    assert_equal 80.0, row["error"], "exact base (sample_every=1): the new side's error only"
  end

  def test_leaks_reads_the_variances_of_each_point
    series = (0..3).map do |k|
      live = 100_000 * (k + 1)
      prof = labelled_profile([[LEAK, [0, 0, live / 100, live], [0, 0, 0, (live / 10)**2], { "gc_age" => 8 }]],
                              time_nanos: T0 + k * 60 * 10**9)
      ["p#{k}.pb.gz", prof]
    end
    data = Heapscope::Report::Leaks.report(series)
    leak = data["sites"].first
    assert_in_delta 0.1, leak["last_relative_error"], 1e-9
    assert_in_delta 100_000, leak["rate_per_minute"], 0.01
    assert_operator leak["rate_error"], :>, 0
    assert_includes data["sampling"], "errors from the sampler's variance"
  end

  def test_flame_graph_nodes_carry_the_errors_of_their_stacks
    prof = cache_profile
    data = Heapscope::Report::Flamegraph.tree([prof])
    ti = 3 # inuse_space
    main = data["frame"].index { |f| data["frames"][f] == ["main", "app/main.rb", 3] }
    assert_in_delta Math.sqrt(6.4e12), data["errors"]["cum"][ti][main], 1e4
    assert_in_delta Math.sqrt(6.4e12 + 1e11), data["errors"]["cum"][ti][0], 1e4, "the root holds every stack"
    assert_in_delta 0, data["errors"]["self"][ti][main], 1e-9
    store = data["frame"].each_index.find { |i| data["frames"][data["frame"][i]][0] == "Cache#store" && data["parent"][i] == main }
    # Cache#store's node holds both stacks (String#* is its child): cum sqrt(6.4e12), self sqrt(3.6e12).
    assert_in_delta Math.sqrt(6.4e12), data["errors"]["cum"][ti][store], 1e4
    assert_in_delta Math.sqrt(3.6e12), data["errors"]["self"][ti][store], 1e4
    assert_nil data["base_errors"]
    # A diff: the base's errors too, on the new profile's types.
    diff = Heapscope::Report::Flamegraph.tree([prof, heapscope_profile([[LEAK, [10, 640, 8, 512], {}]], sample_every: 100)])
    refute_nil diff["base_errors"]
    root_base = diff["base_errors"]["cum"][ti][0]
    assert_in_delta 512 * Math.sqrt(0.99 / 0.08), root_base, 2 # (3 significant digits)
  end

  def test_debug_text_prints_the_error_of_each_row
    text = Heapscope::Rack::TextReport.render(cache_profile.to_pprof, type: :heap)
    assert_includes text, "Type: inuse_space, by line, sorted by flat; sample_every=100, windowed sampling"
    row = text.lines.find { |l| l.include?("Cache#store app/cache.rb:12") }
    # The leaf frames differ (String#* and Cache#store) but the line is one: ?debug=1 shows top's one
    # row for it (issue 33), with top's error.
    assert_match(/11\.4 MiB\s+92\.3%\s+92\.3%\s+11\.4 MiB\s+92\.3%\s+±21%\s+Cache#store/, row)
    assert_match(/^\s+flat\s+flat%\s+sum%\s+cum\s+cum%\s+error\s+site$/, text)
  end

  # A delta (?seconds=N) subtracts two snapshots: alloc variances new - old, inuse ones new + old.
  def test_delta_profiles_keep_variance_labels
    older = labelled_profile([[LEAK, [100, 6400, 80, 5000], [400, 1600, 100, 2500]]])
    newer = labelled_profile([[LEAK, [300, 19_200, 90, 5500], [900, 4900, 144, 3600]]])
    diff = Heapscope::Rack::DeltaVariance.subtract(newer, older)
    assert_equal 4, diff.sample_types.size
    s = diff.samples.first
    assert_equal [200, 12_800, 10, 500], s.values
    assert_equal({ "alloc_objects_var" => 500, "alloc_space_var" => 3300, "inuse_objects_var" => 244,
                   "inuse_space_var" => 6100 }, s.labels)
  end

  # Equal samples read for a report are one object listed once per occurrence, and the reports sum
  # each object once times its count (Sites.each_counted): every report must come out exactly as when
  # each occurrence is its own Sample (Pprof.read without share:), variances and label counts included.
  def test_repeated_samples_report_as_if_read_one_by_one
    rows = cache_profile.samples.map { |s| [s.frames.map(&:to_a), s.values, s.labels] }
    prof = heapscope_profile([], sample_every: 100)
    prof.comments << variance_line
    [0, 1, 0, 2, 1, 0, 0, 2].each_with_index do |i, k|
      frames, values, labels = rows[i]
      prof.add_sample(frames: frames, values: values, labels: labels.merge("endpoint" => k.even? ? "/a" : "/b"))
    end
    path = File.join(@dir, "repeats.pb.gz")
    File.binwrite(path, prof.to_pprof)
    shared = Heapscope::Report::Sites.load(path)
    single = Heapscope::Pprof.read(path)
    assert_equal 8, shared.samples.size
    assert_operator shared.samples.uniq(&:object_id).size, :<, 8, "equal samples are shared"
    assert_equal 8, single.samples.uniq(&:object_id).size
    [{}, { by: "function" }, { by: "class" }, { by: "label:endpoint" }, { cum: true }].each do |opts|
      assert_equal Heapscope::Report::Top.report(single, **opts), Heapscope::Report::Top.report(shared, **opts), opts.inspect
    end
    assert_equal Heapscope::Report::Flamegraph.html(single, path: path), Heapscope::Report::Flamegraph.html(shared, path: path)
    assert_equal Heapscope::Report::Diff.report(cache_profile, single), Heapscope::Report::Diff.report(cache_profile, shared)
  end
end
