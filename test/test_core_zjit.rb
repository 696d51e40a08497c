# frozen_string_literal: true

require_relative "core_helper"
require "open3"
require "rbconfig"
require "zlib"

# On Ruby 4.1+ the default sampling mode is :always, not :windowed: windows aborted a 4.1-dev at its first
# GC, and ZJIT discards its inlined allocations every time a window switches the allocation hook on
# (docs/architecture.md, ZJIT). The choice itself depends only on its arguments and is checked for every
# Ruby on any Ruby; the end-to-end check needs a Ruby 4.1+ built with ZJIT, which CI's Rubies (3.1, 3.3,
# 3.4) are not, so there that one test skips, saying so, and 4.1-dev is checked by hand.
class TestCoreZjit < Minitest::Test
  LIB = File.expand_path("../lib", __dir__)

  # Starts heapscope with its defaults in a fresh `ruby ruby_flags`; prints the mode, the reason and
  # whether a profile's comments carry the reason.
  SCRIPT = <<~RUBY
    require "heapscope"
    Heapscope.start
    stats = Heapscope.stats
    comments = Zlib.gunzip(Heapscope.profile)
    puts "mode=\#{stats[:sampling]}"
    puts "reason=\#{stats[:sampling_reason]}"
    puts "in_profile=\#{comments.include?("sampling_reason: always, not windowed: ZJIT is enabled")}"
    Heapscope.stop
  RUBY

  def run_script(ruby_flags)
    out, err, status = Open3.capture3(RbConfig.ruby, *ruby_flags, "-I", LIB, "-rzlib", "-e", SCRIPT)
    assert status.success?, "the script failed (#{status}): #{err}"
    out.lines.to_h { |line| line.chomp.split("=", 2) }
  end

  def zjit_available?
    (RUBY_VERSION.split(".").map(&:to_i) <=> [4, 1]) >= 0 &&
      system(RbConfig.ruby, "--zjit", "-e", "exit(RubyVM::ZJIT.enabled? ? 0 : 1)", %i[out err] => File::NULL)
  end

  def default_sampling(sample_every, version, zjit)
    Heapscope.send(:default_sampling, sample_every, version, zjit)
  end

  def test_the_default_mode_for_each_ruby_and_jit
    unless Heapscope::Native::WINDOWED_SUPPORTED && Heapscope::Native::WINDOWED_TICKER
      # Ruby 3.1: windows cannot be timed here, so every case samples always, for no special reason.
      [["3.4.11", false], ["4.1.0", true]].each do |version, zjit|
        assert_equal [:always, nil], default_sampling(1000, version, zjit)
      end
      return
    end

    assert_equal [:windowed, nil], default_sampling(1000, "3.4.11", false)
    assert_equal [:windowed, nil], default_sampling(1000, "4.0.5", true), "4.0's ZJIT inlines no allocation: windows stay"
    assert_equal [:always, nil], default_sampling(1, "3.4.11", false), "sample_every 1 needs the hook on for every allocation"
    mode, why = default_sampling(1000, "4.1.0", false)
    assert_equal :always, mode
    assert_match(/aborted a Ruby 4\.1-dev at its first GC/, why)
    mode, why = default_sampling(1000, "4.2.0", true)
    assert_equal :always, mode
    assert_match(/ZJIT is enabled/, why)
  end

  def test_default_is_always_under_zjit_with_the_reason_in_stats_and_profile
    skip "Ruby #{RUBY_VERSION} has no ZJIT that inlines allocation (4.1-dev built with --enable-zjit has; CI's Rubies do not)" unless zjit_available?

    got = run_script(["--zjit"])
    assert_equal "always", got["mode"], "ZJIT on: the default should keep the hook on"
    assert_match(/ZJIT is enabled/, got["reason"])
    assert_equal "true", got["in_profile"], "the profile's comments say why the mode is :always"
  end
end
