# frozen_string_literal: true

require "json"

module Accuracy
  module Cases
    # Allocations inside one long C call: JSON::Parser#parse of a text of a few MB (one call, about 200k
    # objects, no interrupt check inside), the last few results kept in a ring, and a summary string per
    # document made in Ruby after each parse. The parse line is one site for every object the parser
    # makes (heapscope gives a C function its Ruby caller's line), counted here without the site DSL:
    # allocations by the VM's counter around the call, live objects and bytes by walking the kept results.
    class JsonParse < SyntheticCase
      register "json_parse", "JSON.parse of a 3 MB text inside one C call, the last results kept"

      DOCS = 20_000 # documents per text (about 3 MB)
      RING = 3
      KEYS = %w[id name email score tags nested x y z].freeze

      def setup
        @parses = scaled(12)
        @text = JSON.generate(Array.new(DOCS) { |i| document(i) })
        # The parser interns Hash keys (frozen, deduplicated strings): parsing once here makes them, and
        # keeping them makes every later parse reuse them, so the parse site allocates no key.
        @keys = {}.compare_by_identity
        JSON.parse(JSON.generate(document(0))).each_key { |k| @keys[k] = true }
        @keys.merge!(JSON.parse(JSON.generate(document(0)["nested"])).keys.to_h { |k| [k, true] })
        @fill = Array.new(129) { |n| ("s" * n).freeze }
        @summary = site(:summary, String) { |k, n| k.new << @fill[n] }
        @parse = ->(text) { JSON::Parser.new(text).parse }
        @parse_file, @parse_line = @parse.source_location
        @parse_allocs = 0
        @parse_bytes = 0
      end

      def document(i)
        { KEYS[0] => i, KEYS[1] => "user#{i}", KEYS[2] => "user#{i}@example.com", KEYS[3] => i * 1.25,
          KEYS[4] => ["t#{i % 7}", "t#{i % 11}", "tag"],
          KEYS[5] => { KEYS[6] => i, KEYS[7] => [i, i + 1, i + 2], KEYS[8] => "z" * (i % 50) } }
      end

      def work
        @ring = Array.new(RING)
        @summaries = Array.new(RING)
        @parses.times do |p|
          before = GC.stat(:total_allocated_objects)
          docs = @parse.call(@text)
          made = GC.stat(:total_allocated_objects) - before
          # Every parse of the same text makes the same objects: the first is measured, the others count alike.
          @result ||= measure(docs)
          count, bytes = @result
          # What the parser made and did not return (the parser object itself) counts one slot each: a
          # T_DATA that dies before any profile is never measured (docs/architecture.md, Sizes).
          @parse_allocs += made
          @parse_bytes += bytes + (made - count) * Accuracy::SLOT_SIZE
          @ring[p % RING] = docs
          @summaries[p % RING] = docs.map { |d| @summary.make(d["id"] % 128) }
        end
      end

      # [objects, bytes] reachable from the parsed documents, each object once, keys excepted.
      def measure(docs)
        seen = {}.compare_by_identity
        stack = [docs]
        bytes = 0
        until stack.empty?
          obj = stack.pop
          case obj
          when Hash, Array then nil
          when String then next if @keys.key?(obj)
          when Float then next if ObjectSpace.memsize_of(obj).zero? # a flonum is no object
          else next # Integer, nil, true, false: the parser makes no other object
          end
          next if seen.key?(obj)

          seen[obj] = true
          bytes += ObjectSpace.memsize_of(obj)
          if obj.is_a?(Hash)
            obj.each { |k, v| stack.push(k, v) }
          elsif obj.is_a?(Array)
            stack.concat(obj)
          end
        end
        [seen.size, bytes]
      end

      def extra_truth
        live = @ring.compact.map { @result }
        { Accuracy.site_key(@parse_file, @parse_line) => {
          "alloc_objects" => @parse_allocs, "alloc_space" => @parse_bytes,
          "inuse_objects" => live.sum(&:first), "inuse_space" => live.sum(&:last),
        } }
      end

      # The parse's objects are of these types; a profile that misses the parse leaves them unseen there.
      def extra_info
        { Accuracy.site_key(@parse_file, @parse_line) => { "types" => %w[T_HASH T_ARRAY T_STRING T_FLOAT] } }
      end

      def extra_names
        { Accuracy.site_key(@parse_file, @parse_line) => "parse" }
      end

      def files
        (super + [@parse_file]).uniq
      end
    end
  end
end
