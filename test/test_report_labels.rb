# frozen_string_literal: true

# The reports on user labels (endpoint, job, thread): `--by label:KEY` rows for top, diff and leaks,
# the `--label KEY=VALUE` selection (checked against `go tool pprof -tagfocus`), the header's list of
# keys, JSON, error messages, and the flame graph page's label selectors, in Chromium, with a hostile
# label value. Expected numbers are worked out in the comments from the hand-made profiles below.

require_relative "test_report_helper"
require_relative "browser_helper"
require "json"
require "heapscope/report/cli"

class TestReportLabels < Minitest::Test
  include ReportHelper
  include BrowserHelper

  MIN = 60 * 10**9
  T0 = 1_800_000_000 * 10**9
  CACHE = [["Cache#store", "app/cache.rb", 12], ["UsersController#show", "app/users.rb", 5], ["main", "app/main.rb", 3]].freeze
  PARSE = [["Request#parse", "app/request.rb", 7], ["UsersController#show", "app/users.rb", 6], ["main", "app/main.rb", 3]].freeze
  REPORT = [["ReportJob#perform", "app/report_job.rb", 20], ["main", "app/main.rb", 9]].freeze
  BOOT = [["Config#load", "app/config.rb", 2], ["main", "app/main.rb", 1]].freeze
  SHOW = "GET /users/:id"
  VARIANCE = "sampling=always share=1 sample_every=1 current_sample_every=1 rate_lowered=false windows=0 variance=labels"
  HOSTILE = "</script><img src=x onerror=window.hsOwned=1>"

  def setup
    @dir = Dir.mktmpdir("heapscope-labels")
  end

  def teardown
    stop_browser if @cdp
    FileUtils.rm_rf(@dir)
  end

  # 102,000 live bytes. By endpoint: GET /users/:id 40,000 + 20,000 (Cache#store) + 10,000
  # (Request#parse) = 70,000; POST /users 5,000 + 3,000 = 8,000; none (the job and boot) 15,000 +
  # 7,000 = 22,000; (other), a label set past the cap, 2,000. By thread: worker-1 50,000, worker-2
  # 28,000, worker-3 15,000, none 7,000, (other) 2,000. Variances (inuse_space_var): GET's samples
  # 3000² + 4000² (+ 0) = 5000², POST's 1200² + 500² = 1300².
  def app_profile(endpoint: SHOW)
    l = ->(ep, th, cls, var = nil) { { "class" => cls, "endpoint" => ep, "thread" => th, "inuse_space_var" => var }.compact }
    prof = heapscope_profile([
                               [CACHE, [10, 1000, 10, 40_000], l.call(endpoint, "worker-1", "String", 3000**2)],
                               [CACHE, [5, 500, 5, 20_000], l.call(endpoint, "worker-2", "String", 4000**2)],
                               [PARSE, [50, 9000, 2, 10_000], l.call(endpoint, "worker-1", "Hash")],
                               [CACHE, [2, 200, 2, 5_000], l.call("POST /users", "worker-2", "String", 1200**2)],
                               [PARSE, [9, 900, 1, 3_000], l.call("POST /users", "worker-2", "Hash", 500**2)],
                               [REPORT, [3, 300, 3, 15_000], { "class" => "Array", "job" => "ReportJob", "thread" => "worker-3" }],
                               [BOOT, [1, 100, 1, 7_000], { "class" => "Hash" }],
                               [CACHE, [1, 10, 1, 2_000], l.call("(other)", "(other)", "String")],
                             ], time_nanos: T0 + MIN)
    prof.comments << VARIANCE
    prof
  end

  def flat(rows)
    rows.to_h { |r| [r["name"], r["flat"]] }
  end

  def test_top_by_label_sums_each_value_with_its_error
    path = write("app.pb.gz", app_profile)
    data = json("top", path, "--by", "label:endpoint")
    assert_equal "label:endpoint", data["by"]
    assert_equal({ SHOW => 70_000, "(no endpoint label)" => 22_000, "POST /users" => 8_000, "(other)" => 2_000 }, flat(data["entries"]))
    assert_equal [SHOW, "(no endpoint label)", "POST /users", "(other)"], data["entries"].map { |e| e["name"] }
    assert_equal 102_000, data["total"]
    rows = data["entries"].to_h { |e| [e["name"], e] }
    # Each row's error is the square root of its summed variance labels.
    assert_in_delta 5000.0 / 70_000, rows[SHOW]["relative_error"], 1e-4
    assert_in_delta 1300.0 / 8_000, rows["POST /users"]["relative_error"], 1e-4
    assert_equal 0.0, rows["(no endpoint label)"]["relative_error"]
    assert_in_delta 68.63, rows[SHOW]["flat_percent"], 0.01

    assert_equal({ "worker-1" => 50_000, "worker-2" => 28_000, "worker-3" => 15_000, "(no thread label)" => 7_000, "(other)" => 2_000 },
                 flat(json("top", path, "--by", "label:thread")["entries"]))
    # Any key groups, heapscope's own too: a number label by its decimal form.
    aged = write("aged.pb.gz", heapscope_profile([[CACHE, [1, 1, 1, 100], { "gc_age" => 8 }], [PARSE, [1, 1, 1, 50], { "gc_age" => 2 }],
                                                  [BOOT, [1, 1, 1, 30], { "gc_age" => 8 }]]))
    assert_equal({ "8" => 130, "2" => 50 }, flat(json("top", aged, "--by", "label:gc_age")["entries"]))
    assert_equal(flat(json("top", path, "--by", "class")["entries"]), flat(json("top", path, "--by", "label:class")["entries"]))

    status, out, err = run_cli("top", path, "--by", "label:endpoint")
    assert_equal [0, ""], [status, err]
    assert_includes out, "Type: inuse_space, by label:endpoint"
    row = out.lines.find { |l| l.include?(SHOW) }
    assert_match(/\A68\.4 KiB\s+68\.6%\s+68\.6%\s+68\.4 KiB\s+68\.6%\s+±7%\s+GET \/users\/:id\n\z/, row)
    assert(out.lines.any? { |l| l.end_with?("(no endpoint label)\n") })
  end

  # Error bars with variance groups: two samples of one endpoint from the same windows have their
  # group parts summed (test_report_variance_groups works the numbers out): 1,280 objects, ±13.9%; an
  # endpoint seen in one group only is ±100%.
  def test_by_label_sums_variance_groups_per_row
    even_odd = (0...16).to_h { |g| [g, g.even? ? 100 : 60] }
    prof = heapscope_profile([], sample_every: 100)
    prof.comments << "sampling=windowed share=0.04 sample_every=100 current_sample_every=100 rate_lowered=false " \
                     "windows=400 hook_on_share=0.04 allocations=400000 skipped_own=0 variance=groups"
    prof.comments << "variance_groups=16 group_allocations=#{Array.new(16, 1000).join(",")}"
    parts = ->(by_group) { by_group.to_h { |g, v| ["inuse_objects_vg#{g}", v] } }
    prof.add_sample(frames: CACHE, values: [0, 0, 640, 64_000], labels: { "endpoint" => SHOW, "class" => "String" }.merge(parts.call(even_odd)))
    prof.add_sample(frames: PARSE, values: [0, 0, 640, 64_000], labels: { "endpoint" => SHOW, "class" => "Hash" }.merge(parts.call(even_odd)))
    prof.add_sample(frames: REPORT, values: [0, 0, 500, 50_000], labels: { "job" => "ReportJob" }.merge(parts.call(3 => 500)))
    rows = json("top", write("groups.pb.gz", prof), "--by", "label:endpoint", "--sample", "inuse_objects")["entries"].to_h { |e| [e["name"], e] }
    assert_equal 1280, rows[SHOW]["flat"]
    assert_in_delta 177.7 / 1280, rows[SHOW]["relative_error"], 0.002
    assert_in_delta 1.0, rows["(no endpoint label)"]["relative_error"], 1e-3
  end

  def test_label_filter_selects_samples_and_agrees_with_go_pprof
    path = write("app.pb.gz", app_profile)
    data = json("top", path, "--label", "endpoint=#{SHOW}", "--by", "function", "-n", "100")
    assert_equal [{ "key" => "endpoint", "value" => SHOW }], data["label_filter"]
    assert_equal [102_000, 70_000], [data["total"], data["selected_total"]]
    ours = data["entries"].to_h { |e| [e["name"], [e["flat"], e["cum"]]] }
    assert_equal({ "Cache#store" => [60_000, 60_000], "Request#parse" => [10_000, 10_000],
                   "UsersController#show" => [0, 70_000], "main" => [0, 70_000] }, ours)
    go = go_top(path, "endpoint=^#{SHOW}$")
    assert_equal [70_000, 102_000], go[:selected]
    assert_equal go[:rows], ours
    # Percentages are of the whole profile, as pprof's: Cache#store is 60,000 of 102,000.
    assert_in_delta 58.82, data["entries"].find { |e| e["name"] == "Cache#store" }["flat_percent"], 0.01

    # Several --label: all must match (Go: key-less filters, each matched against "key:value", are ANDed).
    data = json("top", path, "--label", "endpoint=#{SHOW}", "--label", "thread=worker-1", "--by", "function", "-n", "100")
    assert_equal 50_000, data["selected_total"]
    go = go_top(path, "^endpoint:#{SHOW}$,^thread:worker-1$")
    assert_equal [50_000, 102_000], go[:selected]
    assert_equal go[:rows], data["entries"].to_h { |e| [e["name"], [e["flat"], e["cum"]]] }

    # Combined with --by label:KEY: the threads of one endpoint's samples.
    assert_equal({ "worker-1" => 50_000, "worker-2" => 20_000 },
                 flat(json("top", path, "--label", "endpoint=#{SHOW}", "--by", "label:thread")["entries"]))
    # The error of a selected line comes from its selected samples only: 5000 of 60,000.
    line = json("top", path, "--label", "endpoint=#{SHOW}")["entries"].find { |e| e["name"] == "Cache#store app/cache.rb:12" }
    assert_in_delta 5000.0 / 60_000, line["relative_error"], 1e-4
    # A number label matches its decimal form.
    aged = heapscope_profile([[CACHE, [1, 1, 1, 100], { "gc_age" => 8 }], [PARSE, [1, 1, 1, 50], { "gc_age" => 2 }]])
    assert_equal 100, json("top", write("aged.pb.gz", aged), "--label", "gc_age=8")["selected_total"]

    status, out, err = run_cli("top", path, "--label", "endpoint=#{SHOW}", "--label", "thread=worker-1")
    assert_equal [0, ""], [status, err]
    assert_includes out, "Selected: samples with endpoint=#{SHOW} and thread=worker-1: 48.8 KiB (49.0% of the total; percentages are of the total)\n"
  end

  # `go tool pprof -top` with -tagfocus: {function => [flat, cum]} and [selected, total] from its
  # "Showing nodes accounting for X, P% of T total" line.
  def go_top(path, focus)
    out = go_pprof("-top", "-unit=B", "-nodecount=1000", "-nodefraction=0", "-sample_index=inuse_space", "-tagfocus", focus, path)
    selected = out.match(/accounting for (\d+)B, [\d.]+% of (\d+)B total/) or flunk("no totals in:\n#{out}")
    # "     60000B 58.82% 58.82%      60000B 58.82%  Cache#store" (a zero is "0", without the unit)
    row = /\A\s*(\d+)B?\s+[\d.]+%\s+[\d.]+%\s+(\d+)B?\s+[\d.]+%\s+(\S.*)\n\z/
    rows = out.lines.filter_map { |l| (m = l.match(row)) && [m[3], [m[1].to_i, m[2].to_i]] }.to_h
    { selected: selected.captures.map(&:to_i), rows: rows }
  end

  def test_header_lists_the_label_keys
    path = write("app.pb.gz", app_profile)
    _, out, = run_cli("top", path)
    assert_equal "Labels: endpoint (3 values), job (1 value), thread (4 values); (other): label sets past the writer's cap", out.lines[2].chomp
    assert_equal [{ "key" => "endpoint", "values" => 3, "other" => true }, { "key" => "job", "values" => 1, "other" => false },
                  { "key" => "thread", "values" => 4, "other" => true }], json("top", path)["labels"]
    # heapscope's own labels are not user labels: no header line, an empty list.
    plain = write("plain.pb.gz", heapscope_profile([[CACHE, [1, 1, 1, 100], { "class" => "String", "gc_age" => 4, "inuse_space_var" => 9 }]]))
    _, out, = run_cli("top", plain)
    refute_includes out, "Labels:"
    assert_equal [], json("top", plain)["labels"]
    assert_equal [], json("top", plain)["label_filter"]
  end

  def test_diff_per_label
    base = heapscope_profile([
                               [CACHE, [1, 1, 1, 30_000], { "endpoint" => SHOW, "thread" => "worker-1" }],
                               [CACHE, [1, 1, 1, 10_000], { "endpoint" => "POST /users", "thread" => "worker-2" }],
                               [REPORT, [1, 1, 1, 15_000], { "job" => "ReportJob" }],
                               [BOOT, [1, 1, 1, 7_000], {}],
                             ])
    b = write("base.pb.gz", base)
    n = write("new.pb.gz", app_profile)
    data = json("diff", b, n, "--by", "label:endpoint")
    # GET +40,000 (error 5000 from NEW's variances, BASE's is exact: not noise); POST 10,000 -> 8,000
    # (error 1300: 2,000 is within twice it, noise); (other) is new (no variance label: exact, not
    # noise); the unlabelled 22,000 did not change.
    assert_equal [[SHOW, 30_000, 70_000, 40_000, false], ["(other)", 0, 2000, 2000, false]],
                 data["grew"].map { |r| [r["name"], r["base"], r["new"], r["change"], r["noise"]] }
    assert_equal [["POST /users", 10_000, 8_000, -2000, true]], data["shrank"].map { |r| [r["name"], r["base"], r["new"], r["change"], r["noise"]] }
    assert_equal 5000.0, data["grew"][0]["error"]

    data = json("diff", b, n, "--label", "endpoint=#{SHOW}")
    assert_equal [["Cache#store app/cache.rb:12", 30_000, 60_000], ["Request#parse app/request.rb:7", 0, 10_000]],
                 data["grew"].map { |r| [r["name"], r["base"], r["new"]] }
    assert_equal [], data["shrank"]
    assert_equal [62_000, 102_000, 30_000, 70_000], data.values_at("total_base", "total_new", "selected_base", "selected_new")
    # A value only NEW has is a selection, not an error.
    assert_equal [["Cache#store app/cache.rb:12", 2000]], json("diff", b, n, "--label", "endpoint=(other)")["grew"].map { |r| [r["name"], r["new"]] }

    status, out, err = run_cli("diff", b, n, "--label", "endpoint=#{SHOW}")
    assert_equal [0, ""], [status, err]
    assert_includes out, "Labels: endpoint (3 values), job (1 value), thread (4 values); (other): label sets past the writer's cap\n" \
                         "Total: 60.5 KiB -> 99.6 KiB (+39.1 KiB, +64.5%)\n" \
                         "Selected: samples with endpoint=#{SHOW}: 29.3 KiB -> 68.4 KiB (+39.1 KiB)\n"
  end

  # A series where one endpoint leaks at Cache#store (+10,000 a minute, old objects) and another churns
  # at the same line: by line the site fluctuates (rises in 2 of 4 intervals); per endpoint the leak
  # is plain. GET /export starts at minute 2 and grows by 20,000 a minute, young.
  def series(k)
    churn = [50_000, 5_000, 40_000, 2_000, 35_000][k]
    rows = [[CACHE, [1, 1, 1, 10_000 * (k + 1)], { "endpoint" => SHOW, "gc_age" => 8 }],
            [CACHE, [1, 1, 1, churn], { "endpoint" => "POST /users", "gc_age" => 0 }]]
    rows << [REPORT, [1, 1, 1, 20_000 * (k - 1)], { "endpoint" => "GET /export", "gc_age" => 0 }] if k >= 2
    write("s#{k}.pb.gz", heapscope_profile(rows, time_nanos: T0 + k * MIN))
  end

  def test_leaks_per_label
    paths = (0..4).map { |k| series(k) }
    by_line = json("leaks", *paths)["sites"].find { |s| s["name"] == "Cache#store app/cache.rb:12" }
    assert_equal ["churn", "up and down", 2], by_line.values_at("verdict", "shape", "rises")

    sites = json("leaks", *paths, "--label", "endpoint=#{SHOW}")["sites"]
    assert_equal 1, sites.size
    assert_equal ["Cache#store app/cache.rb:12", 10_000.0, 4, "leak", "old"],
                 sites[0].values_at("name", "rate_per_minute", "rises", "verdict", "objects")

    # Per endpoint: GET /export (16,000 a minute: the slope of 0, 0, 20k, 40k, 60k) and GET /users/:id;
    # POST /users shrank overall and is not listed.
    data = json("leaks", *paths, "--by", "label:endpoint")
    # GET /export: flat at 0, then a steady rise: exact counts, so the line's misfit is beyond its (zero)
    # error, but the rise is no single step and the slope is far beyond the fit's scatter: a leak, young.
    assert_equal [["GET /export", 16_000.0, "leak", "young"], [SHOW, 10_000.0, "leak", "old"]],
                 data["sites"].map { |s| s.values_at("name", "rate_per_minute", "verdict", "objects") }
    # A value absent from the first profiles counts as zero there.
    assert_equal [0, 0, 20_000, 40_000, 60_000], json("leaks", *paths, "--label", "endpoint=GET /export")["sites"][0]["values"]

    status, out, err = run_cli("leaks", *paths, "--label", "endpoint=#{SHOW}")
    assert_equal [0, ""], [status, err]
    assert_includes out, "Labels: endpoint (3 values)\nSelected: samples with endpoint=#{SHOW} in every profile\n"
    assert_equal [2, "", "heapscope leaks: the series (5 profiles): no sample matches --label endpoint=GET /nope: no sample has " \
                         "endpoint=GET /nope; endpoint has \"#{SHOW}\", \"POST /users\", \"GET /export\"\n"],
                 run_cli("leaks", *paths, "--label", "endpoint=GET /nope")
  end

  def test_bad_label_arguments_are_one_line_errors
    path = write("app.pb.gz", app_profile)
    base = write("base.pb.gz", heapscope_profile([[BOOT, [1, 1, 1, 7_000], {}]]))
    cases = [
      [%W[top #{path} --by label:], "heapscope top: invalid argument: --by label: needs a label key (--by label:KEY, e.g. --by label:endpoint)"],
      [%W[top #{path} --by color], "heapscope top: invalid argument: --by color (one of line, function, class, file, gem or label:KEY)"],
      [%W[top #{path} --by label], "heapscope top: invalid argument: --by label (one of line, function, class, file, gem or label:KEY)"],
      [%W[top #{path} --label endpoint], "heapscope top: invalid argument: --label endpoint is not KEY=VALUE (e.g. --label endpoint=UsersController#show)"],
      [%W[top #{path} --label =x], "heapscope top: invalid argument: --label =x has no key before \"=\" (KEY=VALUE)"],
      [%W[top #{path} --label endpoint=], "heapscope top: invalid argument: --label endpoint= has no value after \"=\" (a label value " \
                                          "cannot be empty; --by label:endpoint shows the samples without the label as (no endpoint label))"],
      [%W[top #{path} --by label:endpiont], "heapscope top: #{path}: no sample has a label \"endpiont\" (--by label:endpiont; labels: " \
                                            "endpoint (3 values), job (1 value), thread (4 values); (other): label sets past the writer's cap)"],
      [%W[top #{path} --label endpoint=GET\ /user], "heapscope top: #{path}: no sample matches --label endpoint=GET /user: no sample has " \
                                                    "endpoint=GET /user; endpoint has \"#{SHOW}\", \"POST /users\", \"(other)\""],
      [%W[top #{path} --label endpoint=POST\ /users --label job=ReportJob],
       "heapscope top: #{path}: no sample matches --label endpoint=POST /users and job=ReportJob: each of endpoint=POST /users and " \
       "job=ReportJob matches samples, but no sample matches them all"],
      [%W[top #{base} --label endpoint=x], "heapscope top: #{base}: no sample matches --label endpoint=x: no sample has a label " \
                                           "\"endpoint\" (the profile has no user labels)"],
      [%W[diff #{base} #{path} --label endpoint=x], /\Aheapscope diff: #{Regexp.escape(base)} and #{Regexp.escape(path)}: no sample matches --label endpoint=x: /],
      [%W[diff #{base} #{base} --by label:endpoint], /\Aheapscope diff: .*: no sample has a label "endpoint" \(--by label:endpoint; the profile has no user labels\)\z/],
      [%W[flamegraph #{path} --label thread=worker-9 -o -], /\Aheapscope flamegraph: #{Regexp.escape(path)}: no sample matches --label thread=worker-9: .*thread has "worker-1"/],
      [%W[leaks #{path} #{base} --by label:], /\Aheapscope leaks: invalid argument: --by label: needs a label key/],
    ]
    cases.each do |(command, *argv), expected|
      status, out, err = run_cli(command, *argv)
      assert_equal [2, ""], [status, out], "#{command} #{argv.join(" ")}: #{err}"
      assert_equal 1, err.lines.size, err
      expected.is_a?(Regexp) ? assert_match(expected, err.chomp) : assert_equal(expected, err.chomp)
    end
    # --by still takes a unique prefix of line, function and class, as before.
    assert_equal "function", json("top", path, "--by", "func")["by"]
    # A hostile value in a message or a row reaches the terminal escaped.
    evil = write("evil.pb.gz", heapscope_profile([[BOOT, [1, 1, 1, 10], { "endpoint" => "x\e[2J\ny" }]]))
    _, out, = run_cli("top", evil, "--by", "label:endpoint")
    assert_includes out, "x\\e[2J\\ny\n"
    refute_includes out, "\e"
    _, _, err = run_cli("top", evil, "--label", "endpoint=z")
    assert_includes err, "endpoint has \"x\\e[2J\\ny\""
    refute_includes err, "\e"
  end

  # The page's data: a view (tree) per label value, frames shared, values and errors the value's own.
  def test_flamegraph_page_data_has_a_view_per_value
    path = write("app.pb.gz", app_profile(endpoint: HOSTILE))
    status, html, err = run_cli("flamegraph", path, "-o", "-")
    assert_equal [0, ""], [status, err]
    script = html[%r{<script type="application/json" id="hs-data">(.*?)</script>}m, 1]
    refute_match(/[<>&]/, script, "the hostile value stays inside the data script")
    assert_equal 2, html.scan(/<script\b/).size
    refute_includes html, "<img"
    data = JSON.parse(script)
    assert_equal %w[endpoint job thread], data["labels"].map { |l| l["key"] }
    endpoint = data["labels"][0]
    assert_equal [HOSTILE, "POST /users", "(other)"], endpoint["values"].map { |v| v["name"] }
    root = ->(view) { data["views"][view]["values"][3][0] }
    assert_equal [70_000, 8_000, 2_000], endpoint["values"].map { |v| root.call(v["view"]) }
    assert_equal [22_000, "(no endpoint label)"], [root.call(endpoint["missing"]), endpoint["missing_name"]]
    assert_equal 5000.0, data["views"][endpoint["values"][0]["view"]]["errors"]["cum"][3][0]
    # The job view holds ReportJob#perform, a frame of the main tree too, by the same index.
    job = data["views"][data["labels"][1]["values"][0]["view"]]
    assert_includes job["frame"].map { |i| data["frames"][i][0] }, "ReportJob#perform"
    meta = html[%r{<div class="meta">(.*?)</div>}, 1]
    assert meta.end_with?("; labels: endpoint (3 values), job (1 value), thread (4 values) (choose one above)"), meta

    # --label at generation: the page holds the selection, and that key's selector is left out.
    _, html, = run_cli("flamegraph", path, "-o", "-", "--label", "thread=worker-2")
    data = JSON.parse(html[%r{id="hs-data">(.*?)</script>}m, 1])
    assert_equal 28_000, data["values"][3][0]
    assert_equal %w[endpoint], data["labels"].map { |l| l["key"] }
    assert_includes html[%r{<div class="meta">(.*?)</div>}, 1], "; only samples with thread=worker-2; labels: endpoint (2 values)"
    # No user labels, no selectors.
    _, html, = run_cli("flamegraph", write("plain.pb.gz", heapscope_profile([[BOOT, [1, 1, 1, 5], { "class" => "Hash" }]])), "-o", "-")
    assert_equal [[], []], JSON.parse(html[%r{id="hs-data">(.*?)</script>}m, 1]).values_at("labels", "views")
  end

  def test_flamegraph_selectors_in_chromium
    path = write("app.pb.gz", app_profile(endpoint: HOSTILE))
    html = File.join(@dir, "app.html")
    assert_equal 0, run_cli("flamegraph", path, "-o", html)[0]
    chromium = BrowserHelper.chromium
    flunk "chromium is required: apt-get install chromium" unless chromium
    start_browser(chromium)
    open_page(html)
    texts = eval_js("Array.from(document.querySelectorAll('#hs-labels select')).map(s => Array.from(s.options).map(o => o.textContent))")
    assert_equal ["all (99.6 KiB)", "#{HOSTILE} (68.4 KiB)", "POST /users (7.8 KiB)", "(other) (2.0 KiB)", "(no endpoint label) (21.5 KiB)"], texts[0]
    assert_equal ["all (99.6 KiB)", "ReportJob (14.6 KiB)", "(no job label) (85.0 KiB)"], texts[1]
    assert_equal 0, eval_js("document.querySelectorAll('img').length"), "no markup from a label value"

    pick = ->(k, v) { eval_js("(function(){var s=document.querySelectorAll('#hs-labels select')[#{k}];s.value='#{v}';s.dispatchEvent(new Event('change'))})()") }
    view = ->(k, n) { eval_js("document.querySelectorAll('#hs-labels select')[#{k}].options[#{n}].value") }
    pick.call(0, view.call(0, 1))
    status = eval_js("document.getElementById('hs-status').textContent")
    assert_equal "samples with endpoint=#{HOSTILE} (68.6% of all); inuse_space: total 68.4 KiB", status
    top = eval_js("document.getElementById('hs-top').innerText").lines
    assert_match(/58\.6 KiB\s+85\.7%\s+±8%\s+Cache#store/, top.find { |l| l.include?("Cache#store") })
    refute(top.any? { |l| l.include?("ReportJob") })

    # Another key's choice sets this one back to all, and draws that value's tree.
    pick.call(2, view.call(2, 3)) # thread: all, worker-1, worker-2, worker-3
    assert_equal "-1", eval_js("document.querySelectorAll('#hs-labels select')[0].value")
    drawn = eval_js("Array.from(document.querySelectorAll('#hs-svg g')).map(g => g.getAttribute('data-name'))")
    assert_includes drawn, "ReportJob#perform"
    refute_includes drawn, "Cache#store"
    # The sample type switch relabels the values with that type's totals.
    eval_js("(function(){var s=document.getElementById('hs-type');s.value='0';s.dispatchEvent(new Event('change'))})()")
    assert_equal "ReportJob (3)", eval_js("document.querySelectorAll('#hs-labels select')[1].options[1].textContent")
    pick.call(2, "-1")
    assert_includes eval_js("document.getElementById('hs-status').textContent"), "alloc_objects: total 81"
    assert_nil eval_js("window.hsOwned"), "no script from a label value"

    # The diff page: a value's selector shows its change.
    base = write("base.pb.gz", heapscope_profile([[CACHE, [1, 1, 1, 30_000], { "endpoint" => HOSTILE }], [BOOT, [1, 1, 1, 7_000], {}]]))
    diff_html = File.join(@dir, "diff.html")
    assert_equal 0, run_cli("diff", base, path, "--html", "-o", diff_html)[0]
    open_page(diff_html)
    assert_equal "#{HOSTILE} (+39.1 KiB)", eval_js("document.querySelector('#hs-labels select').options[1].textContent")
    pick.call(0, view.call(0, 1))
    assert_includes eval_js("document.getElementById('hs-status').textContent"), "base 29.3 KiB, new 68.4 KiB, change +39.1 KiB"
    assert_equal 0, eval_js("document.querySelectorAll('img').length")
    assert_no_console_errors
  end
end
