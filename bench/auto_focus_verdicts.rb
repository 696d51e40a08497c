# frozen_string_literal: true

# bench/auto_focus_verdicts.rb: what automatic focus does to `heapscope leaks` on the memo-cache app
# (examples/memo_cache.rb: four leaking lines of three classes, the request's parameter Strings the
# cache's keys keep, request garbage, a bounded cache), over fresh processes, with and without it.
#
#   bundle exec ruby bench/auto_focus_verdicts.rb [RUNS] [ROUNDS]
#
# 1,000 requests (one leaked entry each) per round, a snapshot per round. Per run and mode: the leaks
# verdict over the last 6 snapshots of every line of the example, and the diff verdict between the
# snapshots at 6,000 and 10,000 entries (issue 32's acceptance); then, per line, the tally over runs.
# Automatic focus engages after 4 rounds of growth, so both diff snapshots are focused ones. The
# leaking lines should be leaks and grow in (nearly) every run, the bounded cache's line never.
require "json"
require "open3"
require "rbconfig"
require "tmpdir"

ROOT = File.expand_path("..", __dir__)
RUNS = Integer(ARGV[0] || 10)
ROUNDS = Integer(ARGV[1] || 10)
PER_ROUND = 1000
EXAMPLE = File.join(ROOT, "examples/memo_cache.rb")
LINES = File.readlines(EXAMPLE)
# The lines to report, by what they hold.
WATCH = {
  "the key Array" => "leak", "the Hash" => "leak", "the String" => "leak", "the Array of 12 Strings" => "leak",
  "@recent[term] =" => "bounded", "# garbage\n" => "garbage/params (leaks through the keys)",
}.to_h { |marker, kind| [LINES.index { |l| !l.lstrip.start_with?("#") && l.include?(marker) } + 1, "#{kind}: #{marker.strip}"] }

def run(auto_focus)
  Dir.mktmpdir("auto-focus") do |dir|
    env = { "MEMO_AUTO_FOCUS" => auto_focus ? "1" : "0", "MEMO_PER_ROUND" => PER_ROUND.to_s }
    _, err, status = Open3.capture3(env, RbConfig.ruby, "-I", File.join(ROOT, "lib"), EXAMPLE, dir, ROUNDS.to_s)
    raise err unless status.success?

    files = Dir[File.join(dir, "*.pb.gz")].sort
    leaks = heapscope("leaks", *files.last(6), "--json")["sites"] || []
    diff = heapscope("diff", files[6000 / PER_ROUND - 1], files[10_000 / PER_ROUND - 1], "--json")
    grew = diff["grew"] || []
    WATCH.keys.to_h do |line|
      site = leaks.find { |s| s["file"] == EXAMPLE && s["line"] == line }
      change = grew.find { |s| s["file"] == EXAMPLE && s["line"] == line }
      [line, [site ? site["verdict"] : "absent", change ? change["verdict"] : "absent",
              site && site["trend_sigmas"], change && change["sigmas"]]]
    end
  end
end

def heapscope(*args)
  out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.join(ROOT, "lib"), File.join(ROOT, "exe/heapscope"), *args)
  raise err unless status.success?

  JSON.parse(out)
end

counts = { true => Hash.new(0), false => Hash.new(0) }
RUNS.times do |i|
  [true, false].each do |auto|
    verdicts = run(auto)
    verdicts.each do |line, (leak, change, _, _)|
      counts[auto][[line, "leaks: #{leak}"]] += 1
      counts[auto][[line, "diff: #{change}"]] += 1
    end
    warn "run #{i + 1} auto_focus=#{auto}: #{verdicts.map { |l, (a, b, za, zb)| "#{l}:#{a} #{za}/#{b} #{zb}" }.join(" ")}"
  end
end
puts "bench/auto_focus_verdicts: Ruby #{RUBY_VERSION}, #{RUNS} runs per mode, #{ROUNDS} snapshots of #{PER_ROUND} requests; " \
     "leaks over the last 6, diff at 6,000 -> 10,000 entries"
WATCH.each do |line, what|
  [true, false].each do |auto|
    tally = counts[auto].select { |(l, _), _| l == line }.map { |(_, v), n| "#{v} #{n}" }.sort.join(", ")
    puts format("line %3d %-48s auto_focus=%-5s %s", line, what, auto, tally)
  end
end
