# frozen_string_literal: true

# The profilers bench/run compares. Each entry knows how to start itself inside a bench cell (a fresh
# `ruby` process), how to finish (stop, and produce its result the way a user would get it), and a note
# on what exactly is measured. Requires happen inside `start`, so bench/run can list profilers without
# loading any of them.
#
# `finish` returns a Hash of facts worth printing (samples taken, effective settings) or {}.
module Bench
  module Profilers
    Profiler = Struct.new(:name, :gem, :note, :start, :finish, keyword_init: true)

    @all = {}

    class << self
      attr_reader :all

      def define(name, gem: nil, note:, start:, finish: ->(_ctx) { {} })
        @all[name.to_s] = Profiler.new(name: name.to_s, gem: gem, note: note, start: start, finish: finish)
      end

      def fetch(name)
        @all.fetch(name.to_s) { raise ArgumentError, "unknown profiler #{name.inspect} (known: #{@all.keys.join(", ")})" }
      end
    end

    define :none, note: "no profiler (the baseline of every ratio)", start: ->(_ctx) {}

    define :emptyhook,
           note: "an enabled RUBY_INTERNAL_EVENT_NEWOBJ tracepoint whose callback is empty (bench/emptyhook)",
           start: ->(_ctx) { HeapscopeBench.empty_hook_enable },
           finish: ->(_ctx) { HeapscopeBench.empty_hook_disable && {} }

    # The stats worth printing next to a cell (docs/configuration.md says what each one is). The windowed
    # ones only where the mode is windowed: realized_share is the hook-on share of (virtual) time,
    # hook_on_share of allocations, weight_scale their correction of the weights; sync_jobs are the
    # postponed jobs that switch the hook (Ruby 3.3+), ticker_wakeups the timer thread's, mean_window_ns
    # the mean window the schedule has retuned itself to, own_ns heapscope's own time (left out of virtual
    # time), hook_cost_ns what the hook was measured to add to one allocation.
    heapscope_keep = %i[sampling current_sample_every max_overhead sampling_overhead samples_taken tracked_objects stacks
                        dropped skipped_own].freeze
    heapscope_windowed_keep = %i[window_share realized_share hook_on_share weight_scale windows_opened sync_jobs
                                 ticker_wakeups ticker_triggers schedule_flips mean_window_ns hook_cost_ns own_ns
                                 gc_registrations_deferred mean_window_share window_share_changes hook_cost_full_share].freeze
    heapscope_finish = lambda do |_ctx|
      Heapscope.profile # what a user asks for at the end: one heap profile
      stats = Heapscope.stats
      Heapscope.stop
      return {} unless stats.is_a?(Hash)

      keep = heapscope_keep + (stats[:sampling].to_s == "windowed" ? heapscope_windowed_keep : [])
      stats.select { |k, v| keep.include?(k.to_sym) && !v.nil? }.transform_values { |v| v.is_a?(Float) ? v.round(4) : v }
    end
    # Fixed rates: the overhead budget (max_overhead, on by default) is turned off, or it would lower
    # sample_every 1 and 100 by itself and the rows would no longer mean what their names say. These rows
    # keep the allocation hook on for every allocation (sampling: :always, what heapscope did before
    # windowed sampling); heapscope_windowed and heapscope_default are the windowed mode.
    [1, 100, 1000].each do |n|
      define "heapscope_#{n}", gem: "heapscope",
                               note: "Heapscope.start(sample_every: #{n}, sampling: :always, max_overhead: nil); Heapscope.profile at the end",
                               start: lambda { |_ctx|
                                 require "heapscope"
                                 opts = { sample_every: n }
                                 opts[:max_overhead] = nil if Heapscope::START_DEFAULTS.key?(:max_overhead)
                                 opts[:sampling] = :always if Heapscope::START_DEFAULTS.key?(:sampling)
                                 Heapscope.start(**opts)
                               },
                               finish: heapscope_finish
    end
    # The focused hook (Heapscope.start(focus:)): every allocation's class is looked up in the focus table
    # (20 classes here, none of which the workloads allocate, so the cost measured is the lookup's).
    define :heapscope_focus20, gem: "heapscope",
                               note: "heapscope_1000 with focus: 20 classes at 1 in 100 (the lookup on every allocation)",
                               start: lambda { |_ctx|
                                 require "heapscope"
                                 focus = (1..20).to_h { |i| [Object.const_set("HeapscopeBenchFocus#{i}", Class.new), 100] }
                                 Heapscope.start(sample_every: 1000, sampling: :always, max_overhead: nil, focus: focus)
                               },
                               finish: heapscope_finish
    define :heapscope_windowed, gem: "heapscope",
                                note: "Heapscope.start(sample_every: 1000, sampling: :windowed, max_overhead: nil): the hook on " \
                                      "for a random window_share (4%) of the time, switched by a timer thread's postponed jobs " \
                                      "(Ruby 3.3+) and at GCs (Ruby 3.1: at GCs only)",
                                start: lambda { |_ctx|
                                  require "heapscope"
                                  Heapscope.start(sample_every: 1000, sampling: :windowed, max_overhead: nil)
                                },
                                finish: heapscope_finish
    define :heapscope_budget, gem: "heapscope",
                              note: "Heapscope.start(window_share: :budget): the same as heapscope_default since 2026-12-07 (kept so older tables compare)",
                              start: ->(_ctx) { require "heapscope"; Heapscope.start(window_share: :budget) },
                              finish: heapscope_finish
    define :heapscope_default, gem: "heapscope",
                               note: "Heapscope.start with no options (windowed sampling, sample_every 1000, the adaptive overhead budget, which also sets the window share)",
                               start: ->(_ctx) { require "heapscope"; Heapscope.start },
                               finish: heapscope_finish

    define :memory_profiler, gem: "memory_profiler",
                             note: "MemoryProfiler.start/stop: trace_object_allocations, GC disabled while it runs; " \
                                   "the report is built in `stop` (finish column)",
                             start: ->(ctx) { require "memory_profiler"; ctx[:mp] = MemoryProfiler::Reporter.new.tap(&:start) },
                             finish: lambda { |ctx|
                               r = ctx[:mp].stop
                               { allocated: r.total_allocated, retained: r.total_retained }
                             }

    [1, 1000].each do |n|
      define "stackprof_#{n}", gem: "stackprof",
                               note: "StackProf.start(mode: :object, interval: #{n}) (allocation samples, no liveness)",
                               start: ->(_ctx) { require "stackprof"; StackProf.start(mode: :object, interval: n, raw: false) },
                               finish: lambda { |_ctx|
                                 StackProf.stop
                                 r = StackProf.results
                                 { samples: r[:samples] }
                               }
    end

    define :vernier, gem: "vernier",
                     note: "Vernier.start_profile(mode: :retained)",
                     start: ->(_ctx) { require "vernier"; Vernier.start_profile(mode: :retained) },
                     finish: ->(_ctx) { Vernier.stop_profile && {} }

    # datadog: no agent. Profiles go to a transport that writes them to a local file; tracing, telemetry,
    # remote configuration and crash tracking are off so the only work is the profiler's. The gem itself
    # refuses heap profiling on Ruby < 3.1.4 (WeakMap bug 19529): `datadog` measures what a user of this
    # Ruby gets (allocation profiling + its always-on CPU/wall sampler); `datadog_heap` bypasses the
    # version check (bench only: no compaction happens in these workloads) to measure heap tracking.
    datadog_start = lambda do |ctx, force_heap|
      require "datadog"
      require "logger"
      if force_heap
        Datadog::Profiling::Component.define_singleton_method(:enable_heap_profiling?) { |_s, alloc, _r, _l| alloc }
      end
      out = File.join(ctx[:tmpdir], "datadog-#{Process.pid}.pprof")
      sink = Object.new
      sink.define_singleton_method(:export) do |flush|
        File.binwrite(out, flush.encoded_profile._native_bytes)
        true
      end
      Datadog.configure do |c|
        c.logger.instance = Logger.new(File.join(ctx[:tmpdir], "datadog.log"))
        c.diagnostics.startup_logs.enabled = false
        c.tracing.enabled = false
        c.telemetry.enabled = false
        c.remote.enabled = false if c.respond_to?(:remote)
        c.profiling.enabled = true
        c.profiling.allocation_enabled = true
        c.profiling.advanced.experimental_heap_enabled = true
        c.profiling.exporter.transport = sink
      end
      Datadog::Profiling.wait_until_running(timeout_seconds: 10)
      ctx[:datadog_out] = out
      ctx[:datadog_sink] = sink
    end
    # finish: read the sampler's stats, serialize one profile (what the scheduler would upload; its 1 s
    # minimum-duration rule is lifted so a short cell still produces one), write it, shut down.
    datadog_finish = lambda do |ctx|
      profiler = Datadog.send(:components).profiler
      stats = profiler.send(:worker).stats
      recorder = ObjectSpace.each_object(Datadog::Profiling::StackRecorder).first
      heap = recorder&.stats&.dig(:heap_recorder_snapshot)
      exporter = profiler.send(:scheduler).send(:exporter)
      exporter.instance_variable_set(:@minimum_duration_seconds, 0)
      flush = exporter.flush
      ctx[:datadog_sink].export(flush) if flush
      Datadog.shutdown!
      {
        samples: stats[:allocation_sampled],
        effective_sample_every: stats[:allocation_effective_sample_rate].to_f.positive? ? (1 / stats[:allocation_effective_sample_rate]).round : nil,
        tracked_objects: heap && heap[:num_object_records], # nil (left out) when heap profiling is off
        profile_bytes: (File.size(ctx[:datadog_out]) rescue 0),
      }.compact
    end
    define :datadog, gem: "datadog",
                     note: "datadog profiling, allocation_enabled + experimental_heap_enabled (the gem turns heap off " \
                           "on Ruby < 3.1.4); CPU/wall sampler on as shipped; profile to a local file",
                     start: ->(ctx) { datadog_start.call(ctx, false) }, finish: datadog_finish
    define :datadog_heap, gem: "datadog",
                          note: "as datadog, with the gem's Ruby-version check for heap profiling bypassed (bench only)",
                          start: ->(ctx) { datadog_start.call(ctx, true) }, finish: datadog_finish
  end
end
