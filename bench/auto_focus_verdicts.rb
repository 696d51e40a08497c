# frozen_string_literal: true

# bench/auto_focus_verdicts.rb: what automatic focus does to `heapscope leaks` on the memo-cache app
# (examples/memo_cache.rb: four leaking lines of three classes, the request's parameter Strings the
# cache's keys keep, request garbage, a bounded cache), over fresh processes, with and without it.
#
#   bundle exec ruby bench/auto_focus_verdicts.rb [RUNS] [ROUNDS]
#
# Per run and mode: the leaks verdict of every line of the example; then, per line, how many runs
# called it a leak. The leaking lines should be leaks in (nearly) every run, the bounded cache's line
# never.
require "json"
require "open3"
require "rbconfig"
require "tmpdir"

ROOT = File.expand_path("..", __dir__)
RUNS = Integer(ARGV[0] || 10)
ROUNDS = Integer(ARGV[1] || 7)
EXAMPLE = File.join(ROOT, "examples/memo_cache.rb")
LINES = File.readlines(EXAMPLE)
# The lines to report, by what they hold.
WATCH = {
  "the key Array" => "leak", "the Hash" => "leak", "the String" => "leak", "the Array of 12 Strings" => "leak",
  "@recent[term] =" => "bounded", "# garbage\n" => "garbage/params (leaks through the keys)",
}.to_h { |marker, kind| [LINES.index { |l| !l.lstrip.start_with?("#") && l.include?(marker) } + 1, "#{kind}: #{marker.strip}"] }

def run(auto_focus)
  Dir.mktmpdir("auto-focus") do |dir|
    _, err, status = Open3.capture3({ "MEMO_AUTO_FOCUS" => auto_focus ? "1" : "0" }, RbConfig.ruby, "-I", File.join(ROOT, "lib"),
                                    EXAMPLE, dir, ROUNDS.to_s)
    raise err unless status.success?

    out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.join(ROOT, "lib"), File.join(ROOT, "exe/heapscope"), "leaks", dir, "--json")
    raise err unless status.success?

    sites = JSON.parse(out)["sites"] || []
    WATCH.keys.to_h do |line|
      site = sites.find { |s| s["file"] == EXAMPLE && s["line"] == line }
      [line, site ? site["verdict"] : "absent"]
    end
  end
end

counts = { true => Hash.new(0), false => Hash.new(0) }
RUNS.times do |i|
  [true, false].each do |auto|
    verdicts = run(auto)
    verdicts.each { |line, v| counts[auto][[line, v]] += 1 }
    warn "run #{i + 1} auto_focus=#{auto}: #{verdicts.map { |l, v| "#{l}:#{v}" }.join(" ")}"
  end
end
puts "bench/auto_focus_verdicts: Ruby #{RUBY_VERSION}, #{RUNS} runs per mode, #{ROUNDS} snapshots each"
WATCH.each do |line, what|
  [true, false].each do |auto|
    tally = counts[auto].select { |(l, _), _| l == line }.map { |(_, v), n| "#{v} #{n}" }.sort.join(", ")
    puts format("line %3d %-48s auto_focus=%-5s %s", line, what, auto, tally)
  end
end
