# frozen_string_literal: true

# Six runs of the demo (examples/leaky_app.rb, in fresh processes, the default sampling mode of this
# Ruby) must agree with each other within their printed errors, and `heapscope diff` of two runs must
# call the leak line's change noise. Before issue 17 the leak line read 3.4 to 6.5 MiB across six runs
# while each printed about ±5%, and diff called a +92% change real.
#
# False-failure rates, if the printed errors are the estimates' true standard errors: each of the 15
# pairs differs by more than 4 combined standard errors with probability 6e-5 (under 1e-3 for all); the
# diffs call a change real (beyond 2 combined errors) with probability 0.05 each, and the test wants at
# least two of three pairs called noise (fails with probability about 0.007).
require "minitest/autorun"
require "json"
require "open3"
require "rbconfig"
require "tmpdir"

class TestDemoAgreement < Minitest::Test
  ROOT = File.expand_path("..", __dir__)
  CLI = File.join(ROOT, "exe/heapscope")
  RUNS = 6
  LEAK_LINE = 18

  def run_demo(dir, i)
    out = File.join(dir, "heap#{i}.pb.gz")
    text, err, status = Open3.capture3(RbConfig.ruby, "-I", File.join(ROOT, "lib"), File.join(ROOT, "examples/leaky_app.rb"), out)
    assert status.success?, "demo run #{i} failed: #{err}"
    # The demo ends with who holds its leak (Heapscope.retainers): from the script's local to the cache.
    assert_match(/^#1: \d+ of \d+ objects, held by local variable app of the main script\n  App\n  @cache -> SessionCache\n  @sessions -> Hash\n/,
                 text)
    out
  end

  def cli_json(*args)
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.join(ROOT, "lib"), CLI, *args, "--json")
    assert status.success?, "heapscope #{args.first} failed: #{err}"
    JSON.parse(out)
  end

  def leak_entry(path)
    entry = cli_json("top", path, "-n", "50")["entries"].find { |e| e["line"] == LEAK_LINE && e["file"].end_with?("leaky_app.rb") }
    assert entry, "the leak line is in #{path}'s top"
    entry
  end

  def test_six_runs_agree_within_their_errors_and_diff_calls_it_noise
    Dir.mktmpdir("heapscope-demo") do |dir|
      files = Array.new(RUNS) { |i| run_demo(dir, i) }
      leaks = files.map { |f| leak_entry(f) }
      values = leaks.map { |e| e["flat"].to_f }
      errors = leaks.map { |e| e["relative_error"].to_f * e["flat"].to_f }
      report = leaks.map { |e| format("%.2f MiB ±%.1f%%", e["flat"] / 1048576.0, 100 * e["relative_error"].to_f) }.join(", ")
      errors.each { |err| assert_operator err, :>, 0, "a sampled estimate prints a nonzero error: #{report}" }
      values.combination(2).zip(errors.combination(2)).each do |(a, b), (ea, eb)|
        assert_operator (a - b).abs, :<=, 4 * Math.sqrt(ea**2 + eb**2), "two runs disagree beyond their errors: #{report}"
      end
      noise = [[0, 1], [2, 3], [4, 5]].count do |i, j|
        rows = cli_json("diff", files[i], files[j]).values_at("grew", "shrank").flatten.compact
        row = rows.find { |r| r["site"].to_s.include?("leaky_app.rb:#{LEAK_LINE}") || r["name"].to_s.include?("leaky_app.rb:#{LEAK_LINE}") }
        row.nil? || row["noise"] # an unchanged site is not listed
      end
      assert_operator noise, :>=, 2, "diff called the leak line's change real in #{3 - noise} of 3 pairs: #{report}"
      puts "\n  demo leak line, #{RUNS} runs: #{report}" if ENV["HEAPSCOPE_ACCURACY_REPORT"]
    end
  end
end
