# frozen_string_literal: true

require "minitest/autorun"
require_relative "stress_helper"

# Stress cells for what else runs in the process: another tool's allocation hook (ObjectSpace's
# allocation tracing, stackprof's object mode) and Ractors.
#
# Why another hook matters: Ruby runs no internal-event hook while another one runs, so a GC started by
# an allocation inside someone else's NEWOBJ hook runs without heapscope's liveness pass (Rubies up to
# 3.3; 3.4+ disable GC while NEWOBJ hooks run). Such a GC can sweep recorded objects and free their
# whole heap pages; reading a record then was a segfault at a page-aligned address (issue 11). Every
# GC must be counted as seen or missed, and after a missed one nothing may be read that is not known to
# be on a live page.
class TestStressPeers < Minitest::Test
  include StressCells

  # The crash of issue 11, item 1, as reported: many objects freed while ObjectSpace traces allocations.
  FREE_MANY_UNDER_TRACING = <<~'RUBY'
    gcs_before = GC.count
    Heapscope.start(**OPTIONS)
    kept = []
    3.times do |round|
      arr = Array.new(200_000 * SCALE) { Object.new }
      ObjectSpace.trace_object_allocations_start
      arr = nil
      200.times { Array.new(10_000) { |i| "t#{i}" } }
      kept << Array.new(500) { |i| "kept #{round} #{i}" }
      ObjectSpace.trace_object_allocations_stop
      GC.start
      decoded # reads every record: after a missed GC, suspects are checked first
    end
    GC.start
    stats = Heapscope.stats
    gcs = GC.count - gcs_before
    check(stats[:gc_runs_seen] + stats[:gc_runs_missed] == gcs,
          "seen #{stats[:gc_runs_seen]} + missed #{stats[:gc_runs_missed]} == #{gcs} GCs")
    check(stats[:suspect_records] == 0 && stats[:invalid_records] == 0, stats.slice(:suspect_records, :invalid_records).inspect)
    live = live_by_line_and_class(decoded(gc: true)).select { |(_, klass), _| klass == "String" }.values.sum
    # Every one of them when every allocation is sampled (a suspect that survived is kept); windows
    # sample a few, if any.
    check(live >= 1500, "the kept strings are still in the profile (#{live})") if OPTIONS[:sample_every] == 1
    puts "OK #{stats.slice(:gc_runs_seen, :gc_runs_missed, :stale_records, :tracked_objects)} live strings #{live}"
  RUBY

  def test_objects_freed_under_objectspace_tracing_always_mode
    run_cell("tracing_always", "OPTIONS = { sample_every: 1, sampling: :always, max_overhead: nil }\n" + FREE_MANY_UNDER_TRACING)
  end

  def test_objects_freed_under_objectspace_tracing_default_mode
    run_cell("tracing_default", "OPTIONS = { sample_every: 50 }\n" + FREE_MANY_UNDER_TRACING)
  end

  # GC.stress with tracing on: every malloc in ObjectSpace's hook starts a GC heapscope cannot see (up
  # to 3.3), in the default (windowed) mode, with objects dying all along.
  def test_gc_stress_under_objectspace_tracing_default_mode
    run_cell("tracing_stress_default", <<~'RUBY')
      gcs_before = GC.count
      Heapscope.start(sample_every: 3)
      ObjectSpace.trace_object_allocations_start
      keep = []
      GC.stress = true
      (40 * SCALE).times do |i|
        keep << "s#{i}" << [i] << { i => i }
        Array.new(50) { Object.new } # garbage, freed under stress
      end
      GC.stress = false
      ObjectSpace.trace_object_allocations_stop
      keep.clear
      3.times { decoded(gc: true) }
      GC.start
      stats = Heapscope.stats
      gcs = GC.count - gcs_before
      check(stats[:gc_runs_seen] + stats[:gc_runs_missed] == gcs, "every GC seen or missed: #{stats.slice(:gc_runs_seen, :gc_runs_missed)} of #{gcs}")
      puts "OK #{stats.slice(:gc_runs_seen, :gc_runs_missed, :stale_records, :tracked_objects)}"
    RUBY
  end

  # stackprof's object mode is a NEWOBJ hook that allocates (its frame buffers grow with xmalloc): in
  # both modes, and with GC.stress for part of the run.
  def test_objects_freed_under_stackprof_object_mode
    [["always", "sample_every: 1, sampling: :always, max_overhead: nil", false],
     ["default", "sample_every: 50", false], ["default_stress", "sample_every: 50", true]].each do |name, options, stress|
      run_cell("stackprof_#{name}", STACKPROF_CELL.sub("OPTIONS", options).gsub("STRESS", stress.to_s))
    end
  end

  STACKPROF_CELL = <<~'RUBY'
      require "stackprof"
      gcs_before = GC.count
      Heapscope.start(OPTIONS)
      kept = []
      2.times do |round|
        arr = Array.new(200_000 * SCALE) { Object.new }
        StackProf.run(mode: :object, interval: 1, raw: true) do
          arr = nil
          GC.stress = STRESS
          20.times { |i| kept << "stressed #{round} #{i}" } if STRESS
          GC.stress = false
          100.times { Array.new(10_000) { |i| "t#{i}" } }
          kept << Array.new(500) { |i| "kept #{round} #{i}" }
        end
        GC.start
        decoded
      end
      GC.start
      stats = Heapscope.stats
      gcs = GC.count - gcs_before
      check(stats[:gc_runs_seen] + stats[:gc_runs_missed] == gcs, "every GC seen or missed: #{stats.slice(:gc_runs_seen, :gc_runs_missed)} of #{gcs}")
      check(stats[:suspect_records] == 0, "no suspect left: #{stats[:suspect_records]}")
      puts "OK #{stats.slice(:gc_runs_seen, :gc_runs_missed, :stale_records, :tracked_objects)}"
  RUBY

  # issue 11, item 2: an allocating Ractor crashed the application within 0.2 s in every mode. Now the
  # first Ractor.new switches heapscope off (one warning) before the Ractor runs.
  def test_a_ractor_switches_heapscope_off_and_the_application_survives
    %w[always default].each do |mode|
      out = run_cell("ractor_#{mode}", <<~RUBY, timeout: 60)
        Warning[:experimental] = false
        Heapscope.start(**#{mode == "always" ? "{ sample_every: 1, sampling: :always, max_overhead: nil }" : "{ sample_every: 10 }"})
        r = Ractor.new { 100_000.times.map { |i| "x\#{i}" }.size }
        got = r.respond_to?(:value) ? r.value : r.take
        check(got == 100_000, "the Ractor finished its work: \#{got}")
        check(!Heapscope.running?, "heapscope is off")
        check(Heapscope.stats[:off_reason].include?("Ractor"), Heapscope.stats.inspect)
        check_raises(Heapscope::Error, "a Ractor was started") { Heapscope.profile }
        # Once no other Ractor runs, heapscope can start again and works (3.3+). (A Ractor that has
        # returned its value may still count for a moment.) Ruby 3.1 refuses for good: a second Ractor
        # made behind Ractor.new's back would crash Ruby with the hooks on (test_hardening_ractors.rb).
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
        sleep 0.01 while Ractor.count > 1 && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
        if RUBY_VERSION < "3.3"
          check_raises(Heapscope::Error, "cannot start on Ruby") { Heapscope.start }
          puts "OK refused to start again on Ruby \#{RUBY_VERSION}"
          exit
        end
        Heapscope.start(sample_every: 1, sampling: :always, max_overhead: nil)
        keep = Array.new(100) { "after #{mode}" }
        live = live_by_line_and_class(decoded(gc: true))
        check(live.values.sum >= 100, "profiles again: \#{live.inspect}")
        puts "OK \#{live.values.sum} live after the Ractor"
      RUBY
      assert_match(/OK/, out)
    end
  end

  def test_start_refuses_while_a_ractor_runs
    run_cell("ractor_running", <<~'RUBY', timeout: 60)
      Warning[:experimental] = false
      q = Ractor.new { Ractor.receive }
      check_raises(Heapscope::Error, "while other Ractors run") { Heapscope.start }
      q.send(:done)
      q.respond_to?(:value) ? q.value : q.take
      puts "OK refused: heapscope cannot start while other Ractors run"
    RUBY
  end
end
