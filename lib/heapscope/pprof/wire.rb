# frozen_string_literal: true

# The protobuf wire format, schema-free: Wire::Reader walks a message's fields, Wire::Writer writes them.
module Heapscope
  module Pprof
    WIRE_VARINT = 0
    WIRE_FIXED64 = 1
    WIRE_BYTES = 2
    WIRE_FIXED32 = 5

    GZIP_MAGIC = "\x1f\x8b".b.freeze


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

        # If the next field's key is the one byte key_byte (a length-delimited field numbered below 16),
        # reads past the field and returns where its bytes start (they end at pos); else returns nil,
        # having read nothing. The fast path for a profile's samples: no [field, wire] Array, no checks
        # that a one-byte key makes needless.
        def bytes_after(key_byte)
          return nil unless @pos < @limit && @buf.getbyte(@pos) == key_byte

          @pos += 1
          length_delimited(key_byte >> 3)[0]
        end

        # Returns a Reader over a nested message of the given name.
        def message(field, name)
          s, e = length_delimited(field)
          Reader.new(@buf, s, e, name)
        end

        # Yields with this reader narrowed to the nested message at the current field (named name in
        # errors), then moves past it: what #message does without a Reader per message, for the many
        # small ones (a sample's labels).
        def inside(field, name)
          s, e = length_delimited(field)
          limit = @limit
          what = @what
          after = @pos
          @pos = s
          @limit = e
          @what = name
          begin
            yield
          ensure
            @pos = after
            @limit = limit
            @what = what
          end
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
              packed_uint64(e, into)
            end
            @pos = after
            @limit = limit
          else
            fail!("bad wire type #{wire} for field #{field} of #{@what} (want varint or packed)")
          end
          into
        end

        # Reads the packed unsigned varints up to e: a sample's location ids, most of a big profile's
        # bytes. One- and two-byte varints (ids below 16384) are decoded inline, without a method call
        # each, which makes decoding such a profile about twice as fast; longer ones go through varint.
        def packed_uint64(e, into)
          buf = @buf
          pos = @pos
          while pos < e
            byte = buf.getbyte(pos)
            if byte < 0x80
              into << byte
              pos += 1
              next
            end
            second = pos + 1 < e ? buf.getbyte(pos + 1) : 0x80
            if second < 0x80
              into << ((byte & 0x7f) | (second << 7))
              pos += 2
              next
            end
            @pos = pos
            into << varint
            pos = @pos
          end
          @pos = pos
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
  end
end
