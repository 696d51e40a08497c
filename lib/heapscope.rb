# frozen_string_literal: true

require_relative "heapscope/version"
require_relative "heapscope/atomic_write"
require_relative "heapscope/internal"
begin
  # The C extension, Heapscope::Native. The prebuilt gem holds one build per Ruby minor
  # (lib/heapscope/3.4/heapscope.so: rakelib/native_gem.rake); a build from source, one beside this file.
  prebuilt = "heapscope/#{RUBY_VERSION[/\A\d+\.\d+/]}/heapscope"
  if File.exist?(File.join(__dir__, "#{prebuilt}.#{RbConfig::CONFIG["DLEXT"]}"))
    require_relative prebuilt
  else
    require_relative "heapscope/heapscope"
  end
rescue LoadError => e
  builds = Dir[File.join(__dir__, "heapscope", "*", "heapscope.#{RbConfig::CONFIG["DLEXT"]}")].map { |path| File.basename(File.dirname(path)) }
  unless builds.empty?
    raise LoadError, "heapscope: this prebuilt gem holds its C extension for Ruby #{builds.sort.join(", ")}, not for " \
                     "#{RUBY_VERSION} (#{e.message}). Install the source gem, which compiles it: `gem install heapscope-profiler " \
                     "--platform ruby`, or in a Gemfile `gem \"heapscope-profiler\", force_ruby_platform: true`. See README.md, Install."
  end
  # A checkout used as a Bundler `path:` gem, or a copy of lib/ alone, has no compiled extension:
  # say what is missing and how to build it, not only the path Ruby could not open.
  raise LoadError, "heapscope: its C extension (heapscope/heapscope.so) is not built for Ruby #{RUBY_VERSION} " \
                   "(#{e.message}). In a checkout run `bundle exec rake compile`; to install it as a gem, " \
                   "`gem build heapscope-profiler.gemspec && gem install ./heapscope-profiler-#{Heapscope::VERSION}.gem` (Bundler does " \
                   "not compile `path:` gems). The build needs a C compiler, Ruby's headers and zlib's. See README.md, Install."
end

# heapscope: which lines of code allocated the objects that are still alive, how many, how big, how old.
#
#   Heapscope.start(sample_every: 1000)
#   ...
#   File.binwrite("heap.pb.gz", Heapscope.profile(gc: true))  # or Heapscope.write("heap.pb.gz")
#
# Profiles are gzipped pprof (profile.proto) that `go tool pprof`, Pyroscope, Parca and Grafana read.
# This file only validates options and forwards to the C core; docs/configuration.md lists every option.
module Heapscope
  # Raised for calls made in the wrong state (start while running, profile before start).
  class Error < StandardError; end

  START_DEFAULTS = {
    sample_every: 1000,
    max_frames: 400,
    min_age: 1,
    track_sizes: true,
    max_tracked_objects: 1_000_000,
    max_stacks: 100_000,
    max_overhead: 0.01, # off (nil) when sample_every is given and max_overhead is not: see start
    sampling: nil, # :windowed, or :always; nil: :windowed unless sample_every is 1 (see docs/configuration.md)
    window_share: :budget, # windowed: the share of time the hook is on; :budget: the overhead budget sets it
                           # from how densely the program allocates (0.04 without a budget or a ticker)
    label_threads: false, # every sample also labelled thread=<its native thread's name> (labels.rb)
    max_label_sets: 1000, # distinct label sets per process; past it new sets become "(other)"
    show_contents: false, # the operator's consent to show data (Hash keys, String bytes: retainers, examples) to any reader
    census: true, # every profile counts the live heap exactly first (docs/reading-profiles.md, exact totals)
    focus: nil, # { "Quote" => 10, String => 100 }: those classes sampled at their own rate (focus.rb)
    auto_focus: true, # classes whose exact live bytes keep growing get a denser rate (auto_focus.rb)
    exact_threads: true, # Threads and Fibers made from Ruby are recorded whole, never sampled (ThreadWatch)
  }.freeze
  SAMPLING_MODES = %i[windowed always].freeze

  PROFILE_DEFAULTS = { gc: false, type: :heap, min_age: nil }.freeze
  PROFILE_TYPES = %i[heap allocs].freeze
  MAX_FRAMES_LIMIT = 3000
  # The size reported for every object when track_sizes is false: one heap slot.
  SLOT_SIZE = GC::INTERNAL_CONSTANTS[:RVALUE_SIZE] || GC::INTERNAL_CONSTANTS[:BASE_SLOT_SIZE] || 40

  class << self
    # Starts sampling allocations. Raises ArgumentError for a bad option, Heapscope::Error if running.
    #
    # Exact means exact: a sample_every the caller chose is never lowered behind their back, so giving
    # sample_every without max_overhead turns the overhead budget off (sample_every: 1 then records
    # every allocation). The default rate keeps the default budget; max_overhead given explicitly
    # always wins.
    def start(**options)
      config = check_options(options, START_DEFAULTS, "start")
      config[:max_overhead] = nil if options.key?(:sample_every) && !options.key?(:max_overhead)
      check_integer(config, :sample_every, 1, 2**31 - 1)
      check_integer(config, :max_frames, 1, MAX_FRAMES_LIMIT)
      check_integer(config, :min_age, 0, 2**31 - 1)
      check_integer(config, :max_tracked_objects, 1, 2**31 - 1)
      check_integer(config, :max_stacks, 1, 2**31 - 1)
      check_boolean(config, :label_threads)
      check_integer(config, :max_label_sets, 1, 1_000_000)
      check_boolean(config, :track_sizes)
      check_boolean(config, :show_contents)
      check_boolean(config, :census)
      check_boolean(config, :auto_focus)
      check_boolean(config, :exact_threads)
      check_fraction(config, :max_overhead)
      config[:sampling], sampling_reason = check_sampling(config)
      check_fraction(config, :window_share, nil_ok: false) unless config[:window_share] == :budget
      focus = Focus.check(config[:focus])
      if running?
        raise Error, "heapscope is already running (call Heapscope.stop first, or check Heapscope.running?)"
      end
      if defined?(Ractor) && Ractor.count > 1
        raise Error, "heapscope cannot start while other Ractors run (#{Ractor.count - 1}): it does not support Ractors"
      end

      # Everything heapscope keeps for the run is made before sampling starts, so none of it is the
      # program's (the profile would show heapscope's own objects otherwise).
      strata = focus.map { |klass, rate, _| [klass, rate] } + auto_focus_slots(config)
      # Automatic focus reads each profile's census: none without it.
      auto_focus = if config[:auto_focus] && config[:census]
                     # (Threads and Fibers recorded whole need no denser rate.)
                     AutoFocus.new(first_index: focus.size, rate: auto_focus_rate(config),
                                   taken: focus.map { |_, _, name| name } + (config[:exact_threads] ? %w[Thread Fiber] : []),
                                   resolve: Focus.method(:lookup))
                   end
      Native._start(config[:sample_every], config[:max_frames], config[:min_age], config[:track_sizes],
                    config[:max_tracked_objects], config[:max_stacks], SLOT_SIZE,
                    config[:max_overhead]&.to_f, config[:sampling] == :windowed, config[:window_share] == :budget ? 0.0 : config[:window_share].to_f,
                    config[:label_threads], config[:max_label_sets], strata, config[:exact_threads])
      @focus = focus
      @auto_focus = auto_focus
      internal { Focus.watch(focus) } # the TracePoint is heapscope's too
      @config = config
      @sampling_reason = sampling_reason
      true
    end

    # Stops sampling and forgets every tracked object. Returns false when it was not running.
    def stop
      Focus.unwatch
      Native._stop
    end

    def running?
      Native._running?
    end

    # Whether the operator allowed heapscope to show contents of the application's objects (Hash keys
    # in retainers and examples, String bytes in examples) to whoever reads its reports and endpoints:
    # the show_contents start option (HEAPSCOPE_SHOW_CONTENTS=1, config.heapscope.show_contents). Off
    # by default.
    def show_contents?
      running? && @config&.fetch(:show_contents, false) == true
    end

    # The settings of the current run (nil before the first start).
    def config
      @config
    end

    # Returns a gzipped pprof profile (a binary String).
    #   gc:      run a full GC first, so the profile reflects what is really alive now.
    #   type:    :heap (viewers show inuse_space) or :allocs (default sample type alloc_space).
    #   min_age: leave out objects that survived fewer GCs than this (default: the start option).
    #
    # Building it allocates (the String, the decoded options) on the caller's thread: that is
    # heapscope's work, so it runs excluded from sampling (Heapscope.internal).
    def profile(**options)
      internal do
        opts = check_profile_options(options)
        GC.start(full_mark: true, immediate_sweep: true) if opts[:gc] && running?
        # Raises Heapscope::Error when not running, saying why (never started, stopped, or disabled by
        # the fail-safe after an internal error).
        # The memory breakdown's raw figures ride in the profile as a comment (memory.rb), and so do
        # the focused classes' rates (focus.rb).
        Focus.resolve_pending(@focus) if @focus && running?
        focus = running? ? focus_comments : ""
        bytes = Native._profile(opts[:type] == :allocs, opts[:min_age] || @config&.fetch(:min_age) || 0,
                                "#{Memory.comment(Memory.measure)}\n#{"sampling_reason: #{@sampling_reason}\n" if @sampling_reason}#{focus}",
                                @config&.fetch(:census, true) != false)
        # This profile's census is the next observation of which classes grow (auto_focus.rb): what
        # it changes shows from the next profile on.
        @auto_focus&.observe(Native._last_census, Process.clock_gettime(Process::CLOCK_MONOTONIC)) if running?
        bytes
      end
    end

    # Writes profile(**options) to path atomically (temp file in the same directory, then rename),
    # so a reader never sees a partial file. Returns path. Excluded from sampling, as profile is.
    def write(path, **options)
      internal { Heapscope.write_atomically(path.to_s, profile(**options)) }
    end

    # Counters of the recorder (a Hash with Symbol keys; see docs/configuration.md#stats), and, when
    # the no-code-change surfaces run (heapscope/auto), theirs under :surfaces.
    def stats
      internal { stats_of_this_run }
    end

    # Heapscope.stats' work, excluded from sampling (heapscope's own allocations, not the program's).
    def stats_of_this_run
      stats = Native._stats
      # Why the default mode was not the usual one (only where that needs saying: Ruby 4.1+, ZJIT).
      stats[:sampling_reason] = @sampling_reason if @sampling_reason && stats[:running]
      stats[:focus] = focus_stats if stats[:running] && @focus&.any?
      stats[:auto_focus] = auto_focus_stats if stats[:running] && @auto_focus
      stats[:surfaces] = Auto.stats if defined?(Auto) && Auto.config
      stats
    end
    private :stats_of_this_run

    # Who keeps site's sampled live objects alive: paths from a GC root, one per shape with a count
    # (lib/heapscope/retainers.rb). site is FILE:LINE as `heapscope top` prints it; options limit: (3),
    # time_limit: seconds (1.0), max_memory: the walk's tables ("256M"), keys: (show_contents?).
    # Pauses the application for the walk, in slices.
    def retainers(site, **options)
      Retainers.find(site, **options)
    end

    # What site's sampled live objects hold: the max (5) oldest, each with class, size, age and a
    # bounded preview (lib/heapscope/examples.rb); String bytes and Hash keys only with show_contents.
    # No method of the application's objects runs.
    def examples(site, max: Examples::DEFAULT_MAX)
      Examples.find(site, max: max)
    end

    # Forgets the allocation counts (alloc_* values restart from zero); live objects stay tracked.
    def reset
      Native._reset
    end

    private

    # Each focused class: its name, the rate asked for and in force, its samples, and whether it is
    # defined yet (a pending name is looked for again at each profile).
    def focus_stats
      Native._focus_stats.first(@focus.size).zip(@focus).map do |(every, current, samples), (klass, _rate, name)|
        { class: name, sample_every: every, current_sample_every: current, samples: samples, pending: klass.nil? }
      end
    end

    # Automatic focus: the classes it focuses now (with their samples so far) and its changes.
    def auto_focus_stats
      stats = Native._focus_stats
      active = @auto_focus.active.map do |name, index|
        every, current, samples = stats[index]
        { class: name, sample_every: every, current_sample_every: current, samples: samples }
      end
      { active: active, changes: @auto_focus.log }
    end

    # The focus comment lines of a profile: the operator's classes, then automatic focus's.
    def focus_comments
      text = @focus&.any? ? Focus.comments(@focus) : +""
      return text unless @auto_focus

      stats = Native._focus_stats
      @auto_focus.active.each do |name, index|
        text << Focus.line(stats[index], "auto", name)
      end
      text + @auto_focus.comments
    end

    # The strata Native._start keeps for automatic focus (no class until a suspect comes).
    def auto_focus_slots(config)
      config[:auto_focus] && config[:census] ? Array.new(AutoFocus::SLOTS) { [nil, auto_focus_rate(config)] } : []
    end

    def auto_focus_rate(config)
      [config[:sample_every] / AutoFocus::DENSER, 1].max
    end

    def check_options(options, defaults, method)
      unknown = options.keys - defaults.keys
      unless unknown.empty?
        raise ArgumentError, "Heapscope.#{method}: unknown option #{unknown.map(&:inspect).join(", ")} " \
                             "(known: #{defaults.keys.join(", ")})"
      end
      defaults.merge(options)
    end

    def check_integer(config, key, min, max)
      value = config[key]
      return if value.is_a?(Integer) && value >= min && value <= max

      raise ArgumentError, "#{key} must be an Integer from #{min} to #{max}, got #{value.inspect}"
    end

    def check_boolean(config, key)
      value = config[key]
      return if value == true || value == false

      raise ArgumentError, "#{key} must be true or false, got #{value.inspect}"
    end

    # nil disables what the option bounds (when nil_ok).
    def check_fraction(config, key, nil_ok: true)
      value = config[key]
      return if (nil_ok && value.nil?) || (value.is_a?(Numeric) && value.real? && value > 0 && value <= 1)

      what = key == :window_share ? "the fraction of time the allocation hook is on" : "a fraction of run time"
      also = nil_ok ? " or nil" : key == :window_share ? " or :budget" : ""
      raise ArgumentError, "#{key} must be a number above 0 and at most 1 (#{what})#{also}, got #{value.inspect}"
    end

    # [the sampling mode to use, why where that needs saying (else nil)]: default_sampling's choice when
    # none is given; a mode given explicitly is kept where this Ruby supports it.
    def check_sampling(config)
      mode = config[:sampling]
      return default_sampling(config[:sample_every], RUBY_VERSION, zjit_enabled?) if mode.nil?

      unless SAMPLING_MODES.include?(mode)
        raise ArgumentError, "sampling must be one of #{SAMPLING_MODES.map(&:inspect).join(", ")} (or nil for the default), got #{mode.inspect}"
      end
      if mode == :windowed && !Native::WINDOWED_SUPPORTED
        raise ArgumentError, "sampling: :windowed is not supported on Ruby #{RUBY_VERSION} (it registers hooks " \
                             "inside the GC, which needs rb_gc_disable_no_rest); use sampling: :always"
      end
      if mode == :windowed && ruby_at_least?(RUBY_VERSION, WINDOWED_UNVERIFIED_FROM)
        raise ArgumentError, "sampling: :windowed is not supported on Ruby #{RUBY_VERSION}: #{WINDOWED_UNVERIFIED_WHY}; " \
                             "use sampling: :always"
      end
      [mode, nil]
    end

    # The mode a start without sampling: gets, and why when it is not the usual one (else nil): windowed,
    # except that sample_every: 1 (every allocation) needs the hook on for every allocation, Rubies where
    # windows cannot open (see Native::WINDOWED_SUPPORTED) or can change only at GCs (Ruby 3.1: no
    # Native::WINDOWED_TICKER, so a short run may see no window at all) sample always, and so does Ruby
    # 4.1+, where windows are not verified (WINDOWED_UNVERIFIED_WHY) and ZJIT would pay for them
    # (ZJIT_SAMPLING_REASON). Depends only on its arguments, so every Ruby's choice is tested on any Ruby.
    def default_sampling(sample_every, ruby_version, zjit)
      return [:always, nil] if sample_every == 1 || !Native::WINDOWED_SUPPORTED || !Native::WINDOWED_TICKER
      return [:windowed, nil] unless ruby_at_least?(ruby_version, WINDOWED_UNVERIFIED_FROM)

      [:always, zjit ? ZJIT_SAMPLING_REASON : "always, not windowed: #{WINDOWED_UNVERIFIED_WHY}"]
    end

    # ZJIT on Ruby 4.1+ compiles allocations inline only while no allocation hook is on, and each time one
    # is switched on it discards that code (an exit to the interpreter; after 4 versions a method is not
    # recompiled). Windows switch the hook on many times a second, so hot allocating methods fall back to
    # the interpreter's speed: more than the hook kept on costs (docs/architecture.md, ZJIT). ZJIT in 4.0
    # has no inline allocation. Checked at start: ZJIT switched on later (RubyVM::ZJIT.enable) is not seen.
    ZJIT_SAMPLING_REASON = "always, not windowed: ZJIT is enabled, and it discards its compiled allocations " \
                           "each time a window switches the allocation hook on"

    # Windowed sampling registers a GC hook from inside the GC; on a 4.1-dev snapshot (per-Ractor GC) that
    # aborted the process at its first GC (docs/architecture.md). Until a 4.1 release is checked, 4.1+
    # samples always: a profiler that can abort the application is worse than one that costs more.
    WINDOWED_UNVERIFIED_FROM = [4, 1].freeze
    WINDOWED_UNVERIFIED_WHY = "windowed sampling aborted a Ruby 4.1-dev at its first GC and is not yet " \
                              "verified on 4.1"

    def ruby_at_least?(version, minimum)
      (version.split(".").map(&:to_i) <=> minimum) >= 0
    end

    def zjit_enabled?
      defined?(RubyVM::ZJIT) && RubyVM::ZJIT.respond_to?(:enabled?) && RubyVM::ZJIT.enabled? ? true : false
    end

    def check_profile_options(options)
      opts = check_options(options, PROFILE_DEFAULTS, "profile")
      unless PROFILE_TYPES.include?(opts[:type])
        raise ArgumentError, "type must be one of #{PROFILE_TYPES.map(&:inspect).join(", ")}, got #{opts[:type].inspect}"
      end
      check_boolean(opts, :gc)
      check_integer(opts, :min_age, 0, 2**31 - 1) unless opts[:min_age].nil?
      opts
    end
  end
end

module Heapscope
  # Ruby 3.1 cannot disable the GC from inside the GC, so windowed sampling registers nothing there
  # while GC.stress is on (a malloc would start a GC inside the GC): GC.stress= is watched.
  # Switching it on is announced before it takes effect, switching it off after.
  module GCStressWatch
    def stress=(flag)
      Native._gc_stress_changed(true) if flag
      result = super
      Native._gc_stress_changed(false) unless flag
      result
    end
  end

  if Native::WATCH_GC_STRESS
    GC.singleton_class.prepend(GCStressWatch)
    Native._gc_stress_changed(GC.stress ? true : false)
  end
end

module Heapscope
  # Ractors: heapscope does not support them (ext/heapscope/ractors.h says what goes wrong). So the
  # first Ractor.new switches heapscope off, with one warning, before the Ractor runs; Heapscope.start
  # refuses while other Ractors run. (Ractors made another way, such as through a Method taken before
  # heapscope loaded, are caught in the C extension.) Only the main Ractor can have heapscope on, and
  # only it may call Native: inside another Ractor heapscope is already off, and the call would raise
  # Ractor::UnsafeError.
  module RactorWatch
    def new(*args, **kwargs, &block)
      if Ractor.current == Ractor.main && Native._disable_for_ractor
        Kernel.warn("heapscope: a Ractor was started; profiling is off for now (heapscope does not support Ractors)",
                    uplevel: 1)
      end
      super
    end
  end

  Ractor.singleton_class.prepend(RactorWatch) if defined?(Ractor)
end

module Heapscope
  # Threads and Fibers are recorded whole (the exact_threads start option, on by default): a sample of
  # one Thread, standing for a thousand allocations, read as a thousand 1 MiB stacks. ThreadWatch and
  # FiberWatch are C methods (ext/heapscope/exact_threads.h) that call the original and hand what it
  # made to the core; in C so that they add no Ruby frame to anyone's stack.
  Thread.singleton_class.prepend(ThreadWatch)
  Fiber.singleton_class.prepend(FiberWatch)
end


# Everything the running paths use later is loaded now, before Heapscope.start can run: a require
# after start would add heapscope's own objects (ISeqs' strings, constants, the files' tables) to the
# user's profile, and on a user's thread. The surfaces (autostart, Rack and the listener, periodic files,
# Pyroscope, fork), the delta and ?debug=1 readers (pprof, report/sampling). The report commands
# (report/cli and what it loads) are not a running path: they read files, in their own process.
require_relative "heapscope/fork"
require_relative "heapscope/labels"
require_relative "heapscope/memory"
require_relative "heapscope/retainers"
require_relative "heapscope/examples"
require_relative "heapscope/focus"
require_relative "heapscope/auto_focus"
require_relative "heapscope/pprof"
require_relative "heapscope/env_config"
require_relative "heapscope/surfaces/rack"
require_relative "heapscope/surfaces/http_server"
require_relative "heapscope/surfaces/periodic_writer"
require_relative "heapscope/surfaces/dumps"
require_relative "heapscope/surfaces/pyroscope"
require_relative "heapscope/surfaces/autostart"
# Rails loaded first (config/application.rb's order): the Railtie too (lib/heapscope/surfaces/rails.rb).
require_relative "heapscope/surfaces/rails" if defined?(::Rails::Railtie)
