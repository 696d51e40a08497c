# frozen_string_literal: true

# What a weight scale per stretch buys (docs/windowed-sampling.md): a run in two phases of 4 s that lose
# windows differently. Phase A runs beside three CPU-bound processes (on a small machine the ticker then
# wakes late, and windows run long), phase B alone; each keeps one object in 20 of its own class. One
# scale for the whole run weighs each phase by the other's losses; a scale per stretch weighs each by its
# own, but for the stretch the phases meet in. Per process: the truth and the census's estimate at the
# sites of each class (inuse objects), the stretches closed and their scales; then the mean and standard
# deviation of estimate / truth per phase over the processes.
#
#   ruby -Ilib bench/accuracy/loaded_phases.rb [PROCESSES (4)] [share (0.04)]
#
# Needs a Ruby whose windowed mode has a ticker (3.3+).
require "json"
require_relative "fresh_processes"

PHASE_SECONDS = 4.0
HOGS = 3

class PhaseA; end
class PhaseB; end

def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

# Allocates for PHASE_SECONDS: a short String each time, and one object of klass in 20, kept.
def phase(klass, kept)
  deadline = now + PHASE_SECONDS
  i = 0
  while now < deadline
    "p" * 20
    kept << klass.new if (i % 20).zero?
    i += 1
  end
end

def child(share)
  require "heapscope"
  require "heapscope/pprof"
  Heapscope.start(sampling: :windowed, window_share: share)
  kept_a = []
  kept_b = []
  hogs = Array.new(HOGS) { spawn(RbConfig.ruby, "-e", "loop {}") }
  begin
    phase(PhaseA, kept_a)
  ensure
    hogs.each { |pid| Process.kill(:KILL, pid) }
    hogs.each { |pid| Process.wait(pid) }
  end
  phase(PhaseB, kept_b)
  prof = Heapscope::Pprof.decode(Heapscope.profile)
  census = Heapscope::Report::Census.of(prof) or abort "no census in the profile"
  ti = prof.sample_index("inuse_objects")
  a, b = %w[PhaseA PhaseB].map { |c| census.class_row(prof, ti, c)["at_sites"] }
  s = Heapscope.stats
  abort "no ticker on this Ruby: windows change at GCs only" unless s[:sync_jobs].positive?
  puts JSON.generate("a" => [kept_a.size, a], "b" => [kept_b.size, b], "stretches" => s[:weight_stretches].to_i,
                     "scales" => [s[:stretch_scale_min].to_f, s[:stretch_scale_max].to_f], "weight_scale" => s[:weight_scale])
end

processes, share, runs = FreshProcesses.main(__FILE__) { |s| child(s) }
ratios = { "a" => [], "b" => [] }
runs.each_with_index do |r, i|
  ratios.each_key { |k| ratios[k] << r[k][1].fdiv(r[k][0]) }
  puts format("run %-3d A %7d est %7d  B %7d est %7d  stretches %d (scales %.2f-%.2f)  weight_scale %.2f",
              i + 1, *r["a"], *r["b"], r["stretches"], *r["scales"], r["weight_scale"])
end
ratios.each do |k, v|
  mean = v.sum / v.size
  sd = v.size > 1 ? Math.sqrt(v.sum { |x| (x - mean)**2 } / (v.size - 1)) : 0.0
  puts format("phase %s: estimate / truth mean %.3f, sd %.3f, standard error %.3f", k.upcase, mean, sd, sd / Math.sqrt(v.size))
end
puts "(#{processes} processes, share #{share})"
