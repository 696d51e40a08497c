# frozen_string_literal: true

require "objspace"

module Accuracy
  # The truth of a LibraryCase, from ObjectSpace's allocation tracing in a process of its own: the same
  # setup and steps as the profiled runs, with every allocation's file:line recorded.
  #
  # Allocations: before each step a full GC, then the GC is disabled for the step, so that after it every
  # object the step allocated is still in the heap (none was freed) and carries the step's GC generation:
  # ObjectSpace.each_object counts them by file:line and measures them there. So an allocation is sized
  # as it is when its step ends, while heapscope sizes it at the first GC after it: the same for objects
  # whose size does not change, not for a String or Hash that grows after that GC (summary.rb does not
  # judge these cases' alloc_space). A T_DATA object counts one slot, as in heapscope (its size is read
  # only at a profile), and if it is still live at the end, its size then.
  # Live: after the last step, a full GC, then every object with a traced file:line, counted and measured.
  # Only lines inside the case's files (the gems' directories) are kept.
  module Trace
    module_function

    # Returns {"truth" => {site key => {type => value}}, "notes" => {...}}.
    def run(kase)
      kase.setup
      prefixes = kase.files
      allocs = Hash.new { |h, k| h[k] = [0, 0] }
      GC.start(full_mark: true, immediate_sweep: true)
      t0 = Accuracy.now
      ObjectSpace.trace_object_allocations_start
      kase.iterations.times do |i|
        GC.start(full_mark: true, immediate_sweep: true)
        generation = GC.count
        GC.disable
        kase.step(i)
        ObjectSpace.each_object do |obj|
          next unless ObjectSpace.allocation_generation(obj) == generation

          key = site_of(obj, prefixes) or next
          a = allocs[key]
          a[0] += 1
          a[1] += data?(obj) ? Accuracy::SLOT_SIZE : ObjectSpace.memsize_of(obj)
        end
        GC.enable
      end
      GC.start(full_mark: true, immediate_sweep: true)
      live = Hash.new { |h, k| h[k] = [0, 0] }
      types = Hash.new { |h, k| h[k] = Hash.new(0) } # {site key => {T_NAME => bytes}}: the site's census types
      ObjectSpace.each_object do |obj|
        key = site_of(obj, prefixes) or next
        l = live[key]
        l[0] += 1
        l[1] += ObjectSpace.memsize_of(obj)
        types[key][type_of(obj)] += ObjectSpace.memsize_of(obj)
        allocs[key][1] += ObjectSpace.memsize_of(obj) - Accuracy::SLOT_SIZE if data?(obj) && allocs.key?(key)
      end
      ObjectSpace.trace_object_allocations_stop
      truth = (allocs.keys | live.keys).to_h do |key|
        a = allocs.fetch(key, [0, 0])
        l = live.fetch(key, [0, 0])
        # Every type the site's live objects are of, the most bytes first: a site of Strings and Arrays
        # is bounded by the two types' exact totals together (census_checks.rb).
        kinds = types[key].sort_by { |t, bytes| [-bytes, t] }.map(&:first)
        [key, { "alloc_objects" => a[0], "alloc_space" => a[1], "inuse_objects" => l[0], "inuse_space" => l[1], "types" => kinds }]
      end
      { "truth" => truth, "notes" => { "trace_s" => (Accuracy.now - t0).round(2), "sites" => truth.size } }
    end

    # Whether obj is a T_DATA.
    def data?(obj)
      type_of(obj) == "T_DATA"
    end

    # The census's name of obj's builtin type (T_STRING...): instances of one class are all of one type,
    # so ObjectSpace.dump is asked once per class.
    def type_of(obj)
      @types ||= {}.compare_by_identity
      klass = obj.class
      @types.fetch(klass) { @types[klass] = "T_#{ObjectSpace.dump(obj)[/"type":"(\w+)"/, 1]}" }
    end

    def site_of(obj, prefixes)
      file = ObjectSpace.allocation_sourcefile(obj) or return nil
      return nil unless prefixes.any? { |p| file.start_with?(p) }

      Accuracy.site_key(file, ObjectSpace.allocation_sourceline(obj))
    end
  end
end
