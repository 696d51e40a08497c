#!/usr/bin/env ruby
# frozen_string_literal: true

# bench/jit_windows.rb: what heapscope's sampling modes cost under a JIT that inlines allocation.
#
#   ruby bench/jit_windows.rb [--rounds 7] [--jits none,yjit,zjit] [--modes none,windowed,always]
#                             [--workloads objects,strings,literals,records] [--calls 20000] [--stats]
#
# ZJIT (Ruby 4.1-dev) bump-allocates objects in compiled code without calling rb_newobj, so that code
# cannot fire a NEWOBJ hook. It compiles that fast path only while no NEWOBJ hook is on, behind a patch
# point, and when a NEWOBJ hook is switched on (the event flag going from off to on) it patches every such
# point to exit to the interpreter and discards the method's compiled version; after 4 versions
# (--zjit-max-versions) a method is not recompiled and keeps the exiting code. heapscope's windowed mode
# switches the hook on hundreds of times a second. This measures what that costs, per JIT, against no
# profiler and against the hook kept on (sampling: :always).
#
# Method: every (jit, mode, workload) cell is a fresh `ruby` process (this file with --cell); each round
# runs every cell once, shuffled. A cell warms its workload up unprofiled (1,000 calls: ZJIT compiles a
# method after 30), starts heapscope, then times `calls` calls. The tables show the median process CPU
# seconds per cell over rounds (CPU, not wall time: on a shared machine wall time mostly measured the other
# processes; heapscope's ticker thread is in the process's CPU), and each mode's median ratio to the
# unprofiled cell of the same round. --stats adds
# one run per cell with --zjit-stats (not timed) for ZJIT's counters.
require "json"
require "optparse"
require "open3"
require "rbconfig"

ROOT = File.expand_path("..", __dir__)
JIT_FLAGS = { "none" => [], "yjit" => ["--yjit"], "zjit" => ["--zjit"] }.freeze
MODES = {
  "none" => nil,
  "windowed" => { sampling: :windowed }, # the default, except under ZJIT on 4.1+ (lib/heapscope.rb)
  "always" => { sampling: :always },
}.freeze
ZJIT_KEYS = %w[compiled_iseq_count compile_time_ns invalidation_time_ns side_exit_count exit_patchpoint_no_newobj_hook
               exit_patchpoint_no_tracepoint ratio_in_zjit].freeze

def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
def cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)

# One cell, in this process: prints one line `JIT_WINDOWS {json}`.
def run_cell(workload, mode, calls)
  $LOAD_PATH.unshift(File.join(ROOT, "lib"))
  require "heapscope"
  require_relative "jit_windows_workloads"
  raise ArgumentError, "unknown workload #{workload}" unless JitWindows::Work::NAMES.include?(workload)
  raise ArgumentError, "unknown mode #{mode}" unless MODES.key?(mode)

  # The driver loop runs once, so a method JIT never compiles it: it only calls the compiled workload.
  JitWindows.module_eval(<<~RUBY, __FILE__, __LINE__ + 1)
    def self.drive(n)
      i = 0
      while i < n
        Work.#{workload}
        i += 1
      end
    end
  RUBY
  JitWindows.drive(1000)
  GC.start(full_mark: true, immediate_sweep: true)
  Heapscope.start(**MODES[mode]) if MODES[mode]
  GC.start(full_mark: true, immediate_sweep: true)
  zjit0 = zjit_stats
  allocs0 = GC.stat(:total_allocated_objects)
  t0 = now
  c0 = cpu
  JitWindows.drive(calls)
  c1 = cpu
  t1 = now
  allocs = GC.stat(:total_allocated_objects) - allocs0
  zjit1 = zjit_stats
  hs = Heapscope.running? ? Heapscope.stats : {}
  Heapscope.stop if Heapscope.running?
  puts "JIT_WINDOWS " + JSON.generate(
    seconds: c1 - c0, wall: t1 - t0, allocs: allocs,
    zjit: zjit1 && zjit0 && ZJIT_KEYS.to_h { |k| [k, k == "ratio_in_zjit" ? zjit1[k.to_sym] : (zjit1[k.to_sym] || 0) - (zjit0[k.to_sym] || 0)] },
    heapscope: hs.slice(:sampling, :windows_opened, :hook_on_share, :window_seen_share, :allocations, :hook_allocations,
                        :samples_taken, :sampling_reason)
  )
end

def zjit_stats
  return nil unless defined?(RubyVM::ZJIT) && RubyVM::ZJIT.enabled? && RubyVM::ZJIT.respond_to?(:stats)

  RubyVM::ZJIT.stats
rescue StandardError
  nil
end

def spawn_cell(jit, workload, mode, calls, extra_flags = [])
  cmd = [RbConfig.ruby, *JIT_FLAGS.fetch(jit), *extra_flags, __FILE__, "--cell", workload, mode, calls.to_s]
  out, err, status = Open3.capture3(*cmd)
  line = out.lines.grep(/\AJIT_WINDOWS /).last
  raise "cell #{jit}/#{workload}/#{mode} failed (#{status}): #{err.lines.last(5).join}" unless status.success? && line

  JSON.parse(line.sub("JIT_WINDOWS ", ""))
end

def median(values)
  sorted = values.sort
  n = sorted.size
  n.odd? ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
end

if ARGV.first == "--cell"
  run_cell(ARGV[1], ARGV[2], Integer(ARGV[3]))
  exit
end

opts = { rounds: 7, jits: JIT_FLAGS.keys, modes: MODES.keys, workloads: %w[objects strings literals records],
         calls: 20_000, stats: false, seed: 42 }
OptionParser.new do |o|
  o.on("--rounds N", Integer) { |v| opts[:rounds] = v }
  o.on("--jits LIST", Array) { |v| opts[:jits] = v }
  o.on("--modes LIST", Array) { |v| opts[:modes] = v }
  o.on("--workloads LIST", Array) { |v| opts[:workloads] = v }
  o.on("--calls N", Integer) { |v| opts[:calls] = v }
  o.on("--stats", "also one untimed run per ZJIT cell with --zjit-stats") { opts[:stats] = true }
  o.on("--seed N", Integer) { |v| opts[:seed] = v }
end.parse!
opts[:jits].select! do |jit|
  ok = system(RbConfig.ruby, *JIT_FLAGS.fetch(jit), "-e", "exit", err: File::NULL)
  warn "bench/jit_windows.rb: #{RUBY_VERSION} has no #{jit}, skipped" unless ok
  ok
end
opts[:modes] |= ["none"] # ratios are against it

puts "ruby #{RUBY_DESCRIPTION}; #{opts[:calls]} calls per cell, #{opts[:rounds]} rounds"
rng = Random.new(opts[:seed])
cells = opts[:jits].product(opts[:workloads], opts[:modes])
results = Hash.new { |h, k| h[k] = [] }
opts[:rounds].times do |round|
  cells.shuffle(random: rng).each { |cell| results[cell] << spawn_cell(*cell[0, 2], cell[2], opts[:calls]) }
  warn "round #{round + 1}/#{opts[:rounds]} done"
end

opts[:jits].each do |jit|
  puts "\n#{jit}: median CPU seconds (ratio to no profiler: median over rounds of the same round's ratio)"
  puts format("%-9s %12s", "workload", "allocs/call") + opts[:modes].map { |m| format("%22s", m) }.join
  opts[:workloads].each do |w|
    base = results[[jit, w, "none"]]
    row = format("%-9s %12.1f", w, median(base.map { |r| r["allocs"] }) / opts[:calls].to_f)
    opts[:modes].each do |m|
      runs = results[[jit, w, m]]
      ratio = median(runs.zip(base).map { |r, b| r["seconds"] / b["seconds"] })
      row << format("%22s", format("%.3fs x%.2f", median(runs.map { |r| r["seconds"] }), ratio))
    end
    puts row
  end
  opts[:workloads].each do |w|
    opts[:modes].each do |m|
      hs = results[[jit, w, m]].map { |r| r["heapscope"] }.reject(&:empty?)
      next if hs.empty?

      puts format("  %-9s %-8s windows %6d  hook saw %.4f of allocations (share %.4f)  samples %d",
                  w, m, median(hs.map { |h| h["windows_opened"] || 0 }),
                  median(hs.map { |h| h["hook_allocations"].to_f / [h["allocations"], 1].max }),
                  median(hs.map { |h| h["hook_on_share"] || 0 }), median(hs.map { |h| h["samples_taken"] || 0 }))
    end
  end
end

if opts[:stats] && opts[:jits].include?("zjit")
  puts "\nzjit counters during the timed calls (one run each with --zjit-stats, not timed)"
  opts[:workloads].product(opts[:modes]).each do |w, m|
    z = spawn_cell("zjit", w, m, opts[:calls], ["--zjit-stats=quiet"])["zjit"] || {}
    puts format("  %-9s %-8s ", w, m) + z.map { |k, v| "#{k}=#{v.is_a?(Float) ? v.round(1) : v}" }.join(" ")
  end
end
