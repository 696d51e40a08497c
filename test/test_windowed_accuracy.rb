# frozen_string_literal: true

# Windowed sampling (the default) against the truth: each workload of test/workloads/windowed_accuracy.rb
# runs RUNS (48) times, each in a fresh process; `go tool pprof -tags` reads every profile (the reference
# decoder, not ours); per site, the mean estimate must lie within 4 standard errors of the truth, the
# standard error being the runs' own standard deviation over sqrt(RUNS). So a biased estimator fails
# however noisy windows are, and an unbiased one passes however few samples a run takes.
require "minitest/autorun"
require "json"
require "open3"
require "tmpdir"
require "rbconfig"
require "heapscope"

class TestWindowedAccuracy < Minitest::Test
  ROOT = File.expand_path("..", __dir__)
  WORKLOAD = File.join(ROOT, "test/workloads/windowed_accuracy.rb")
  # Windowed estimates are heavy-tailed (a few windows that a coin let through weigh a lot), so the runs'
  # own standard deviation is trustworthy only over many runs: with 16, CI once saw z -5.6 for a site
  # whose 64-run mean was within 0.74 standard errors.
  RUNS = Integer(ENV.fetch("HEAPSCOPE_ACCURACY_RUNS", 48))
  PARALLEL = 4
  # Sites with fewer expected samples per run than this are reported, not judged: their estimates are
  # mostly zero, and four standard errors of mostly-zero runs say nothing.
  MIN_EXPECTED_SAMPLES = 5
  SAMPLE_EVERY = 1000
  # Windowed sampling, chosen explicitly: it is the default only where a ticker can switch windows at
  # interrupt checks (Ruby 3.3+). On Ruby 3.1 windows change at GCs only, a few per run at the default
  # 4% of the time; there half the time is on, so that 48 runs have enough windows to judge bias.
  SHARE = Heapscope::Native::WINDOWED_TICKER ? 0.04 : 0.5
  OPTIONS = JSON.generate(sampling: "windowed", window_share: SHARE)

  def setup
    skip "go is not installed (go tool pprof)" unless system("command -v go >/dev/null 2>&1")
  end

  # The class tag's totals of one sample type, as go tool pprof reports them.
  def go_tags(path, sample_index)
    out, err, status = Open3.capture3("go", "tool", "pprof", "-tags", "-sample_index=#{sample_index}", path)
    assert status.success?, "go tool pprof -tags failed on #{path}: #{err}"
    section = out.split(/^\s*(?=\w+: Total)/).find { |s| s.start_with?("class:") } || ""
    section.scan(/^\s+([\d.]+) \([^)]*\): (\S+)$/).to_h { |value, klass| [klass, value.to_f] }
  end

  def run_workload(name)
    Array.new(RUNS) { |i| i }.each_slice(PARALLEL).flat_map do |slice|
      slice.map do |i|
        Thread.new do
          Dir.mktmpdir("heapscope-accuracy") do |dir|
            out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.join(ROOT, "lib"), WORKLOAD, name, dir, OPTIONS)
            assert status.success?, "workload #{name} run #{i} failed: #{err}"
            result = JSON.parse(out.lines.last)
            result["allocs"] = go_tags(File.join(dir, "allocs.pb.gz"), "alloc_objects")
            result["live"] = go_tags(File.join(dir, "heap.pb.gz"), "inuse_objects")
            result
          end
        end
      end.map(&:value)
    end
  end

  # Checks every site of one kind ("allocs" or "live") of the runs against the truth. known_bias: the
  # relative error allowed on top of 4 standard errors, for estimates with a measured, documented bias:
  # one number for every site, or a Hash of site => number (sites not in it get none).
  def assert_unbiased(name, runs, kind, known_bias: nil)
    truth = runs.first.dig("truth", kind)
    report = []
    truth.each do |site, expected|
      estimates = runs.map { |r| r[kind].fetch(site, 0.0) }
      mean = estimates.sum / estimates.size
      sd = Math.sqrt(estimates.sum { |e| (e - mean)**2 } / (estimates.size - 1))
      se = sd / Math.sqrt(estimates.size)
      judged = expected / SAMPLE_EVERY >= MIN_EXPECTED_SAMPLES
      report << format("%-9s %-6s %-8s truth %8d mean %10.0f (%+6.1f%%) sd/run %5.1f%% z %+5.2f%s", name, kind, site, expected,
                       mean, 100.0 * (mean - expected) / expected, 100.0 * sd / expected,
                       se.positive? ? (mean - expected) / se : 0.0, judged ? "" : " (not judged: too few samples)")
      next unless judged

      assert se.positive?, "#{name} #{kind} #{site}: every run gave #{estimates.first}"
      bias = known_bias.is_a?(Hash) ? known_bias[site] : known_bias
      if bias
        assert_operator (mean - expected).abs, :<=, bias * expected + 4 * se,
                        "#{name} #{kind} #{site}: the mean of #{RUNS} runs is off by more than the known bias " \
                        "(#{bias}) plus 4 standard errors\n#{report.join("\n")}"
      else
        assert_operator (mean - expected).abs, :<=, 4 * se,
                        "#{name} #{kind} #{site}: the mean of #{RUNS} runs is more than 4 standard errors from the truth\n#{report.join("\n")}"
      end
    end
    puts report if ENV["HEAPSCOPE_ACCURACY_REPORT"]
  end

  def check(name, live_known_bias: nil, allocs_known_bias: nil, judge_live: true)
    runs = run_workload(name)
    runs.each do |r|
      stats = r["stats"]
      assert_equal "windowed", stats["sampling"]
      # The hook is on for its share of time, so of allocations too, give or take a run's luck. A short
      # run on a loaded machine may be a few dozen windows, lengthened up to 50 ms where sync jobs are
      # dear (schedule.h): Ruby 3.4.11, 48 runs of each workload, at most 1.7x the share (means 0.023 to
      # 0.036); 96 runs of a close variant, 2.2x; the old bound of 2x failed two runs of a tried design
      # (2.4x, 2.5x; none beyond in about 1,100). So one run may reach 4x; on average the hook keeps to
      # its share.
      assert_operator stats["hook_on_share"], :<=, [4 * SHARE, 1.0].min, "the hook was on for too many allocations: #{stats}"
      # Every GC had its liveness pass (a deferred registration skips it: docs/architecture.md)
      assert_equal 0, stats["gc_registrations_deferred"], stats.inspect
    end
    shares = runs.map { |r| r["stats"]["hook_on_share"] }
    mean_on = shares.sum / shares.size
    requested = runs.sum { |r| r["stats"]["requested_share"] } / runs.size
    if ENV["HEAPSCOPE_ACCURACY_REPORT"]
      puts format("%-9s hook on for %.4f of allocations on average, %.4f at most; requested %.4f of the time",
                  name, mean_on, shares.max, requested)
    end
    # On average the hook keeps to its share, or to what the ticker requested where load made that more
    # (late wake-ups at windows' ends stretch them: docs/architecture.md, up to 1.9x the share measured
    # beside six CPU-bound processes). A ticker asking for 4x its share is broken, not loaded.
    assert_operator requested, :<=, [4 * SHARE, 1.0].min, "#{name}: the ticker requested #{requested} of the time on average (share #{SHARE})"
    assert_operator mean_on, :<=, 1.5 * [SHARE, requested].max,
                    "#{name}: the hook was on for #{mean_on} of allocations on average (share #{SHARE}, requested #{requested})"
    assert_unbiased(name, runs, "allocs", known_bias: allocs_known_bias)
    return if !judge_live || runs.first.dig("truth", "live").empty?

    assert_unbiased(name, runs, "live", known_bias: live_known_bias)
  end

  def test_alternating_sites
    check("alternating")
  end

  # A known bias, not fixed yet (issue 17): the share of a burst's allocations the hook sees falls from
  # its start to its end (bench/accuracy/burst_coverage.rb), so SiteC, the burst's last 100, comes out
  # low and SiteB a little high. Ruby 3.4.11, 144 runs: SiteC -5.6% (z -4.3), SiteB +1.2% (z +3.7); CI
  # once saw SiteC -10.1% in 48 runs (z -4.1). Not the hook's cost charged to virtual time (charging
  # 0 or 80 ns: -6.6% and -4.7%), nor the overhead budget (off: -6.1%). Ending windows in the hook at
  # the chain's flip took SiteC to -3.5% (192 runs) but cost more than it gave (docs/architecture.md):
  # not kept. The allowance is the measured bias with room; four standard errors on top (48 runs:
  # about 10% for SiteC) keep the 4-sigma false-failure rate, and anything worse still fails.
  def test_bursty_sites
    check("bursty", allocs_known_bias: { "SiteB" => 0.015, "SiteC" => 0.07 })
  end

  def test_malloc_driven_gc
    check("malloc_gc")
  end

  def test_mixed_json_like_documents
    check("mixed_json")
  end

  # Live objects that live about as long as a GC interval: the old GC-synchronised windows were 89% low
  # here. Windows in time see every moment between GCs alike.
  def test_a_cache_that_lives_about_one_gc_interval
    check("json_cache")
  end

  # Phases whose GCs fall at the same points of the work in every run: the old windows at GCs
  # over-sampled the retained sites by up to 50%.
  def test_phases_longer_than_a_window
    check("phases")
  end
end
