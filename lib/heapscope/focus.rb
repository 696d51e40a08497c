# frozen_string_literal: true

module Heapscope
  # Focused classes: Heapscope.start(focus: { "Quote" => 10, String => 100 }) samples each named class at
  # its own rate (1 in N), with a countdown of its own in the allocation hook (sampling_plan.h: strata).
  # Each sample weighs 1 / its own rate, so estimates stay unbiased, and a denser rate narrows that
  # class's error bars by about sqrt(sample_every / rate). Windowed, no rate is denser than 1 in
  # 1 / window_share overall (the hook is on only that share of the time); sampling: :always gives any.
  #
  # A class is matched exactly (not its subclasses), by the class a new object has when it is allocated.
  # A name not defined at start (autostart runs before the application loads) stays pending until a
  # `class Name` body opens (a :class TracePoint, on while names are pending: it fires only where a class
  # body opens) or, for classes made otherwise (Class.new, Struct.new), until a profile finds it; nothing
  # is loaded to look (an autoload is left alone), and no method of the application's modules runs (the
  # lookups are Module's own, bound). Profiles list every focused class and its rate in their comments.
  module Focus
    MAX_CLASSES = 64
    MAX_RATE = 2**31 - 1
    # One class name as written in Ruby: Constant or Nested::Constant.
    NAME = /\A(?:::)?[A-Z]\w*(?:::[A-Z]\w*)*\z/.freeze
    # Module's own methods, called bound: an application's module may override its singleton's.
    AUTOLOAD_P = Module.instance_method(:autoload?)
    CONST_DEFINED_P = Module.instance_method(:const_defined?)
    CONST_GET = Module.instance_method(:const_get)
    MODULE_NAME = Module.instance_method(:name)

    class << self
      # The focus option as [[Class or nil, rate, name], ...]: nil for a name not defined yet. Raises
      # ArgumentError naming what is wrong: not a Hash, a key that is neither a Class nor a class name,
      # a rate that is not an Integer from 1, too many classes, a class given twice.
      def check(focus)
        return [] if focus.nil?
        focus = parse(focus) if focus.is_a?(String)
        raise ArgumentError, "focus must be a Hash of class => rate (e.g. { \"Quote\" => 10 }), got #{focus.inspect[0, 200]}" unless focus.is_a?(Hash)
        if focus.size > MAX_CLASSES
          raise ArgumentError, "focus: at most #{MAX_CLASSES} classes, got #{focus.size}"
        end

        entries = focus.map { |key, rate| entry(key, rate) }
        names = entries.map { |_, _, name| name }
        twice = names.select { |name| names.count(name) > 1 }.uniq
        raise ArgumentError, "focus: #{twice.join(", ")} given more than once" unless twice.empty?
        entries
      end

      # "Quote=10,String=100" (HEAPSCOPE_FOCUS, heapscope run --focus) as a Hash; ArgumentError names a
      # malformed part.
      def parse(text)
        text.split(",").map(&:strip).reject(&:empty?).to_h do |part|
          name, rate = part.split("=", 2)
          unless rate && rate.strip.match?(/\A\d+\z/)
            shown = part.length > 60 ? "#{part[0, 60].inspect}... (#{part.length} characters)" : part.inspect
            raise ArgumentError, "focus: #{shown} is not CLASS=RATE (e.g. Quote=10)"
          end
          [name.strip, Integer(rate.strip, 10)]
        end
      end

      # The class a name stands for now, or nil when it is not defined yet. Never loads anything: a
      # constant still to be autoloaded counts as not defined (loading it would run the application's
      # code from inside heapscope).
      def lookup(name)
        name.delete_prefix("::").split("::").reduce(Object) do |scope, part|
          return nil unless Module === scope && AUTOLOAD_P.bind_call(scope, part).nil? && CONST_DEFINED_P.bind_call(scope, part, false)
          CONST_GET.bind_call(scope, part, false)
        end
      end

      # Pending names (entries with a nil class) defined since: handed to the C core, which focuses them
      # from now on. Called before each profile, in the caller's thread.
      def resolve_pending(entries)
        entries.each_with_index do |entry, index|
          next unless entry[0].nil?
          klass = lookup(entry[2])
          activate(entries, index, klass) if Class === klass
        end
        unwatch if entries.none? { |klass, _, _| klass.nil? }
      end

      # Watches class bodies opening while entries has pending names (Heapscope.start calls it; stop
      # calls unwatch): a `class Name` of a pending name focuses it at once, before its first instance.
      def watch(entries)
        unwatch
        return if entries.none? { |klass, _, _| klass.nil? }

        @watch = TracePoint.new(:class) do |tp|
          klass = tp.self
          next unless Class === klass

          name = MODULE_NAME.bind_call(klass)
          index = entries.index { |k, _, n| k.nil? && n == name }
          next if index.nil?

          activate(entries, index, klass)
          unwatch if entries.none? { |k, _, _| k.nil? }
        end
        @watch.enable
      end

      def unwatch
        @watch&.disable
        @watch = nil
      end

      # The profile's comment lines: one per focused class, with the rate asked for, the rate in force
      # (the overhead budget lowers both rates by the same factor) and its samples so far.
      def comments(entries)
        stats = Native._focus_stats
        entries.each_with_index.map do |(klass, _rate, name), index|
          line(stats[index] || [0, 0, 0], klass ? "active" : "pending", name)
        end.join
      end

      # One focus comment line from a stratum's Native._focus_stats entry [rate, rate in force, samples]
      # (report/sampling.rb's FOCUS reads it; automatic focus writes its strata with state "auto").
      # Keys of their own (rate=, not sample_every=): readers take sample_every= for the profile's rate.
      def line((every, current, samples), state, name)
        "heapscope focus: rate=#{every} current_rate=#{current} samples=#{samples} state=#{state} class=#{name}\n"
      end

      private

      def activate(entries, index, klass)
        entries[index][0] = klass if Native._focus_class(index, klass)
      end

      def entry(key, rate)
        unless rate.is_a?(Integer) && rate >= 1 && rate <= MAX_RATE
          raise ArgumentError, "focus: the rate of #{key.inspect[0, 100]} must be an Integer from 1 to #{MAX_RATE}, got #{rate.inspect[0, 100]}"
        end

        case key
        when Class
          name = key.name
          raise ArgumentError, "focus: #{key.inspect[0, 100]} is an anonymous class (give a named one)" if name.nil?
          [key, rate, name]
        when String, Symbol
          name = key.to_s
          raise ArgumentError, "focus: #{name.inspect[0, 100]} is not a class name (e.g. Quote or Shop::Quote)" unless NAME.match?(name)
          name = name.delete_prefix("::")
          klass = lookup(name)
          raise ArgumentError, "focus: #{name} is a #{klass.class}, not a Class" if klass && !klass.is_a?(Class)
          [klass, rate, name]
        else
          raise ArgumentError, "focus: a key must be a Class or a class name, got #{key.inspect[0, 100]}"
        end
      end
    end
  end
end
