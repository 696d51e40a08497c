# frozen_string_literal: true

require_relative "schema"
require_relative "encoder"

# The decoded model: Frame, Location, Function, Mapping, Sample, Profile.
module Heapscope
  module Pprof
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
  end
end
