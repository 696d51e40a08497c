# frozen_string_literal: true

# Reads bench/accuracy/run's flags and writes the plan into WORKDIR (run calls it first; README.md):
#   plan.json  the settings (read by child.rb and summary.rb)
#   jobs       one job per line, "JOB CASE MODE RUN", for xargs: the library cases' truth first, then
#              run after run of every case, default and always interleaved
#   plan.sh    JOBS and SETUP for run itself
# Exit status: 0 planned, 2 bad flags, 10 help printed.
require "json"
require "optparse"
require "etc"
require_relative "case"

USAGE = "usage: bench/accuracy/run [--quick] [--runs N] [--sample-every S] [--max-overhead X|off] [--window-share C] [--focus C=N,...] [--cases a,b] [--jobs J] " \
        "[--min-samples K] [--strict-coverage] [--no-fail] [--no-setup] [--keep-profiles] [--json PATH]"

workdir = ARGV.shift or abort(USAGE)
cases = Accuracy.load_cases
opts = { runs: nil, sample_every: 1000, quick: false, cases: cases.keys, jobs: 2, min_samples: 10,
         strict_coverage: false, fail: true, setup: true, keep_profiles: false, json: nil, max_overhead: nil, window_share: nil,
         focus: nil }
parser = OptionParser.new do |o|
  o.banner = USAGE
  o.on("--quick", "smoke run: 8 runs, short cases (numbers are noisy; not for judging)") { opts[:quick] = true }
  o.on("--runs N", Integer, "fresh processes per case and mode (default 40, --quick 8)") { |v| opts[:runs] = v }
  o.on("--sample-every S", Integer, "Heapscope.start(sample_every: S) in both modes (default 1000)") { |v| opts[:sample_every] = v }
  o.on("--max-overhead X", "Heapscope.start(max_overhead: X) in both modes; off for nil (default: heapscope's own)") do |v|
    opts[:max_overhead] = v == "off" ? "off" : Float(v)
  rescue ArgumentError
    raise OptionParser::InvalidArgument, v
  end
  o.on("--window-share C", "Heapscope.start(window_share: C) in the default mode, 0 < C <= 1 or budget (default: heapscope's own)") do |v|
    opts[:window_share] = v == "budget" ? "budget" : Float(v)
  rescue ArgumentError
    raise OptionParser::InvalidArgument, v
  end
  o.on("--focus LIST", "Heapscope.start(focus: LIST) in both modes, e.g. Accuracy::Sites::FifoValue=25 (compare.rb sets it beside a run without)") do |v|
    opts[:focus] = v
  end
  o.on("--cases LIST", Array, "cases to run (default all: #{cases.keys.join(",")})") { |v| opts[:cases] = v }
  o.on("--jobs J", Integer, "processes at once (default 2: the machine has 2 cores)") { |v| opts[:jobs] = v }
  o.on("--min-samples K", Float, "judge a site only if its truth is at least K * sample_every objects (default 10)") do |v|
    opts[:min_samples] = v
  end
  o.on("--strict-coverage", "judge each site's coverage by 90-98% itself, not allowing for its binomial noise") do
    opts[:strict_coverage] = true
  end
  o.on("--no-fail", "exit 0 whatever the criteria say (report only)") { opts[:fail] = false }
  o.on("--no-setup", "skip bundle install (bench group) and rake compile") { opts[:setup] = false }
  o.on("--keep-profiles", "keep every profile in the work directory (tmp/accuracy/STAMP/profiles)") { opts[:keep_profiles] = true }
  o.on("--json PATH", "where the results go (default bench/accuracy/results/STAMP.json)") { |v| opts[:json] = v }
  o.on("-h", "--help") do
    puts o.help
    exit 10
  end
end
begin
  parser.parse!(ARGV)
  raise OptionParser::InvalidArgument, "unexpected argument #{ARGV.first}" unless ARGV.empty?
  unknown = opts[:cases] - cases.keys
  raise OptionParser::InvalidArgument, "unknown case #{unknown.join(", ")} (known: #{cases.keys.join(", ")})" if unknown.any?
  raise OptionParser::InvalidArgument, "--runs must be at least 2" if opts[:runs] && opts[:runs] < 2
  raise OptionParser::InvalidArgument, "--sample-every must be at least 1" if opts[:sample_every] < 1
  raise OptionParser::InvalidArgument, "--jobs must be at least 1" if opts[:jobs] < 1
  if opts[:window_share] && opts[:window_share] != "budget" && !(opts[:window_share] > 0 && opts[:window_share] <= 1)
    raise OptionParser::InvalidArgument, "--window-share must be above 0 and at most 1"
  end
  # Without a budget the budget's share is the fixed 0.04, which would be measured under the budget's name.
  if opts[:window_share] == "budget" && opts[:max_overhead] == "off"
    raise OptionParser::InvalidArgument, "--window-share budget needs a budget (not --max-overhead off): without one the share stays 0.04"
  end
rescue OptionParser::ParseError => e
  warn "bench/accuracy/run: #{e.message}\n#{USAGE}"
  exit 2
end
warn "bench/accuracy/run: --jobs #{opts[:jobs]} on #{Etc.nprocessors} cores" if opts[:jobs] > Etc.nprocessors

runs = opts[:runs] || (opts[:quick] ? 8 : 40)
selected = cases.keys & opts[:cases] # the registry's order
jobs = selected.select { |c| cases[c] <= Accuracy::LibraryCase }.map { |c| [c, "trace", 0] }
(1..runs).each do |run|
  selected.each do |c|
    modes = run.odd? ? %w[default always] : %w[always default]
    modes.each { |m| jobs << [c, m, run] }
  end
end
stamp = File.basename(workdir)
plan = {
  "stamp" => stamp, "runs" => runs, "sample_every" => opts[:sample_every], "quick" => opts[:quick],
  "scale" => opts[:quick] ? 0.3 : 1.0, "cases" => selected, "min_samples" => opts[:min_samples],
  "max_overhead" => opts[:max_overhead], "window_share" => opts[:window_share], "focus" => opts[:focus], "strict_coverage" => opts[:strict_coverage], "fail" => opts[:fail], "keep_profiles" => opts[:keep_profiles],
  "json" => File.expand_path(opts[:json] || File.join(__dir__, "results", "#{stamp}.json")),
  "jobs" => opts[:jobs], "jobs_total" => jobs.size, "ruby" => RUBY_DESCRIPTION,
}
File.write(File.join(workdir, "plan.json"), JSON.pretty_generate(plan))
File.write(File.join(workdir, "jobs"), jobs.each_with_index.map { |(c, m, r), i| "#{i + 1} #{c} #{m} #{r}\n" }.join)
File.write(File.join(workdir, "plan.sh"), "JOBS=#{opts[:jobs]}\nSETUP=#{opts[:setup] ? 1 : 0}\nTOTAL=#{jobs.size}\n")
