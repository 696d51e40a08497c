# frozen_string_literal: true

# The verdicts of `heapscope leaks` (Report::Verdict): series of profiles with known trends and known
# sampling errors, written with the project's encoder, must come out as what they are (a steady leak
# seen through few samples: leak, or not enough evidence with the snapshots that would tell, never
# churn; churn; noise; a strong leak), and a real process whose Hash line leaks must have it called a
# leak through the CLI.

require_relative "test_report_helper"
require "json"
require "rbconfig"
require "heapscope/report/cli"
require "heapscope/report/verdict"

class TestReportLeaks < Minitest::Test
  include ReportHelper
  MIN = 60 * 10**9
  T0 = 1_800_000_000 * 10**9
  EVERY = 100
  SIZE = 160 # bytes per object
  LEAK = [["Cache#store", "app/cache.rb", 12], ["main", "app/main.rb", 3]].freeze
  CHURN = [["Request#parse", "app/request.rb", 7], ["main", "app/main.rb", 4]].freeze
  FLAT = [["Registry#add", "app/registry.rb", 9], ["main", "app/main.rb", 5]].freeze
  STRONG = [["Log#append", "app/log.rb", 20], ["main", "app/main.rb", 6]].freeze
  Verdict = Heapscope::Report::Verdict

  def setup
    @dir = Dir.mktmpdir("heapscope-leaks")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  # Writes one profile per minute; sites: {frames => [sampled objects in each profile]}. Each sampled
  # object stands for EVERY objects of SIZE bytes, as 1-in-EVERY sampling writes them, so a site of k
  # samples has the error sqrt((1 - p) / k) Report::Sampling gives such profiles (no variance labels).
  def series(sites, age: 8)
    n = sites.values.first.size
    (0...n).map do |k|
      rows = sites.map do |frames, counts|
        objects = counts[k] * EVERY
        [frames, [objects, objects * SIZE, objects, objects * SIZE], { "gc_age" => age }]
      end
      write(format("heap-%02d.pb.gz", k), heapscope_profile(rows, sample_every: EVERY, time_nanos: T0 + k * MIN))
    end
  end

  def leaks(paths)
    status, out, err = run_cli("leaks", *paths, "--json")
    assert_equal [0, ""], [status, err]
    JSON.parse(out)["sites"].to_h { |s| [s["function"], s] }
  end

  # The issue's case: a real leak at one object a minute seen at 1 in 100, so a handful of samples per
  # profile, which went down in two of five intervals: the old rule (grew in 75% of intervals) called
  # it "fluctuating (churn?)". The points are within their errors of a rising line, so it is no churn.
  def test_a_thinly_sampled_steady_leak_is_never_called_churn
    paths = series({ LEAK => [1, 3, 2, 5, 4, 6] })
    site = leaks(paths)["Cache#store"]
    assert_equal [3, 5], site.values_at("rises", "intervals")
    assert_includes [Verdict::LEAK, Verdict::UNCLEAR], site["verdict"]
    assert_equal "not enough evidence", site["verdict"], site.inspect
    assert_operator site["trend_sigmas"], :>, 1
    # The slope, 0.9 samples a minute, is 1.9 of its errors: one more snapshot at this rate passes 2σ
    # (if the leak goes on), and so would 1-in-93 sampling over these six.
    assert_equal [1.9, 1, 93], site.values_at("trend_sigmas", "more_snapshots", "advice_sample_every")
    assert_equal "at this rate of growth (+13.8 KiB/min) and ±38.1 KiB per snapshot, about 1 more snapshot (one every " \
                 "1.0 min) would separate it from noise at 2σ; or sample_every: 93 would reach 2σ over these snapshots " \
                 "(error scales as sqrt(sample_every))", site["advice"]

    _, out, = run_cli("leaks", *paths)
    assert_match(/not enough evidence 1\.\dσ\s+Cache#store app\/cache\.rb:12$/, out)
    assert_includes out, "To decide:\n  Cache#store app/cache.rb:12: at this rate of growth"
  end

  # The same line seen through more samples (10x the rate): a leak, and it ranks first.
  def test_leaks_churn_noise_and_a_strong_leak
    paths = series({ LEAK => [10, 31, 22, 48, 41, 62],
                   CHURN => [10, 40, 8, 45, 12, 42],     # up and down by 4x its ±16% error, no trend
                   FLAT => [100, 104, 97, 102, 99, 103], # within its ±10% (±10 samples)
                   STRONG => [100, 200, 300, 400, 500, 600] })
    sites = leaks(paths)
    assert_equal %w[leak steady], sites["Cache#store"].values_at("verdict", "shape")
    assert_operator sites["Cache#store"]["trend_sigmas"], :>, 3
    assert_equal ["churn", "up and down"], sites["Request#parse"].values_at("verdict", "shape")
    assert_operator sites["Request#parse"]["scatter"], :>, 3
    assert_equal "noise", sites["Registry#add"]["verdict"]
    assert_operator sites["Registry#add"]["trend_sigmas"], :<, 1
    assert_nil sites["Registry#add"]["advice"]
    assert_equal "leak", sites["Log#append"]["verdict"]
    assert_operator sites["Log#append"]["trend_sigmas"], :>, 20
    status, out, = run_cli("leaks", *paths)
    assert_equal 0, status
    order = out.lines.grep(/app\//).map { |l| l[/(\S+) app\//, 1] }
    assert_equal %w[Log#append Cache#store Request#parse Registry#add], order, out
    refute_includes out, "To decide:"
  end

  # Seeded: a steady leak of 1..6 expected samples (the thinnest the issue saw) over 400 draws. With
  # right errors a chi-square test at 99% calls about 1% of them beyond their errors, and those with a
  # trend are leaks all the same: churn should stay near 0. (Deterministic: fixed seeds.)
  def test_sampling_noise_around_a_rising_line_is_rarely_churn
    tally = Hash.new(0)
    400.times do |seed|
      rng = Random.new(seed)
      counts = (1..6).map { |k| (k * EVERY).times.count { rng.rand < 1.0 / EVERY } }
      y = counts.map { |c| c * EVERY * SIZE }
      err = counts.map { |c| c.zero? ? 0.0 : Math.sqrt((1 - 1.0 / EVERY) / c) * c * EVERY * SIZE }
      tally[Verdict.trend((0..5).map(&:to_f), y, err, every: EVERY)[:verdict]] += 1
    end
    assert_operator tally["churn"], :<=, 4, tally.inspect
    assert_operator tally["leak"] + tally["not enough evidence"], :>=, 390, tally.inspect
  end

  # The advice "about N more snapshots" is a forecast at the rate seen: for a real leak of 1-6 samples
  # per snapshot left undecided by six, N more snapshots of the same leak make it a leak in 84% of
  # 1000 seeded draws (docs/reading-profiles.md quotes this); 300 of them here.
  def test_more_snapshots_mostly_come_true
    hits = 0
    total = 0
    300.times do |seed|
      rng = Random.new(10_000 + seed)
      draw = ->(k) { ((k + 1) * EVERY).times.count { rng.rand < 1.0 / EVERY } }
      call = lambda do |counts|
        y = counts.map { |c| c * EVERY * SIZE }
        err = counts.map { |c| c.zero? ? 0.0 : Math.sqrt((1 - 1.0 / EVERY) / c) * c * EVERY * SIZE }
        Verdict.trend((0...counts.size).map(&:to_f), y, err, every: EVERY)
      end
      counts = (0...6).map { |k| draw.call(k) }
      first = call.call(counts)
      next unless first[:verdict] == Verdict::UNCLEAR && first[:more_snapshots]

      total += 1
      more = (6...6 + first[:more_snapshots]).map { |k| draw.call(k) }
      hits += 1 if call.call(counts + more)[:verdict] == Verdict::LEAK
    end
    assert_operator total, :>, 100
    assert_operator hits.to_f / total, :>, 0.75, "#{hits} of #{total}"
  end

  # Two snapshots show a change, never a trend; three exact points on a line are a leak with no error.
  def test_few_snapshots_and_exact_counts
    two = series({ LEAK => [10, 30] })
    site = leaks(two)["Cache#store"]
    assert_equal "not enough evidence", site["verdict"]
    assert_equal 1, site["more_snapshots"]
    exact = (0..2).map do |k|
      write("exact-#{k}.pb.gz", heapscope_profile([[LEAK, [0, 0, k + 1, 1000 * (k + 1)], { "gc_age" => 8 }]],
                                                  time_nanos: T0 + k * MIN))
    end
    site = leaks(exact)["Cache#store"]
    assert_equal ["leak", nil, 0.0], site.values_at("verdict", "trend_sigmas", "rate_error")
  end

  def test_verdict_change_for_diff
    assert_equal "grew", Verdict.change(500, 100.0, 0, 500)[:verdict]
    assert_equal "shrank", Verdict.change(-500, 100.0, 600, 100)[:verdict]
    assert_equal "noise", Verdict.change(50, 100.0, 10_000, 10_050)[:verdict]
    # The issue's String line: +7.5 MiB ±5.0 MiB at 1 in 1000 is 1.5σ: not noise, not yet real.
    call = Verdict.change(7.5 * 2**20, 5.0 * 2**20, 6 * 2**20, 13.5 * 2**20, every: 1000)
    assert_equal ["not enough evidence", 1.5, 560], [call[:verdict], call[:z].round(1), call[:sample_every]]
    assert_equal "sample_every: 560 would make a change this size 2σ (error scales as sqrt(sample_every))", call[:advice]
  end

  # A real process (sampling: :always at 1 in 100): a Hash line that leaks 10,000 Hashes per snapshot
  # and a line whose live Hashes go up and down (1,000 to 9,000), six snapshots. At 1 in 100 the leak
  # is 100 more samples a snapshot against about ±sqrt(100 k) per snapshot k: its slope is about 22
  # standard errors, so the chance that it is not called a leak is below 1e-9; the churn line's slope
  # is under 1σ once its scatter widens it, and its chi-square is in the hundreds: called churn with
  # about the same certainty. The test's false-failure rate is dominated by the machine (a crash), not
  # by sampling. Windowed sampling (3.3+'s default) is left out on purpose: this process runs well under
  # a second, a handful of windows, and its snapshots read [0, 0, 0, 7.4M, 9.3M, 11.8M] with ±24 MiB
  # each on 3.3, which "not enough evidence" describes correctly (short runs: issue 31, item 3).
  WORKLOAD = <<~'RUBY'
    require "heapscope"
    dir = ARGV[0]
    $kept = []
    $churn = []
    SIZES = [1000, 8000, 500, 7000, 1500, 9000]
    def leak(round, i)
      $kept << { round: round, i: i }                 # LEAK_LINE
    end
    def churn(i)
      $churn << { i: i }                              # CHURN_LINE
    end
    Heapscope.start(sample_every: 100, sampling: :always)
    6.times do |round|
      10_000.times { |i| leak(round, i) }
      $churn = []
      SIZES[round].times { |i| churn(i) }
      GC.start
      Heapscope.write(File.join(dir, format("heap-%02d.pb.gz", round)), gc: true)
      sleep 0.05
    end
  RUBY

  def test_a_leaking_hash_line_in_a_real_process
    script, line_of = run_workload(WORKLOAD)
    status, out, err = run_cli("leaks", @dir, "--json")
    assert_equal [0, ""], [status, err]
    sites = JSON.parse(out)["sites"]
    leak = sites.find { |s| s["file"] == script && s["line"] == line_of.call("LEAK_LINE") }
    refute_nil leak, sites.map { |s| s["name"] }.inspect
    assert_equal "leak", leak["verdict"], leak.inspect
    assert_operator leak["trend_sigmas"], :>, 3 # about 22σ (sampling always)
    churn = sites.find { |s| s["file"] == script && s["line"] == line_of.call("CHURN_LINE") }
    refute_nil churn, sites.map { |s| s["name"] }.inspect
    assert_equal "churn", churn["verdict"], churn.inspect
    assert_equal leak, sites.first, "the leak ranks first"
  end
end
