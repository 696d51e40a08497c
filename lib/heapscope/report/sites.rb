# frozen_string_literal: true

require "heapscope/pprof"

module Heapscope
  module Report
    # Error is a problem with the user's input (a flag, a file, a sample type): the CLI prints its message
    # on one line and exits 2.
    class Error < StandardError; end

    # Sites groups a profile's samples into the rows the text reports print, summing every sample type at
    # once (so the object count behind a byte estimate is at hand for its sampling error).
    #
    # Grouping (--by):
    #   line      the source line (file:line) of the leaf frame: the line that allocated. heapscope gives C
    #             functions (String#*, Array#push) their Ruby caller's line, so `"x" * 200` on line 4 and
    #             the method around it count as one site; it is named after the outermost function of the
    #             leaf frames on that line (the Ruby method, not the C function it called). Frames without a
    #             file count by function name.
    #   function  the leaf function, C functions included.
    #   class     the "class" label (heapscope profiles); "(no class label)" otherwise.
    # flat counts a sample at its site; cum counts it at every site in its stack (once per sample).
    module Sites
      BY = %w[line function class].freeze
      NO_CLASS = "(no class label)"

      # Entry is one row: name for display, flat and cum are value vectors over all sample types.
      Entry = Struct.new(:key, :name, :function, :file, :line, :flat, :cum)

      module_function

      # Reads a profile file, turning every decoding problem into Report::Error (message names the file).
      def load(path)
        Pprof.read(path)
      rescue Pprof::DecodeError => e
        raise Error, e.message
      end

      # The sample type a report uses: the one asked for, else the profile's default, else inuse_space,
      # else the last one (pprof's rule). Returns its index; Error names the file when it is missing.
      def sample_index(prof, requested, path)
        if prof.sample_types.empty?
          raise Error, "#{path}: the profile has no sample types"
        elsif requested
          prof.sample_index(requested) or
            raise Error, "#{path}: no sample type #{requested.inspect} (have: #{prof.sample_type_names.join(", ")})"
        else
          [prof.default_sample_type, "inuse_space"].each do |name|
            i = name && prof.sample_index(name)
            return i if i
          end
          prof.sample_types.size - 1
        end
      end

      # Returns {key => Entry}, summing every sample of prof.
      def aggregate(prof, by)
        raise Error, "--by must be one of #{BY.join(", ")}, got #{by.inspect}" unless BY.include?(by)

        n = prof.sample_types.size
        entries = {}
        prof.samples.each do |s|
          values = s.values
          next if values.all?(&:zero?)

          if by == "class"
            cls = s.labels["class"]
            cls = cls.nil? ? NO_CLASS : cls.to_s
            e = entries[cls] ||= Entry.new(cls, cls, cls, "", 0, Array.new(n, 0), Array.new(n, 0))
            add(e.flat, values)
            add(e.cum, values)
            next
          end

          frames = s.frames
          next if frames.empty?

          # Frames on the same line as the one before are one site; the outermost names it.
          sites = []
          frames.each do |f|
            key = site_key(f, by)
            if by == "line" && sites.last && sites.last[0] == key
              sites.last[1] = f
            else
              sites << [key, f]
            end
          end
          seen = {}
          sites.each do |key, f|
            next if seen[key]

            seen[key] = true
            add(entry_for(entries, key, f, by, n).cum, values)
          end
          key, f = sites.first
          add(entry_for(entries, key, f, by, n).flat, values)
        end
        entries
      end

      def site_key(frame, by)
        if by == "function" then [frame.function, frame.file]
        elsif frame.file.to_s.empty? then [frame.function, "", 0]
        else [nil, frame.file, frame.line]
        end
      end

      def entry_for(entries, key, frame, by, n)
        entries[key] ||= begin
          name = if by == "function" || frame.file.to_s.empty?
                   frame.function
                 else
                   "#{frame.function} #{frame.file}:#{frame.line}"
                 end
          Entry.new(key, name, frame.function, frame.file, by == "line" ? frame.line : 0,
                    Array.new(n, 0), Array.new(n, 0))
        end
      end

      def add(into, values)
        values.each_with_index { |v, i| into[i] += v }
      end
    end
  end
end
