# frozen_string_literal: true

# bench/leak_calibration.rb: how `heapscope leaks` judges sites whose truth is known, over fresh
# processes: is "leak" called on real leaks (power), and how often on sites that do not grow (false
# leaks, which its 2σ one-sided test means to keep near 2.3% per flat site)?
#
#   bundle exec ruby bench/leak_calibration.rb [RUNS] [ROUNDS] [PER_ROUND] [--always]
#
# Each process (default settings, windowed on Ruby 3.3+; --always: sampling: :always) runs ROUNDS
# rounds of PER_ROUND iterations and writes a snapshot after each (gc: true, as the periodic writer's
# are not, but a GC per round keeps the rounds alike), then `leaks` over the last 6. Its lines:
#   static   20,000 Strings made before the first round, kept, never added to: flat
#   bounded  a Hash of 3,000 keys whose values are replaced: flat once full (from the first round)
#   queue    an Array that takes 500 Strings a round and gives back 500: flat
#   leak     one String of ~80 bytes every 4th iteration, kept: grows
#   slow     one Array every 50th iteration, kept: grows slowly
# plus garbage every iteration. Per line: how often each verdict, the mean and spread of the trend's z
# over the runs where it grew at all (leaks lists no site that shrank), and whether the run's snapshots were judged
# as one run (heapscope 0.3's run_id).
require "json"
require "open3"
require "rbconfig"
require "tmpdir"

ROOT = File.expand_path("..", __dir__)
args = ARGV.reject { |a| a.start_with?("--") }
RUNS = Integer(args[0] || 20)
ROUNDS = Integer(args[1] || 10)
PER_ROUND = Integer(args[2] || 4000)
ALWAYS = ARGV.include?("--always")

CHILD = <<~'RUBY'
  require "heapscope"
  dir, rounds, per_round, always = ARGV[0], Integer(ARGV[1]), Integer(ARGV[2]), ARGV[3] == "1"
  Heapscope.start(**(always ? { sampling: :always } : {}))
  STATIC = Array.new(20_000) { |i| "static #{i} " * 6 }               # static
  BOUNDED = {}
  QUEUE = []
  LEAK = []
  SLOW = []
  n = 0
  rounds.times do |r|
    per_round.times do
      BOUNDED["k#{n % 3000}"] = "value #{n} " * 6                       # bounded
      QUEUE << "queued #{n} " * 4 if n % (per_round / 500) == 0         # queue
      QUEUE.shift while QUEUE.size > 500
      LEAK << "leaked #{n} " * 6 if n % 4 == 0                          # leak
      SLOW << Array.new(8, n) if n % 50 == 0                            # slow
      $junk = Array.new(4) { "junk #{n}" }
      n += 1
    end
    Heapscope.write(File.join(dir, format("cal-%03d.heap.pb.gz", r)), gc: true)
  end
RUBY

LINES = CHILD.lines
KINDS = %w[static bounded queue leak slow].to_h do |kind|
  [LINES.index { |l| l.rstrip.end_with?("# #{kind}") } + 1, kind]
end

def one_run
  Dir.mktmpdir("leak-cal") do |dir|
    script = File.join(dir, "child.rb")
    File.write(script, CHILD)
    _, err, status = Open3.capture3(RbConfig.ruby, "-I", File.join(ROOT, "lib"), script, dir, ROUNDS.to_s,
                                    PER_ROUND.to_s, ALWAYS ? "1" : "0")
    raise err unless status.success?

    files = Dir[File.join(dir, "*.pb.gz")].sort.last(6)
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.join(ROOT, "lib"), File.join(ROOT, "exe/heapscope"),
                                      "leaks", *files, "--json", "-n", "1000")
    raise err unless status.success?

    data = JSON.parse(out)
    found = KINDS.to_h do |line, kind|
      site = data["sites"].find { |s| s["file"] == script && s["line"] == line }
      [kind, site ? [site["verdict"], site["trend_sigmas"]&.to_f] : ["not growing", nil]]
    end
    [found, data["one_run"]]
  end
end

results = Hash.new { |h, k| h[k] = [] }
one_runs = 0
RUNS.times do |i|
  found, one = one_run
  one_runs += 1 if one
  found.each { |kind, v| results[kind] << v }
  warn "run #{i + 1}: #{found.map { |k, (v, z)| "#{k}=#{v} #{z}" }.join(", ")}"
end
puts "bench/leak_calibration: Ruby #{RUBY_VERSION}, #{ALWAYS ? "sampling always" : "default settings"}, " \
     "#{RUNS} processes, #{ROUNDS} rounds of #{PER_ROUND}, leaks over the last 6; judged as one run in #{one_runs}"
KINDS.each_value do |kind|
  rows = results[kind]
  zs = rows.map(&:last).compact
  zs = [0.0] if zs.empty?
  mean = zs.sum / zs.size
  sd = Math.sqrt(zs.sum { |z| (z - mean)**2 } / [zs.size - 1, 1].max)
  tally = rows.map(&:first).tally.sort.map { |v, c| "#{v} #{c}" }.join(", ")
  puts format("%-8s z mean %6.2f sd %5.2f   %s", kind, mean, sd, tally)
end
