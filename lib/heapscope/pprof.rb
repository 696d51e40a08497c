# frozen_string_literal: true

require "zlib"
require_relative "pprof/schema"
require_relative "pprof/wire"
require_relative "pprof/profile"
require_relative "pprof/decoder"
require_relative "pprof/encoder"

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
