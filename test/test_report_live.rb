# frozen_string_literal: true

# The reports on profiles heapscope's C core wrote while a real Ruby workload leaked: `top` must put the
# leaking line first, `leaks` must rank it first over a series, `diff` must show it growing. The workload
# runs in a child process so its profiler does not meet the other tests'.

require_relative "test_report_helper"
require "json"
require "rbconfig"
require "stringio"
require "heapscope/report/cli"

class TestReportLive < Minitest::Test
  LIB = File.expand_path("../lib", __dir__)

  WORKLOAD = <<~'RUBY'
    require "heapscope"
    dir = ARGV[0]
    $kept = []
    def leak_one
      $kept << ("leak" * 64)                  # LEAK_LINE
    end
    def churn_one
      ("churn" * 64).upcase                   # garbage at once
    end
    def once
      $config ||= Array.new(3000) { |i| "config-#{i}" * 4 }
    end
    Heapscope.start(sample_every: 7, sampling: :always) # a report test: sampling noise kept small
    once
    5.times do |round|
      4000.times { leak_one; churn_one; churn_one }
      GC.start
      Heapscope.write(File.join(dir, format("heap-%02d.pb.gz", round)), gc: true)
      sleep 0.05
    end
  RUBY

  def self.profiles
    @profiles ||= begin
      dir = Dir.mktmpdir("heapscope-live")
      script = File.join(dir, "workload.rb")
      File.write(script, WORKLOAD)
      out, status = Open3.capture2e(RbConfig.ruby, "-I", LIB, script, dir)
      raise "workload failed (is the extension built? bundle exec rake compile):\n#{out}" unless status.success?

      [dir, script, WORKLOAD.lines.index { |l| l.include?("LEAK_LINE") } + 1]
    end
  end

  Minitest.after_run { FileUtils.rm_rf(@profiles[0]) if @profiles }

  def run_cli(command, *argv)
    out = StringIO.new
    err = StringIO.new
    status = Heapscope::Report::CLI.run(command, argv, out: out, err: err)
    assert_equal [0, ""], [status, err.string], "#{command} #{argv.join(" ")}"
    out.string
  end

  def test_top_puts_the_leaking_line_first
    dir, script, line = self.class.profiles
    last = File.join(dir, "heap-04.pb.gz")
    Heapscope::Pprof.validate!(Heapscope::Pprof.read(last))
    data = JSON.parse(run_cli("top", last, "--json"))
    first = data["entries"].first
    assert_equal [script, line], first.values_at("file", "line"), data["entries"].first(3).inspect
    assert_equal "Object#leak_one", first["function"]
    # 20k strings of 256 chars: about 5 MiB of live memory, estimated from 1-in-7 samples.
    assert_in_delta 20_000, first["objects"], 20_000 * 0.1
    assert_operator first["relative_error"], :<, 0.05
    text = run_cli("top", last, "-n", "3")
    assert_match(/Object#leak_one #{Regexp.escape(script)}:#{line}$/, text.lines.find { |l| l =~ /\d%/ && l !~ /flat%/ })

    # Allocations: the churn line allocated twice as much as the leak.
    data = JSON.parse(run_cli("top", last, "--sample", "alloc_space", "--json"))
    assert_equal "Object#churn_one", data["entries"].first["function"]
  end

  def test_leaks_and_diff_over_the_series
    dir, script, line = self.class.profiles
    data = JSON.parse(run_cli("leaks", dir, "--json"))
    assert_equal 5, data["profiles"].size
    top = data["sites"].first
    assert_equal [script, line], top.values_at("file", "line"), data["sites"].first(3).map { |s| s["name"] }.inspect
    assert_equal [4, 4], top.values_at("rises", "intervals")
    assert_equal "leak", top["verdict"]
    assert_operator top["trend_sigmas"], :>, 10
    refute(data["sites"].any? { |s| s["function"] == "Object#once" && s["steady"] >= 0.75 })

    diff = JSON.parse(run_cli("diff", File.join(dir, "heap-00.pb.gz"), File.join(dir, "heap-04.pb.gz"), "--json"))
    grew = diff["grew"].first
    assert_equal [script, line], grew.values_at("file", "line")
    refute grew["noise"]
    assert_equal "grew", grew["verdict"]
  end
end
