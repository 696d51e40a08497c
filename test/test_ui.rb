# frozen_string_literal: true

# `heapscope ui`: the server over a folder of periodic profiles of a leaking app (made by running a
# small script under `heapscope run`), checked through HTTP (timeline, top, diff, flame graph, bad
# requests, token), a live listener's URL refreshed on its own, the CLI's usage errors, and the page
# itself in headless Chromium (browser_helper.rb).

require_relative "test_http_helper"
require_relative "browser_helper"
require "net/http"
require "open3"
require "etc"
require "heapscope/ui/cli"

class TestUI < Minitest::Test
  include SurfacesTestHelper
  include BrowserHelper

  EXE = File.join(ROOT, "exe/heapscope")
  # Line 4 keeps what it makes (the leak); line 5 replaces its array each turn (churn: flat over time).
  LEAKY = <<~RUBY
    KEEP = []
    t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0 < Float(ARGV[0])
      200.times { KEEP << ("x" * 1000) }
      $churn = Array.new(2000) { "y" * 1000 }
      sleep 0.02
    end
  RUBY
  LEAK_LINE = "leaky.rb:4"
  CHURN_LINE = "leaky.rb:5"

  # The folder of periodic profiles, made once for every test of this file.
  def self.folder
    @folder ||= periodic_folder("heapscope-ui-data", "--sampling", "always", "--sample-every", "50")
  end

  # The same script's profiles at default settings (windowed on Ruby 3.3+: the leak verdicts' other
  # path), made once.
  def self.default_folder
    @default_folder ||= periodic_folder("heapscope-ui-default")
  end

  # Runs LEAKY for 2.5 s under `heapscope run` with flags, a profile every 0.2 s; returns the folder.
  def self.periodic_folder(prefix, *flags)
    dir = Dir.mktmpdir(prefix)
    at_exit { FileUtils.rm_rf(dir) }
    File.write(File.join(dir, "leaky.rb"), LEAKY)
    _, err, status = Open3.capture3({ "RUBYOPT" => nil, "HEAPSCOPE_DIR" => nil }, RbConfig.ruby, EXE, "run",
                                    "--dir", File.join(dir, "prof"), "--interval", "0.2", *flags, "--",
                                    RbConfig.ruby, "leaky.rb", "2.5", chdir: dir)
    raise "heapscope run failed: #{err}" unless status.success?

    File.join(dir, "prof")
  end

  def setup
    @dir = Dir.mktmpdir("heapscope-ui")
    @servers = []
    @children = []
  end

  def teardown
    stop_browser if @cdp
    @servers.each(&:stop)
    @children.each do |pid|
      Process.kill("TERM", pid)
      Process.wait(pid)
    rescue Errno::ESRCH, Errno::ECHILD
      nil
    end
    FileUtils.rm_rf(@dir)
  end

  # A started ui server over sources; waits until every file is summarized.
  def serve(folders: [self.class.folder], files: [], urls: [], token: nil, refresh: 10, cache: File.join(@dir, "cache"))
    sources = Heapscope::UI::Sources.new(folders: folders, files: files, urls: urls, refresh: refresh,
                                         cache: Heapscope::UI::SummaryCache.new(cache))
    server = Heapscope::UI::Server.new(sources, port: 0, token: token, refresh: refresh).start
    @servers << server
    deadline = now + 60
    sleep 0.05 while sources.pending.positive? && now < deadline
    server
  end

  def now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  def get(server, target, headers = {})
    Net::HTTP.start("127.0.0.1", server.http.port, read_timeout: 60) do |http|
      http.get(target, headers)
    end
  end

  def get_json(server, target)
    res = get(server, target)
    assert_equal "200", res.code, "#{target}: #{res.body}"
    JSON.parse(res.body)
  end

  def site(series, line)
    series["sites"].find { |s| s["name"].end_with?(line) }
  end

  def test_timeline_shows_the_leak_rising_and_the_churn_flat
    data = get_json(serve, "/api/timeline")
    assert_equal 0, data["pending"]
    series = data["series"].first
    assert_operator series["snapshots"].size, :>=, 6
    times = series["snapshots"].map { |s| s["time"] }
    assert_equal times.sort, times
    leak = site(series, LEAK_LINE)
    churn = site(series, CHURN_LINE)
    assert leak, "the leak line is not drawn: #{series["sites"].map { |s| s["name"] }}"
    assert churn, "the churn line is not drawn"
    # Rising: every third point above the one before it, and the last far above the first.
    values = leak["values"]
    assert_operator values.last, :>, 4 * values.first
    assert values.each_slice(3).map(&:first).each_cons(2).all? { |a, b| b > a }, values.inspect
    assert_equal values.size, leak["errors"].size
    assert leak["errors"].all? { |e| e >= 0 }
    # The leak table calls it a leak; the churn line is no leak, and it never holds more than one
    # turn's arrays (about 2 MB, three turns at most between two GCs).
    row = series["leaks"].find { |r| r["name"].end_with?(LEAK_LINE) }
    assert_equal "leak", row["verdict"], row.inspect
    refute series["leaks"].any? { |r| r["name"].end_with?(CHURN_LINE) && r["verdict"] == "leak" }
    # (Not "below the leak's last value": how far the leak got depends on how many turns a loaded
    # machine ran in 2.5 s; one CI-loaded run had the leak at 6.2 MB beside a churn peak of 6.4 MB.)
    assert_operator churn["values"].max, :<, 16_000_000
    # Totals with errors, and the memory breakdown of each snapshot.
    assert series["snapshots"].all? { |s| s["total"].positive? && s["total_error"] >= 0 }
    assert series["snapshots"].last["memory"]&.key?("rss")
  end

  # The page's leak verdicts are `heapscope leaks`' over the same profiles: snapshots of one run judged
  # by what changed between them (Report::Persistence), from the summaries alone; sampling always
  # (T_var by gc_age) and at default settings (variance groups on Ruby 3.3+), and again from the
  # summary cache.
  def test_leak_verdicts_match_heapscope_leaks
    [self.class.folder, self.class.default_folder].each do |folder|
      out, err, status = Open3.capture3({ "RUBYOPT" => nil }, RbConfig.ruby, "-I", File.join(ROOT, "lib"), EXE, "leaks",
                                        folder, "--json", "-n", "100")
      assert status.success?, err
      data = JSON.parse(out)
      assert data["one_run"], "#{folder}: one run's snapshots"
      cli = data["sites"].find { |r| r["name"].end_with?(LEAK_LINE) }
      refute_nil cli, data["sites"].map { |r| r["name"] }.inspect
      2.times do # the second server reads the summaries from the cache
        series = get_json(serve(folders: [folder]), "/api/timeline")["series"].first
        row = series["leaks"].find { |r| r["name"].end_with?(LEAK_LINE) }
        assert_equal cli.values_at("verdict", "trend_sigmas", "rate_error"), row.values_at("verdict", "trend_sigmas", "rate_error"), folder
      end
    end
  end

  # A second server over the same folder reads the summaries back (one cache file per profile) and
  # shows the same timeline.
  def test_summary_cache_gives_the_same_timeline
    first = get_json(serve, "/api/timeline")["series"]
    assert_equal Dir.children(self.class.folder).size, Dir.children(File.join(@dir, "cache")).size
    File.write(File.join(@dir, "cache", "junk.json"), "{not json")
    Dir[File.join(@dir, "cache", "*.json")].first.then { |f| File.write(f, "[]") } # a bad entry is a miss
    assert_equal first, get_json(serve, "/api/timeline")["series"]
  end

  # The one-run data a summary keeps (persist, extras) is input when read back: an entry whose parts
  # are malformed is a miss (the profile is read again), never a crash or a verdict from bad numbers.
  def test_summary_cache_with_malformed_one_run_data_is_a_miss
    first = get_json(serve, "/api/timeline")["series"]
    files = Dir[File.join(@dir, "cache", "*.json")].sort
    bad = [{ "ages" => "x" }, { "ages" => [[["4", 1, 2]]] }, nil]
    files.each_with_index do |f, i|
      data = JSON.parse(File.read(f))
      refute_nil data["persist"], "a summary of heapscope's own profile keeps its run's data"
      case i % 3
      when 0 then data["extras"] = bad[i % 2]
      when 1 then data["persist"] = data["persist"].merge("gc" => "12")
      else data["extras"] = data["extras"].merge("ages" => data["extras"]["ages"].drop(1))
      end
      File.write(f, JSON.generate(data))
    end
    assert_equal first, get_json(serve, "/api/timeline")["series"]
  end

  def test_top_flame_and_diff_of_snapshots
    server = serve
    snaps = get_json(server, "/api/timeline")["series"].first["snapshots"]
    first = snaps[1]["id"]
    last = snaps[-2]["id"] # the final profile is written after the loop ended; take the last periodic one
    top = get_json(server, "/api/top?snap=#{last}")
    entry = top["entries"].find { |e| e["name"].end_with?(LEAK_LINE) }
    assert entry
    assert_operator entry["relative_error"], :>, 0
    diff = get_json(server, "/api/diff?base=#{first}&new=#{last}")
    grew = diff["grew"].find { |r| r["name"].end_with?(LEAK_LINE) }
    assert_equal "grew", grew["verdict"], grew.inspect
    %W[/flame?snap=#{last} /diff?base=#{first}&new=#{last} /].each do |target|
      res = get(server, target)
      assert_equal "200", res.code, target
      assert_match %r{\Atext/html}, res["content-type"]
      refute_match %r{(src|href)=["']?https?://}, res.body, "#{target} must not load anything from the network"
    end
    assert_includes get(server, "/flame?snap=#{last}").body, "leaky.rb"
  end

  def test_bad_requests_get_4xx_and_read_nothing_outside_the_sources
    server = serve
    {
      "/nope" => "404", "/api/top" => "400", "/api/top?snap=abc" => "400", "/api/top?snap=999999" => "404",
      "/flame?file=../../etc/passwd" => "400", "/flame?snap=../../etc/passwd" => "400",
      "/../../etc/passwd" => "404", "/%2e%2e/%2e%2e/etc/passwd" => "404", "/api/diff?base=1&new=1" => "400",
      "/api/top?snap=1&snap=%00" => "400", "/api/top?%zz" => "400",
    }.each do |target, code|
      res = get(server, target)
      assert_equal code, res.code, "#{target}: #{res.body}"
      refute_includes res.body, "root:"
    end
    post = Net::HTTP.start("127.0.0.1", server.http.port) { |h| h.post("/api/timeline", "x") }
    assert_equal "413", post.code # a body is refused by the listener before the app sees it
    post = Net::HTTP.start("127.0.0.1", server.http.port) { |h| h.request(Net::HTTP::Delete.new("/api/timeline")) }
    assert_equal "405", post.code
  end

  # Child processes summarize part of a large folder into the cache (Prefetch); the timeline is the
  # one a single process makes.
  def test_prefetch_children_give_the_same_timeline
    skip "one core: no child is started" if Etc.nprocessors < 2
    big = File.join(@dir, "big")
    FileUtils.mkdir_p(big)
    Dir.children(self.class.folder).each do |n|
      FileUtils.cp(File.join(self.class.folder, n), File.join(big, n))
      FileUtils.cp(File.join(self.class.folder, n), File.join(big, n.sub(/-(\d+)-/, "-99999-")))
    end
    alone = Heapscope::UI::Sources.new(folders: [big], cache: nil)
    Heapscope::UI::Server.new(alone, port: 0).start.tap { |s| @servers << s }
    sleep 0.05 while alone.pending.positive?
    helped = Heapscope::UI::Sources.new(folders: [big], cache: Heapscope::UI::SummaryCache.new(File.join(@dir, "pcache")))
    server = Heapscope::UI::Server.new(helped, port: 0).start.tap { |s| @servers << s }
    refute_nil helped.instance_variable_get(:@prefetch), "no child was started"
    sleep 0.05 while helped.pending.positive?
    assert_equal Dir.children(big).size, Dir.children(File.join(@dir, "pcache")).size
    by_name = ->(series) { series.map { |s| [s["name"], s["snapshots"].map { |p| p.except("id") }, s["leaks"].map { |r| r["name"] }] } }
    expected = Heapscope::UI::Timeline.method(:build)
    got = get_json(server, "/api/timeline")["series"]
    want = alone.series.map { |s| JSON.parse(Heapscope::Report::Escape.script_json(expected.call(s, alone.table))) }
    assert_equal by_name.call(want), by_name.call(got)
  end

  # exe/heapscope ui in a child process: says where it serves, serves, and ends with exit 0 on INT.
  def test_exe_serves_until_interrupted
    out, w = IO.pipe
    pid = Process.spawn({ "RUBYOPT" => nil, "HEAPSCOPE_UI_CACHE" => "off" }, RbConfig.ruby, EXE, "ui", self.class.folder,
                        "--port", "0", out: w, err: File.join(@dir, "ui.log"))
    w.close
    line = Timeout.timeout(30) { out.gets }
    url = line[%r{serving (http://127\.0\.0\.1:\d+/)}, 1]
    assert url, line
    res = Net::HTTP.get_response(URI("#{url}api/timeline"))
    assert_equal "200", res.code
    Process.kill("INT", pid)
    _, status = Timeout.timeout(30) { Process.wait2(pid) }
    assert_equal 0, status.exitstatus, File.read(File.join(@dir, "ui.log"))
  ensure
    out&.close
  end

  # A folder holding two processes' periodic files gives two series; files named one by one make one.
  def test_series_per_process_and_for_single_files
    mixed = File.join(@dir, "mixed")
    FileUtils.mkdir_p(mixed)
    names = Dir.children(self.class.folder).sort
    names.each { |n| FileUtils.cp(File.join(self.class.folder, n), File.join(mixed, n)) }
    names.first(3).each { |n| FileUtils.cp(File.join(self.class.folder, n), File.join(mixed, n.sub(/-(\d+)-/, "-99999-"))) }
    series = get_json(serve(folders: [mixed]), "/api/timeline")["series"]
    assert_equal [3, names.size], series.map { |s| s["snapshots"].size }.sort
    assert(series.all? { |s| s["name"].start_with?("#{mixed}: leaky-") })

    files = names.first(2).map { |n| File.join(self.class.folder, n) }
    series = get_json(serve(folders: [], files: files), "/api/timeline")["series"]
    assert_equal [["files", 2]], series.map { |s| [s["name"], s["snapshots"].size] }
  end

  # Label filters (label=KEY=VALUE, as --label) on the top table, the diff and the flame graph.
  def test_label_filters
    folder = File.join(@dir, "labelled")
    FileUtils.mkdir_p(folder)
    types = [%w[inuse_objects count], %w[inuse_space bytes]]
    2.times do |k|
      prof = Heapscope::Pprof::Profile.new(sample_types: types, time_nanos: (1_700_000_000 + 60 * k) * 1_000_000_000,
                                           comments: ["heapscope sample_every=1"])
      prof.add_sample(frames: [["Users#show", "app/users.rb", 3]], values: [10, 1000 * (k + 1)], labels: { "endpoint" => "users" })
      prof.add_sample(frames: [["Posts#index", "app/posts.rb", 7]], values: [10, 500], labels: { "endpoint" => "posts" })
      File.binwrite(File.join(folder, "app-1-#{k}.heap.pb.gz"), prof.to_pprof)
    end
    server = serve(folders: [folder])
    ids = get_json(server, "/api/timeline")["series"].first["snapshots"].map { |s| s["id"] }
    labels = get_json(server, "/api/labels?snap=#{ids[0]}")["labels"]
    assert_equal [{ "key" => "endpoint", "values" => [["posts", 1], ["users", 1]], "more" => false }], labels
    top = get_json(server, "/api/top?snap=#{ids[1]}&label=endpoint%3Dposts")
    assert_equal ["Posts#index app/posts.rb:7"], top["entries"].map { |e| e["name"] }
    diff = get_json(server, "/api/diff?base=#{ids[0]}&new=#{ids[1]}&label=endpoint%3Dusers")
    assert_equal ["Users#show app/users.rb:3"], diff["grew"].map { |r| r["name"] }
    assert_equal "200", get(server, "/flame?snap=#{ids[1]}&label=endpoint%3Dusers").code
    assert_equal "400", get(server, "/api/top?snap=#{ids[1]}&label=endpoint").code
    assert_equal "404", get(server, "/api/top?snap=#{ids[1]}&label=endpoint%3Dnone").code # no sample matches
    # A file's snapshot has no process to ask who holds a site.
    assert_equal "400", get(server, "/api/retainers?snap=#{ids[1]}&site=app%2Fusers.rb%3A3").code
  end

  # A real run whose requests carry an endpoint label: "users" keeps what it makes, "posts" does not.
  LABELLED = <<~RUBY
    KEEP = []
    t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0 < Float(ARGV[0])
      Heapscope.with_labels(endpoint: "users", worker: "w1") { 100.times { KEEP << ("u" * 1000) } }
      Heapscope.with_labels(endpoint: "posts", worker: "w1") { $posts = Array.new(300) { "p" * 1000 } }
      Heapscope.with_labels(endpoint: "users", worker: "w2") { 50.times { KEEP << ("v" * 1000) } }
      sleep 0.02
    end
  RUBY

  # The timeline with label filters: each series gets the live bytes of the samples carrying them, per
  # snapshot, equal to what the top table's selection holds and with the error --by label:KEY prints
  # for that row (computed here by Report::Sites from the whole profile); read back from the cache alike.
  def labelled_folder
    File.write(File.join(@dir, "labelled.rb"), LABELLED)
    folder = File.join(@dir, "prof")
    _, err, status = Open3.capture3({ "RUBYOPT" => nil, "HEAPSCOPE_DIR" => nil }, RbConfig.ruby, EXE, "run",
                                    "--dir", folder, "--interval", "0.2", "--sampling", "always", "--sample-every", "20",
                                    "--", RbConfig.ruby, "labelled.rb", "1.5", chdir: @dir)
    assert status.success?, err
    folder
  end

  def test_timeline_follows_a_label_filter
    folder = labelled_folder
    server = serve(folders: [folder])
    whole = get_json(server, "/api/timeline")["series"].first
    assert_nil whole["selected"]
    series = get_json(server, "/api/timeline?label=endpoint%3Dusers")["series"].first
    assert_equal whole["snapshots"], series["snapshots"]
    sel = series["selected"]
    assert_equal "endpoint=users", sel["filter"]
    assert_operator sel["values"].size, :>=, 4
    assert_operator sel["values"].last, :>, 2 * sel["values"].first, sel["values"].inspect
    assert sel["rest"].all?(&:zero?)
    series["snapshots"].each_with_index do |snap, i|
      top = get_json(server, "/api/top?snap=#{snap["id"]}&label=endpoint%3Dusers")
      assert_equal top["selected_total"], sel["values"][i], "snapshot #{i}"
      prof = Heapscope::Pprof.decode(File.binread(File.join(folder, snap["file"])))
      ti = prof.sample_type_names.index("inuse_space")
      row = Heapscope::Report::Sites.aggregate(prof, "label:endpoint")["users"]
      assert_equal row.flat[ti], sel["values"][i]
      want = Heapscope::Report::Sampling.new(prof).absolute_error(row.flat, ti)
      assert_in_delta want, sel["errors"][i], 0.1 + 1e-9 * want, "snapshot #{i}"
      assert_operator sel["values"][i], :<=, snap["total"]
    end
    # Two filters: the samples carrying both (w2 is a third of users' bytes).
    both = get_json(server, "/api/timeline?label=endpoint%3Dusers&label=worker%3Dw2")["series"].first["selected"]
    assert_equal "endpoint=users and worker=w2", both["filter"]
    assert both["values"].zip(sel["values"]).all? { |b, u| b <= u }
    assert_operator both["values"].last, :>, 0
    posts = get_json(server, "/api/timeline?label=endpoint%3Dposts")["series"].first["selected"]
    assert_operator posts["values"].max, :<, sel["values"].last
    assert_equal [0] * sel["values"].size, get_json(server, "/api/timeline?label=endpoint%3Dnone")["series"].first["selected"]["values"]
    assert_equal "400", get(server, "/api/timeline?label=endpoint").code
    own = get(server, "/api/timeline?label=class%3DString")
    assert_equal ["400", true], [own.code, own.body.include?("class is heapscope's own")]
    # A second server reads the label sets back from the cache.
    assert_equal series, get_json(serve(folders: [folder]), "/api/timeline?label=endpoint%3Dusers")["series"].first
  end

  # The page: a label filter chosen (as its select does) draws the filtered samples' line and band on
  # the timeline, with a legend entry; clearing it takes them away.
  def test_page_draws_a_label_filter
    path = BrowserHelper.chromium
    flunk "chromium is required: apt-get install chromium" unless path
    server = serve(folders: [labelled_folder])
    start_browser(path)
    @cdp.call("Page.navigate", { url: server.url }, session: @session)
    @cdp.wait_event("Page.loadEventFired")
    selected = "Array.from(document.querySelectorAll('svg.hs-timeline [data-kind=\"selected\"]'))" \
               ".map(e => e.tagName + ' ' + e.getAttribute('data-site')).join('|')"
    deadline = now + 20
    sleep 0.1 until eval_js("document.querySelectorAll('svg.hs-timeline path.line').length") > 0 || now > deadline
    assert_equal "", eval_js(selected)
    eval_js("window.hsUI.filter('endpoint', 'users')")
    deadline = now + 20
    sleep 0.1 until !eval_js(selected).empty? || now > deadline
    assert_equal "polygon with endpoint=users|path with endpoint=users", eval_js(selected)
    assert_includes eval_js("document.querySelector('.hs-legend').innerText"), "with endpoint=users"
    eval_js("window.hsUI.filter('endpoint', '')")
    deadline = now + 20
    sleep 0.1 until eval_js(selected).empty? || now > deadline
    assert_equal "", eval_js(selected)
    assert_no_console_errors
  end

  def test_token_by_header_or_query
    server = serve(token: "s3cret-token-123")
    assert_equal "401", get(server, "/api/timeline").code
    assert_includes get(server, "/").body, "?token=TOKEN"
    assert_equal "401", get(server, "/api/timeline?token=wrong").code
    assert_equal "200", get(server, "/api/timeline?token=s3cret-token-123").code
    assert_equal "200", get(server, "/api/timeline", "Authorization" => "Bearer s3cret-token-123").code
  end

  def test_cli_usage_errors_are_one_line_and_exit_2
    closed = TCPServer.new("127.0.0.1", 0).then { |s| s.addr[1].tap { s.close } }
    empty = Dir.mktmpdir("heapscope-ui-empty", @dir)
    held = TCPServer.new("127.0.0.1", 0)
    {
      [self.class.folder, "--port", held.addr[1].to_s] => /cannot listen on 127\.0\.0\.1:\d+: Address already in use/,
      [] => /missing SOURCE/,
      [File.join(@dir, "missing")] => /missing: no such file, folder or URL/,
      [empty] => /no profiles/,
      [self.class.folder, "--port", "http"] => /--port must be a number from 0 to 65535, got "http"/,
      [self.class.folder, "--port", "70000"] => /--port must be a number/,
      [self.class.folder, "--host", "0.0.0.0"] => /not a loopback address: set HEAPSCOPE_HTTP_TOKEN/,
      ["http://127.0.0.1:#{closed}/debug/pprof/heap", "--timeout", "5"] => %r{127\.0\.0\.1:#{closed}/debug/pprof/heap},
    }.each do |argv, message|
      out = StringIO.new
      err = StringIO.new
      assert_equal 2, Heapscope::UI::CLI.run(argv, out: out, err: err), argv.inspect
      assert_equal 1, err.string.lines.size, err.string
      assert_match message, err.string
      assert_match(/\Aheapscope ui: /, err.string)
    end
    held.close
    out, = Open3.capture3({ "RUBYOPT" => nil }, RbConfig.ruby, EXE, "--help")
    assert_includes out, "ui SOURCE..."
  end

  # A listener in a child process (heapscope run --http), fetched every 0.3 s.
  def test_live_source_refreshes
    port = TCPServer.new("127.0.0.1", 0).then { |s| s.addr[1].tap { s.close } }
    File.write(File.join(@dir, "leaky.rb"), LEAKY)
    # Sampled always and densely: the leak line is then in every snapshot's top (windowed, the default
    # on 3.3+, a second-old process may not have sampled it yet).
    @children << Process.spawn({ "RUBYOPT" => nil, "HEAPSCOPE_DIR" => nil }, RbConfig.ruby, EXE, "run", "--dir",
                               File.join(@dir, "prof"), "--http", "127.0.0.1:#{port}", "--sampling", "always",
                               "--sample-every", "100", "--", RbConfig.ruby, "leaky.rb", "60",
                               chdir: @dir, out: File::NULL, err: File.join(@dir, "run.log"))
    url = "http://127.0.0.1:#{port}/debug/pprof/heap"
    deadline = now + 30
    until (Net::HTTP.get_response(URI(url)).code == "200" rescue false) # rubocop:disable Style/RescueModifier
      flunk "the listener did not start: #{File.read(File.join(@dir, "run.log"))}" if now > deadline
      sleep 0.2
    end
    server = serve(folders: [], urls: [url], refresh: 0.3)
    deadline = now + 30
    series = nil
    loop do
      series = get_json(server, "/api/timeline")["series"].first
      break if series["snapshots"].size >= 4 || now > deadline

      sleep 0.3
    end
    assert_operator series["snapshots"].size, :>=, 4
    assert_equal "live", series["kind"]
    newest = series["snapshots"].last["id"]
    assert_equal "200", get(server, "/flame?snap=#{newest}").code
    # Who holds the leak: asked of the process (its /debug/pprof/retainers); the KEEP constant does.
    top = get_json(server, "/api/top?snap=#{newest}")
    assert top["live"]
    leak = top["entries"].find { |e| e["name"].end_with?(LEAK_LINE) }
    refute_nil leak, "the leak line in the live top: #{top["entries"].map { |e| e["name"] }}"
    res = get(server, "/api/retainers?snap=#{newest}&site=#{URI.encode_www_form_component("#{leak["file"]}:#{leak["line"]}")}")
    assert_equal "200", res.code, res.body
    assert_includes res.body, "KEEP"
    assert_equal "400", get(server, "/api/retainers?snap=#{newest}&site=nowhere").code
    # Older live snapshots keep only their summaries.
    assert_equal "404", get(server, "/flame?snap=#{series["snapshots"].first["id"]}").code

    # The page redraws on its own as snapshots arrive.
    path = BrowserHelper.chromium
    flunk "chromium is required: apt-get install chromium" unless path
    start_browser(path)
    @cdp.call("Page.navigate", { url: server.url }, session: @session)
    @cdp.wait_event("Page.loadEventFired")
    count = -> { eval_js("document.querySelectorAll('svg.hs-timeline circle.snap').length") }
    deadline = now + 20
    sleep 0.1 until count.call.positive? || now > deadline
    before = count.call
    assert_operator before, :>=, 4
    sleep 0.1 until count.call > before + 2 || now > deadline
    assert_operator count.call, :>, before + 2
    assert_includes eval_js("document.querySelector('h2').textContent"), "live, refreshed every 0.3 s"
    assert_no_console_errors
  end

  def test_page_in_chromium
    path = BrowserHelper.chromium
    flunk "chromium is required: apt-get install chromium" unless path
    server = serve
    start_browser(path)
    @cdp.call("Network.enable", {}, session: @session)
    @cdp.events.clear
    @cdp.call("Page.navigate", { url: server.url }, session: @session)
    @cdp.wait_event("Page.loadEventFired")
    drawn = lambda do
      eval_js("Array.from(document.querySelectorAll('svg.hs-timeline path.line')).map(p => p.getAttribute('data-site')).join('\\n')")
    end
    deadline = now + 20
    sleep 0.1 until drawn.call.include?(LEAK_LINE) || now > deadline
    sites = drawn.call.split("\n")
    assert_includes sites, "total"
    leak = sites.find { |s| s.end_with?(LEAK_LINE) }
    assert leak, sites.inspect
    # The leak's path rises: its last point is higher on the page (smaller y) than its first.
    ys = eval_js("(function(){var p=Array.from(document.querySelectorAll('svg.hs-timeline path.line'))" \
                 ".find(p=>p.getAttribute('data-site').endsWith('#{LEAK_LINE}'));" \
                 "var pts=p.getAttribute('d').slice(1).split('L').map(s=>+s.split(',')[1]);return [pts[0],pts[pts.length-2]]})()")
    assert_operator ys[1], :<, ys[0] - 50
    assert_operator eval_js("document.querySelectorAll('svg.hs-timeline polygon.band').length"), :>=, 3
    assert_includes eval_js("document.querySelector('.hs-leaks').innerText"), "leak"

    # Two clicks on points: the top table of the second, and the diff of the two.
    ids = eval_js("Array.from(document.querySelectorAll('svg.hs-timeline circle.snap')).map(c => c.getAttribute('data-id'))")
    [ids[1], ids[-2]].each do |id|
      box = eval_js("(function(){var r=document.querySelector('svg.hs-timeline circle.snap[data-id=\"#{id}\"]')" \
                    ".getBoundingClientRect();return [r.x,r.y,r.width,r.height]})()")
      eval_js("window.scrollTo(0,0)")
      mouse("mousePressed", box, click: 1)
      mouse("mouseReleased", box, click: 1)
    end
    deadline = now + 20
    sleep 0.1 until (eval_js("document.getElementById('hs-diff-table') ? 1 : 0") == 1 && eval_js("document.getElementById('hs-top-table') ? 1 : 0") == 1) || now > deadline
    assert_includes eval_js("document.getElementById('hs-top-table').innerText"), LEAK_LINE
    diff = eval_js("Array.from(document.querySelectorAll('#hs-diff-table tr[data-verdict]')).map(r => r.getAttribute('data-verdict') + ' ' + r.lastChild.textContent)")
    assert diff.any? { |r| r.start_with?("grew") && r.end_with?(LEAK_LINE) }, diff.inspect
    assert_match %r{/flame\?snap=\d+\z}, eval_js("document.getElementById('hs-flame-link').href")

    shot = @cdp.call("Page.captureScreenshot", { format: "png" }, session: @session)["data"].unpack1("m")
    FileUtils.mkdir_p(File.join(ROOT, "tmp"))
    File.binwrite(File.join(ROOT, "tmp", "ui-timeline.png"), shot)
    assert_operator shot.bytesize, :>, 10_000

    # Every request the page made went to this server.
    urls = @cdp.events.select { |e| e["method"] == "Network.requestWillBeSent" }.map { |e| e.dig("params", "request", "url") }
    assert_operator urls.size, :>=, 3
    urls.each { |u| assert u.start_with?("http://127.0.0.1:#{server.http.port}/"), u }
    assert_no_console_errors
  end
end
