# frozen_string_literal: true

require_relative "schema"
require_relative "wire"
require_relative "profile"

# profile.proto bytes -> Profile.
module Heapscope
  module Pprof
    # Decoder turns profile.proto bytes (not gzipped) into a Profile.
    class Decoder
      # Profile fields that hold a message, and the message's name.
      MESSAGE_FIELDS = {
        TAG_PROFILE_SAMPLE_TYPE => "ValueType", TAG_PROFILE_MAPPING => "Mapping",
        TAG_PROFILE_LOCATION => "Location", TAG_PROFILE_FUNCTION => "Function", TAG_PROFILE_PERIOD_TYPE => "ValueType"
      }.freeze

      NO_UNITS = {}.freeze
      NO_LABELS = {}.freeze
      SAMPLE_KEY = (TAG_PROFILE_SAMPLE << 3) | WIRE_BYTES # a sample's one-byte field key

      # max_frames: the most stack frames the samples may expand to (nil: no limit), inlined lines
      # counted at every sample that refers to their location: the reports' work is proportional to it.
      # max_samples: the most distinct samples (nil: no limit); each costs a Sample object with its
      # arrays, a few hundred bytes. share: samples whose encoding is byte for byte the same become one
      # Sample, its arrays and labels frozen, listed once per occurrence, each further occurrence costing
      # an Array slot (the reports read samples and never change them; a program that edits a decoded
      # profile leaves share off and gets a Sample of its own per occurrence); then max_occurrences
      # bounds all of them, the time the reports take.
      # pace: called once per field and per sample (a Heapscope::Pacer, when other threads must get
      # to run during a long decode), or nil.
      def initialize(buf, max_frames: nil, max_samples: nil, max_occurrences: nil, share: false, pace: nil)
        @buf = buf
        @max_frames = max_frames
        @max_samples = max_samples
        @max_occurrences = max_occurrences
        @pace = pace
        @shared = share
        @share = share ? {} : nil # encoding -> index in @ranges / 2, while reading
        @ranges = [] # start, end of each distinct sample's encoding
        @order = [] # with share: per occurrence, the index of its distinct sample
      end

      # The string table can come anywhere in the message (Go writes it last), so the first pass collects
      # it and notes where the other fields are (for samples, a pair of offsets per distinct one: a profile
      # is mostly samples, and a reader object kept per sample cost more than the Sample itself); the
      # second decodes them with strings at hand.
      def decode
        top = Wire::Reader.new(@buf, 0, @buf.bytesize, "Profile")
        @strings = []
        fields = []
        pace = @pace
        until top.eof?
          pace&.call
          if (from = top.bytes_after(SAMPLE_KEY))
            note_sample(from, top.pos)
            next
          end
          field, wire = top.key
          if field == TAG_PROFILE_STRING_TABLE
            top.expect(field, wire, WIRE_BYTES)
            @strings << top.string(field)
          elsif field == TAG_PROFILE_SAMPLE
            top.expect(field, wire, WIRE_BYTES)
            note_sample(*top.length_delimited(field))
          elsif field == TAG_PROFILE_COMMENT
            fields << [field, top.repeated(field, wire, [], true)]
          elsif MESSAGE_FIELDS.key?(field)
            top.expect(field, wire, WIRE_BYTES)
            fields << [field, top.message(field, MESSAGE_FIELDS[field])]
          elsif field <= TAG_PROFILE_DEFAULT_SAMPLE_TYPE
            fields << [field, top.int64_of(field, wire)]
          else
            top.skip(field, wire)
          end
        end
        if @strings.empty?
          raise DecodeError, "not a pprof profile (no string table)" unless @buf.empty?

          raise DecodeError, "empty input (not a pprof profile)"
        end

        build(fields)
      end

      private

      # Notes where a sample's bytes are (its strings may come later), checking the limits as samples come.
      def note_sample(from, to)
        if @share
          if @max_occurrences && @order.size >= @max_occurrences
            limit(@max_occurrences, "samples", BYTES_PER_OCCURRENCE)
          end
          key = @buf.byteslice(from, to - from).freeze # (a frozen key is not copied again by Hash)
          @order << (@share[key] ||= @ranges.size / 2)
          return if @ranges.size / 2 == @share.size
        end
        if @max_samples && @ranges.size / 2 >= @max_samples
          limit(@max_samples, @share ? "distinct samples" : "samples", BYTES_PER_SAMPLE)
        end
        @ranges << from << to
      end

      def limit(count, what, bytes_each)
        raise LimitError, "it has more than #{count} #{what}, the limit that goes with #{Pprof.size_text(count * bytes_each)}"
      end

      def build(fields)
        prof = Profile.new
        prof.string_table = @strings
        fields.each do |field, v|
          case field
          when TAG_PROFILE_SAMPLE_TYPE then prof.sample_types << value_type(v)
          when TAG_PROFILE_MAPPING then prof.mappings << mapping(v)
          when TAG_PROFILE_LOCATION then prof.locations << location(v)
          when TAG_PROFILE_FUNCTION then prof.functions << function(v)
          when TAG_PROFILE_DROP_FRAMES then prof.drop_frames = str(v, "drop_frames")
          when TAG_PROFILE_KEEP_FRAMES then prof.keep_frames = str(v, "keep_frames")
          when TAG_PROFILE_TIME_NANOS then prof.time_nanos = v
          when TAG_PROFILE_DURATION_NANOS then prof.duration_nanos = v
          when TAG_PROFILE_PERIOD_TYPE then prof.period_type = value_type(v)
          when TAG_PROFILE_PERIOD then prof.period = v
          when TAG_PROFILE_COMMENT then v.each { |i| prof.comments << str(i, "comment") }
          when TAG_PROFILE_DEFAULT_SAMPLE_TYPE
            prof.default_sample_type = v.zero? ? nil : str(v, "default_sample_type")
          end
        end
        prof.reindex
        prof.samples = samples(prof)
        check_frames(prof) if @max_frames
        prof
      end

      # Decodes the distinct samples, then lists them once per occurrence (share) or as they are.
      def samples(prof)
        @share = nil # its keys, a String per distinct sample, can go while the Samples are made
        stacks = {} # with share: one frozen ids Array per stack (a stack recurs with other labels, values)
        pace = @pace
        distinct = Array.new(@ranges.size / 2) do |k|
          pace&.call
          sample = sample(prof, Wire::Reader.new(@buf, @ranges[2 * k], @ranges[2 * k + 1], "Sample"), stacks)
          if @shared
            sample.values.freeze
            sample.labels.freeze
          end
          sample
        end
        @ranges = nil
        @shared ? @order.map! { |k| distinct[k] } : distinct
      end

      # Raises LimitError when the samples' stacks, inlined lines expanded, exceed max_frames. Without
      # inlining every frame costs at least a byte of input, so only locations with several lines can
      # make a small profile expand far past its size; only those are looked up per sample.
      def check_frames(prof)
        lines = {}
        prof.locations.each { |l| lines[l.id] ||= l.lines.size } # the first location of an id wins, as in reindex
        extra = lines.filter_map { |id, n| [id, n - 1] if n > 1 }.to_h
        total = 0
        prof.samples.each do |s|
          ids = s.location_ids
          total += ids.size
          ids.each { |id| total += extra[id] || 0 } unless extra.empty?
          next if total <= @max_frames

          raise LimitError, "its stacks expand to more than #{@max_frames} frames (inlined lines counted at " \
                            "every sample that uses them), the limit that goes with " \
                            "#{Pprof.size_text(@max_frames * BYTES_PER_FRAME)}"
        end
      end

      # Resolves a string table index, checking its range.
      def str(index, what)
        if index.negative? || index >= @strings.size
          raise DecodeError, "#{what} refers to string #{index}, but the string table has #{@strings.size}"
        end

        @strings[index]
      end

      def value_type(r)
        type = unit = 0
        until r.eof?
          field, wire = r.key
          case field
          when TAG_VALUE_TYPE_TYPE then type = r.int64_of(field, wire)
          when TAG_VALUE_TYPE_UNIT then unit = r.int64_of(field, wire)
          else r.skip(field, wire)
          end
        end
        [str(type, "ValueType.type"), str(unit, "ValueType.unit")]
      end

      def sample(prof, r, stacks = nil)
        ids = []
        values = []
        labels = nil
        units = nil
        until r.eof?
          field, wire = r.key
          case field
          when TAG_SAMPLE_LOCATION then r.repeated(field, wire, ids, false)
          when TAG_SAMPLE_VALUE then r.repeated(field, wire, values, true)
          when TAG_SAMPLE_LABEL
            r.expect(field, wire, WIRE_BYTES)
            labels ||= {}
            units ||= {}
            r.inside(field, "Label") { label(r, labels, units) }
          else r.skip(field, wire)
          end
        end
        ids = stacks[ids] ||= ids.freeze if @shared
        Sample.new(prof, ids, values, labels || (@shared ? NO_LABELS : {}), units.nil? || units.empty? ? NO_UNITS : units)
      end

      def label(r, labels, units)
        key = s = num = unit = 0
        until r.eof?
          field, wire = r.key
          case field
          when TAG_LABEL_KEY then key = r.int64_of(field, wire)
          when TAG_LABEL_STR then s = r.int64_of(field, wire)
          when TAG_LABEL_NUM then num = r.int64_of(field, wire)
          when TAG_LABEL_NUM_UNIT then unit = r.int64_of(field, wire)
          else r.skip(field, wire)
          end
        end
        name = str(key, "Label.key")
        # A label carries str or num; str wins when both are set, as pprof's own reader does.
        labels[name] = s.zero? ? num : str(s, "Label.str")
        units[name] = str(unit, "Label.num_unit") unless unit.zero?
      end

      def mapping(r)
        m = Mapping.new(0, 0, 0, 0, "", "", false, false, false, false)
        until r.eof?
          field, wire = r.key
          case field
          when TAG_MAPPING_ID..TAG_MAPPING_HAS_INLINE_FRAMES
            r.expect(field, wire, WIRE_VARINT)
            v = r.varint
            case field
            when TAG_MAPPING_ID then m.id = v
            when TAG_MAPPING_START then m.memory_start = v
            when TAG_MAPPING_LIMIT then m.memory_limit = v
            when TAG_MAPPING_OFFSET then m.file_offset = v
            when TAG_MAPPING_FILENAME then m.filename = str(v, "Mapping.filename")
            when TAG_MAPPING_BUILD_ID then m.build_id = str(v, "Mapping.build_id")
            when TAG_MAPPING_HAS_FUNCTIONS then m.has_functions = v != 0
            when TAG_MAPPING_HAS_FILENAMES then m.has_filenames = v != 0
            when TAG_MAPPING_HAS_LINE_NUMBERS then m.has_line_numbers = v != 0
            when TAG_MAPPING_HAS_INLINE_FRAMES then m.has_inline_frames = v != 0
            end
          else r.skip(field, wire)
          end
        end
        m
      end

      def location(r)
        loc = Location.new(0, 0, 0, [], false)
        until r.eof?
          field, wire = r.key
          case field
          when TAG_LOCATION_ID then loc.id = r.uint64_of(field, wire)
          when TAG_LOCATION_MAPPING_ID then loc.mapping_id = r.uint64_of(field, wire)
          when TAG_LOCATION_ADDRESS then loc.address = r.uint64_of(field, wire)
          when TAG_LOCATION_LINE
            r.expect(field, wire, WIRE_BYTES)
            loc.lines << line(r.message(field, "Line"))
          when TAG_LOCATION_IS_FOLDED then loc.is_folded = r.int64_of(field, wire) != 0
          else r.skip(field, wire)
          end
        end
        loc
      end

      def line(r)
        ln = Line.new(0, 0)
        until r.eof?
          field, wire = r.key
          case field
          when TAG_LINE_FUNCTION_ID then ln.function_id = r.uint64_of(field, wire)
          when TAG_LINE_LINE then ln.line = r.int64_of(field, wire)
          else r.skip(field, wire)
          end
        end
        ln
      end

      def function(r)
        fn = Function.new(0, "", "", "", 0)
        until r.eof?
          field, wire = r.key
          case field
          when TAG_FUNCTION_ID then fn.id = r.uint64_of(field, wire)
          when TAG_FUNCTION_NAME then fn.name = str(r.int64_of(field, wire), "Function.name")
          when TAG_FUNCTION_SYSTEM_NAME
            fn.system_name = str(r.int64_of(field, wire), "Function.system_name")
          when TAG_FUNCTION_FILENAME
            fn.filename = str(r.int64_of(field, wire), "Function.filename")
          when TAG_FUNCTION_START_LINE then fn.start_line = r.int64_of(field, wire)
          else r.skip(field, wire)
          end
        end
        fn
      end
    end
  end
end
