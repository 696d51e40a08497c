# frozen_string_literal: true

# Shared helpers for the core tests: run the profiler, decode what it wrote with the project's
# independent Ruby decoder (lib/heapscope/pprof.rb), and sum values per source line.
require "minitest/autorun"
require "objspace"
require "heapscope"
require "heapscope/pprof"

module CoreHelper
  # GC.verify_compaction_references moving every object toward an emptied heap: Ruby 3.3+ call the
  # keyword expand_heap (and warn about double_heap), 3.1 knows only double_heap.
  def verify_compaction
    GC.verify_compaction_references(expand_heap: true, toward: :empty)
  rescue ArgumentError
    GC.verify_compaction_references(double_heap: true, toward: :empty)
  end
  def teardown
    Heapscope.stop if Heapscope.running?
    GC.stress = false
    super
  end

  def decode(bytes)
    prof = Heapscope::Pprof.decode(bytes)
    Heapscope::Pprof.validate!(prof)
    prof
  end

  def heap_profile(**options)
    decode(Heapscope.profile(**options))
  end

  # Samples whose allocating line (the leaf frame: C frames carry their Ruby caller's line) is file:line.
  # klass: only samples labelled with that class.
  def samples_at(prof, line, file: caller_file, klass: nil)
    prof.samples.select do |s|
      (leaf = s.frames.first) && leaf.file == file && leaf.line == line && (klass.nil? || s.labels["class"] == klass)
    end
  end

  def sum_at(prof, type, line, file: caller_file, klass: nil)
    samples_at(prof, line, file: file, klass: klass).sum { |s| s.value(type) }
  end

  def caller_file
    File.expand_path(caller_locations(2, 1).first.path)
  end

  # Runs the block in a thread that ends before we look: its stack, a conservative GC root, is gone,
  # so temporaries it made are really unreachable.
  def in_finished_thread(&block)
    Thread.new(&block).join
    nil
  end

  def line_of(marker, file)
    File.readlines(file).index { |l| l.include?(marker) } + 1
  end
end
