# frozen_string_literal: true

require "zlib"

# Heapscope::Pprof reads and writes profile.proto (github.com/google/pprof/proto/profile.proto) in pure
# Ruby. It is independent of the C writer on purpose: the tests use it as a second opinion on what the C
# core encodes, and the report commands (top, flamegraph, diff, leaks) read any pprof heap profile with it,
# Go's included, without the C extension loaded.
#
# Layers, top to bottom:
#   Wire     a schema-free protobuf reader (varints, length-delimited ranges) and writer.
#   decode   profile.proto messages -> Profile, Sample, Location, Function, Mapping (strings resolved).
#   Profile  the model, plus add_sample (hand-made profiles), to_pprof (re-encode) and subtract.
#
#   prof = Heapscope::Pprof.read("heap.pb.gz")
#   prof.samples.each { |s| puts "#{s.frames.first.function} #{s.value("inuse_space")}" }
#
# Every decoding problem raises DecodeError with a one-line message naming it.
module Heapscope
  module Pprof
    # DecodeError is raised for input that is not a readable pprof profile, or that breaks its rules.
    class DecodeError < StandardError; end

    # Field numbers of profile.proto, each with its type.
    TAG_PROFILE_SAMPLE_TYPE = 1          # repeated ValueType
    TAG_PROFILE_SAMPLE = 2               # repeated Sample
    TAG_PROFILE_MAPPING = 3              # repeated Mapping
    TAG_PROFILE_LOCATION = 4             # repeated Location
    TAG_PROFILE_FUNCTION = 5             # repeated Function
    TAG_PROFILE_STRING_TABLE = 6         # repeated string
    TAG_PROFILE_DROP_FRAMES = 7          # int64 (string table index)
    TAG_PROFILE_KEEP_FRAMES = 8          # int64 (string table index)
    TAG_PROFILE_TIME_NANOS = 9           # int64
    TAG_PROFILE_DURATION_NANOS = 10      # int64
    TAG_PROFILE_PERIOD_TYPE = 11         # ValueType
    TAG_PROFILE_PERIOD = 12              # int64
    TAG_PROFILE_COMMENT = 13             # repeated int64 (string table indices)
    TAG_PROFILE_DEFAULT_SAMPLE_TYPE = 14 # int64 (string table index)

    TAG_VALUE_TYPE_TYPE = 1 # int64 (string table index)
    TAG_VALUE_TYPE_UNIT = 2 # int64 (string table index)

    TAG_SAMPLE_LOCATION = 1 # repeated uint64
    TAG_SAMPLE_VALUE = 2    # repeated int64
    TAG_SAMPLE_LABEL = 3    # repeated Label

    TAG_LABEL_KEY = 1      # int64 (string table index)
    TAG_LABEL_STR = 2      # int64 (string table index)
    TAG_LABEL_NUM = 3      # int64
    TAG_LABEL_NUM_UNIT = 4 # int64 (string table index)

    TAG_MAPPING_ID = 1                # uint64
    TAG_MAPPING_START = 2             # uint64
    TAG_MAPPING_LIMIT = 3             # uint64
    TAG_MAPPING_OFFSET = 4            # uint64
    TAG_MAPPING_FILENAME = 5          # int64 (string table index)
    TAG_MAPPING_BUILD_ID = 6          # int64 (string table index)
    TAG_MAPPING_HAS_FUNCTIONS = 7     # bool
    TAG_MAPPING_HAS_FILENAMES = 8     # bool
    TAG_MAPPING_HAS_LINE_NUMBERS = 9  # bool
    TAG_MAPPING_HAS_INLINE_FRAMES = 10 # bool

    TAG_LOCATION_ID = 1         # uint64
    TAG_LOCATION_MAPPING_ID = 2 # uint64
    TAG_LOCATION_ADDRESS = 3    # uint64
    TAG_LOCATION_LINE = 4       # repeated Line
    TAG_LOCATION_IS_FOLDED = 5  # bool

    TAG_LINE_FUNCTION_ID = 1 # uint64
    TAG_LINE_LINE = 2        # int64

    TAG_FUNCTION_ID = 1          # uint64
    TAG_FUNCTION_NAME = 2        # int64 (string table index)
    TAG_FUNCTION_SYSTEM_NAME = 3 # int64 (string table index)
    TAG_FUNCTION_FILENAME = 4    # int64 (string table index)
    TAG_FUNCTION_START_LINE = 5  # int64

    WIRE_VARINT = 0
    WIRE_FIXED64 = 1
    WIRE_BYTES = 2
    WIRE_FIXED32 = 5

    GZIP_MAGIC = "\x1f\x8b".b.freeze

    # Frame is one line of a stack, leaf first in Sample#frames. function and file are Strings ("" when
    # unknown), line an Integer (0 when unknown).
    Frame = Struct.new(:function, :file, :line) do
      def to_s
        line.positive? ? "#{function} #{file}:#{line}" : "#{function} #{file}"
      end
    end

    # Line is one entry of a Location: the function id and line number.
    Line = Struct.new(:function_id, :line)

    # Location is an address in the program; several lines mean inlining (the last line is the caller).
    Location = Struct.new(:id, :mapping_id, :address, :lines, :is_folded)

    # Function: name, system_name and filename are resolved Strings.
    Function = Struct.new(:id, :name, :system_name, :filename, :start_line)

    # Mapping: filename and build_id are resolved Strings.
    Mapping = Struct.new(:id, :memory_start, :memory_limit, :file_offset, :filename, :build_id,
                         :has_functions, :has_filenames, :has_line_numbers, :has_inline_frames)

    # Wire is the protobuf wire format and nothing else: it knows no message schema.
    module Wire
      # Reader walks the fields of one message held in buf[pos...limit] (buf is a binary String shared
      # by every nested Reader, so nested messages are never copied).
      class Reader
        attr_reader :pos

        def initialize(buf, pos, limit, what)
          @buf = buf
          @pos = pos
          @limit = limit
          @what = what # the message name, for error messages
        end

        def eof?
          @pos >= @limit
        end

        # Reads a field key; returns [field number, wire type].
        def key
          k = varint
          field = k >> 3
          wire = k & 7
          fail!("field number 0 in #{@what}") if field.zero?
          fail!("bad wire type #{wire} for field #{field} of #{@what}") if wire == 3 || wire == 4 || wire > 5
          [field, wire]
        end

        # Reads an unsigned varint (at most 10 bytes, 64 bits). The one-byte case is most of a profile.
        def varint
          pos = @pos
          fail!("truncated varint in #{@what}") if pos >= @limit
          byte = @buf.getbyte(pos)
          if byte < 0x80
            @pos = pos + 1
            return byte
          end

          value = byte & 0x7f
          shift = 7
          while true # a while loop: much faster than loop {} here
            pos += 1
            fail!("truncated varint in #{@what}") if pos >= @limit
            byte = @buf.getbyte(pos)
            value |= (byte & 0x7f) << shift
            if byte < 0x80
              @pos = pos + 1
              return value & 0xffff_ffff_ffff_ffff
            end
            shift += 7
            fail!("varint longer than 10 bytes in #{@what}") if shift >= 70
          end
        end

        # Reads a varint as a two's complement int64 (negative int64s are 10-byte varints).
        def int64
          v = varint
          v >= 0x8000_0000_0000_0000 ? v - 0x1_0000_0000_0000_0000 : v
        end

        # Reads a length prefix and returns [start, end] of the bytes it covers, after checking they exist.
        def length_delimited(field)
          start_at = @pos
          len = varint
          if len > @limit - @pos
            fail!("truncated: field #{field} of #{@what} at byte #{start_at} claims #{len} bytes, " \
                  "only #{@limit - @pos} left")
          end
          range = [@pos, @pos + len]
          @pos += len
          range
        end

        # Returns a Reader over a nested message of the given name.
        def message(field, name)
          s, e = length_delimited(field)
          Reader.new(@buf, s, e, name)
        end

        def string(field)
          s, e = length_delimited(field)
          @buf.byteslice(s, e - s).force_encoding(Encoding::UTF_8)
        end

        # Reads a repeated integer field that may be packed (wire type 2) or not (wire type 0).
        def repeated(field, wire, into, signed)
          if wire == WIRE_VARINT
            into << (signed ? int64 : varint)
          elsif wire == WIRE_BYTES
            s, e = length_delimited(field)
            # Packed: read in place, moving this reader's window over the bytes, then restore it.
            limit = @limit
            after = @pos
            @pos = s
            @limit = e
            if signed
              into << int64 while @pos < e
            else
              into << varint while @pos < e
            end
            @pos = after
            @limit = limit
          else
            fail!("bad wire type #{wire} for field #{field} of #{@what} (want varint or packed)")
          end
          into
        end

        # Reads a singular int64 field after checking it is a varint.
        def int64_of(field, wire)
          expect(field, wire, WIRE_VARINT)
          int64
        end

        # Reads a singular uint64 field after checking it is a varint.
        def uint64_of(field, wire)
          expect(field, wire, WIRE_VARINT)
          varint
        end

        # Checks a singular field's wire type.
        def expect(field, wire, want)
          return if wire == want

          fail!("bad wire type #{wire} for field #{field} of #{@what} (want #{want})")
        end

        # Skips a field whose number this decoder does not know (forward compatibility).
        def skip(field, wire)
          case wire
          when WIRE_VARINT then varint
          when WIRE_BYTES then length_delimited(field)
          when WIRE_FIXED64 then advance(field, 8)
          when WIRE_FIXED32 then advance(field, 4)
          end
        end

        def fail!(message)
          raise DecodeError, message
        end

        private

        def advance(field, n)
          fail!("truncated: fixed-width field #{field} of #{@what} at byte #{@pos}") if @pos + n > @limit
          @pos += n
        end
      end

      # Writer appends fields to a binary String. Nested messages are encoded into their own Writer and
      # appended with their length (Ruby has no cheap back-patching of a varint-sized hole).
      class Writer
        attr_reader :buf

        def initialize
          @buf = +"".b
        end

        def varint(v)
          v &= 0xffff_ffff_ffff_ffff # negative int64s become their 10-byte two's complement
          while v >= 0x80
            @buf << ((v & 0x7f) | 0x80)
            v >>= 7
          end
          @buf << v
        end

        def key(field, wire)
          varint((field << 3) | wire)
        end

        # int64/uint64/bool field; opt skips zero values as proto3 does.
        def int(field, v)
          key(field, WIRE_VARINT)
          varint(v)
        end

        def int_opt(field, v)
          int(field, v) unless v.nil? || v.zero?
        end

        def bool_opt(field, v)
          int(field, 1) if v
        end

        def bytes(field, str)
          key(field, WIRE_BYTES)
          varint(str.bytesize)
          @buf << str.b
        end

        # A packed repeated integer field (omitted when empty).
        def packed(field, values)
          return if values.empty?

          inner = Writer.new
          values.each { |v| inner.varint(v) }
          bytes(field, inner.buf)
        end

        def message(field, writer)
          bytes(field, writer.buf)
        end
      end
    end

    # Sample is one stack with its values and labels. It keeps its Profile, so value("inuse_space")
    # and frames work on their own.
    class Sample
      attr_reader :profile, :location_ids, :values, :labels, :num_units

      # labels: {String => String or Integer}; num_units: {String => String} for num labels with a unit.
      def initialize(profile, location_ids, values, labels = {}, num_units = {})
        @profile = profile
        @location_ids = location_ids
        @values = values
        @labels = labels
        @num_units = num_units
      end

      # Returns the value of one sample type, given by name ("inuse_space") or index.
      # Raises KeyError for a name the profile does not have.
      def value(which)
        index = which.is_a?(Integer) ? which : @profile.sample_index(which.to_s)
        raise KeyError, "no sample type #{which.inspect} (have: #{@profile.sample_type_names.join(", ")})" unless index

        @values[index]
      end

      # Returns the stack as Frames, leaf first, inlined lines expanded.
      def frames
        @frames ||= @profile.frames_for(@location_ids)
      end

      # A short inspect: the default one would print the whole Profile this sample refers to.
      def inspect
        "#<Heapscope::Pprof::Sample values=#{@values.inspect} labels=#{@labels.inspect} " \
          "locations=#{@location_ids.inspect}>"
      end

      # Returns a key identifying the stack and labels (what subtract and the reports aggregate by).
      def key
        [frames.map(&:to_a), @labels.sort]
      end
    end

    # Profile is a decoded (or hand-made) pprof profile.
    class Profile
      attr_accessor :sample_types, :samples, :mappings, :locations, :functions, :default_sample_type,
                    :period_type, :period, :time_nanos, :duration_nanos, :comments, :drop_frames, :keep_frames

      # Builds an empty profile; add samples with add_sample.
      #   Profile.new(sample_types: [["alloc_objects", "count"], ["alloc_space", "bytes"]])
      def initialize(sample_types: [], default_sample_type: nil, period_type: nil, period: 0, time_nanos: 0,
                     duration_nanos: 0, comments: [])
        @sample_types = sample_types.map { |t, u| [t.to_s, u.to_s] }
        @default_sample_type = default_sample_type
        @period_type = period_type
        @period = period
        @time_nanos = time_nanos
        @duration_nanos = duration_nanos
        @comments = comments.dup
        @drop_frames = nil
        @keep_frames = nil
        @samples = []
        @mappings = []
        @locations = []
        @functions = []
        @string_table = nil # set by decode only
        reindex
      end

      # string_table is the decoded table; a profile made in Ruby reports the table to_pprof would write.
      def string_table
        @string_table || Pprof.decode(to_pprof(gzip: false)).string_table
      end

      def string_table=(table)
        @string_table = table
      end

      # A short inspect (a profile can hold many thousands of samples).
      def inspect
        "#<Heapscope::Pprof::Profile sample_types=#{@sample_types.inspect} samples=#{@samples.size} " \
          "locations=#{@locations.size} functions=#{@functions.size}>"
      end

      def sample_type_names
        @sample_types.map(&:first)
      end

      # Returns the index of the sample type with that name, or nil.
      def sample_index(name)
        @sample_types.index { |t, _| t == name.to_s }
      end

      # Returns the unit of a sample type ("bytes", "count") or nil.
      def sample_unit(name)
        t = @sample_types.find { |n, _| n == name.to_s }
        t && t[1]
      end

      # Sum of one sample type over all samples.
      def total(name)
        i = sample_index(name) or raise KeyError, "no sample type #{name.inspect}"
        @samples.sum { |s| s.values[i] }
      end

      # Returns the Frames of a list of location ids, leaf first. Unknown ids become "0x0"-style frames
      # (validate! reports them; readers just keep going).
      def frames_for(location_ids)
        location_ids.flat_map { |id| location_frames(id) }
      end

      # Adds a sample given its frames (leaf first; Frame or [function, file, line]), creating functions and
      # single-line locations as needed. Used for hand-made profiles and by subtract.
      def add_sample(frames:, values:, labels: {})
        if values.size != @sample_types.size
          raise ArgumentError, "#{values.size} values for #{@sample_types.size} sample types"
        end

        ids = frames.map { |f| intern_location([f.is_a?(Frame) ? f : Frame.new(*f)]) }
        sample = Sample.new(self, ids, values.dup, labels.dup)
        @samples << sample
        sample
      end

      # Re-encodes the profile as profile.proto, gzipped unless gzip: false.
      def to_pprof(gzip: true)
        raw = Encoder.new(self).encode
        gzip ? Zlib.gzip(raw, level: Zlib::DEFAULT_COMPRESSION) : raw
      end

      # Rebuilds the id indexes after the tables were replaced (decode and subtract do this).
      def reindex
        @location_by_id = {}
        @locations.each { |l| @location_by_id[l.id] ||= l }
        @function_by_id = {}
        @functions.each { |f| @function_by_id[f.id] ||= f }
        @frames_cache = {}
        @function_ids = {}
        @functions.each { |f| @function_ids[[f.name, f.system_name, f.filename, f.start_line]] ||= f.id }
        # New ids continue after the largest one, so they stay unique even if a table is not 1..N.
        @next_location_id = @locations.map(&:id).max || 0
        @next_function_id = @functions.map(&:id).max || 0
        @location_ids = nil # frames -> location id, built when intern_location first needs it
        self
      end

      # Returns the id of a location whose lines are exactly these frames, creating it if missing.
      def intern_location(frames)
        key = frames.map(&:to_a)
        unless @location_ids
          @location_ids = {}
          @locations.each { |l| @location_ids[location_frames(l.id).map(&:to_a)] ||= l.id }
        end
        @location_ids[key] ||= begin
          lines = frames.map { |f| Line.new(intern_function(f.function.to_s, f.file.to_s), f.line.to_i) }
          loc = Location.new(@next_location_id += 1, 0, 0, lines, false)
          @locations << loc
          @location_by_id[loc.id] = loc
          loc.id
        end
      end

      private

      def intern_function(name, file)
        @function_ids[[name, name, file, 0]] ||= @function_ids[[name, "", file, 0]] || begin
          fn = Function.new(@next_function_id += 1, name, name, file, 0)
          @functions << fn
          @function_by_id[fn.id] = fn
          fn.id
        end
      end

      def location_frames(id)
        @frames_cache[id] ||= begin
          loc = @location_by_id[id]
          if loc.nil?
            [Frame.new(format("<unknown location %d>", id), "", 0)]
          elsif loc.lines.empty?
            # An unsymbolized location: all we have is its address.
            [Frame.new(format("0x%x", loc.address), "", 0)]
          else
            loc.lines.map do |ln|
              fn = @function_by_id[ln.function_id]
              Frame.new(fn ? fn.name : format("<unknown function %d>", ln.function_id), fn ? fn.filename : "",
                        ln.line)
            end
          end
        end
      end
    end

    # Decoder turns profile.proto bytes (not gzipped) into a Profile.
    class Decoder
      # Profile fields that hold a message, and the message's name.
      MESSAGE_FIELDS = {
        TAG_PROFILE_SAMPLE_TYPE => "ValueType", TAG_PROFILE_SAMPLE => "Sample", TAG_PROFILE_MAPPING => "Mapping",
        TAG_PROFILE_LOCATION => "Location", TAG_PROFILE_FUNCTION => "Function", TAG_PROFILE_PERIOD_TYPE => "ValueType"
      }.freeze

      NO_UNITS = {}.freeze

      def initialize(buf)
        @buf = buf
      end

      # The string table can come anywhere in the message (Go writes it last), so the first pass collects
      # it and notes where the other fields are; the second decodes them with strings at hand.
      def decode
        top = Wire::Reader.new(@buf, 0, @buf.bytesize, "Profile")
        @strings = []
        fields = []
        until top.eof?
          field, wire = top.key
          if field == TAG_PROFILE_STRING_TABLE
            top.expect(field, wire, WIRE_BYTES)
            @strings << top.string(field)
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

      def build(fields)
        prof = Profile.new
        prof.string_table = @strings
        sample_readers = []
        fields.each do |field, v|
          case field
          when TAG_PROFILE_SAMPLE_TYPE then prof.sample_types << value_type(v)
          when TAG_PROFILE_SAMPLE then sample_readers << v
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
        prof.samples = sample_readers.map { |r| sample(prof, r) }
        prof
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

      def sample(prof, r)
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
            label(r.message(field, "Label"), labels, units)
          else r.skip(field, wire)
          end
        end
        Sample.new(prof, ids, values, labels || {}, units.nil? || units.empty? ? NO_UNITS : units)
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

    # Encoder writes a Profile as profile.proto: string table index 0 is "", strings interned in the
    # order they are first needed, messages in table order, so the output is deterministic.
    class Encoder
      def initialize(prof)
        @prof = prof
        @strings = { "" => 0 }
      end

      def encode
        p = @prof
        w = Wire::Writer.new
        p.sample_types.each { |t, u| w.message(TAG_PROFILE_SAMPLE_TYPE, value_type(t, u)) }
        p.samples.each { |s| w.message(TAG_PROFILE_SAMPLE, sample(s)) }
        p.mappings.each { |m| w.message(TAG_PROFILE_MAPPING, mapping(m)) }
        p.locations.each { |l| w.message(TAG_PROFILE_LOCATION, location(l)) }
        p.functions.each { |f| w.message(TAG_PROFILE_FUNCTION, function(f)) }
        w.int_opt(TAG_PROFILE_DROP_FRAMES, p.drop_frames && intern(p.drop_frames))
        w.int_opt(TAG_PROFILE_KEEP_FRAMES, p.keep_frames && intern(p.keep_frames))
        w.int_opt(TAG_PROFILE_TIME_NANOS, p.time_nanos)
        w.int_opt(TAG_PROFILE_DURATION_NANOS, p.duration_nanos)
        w.message(TAG_PROFILE_PERIOD_TYPE, value_type(*p.period_type)) if p.period_type
        w.int_opt(TAG_PROFILE_PERIOD, p.period)
        w.packed(TAG_PROFILE_COMMENT, p.comments.map { |c| intern(c) })
        w.int_opt(TAG_PROFILE_DEFAULT_SAMPLE_TYPE, p.default_sample_type && intern(p.default_sample_type))
        # The string table goes last, as Go writes it: only now is every string interned.
        table = @strings.keys
        table.each { |s| w.bytes(TAG_PROFILE_STRING_TABLE, s) }
        w.buf
      end

      private

      def intern(s)
        @strings[s.to_s] ||= @strings.size
      end

      def value_type(type, unit)
        w = Wire::Writer.new
        w.int_opt(TAG_VALUE_TYPE_TYPE, intern(type))
        w.int_opt(TAG_VALUE_TYPE_UNIT, intern(unit))
        w
      end

      def sample(s)
        w = Wire::Writer.new
        w.packed(TAG_SAMPLE_LOCATION, s.location_ids)
        w.packed(TAG_SAMPLE_VALUE, s.values)
        s.labels.each do |k, v|
          lw = Wire::Writer.new
          lw.int_opt(TAG_LABEL_KEY, intern(k))
          if v.is_a?(Integer)
            lw.int_opt(TAG_LABEL_NUM, v)
            unit = s.num_units[k]
            lw.int_opt(TAG_LABEL_NUM_UNIT, intern(unit)) if unit
          else
            lw.int_opt(TAG_LABEL_STR, intern(v))
          end
          w.message(TAG_SAMPLE_LABEL, lw)
        end
        w
      end

      def mapping(m)
        w = Wire::Writer.new
        w.int_opt(TAG_MAPPING_ID, m.id)
        w.int_opt(TAG_MAPPING_START, m.memory_start)
        w.int_opt(TAG_MAPPING_LIMIT, m.memory_limit)
        w.int_opt(TAG_MAPPING_OFFSET, m.file_offset)
        w.int_opt(TAG_MAPPING_FILENAME, intern(m.filename))
        w.int_opt(TAG_MAPPING_BUILD_ID, intern(m.build_id))
        w.bool_opt(TAG_MAPPING_HAS_FUNCTIONS, m.has_functions)
        w.bool_opt(TAG_MAPPING_HAS_FILENAMES, m.has_filenames)
        w.bool_opt(TAG_MAPPING_HAS_LINE_NUMBERS, m.has_line_numbers)
        w.bool_opt(TAG_MAPPING_HAS_INLINE_FRAMES, m.has_inline_frames)
        w
      end

      def location(l)
        w = Wire::Writer.new
        w.int_opt(TAG_LOCATION_ID, l.id)
        w.int_opt(TAG_LOCATION_MAPPING_ID, l.mapping_id)
        w.int_opt(TAG_LOCATION_ADDRESS, l.address)
        l.lines.each do |ln|
          lw = Wire::Writer.new
          lw.int_opt(TAG_LINE_FUNCTION_ID, ln.function_id)
          lw.int_opt(TAG_LINE_LINE, ln.line)
          w.message(TAG_LOCATION_LINE, lw)
        end
        w.bool_opt(TAG_LOCATION_IS_FOLDED, l.is_folded)
        w
      end

      def function(f)
        w = Wire::Writer.new
        w.int_opt(TAG_FUNCTION_ID, f.id)
        w.int_opt(TAG_FUNCTION_NAME, intern(f.name))
        w.int_opt(TAG_FUNCTION_SYSTEM_NAME, intern(f.system_name))
        w.int_opt(TAG_FUNCTION_FILENAME, intern(f.filename))
        w.int_opt(TAG_FUNCTION_START_LINE, f.start_line)
        w
      end
    end

    class << self
      # Decodes a profile from gzipped or raw profile.proto bytes. Raises DecodeError.
      def decode(bytes)
        bytes = bytes.b
        raise DecodeError, "empty input (not a pprof profile)" if bytes.empty?

        if bytes.start_with?(GZIP_MAGIC)
          bytes = gunzip(bytes)
          return Decoder.new(bytes).decode
        end
        begin
          Decoder.new(bytes).decode
        rescue DecodeError => e
          # Raw input that fails early is most likely not a profile at all; say so first.
          raise DecodeError, "not gzip or pprof protobuf data (#{e.message})"
        end
      end

      # Reads and decodes a profile file. Raises DecodeError with a message that starts with the path.
      def read(path)
        data = begin
          File.binread(path)
        rescue Errno::ENOENT
          raise DecodeError, "#{path}: no such file"
        rescue Errno::EISDIR
          raise DecodeError, "#{path}: is a directory"
        rescue SystemCallError => e
          raise DecodeError, "#{path}: #{e.message.sub(/ @ .*/, "")}"
        end
        begin
          decode(data)
        rescue DecodeError => e
          raise DecodeError, "#{path}: #{e.message}"
        end
      end

      # Checks the rules pprof consumers (Parca's validator among them) rely on. Raises DecodeError naming
      # the first broken rule; returns prof.
      def validate!(prof)
        table = prof.string_table
        raise DecodeError, "string_table[0] is #{table[0].inspect}, must be \"\"" unless table.empty? || table[0] == ""
        raise DecodeError, "string table is empty (string_table[0] must be \"\")" if table.empty?

        mapping_ids = unique_ids(prof.mappings, "mapping")
        function_ids = unique_ids(prof.functions, "function")
        location_ids = unique_ids(prof.locations, "location")
        prof.locations.each do |loc|
          if loc.mapping_id != 0 && !mapping_ids.key?(loc.mapping_id)
            raise DecodeError, "location #{loc.id} refers to unknown mapping #{loc.mapping_id}"
          end
          loc.lines.each do |ln|
            next if function_ids.key?(ln.function_id)

            raise DecodeError, "location #{loc.id} refers to unknown function #{ln.function_id}"
          end
        end
        n = prof.sample_types.size
        prof.samples.each_with_index do |s, i|
          if s.values.size != n
            raise DecodeError, "sample #{i} has #{s.values.size} values, but there are #{n} sample types"
          end
          s.location_ids.each do |id|
            raise DecodeError, "sample #{i} refers to unknown location #{id}" unless location_ids.key?(id)
          end
        end
        prof
      end

      # Returns newer minus older, per identical (frames, labels) key: a delta profile. Negative values are
      # kept, zero samples dropped; keys only in older come out negated. Metadata is newer's. Sample types
      # are matched by name (a type older lacks counts as 0 there).
      def subtract(newer, older)
        out = Profile.new(sample_types: newer.sample_types, default_sample_type: newer.default_sample_type,
                          period_type: newer.period_type, period: newer.period, time_nanos: newer.time_nanos,
                          duration_nanos: newer.duration_nanos, comments: newer.comments)
        out.drop_frames = newer.drop_frames
        out.keep_frames = newer.keep_frames
        out.mappings = newer.mappings.map(&:dup)
        out.locations = newer.locations.map { |l| l.dup.tap { |c| c.lines = l.lines.map(&:dup) } }
        out.functions = newer.functions.map(&:dup)
        out.reindex

        # older's values, aligned to newer's sample types, summed per key.
        map = newer.sample_type_names.map { |name| older.sample_index(name) }
        old_sums = {}
        old_first = {}
        older.samples.each do |s|
          key = s.key
          vals = map.map { |i| i ? s.values[i] : 0 }
          if (sum = old_sums[key])
            vals.each_with_index { |v, i| sum[i] += v }
          else
            old_sums[key] = vals
            old_first[key] = s
          end
        end

        # newer's samples, summed per key, in first-seen order.
        new_sums = {}
        new_first = {}
        newer.samples.each do |s|
          key = s.key
          if (sum = new_sums[key])
            s.values.each_with_index { |v, i| sum[i] += v }
          else
            new_sums[key] = s.values.dup
            new_first[key] = s
          end
        end

        new_sums.each do |key, vals|
          old = old_sums[key]
          vals = vals.each_with_index.map { |v, i| v - (old ? old[i] : 0) }
          next if vals.all?(&:zero?)

          s = new_first[key]
          out.samples << Sample.new(out, s.location_ids.dup, vals, s.labels.dup, s.num_units.dup)
        end
        old_sums.each do |key, vals|
          next if new_sums.key?(key) || vals.all?(&:zero?)

          s = old_first[key]
          # Carry older's locations over by their frames (inlined lines stay in one location).
          ids = s.location_ids.map { |id| out.intern_location(older.frames_for([id])) }
          out.samples << Sample.new(out, ids, vals.map(&:-@), s.labels.dup, s.num_units.dup)
        end
        out
      end

      private

      # Inflates one gzip member. Zlib.gunzip would do, but it warns (under -w) on the truncated input we
      # report as an error ourselves.
      def gunzip(bytes)
        z = Zlib::Inflate.new(Zlib::MAX_WBITS + 16) # + 16: expect a gzip header and trailer
        begin
          out = z.inflate(bytes)
          raise DecodeError, "truncated gzip data" unless z.finished?

          out
        rescue Zlib::BufError
          raise DecodeError, "truncated gzip data"
        rescue Zlib::Error => e
          raise DecodeError, "bad gzip data (#{e.message})"
        ensure
          z.reset
          z.close
        end
      end

      def unique_ids(table, what)
        seen = {}
        table.each do |entry|
          raise DecodeError, "#{what} id 0 is reserved (ids start at 1)" if entry.id.zero?
          raise DecodeError, "duplicate #{what} id #{entry.id}" if seen.key?(entry.id)

          seen[entry.id] = true
        end
        seen
      end
    end
  end
end
