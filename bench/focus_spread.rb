# frozen_string_literal: true

# bench/focus_spread.rb: what focusing a class buys (Heapscope.start(focus:)), over fresh processes.
#
#   bundle exec ruby bench/focus_spread.rb [RUNS] [always|windowed|default]
#
# Each process keeps 20,000 Quote objects (and 20,000 Plain ones from the same loop) among 2 million
# churned allocations, then takes one heap profile (census off, so estimates are the samples' own);
# truth is known by construction. Per mode and focus, over RUNS processes: the mean estimate of each
# class, its distance from the truth in standard errors of the mean, and the per-profile spread (sd over
# runs); then the spread ratio unfocused / focused for Quote beside sqrt(rate ratio), what stratified
# sampling promises when every allocation is drawn independently (windows add their clustering, which
# a denser rate cannot remove). Plain is the control: focus must leave it unchanged.
require "json"
require "open3"
require "rbconfig"

ROOT = File.expand_path("..", __dir__)
RUNS = Integer(ARGV[0] || 20)
MODE = (ARGV[1] || "default").to_sym
KEPT = 20_000
FOCUS_RATE = 10

CHILD = <<~'RUBY'
  require "heapscope"
  require "heapscope/report/top"
  class Quote; def initialize(i) = @i = i; end
  class Plain; def initialize(i) = @i = i; end
  mode, focus, kept = ARGV[0].to_sym, ARGV[1] == "1" ? { Quote => Integer(ARGV[2]) } : nil, Integer(ARGV[3])
  opts = { census: false, focus: focus }
  opts[:sampling] = mode unless mode == :default
  Heapscope.start(**opts)
  keep = []
  kept.times do |i|
    keep << Quote.new(i) << Plain.new(i)
    100.times { |j| "churn #{j}" } # 2 million churned Strings in all
  end
  prof = Heapscope::Report::Sites.decode(Heapscope.profile(gc: true), "child")
  rows = Heapscope::Report::Top.report(prof, sample: "inuse_objects", by: "class", n: 1000)["entries"]
  out = %w[Quote Plain].to_h { |c| r = rows.find { |e| e["name"] == c }; [c, r ? r["flat"] : 0] }
  out["sampling"] = Heapscope.stats[:sampling]
  puts JSON.generate(out)
RUBY

def run_child(focus)
  out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.join(ROOT, "lib"), "-e", CHILD, MODE.to_s, focus ? "1" : "0",
                                    FOCUS_RATE.to_s, KEPT.to_s)
  raise "child failed: #{err}" unless status.success?

  JSON.parse(out.lines.last)
end

def summary(values)
  mean = values.sum / values.size.to_f
  sd = Math.sqrt(values.sum { |v| (v - mean)**2 } / (values.size - 1))
  [mean, sd]
end

results = { false => [], true => [] }
RUNS.times do
  # Interleaved, so drift on a shared machine touches both alike.
  [false, true].each { |focus| results[focus] << run_child(focus) }
end
sampling = results[false].first["sampling"]
puts "bench/focus_spread: Ruby #{RUBY_VERSION}, #{RUNS} processes per row, sampling #{sampling}, " \
     "focus Quote 1 in #{FOCUS_RATE}, truth #{KEPT} each"
puts format("%-9s %-6s %10s %8s %10s", "focus", "class", "mean", "z", "spread")
spreads = {}
[false, true].each do |focus|
  %w[Quote Plain].each do |klass|
    mean, sd = summary(results[focus].map { |r| r[klass] })
    z = sd.zero? ? 0.0 : (mean - KEPT) / (sd / Math.sqrt(RUNS))
    spreads[[focus, klass]] = sd
    puts format("%-9s %-6s %10.0f %8.2f %10.0f", focus ? "Quote=#{FOCUS_RATE}" : "none", klass, mean, z, sd)
  end
end
ratio = spreads[[false, "Quote"]] / [spreads[[true, "Quote"]], 1e-9].max
puts format("Quote spread ratio (none / focused): %.2f; sqrt(1000 / %d) = %.2f; Plain's ratio %.2f (1 = unchanged)",
            ratio, FOCUS_RATE, Math.sqrt(1000.0 / FOCUS_RATE), spreads[[false, "Plain"]] / [spreads[[true, "Plain"]], 1e-9].max)
