# frozen_string_literal: true

# bench/same_run_diff.rb: how good `heapscope diff`'s error is for two snapshots of one process, and
# whether subtracting the windows' parts (the objects alive in both cancel) would be better.
#
#   bundle exec ruby bench/same_run_diff.rb [RUNS] [default|always]
#
# "diff (one run)" is what `heapscope diff` prints since profiles say their run (run_id): the error
# of what was sampled or lost between the two snapshots (Report::Persistence).
#
# Each fresh process keeps 3,000 Strings at a stable line, then 6,000 at a growing line, takes profile
# A, keeps 4,000 more at the growing line over a second, takes profile B (churn throughout). Truth by
# construction: the growing line changed by 4,000 Strings (memsize_of), the stable one by 0. Per line,
# over RUNS processes: the spread of the change, and how often ±2σ covered the truth with
#   independent  diff's error today: the two profiles' errors in quadrature;
#   parts        the change's own variance from the newer profile's design, its parts taken as
#                new - k x old per variance group (k the ratio of the profiles' weight scales), plus the
#                stable part's rescaling (old x (k - 1)) in quadrature: a candidate for same-run diffs.
# Honest errors cover about 95%; the median error (~) shows how wide each is. Only windowed profiles
# have parts.
require "open3"
require "rbconfig"
require "tempfile"

ROOT = File.expand_path("..", __dir__)
RUNS = Integer(ARGV[0] || 24)
MODE = (ARGV[1] || "default").to_sym

CHILD = <<~'RUBY'
  require "heapscope"
  require "heapscope/pprof"
  require "heapscope/report/diff"
  require "heapscope/report/persistence"
  require "objspace"
  R = Heapscope::Report
  STABLE = []
  GROW = []
  def churn(sec)
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t < sec
      $junk = Array.new(200) { "j" * 50 }
      sleep 0.001
    end
  end
  def grow(n, sec)
    50.times { (n / 50).times { GROW << ("g" * 1500) }; churn(sec / 50.0) } # GROW
  end
  Heapscope.start(**(ARGV[0] == "always" ? { sampling: :always } : {}))
  50.times { 60.times { STABLE << ("s" * 1000) }; churn(0.02) } # STABLE
  grow(6000, 1.5)
  a = Heapscope::Pprof.decode(Heapscope.profile(gc: true))
  grow(4000, 1.0)
  b = Heapscope::Pprof.decode(Heapscope.profile(gc: true))
  src = File.readlines(__FILE__)
  line = ->(tag) { src.index { |l| l.include?("# #{tag}") } + 1 }
  truth = { "GROW" => 4000 * ObjectSpace.memsize_of(GROW.last), "STABLE" => 0 }
  ti = b.sample_type_names.index("inuse_space")
  sn = R::Sampling.new(b)
  sb = R::Sampling.new(a)
  scale = ->(p) { p.comments.join("\n")[/weight_scale=([\d.]+)/, 1]&.to_f || 1.0 }
  k = scale.(b) / scale.(a)
  ns = R::Sites.aggregate(b, "line", cum: [])
  bs = R::Sites.aggregate(a, "line", cum: [])
  truth.each do |tag, t|
    want = ":#{line.(tag)}"
    en = ns.values.find { |e| e.name.end_with?(want) }
    eb = bs.values.find { |e| e.name.end_with?(want) }
    w = (en || eb)&.flat&.size || b.sample_types.size
    vn = en ? en.flat : Array.new(w, 0)
    vb = eb ? eb.flat : Array.new(w, 0)
    independent = Math.sqrt((en ? sn.absolute_error(vn, ti).to_f : 0)**2 + (eb ? sb.absolute_error(vb, ti).to_f : 0)**2)
    parts = sn.mode == "windowed" ? sn.send(:variance_of, vn.zip(vb).map { |x, y| x - k * y }, ti) : nil
    parts &&= Math.sqrt(parts + (vb[ti] * (k - 1))**2)
    # What `heapscope diff` prints now: for one run, the error of what was sampled or lost between the
    # snapshots (Report::Persistence).
    report = R::Diff.report(a, b, n: 10_000)
    row = (report["grew"] + report["shrank"]).find { |r| r["name"].end_with?(want) }
    lin = row && report["one_run"] ? row["error"] : nil
    puts [tag, t, vn[ti] - vb[ti], independent.round, parts ? parts.round : "-", k.round(4), lin ? lin.round : "-"].join(" ")
  end
RUBY

rows = Hash.new { |h, k| h[k] = [] }
child = Tempfile.create(["same_run_diff", ".rb"])
child.write(CHILD)
child.close
at_exit { File.unlink(child.path) }
RUNS.times do |r|
  out, err, status = Open3.capture3({ "RUBYOPT" => nil }, RbConfig.ruby, "-I", File.join(ROOT, "lib"), child.path, MODE.to_s)
  abort "run #{r} failed: #{err}" unless status.success?
  out.each_line do |l|
    tag, truth, change, ind, parts, k, lin = l.split
    rows[tag] << { truth: truth.to_i, change: change.to_i, ind: ind.to_f, parts: parts == "-" ? nil : parts.to_f, k: k.to_f,
                   lin: lin == "-" ? nil : lin.to_f }
  end
end

median = ->(xs) { xs.empty? ? nil : xs.sort[xs.size / 2] }
covered = ->(rs, key) { rs.count { |r| r[key] && (r[:change] - r[:truth]).abs <= 2 * r[key] } }
puts "Ruby #{RUBY_VERSION}, #{MODE}, #{RUNS} processes"
puts format("%-7s %10s %12s %12s %16s %16s %16s %10s", "line", "truth", "mean change", "sd change", "independent cov", "parts cov",
            "diff (one run)", "k range")
rows.each do |tag, rs|
  changes = rs.map { |r| r[:change] }
  mean = changes.sum.to_f / rs.size
  sd = Math.sqrt(changes.sum { |c| (c - mean)**2 } / [rs.size - 1, 1].max)
  parts = rs.count { |r| r[:parts] }
  lin = rs.count { |r| r[:lin] }
  puts format("%-7s %10d %12d %12d %9d/%d (~%s) %9s (~%s) %9s (~%s) %4.2f-%4.2f", tag, rs[0][:truth], mean, sd, covered.(rs, :ind), rs.size,
              median.(rs.map { |r| r[:ind] }).round, parts.zero? ? "-" : "#{covered.(rs, :parts)}/#{parts}",
              parts.zero? ? "-" : median.(rs.filter_map { |r| r[:parts] }).round,
              lin.zero? ? "-" : "#{covered.(rs, :lin)}/#{lin}", lin.zero? ? "-" : median.(rs.filter_map { |r| r[:lin] }).round,
              rs.map { |r| r[:k] }.min, rs.map { |r| r[:k] }.max)
end
