# frozen_string_literal: true

require_relative "retainers"
require_relative "report/units"

module Heapscope
  # Examples answers the question after "this line keeps 40 MB alive": what are those objects? For a
  # site's sampled live objects, the oldest first, it shows each one's class, size, age (GCs survived)
  # and a short, bounded preview of what it holds (ext/heapscope/previews.c reads them in C):
  #
  #   String  its byte size and encoding; its first 64 bytes only with the operator's consent
  #   Array   its length and its elements' classes (top 5 with counts, of the first 10,000)
  #   Hash    its size, its keys' and values' classes; its first 5 keys only with consent
  #   object  its instance variables' names (the first 16)
  #   other   class, builtin type and size
  #
  #   report = Heapscope.examples("app/cache.rb:12", max: 5)
  #   puts Heapscope::Examples.text(report)
  #
  # No method of the application's objects runs (no inspect, to_s, hash, ==, method_missing,
  # respond_to?): previews.c reads them with Ruby's C API, and Strings and keys are quoted from copies
  # of their first bytes. Consent is the show_contents start option (Heapscope.show_contents?, off by
  # default): Strings and keys may be data (session ids, tokens), and reports reach other readers.
  module Examples
    DEFAULT_MAX = 5
    MAX = 100

    class << self
      # The report (a Hash of plain data, no object of the application's): site, sampled (the site's
      # sampled live objects), contents (whether String bytes and keys are shown) and examples, the max
      # oldest, each {class:, type:, size:, age:} plus, by type, bytesize:, encoding:, head: (String),
      # length:, scanned:, elements: (Array), length:, scanned:, key_classes:, value_classes:, keys:
      # (Hash), ivar_count:, ivars: (object); class counts are [[name, count], ...]. Raises
      # ArgumentError for a bad argument and Heapscope::Error when the profiler is not running.
      def find(site, max: DEFAULT_MAX)
        file, line = Retainers.parse_site(site)
        raise ArgumentError, "max must be an Integer from 1 to #{MAX}, got #{max.inspect}" unless max.is_a?(Integer) && max.between?(1, MAX)
        raise Heapscope::Error, "heapscope is not running" unless Heapscope.running?

        contents = Heapscope.show_contents?
        Heapscope.internal do
          raw = Native._examples(file, line, max, contents)
          { site: "#{file}:#{line}", sampled: raw[:sampled], contents: contents, examples: raw[:examples] }
        end
      end

      # The report as text: a header, then one block per object.
      def text(report)
        shown = report[:examples].size
        hidden = report[:contents] ? "" : " (String and key contents hidden: the operator's show_contents is off)"
        out = +"heapscope examples of #{report[:site]}: #{shown} of #{report[:sampled]} sampled live objects, the oldest first#{hidden}\n"
        out << "no sampled live object was allocated there (is the line one `heapscope top` lists?)\n" if report[:sampled].zero?
        report[:examples].each_with_index do |example, i|
          out << "\n##{i + 1} #{example[:class]} (#{example[:type]}), #{Report::Units.bytes(example[:size])}, " \
                 "survived #{example[:age]} GC#{example[:age] == 1 ? "" : "s"}\n"
          details(example).each { |line| out << "  #{line}\n" }
        end
        out
      end

      private

      def details(example)
        case example[:type]
        when :string
          ["#{example[:bytesize]} bytes, #{example[:encoding]}", example[:head] && "first bytes: #{example[:head]}"].compact
        when :array
          ["#{example[:length]} elements#{of_first(example)}: #{classes(example[:elements])}"]
        when :hash
          ["#{example[:length]} entries#{of_first(example)}: keys #{classes(example[:key_classes])}; " \
           "values #{classes(example[:value_classes])}",
           example[:keys] && "first keys: #{example[:keys].join(", ")}"].compact
        when :object
          names = example[:ivars].join(", ")
          more = example[:ivar_count] > example[:ivars].size ? ", ...#{example[:ivar_count] - example[:ivars].size} more" : ""
          [example[:ivar_count].zero? ? "no instance variables" : "instance variables: #{names}#{more}"]
        else
          []
        end
      end

      def of_first(example)
        example[:scanned] < example[:length] ? " (classes of the first #{example[:scanned]})" : ""
      end

      def classes(counts)
        counts.empty? ? "(none)" : counts.map { |name, count| "#{name} x#{count}" }.join(", ")
      end
    end
  end
end
