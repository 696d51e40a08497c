# frozen_string_literal: true

require "minitest/autorun"
require "open3"
require "rbconfig"

# Smoke test of the benchmark harness (bench/run): its quickest mode on the tiny allocation loop with
# no profiler, the empty NEWOBJ hook and heapscope, then the table must parse and be sane. It measures
# nothing worth reporting; it proves the command docs/benchmarks.md tells people to run still works.
class TestBenchSmoke < Minitest::Test
  ROOT = File.expand_path("..", __dir__)
  PROFILERS = %w[none emptyhook heapscope_1000].freeze

  def run_bench(*args)
    Open3.capture3(RbConfig.ruby, File.join(ROOT, "bench/run"), *args, chdir: ROOT)
  end

  # Rows of the long table: | workload | profiler | runs | median ms | ratio | ratio range | x hook |
  # cpu ratio | cpu x hook | GCs | finish ms | notes |
  def parse_rows(out)
    out.lines.grep(/\A\| alloc /).map { |l| l.split("|").map(&:strip).drop(1) }
  end

  def test_quick_run_prints_a_parsable_table
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    out, err, status = run_bench("--quick", "--rounds", "1", "--no-setup", "--workloads", "alloc",
                                 "--size", "50000", "--profilers", PROFILERS.join(","))
    elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    assert status.success?, "bench/run failed:\n#{out}\n#{err}"
    assert_operator elapsed, :<, 60, "the smoke run must stay under a minute"

    rows = parse_rows(out)
    assert_equal PROFILERS, rows.map { |r| r[1] }, "one row per profiler, in order:\n#{out}"
    rows.each do |r|
      assert_equal "1", r[2], "row #{r[1]} must have one successful run:\n#{out}"
      assert_match(/\A\d+\.\d\z/, r[3], "median ms of #{r[1]}")
      assert_match(/\A\d+\.\d\d\z/, r[4], "ratio of #{r[1]}")
    end
    assert_equal "1.00", rows[0][4], "the unprofiled row is the baseline"
    assert_includes %w[1.00 n/a], rows[1][6], "the hook's own x-hook ratio is 1 by definition (n/a within noise)"
    hs = rows[2]
    assert_operator Float(hs[4]), :>, 0.3, "heapscope's ratio is implausible: #{hs.inspect}"
    assert_match(/samples_taken=\d+/, hs[11], "heapscope's stats must reach the notes column")
    refute_match(/not measured/, out, "none of the three may be missing:\n#{out}")
  end

  def test_unknown_profiler_is_rejected
    _out, err, status = run_bench("--no-setup", "--profilers", "no_such_profiler")
    refute status.success?
    assert_match(/unknown profiler/, err)
  end
end
