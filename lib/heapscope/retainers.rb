# frozen_string_literal: true

require_relative "surfaces/dumps"

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
  # The walk holds the GVL in slices of about 20 ms and lets the application run between them; it
  # calls no method of the application's and names edges in C (edge_names.c). It is bounded by
  # time_limit (seconds, wall time, naming included) and max_memory (the walk's tables, about 21-29
  # bytes per object kept); at a bound it returns what it found and says it was cut short.
  # docs/leak-hunting.md, "Who holds it", shows a worked example; bench/retainers_cost.rb measures
  # the pause.
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
    # Ruby's own global variables: most have getters (reading $FILENAME makes ARGF shift ARGV and open
    # a file; $@ calls the exception's #backtrace; $~ and $_ are the caller's frame's), so none is read
    # to name a root. The same 42 names on 3.1, 3.3 and 3.4 (`ruby --disable-gems -e 'p
    # global_variables'`, checked by test_core_retainers.rb), plus the aliases English defines.
    SPECIAL_GLOBALS = %i[
      $! $" $$ $& $' $* $+ $, $-0 $-F $-I $-W $-a $-d $-i $-l $-p $-v $-w $. $/ $0 $: $; $< $= $> $? $@ $DEBUG
      $FILENAME $LOADED_FEATURES $LOAD_PATH $PROGRAM_NAME $VERBOSE $\\ $_ $` $stderr $stdin $stdout $~
      $ARGV $CHILD_STATUS $DEFAULT_INPUT $DEFAULT_OUTPUT $ERROR_INFO $ERROR_POSITION $FIELD_SEPARATOR $FS
      $IGNORECASE $INPUT_LINE_NUMBER $INPUT_RECORD_SEPARATOR $LAST_MATCH_INFO $LAST_PAREN_MATCH
      $LAST_READ_LINE $MATCH $NR $OFS $ORS $OUTPUT_FIELD_SEPARATOR $OUTPUT_RECORD_SEPARATOR $PID
      $POSTMATCH $PREMATCH $PROCESS_ID $RS
    ].freeze

    class << self
      # The report (a Hash, see text for its use): site, sampled (objects of the site followed),
      # held (of those, reached from a root), visited, seconds (the walk), table_bytes (its tables),
      # cut_short (nil, :time, :objects or
      # :memory), shapes (distinct path shapes) and paths: [{count:, root:, hops: [{class:, edge:}]}],
      # largest count first, at most limit. Raises ArgumentError for a bad argument and
      # Heapscope::Error when the profiler is not running.
      # keys: false names a Hash's key by its class only ("value at a String key"), true shows its
      # contents; by default, the operator's show_contents setting (Heapscope.start, off by default),
      # since keys may be data (session ids, tokens).
      def find(site, limit: DEFAULTS[:limit], time_limit: DEFAULTS[:time_limit], max_memory: DEFAULTS[:max_memory], keys: nil)
        file, line = parse_site(site)
        keys = Heapscope.show_contents? if keys.nil?
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
          @globals = nil
          # (Thread.pass now and then: naming 1000 paths takes some 25 ms the application can share.)
          paths = raw[:paths].each_with_index.map do |(category, objects, kinds, edges), i|
            Thread.pass if (i % 100).zero?
            describe(category, objects, kinds, edges, keys)
          end
          @globals = nil
          groups = paths.group_by { |p| p[:shape] }.map do |_shape, same|
            { count: same.size, root: same.first[:root], hops: same.first[:hops] }
          end
          groups.sort_by! { |g| -g[:count] }
          { site: "#{file}:#{line}", sampled: raw[:targets], held: paths.size, visited: raw[:visited],
            kept: raw[:kept], seconds: raw[:seconds], longest_pause: raw[:longest_pause], slices: raw[:slices], table_bytes: raw[:table_bytes],
            cut_short: raw[:cut_short], shapes: groups.size, paths: groups.first(limit), keys: keys }
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

      def describe(category, objects, kinds, edges, keys)
        root = root_name(category, objects.first, kinds.first)
        hops = objects.each_index.map do |k|
          { class: kinds[k] || class_name(objects[k]), edge: k.zero? ? nil : edge_name(objects[k - 1], objects[k], edges[k], keys) }
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

        if SAME.bind_call(objects.first, Object) && hops[1]&.dig(:edge)&.start_with?("constant ")
          last = 1
          last += 1 while hops[last + 1]&.dig(:edge)&.start_with?("constant ")
          rest = hops[last..].map(&:dup)
          rest.first[:edge] = nil
          return ["#{hops[last][:edge]}", rest]
        end
        # (Class#=== rather than is_a?: a BasicObject has no is_a?.)
        if Binding === objects.first && kinds_internal?(hops[1]) && hops.size > 2
          binding = objects.first
          # Binding's own methods, bound: a local variable's value is compared by identity, never asked.
          var = BINDING_LOCALS.bind_call(binding).find { |v| SAME.bind_call(BINDING_LOCAL_GET.bind_call(binding, v), objects[2]) }
          whose = SAME.bind_call(binding, TOPLEVEL_BINDING) ? "of the main script" : "of a Binding"
          return ["#{var ? "local variable #{var}" : "a local variable"} #{whose}", hops[2..]]
        end
        thread_at = objects.first(2).index { |o| Thread === o }
        if thread_at && hops.size > thread_at + 1
          name = THREAD_NAME.bind_call(objects[thread_at]) # (a Thread subclass's #name is not run)
          return ["a thread's stack or locals (Thread#{name ? " #{name.inspect}" : ""})", hops[(thread_at + 1)..]]
        end
        [root, hops]
      end

      def kinds_internal?(hop)
        hop && hop[:class].start_with?("VM-internal")
      end

      # Keys and indexes differ between objects of one shape: they are left out of it.
      def shape_of(edge)
        edge&.sub(/\A\[\d+\]\z/, "[i]")&.sub(/\Avalue at key .*\z/m, "value at a key")
      end

      def root_name(category, first, kind)
        base = ROOTS[category] || "a VM root (#{category})"
        if category == "global_tbl" && kind.nil?
          name = (@globals ||= global_values)[first]
          return "global variable #{name}" if name
        end
        base
      end

      PLAIN_GLOBAL = /\A\$[A-Za-z_][A-Za-z0-9_]*\z/.freeze

      # {value => name} of the global variables a program assigned: every name but Ruby's own, read
      # once per walk. A plain variable's read has no side effect. What this cannot tell: a global a C
      # extension defines with a getter of its own, or an alias of a special one (`alias $f $FILENAME`):
      # those are read like plain ones (docs/leak-hunting.md says so).
      def global_values
        values = {}.compare_by_identity
        quietly do
          global_variables.each do |name|
            next if SPECIAL_GLOBALS.include?(name) || !PLAIN_GLOBAL.match?(name)

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

      # Core methods, bound at load: an application's overrides (or a later monkey patch) are not run.
      # Identity, asked of BasicObject#equal? itself: an application object may redefine equal?.
      SAME = BasicObject.instance_method(:equal?)
      KERNEL_CLASS = Kernel.instance_method(:class)
      MODULE_NAME = Module.instance_method(:name)
      MODULE_INSPECT = Module.instance_method(:inspect)
      BINDING_LOCALS = Binding.instance_method(:local_variables)
      BINDING_LOCAL_GET = Binding.instance_method(:local_variable_get)
      THREAD_NAME = Thread.instance_method(:name)
      THREAD_KEYS = Thread.instance_method(:keys)
      THREAD_GET = Thread.instance_method(:[])
      THREAD_VARIABLES = Thread.instance_method(:thread_variables)
      THREAD_VARIABLE_GET = Thread.instance_method(:thread_variable_get)
      INSPECT = { String => String.instance_method(:inspect), Symbol => Symbol.instance_method(:inspect),
                  Integer => Integer.instance_method(:inspect), Float => Float.instance_method(:inspect),
                  NilClass => NilClass.instance_method(:inspect), TrueClass => TrueClass.instance_method(:inspect),
                  FalseClass => FalseClass.instance_method(:inspect) }.freeze
      ARRAY_SIZE = Array.instance_method(:size)
      ARRAY_AT = Array.instance_method(:[])
      STRUCT_TO_A = Struct.instance_method(:to_a)
      STRING_SLICE = String.instance_method(:[])
      STRING_SIZE = String.instance_method(:size)
      # A key of Array or Struct shows at most this many elements, this deep.
      KEY_ELEMENTS = 5
      KEY_DEPTH = 2

      # What parent holds child by, from the description Native._retainers made in C (edge_names.c);
      # nil where nothing names it (a bare arrow). A Thread's locals are asked of Thread's own methods.
      def edge_name(parent, child, edge, keys)
        return thread_edge(parent, child) if edge.nil? && Thread === parent
        return nil if edge.nil?

        case edge[0]
        when :ivar then edge[1].to_s
        when :class_ivar then "#{edge[1]} (of the #{Class === parent ? "class" : "module"})"
        when :class_variable then "class variable #{edge[1]}"
        when :constant then "constant #{SAME.bind_call(edge[1], Object) ? edge[2] : "#{module_name(edge[1])}::#{edge[2]}"}"
        when :index then "[#{edge[1]}]"
        when :member then ".#{edge[1]}"
        when :value_at then keys ? "value at key #{preview(edge[1])}" : "value at #{article(class_name(edge[1]))} key"
        when :key then "a key"
        when :captured then "its code or captured variables"
        end
      rescue StandardError
        nil
      end

      def article(noun)
        "#{noun.match?(/\A[AEIOU]/) ? "an" : "a"} #{noun}"
      end

      # Thread#keys and #thread_variables return copies made in C: nothing of the thread is iterated
      # from Ruby while other threads run.
      def thread_edge(thread, child)
        key = THREAD_KEYS.bind_call(thread).find { |k| SAME.bind_call(THREAD_GET.bind_call(thread, k), child) }
        return "thread-local #{key.inspect}" if key

        var = THREAD_VARIABLES.bind_call(thread).find { |k| SAME.bind_call(THREAD_VARIABLE_GET.bind_call(thread, k), child) }
        var ? "thread variable #{var.inspect}" : "its stack (a local variable or block)"
      end

      # A key as it reads in code, for core types only (no method of the application's is run): an
      # Array or a Struct by its first elements, anything else by its class.
      def preview(key, depth = 0)
        klass = KERNEL_CLASS.bind_call(key)
        text =
          if INSPECT.key?(klass)
            INSPECT[klass].bind_call(klass == String && STRING_SIZE.bind_call(key) > KEY_PREVIEW ? STRING_SLICE.bind_call(key, 0, KEY_PREVIEW) : key)
          elsif depth < KEY_DEPTH && klass == Array
            elements_preview("[", "]", KEY_ELEMENTS.times.map { |i| i < ARRAY_SIZE.bind_call(key) ? ARRAY_AT.bind_call(key, i) : NONE },
                             ARRAY_SIZE.bind_call(key), depth)
          elsif depth < KEY_DEPTH && Struct === key
            values = STRUCT_TO_A.bind_call(key)
            elements_preview("#<struct #{module_name(klass)} ", ">", values.first(KEY_ELEMENTS), values.size, depth)
          else
            "#<#{class_name(key)}>"
          end
        limit = depth.zero? ? KEY_PREVIEW * 3 : KEY_PREVIEW
        text.length > limit ? "#{text[0, limit]}..." : text
      end

      NONE = Object.new.freeze

      def elements_preview(open, close, elements, size, depth)
        shown = elements.reject { |e| SAME.bind_call(e, NONE) }.map { |e| preview(e, depth + 1) }
        shown << "...#{size - shown.size} more" if size > shown.size
        "#{open}#{shown.join(", ")}#{close}"
      end
    end
  end
end
