# frozen_string_literal: true

require_relative "core_helper"

# Randomized record-lifecycle test: random sequences of allocations at four sites, drops, minor and
# major GCs, compaction, resets, stop/start and profiles, checked after every profile against a model
# of what is alive and what was allocated (exact: sample_every 1, budget off). A failure prints the
# seed and the operations that led to it; HEAPSCOPE_LIFECYCLE_SEEDS=N runs more sequences.
class TestCoreLifecycle < Minitest::Test
  include CoreHelper

  Item = Struct.new(:payload, :site, :generation)
  SEQUENCES = Integer(ENV.fetch("HEAPSCOPE_LIFECYCLE_SEEDS", "12"))
  OPS = 40

  def site0(out, n) = n.times { |i| out << Item.new("a" * (i % 50), 0) } # LIFECYCLE 0
  def site1(out, n) = n.times { |i| out << Item.new([i], 1) } # LIFECYCLE 1
  def site2(out, n) = n.times { |i| out << Item.new(i.to_s * 20, 2) } # LIFECYCLE 2
  def site3(out, n) = n.times { |_| out << Item.new(nil, 3) } # LIFECYCLE 3

  def lines
    @lines ||= Array.new(4) { |k| line_of("# LIFECYCLE #{k}", __FILE__) }
  end

  def start_model
    Heapscope.start(sample_every: 1, max_overhead: nil)
    @generation = (@generation || 0) + 1
    { kept: Array.new(4) { [] }, allocated: Array.new(4, 0), generation: @generation }
  end

  # The truth is what the GC kept: the model's kept objects, plus the few that a conservative scan of
  # the machine stack can keep alive after the model let go of them. Objects from before a restart are
  # alive but no longer tracked, so they are told apart by generation. (Not with an ObjectSpace::WeakMap:
  # compaction corrupts those on Ruby 3.1.2, bug 19529.)
  def check(model, log)
    prof = heap_profile(gc: true)
    alive = ObjectSpace.each_object(Item).select { |o| o.generation == model[:generation] }
    4.times do |k|
      truth = alive.select { |o| o.site == k }
      live = sum_at(prof, "inuse_objects", lines[k], klass: "TestCoreLifecycle::Item")
      allocated = sum_at(prof, "alloc_objects", lines[k], klass: "TestCoreLifecycle::Item")
      assert_equal truth.size, live, "live at site #{k} after: #{log.join(", ")}"
      assert_operator live, :>=, model[:kept][k].size
      assert_operator live, :<=, model[:kept][k].size + 64, "released objects must go (a few may stay reachable from the stack)"
      assert_equal model[:allocated][k], allocated, "allocated at site #{k} after: #{log.join(", ")}"
      bytes = truth.sum { |o| ObjectSpace.memsize_of(o) }
      assert_equal bytes, sum_at(prof, "inuse_space", lines[k], klass: "TestCoreLifecycle::Item"), "bytes at site #{k}"
    end
    assert_equal 0, Heapscope.stats[:invalid_records]
    assert_equal 0, Heapscope.stats[:stale_records]
  end

  def test_random_lifecycles_match_the_model
    SEQUENCES.times do |seed|
      rng = Random.new(seed)
      log = ["seed #{seed}"]
      model = start_model
      OPS.times do
        case rng.rand(10)
        when 0, 1, 2
          k = rng.rand(4)
          n = rng.rand(1..60)
          keep = rng.rand < 0.6
          made = []
          in_finished_thread { send("site#{k}", made, n) }
          made.each { |o| o.generation = model[:generation] }
          model[:kept][k].concat(made) if keep
          made = nil
          model[:allocated][k] += n
          log << "alloc(#{k}, #{n}, #{keep ? "keep" : "drop"})"
        when 3
          k = rng.rand(4)
          n = rng.rand(0..model[:kept][k].size)
          # A new array (Array#shift would keep the shifted elements reachable through its shared buffer).
          model[:kept][k] = model[:kept][k].drop(n)
          log << "release(#{k}, #{n})"
        when 4 then GC.start(full_mark: false); log << "minor gc"
        when 5 then GC.start; log << "major gc"
        when 6 then GC.compact; log << "compact"
        when 7 then Heapscope.reset; model[:allocated] = Array.new(4, 0); log << "reset"
        when 8
          Heapscope.stop
          kept = model[:kept]
          model = start_model
          model[:kept] = Array.new(4) { [] } # objects from before the restart are not tracked
          kept.clear
          log << "restart"
        when 9 then check(model, log); log << "profile"
        end
      end
      check(model, log)
      Heapscope.stop
    end
  end
end
