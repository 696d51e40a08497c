#!/usr/bin/env ruby
# frozen_string_literal: true

# Does turning the allocation hook on and off change the GC's work? Runs bench's mixed workload (JSON
# pages) unprofiled and with bench/hooktoggle at several window lengths, each in a fresh process, and
# prints minor GCs, objects promoted to the old generation, and the mean live slots after each GC
# (GC::Profiler). No heapscope code is involved.
#
#   ruby bench/hooktoggle/run.rb [PAGES]      (builds the extension into tmp/bench/hooktoggle first)
require_relative "../extension"

root = File.expand_path("../..", __dir__)
build = Bench::Extension.build("hooktoggle")
pages = Integer(ARGV[0] || 900)
cell = <<~RUBY
  require "hooktoggle"
  require_relative "#{root}/bench/workloads/registry"
  Bench::Workloads.load_all
  w = Bench::Workloads.fetch("mixed")
  w.run(15)
  GC.start(full_mark: true, immediate_sweep: true)
  HookToggle.start(Integer(ARGV[0]))
  GC::Profiler.enable # records each GC's live slots; registers no hook
  s0 = GC.stat
  w.run(#{pages})
  s1 = GC.stat
  live = GC::Profiler.raw_data.map { |r| r[:HEAP_USE_SIZE] / (GC::INTERNAL_CONSTANTS[:RVALUE_SIZE] || GC::INTERNAL_CONSTANTS[:BASE_SLOT_SIZE]) }
  puts [s1[:minor_gc_count] - s0[:minor_gc_count], s1[:old_objects] - s0[:old_objects], HookToggle.windows,
        live.sum / [live.size, 1].max].join(" ")
RUBY
puts "window length   minor GCs   promoted   windows   live after GC (mean)   (mixed workload, #{pages} pages, 2 runs each)"
[0, 100, 700, 1300, 2000].each do |len|
  2.times do
    out = IO.popen([RbConfig.ruby, "-I", build, "-e", cell, len.to_s], &:read).split
    printf "%13s %11s %10s %9s %22s\n", len.zero? ? "(no hook)" : len, *out
  end
end
