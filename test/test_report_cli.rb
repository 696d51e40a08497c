# frozen_string_literal: true

# heapscope top, diff and leaks on profiles with known answers (hand-made with the Ruby writer, and
# written by Go's runtime/pprof), their JSON, their sampling errors, and every bad-input case: one line
# on stderr naming the problem, exit status 2, never a backtrace.

require_relative "test_report_helper"
require "json"
require "stringio"
require "minitest/mock"
require "heapscope/report/cli"

class TestReportCLI < Minitest::Test
  include ReportHelper
  MIN = 60 * 10**9 # a minute in nanoseconds
  T0 = 1_800_000_000 * 10**9

  def setup
    @dir = Dir.mktmpdir("heapscope-report")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  LEAK = [["Cache#store", "app/cache.rb", 12], ["Worker#run", "app/worker.rb", 30], ["main", "app/main.rb", 3]].freeze
  ONE_OFF = [["Config#load", "app/config.rb", 5], ["main", "app/main.rb", 4]].freeze
  CHURN = [["Request#parse", "app/request.rb", 7], ["Worker#run", "app/worker.rb", 31], ["main", "app/main.rb", 3]].freeze
  # A C function carrying its Ruby caller's line, as heapscope writes them.
  CFUNC = [["String#*", "app/cache.rb", 12], ["Cache#store", "app/cache.rb", 12], ["Worker#run", "app/worker.rb", 30],
           ["main", "app/main.rb", 3]].freeze

  # A heap profile at minute k of a process that leaks 100 KiB a minute at Cache#store, loaded 3 MiB of
  # config once at minute 2, and churns requests (live bytes up and down).
  def series_profile(k, sample_every: 1)
    leak = 100 * 1024 * (k + 1)
    churn = [300, 900, 200, 800, 250, 850][k] * 1024
    config = k >= 2 ? 3 * 1024 * 1024 : 0
    heapscope_profile([
                        [LEAK, [leak / 64, leak / 2, leak / 128, leak / 2], { "class" => "String", "gc_age" => 8 }],
                        [CFUNC, [leak / 64, leak / 2, leak / 128, leak / 2], { "class" => "String", "gc_age" => 16 }],
                        [ONE_OFF, [config / 1024, config, config / 1024, config], { "class" => "Hash", "gc_age" => 4 }],
                        [CHURN, [20_000, 20_000 * 512, churn / 512, churn], { "class" => "Array", "gc_age" => 0 }],
                      ], sample_every: sample_every, time_nanos: T0 + k * MIN)
  end

  def test_windowed_profiles_say_their_errors_are_lower_bounds
    prof = heapscope_profile([[LEAK, [1000, 64_000, 800, 8 * 1024 * 1024], { "class" => "String" }]], sample_every: 100)
    prof.comments << "sampling=windowed window_share=0.02 windows_opened=37 windows_skipped=5 hook_on_share=0.01900 allocations=9000000"
    status, out, err = run_cli("top", write("windowed.pb.gz", prof))
    assert_equal [0, ""], [status, err]
    assert_includes out.lines[1], "sample_every=100, windowed sampling (37 windows): errors are lower bounds"
    # Always mode (no sampling=windowed line): as before.
    status, out, = run_cli("top", write("always.pb.gz", heapscope_profile([[LEAK, [10, 640, 8, 512], {}]], sample_every: 100)))
    assert_equal 0, status
    refute_includes out, "lower bounds"
  end

  def test_top_puts_the_biggest_line_first_with_units_and_errors
    path = write("heap.pb.gz", heapscope_profile([
                                                   [LEAK, [1000, 64_000, 800, 8 * 1024 * 1024], { "class" => "String" }],
                                                   [CHURN, [50_000, 9_000_000, 100, 1024 * 1024], { "class" => "Array" }],
                                                   [ONE_OFF, [10, 1000, 10, 1024], { "class" => "Hash" }],
                                                 ], sample_every: 100))
    status, out, err = run_cli("top", path)
    assert_equal [0, ""], [status, err]
    lines = out.lines.map(&:chomp)
    assert_equal "File: #{path}", lines[0]
    assert_includes lines[1], "inuse_space"
    assert_includes lines[1], "sample_every=100"
    header = lines.index { |l| l.include?("flat%") }
    first = lines[header + 1]
    # 8 MiB of 9 MiB + 1 KiB; 800 objects at 1-in-100 sampling = 8 samples: ±sqrt(0.99/8) = ±35%.
    assert_match(/\A8\.0 MiB\s+88\.9%\s+88\.9%\s+8\.0 MiB\s+88\.9%\s+±35%\s+Cache#store app\/cache\.rb:12\z/, first)
    assert_match(/1\.0 MiB\s+11\.1%\s+100\.0%.*±100%\s+Request#parse app\/request\.rb:7\z/, lines[header + 2])
    # Worker#run only calls: 0 flat, 100% cum.
    worker = lines.find { |l| l.include?("Worker#run app/worker.rb:30") }
    assert_match(/\A\s*0 B\s+0\.0%.*8\.0 MiB\s+88\.9%\s+-\s+Worker#run/, worker)

    # --cum sorts by cumulative value: main first.
    _, out, = run_cli("top", path, "--cum", "-n", "2")
    assert_match(/main app\/main\.rb:3\z/, out.lines.grep(/%/).first(2).last.chomp)

    # --by class, --sample and --json.
    status, out, = run_cli("top", path, "--by", "class", "--sample", "alloc_objects", "--json")
    assert_equal 0, status
    data = JSON.parse(out)
    assert_equal %w[alloc_objects count class flat], data.values_at("sample_type", "unit", "by", "sort")
    assert_equal 51_010, data["total"]
    assert_equal %w[Array String Hash], data["entries"].map { |e| e["name"] }
    assert_equal 50_000, data["entries"][0]["flat"]
    assert_in_delta Math.sqrt(0.99 / 500), data["entries"][0]["relative_error"], 1e-4
    assert_equal 100, data["sample_every"]

    _, out, = run_cli("top", path, "--by", "function", "-n", "1")
    assert_match(/Cache#store\z/, out.lines.last.chomp)
  end

  def test_top_merges_c_frames_into_their_ruby_line
    path = write("cfunc.pb.gz", series_profile(0))
    _, out, = run_cli("top", path, "--json")
    entries = JSON.parse(out)["entries"]
    e = entries.find { |x| x["file"] == "app/cache.rb" }
    assert_equal ["Cache#store", 12], e.values_at("function", "line")
    assert_equal 100 * 1024, e["flat"] # both samples: the String#* one and the Ruby one
    assert_equal 1, entries.count { |x| x["file"] == "app/cache.rb" }
    assert_empty entries.select { |x| x["function"] == "String#*" }
  end

  def test_top_reads_go_heap_profiles
    go = go_heap_profile(@dir)
    status, out, err = run_cli("top", go, "-n", "3")
    assert_equal [0, ""], [status, err]
    first = out.lines.find { |l| l.include?("%") && !l.include?("flat%") }
    assert_match(/main\.leakyAlloc .*main\.go:\d+$/, first)
    assert_includes out, "Go sampling"
    status, out, = run_cli("top", go, "--sample", "alloc_space", "--by", "function", "--json")
    assert_equal 0, status
    names = JSON.parse(out)["entries"].map { |e| e["name"] }
    assert_equal %w[main.leakyAlloc main.churnAlloc], names.first(2)
  end

  def test_diff_sorts_by_growth_and_marks_noise
    base = write("base.pb.gz", heapscope_profile([
                                                   [LEAK, [0, 0, 100, 1_000_000], {}],
                                                   [CHURN, [0, 0, 400, 4_000_000], {}],
                                                   [ONE_OFF, [0, 0, 10_000, 500_000], {}],
                                                 ], sample_every: 10))
    newer = write("new.pb.gz", heapscope_profile([
                                                   [LEAK, [0, 0, 900, 9_000_000], {}],
                                                   [CHURN, [0, 0, 100, 1_000_000], {}],
                                                   [ONE_OFF, [0, 0, 10_010, 500_500], {}],
                                                   [[["New#thing", "app/new.rb", 1]], [0, 0, 10, 2_000], {}],
                                                 ], sample_every: 10))
    status, out, err = run_cli("diff", base, newer)
    assert_equal [0, ""], [status, err]
    assert_includes out, "Total: 5.2 MiB -> 10.0 MiB (+4.8 MiB, +91.0%)"
    grew = out[/^Grew.*?(?=^$)/m].lines.drop(2)
    assert_match(/\A\s*977 KiB\s+8\.6 MiB\s+\+7\.6 MiB\s+\+800\.0%\s+±\S+ KiB\s+grew 8\.4σ\s+Cache#store app\/cache\.rb:12$/, grew[0])
    assert_match(/New#thing/, grew[1])
    # One sampled object in NEW: +2 KB ±1.9 KB is within twice its error, but so near its error, and on
    # so few samples, that it is not called noise; the advice names the rate that would tell.
    assert_match(/new\s+±\S+ KiB\s+not enough evidence 1\.0σ\s+New#thing/, grew[1])
    assert_match(/\+500 B .* noise 0\.0σ\s+Config#load/, grew[2])
    assert_includes out, "To decide:\n  New#thing app/new.rb:1: +2.0 KiB ±1.9 KiB: sample_every: 2 would make a change this size 2σ"
    shrank = out[/^Shrank.*?(?=^$)/m].lines.drop(2)
    assert_match(/-2\.9 MiB\s+-75\.0%.*Request#parse/, shrank[0])

    status, out, = run_cli("diff", base, newer, "--json", "--by", "function")
    assert_equal 0, status
    data = JSON.parse(out)
    assert_equal %w[Cache#store New#thing Config#load], data["grew"].map { |r| r["name"] }
    assert_equal 8_000_000, data["grew"][0]["change"]
    refute data["grew"][0]["noise"]
    assert_equal [["grew", 8.4, nil], ["not enough evidence", 1.0, 2], ["noise", 0.0, nil]],
                 data["grew"].map { |r| r.values_at("verdict", "sigmas", "advice_sample_every") }
    assert_equal ["Request#parse"], data["shrank"].map { |r| r["name"] }
    assert_equal ["shrank", -4.4], data["shrank"][0].values_at("verdict", "sigmas")

    html = File.join(@dir, "d.html")
    status, out, = run_cli("diff", base, newer, "--html", "-o", html)
    assert_equal 0, status
    assert_includes out, "wrote #{html}"
    assert_includes File.read(html), "Cache#store"
  end

  def test_leaks_ranks_a_steady_leak_above_a_one_off_and_churn
    6.times { |k| write(format("heap-%02d.pb.gz", k), series_profile(k, sample_every: 64)) }
    status, out, err = run_cli("leaks", @dir)
    assert_equal [0, ""], [status, err]
    rows = out.lines.drop_while { |l| !l.include?("rate/min") }.drop(1).take_while { |l| l.strip != "" }
    assert_match(/Cache#store app\/cache\.rb:12$/, rows[0])
    assert_match(/\+100 KiB\s+\S+\s+5\/5\s+600 KiB\s+\S+\s+8:50% 16:50%\s+leak 11\.2σ/, rows[0])
    # The one-off step is beyond its errors but no trend: churn that grew once; the requests go up and
    # down by far more than their errors.
    assert_match(/churn \(grew once\)\s+Config#load/, rows[1])
    assert_match(/churn \d+\.\dx error\s+Request#parse/, rows[2])
    assert_includes out, "Profiles: 6 from 2027-01-15T08:00:00Z to 2027-01-15T08:05:00Z (5.0 min)"

    status, out, = run_cli("leaks", *Dir[File.join(@dir, "*.pb.gz")].shuffle(random: Random.new(1)), "--json")
    assert_equal 0, status
    data = JSON.parse(out)
    leak, one_off, churn = data["sites"]
    assert_equal "Cache#store", leak["function"]
    assert_in_delta 102_400, leak["rate_per_minute"], 0.01
    assert_equal [1.0, 5, 5], leak.values_at("steady", "rises", "intervals")
    assert_equal({ "8" => 307_200, "16" => 307_200 }, leak["gc_age"])
    assert_equal 1.0, leak["old_share"]
    assert_equal ["leak", "steady", "old", nil], leak.values_at("verdict", "shape", "objects", "advice")
    assert_operator leak["trend_sigmas"], :>, 2
    assert_operator leak["last_relative_error"], :>, 0 # 1-in-64 sampling is not exact
    # The one-off step is bigger per minute than the leak, but it grew in one interval only.
    assert_equal "Config#load", one_off["function"]
    assert_operator one_off["rate_per_minute"], :>, leak["rate_per_minute"]
    assert_equal 1, one_off["rises"]
    assert_equal %w[churn grew\ once], one_off.values_at("verdict", "shape")
    assert_equal ["churn", "up and down"], churn.values_at("verdict", "shape")
    assert_equal "Request#parse", churn["function"]
    assert_equal 0.0, churn["old_share"]

    # Young and steadily growing: a backlog, not called a leak.
    young = (0..3).map do |k|
      write("young-#{k}.pb", heapscope_profile([[LEAK, [0, 0, k + 1, (k + 1) * 1000], { "gc_age" => 0 }]],
                                               time_nanos: T0 + k * MIN))
    end
    _, out, = run_cli("leaks", *young)
    assert_match(/leak exact\s+Cache#store/, out, "exact counts on a line: no sampling error at all")
    assert_includes out, "To decide:\n  Cache#store app/cache.rb:12: mostly young objects (under 4 GCs)"
  end

  def test_leaks_picks_one_process_from_a_periodic_directory
    dir = File.join(@dir, "periodic")
    FileUtils.mkdir_p(dir)
    4.times do |k|
      stamp = Time.at(1_800_000_000 + k * 60).utc.strftime("%Y%m%dT%H%M%S.000Z")
      File.binwrite(File.join(dir, "web-100-#{stamp}.heap.pb.gz"), series_profile(k).to_pprof)
      old = File.join(dir, "web-99-#{stamp}.heap.pb.gz")
      File.binwrite(old, heapscope_profile([[CHURN, [0, 0, 1, 1000 * (k + 1)]]], time_nanos: T0 + k * MIN).to_pprof)
      File.utime(Time.at(1_000_000), Time.at(1_000_000), old) # an older process's files
    end
    File.binwrite(File.join(dir, ".web-100-x.heap.pb.gz.tmp-100"), "partial") # a write in progress
    status, out, = run_cli("leaks", dir, "--json")
    assert_equal 0, status
    data = JSON.parse(out)
    assert_equal 4, data["profiles"].size
    assert(data["profiles"].all? { |p| p["file"].include?("/web-100-") })
    assert_match(/holds profiles of 2 processes; using web-100's/, data["note"])
    assert_equal "Cache#store", data["sites"].first["function"]
  end

  def test_leaks_on_go_profiles_without_ages
    a = File.binread(go_heap_profile(@dir))
    prof = Heapscope::Pprof.decode(a)
    later = Heapscope::Pprof.decode(a)
    later.time_nanos = prof.time_nanos + 2 * MIN
    later.samples.each { |s| s.values.map! { |v| v * 2 } if s.frames.first.function == "main.leakyAlloc" }
    p1 = write("go1.pb.gz", prof)
    p2 = write("go2.pb.gz", later)
    status, out, = run_cli("leaks", p1, p2, "--json", "--by", "function")
    assert_equal 0, status
    site = JSON.parse(out)["sites"].first
    assert_equal "main.leakyAlloc", site["function"]
    # Two profiles show a change, not a trend (a step would look the same): not enough evidence, and
    # how many more snapshots would tell.
    assert_equal "not enough evidence", site["verdict"]
    assert_equal 1, site["more_snapshots"]
    assert_match(/about 1 more snapshot \(one every 2\.0 min\) would separate it from noise at 2σ/, site["advice"])
    assert_in_delta 4_096_000 / 2.0, site["rate_per_minute"], 20_000
  end

  def test_bad_input_exits_2_with_one_line
    good = write("good.pb.gz", series_profile(0))
    text = File.join(@dir, "notes.txt")
    File.write(text, "this is not a profile\n")
    truncated = File.join(@dir, "cut.pb.gz")
    File.binwrite(truncated, File.binread(good).byteslice(0, 40))
    raw_cut = File.join(@dir, "cut.pb")
    File.binwrite(raw_cut, series_profile(0).to_pprof(gzip: false).byteslice(0, 100))
    missing = File.join(@dir, "missing.pb.gz")
    cases = [
      [%W[top #{missing}], "heapscope top: #{missing}: no such file"],
      [%W[top #{text}], /\Aheapscope top: #{Regexp.escape(text)}: not gzip or pprof protobuf data/],
      [%W[top #{truncated}], "heapscope top: #{truncated}: truncated gzip data"],
      [%W[top #{raw_cut}], /\Aheapscope top: #{Regexp.escape(raw_cut)}: .*truncated/],
      [%W[top #{good} --sample cpu], "heapscope top: #{good}: no sample type \"cpu\" (have: alloc_objects, alloc_space, inuse_objects, inuse_space)"],
      [%W[top #{good} --by color], /\Aheapscope top: invalid argument: --by color/],
      [%W[top #{good} -n 0], "heapscope top: -n must be a positive number, got 0"],
      [%W[top #{good} -n many], /\Aheapscope top: invalid argument: -n many/],
      [%W[top #{good} --frobnicate], /\Aheapscope top: invalid option: --frobnicate/],
      [%w[top], /\Aheapscope top: missing FILE/],
      [%W[top #{good} #{good}], /\Aheapscope top: unexpected argument/],
      [%W[flamegraph #{missing}], "heapscope flamegraph: #{missing}: no such file"],
      [%W[flamegraph #{good} --sample cpu], /\Aheapscope flamegraph: .*no sample type "cpu"/],
      [%W[flamegraph #{good} -o #{@dir}/no/such/dir/x.html], /\Aheapscope flamegraph: cannot write .*x\.html: No such file or directory/],
      [%W[diff #{good}], /\Aheapscope diff: missing BASE and NEW profiles/],
      [%W[diff #{good} #{text}], /\Aheapscope diff: #{Regexp.escape(text)}: not gzip/],
      [%W[diff #{good} #{good} -o x.html], "heapscope diff: -o needs --html"],
      [%W[leaks #{good}], "heapscope leaks: need at least 2 profiles to see growth, got 1"],
      [%W[leaks #{good} #{good}], "heapscope leaks: the profiles all have the same time; cannot compute a growth rate"],
      [%W[leaks #{@dir}/empty], "heapscope leaks: #{@dir}/empty: no such file"],
      [%w[tops x], /\Aheapscope: unknown report command "tops"/],
    ]
    FileUtils.mkdir_p(File.join(@dir, "emptydir"))
    cases << [%W[leaks #{@dir}/emptydir], "heapscope leaks: #{@dir}/emptydir: no profiles (*.pb.gz, *.pb, *.pprof) in this directory"]
    cases.each do |(command, *argv), expected|
      status, out, err = run_cli(command, *argv)
      assert_equal 2, status, "#{command} #{argv.join(" ")}: #{err}"
      assert_equal "", out, "#{command} #{argv.join(" ")}"
      assert_equal 1, err.lines.size, "one line expected: #{err}"
      if expected.is_a?(Regexp)
        assert_match expected, err.chomp
      else
        assert_equal expected, err.chomp
      end
    end
  end

  def test_help_exits_0
    status, out, err = run_cli("top", "--help")
    assert_equal [0, ""], [status, err]
    assert_includes out, "usage: heapscope top FILE"
  end

  def test_every_commands_help_says_what_it_does
    %w[top diff leaks flamegraph].each do |command|
      status, out, err = run_cli(command, "--help")
      assert_equal [0, ""], [status, err], command
      usage, blank, description = out.lines
      assert_match(/\Ausage: heapscope #{command} /, usage)
      assert_equal "\n", blank, command
      assert_match(/\A[A-Z][a-z]+s .{20,}\.\n\z/, description, "#{command}: a sentence saying what it does")
    end
  end

  def test_top_hides_sites_at_zero_unless_asked
    # Three stacks made objects; only the leak's are still alive. The inuse view lists the leak's three
    # lines (its own and its callers', cum) and says the four lines of the other stacks are hidden;
    # --all lists all seven; the alloc view has nothing at zero.
    path = write("zeros.pb.gz", heapscope_profile([[LEAK, [10, 640, 8, 512], {}], [ONE_OFF, [5, 320, 0, 0], {}],
                                                   [CHURN, [7, 448, 0, 0], {}]]))
    status, out, = run_cli("top", path, "--sample", "inuse_space")
    assert_equal 0, status
    assert_includes out, "showing 3 of 3 sites, 4 more at zero hidden (--all lists them)"
    refute_includes out, "app/config.rb"
    data = JSON.parse(run_cli("top", path, "--sample", "inuse_space", "--json")[1])
    assert_equal [3, 4], [data["entries_total"], data["hidden_zero"]]
    _, out, = run_cli("top", path, "--sample", "inuse_space", "--all")
    assert_includes out, "showing 7 of 7 sites ("
    assert_includes out, "app/config.rb:5"
    _, out, = run_cli("top", path, "--sample", "alloc_objects")
    assert_includes out, "showing 7 of 7 sites ("
  end

  def test_internal_errors_are_one_line_exit_1
    path = write("ok.pb.gz", series_profile(0))
    Heapscope::Report::Top.stub(:report, ->(*) { raise ArgumentError, "boom\nsecond line" }) do
      status, _out, err = run_cli("top", path)
      assert_equal 1, status
      assert_equal "heapscope top: internal error: ArgumentError: boom (please report it with the profile)\n", err
    end
  end
end
