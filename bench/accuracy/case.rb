# frozen_string_literal: true

require "objspace"

# The accuracy suite's cases (bench/accuracy/README.md). A case is a workload whose truth is known; each
# file in cases/ defines one and registers it:
#
#   class Accuracy::Cases::Fifo < Accuracy::SyntheticCase
#     register "fifo", "a FIFO cache with churn"
#     def setup = ...   # before Heapscope.start: inputs, warm-up (not profiled)
#     def work = ...    # the profiled code; what must stay alive stays in instance variables
#   end
#
# SyntheticCase knows its truth by construction (sites declared with `site`); LibraryCase runs a gem from
# the registry and gets its truth from a separate process that traces allocations (trace.rb).
module Accuracy
  TYPES = %w[alloc_objects alloc_space inuse_objects inuse_space].freeze
  # The object count each type's sample count comes from (a byte site is judged by its objects).
  OBJECTS_OF = { "alloc_objects" => "alloc_objects", "alloc_space" => "alloc_objects",
                 "inuse_objects" => "inuse_objects", "inuse_space" => "inuse_objects" }.freeze

  # What heapscope counts for an object it never measured (lib/heapscope.rb's SLOT_SIZE): one slot.
  SLOT_SIZE = GC::INTERNAL_CONSTANTS[:RVALUE_SIZE] || GC::INTERNAL_CONSTANTS[:BASE_SLOT_SIZE] || 40

  # Core classes and the census's names of their types (Accuracy.builtin_type); the first match wins.
  CORE_TYPES = [[String, "T_STRING"], [Array, "T_ARRAY"], [Hash, "T_HASH"], [Thread, "T_DATA"], [Fiber, "T_DATA"],
                [Struct, "T_STRUCT"], [Object, "T_OBJECT"]].freeze

  # Site classes live here, so a profile's class labels name them (Accuracy::Sites::FifoValue).
  module Sites; end
  module Cases; end

  @cases = {}

  class << self
    attr_reader :cases

    # Loads every case file, in name order (the order of the tables).
    def load_cases
      Dir[File.join(__dir__, "cases", "*.rb")].sort.each { |f| require f }
      @cases
    end

    def fetch_case(name)
      load_cases if @cases.empty?
      @cases.fetch(name) { raise ArgumentError, "unknown case #{name.inspect} (known: #{@cases.keys.join(", ")})" }
    end

    def site_key(file, line)
      "#{file}:#{line}"
    end

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end

    # The builtin type (the census's T_STRING...) of a class's instances, from its nearest core ancestor.
    def builtin_type(klass)
      CORE_TYPES.find { |k, _| klass <= k }&.last
    end
  end

  # What every case shares: its name and summary, the size scale (1.0 full, smaller with --quick) and the
  # notes it reports (facts such as GCs per run or lifetimes in GC intervals, printed above its table).
  class Case
    class << self
      attr_reader :name_, :summary

      def register(name, summary)
        @name_ = name
        @summary = summary
        Accuracy.cases[name] = self
      end

      # Whether the spread ratio to :always is a criterion (default) or only reported.
      def judge_ratio(judged = nil)
        @judge_ratio = judged unless judged.nil?
        @judge_ratio.nil? ? true : @judge_ratio
      end
    end

    attr_reader :scale, :notes

    def initialize(scale)
      @scale = scale
      @notes = {}
    end

    def name
      self.class.name_
    end

    # n scaled for --quick (at least 1).
    def scaled(n)
      [(n * @scale).round, 1].max
    end

    def setup; end

    def work
      raise NotImplementedError
    end

    # Counts GCs and allocations of work, for the notes (GC intervals are what lifetimes are measured in).
    def measure_work
      gc0 = GC.count
      a0 = GC.stat(:total_allocated_objects)
      t0 = Accuracy.now
      c0 = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
      work
      @notes["work_s"] = (Accuracy.now - t0).round(3)
      @notes["work_cpu_s"] = (Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - c0).round(3)
      @notes["gcs"] = GC.count - gc0
      @notes["allocations"] = GC.stat(:total_allocated_objects) - a0
      @notes["gc_interval"] = @notes["allocations"] / [@notes["gcs"], 1].max
    end

    # A lifetime in allocations as GC intervals, for the notes.
    def intervals(allocations)
      (allocations.to_f / [@notes.fetch("gc_interval", 1), 1].max).round(2)
    end
  end

  # A case that counts its own truth. Each site is a one-line block that allocates exactly one object of
  # the site's own class (a subclass of base), on the block's line: that file:line is the site. Calls
  # count the allocations and their bytes (ObjectSpace.memsize_of once the block returns: the block
  # builds the whole object, whose size must not change later, since heapscope measures an allocation at
  # the first GC after it); after the profile's full GC, ObjectSpace.each_object finds the site's live
  # objects by their class.
  class SyntheticCase < Case
    # The first calls of each site check that it allocates exactly one object.
    CHECKED_CALLS = 64

    # A site's options (all off by default):
    #   shared   threads call make at once (a request app's handlers): make takes a lock, so its counts
    #            and its one-object check see its own call only
    #   by_class the line allocates other objects beside the site's own (Thread.new makes a Thread and
    #            some internals), so the site is read by its class (`top --label class=...`) and the
    #            one-object check is skipped
    #   exact    heapscope records the site's objects whole (Threads and Fibers: exact_threads), so no
    #            run may read it above 2x its truth (issue 31's acceptance)
    class Site
      attr_reader :name, :file, :line, :klass, :allocs, :bytes, :bad_checks, :options

      def initialize(name, klass, block, options)
        @name = name
        @klass = klass
        @block = block
        @options = options
        @file, @line = block.source_location
        @lock = Mutex.new if options[:shared]
        @allocs = 0
        @bytes = 0
        @checks = options[:by_class] ? CHECKED_CALLS : 0
        @bad_checks = 0
      end

      def key
        Accuracy.site_key(@file, @line)
      end

      # Allocates one object at the site's line (the block gets the site's class and arg). One fixed
      # argument: a splat would allocate an Array per call.
      def make(arg = nil)
        return @lock.synchronize { make_one(arg) } if @lock

        make_one(arg)
      end

      private

      def make_one(arg)
        if @checks < CHECKED_CALLS
          @checks += 1
          before = GC.stat(:total_allocated_objects)
          obj = @block.call(@klass, arg)
          @bad_checks += 1 if GC.stat(:total_allocated_objects) - before != 1
        else
          obj = @block.call(@klass, arg)
        end
        @allocs += 1
        @bytes += ObjectSpace.memsize_of(obj)
        obj
      end
    end

    def sites
      @site_table ||= {}
    end

    # Declares a site: site(:fifo_value, String) { |k, n| k.new << FILL[n] }; options: Site's.
    def site(name, base = Object, shared: false, by_class: false, exact: false, &block)
      const = name.to_s.split("_").map(&:capitalize).join
      klass = if Accuracy::Sites.const_defined?(const, false) then Accuracy::Sites.const_get(const, false)
              else Accuracy::Sites.const_set(const, Class.new(base))
              end
      sites[name] = Site.new(name, klass, block, { shared: shared, by_class: by_class, exact: exact })
    end

    # {site key => class name} of the sites read by their class (Site's by_class).
    def label_sites
      sites.values.select { |s| s.options[:by_class] }.to_h { |s| [s.key, s.klass.name] }
    end

    # {site key => {"class" =>, "type" =>, "exact" =>}}: what the census checks need of each site.
    def site_info
      sites.values.to_h do |s|
        [s.key, { "class" => s.klass.name, "type" => Accuracy.builtin_type(s.klass), "exact" => s.options[:exact] }]
      end.merge(extra_info)
    end

    # The census types of the sites a case counts its own way; {site key => {"types" => [T_NAME, ...]}}.
    def extra_info
      {}
    end

    def files
      sites.values.map(&:file).uniq
    end

    # {site key => {type => value}} after the profile's full GC; names: {site key => site name}.
    def truth
      live = Hash.new { |h, k| h[k] = [0, 0] }
      by_class = sites.values.to_h { |s| [s.klass, s] }
      by_class.keys.group_by(&:superclass).each_key do |base|
        ObjectSpace.each_object(base) do |obj|
          s = by_class[obj.class] or next
          l = live[s]
          l[0] += 1
          l[1] += ObjectSpace.memsize_of(obj)
        end
      end
      bad = sites.values.select { |s| s.bad_checks > 2 }
      @notes["truth_problems"] = bad.map { |s| "#{s.name}: #{s.bad_checks} of #{CHECKED_CALLS} calls allocated other than 1 object" } if bad.any?
      sites.values.to_h do |s|
        l = live.fetch(s, [0, 0])
        [s.key, { "alloc_objects" => s.allocs, "alloc_space" => s.bytes, "inuse_objects" => l[0], "inuse_space" => l[1] }]
      end.merge(extra_truth)
    end

    # Sites a case counts its own way (json_parse); {site key => {type => value}}.
    def extra_truth
      {}
    end

    def site_names
      sites.values.to_h { |s| [s.key, s.name.to_s] }.merge(extra_names)
    end

    def extra_names
      {}
    end
  end

  # A case that runs a gem from the registry. Its work is iterations of one deterministic step; the truth
  # comes from trace.rb, which runs the same setup and steps in another process under
  # ObjectSpace.trace_object_allocations. Sites are allocation lines inside the gems' own files.
  class LibraryCase < Case
    def gems
      raise NotImplementedError
    end

    def iterations
      raise NotImplementedError
    end

    def step(_index)
      raise NotImplementedError
    end

    def work
      iterations.times { |i| step(i) }
    end

    # The gems' directories (a site is in one of them).
    def files
      gems.map { |g| File.join(Gem.loaded_specs.fetch(g).full_gem_path, "") }
    end

    def truth
      nil
    end

    def site_names
      {}
    end

    def label_sites
      {}
    end

    # A library site's type comes from its traced truth (trace.rb), not from here.
    def site_info
      {}
    end

    # Loads the bundle's bench group (where the Gemfile lists the gems), then the gems.
    def self.require_gems(*libs)
      Accuracy.require_group(:bench, libs)
    end
  end

  # Loads a group of the project's Gemfile (bench: the gems; surfaces: rack and puma for the request
  # app), then the libraries, with a LoadError that says how to install them.
  def self.require_group(group, libs)
    require "bundler"
    ENV["BUNDLE_GEMFILE"] ||= File.expand_path("../../Gemfile", __dir__)
    Bundler.setup(:default, group)
    libs.each { |l| require l }
  rescue LoadError, Bundler::GemNotFound => e
    raise LoadError, "#{e.message.lines.first.strip} (install the Gemfile's #{group} group: bench/accuracy/run does, unless --no-setup)"
  end
end
