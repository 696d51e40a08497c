# frozen_string_literal: true

# One bench cell: runs one workload under one profiler in this (fresh) process and prints one line
#   BENCH_RESULT {"run_s":..., "cpu_s":..., "finish_s":..., "allocs":..., ...}
# bench/run starts this file once per (workload, profiler, round); it is not meant to be run by hand,
# though `ruby bench/cell.rb alloc heapscope_1000 100000` works for poking at one cell.
#
# Order inside the cell: load everything, warm the workload up once (small size) unprofiled, full GC,
# start the profiler, time the workload (wall and process CPU), then time `finish` separately.
# With --callgrind the measured region is bracketed by callgrind toggles (run under
# valgrind --collect-atstart=no), so its instruction count excludes boot, warm-up and profiler start.
require "json"
require "tmpdir"
require "heapscope_bench" # bench/emptyhook, built by bench/run into tmp/bench/emptyhook
require_relative "workloads/registry"
require_relative "profilers"

workload_name, profiler_name, size, *flags = ARGV
abort "usage: cell.rb WORKLOAD PROFILER SIZE [--callgrind] [--no-warmup]" unless size
callgrind = flags.include?("--callgrind")

workload = Bench::Workloads.load_all.fetch(workload_name)
profiler = Bench::Profilers.fetch(profiler_name)
n = Integer(size)
ctx = { tmpdir: ENV.fetch("BENCH_TMPDIR", Dir.tmpdir) }

def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
def cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)

begin
  workload.run([n / 20, 1].max) unless flags.include?("--no-warmup")
  GC.start(full_mark: true, immediate_sweep: true)
  profiler.start.call(ctx)

  gc0 = GC.count
  allocs0 = GC.stat(:total_allocated_objects)
  HeapscopeBench.callgrind_toggle if callgrind
  t0 = now
  c0 = cpu
  kept = workload.run(n)
  c1 = cpu
  t1 = now
  HeapscopeBench.callgrind_toggle if callgrind
  allocs1 = GC.stat(:total_allocated_objects)
  gc1 = GC.count
  gc_by = GC.latest_gc_info(:gc_by)

  f0 = now
  info = profiler.finish.call(ctx) || {}
  f1 = now
  kept = nil # the workload's result (e.g. the retained heap) stays alive through finish

  puts "BENCH_RESULT " + JSON.generate(
    workload: workload.name, profiler: profiler.name, size: n,
    run_s: t1 - t0, cpu_s: c1 - c0, finish_s: f1 - f0,
    allocs: allocs1 - allocs0, gcs: gc1 - gc0, last_gc_by: gc_by.to_s,
    valgrind: HeapscopeBench.running_on_valgrind?, info: info
  )
rescue LoadError, StandardError, NotImplementedError => e
  puts "BENCH_ERROR " + JSON.generate(error: "#{e.class}: #{e.message}".lines.first.to_s.strip)
  exit 3
end
