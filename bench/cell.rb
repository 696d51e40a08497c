# frozen_string_literal: true

# One bench cell: runs one workload under one profiler in this (fresh) process and prints one line
#   BENCH_RESULT {"run_s":..., "cpu_s":..., "finish_s":..., "allocs":..., ...}
# bench/run starts this file once per (workload, profiler, round); it is not meant to be run by hand,
# though `ruby bench/cell.rb alloc heapscope_1000 100000` works for poking at one cell.
#
# Order inside the cell: load everything, prepare the workload (a gem, its inputs), warm it up once (small
# size) unprofiled, full GC, start the profiler, full GC, time the workload (wall and process CPU), then
# time `finish` separately.
# With --callgrind the measured region is bracketed by callgrind toggles (run under
# valgrind --collect-atstart=no), so its instruction count excludes boot, warm-up and profiler start.
require "json"
require "tmpdir"
require "heapscope_bench" # bench/emptyhook, built by bench/run into tmp/bench/emptyhook
# Every cell loads heapscope's library, whether it runs or not: `require "heapscope"` loads everything it
# uses later (pprof, HTTP, JSON, URI, socket: about 9k live objects on Ruby 3.1), and on these small heaps
# that alone changes how often the GC runs (alloc on 3.1: 102 GCs without it, 73 with it, not started),
# which would be counted as heapscope's (negative) cost. Loaded in every cell, every row has the same heap.
require "heapscope"
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

# CPU nanoseconds of each of this process's threads (Linux tasks: Ruby's and native ones), by thread id,
# read from each thread's CPU clock (Linux's clock id for thread tid: ~tid << 3 | 6); {} without /proc.
# The threads a profiler starts (heapscope's ticker, datadog's sampler) are the ones that appear between
# before and after its start.
def threads_cpu_ns
  Dir.children("/proc/self/task").each_with_object({}) do |tid, h|
    h[tid] = Process.clock_gettime((~Integer(tid) << 3) | 6, :nanosecond)
  rescue SystemCallError
    nil # the thread ended meanwhile
  end
rescue SystemCallError
  {}
end

# Whether the GC is off (GC.disable), without changing it: GC.disable answers whether it already was.
def gc_disabled?
  GC.disable.tap { |was| GC.enable unless was }
end

begin
  workload.prepare!
  workload.run([n / 20, 1].max) unless flags.include?("--no-warmup")
  GC.start(full_mark: true, immediate_sweep: true)
  threads_before = threads_cpu_ns.keys
  profiler.start.call(ctx)
  # A second full GC: what the profiler's start left behind (heapscope's windowed mode allocates 20,000
  # objects to measure the hook's cost) is swept here, not in the measured region. Left to the workload,
  # those 20,000 dead objects moved the GCs of the mixed workload on Ruby 3.4 for the whole run (300 pages:
  # 12 GCs unprofiled, 16 after 20,000 Object.new and no profiler at all; 900 pages: 33 and 42).
  # Not where the profiler has turned the GC off: memory_profiler disables it in its start and reports only
  # objects of the GC generation it started in, so a GC here emptied its report (allocated=0 retained=0).
  GC.start(full_mark: true, immediate_sweep: true) unless gc_disabled?

  threads0 = threads_cpu_ns.reject { |tid, _| threads_before.include?(tid) }
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
  threads1 = threads_cpu_ns
  own_threads_ns = threads0.sum { |tid, ns| threads1.key?(tid) ? threads1[tid] - ns : 0 }

  f0 = now
  info = profiler.finish.call(ctx) || {}
  f1 = now
  kept = nil # the workload's result (e.g. the retained heap) stays alive through finish

  puts "BENCH_RESULT " + JSON.generate(
    workload: workload.name, profiler: profiler.name, size: n,
    run_s: t1 - t0, cpu_s: c1 - c0, finish_s: f1 - f0, profiler_threads: threads0.size,
    profiler_threads_cpu_s: own_threads_ns / 1e9,
    allocs: allocs1 - allocs0, gcs: gc1 - gc0, last_gc_by: gc_by.to_s,
    valgrind: HeapscopeBench.running_on_valgrind?, info: info
  )
rescue LoadError, StandardError, NotImplementedError => e
  puts "BENCH_ERROR " + JSON.generate(error: "#{e.class}: #{e.message}".lines.first.to_s.strip)
  exit 3
end
