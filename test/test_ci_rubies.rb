# frozen_string_literal: true

require "minitest/autorun"

# CI covers several Rubies (issue 16): .ci/run runs `bin/test --ruby VERSION` for each Ruby named in
# HEAPSCOPE_CI_RUBIES, then this machine's bin/test, which runs this file. It fails unless every named
# Ruby ran the whole suite during this CI run and passed: a Ruby silently skipped (not installed, a run
# that stopped early, an old log) fails the build.
class TestCiRubies < Minitest::Test
  ROOT = File.expand_path("..", __dir__)

  def test_every_ci_ruby_ran_the_whole_suite_and_passed
    skip "this is the run on Ruby #{ENV["HEAPSCOPE_RUBY_LABEL"]} itself" if ENV["HEAPSCOPE_RUBY_LABEL"]
    wanted = ENV["HEAPSCOPE_CI_RUBIES"].to_s.split
    skip "not a CI run (.ci/run names the Rubies it covers in HEAPSCOPE_CI_RUBIES)" if wanted.empty? && ENV["CI"] != "true"
    refute_empty wanted, "CI=true but HEAPSCOPE_CI_RUBIES names no Ruby: .ci/run must name the Rubies it covers"
    started = Integer(ENV.fetch("HEAPSCOPE_CI_STARTED"))
    wanted.each do |version|
      log = File.join(ROOT, "tmp/rubies/#{version}.log")
      assert File.exist?(log), "Ruby #{version}: no log (#{log}); its suite did not run"
      assert_operator File.mtime(log).to_i, :>=, started, "Ruby #{version}: the log is older than this CI run"
      text = File.read(log, encoding: "UTF-8").scrub
      assert_match(/^bin\/test: Ruby #{Regexp.escape(version)}\.\d+ /, text, "Ruby #{version}: the suite ran on another Ruby")
      c_runs = text.scan(/^(\d+) passed, (\d+) failed$/)
      assert_operator c_runs.size, :>=, 10, "Ruby #{version}: the pure-C tests did not all run"
      assert c_runs.all? { |_, failed| failed == "0" }, "Ruby #{version}: a C test failed"
      summary = text.lines.grep(/\A\d+ runs, \d+ assertions, \d+ failures, \d+ errors, \d+ skips/).last
      assert summary, "Ruby #{version}: the Ruby suite printed no summary (it stopped early)"
      runs, _assertions, failures, errors, skips = summary.scan(/\d+/).map(&:to_i)
      assert_equal [0, 0], [failures, errors], "Ruby #{version}: #{summary}#{failure_details(text)}"
      # Every test file ran: as many tests as this run has, less this one (which skips there).
      assert_operator runs, :>=, own_test_count - 1, "Ruby #{version}: fewer tests ran than exist (#{summary.strip})"
      unexpected = skipped_tests(text).reject { |line| VERSION_SKIPS.any? { |re| re.match?(line) } }
      assert_empty unexpected, "Ruby #{version}: tests were skipped for a reason that is not this Ruby's version (#{summary.strip})"
      assert_operator skips, :<=, VERSION_SKIPS.size, "Ruby #{version}: more tests skipped than version skips exist (#{summary.strip})"
    end
  end

  # The skips a newer Ruby may take: each names a feature that exists on other versions only. Any other
  # skip on a CI Ruby (a missing tool, a sampled-nothing case, a test that gave up) fails the build.
  VERSION_SKIPS = [
    /\ATestCiRubies#test_every_ci_ruby_ran_the_whole_suite_and_passed: this is the run on Ruby [\d.]+ itself\z/,
    /\ATestCoreZjit#\w+: Ruby [\d.]+ has no ZJIT that inlines allocation/,
    /\ATestHardeningRactors#\w+: the pause exists on Ruby 3\.1 and 3\.2 only\z/
  ].freeze

  def test_version_skips_match_the_lines_the_reporter_prints_and_nothing_else
    log = <<~LOG
      Skipped (3):
        TestCoreZjit#test_default_is_always_under_zjit: Ruby 3.4.11 has no ZJIT that inlines allocation (4.1-dev)
        TestHardeningRactors#test_a_c_api_gc: the pause exists on Ruby 3.1 and 3.2 only
        TestCoreCensus#test_threads: no Thread was sampled in 40,000 tries


      Finished in 1.0s
    LOG
    lines = skipped_tests(log)
    assert_equal 3, lines.size
    allowed, other = lines.partition { |line| VERSION_SKIPS.any? { |re| re.match?(line) } }
    assert_equal 2, allowed.size
    assert_equal ["TestCoreCensus#test_threads: no Thread was sampled in 40,000 tries"], other
  end

  private

  # The failures and errors a suite's log reports, cut to a few thousand characters: CI shows only the
  # end of its output, which is this run's, so a newer Ruby's failure must be repeated here to be seen.
  def failure_details(text)
    blocks = text.split(/^(?=\s*\d+\) (?:Failure|Error):$)/).drop(1)
    blocks[-1] = blocks[-1].split(/^\d+ runs, /).first if blocks.any?
    details = blocks.join.strip
    details = "#{details[0, 4000]}\n[... #{details.size - 4000} more characters in the log]" if details.size > 4000
    details.empty? ? "" : "\n#{details}\n"
  end

  # The lines under the reporter's "Skipped (N):" heading (test/support/file_progress.rb), one per skip.
  def skipped_tests(text)
    block = text.split(/^Skipped \(\d+\):$/, 2)[1]
    return [] unless block
    block.sub(/\A\r?\n/, "").lines.map(&:strip).take_while { |line| !line.empty? }
  end

  # The tests this run knows of (every Minitest::Test subclass loaded so far: rake loads every file first).
  def own_test_count
    Minitest::Runnable.runnables.sum { |klass| klass.runnable_methods.size }
  end
end
