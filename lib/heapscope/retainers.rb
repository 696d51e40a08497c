# frozen_string_literal: true

require_relative "dumps"

module Heapscope
  # Retainers answers the question after "this line allocated 40 MB that is still alive": who keeps
  # it alive. For a site's sampled live objects it walks the object graph from the VM's roots
  # (retainers.c: breadth first, so each path is a shortest one) and names every hop: the root (a
  # global variable, a constant, a thread's stack, the VM), each object's class, and the edge to the
  # next (instance variable, constant, class variable, Hash key, Array index, a block's captured
  # variables). Paths of the same shape (the same classes and edges, whatever the keys and indexes)
  # are shown once with a count.
  #
  #   report = Heapscope.retainers("app/cache.rb:12", limit: 3)
  #   puts Heapscope::Retainers.text(report)
  #
  # The walk holds the GVL and disables GC while it runs: the application pauses for its length,
  # bounded by time_limit (seconds) and max_memory (the walk's tables, about 25 bytes per object
  # reached); at a bound it returns what it found and says it was cut short. docs/reading-profiles.md,
  # "Who holds it", shows a worked example; bench/retainers_cost.rb measures the pause.
  module Retainers
    DEFAULTS = { limit: 3, time_limit: 1.0, max_memory: 256 * 1024 * 1024 }.freeze
    # At most this many sampled objects of the site are followed (paths are grouped by shape anyway).
    MAX_TARGETS = 1000
    SITE = /\A(.+):(\d+)\z/.freeze
    ROOTS = {
      "vm" => "the VM (its threads, loaded code and internal tables)",
      "machine_context" => "a thread's C stack (a C local or temporary, found conservatively)",
      "global_list" => "a C global registered with the GC (rb_gc_register_address)",
      "global_tbl" => "a global variable",
      "end_proc" => "an at_exit block",
      "finalizers" => "a finalizer",
      "object_id" => "the object id table",
      "symbols" => "the symbol table",
    }.freeze
    KEY_PREVIEW = 40

    class << self
      # The report (a Hash, see text for its use): site, sampled (objects of the site followed),
      # held (of those, reached from a root), visited, seconds (the walk), table_bytes (its tables),
      # cut_short (nil, :time, :objects or
      # :memory), shapes (distinct path shapes) and paths: [{count:, root:, hops: [{class:, edge:}]}],
      # largest count first, at most limit. Raises ArgumentError for a bad argument and
      # Heapscope::Error when the profiler is not running.
      # keys: false names a Hash's key by its class only ("value at a String key"): the HTTP endpoint's
      # default, since keys may be data (session ids, tokens).
      def find(site, limit: DEFAULTS[:limit], time_limit: DEFAULTS[:time_limit], max_memory: DEFAULTS[:max_memory], keys: true)
        file, line = parse_site(site)
        raise ArgumentError, "limit must be an Integer from 1 to 100, got #{limit.inspect}" unless limit.is_a?(Integer) && limit.between?(1, 100)
        unless time_limit.is_a?(Numeric) && time_limit.positive? && time_limit <= 60
          raise ArgumentError, "time_limit must be a number of seconds above 0 and at most 60, got #{time_limit.inspect}"
        end
        max_memory = Dumps.parse_size(max_memory, "max_memory")
        raise Heapscope::Error, "heapscope is not running" unless Heapscope.running?
        unless Native.respond_to?(:_retainers)
          raise Heapscope::Error, "this Ruby does not export rb_objspace_reachable_objects_from_root: retainers are unavailable"
        end

        Heapscope.internal do
          raw = Native._retainers(file, line, MAX_TARGETS, time_limit.to_f, max_memory)
          cache = {}.compare_by_identity
          paths = raw[:paths].map { |category, objects, kinds| describe(category, objects, kinds, keys, cache) }
          groups = paths.group_by { |p| p[:shape] }.map do |_shape, same|
            { count: same.size, root: same.first[:root], hops: same.first[:hops] }
          end
          groups.sort_by! { |g| -g[:count] }
          { site: "#{file}:#{line}", sampled: raw[:targets], held: paths.size, visited: raw[:visited],
            seconds: raw[:seconds], table_bytes: raw[:table_bytes], cut_short: raw[:cut_short], shapes: groups.size,
            paths: groups.first(limit) }
        end
      end

      # "file:line" -> [file, line]; file may be a path's tail ("app/cache.rb").
      def parse_site(site)
        m = SITE.match(site.to_s.strip)
        unless m && m[2].to_i.positive?
          raise ArgumentError, "site must be FILE:LINE as heapscope top prints it (e.g. app/cache.rb:12), got #{site.inspect}"
        end

        [m[1], Integer(m[2], 10)]
      end

      # The report as text, one block per path shape.
      def text(report)
        cut = report[:cut_short] ? "; cut short at the #{report[:cut_short]} limit, so some objects may have no path" : ""
        first = report[:sampled] >= MAX_TARGETS ? " (the first #{MAX_TARGETS} followed)" : ""
        out = +"heapscope retainers of #{report[:site]}: #{report[:sampled]} sampled live objects#{first}, #{report[:held]} " \
               "reached from a root (walked #{report[:visited]} objects in #{(report[:seconds] * 1000).round(1)} ms#{cut})\n"
        out << "no sampled live object was allocated there (is the line one `heapscope top` lists?)\n" if report[:sampled].zero?
        unreached = report[:sampled] - report[:held]
        if unreached.positive? && report[:cut_short].nil?
          out << "#{unreached} reached from no root: garbage the next GC frees\n"
        end
        report[:paths].each_with_index do |path, i|
          shown = report[:shapes] > report[:paths].size ? " (#{report[:shapes]} shapes in all)" : ""
          out << "\n##{i + 1}: #{path[:count]} of #{report[:held]} objects#{i.zero? ? shown : ""}, held by #{path[:root]}\n"
          path[:hops].each do |hop|
            out << "  #{hop[:edge] ? "#{hop[:edge]} -> " : ""}#{hop[:class]}\n"
          end
        end
        out
      end

      private

      def describe(category, objects, kinds, keys, cache)
        objects, kinds = skip_variable_tables(objects, kinds, keys, cache)
        root = root_name(category, objects.first, kinds.first, cache)
        hops = objects.each_index.map do |k|
          { class: kinds[k] || class_name(objects[k]),
            edge: k.zero? ? nil : edge_name(objects[k - 1], kinds[k - 1], objects[k], kinds[k], keys, cache) }
        end
        hops.last[:class] = "#{hops.last[:class]} (the sampled object)"
        root, hops = fold_root(category, root, objects, hops)
        { root: root, hops: hops, shape: [root, hops.map { |h| [h[:class], shape_of(h[:edge])] }] }
      end

      # The VM's roots lead to constants through Object, and to threads through their Ractor: such a
      # path reads better from the constant or the thread.
      def fold_root(category, root, objects, hops)
        return [root, hops] unless category == "vm"

        # The VM's roots may hold the way in through its own tables (hidden arrays): skip them.
        lead = 0
        lead += 1 while lead < objects.size - 1 && objects[lead].nil?
        if lead.positive?
          objects = objects[lead..]
          hops = hops[lead..].map(&:dup)
          hops.first[:edge] = nil
        end

        if objects.first.equal?(Object) && hops[1]&.dig(:edge)&.start_with?("constant ")
          last = 1
          last += 1 while hops[last + 1]&.dig(:edge)&.start_with?("constant ")
          rest = hops[last..].map(&:dup)
          rest.first[:edge] = nil
          return ["#{hops[last][:edge]}", rest]
        end
        # (Class#=== rather than is_a?: a BasicObject has no is_a?.)
        if Binding === objects.first && kinds_internal?(hops[1]) && hops.size > 2
          binding = objects.first
          var = binding.local_variables.find { |v| binding.local_variable_get(v).equal?(objects[2]) }
          whose = binding.equal?(TOPLEVEL_BINDING) ? "of the main script" : "of a Binding"
          return ["#{var ? "local variable #{var}" : "a local variable"} #{whose}", hops[2..]]
        end
        thread_at = objects.first(2).index { |o| Thread === o }
        if thread_at && hops.size > thread_at + 1
          name = objects[thread_at].name
          return ["a thread's stack or locals (Thread#{name ? " #{name.inspect}" : ""})", hops[(thread_at + 1)..]]
        end
        [root, hops]
      end

      # Ruby 4.0 keeps a class's variables (class variables, the class's own instance variables) in a
      # VM-internal table that the class points to, so the path reads class -> table -> value. Where
      # the object before the table names the value itself, the table is left out of the path.
      def skip_variable_tables(objects, kinds, keys, cache)
        k = 0
        while k + 2 < objects.size
          parent = objects[k]
          if !parent.nil? && kinds[k].nil? && kinds[k + 1]&.start_with?("VM-internal") && kinds[k + 2].nil? &&
             names_directly?(parent, objects[k + 2], keys, cache)
            objects = objects[0..k] + objects[(k + 2)..]
            kinds = kinds[0..k] + kinds[(k + 2)..]
          end
          k += 1
        end
        [objects, kinds]
      end

      def names_directly?(parent, child, keys, cache)
        (cache[parent] ||= edges_of(parent, keys)).key?(child)
      rescue StandardError
        false
      end

      def kinds_internal?(hop)
        hop && hop[:class].start_with?("VM-internal")
      end

      # Keys and indexes differ between objects of one shape: they are left out of it.
      def shape_of(edge)
        edge&.sub(/\A\[\d+\]\z/, "[i]")&.sub(/\Avalue at key .*\z/m, "value at a key")
      end

      def root_name(category, first, kind, cache)
        base = ROOTS[category] || "a VM root (#{category})"
        if category == "global_tbl" && kind.nil?
          name = (cache[GLOBALS] ||= global_values)[first]
          return "global variable #{name}" if name
        end
        base
      end

      # The cache's key for {value => global variable name} (read once per walk).
      GLOBALS = Object.new.freeze

      def global_values
        values = {}.compare_by_identity
        quietly do # some globals warn when read ($= on older Rubies)
          global_variables.each do |name|
            values[TOPLEVEL_BINDING.eval(name.to_s)] ||= name
          rescue StandardError, ScriptError
            nil
          end
        end
        values
      end

      def quietly
        verbose = $VERBOSE
        $VERBOSE = nil
        yield
      ensure
        $VERBOSE = verbose
      end

      def class_name(obj)
        klass = KERNEL_CLASS.bind_call(obj)
        name = module_name(klass)
        Module === obj ? "#{name} #{module_name(obj)}" : name
      rescue StandardError
        "(object)"
      end

      def module_name(mod)
        MODULE_NAME.bind_call(mod) || MODULE_INSPECT.bind_call(mod)
      end

      KERNEL_CLASS = Kernel.instance_method(:class)
      MODULE_NAME = Module.instance_method(:name)
      MODULE_INSPECT = Module.instance_method(:inspect)
      IVARS = Kernel.instance_method(:instance_variables)
      IVAR_GET = Kernel.instance_method(:instance_variable_get)

      # What parent holds child by, where Ruby can say it (core methods, bound, so an application's
      # overrides are not called); nil where it cannot (the edge then shows as a bare arrow). cache:
      # {parent => {child => edge}}, filled by one pass over each parent, since many paths share their
      # parents (a cache Hash of 60k entries is read once, not once per path).
      def edge_name(parent, parent_kind, child, child_kind, keys, cache)
        return nil if parent_kind || parent.nil?
        return "its code or captured variables" if child_kind && [Proc, Thread, Method, Binding].any? { |k| k === parent }
        return nil if child_kind

        edges = (cache[parent] ||= edges_of(parent, keys))
        edges[child] || (Thread === parent ? "its stack (a local variable or block)" : nil)
      rescue StandardError
        nil
      end

      # {child => edge} for every reference parent has that Ruby can name.
      def edges_of(parent, keys)
        edges = {}.compare_by_identity
        case parent
        when Module then module_edges(parent, edges)
        when Hash
          Hash.instance_method(:each_pair).bind_call(parent) do |k, v|
            edges[v] ||= keys ? "value at key #{preview(k)}" : "value at a #{class_name(k)} key"
            edges[k] ||= "a key"
          end
        when Array then Array.instance_method(:each_with_index).bind_call(parent) { |e, i| edges[e] ||= "[#{i}]" }
        when Thread
          parent.keys.each { |k| edges[parent[k]] ||= "thread-local #{k.inspect}" }
          parent.thread_variables.each { |k| edges[parent.thread_variable_get(k)] ||= "thread variable #{k.inspect}" }
        when Struct then Struct.instance_method(:each_pair).bind_call(parent) { |k, v| edges[v] ||= ".#{k}" }
        end
        IVARS.bind_call(parent).each { |name| edges[IVAR_GET.bind_call(parent, name)] ||= name.to_s } unless Module === parent
        edges
      end

      def module_edges(mod, edges)
        quietly do # reading a deprecated constant (Object::Fixnum on 3.1) warns
          Module.instance_method(:constants).bind_call(mod, false).each do |c|
            next if Module.instance_method(:autoload?).bind_call(mod, c)

            value = Module.instance_method(:const_get).bind_call(mod, c, false)
            edges[value] ||= "constant #{mod.equal?(Object) ? c : "#{module_name(mod)}::#{c}"}"
          end
        end
        Module.instance_method(:class_variables).bind_call(mod, false).each do |v|
          edges[Module.instance_method(:class_variable_get).bind_call(mod, v)] ||= "class variable #{v}"
        end
        kind = Class === mod ? "class" : "module"
        IVARS.bind_call(mod).each { |name| edges[IVAR_GET.bind_call(mod, name)] ||= "#{name} (of the #{kind})" }
      end

      # A key as it reads in code, for core types only (an application's #inspect is not run).
      def preview(key)
        core = [String, Symbol, Integer, Float, NilClass, TrueClass, FalseClass].include?(KERNEL_CLASS.bind_call(key))
        text = core ? key.inspect : "#<#{class_name(key)}>"
        text.length > KEY_PREVIEW ? "#{text[0, KEY_PREVIEW]}..." : text
      end
    end
  end
end
