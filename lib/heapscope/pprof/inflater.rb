# frozen_string_literal: true

require "zlib"

module Heapscope
  module Pprof
    # Inflater decompresses one gzip member fed in chunks, refusing to hold more than max_size bytes of
    # output: a 1 MB gzip bomb that would inflate to 1 GB stops at the limit with a LimitError, having
    # used about max_size bytes, not the bomb's size. (Zlib.gunzip inflates everything first; it also
    # warns under -w on the truncated input we report ourselves.)
    class Inflater
      def initialize(max_size)
        @max = max_size
        @z = Zlib::Inflate.new(Zlib::MAX_WBITS + 16) # + 16: expect a gzip header and trailer
        @out = String.new(encoding: Encoding::BINARY)
      end

      # Feeds compressed bytes; the block form of inflate hands over the output in small pieces, so the
      # limit is checked before each piece is kept.
      def <<(chunk)
        @z.inflate(chunk) do |part|
          if @out.bytesize + part.bytesize > @max
            raise LimitError, "decompresses to more than the #{Pprof.size_text(@max)} limit"
          end

          first = @out.empty?
          @out << part
          # Its first field key must make sense, so a bomb of anything else stops at its first piece.
          Wire::Reader.new(@out, 0, @out.bytesize, "Profile").key if first
        end
        self
      rescue Zlib::BufError
        fail_with(DecodeError, "truncated gzip data")
      rescue Zlib::Error => e
        fail_with(DecodeError, "bad gzip data (#{e.message})")
      rescue StandardError
        close
        raise
      end

      # True once the gzip member (and its trailer) has been read.
      def done?
        @z.finished?
      end

      # Returns the decompressed bytes; DecodeError if the member was cut short.
      def finish
        fail_with(DecodeError, "truncated gzip data") unless @z.finished?

        close
        @out
      end

      private

      def fail_with(klass, message)
        close
        raise klass, message
      end

      def close
        @z.close unless @z.closed?
      end
    end
  end
end
