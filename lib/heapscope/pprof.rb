# frozen_string_literal: true

require "zlib"
require_relative "pprof/schema"
require_relative "pprof/wire"
require_relative "pprof/profile"
require_relative "pprof/decoder"
require_relative "pprof/encoder"
require_relative "pprof/inflater"

# Heapscope::Pprof reads and writes profile.proto (github.com/google/pprof/proto/profile.proto) in pure
# Ruby. It is independent of the C writer on purpose: the tests use it as a second opinion on what the C
# core encodes, and the report commands (top, flamegraph, diff, leaks) read any pprof heap profile with it,
# Go's included, without the C extension loaded.
#
# Layers, top to bottom (one file each under pprof/):
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

    # LimitError is the DecodeError of a profile larger than the reader's limit (see DEFAULT_MAX_SIZE).
    class LimitError < DecodeError; end

    # Profiles are read whole into memory, so reading has a limit, max_size: at most this many bytes of
    # profile.proto after decompression (a gzip bomb stops here, after at most this much work), and at
    # most max_size / BYTES_PER_FRAME stack frames with inlined lines expanded at every sample that uses
    # them (a small profile whose locations have thousands of lines each would otherwise cost samples x
    # lines). 256 MiB holds a heapscope profile at its default caps (100,000 stacks of up to 400 frames:
    # 40 M frame references, each at least a byte), and the 64 M frames that go with it all its frames.
    # Samples are the other thing a small input can have many of (two bytes each at the least, and gzip
    # shrinks a run of equal ones to almost nothing), and each costs a Sample object, a few hundred
    # bytes: at most max_size / BYTES_PER_SAMPLE distinct samples are read (1 Mi at the default), so
    # their memory stays within about twice max_size. A reader that shares equal samples (the reports)
    # pays an Array slot for each repeat, and reads at most max_size / BYTES_PER_OCCURRENCE samples in
    # all (4 Mi), which bounds its time (docs/reading-profiles.md, "Limits on what is read", has figures).
    DEFAULT_MAX_SIZE = 256 * 1024 * 1024
    BYTES_PER_FRAME = 4
    BYTES_PER_SAMPLE = 256
    BYTES_PER_OCCURRENCE = 64
    READ_CHUNK = 1 << 20

    class << self
      # Decodes a profile from gzipped or raw profile.proto bytes. Raises DecodeError (LimitError when the
      # bytes, decompressed, their frames or their samples exceed max_size). share: equal samples become
      # one frozen Sample (Decoder#initialize), for readers that do not change what they read. pace: see
      # Decoder#initialize.
      def decode(bytes, max_size: DEFAULT_MAX_SIZE, share: false, pace: nil)
        bytes = bytes.b unless bytes.encoding == Encoding::BINARY
        raise DecodeError, "empty input (not a pprof profile)" if bytes.empty?

        if bytes.start_with?(GZIP_MAGIC)
          raw = Inflater.new(max_size)
          raw << bytes
          return decoder(raw.finish, max_size, share, pace).decode
        end
        if bytes.bytesize > max_size
          raise LimitError, "the input is #{size_text(bytes.bytesize)}, more than the #{size_text(max_size)} limit"
        end

        decode_raw(bytes, max_size, share, pace)
      end

      # Reads and decodes a profile file, a pipe or a device (/dev/stdin), never holding more than
      # max_size bytes of it: a regular file over the limit is refused before it is read, and other
      # inputs are read in chunks until they end or pass the limit. Raises DecodeError with a message
      # that starts with the path. share: as for decode.
      def read(path, max_size: DEFAULT_MAX_SIZE, share: false)
        bytes = begin
          File.open(path, "rb") { |f| read_bounded(f, max_size) }
        rescue Errno::ENOENT
          raise DecodeError, "#{path}: no such file"
        rescue Errno::EISDIR
          raise DecodeError, "#{path}: is a directory"
        rescue SystemCallError, IOError => e
          raise DecodeError, "#{path}: #{e.message.sub(/ @ .*/, "")}"
        rescue DecodeError => e
          raise e.class, "#{path}: #{e.message}"
        end
        begin
          if bytes.is_a?(Inflater)
            decoder(bytes.finish, max_size, share).decode
          else
            decode_raw(bytes, max_size, share)
          end
        rescue DecodeError => e
          raise e.class, "#{path}: #{e.message}"
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

      # "256 MiB", "1.5 GiB", "300 bytes": sizes in the limit's messages.
      def size_text(n)
        return "#{n} bytes" if n < 1024

        units = %w[KiB MiB GiB TiB]
        v = n / 1024.0
        u = 0
        while v >= 1024 && u < units.size - 1
          v /= 1024
          u += 1
        end
        v == v.round ? "#{v.round} #{units[u]}" : format("%.1f %s", v, units[u])
      end

      private

      # A Decoder with the limits that go with max_size.
      def decoder(raw, max_size, share, pace = nil)
        Decoder.new(raw, max_frames: max_size / BYTES_PER_FRAME, max_samples: max_size / BYTES_PER_SAMPLE,
                         max_occurrences: max_size / BYTES_PER_OCCURRENCE, share: share, pace: pace)
      end

      def decode_raw(bytes, max_size, share, pace = nil)
        decoder(bytes, max_size, share, pace).decode
      rescue LimitError
        raise
      rescue DecodeError => e
        # Raw input that fails early is most likely not a profile at all; say so first.
        raise DecodeError, "not gzip or pprof protobuf data (#{e.message})"
      end

      # Returns the raw bytes of an open input, or an Inflater holding its decompressed bytes.
      def read_bounded(io, max_size)
        st = io.stat
        raise Errno::EISDIR if st.directory?
        if st.file? && st.size > max_size
          raise LimitError, "the file is #{size_text(st.size)}, more than the #{size_text(max_size)} limit"
        end

        first = io.read(READ_CHUNK)
        raise DecodeError, "empty input (not a pprof profile)" if first.nil? || first.empty?

        if first.start_with?(GZIP_MAGIC)
          raw = Inflater.new(max_size)
          chunk = first
          while chunk
            raw << chunk
            break if raw.done?

            chunk = io.read(READ_CHUNK)
          end
          return raw
        end

        # Not gzip: the first field key must make sense, so an endless stream of anything else
        # (/dev/zero) is refused at once instead of after max_size bytes.
        begin
          Wire::Reader.new(first, 0, first.bytesize, "Profile").key
        rescue DecodeError => e
          raise DecodeError, "not gzip or pprof protobuf data (#{e.message})"
        end
        bytes = first
        while (chunk = io.read(READ_CHUNK))
          if bytes.bytesize + chunk.bytesize > max_size
            raise LimitError, "goes on past the #{size_text(max_size)} limit"
          end

          bytes << chunk
        end
        bytes
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
