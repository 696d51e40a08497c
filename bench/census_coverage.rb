# frozen_string_literal: true

# bench/census_coverage.rb: does the unsampled row ("not seen at any site", docs/reading-profiles.md)
# cover what the sites really missed? Runs N fresh processes of a workload whose truth is known by
# construction, each with the default sampling, and checks per run:
#
#   - the String row's remainder (census exact - the sites' estimates) against the true remainder:
#     exact - the bytes the workload's own lines hold (every String the workload keeps is one of its
#     own, measured with memsize_of); covered when within 2 of the row's standard errors;
#   - that no line reads above its class's exact total in heapscope top's rows (the bound);
#   - the Thread line (a dozen kept threads at one line) against its truth.
#
# The workload: 150,000 small Strings kept (line SMALL), a cache of 100 Strings of 20 KB (line BIG),
# 12 sleeping Threads (line THREADS), churn. Profiles are taken with gc: true (so min_age 1 leaves
# nothing young out) after a GC; pre-start Strings (the gems', Ruby's) are part of the true remainder.
#
#   bundle exec ruby -Ilib bench/census_coverage.rb [RUNS]      (default 40)
require "json"
require "open3"
require "rbconfig"
require "tempfile"

RUNS = Integer(ARGV[0] || 40)
ROOT = File.expand_path("..", __dir__)

CHILD = <<~'RUBY'
  require "heapscope"
  require "heapscope/pprof"
  require "heapscope/report/sites"
  require "heapscope/report/top"
  require "objspace"
  require "json"
  GC.start
  before = {}
  ObjectSpace.each_object(String) { |s| before[s.__id__] = true }
  Heapscope.start
  small = Array.new(150_000) { |i| "s-#{i}" }                         # SMALL
  big = Array.new(100) { |i| ("b" * 20_000) << i.to_s }               # BIG
  threads = Array.new(12) { Thread.new { sleep } }                    # THREADS
  200_000.times { |i| "churn #{i}" }
  sleep 0.05
  GC.start
  GC.disable
  own = (small + big).sum { |s| ObjectSpace.memsize_of(s) }
  thread_bytes = threads.sum { |t| ObjectSpace.memsize_of(t) }
  bytes = Heapscope.profile(gc: false)
  GC.enable
  prof = Heapscope::Report::Sites.decode(bytes, "profile")
  data = Heapscope::Report::Top.report(prof, path: "-", sample: "inuse_space", by: "line", n: 1000, all: true)
  census = data["census"] || {}
  row = (census["rows"] || []).find { |r| r["name"] == "String" }
  lines = data["entries"].to_h { |e| [e["line"], e] }
  src = File.readlines(__FILE__)
  at = ->(tag) { src.index { |l| l.include?("# #{tag}") } + 1 }
  puts JSON.generate(
    exact: row && row["exact"], at_sites: row && row["at_sites"], error: row && row["error"], own: own,
    threads_truth: thread_bytes, threads_line: lines[at.("THREADS")]&.then { |e| e["flat_estimate"] || e["flat"] },
    threads_shown: lines[at.("THREADS")]&.fetch("flat"), big_line: lines[at.("BIG")]&.fetch("flat"),
    over_total: data["entries"].count { |e| e["bounded_by"] && e["flat"] > census["total"].to_i },
    bounded: data["entries"].count { |e| e["bounded_by"] }, census_seconds: census["seconds"],
    sampling: Heapscope.stats[:sampling].to_s
  )
RUBY

script = Tempfile.create(["census_coverage", ".rb"])
script.write(CHILD)
script.close
results = Array.new(RUNS) do |i|
  out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.join(ROOT, "lib"), script.path)
  abort "run #{i} failed: #{err}" unless status.success?
  JSON.parse(out.lines.last)
end
File.unlink(script.path)

covered = results.count do |r|
  next false unless r["exact"] && r["error"]
  truth = r["exact"] - r["own"] # what no site of the workload holds: pre-start Strings, heapscope's own
  ((r["exact"] - r["at_sites"]) - truth).abs <= 2 * r["error"]
end
thread_ratio = results.filter_map { |r| r["threads_shown"] && r["threads_shown"].to_f / r["threads_truth"] }
puts "Ruby #{RUBY_VERSION}, #{results.first["sampling"]} sampling, #{RUNS} fresh processes"
puts "String remainder within 2 standard errors of the true remainder: #{covered} of #{RUNS}"
puts "Thread line seen in #{thread_ratio.size} of #{RUNS} runs; shown / truth: " \
     "#{thread_ratio.empty? ? "-" : format("min %.2f max %.2f", thread_ratio.min, thread_ratio.max)}"
puts "rows above the census total: #{results.sum { |r| r["over_total"] }}; rows bounded: #{results.sum { |r| r["bounded"] }}"
puts "census: median #{format("%.1f", results.map { |r| r["census_seconds"] }.sort[RUNS / 2] * 1000)} ms"
