# frozen_string_literal: true

# Error bars that stay right when samples are summed (issue 17, item 3): windowed profiles carry each
# sample's value by variance group (T_vg0..T_vg15 labels, windows hashed into 16 groups) and the groups'
# allocations (a "variance_groups=16 group_allocations=..." comment), so a site that sums samples of
# one window (two classes made by one line, two gc_age buckets) gets the variance of its summed
# groups, not the sum of its samples' variances, which misses their correlation. The expected numbers
# are worked out by hand in the comments. The real sampler's profiles are checked by
# test_windowed_accuracy (coverage of +-2 errors over fresh processes) and bench/accuracy.

require_relative "test_report_helper"
require "json"
require "heapscope/report/cli"
require "heapscope/surfaces/rack"

class TestReportVarianceGroups < Minitest::Test
  include ReportHelper

  LINE = [["Cache#store", "app/cache.rb", 12], ["main", "app/main.rb", 3]].freeze
  OTHER = [["Request#parse", "app/request.rb", 7], ["main", "app/main.rb", 4]].freeze

  def setup
    @dir = Dir.mktmpdir("heapscope-variance-groups")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  # A windowed profile whose 16 groups each saw 1,000 allocations; rows: [frames, values, labels,
  # {type => {group => part}}].
  def grouped_profile(rows, allocations: Array.new(16, 1000))
    prof = heapscope_profile([], sample_every: 100)
    prof.comments << "sampling=windowed share=0.04 sample_every=100 current_sample_every=100 rate_lowered=false " \
                     "windows=400 hook_on_share=0.04 allocations=400000 skipped_own=0 variance=groups"
    prof.comments << "variance_groups=16 group_allocations=#{allocations.join(",")}"
    rows.each do |frames, values, labels, parts|
      group_labels = parts.flat_map { |type, by_group| by_group.map { |g, v| ["#{type}_vg#{g}", v] } }.to_h
      prof.add_sample(frames: frames, values: values, labels: labels.merge(group_labels))
    end
    prof
  end

  # Parts spread over every group: 100 objects in each even group, 60 in each odd one.
  EVEN_ODD = (0...16).to_h { |g| [g, g.even? ? 100 : 60] }.freeze

  def top(path, *args)
    status, out, err = run_cli("top", path, "--json", *args)
    assert_equal [0, ""], [status, err]
    JSON.parse(out)
  end

  def test_a_sites_error_comes_from_its_summed_groups
    # Two classes made by one line in the same windows: String with the parts above, Hash with the
    # same parts. Summed: 200 in even groups, 120 in odd ones, 1,280 in all; R = 1280 / 16000 = 0.08,
    # R x 1000 = 80, residuals +-40, sum of squares 16 x 1600 = 25,600; variance 16/15 x 0.96 x 25,600
    # = 26,214.4; the site spans n = 1280^2 / (8 x 200^2 + 8 x 120^2) = 15.06 groups: t at 14 degrees of
    # freedom is 2.195, so the variance is widened by (2.195 / 2)^2 = 1.2048: error sqrt(31,583) = 177.7,
    # 13.9% of 1,280.
    prof = grouped_profile([
                             [LINE, [0, 0, 640, 64_000], { "class" => "String" }, { "inuse_objects" => EVEN_ODD }],
                             [LINE, [0, 0, 640, 64_000], { "class" => "Hash" }, { "inuse_objects" => EVEN_ODD }],
                           ])
    path = write("grouped.pb.gz", prof)
    row = top(path, "--sample", "inuse_objects")["entries"].find { |e| e["file"] == "app/cache.rb" }
    assert_equal 1280, row["flat"]
    assert_in_delta 177.7 / 1280, row["relative_error"], 0.002
    # Each class alone has half of it: error 88.9 of 640, the same 13.9%. Adding the two classes'
    # variances would give sqrt(2) x 88.9 = 125.7 (9.8%): too small, since they came from the same
    # windows (correlated), which the groups keep.
    by_class = top(path, "--sample", "inuse_objects", "--by", "class")["entries"]
    assert_equal [640, 640], by_class.map { |e| e["flat"] }
    by_class.each { |e| assert_in_delta 177.7 / 1280, e["relative_error"], 0.002 }
  end

  def test_a_site_seen_in_few_windows_gets_a_wide_error
    # 500 objects, all in group 3: it spans one group, so its error is the estimate itself (+-100%).
    one = grouped_profile([[LINE, [0, 0, 500, 50_000], {}, { "inuse_objects" => { 3 => 500 } }]])
    assert_in_delta 1.0, top(write("one.pb.gz", one), "--sample", "inuse_objects")["entries"][0]["relative_error"], 1e-3
    # 400 + 400 in groups 3 and 9: R = 800 / 16000 = 0.05, R x 1000 = 50; residuals 350, 350 and
    # fourteen -50s: 2 x 122,500 + 14 x 2,500 = 280,000; variance 16/15 x 0.96 x 280,000 = 286,720;
    # it spans 2 groups: 1 degree of freedom, t = 13.968, widened by 48.78: error 3,740, 467% of 800.
    two = grouped_profile([[LINE, [0, 0, 800, 80_000], {}, { "inuse_objects" => { 3 => 400, 9 => 400 } }]])
    assert_in_delta 3740.0 / 800, top(write("two.pb.gz", two), "--sample", "inuse_objects")["entries"][0]["relative_error"], 0.01
  end

  def test_flame_graph_nodes_and_debug_text_use_the_groups
    parts = { "inuse_objects" => EVEN_ODD, "inuse_space" => EVEN_ODD.transform_values { |v| v * 100 } }
    prof = grouped_profile([
                             [LINE, [0, 0, 640, 64_000], { "class" => "String" }, parts],
                             [LINE, [0, 0, 640, 64_000], { "class" => "Hash" }, parts],
                             [OTHER, [0, 0, 10, 1000], { "class" => "Array" }, { "inuse_objects" => { 1 => 10 } }],
                           ])
    data = Heapscope::Report::Flamegraph.tree([prof])
    ti = 2 # inuse_objects
    # Cache#store's node sums the two classes' samples: the same 177.7 as top's line. The root holds
    # the Array too: 10 objects more in group 1, an odd group, which evens the groups out (130 vs 200
    # is closer to its share than 120 vs 200 was), so the root's error is a little smaller: 175.
    store = data["frame"].each_index.find { |i| data["frames"][data["frame"][i]][0] == "Cache#store" }
    assert_in_delta 177.7, data["errors"]["cum"][ti][store], 0.5 # (3 significant digits)
    assert_in_delta 175, data["errors"]["cum"][ti][0], 0.5
    # ?debug=1 of the same profile: top's rows (one per line, its classes together), the line's error
    # from its groups as top prints it.
    text = Heapscope::Rack::TextReport.render(prof.to_pprof, type: :heap)
    row = text.lines.find { |l| l.include?("Cache#store app/cache.rb:12") }
    refute_nil row, text
    assert_match(/±14%\s+Cache#store/, row)
  end

  def test_delta_profiles_subtract_the_groups
    older = grouped_profile([[LINE, [100, 6400, 80, 5000], {}, { "inuse_objects" => { 1 => 50, 2 => 30 }, "alloc_objects" => { 1 => 100 } }]])
    newer = grouped_profile([[LINE, [300, 19_200, 60, 4000], {}, { "inuse_objects" => { 1 => 20, 2 => 30, 5 => 10 }, "alloc_objects" => { 1 => 100, 4 => 200 } }]])
    diff = Heapscope::Rack::DeltaVariance.subtract(newer, older)
    labels = diff.samples.first.labels
    # A window's part is in the same group in both: new - old, negative parts kept, zero ones dropped.
    assert_equal({ "inuse_objects_vg1" => -30, "inuse_objects_vg5" => 10, "alloc_objects_vg4" => 200 }, labels)
    assert(diff.comments.any? { |c| c.include?("variance_groups=16") }, "the design line travels with the delta")
  end

  def test_go_tool_pprof_reads_the_group_labels
    prof = grouped_profile([[LINE, [0, 0, 640, 64_000], { "class" => "String" }, { "inuse_objects" => EVEN_ODD }]])
    raw = parse_raw(go_pprof("-raw", write("g.pb.gz", prof)))
    labels = raw[:samples].first[:labels]
    assert_equal (0...16).map { |g| g.even? ? "100" : "60" }, (0...16).map { |g| labels.fetch("inuse_objects_vg#{g}") }
  end

  def test_allocation_counts_use_the_windows_since_reset
    # After Heapscope.reset the counters hold only the windows since, which the alloc_ design line
    # gives: here groups 0-7 saw 1,000 allocations each since the reset, and the site's parts are
    # exactly a tenth of that, 100 per group: no spread, error 0. Read against every window since
    # start (all 16 groups), the same parts look like a site missing from half of them: residuals
    # +-50 in all 16, variance 16/15 x 0.96 x 40,000 = 40,960, widened for 7 degrees of freedom
    # ((2.366 / 2)^2 = 1.40): error 239, 30% of 800.
    prof = grouped_profile([[LINE, [800, 80_000, 0, 0], {}, { "alloc_objects" => (0...8).to_h { |g| [g, 100] } }]])
    prof.comments << "alloc_variance_groups=16 group_allocations=#{(Array.new(8, 1000) + Array.new(8, 0)).join(",")}"
    row = top(write("reset.pb.gz", prof), "--sample", "alloc_objects")["entries"][0]
    assert_equal 800, row["flat"]
    assert_in_delta 0.0, row["relative_error"], 1e-9
    prof.comments.pop
    row = top(write("since_start.pb.gz", prof), "--sample", "alloc_objects")["entries"][0]
    assert_in_delta 0.30, row["relative_error"], 0.01
  end

  def test_a_delta_that_sums_to_zero_still_has_an_error
    # A delta's parts: +300 in group 1, -300 in group 2 (objects moved between windows' generations),
    # 0 in total. Zero is not exact here: residuals +-300 (R = 0), variance 16/15 x 0.96 x 180,000 =
    # 184,320, spanning 2 groups (t at 1 degree of freedom, x 48.78): error 2,998.
    prof = grouped_profile([[LINE, [0, 0, 0, 0], {}, { "inuse_objects" => { 1 => 300, 2 => -300 } }]])
    sampling = Heapscope::Report::Sampling.new(prof)
    values = Heapscope::Report::Sampling.with_variances(prof.samples.first, Heapscope::Report::Sampling.variance_labels(prof))
    assert_in_delta 2998, sampling.absolute_error(values, 2), 2
  end

  def test_a_bounded_weight_scale_is_said_in_the_header
    # The ratio wanted 4.5 but the scale is held at 3: estimates are a third too low, which no error
    # bar shows, so the header says it.
    prof = grouped_profile([[LINE, [0, 0, 640, 64_000], {}, { "inuse_objects" => EVEN_ODD }]])
    prof.comments[-2] = prof.comments[-2].sub("share=0.04 ", "share=0.04 weight_scale=3.0000 weight_scale_wanted=4.5000 ")
    sampling = top(write("bounded.pb.gz", prof), "--sample", "inuse_objects")["sampling"]
    assert_includes sampling, "the weight scale was held at 3.00 (the ratio wanted 4.50), so estimates are about 33.3% too low"
    # Within its bounds: nothing said.
    prof.comments[-2] = prof.comments[-2].sub("weight_scale_wanted=4.5000", "weight_scale_wanted=3.0000")
    refute_includes top(write("ok.pb.gz", prof), "--sample", "inuse_objects")["sampling"], "weight scale"
  end

  def test_a_malformed_design_line_falls_back_to_the_labels
    # 17 numbers for 16 groups, or none: the groups are not used; each sample's T_var label is.
    prof = grouped_profile([[LINE, [0, 0, 640, 64_000], { "inuse_objects_var" => 6400 }, { "inuse_objects" => EVEN_ODD }]],
                           allocations: Array.new(17, 1000))
    row = top(write("bad.pb.gz", prof), "--sample", "inuse_objects")["entries"][0]
    assert_in_delta 80.0 / 640, row["relative_error"], 1e-3
  end
end
