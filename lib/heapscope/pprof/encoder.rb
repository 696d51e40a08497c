# frozen_string_literal: true

require_relative "schema"
require_relative "wire"

# Profile -> profile.proto bytes.
module Heapscope
  module Pprof
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
  end
end
